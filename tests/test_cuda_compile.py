"""Every CUDA kernel compiles for a real GPU (sm_90 PTX), without a GPU.

The simulator suite (tests/cuda) runs the kernels as Python and so misses
what only the CUDA compiler rejects (an overload that does not compile as a
device function, a type that does not unify) and everything about the code
it makes. ``numba.cuda.compile_ptx`` needs libNVVM (the CUDA toolkit, or
numba-cuda's ``[cu12]``/``[cu13]`` wheels) but no GPU and no driver; the tests
skip where libNVVM is missing. ptxas, where one here accepts the PTX version,
assembles the PTX and reports registers and spills, which are checked too
(``scripts/ptx.py`` holds the kernel catalogue; ``python scripts/ptx.py``
prints the whole table).
"""

import functools
import os
import sys

import pytest

from ._scripts import load_script

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") == "1", reason="needs the real CUDA compiler"
)


@pytest.fixture(scope="module")
def ptx():
    from numba import cuda

    ptx_tools = load_script("ptx")

    def trivial(x):
        x[0] = 1.0

    try:
        cuda.compile_ptx(trivial, "void(float32[::1])", cc=ptx_tools.CC)
    except Exception as exc:  # no libNVVM, or a numba without CUDA support
        pytest.skip(f"numba cannot compile CUDA here: {type(exc).__name__}: {exc}")
    return ptx_tools


def _compile(ptx, case):
    try:
        text = ptx.compile_ptx(case)
    except Exception as exc:
        if type(exc).__name__ == "CudaSupportError":  # a numba that wants a driver here
            pytest.skip(f"device functions need a CUDA driver with this numba: {exc}")
        raise
    assert ".entry" in text
    return text


def _usage(ptx, text):
    """ptxas's figures, or None where no ptxas here takes this PTX version (the PTX
    was still compiled); a PTX that ptxas rejects fails the test."""
    try:
        return ptx.assemble(text)
    except ptx.PtxasUnavailable:
        return None


def _usage_or_skip(ptx, text):
    usage = _usage(ptx, text)
    if usage is None:
        pytest.skip("no ptxas here accepts this PTX version: registers and spills unchecked")
    return usage


def _assert_no_local_memory(ptx, case, text):
    """ptxas's figures for the case's PTX, which uses no local memory (no spill stores or
    loads, no stack); skipped where no ptxas takes the PTX."""
    usage = _usage_or_skip(ptx, text)
    assert usage.spill_stores == usage.spill_loads == usage.stack == 0, (case.name, usage)
    return usage


def _assert_spills_at_most(ptx, case, text, spilled_before):
    """The case's PTX spills at most 10 % more bytes than ``spilled_before``, what it
    spilled when written; skipped where no ptxas takes the PTX."""
    usage = _usage_or_skip(ptx, text)
    assert usage.spill_stores <= spilled_before * 1.1, (case.name, usage)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_kernel_compiles_and_assembles(ptx, dtype):
    """Odd sizes: head dimensions that are not multiples of 4 (the dot products'
    tail loops), one feature, more outputs than features."""
    cases = (
        ptx.flash_cases(dtype, 6, 5)
        + ptx.pooling_cases(dtype, 1, 3)
        + ptx.pooling_cases(dtype, 3, 2)
        + ptx.weights_cases(dtype, 3)
        + ptx.grad_cases(dtype, 3)
    )
    if dtype == "float64":  # float32 with every flash term: test_flash_feature_kernels
        cases += ptx.layout_cases() + ptx.flash_cases(dtype, 6, 5, 2, True, True, True)
    cases += ptx.decode_cases(dtype, 3, 5)
    for case in cases:
        _usage(ptx, _compile(ptx, case))


