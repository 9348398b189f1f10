"""A hostile review of the flex tile loops compiled once (``nbattn.kernels.flex_loops``).

The loops take the generated module's tile function as a first-class function and are
compiled, through an explicit signature, once per dtype: ``mod_args`` reach them as
the address of their native values, which the tile function (compiled for their types)
reads back. These tests call one ``score_mod`` with ``mod_args`` of several types in
one process (each must run its own specialisation, never a stale one: every result is
checked against the dense formulation of ``tests/naive.py``), scalars of other widths
after int64 ones (each written and read at its own type) without a new loop, a Python
int beyond int64 after int64 ones (the parent's dispatcher raised OverflowError
there), one and two numba threads (the same bits), and two Python threads with
different ``score_mod`` at once (the same bits as one after the other). Few types,
small shapes: cheap once cached.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest

import nbattn
from tests import naive

B, H, L, S, E = 2, 2, 70, 90, 8


def table_score(score, b, h, q_idx, kv_idx, table, c):
    """score + table[h, kv_idx] times c (a float, an int, a bool table...)."""
    return score + table[h, kv_idx] * c


def table_grad(score, b, h, q_idx, kv_idx, table, c):
    """d table_score / d score."""
    return 1.0 + 0.0 * score


def slope_score(score, b, h, q_idx, kv_idx, table, c):
    """Another function of the same types: a slope on j - i and a scaled score."""
    return score * 0.75 - 0.05 * (kv_idx - q_idx)


def window_mask(b, h, q_idx, kv_idx, table, c):
    """A band: partial tiles, closed and open ones."""
    return (kv_idx <= q_idx + 23) & (kv_idx >= q_idx - 31)


def _inputs(dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, E)).astype(dtype)
    g = rng.standard_normal((B, H, L, E)).astype(dtype)
    return q, k, v, g


def _table(seed=1):
    return np.random.default_rng(seed).standard_normal((H, S))


def _close(got, want, dtype):
    tol = 2e-4 if dtype == np.float32 else 1e-10
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _forward(q, k, v, mod_args, score_mod=table_score, mask_mod=None):
    return nbattn.flash_attention(
        q, k, v, score_mod=score_mod, mask_mod=mask_mod, mod_args=mod_args, return_lse=True
    )


def _dense(q, k, v, mod_args, score_mod=table_score, mask_mod=None):
    return naive.flex_attention_grads(
        q, k, v, score_mod=score_mod, mask_mod=mask_mod, mod_args=mod_args
    )


MOD_ARG_TYPES = {
    # (the table as passed, c): the table normalised by nbattn to C order, same types
    "float64_table_float": lambda t: (t, 1.5),
    "fortran_readonly_table": lambda t: (np.asfortranarray(t), 1.5),
    "strided_table": lambda t: (np.repeat(t, 2, axis=1)[:, ::2], 1.5),
    "int32_table_int": lambda t: ((t * 4).astype(np.int32), 2),
    "bool_table_float32": lambda t: (t > 0, np.float32(0.5)),
}


def test_one_score_mod_with_mod_args_of_many_types_in_one_process():
    """Each type of mod_args runs its own tile function: every result is the dense one,
    whatever ran before it (and back to the first types at the end), and the loops, which
    read them from an address, compile once for them all."""
    from nbattn.kernels import flex_loops

    q, k, v, _ = _inputs()
    table = _table()
    compiled = None
    for name in list(MOD_ARG_TYPES) + ["float64_table_float"]:
        args = MOD_ARG_TYPES[name](table)
        if name == "fortran_readonly_table":
            args[0].flags.writeable = False
        got = _forward(q, k, v, args)
        dense_args = tuple(
            np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for a in args
        )
        _close(got, _dense(q, k, v, dense_args), np.float64)
        if compiled is None:
            compiled = len(flex_loops._forward_items.overloads)
    assert len(flex_loops._forward_items.overloads) == compiled


def test_float32_inputs_and_mask_with_the_same_functions():
    """float32 q, k, v (their own loops) with a mask of closed, partial and open tiles."""
    q, k, v, _ = _inputs(np.float32)
    args = (_table(), 1.5)
    got = _forward(q, k, v, args, mask_mod=window_mask)
    _close(got, _dense(q, k, v, args, mask_mod=window_mask), np.float32)


def test_an_int_beyond_int64_after_int64_ones():
    """A Python int of [2**63, 2**64) is a uint64 mod_arg (the parent raised OverflowError
    when the same function had run with an int64 first)."""
    q, k, v, _ = _inputs()
    table = _table() * 2.0**-63
    for c in (2, 2**63 + 1):
        got = _forward(q, k, v, (table, c))
        _close(got, _dense(q, k, v, (table, c)), np.float64)


def offset_score(score, b, h, q_idx, kv_idx, table, c, d):
    """A table times c plus d: c and d of many widths (read at the wrong one, d would be
    read from c's bytes or beyond them)."""
    return score + table[h, kv_idx] * c + d


def offset_grad(score, b, h, q_idx, kv_idx, table, c, d):
    """d offset_score / d score (for the dense formulation)."""
    return 1.0 + 0.0 * score


def test_scalars_of_other_widths_after_int64_ones_without_new_loops():
    """mod_args (table, c, d) with c and d int64 and float64, then an int16 and a float32,
    then a bool and a float64, then the first types again: each is the dense result,
    forward and backward (the narrow scalars written and read back at their own types,
    whatever types were written before), and none compiles the backward's loops again.
    (A Python int beyond int64 after int64 ones: test_an_int_beyond_int64_after_int64_ones.)
    """
    from nbattn.kernels import flex_loops

    q, k, v, g = _inputs()
    table = _table() * 0.25

    def both(args):
        out, lse = _forward(q, k, v, args, score_mod=offset_score)
        grads = nbattn.flash_attention_backward(
            q, k, v, out, lse, g, score_mod=offset_score, mod_args=args
        )
        return (out, lse) + tuple(grads)

    def dense(args):
        return naive.flex_attention_grads(
            q, k, v, g, offset_score, None, mod_args=args, score_grad=offset_grad
        )

    _close(both((table, 2, -0.5)), dense((table, 2, -0.5)), np.float64)
    compiled = (len(flex_loops._forward_items.overloads), len(flex_loops._backward_items.overloads))
    for args in ((table, np.int16(-3), np.float32(-1.25)), (table, True, 1.5), (table, 2, -0.5)):
        _close(both(args), dense(args), np.float64)
    after = (len(flex_loops._forward_items.overloads), len(flex_loops._backward_items.overloads))
    assert after == compiled


def test_backward_matches_dense():
    """The backward's loops with the tile function of the gradient (supplied)."""
    q, k, v, g = _inputs()
    args = (_table(), 1.5)
    out, lse = _forward(q, k, v, args, mask_mod=window_mask)
    got = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, score_mod=table_score, mask_mod=window_mask, mod_args=args,
        score_mod_grad=table_grad,
    )  # fmt: skip
    want = naive.flex_attention_grads(
        q, k, v, g, table_score, window_mask, mod_args=args, score_grad=table_grad
    )
    _close((out, lse) + tuple(got), want, np.float64)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one numba thread")