def test_flash_float32_fast_exp_vector_loads_and_no_spills(ptx):
    """At D = 64 float32: weights through the fast exp (ex2.approx); K, V and Q
    rows read from shared memory 4 floats at a time (the tiles' 16-byte aligned
    base); the forward and dV kernels keep their rows in registers (no spills),
    dQ and dK spill no more than they did (144 and 152 bytes with NVVM of CUDA
    13.0: the price of one thread per row with two rows of 64 floats)."""
    forward, dq, dk, dv = ptx.flash_cases("float32", 64, 64)
    texts = {case.name: _compile(ptx, case) for case in (forward, dq, dk, dv)}
    assert "ex2.approx" in texts[forward.name]
    assert ptx.shared_load_widths(texts[forward.name]) == {"v4": 32, "v2": 0, "scalar": 0}
    for case in (dq, dk, dv):
        assert ptx.shared_load_widths(texts[case.name])["v4"] == 32, case.name
    # the rows-without-keys test (lse != -inf) is compiled in, not folded away
    assert "0dFFF0000000000000" in texts[dq.name]
    for case in (forward, dv):
        _assert_no_local_memory(ptx, case, texts[case.name])
    for case, spilled_before in ((dq, 144), (dk, 152)):
        _assert_spills_at_most(ptx, case, texts[case.name], spilled_before)


def test_flash_feature_kernels(ptx):
    """At D = 64 float32 with every optional term (float mask, ALiBi, softcap,
    dropout): the weights through the fast exp2 (ex2.approx), K, V, Q and dO rows
    read 4 floats at a time, the mask's tile skip (a block-wide OR, ``bar.red.or``)
    compiled in; the forward and dV kernels keep their rows in registers, dQ and
    dK spill no more than they did when written (180 and 228 bytes, NVVM of CUDA
    13.0). The forwards of a boolean mask and of packed sequences (varlen) compile
    to the same vector loads, without spills."""
    cases = ptx.flash_cases("float32", 64, 64, 2, True, True, True)
    boolean_forward = ptx.flash_cases("float32", 64, 64, 1)[0]
    packed_forward = ptx.flash_cases("float32", 64, 64, 0, False, True, True, True)[0]
    others = (boolean_forward, packed_forward)
    texts = {case.name: _compile(ptx, case) for case in (*cases, *others)}
    forward, dq, dk, dv = cases
    assert "ex2.approx" in texts[forward.name]
    for name, text in texts.items():
        assert ptx.shared_load_widths(text)["v4"] == 32, name
        assert ("bar.red.or" in text) == (name != packed_forward.name), name
    for case in (forward, dv, *others):
        _assert_no_local_memory(ptx, case, texts[case.name])
    for case, spilled_before in ((dq, 180), (dk, 228)):
        _assert_spills_at_most(ptx, case, texts[case.name], spilled_before)


def test_decode_kernel_at_head_size_128(ptx):
    """Split-KV decoding at D = Ev = 128 float32 (the decode benchmark's heads): the
    query row and the accumulator stay in registers (no local memory)."""
    (case,) = ptx.decode_cases("float32", 128, 128)
    _assert_no_local_memory(ptx, case, _compile(ptx, case))


def test_flex_kernels_compile_with_user_functions(ptx):
    """The programmable-attention kernels at D = 64 float32 with a score_mod (a softcap
    through nbattn.flex_tanh, ALiBi from mod_args) and a mask_mod (causal documents)
    compiled in, the backward's complex step included: K, V, Q and dO rows read 4 floats
    at a time, the weights through the fast exp2 (ex2.approx); the forward keeps its rows
    in registers, dV spills nothing, and dQ and dK spill no more than they did when
    written (304 and 288 bytes, NVVM of CUDA 13.0). Odd head sizes (the dot products'
    tail loops) compile too."""
    forward, dq, dk, dv = ptx.flex_cases("float32", 64, 64)
    texts = {case.name: _compile(ptx, case) for case in (forward, dq, dk, dv)}
    for name, text in texts.items():
        assert ptx.shared_load_widths(text)["v4"] == 32, name
        assert "ex2.approx" in text, name
    _assert_no_local_memory(ptx, forward, texts[forward.name])
    usage = _usage_or_skip(ptx, texts[dv.name])
    assert usage.spill_stores == usage.spill_loads == 0, (dv.name, usage)
    for case, spilled_before in ((dq, 304), (dk, 288)):
        _assert_spills_at_most(ptx, case, texts[case.name], spilled_before)
    for case in ptx.flex_cases("float64", 6, 5):
        _usage(ptx, _compile(ptx, case))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pooling_and_loo_kernels_fit_in_registers(ptx, dtype):
    """Nadaraya-Watson, the LOO loss and the spread at d = 8 with 8 outputs, the
    weight matrix at d = 8, and the LOO gradients with 8 entries per launch: no
    local memory at all, and at most 128 registers per thread, so that four
    blocks of 128 threads fit on a multiprocessor (65,536 registers)."""
    cases = ptx.pooling_cases(dtype, 8, 8) + ptx.weights_cases(dtype, 8) + ptx.grad_cases(dtype, 8)
    for case in cases:
        usage = _assert_no_local_memory(ptx, case, _compile(ptx, case))
        assert usage.registers <= 128, (case.name, usage)