def test_one_and_two_threads_give_the_same_bits():
    """The items on one thread or two: the same bits, forward and backward."""
    q, k, v, g = _inputs()
    args = (_table(), 1.5)

    def run():
        out, lse = _forward(q, k, v, args, mask_mod=window_mask)
        grads = nbattn.flash_attention_backward(
            q, k, v, out, lse, g, score_mod=table_score, mask_mod=window_mask, mod_args=args,
            score_mod_grad=table_grad,
        )  # fmt: skip
        return (out, lse) + tuple(grads)

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run()
        numba.set_num_threads(2)
        two = run()
    finally:
        numba.set_num_threads(before)
    for a, b in zip(one, two):
        assert np.array_equal(a, b, equal_nan=True)


def test_two_python_threads_with_different_score_mods():
    """Two score_mods of the same types (one compiled loop, two tile functions) called at
    once from several Python threads: each result is that function's, bit for bit."""
    q, k, v, _ = _inputs()
    args = (_table(), 1.5)
    fns = [table_score, slope_score] * 3
    serial = {fn: _forward(q, k, v, args, score_mod=fn) for fn in (table_score, slope_score)}
    results = [None] * len(fns)
    errors = []

    def work(n):
        try:
            results[n] = _forward(q, k, v, args, score_mod=fns[n])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for fn, got in zip(fns, results):
        for a, b in zip(got, serial[fn]):
            assert np.array_equal(a, b, equal_nan=True)
    _close(serial[slope_score], _dense(q, k, v, args, score_mod=slope_score), np.float64)


def test_a_function_that_does_not_compile_is_named():
    """The compile error still names the user's function and its argument types."""

    def broken(score, b, h, q_idx, kv_idx, table, c):
        return score + table[h, kv_idx, 0]

    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=r"score_mod could not be compiled for arguments"):
        _forward(q, k, v, (_table(), 1.5), score_mod=broken)