def test_diagnostics_float32_fast_exp_and_empty_rows_compiled_in(ptx):
    """The spread and weight-matrix kernels of float32 take their weights through
    the fast exp (ex2.approx), and the spread keeps its test for rows that are
    not direct (lse < -FAR_SCORE_FLOAT32, by default -4096, which includes the rows without
    admissible keys, lse = -inf: var 0, sum_w2 0; the others go to the far kernel),
    which is not folded away."""
    spread = next(c for c in ptx.pooling_cases("float32", 2, 2) if c.name.startswith("NW spread"))
    rows, weights = ptx.weights_cases("float32", 2)
    texts = {case.name: _compile(ptx, case) for case in (spread, rows, weights)}
    assert "ex2.approx" in texts[spread.name]
    assert "ex2.approx" in texts[weights.name]
    import struct

    from nbattn import config

    limit = struct.pack(">d", -float(config.FAR_SCORE_FLOAT32)).hex().upper()
    assert f"0d{limit}" in texts[spread.name]


def test_local_fit_compiles_and_assembles(ptx):
    """The local fit where the register test below does not reach: local-constant
    marginal effects with a compact kernel, missing entries and three outputs (the
    second passes share the fit's device functions)."""
    fit = ptx.local_cases(1, 1, 0, 3, kernel=2, missing=True)[0]
    _usage(ptx, _compile(ptx, fit))


def test_local_linear_kernels_keep_their_state_in_registers(ptx):
    """Local-linear with 3 continuous and 2 categorical columns (5 terms: 15 moments
    and 5 right-hand sides per thread): no local memory in any of the three kernels
    (the accumulators, the Cholesky factor and the query row stay in registers);
    the -inf tests of the fallback rows are compiled in, not folded away."""
    for case in ptx.local_cases(3, 2, 1, 1):
        text = _compile(ptx, case)
        assert "0dFFF0000000000000" in text, case.name
        _assert_no_local_memory(ptx, case, text)


def test_density_sums_compile_and_assemble(ptx):
    """The densities' sums kernel for each continuous kernel, with and without categorical
    columns: its -inf tests (keys out of reach, the running maximum's start) compiled in."""
    for dc, dk, kernel in ((2, 2, 0), (1, 0, 1), (3, 1, 2), (0, 2, 0)):
        (case,) = ptx.density_cases(dc, dk, kernel)
        text = _compile(ptx, case)
        assert "0dFFF0000000000000" in text, case.name
        _usage(ptx, text)


def test_far_row_kernels_compile_and_assemble(ptx):
    """The LOO far-row kernels (diagonal gradient, spread; the full gradient is the
    same code), float32 (casts of float64 weights), odd entry count."""
    diag, _, spread = ptx.far_cases("float32", 3)
    for case in (diag, spread):
        _usage(ptx, _compile(ptx, case))


# --- the disk cache: every kernel through common.jit (cache=True) ---------------


def test_every_cuda_decorator_is_the_caching_one():
    """No module in nbattn/cuda decorates with numba's ``cuda.jit`` directly: all go
    through ``common.jit``, which adds ``cache=config.CUDA_CACHE`` (checked on the source,
    so a kernel that no catalogue entry builds is covered too)."""
    import ast
    import pathlib

    import nbattn.cuda

    offenders = []
    for path in sorted(pathlib.Path(nbattn.cuda.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if ast.unparse(target) in ("cuda.jit", "numba.cuda.jit"):
                    offenders.append(f"{path.name}:{node.lineno} {node.name}")
    assert offenders == []


class _Codegen:
    """Stands in for the CUDA codegen in numba's cache key (its magic tuple names the
    target; nothing here compiles)."""

    def magic_tuple(self):
        return ("cuda-test",)


def _cache_key(kernel, signature):
    """numba's on-disk index key of ``kernel`` for ``signature``: the signature, the
    target, the bytecode's hash and the hash of the pickled closure values."""
    return kernel._cache._index_key(signature, _Codegen())


def test_every_catalogued_kernel_has_a_disk_cache_with_distinct_keys():
    """Every kernel of the catalogue (closures built per compile-time sizes, and the
    module-level layout kernels) but the flex kernels (which hold the user's functions,
    see ``nbattn.cuda.flex``) caches on disk, numba can compute its cache key
    (which pickles the closure: sizes, dtypes, the device functions it calls), and
    two specialisations of one kernel never share a key."""
    from nbattn import config

    ptx = load_script("ptx")

    expected = "CUDACache" if config.CUDA_CACHE else "NullCache"  # NBATTN_CACHE=0 turns it off
    cases = (
        ptx.kernel_cases()
        + ptx.flash_cases("float32", 6, 5)
        + ptx.flash_cases("float64", 7, 7, 2, True, True, True)
        + ptx.pooling_cases("float32", 3, 2)
    )
    seen = {}
    for case in cases:
        if case.name.startswith("flex "):  # the user's functions: kept per process only
            assert type(case.kernel._cache).__name__ == "NullCache", case.name
            continue
        assert type(case.kernel._cache).__name__ == expected, case.name
        if not config.CUDA_CACHE:
            continue
        key = _cache_key(case.kernel, case.signature)
        previous = seen.setdefault(key, case)
        assert previous.kernel is case.kernel, (previous.name, case.name)


def test_far_limits_are_in_the_cache_key(monkeypatch):
    """The far-row limits (``config.FAR_SCORE_FLOAT32/64``, read from the
    environment at import) reach the LOO kernels as closure values, so a process
    with other limits does not load kernels compiled for these from the disk."""
    import numpy as np

    from nbattn import config
    from nbattn.cuda import far, loo

    if not config.CUDA_CACHE:
        pytest.skip("the on-disk cache is off here (NBATTN_CACHE=0 or an overridden tunable)")

    def keys():
        loss = loo._make_loss_kernel(np.float32, 2, 1)
        far_diag, _ = loo._make_far_grad_kernels(np.float32, 3)
        spread = loo._make_far_spread_kernel(np.float32)
        return [_cache_key(k, "void()") for k in (loss, far_diag, spread)]

    before = keys()
    monkeypatch.setattr(far, "FAR_SCORE_FLOAT64", far.FAR_SCORE_FLOAT64 * 2)
    after = keys()
    for a, b in zip(before, after, strict=True):
        assert a != b
    monkeypatch.undo()
    assert keys() == before


@functools.cache
def _module_names_from_config(module):
    """The module-level names of ``module`` assigned from an expression that reads
    ``config`` (env-overridable tunables)."""
    import ast
    import inspect

    names = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if "config." in ast.unparse(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_no_kernel_reads_a_tunable_as_a_global():
    """A global that a kernel reads is frozen into it and is not part of numba's
    cache key, so a tunable read that way would be served stale from the disk
    cache in a process that sets another value. Every kernel and device function
    reachable from the catalogue (through globals and closures) reads only true
    constants: none of the module-level names computed from ``config``."""
    import types

    from nbattn import config

    ptx = load_script("ptx")

    seen, offenders = set(), []

    def walk(fn):
        py = getattr(fn, "py_func", None)
        if py is None or id(py) in seen:
            return
        seen.add(id(py))
        # globals, and attributes of modules read as globals (``far.row_setup``)
        scopes = [sys.modules[py.__module__]]
        scopes += [
            v
            for v in py.__globals__.values()
            if isinstance(v, types.ModuleType) and v.__name__.startswith("nbattn.")
        ]
        for name in py.__code__.co_names:
            for scope in scopes:
                if not hasattr(scope, name):
                    continue
                value = getattr(scope, name)
                from_config = _module_names_from_config(scope) | set(vars(config))
                if name in from_config and not callable(value):
                    offenders.append(f"{py.__qualname__} reads {scope.__name__}.{name}")
                walk(value)
        for cell in py.__closure__ or ():
            walk(cell.cell_contents)

    for case in ptx.kernel_cases():
        walk(case.kernel)
    assert len(seen) > 50  # the walk reached the device functions too
    assert offenders == []
