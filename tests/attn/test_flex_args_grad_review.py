"""A hostile review of the ``mod_args`` gradients (``score_mod_args_grad``).

Each case is checked against torch autograd on the explicit dense formulation
(float64, 1e-10) or finite differences, and the user function also counts its calls
into a "spy" array, so that the tests see where it runs: once per admissible entry,
never on a masked entry, outside the causal band or window, or in a fully masked row.
Every case runs the same module-level functions (``score_fn`` and ``mask_fn`` of
``tests/flex_cases.py``, shared with the other flex test files, and ``args_grad_fn`` of
``test_flex_args_grad.py``) with ``mod_args`` of one set of types, so the file compiles few
specialisations: float64 and float32 q with float64 tables (those of the other files),
float64 q with float32 and float16 tables, a backward with ``score_mod_grad``, and two
misbehaving functions.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.attn import flex
from tests.attn.test_flex_args_grad import args_grad_fn
from tests.flex_cases import (
    DIAG,
    DOC,
    MODS,
    SCALAR,
    SPY,
    TABLE,
    TABLE2,
    mask_fn,
    score_grad_fn,
    to_torch,
    with_args,
)
from tests.flex_cases import make_args as shared_args

torch = pytest.importorskip("torch")

H = 4  # query heads of every case


# args_grad_fn: the chain rule of the shared score_fn, test_flex_args_grad.py's (one
# args module for both files). Here only the temperature ``scalar`` and the two tables
# are learned (no softcap or slopes); it also writes into the placeholders of ids and pyf
# (``doc`` and ``diag``, which have no gradient) and counts its calls in d_spy[b, h, i, j].


LEARNED = (TABLE, TABLE2, SCALAR)  # the entries learned here, in dense_out's order


def learned(args):
    """(table, table2, cap) of ``args`` (or of its gradients)."""
    return tuple(args[m] for m in LEARNED)


def with_learned(args, tables):
    """``args`` with (table, table2, cap) replaced."""
    return with_args(args, **dict(zip(("table", "table2", "scalar"), tables)))


def make_args(seed, n_b, L, S, rows=H, cols2=7, docs=1, dtype=np.float64, spy=True):
    """mod_args of the shared functions for a call of n_b batch entries (or sequences)
    of L queries and S keys: a temperature cap (0-d, the ``scalar``), a relative-position
    bias table[h % rows, j - i + centre], an absolute key bias table2[h % rows, j % cols],
    ids (``doc``: docs contiguous documents shared by queries and keys), pyf (``diag``)
    on the diagonal and a spy."""
    rng = np.random.default_rng(seed)
    n = max(L, S, 1)
    ids = np.zeros((n_b, 2, n), dtype=np.int64)
    if docs > 1:
        for side, length in ((0, L), (1, S)):
            cuts = np.linspace(0, length, docs + 1)[1:-1].astype(np.int64)
            ids[:, side, :length] = np.searchsorted(cuts, np.arange(length), "right")
    table = rng.standard_normal((rows, 2 * n - 1)).astype(dtype)
    table2 = rng.standard_normal((rows if cols2 > 1 else 1, cols2)).astype(dtype)
    cap = np.array(rng.uniform(0.5, 1.5), dtype=dtype)
    spy = np.zeros((n_b, H, L, S) if spy else (1, 1, 1, 1))
    return shared_args(
        n_b, H, n, scalar=cap, table=table, table2=table2, doc=ids, diag=0.3, spy=spy
    )


def make_qkv(seed, n_b, L, S, h_kv=H, e=8, dtype=np.float64):
    rng = np.random.default_rng(seed + 1000)
    q = rng.standard_normal((n_b, H, L, e)).astype(dtype)
    k = rng.standard_normal((n_b, h_kv, S, e)).astype(dtype)
    v = rng.standard_normal((n_b, h_kv, S, e)).astype(dtype)
    return q, k, v, rng.standard_normal((n_b, H, L, e)).astype(dtype)


def run(q, k, v, g, args, fn=args_grad_fn, backward=None, **kw):
    """(dq, dk, dv, dmod_args) of nbattn's forward and backward with ``fn`` (and the
    backward's own keywords ``backward``)."""
    mods = dict(MODS)
    if "block_mask" in kw:
        del mods["mask_mod"]
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, mod_args=args, **mods, **kw)
    return nbattn.flash_attention_backward(
        q, k, v, out, lse, g, mod_args=args, score_mod_args_grad=fn, **mods, **kw,
        **(backward or {}),
    )  # fmt: skip


def keep_map(args, n_b, L, S, causal=False, window=None, alignment="top_left"):
    """(n_b, 1, L, S) boolean: the admissible entries (band and documents)."""
    ids = args[DOC]
    offset = S - L if alignment == "bottom_right" else 0
    d = np.arange(S)[None, :] - np.arange(L)[:, None] - offset
    band = np.ones((L, S), dtype=bool)
    if causal:
        band &= d <= 0
    if window is not None:
        band &= (d >= -window[0]) & (d <= window[1])
    qi, ki = ids[:, 0, :L, None], ids[:, 1, None, :S]
    return (band[None] & (qi >= 0) & (qi == ki))[:, None]


def dense_out(q, k, v, table, table2, cap, pyf, keep):
    """out of the explicit dense formulation, in torch (tensors (B, H, L, E) and k, v of
    H or fewer heads; a row without keys gives 0)."""
    n_b, _, L, e = q.shape
    S = k.shape[-2]
    reps = H // k.shape[1]
    kk, vv = k.repeat_interleave(reps, 1), v.repeat_interleave(reps, 1)
    i, j = torch.arange(L)[:, None], torch.arange(S)[None, :]
    heads = torch.arange(H)
    s = (q @ kk.transpose(-1, -2)) / np.sqrt(e) * cap
    s = s + table[heads % table.shape[0]][:, j - i + table.shape[1] // 2]
    s = s + table2[heads % table2.shape[0]][:, j % table2.shape[1]]
    s = s + pyf * (i == j).to(s.dtype)
    keep = torch.tensor(np.broadcast_to(keep, s.shape))
    empty = ~keep.any(-1, keepdim=True)
    s = torch.where(keep, s, -torch.inf).masked_fill(empty, 0.0)
    return torch.softmax(s, -1).masked_fill(empty, 0.0) @ vv


def dense(q, k, v, g, args, keep, learn=(0, 1, 2)):
    """Gradients of sum(g o out) by torch autograd on the explicit dense formulation, in
    float64: (dq, dk, dv) and those of the args entries in ``learn``."""
    tensors = [torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v)]
    tables = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in learned(args)]
    out = dense_out(*tensors, *tables, args[DIAG], keep)
    loss = (out * torch.tensor(np.asarray(g, np.float64))).sum()
    wrt = tensors + [tables[m] for m in learn]
    return [x.numpy() for x in torch.autograd.grad(loss, wrt)]


def close(got, want, tol=1e-10):
    np.testing.assert_allclose(got, want, rtol=0, atol=tol * max(1.0, np.nanmax(np.abs(want))))


# name: (n_b, L, S, h_kv, args keywords, call keywords)
CASES = {
    "one_table_row_for_all_heads_causal_gqa_documents": (
        2, 300, 300, 2, dict(rows=1, docs=3), dict(causal=True, enable_gqa=True)
    ),
    "window_bottom_right_and_a_1_element_table2": (
        1, 70, 150, H, dict(cols2=1), dict(window=(20, 5), causal_alignment="bottom_right")
    ),
    "window_and_causal_top_left": (1, 90, 60, H, dict(rows=2), dict(causal=True, window=(9, 3))),
    "L_1": (2, 1, 37, H, dict(docs=1), dict()),
    "S_1": (2, 29, 1, H, dict(docs=1), dict()),
    "L_1_S_1_causal": (1, 1, 1, H, dict(), dict(causal=True)),
}  # fmt: skip


def _case(name, seed=0, **extra):
    n_b, L, S, h_kv, spec, kw = CASES[name]
    q, k, v, g = make_qkv(seed, n_b, L, S, h_kv)
    args = make_args(seed, n_b, L, S, **{**spec, **extra})
    keep = keep_map(args, n_b, L, S, kw.get("causal", False), kw.get("window"),
                    kw.get("causal_alignment", "top_left"))  # fmt: skip
    return q, k, v, g, args, kw, keep


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_autograd_and_runs_only_on_admissible_entries(name):
    q, k, v, g, args, kw, keep = _case(name)
    copies = [x.copy() for x in (q, k, v, g, *learned(args), args[DOC])]
    dq, dk, dv, d_args = run(q, k, v, g, args, **kw)
    want = dense(q, k, v, g, args, keep)
    for got, ref in zip((dq, dk, dv, *learned(d_args)), want):
        close(got, ref)
    assert d_args[DOC] is None and d_args[DIAG] is None  # int array, Python float
    assert d_args[SCALAR].shape == () and d_args[TABLE2].shape == args[TABLE2].shape
    assert all(d.dtype == np.float64 for d in learned(d_args) + (d_args[SPY],))
    # the function ran exactly once on each admissible entry, nowhere else
    np.testing.assert_array_equal(d_args[SPY], np.broadcast_to(keep, d_args[SPY].shape))
    for x, y in zip((q, k, v, g, *learned(args), args[DOC]), copies):
        np.testing.assert_array_equal(x, y)  # inputs never modified


def test_fully_masked_rows_and_masked_keys():
    n_b, L, S = 2, 300, 280
    q, k, v, g = make_qkv(11, n_b, L, S)
    args = make_args(11, n_b, L, S, docs=2)
    ids = args[DOC]
    ids[0, 0, 5:140] = -1  # rows without keys
    ids[1, 1, 100:] = -2  # keys nobody sees
    ids[1, 0, 200:] = 7  # queries of a document without keys
    keep = keep_map(args, n_b, L, S)
    assert not keep[0, 0, 5:140].any() and not keep[1, 0, 200:].any()
    dq, dk, dv, d_args = run(q, k, v, g, args)
    want = dense(q, k, v, g, args, keep)
    for got, ref in zip((dq, dk, dv, *learned(d_args)), want):
        close(got, ref)
    np.testing.assert_array_equal(d_args[SPY], np.broadcast_to(keep, d_args[SPY].shape))
    assert not dq[0, :, 5:140].any() and not dq[1, :, 200:].any()


def test_everything_masked_gives_zero_gradients_and_no_call():
    n_b, L, S = 1, 40, 50
    q, k, v, g = make_qkv(12, n_b, L, S)
    args = make_args(12, n_b, L, S)
    args[DOC][:, 0] = -1
    dq, dk, dv, d_args = run(q, k, v, g, args)
    for d in (dq, dk, dv, *learned(d_args), d_args[SPY]):
        assert not d.any()


def test_block_mask_gives_the_mask_mod_gradients():
    # documents of 256 and 44 rows: tiles of the backward (128 x 256) fully inside one
    # document (never evaluating the mask), across two (per entry) and outside (skipped)
    n_b, L = 2, 300
    q, k, v, g = make_qkv(13, n_b, L, L)
    args = make_args(13, n_b, L, L)
    args[DOC][:, :2, 256:] = 1
    args[DOC][1, :2, 280:] = 2
    block = nbattn.create_block_mask(mask_fn, n_b, None, L, L, mod_args=args)
    assert 0 < block.sparsity(128, 256) < 1
    with_mask = run(q, k, v, g, args, causal=True)
    with_block = run(q, k, v, g, args, causal=True, block_mask=block)
    for got, want in zip(
        with_block[:3] + learned(with_block[3]), with_mask[:3] + learned(with_mask[3])
    ):
        close(got, want, 1e-13)
    np.testing.assert_array_equal(with_block[3][SPY], with_mask[3][SPY])
    keep = keep_map(args, n_b, L, L, causal=True)
    for got, ref in zip(learned(with_block[3]), dense(q, k, v, g, args, keep)[3:]):
        close(got, ref)


def test_varlen_with_empty_and_one_token_sequences():
    len_q = [0, 1, 37, 5, 0, 1, 130]
    len_k = [3, 1, 37, 0, 0, 4, 300]
    n_seq, n = len(len_q), max(len_q + len_k)
    cu_q = np.concatenate([[0], np.cumsum(len_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(len_k)]).astype(np.int64)
    rng = np.random.default_rng(14)
    q, g = (rng.standard_normal((H, cu_q[-1], 8)) for _ in range(2))
    k, v = (rng.standard_normal((2, cu_k[-1], 8)) for _ in range(2))
    args = make_args(14, n_seq, n, n, docs=2)
    kw = dict(enable_gqa=True, causal=True, causal_alignment="bottom_right")
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu_q, cu_k, return_lse=True, mod_args=args, **kw, **MODS
    )
    dq, dk, dv, d_args = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, g, cu_q, cu_k, mod_args=args, score_mod_args_grad=args_grad_fn,
        **kw, **MODS,
    )  # fmt: skip
    total = [np.zeros(a.shape) for a in learned(args)]
    calls = np.zeros_like(args[SPY])
    for s in range(n_seq):
        rq, rk = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        L, S = len_q[s], len_k[s]
        seq_args = with_args(args, doc=args[DOC][s : s + 1])
        keep = keep_map(seq_args, 1, L, S, True, None, "bottom_right")
        calls[s, :, :L, :S] = keep[0]
        if L == 0 or S == 0:
            assert not dq[:, rq].any() and not dk[:, rk].any() and not dv[:, rk].any()
            continue
        want = dense(q[None, :, rq], k[None, :, rk], v[None, :, rk], g[None, :, rq], seq_args, keep)
        close(dq[:, rq], want[0][0])
        close(dk[:, rk], want[1][0])
        for t, w in zip(total, want[3:]):
            t += w
    np.testing.assert_array_equal(d_args[SPY], calls)
    for got, want in zip(learned(d_args), total):
        close(got, want)


def test_finite_differences():
    q, k, v, g, args, kw, _ = _case("window_and_causal_top_left", seed=3)
    d_args = run(q, k, v, g, args, **kw)[3]

    def loss(a):
        return float(np.sum(g * nbattn.flash_attention(q, k, v, mod_args=a, **MODS, **kw)))

    centre = args[TABLE].shape[1] // 2
    picks = [(SCALAR, ()), (TABLE, (1, centre)), (TABLE, (0, centre - 9))]
    picks += [(TABLE, (1, centre + 3)), (TABLE, (0, centre + 4)), (TABLE, (1, centre - 10))]
    picks += [(TABLE2, (0, 3)), (TABLE2, (1, 6))]
    for m, index in picks:  # (0, centre + 4) and (1, centre - 10) lie outside the band: 0
        step = 1e-6
        up, down = ([a.copy() if isinstance(a, np.ndarray) else a for a in args] for _ in "ud")
        up[m][index] += step
        down[m][index] -= step
        diff = (loss(tuple(up)) - loss(tuple(down))) / (2 * step)
        assert abs(d_args[m][index] - diff) < 1e-6 * max(1.0, abs(diff)), (m, index)
    assert d_args[TABLE][0, centre + 4] == 0.0 and d_args[TABLE][1, centre - 10] == 0.0


def test_score_mod_grad_given_too_changes_nothing():
    q, k, v, g, args, kw, _ = _case("window_bottom_right_and_a_1_element_table2")
    plain = run(q, k, v, g, args, **kw)
    both = run(q, k, v, g, args, backward=dict(score_mod_grad=score_grad_fn), **kw)
    for got, want in zip(both[:3], plain[:3]):
        close(got, want, 1e-13)
    for got, want in zip(both[3], plain[3]):
        assert (got is None and want is None) or got.tobytes() == want.tobytes()


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_one_and_two_threads_and_two_runs_give_the_same_bits():
    q, k, v, g, args, kw, _ = _case("one_table_row_for_all_heads_causal_gqa_documents", seed=4)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run(q, k, v, g, args, **kw)[3]
        numba.set_num_threads(2)
        two = run(q, k, v, g, args, **kw)[3]
        again = run(q, k, v, g, args, **kw)[3]
    finally:
        numba.set_num_threads(saved)
    for a, b, c in zip(learned(one), learned(two), learned(again)):
        assert a.tobytes() == b.tobytes() == c.tobytes()


def _slots_per_cap(args, n_slots):
    """The FLASH_MAX_DQ_BUFFER_BYTES that leaves room for ``n_slots`` slot buffers."""
    per_slot = 8 * sum(a.size for a in args if isinstance(a, np.ndarray) and a.dtype.kind == "f")
    return n_slots * per_slot


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_a_memory_cap_on_the_slots_keeps_the_gradients_and_their_bits(monkeypatch):
    # 8 key/value slices: 16 slots would be 8; a cap leaves room for 3, then 1
    n_b, L = 4, 130
    q, k, v, g = make_qkv(15, n_b, L, L, h_kv=2)
    args = make_args(15, n_b, L, L, docs=2)
    # a large relative table (its rows beyond the band never read): 12 MB a slot
    big = np.random.default_rng(15).standard_normal((H, 2 * 200_000 - 1))
    big[:, 200_000 - L : 200_000 + L - 1] = args[TABLE][:, :]
    args = with_args(args, table=big)
    kw = dict(enable_gqa=True, causal=True)
    free = run(q, k, v, g, args, **kw)[3]  # 8 slots
    want = dense(q, k, v, g, args, keep_map(args, n_b, L, L, causal=True))[3:]
    for got, ref in zip(learned(free), want):
        close(got, ref)
    made = []

    def buffers(args, n_slots):
        made.append(n_slots)
        return args_buffers(args, n_slots)

    args_buffers = flex._args_buffers
    monkeypatch.setattr(flex, "_args_buffers", buffers)
    for n_slots in (3, 1):
        monkeypatch.setattr(config, "FLASH_MAX_DQ_BUFFER_BYTES", _slots_per_cap(args, n_slots))
        saved = numba.get_num_threads()
        try:
            numba.set_num_threads(1)
            one = run(q, k, v, g, args, **kw)[3]
            numba.set_num_threads(2)
            two = run(q, k, v, g, args, **kw)[3]
        finally:
            numba.set_num_threads(saved)
        for a, b, f in zip(learned(one), learned(two), learned(free)):
            assert a.tobytes() == b.tobytes()
            close(a, f, 1e-13)
        np.testing.assert_array_equal(one[SPY], free[SPY])
    assert made == [3, 3, 1, 1]


def _small(seed=6, **spec):
    """A one-batch causal case of 60 x 80 with two documents, its keep map."""
    q, k, v, g = make_qkv(seed, 1, 60, 80, h_kv=2)
    args = make_args(seed, 1, 60, 80, docs=2, **spec)
    return q, k, v, g, args, keep_map(args, 1, 60, 80, causal=True)


SMALL = dict(causal=True, enable_gqa=True)


def test_float32_inputs_with_float64_tables():
    q, k, v, g, args, keep = _small()
    q32, k32, v32, g32 = (x.astype(np.float32) for x in (q, k, v, g))
    dq, _, _, d_args = run(q32, k32, v32, g32, args, **SMALL)
    assert dq.dtype == np.float32 and all(d.dtype == np.float64 for d in learned(d_args))
    want = dense(q32, k32, v32, g32, args, keep)
    for got, ref in zip(learned(d_args), want[3:]):
        close(got, ref, 1e-5)


def test_float64_inputs_with_float32_tables_are_exact_to_float32_rounding():
    q, k, v, g, args, keep = _small(dtype=np.float32)
    dq, _, _, d_args = run(q, k, v, g, args, **SMALL)
    assert dq.dtype == np.float64 and all(d.dtype == np.float32 for d in learned(d_args))
    want = dense(q, k, v, g, args, keep)
    close(dq, want[0])  # the tables' float32 values, in float64 arithmetic
    for got, ref in zip(learned(d_args), want[3:]):
        close(got, ref, 1e-7)  # float32 rounding of the results


def test_float16_tables_get_gradients_in_float16():
    q, k, v, g, args, keep = _small(dtype=np.float16)
    d_args = run(q, k, v, g, args, **SMALL)[3]
    assert [d.dtype for d in learned(d_args)] == [np.float16] * 3
    want = dense(q, k, v, g, args, keep)
    for got, ref in zip(learned(d_args), want[3:]):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-6)


def test_read_only_non_contiguous_and_big_endian_tables():
    q, k, v, g, args, keep = _small()
    plain = run(q, k, v, g, args, **SMALL)[3]
    table, table2, cap = learned(args)
    wide = np.zeros((table.shape[0], 2 * table.shape[1]))
    wide[:, ::2] = table
    locked = table2.copy()
    locked.flags.writeable = False
    variants = {
        "read-only": (table, locked, cap),
        "strided": (wide[:, ::2], table2, cap),
        "transposed": (table, np.asfortranarray(table2), cap),
        "big-endian": (table.astype(">f8"), table2.astype(">f8"), cap.astype(">f8")),
    }
    for name, tables in variants.items():
        copies = [t.copy() for t in tables]
        got = run(q, k, v, g, with_learned(args, tables), **SMALL)[3]
        for d, p, t in zip(learned(got), learned(plain), tables):
            assert d.shape == t.shape, name
            assert d.dtype == t.dtype, name  # the gradient of a table in its own dtype
            assert d.astype(np.float64).tobytes() == p.tobytes(), name
        for t, c in zip(tables, copies):
            np.testing.assert_array_equal(t, c)
    assert not locked.flags.writeable


def test_big_endian_tables_get_gradients_of_their_dtype():
    q, k, v, g, args, keep = _small()
    tables = tuple(a.astype(">f8") for a in learned(args))
    d_args = run(q, k, v, g, with_learned(args, tables), **SMALL)[3]
    assert [d.dtype for d in learned(d_args)] == [np.dtype(">f8")] * 3


def test_tables_that_are_views_of_one_buffer():
    # table and table2 overlap: each gets the gradient of its own reads, the buffer is kept
    q, k, v, g, args, keep = _small()
    rows, cols = args[TABLE].shape
    buffer = np.random.default_rng(7).standard_normal(rows * cols + 10)
    table = buffer[: rows * cols].reshape(rows, cols)
    table2 = buffer[5 : 5 + 2 * 7].reshape(2, 7)
    aliased = with_args(args, table=table, table2=table2)
    kept = buffer.copy()
    d_args = run(q, k, v, g, aliased, **SMALL)[3]
    np.testing.assert_array_equal(buffer, kept)
    for got, ref in zip(learned(d_args), dense(q, k, v, g, aliased, keep)[3:]):
        close(got, ref)


EXTREMES = {
    # query i attends to i - 3 alone in head 0; keys i - 40 .. i - 21 excluded in head 1
    "1e300 entries": lambda t, t2, c, centre: (
        t[0].__setitem__(centre - 3, 1e300),
        t[1, centre - 40 : centre - 20].fill(-1e300),
    ),
    "subnormal tables and cap": lambda t, t2, c, centre: (
        t.__imul__(1e-310),
        t2.__imul__(1e-312),
        c.fill(5e-324),
    ),
    "-inf entries": lambda t, t2, c, centre: t[:, centre - 5].fill(-np.inf),
    # head 1 sees keys 2, 9, 16, ... (j % 7 == 2) at 1e300: ties of the largest score
    "tied 1e300 entries": lambda t, t2, c, centre: t2[1].__setitem__(2, 1e300),
}
TIES = (
    "lse = max + log(sum) rounds to the maximum when log(sum) is below half an ulp of "
    "it (scores of 1e300 here): P = exp(s - lse) is then 1 on each of n tied maxima "
    "instead of 1 / n, and the gradients of such rows (dq, dk, dv and those of mod_args) "
    "come n times too large"
)


@pytest.mark.parametrize(
    "what",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=TIES))
        if name.startswith("tied")
        else name
        for name in EXTREMES
    ],
)
def test_extreme_table_values_follow_the_dense_formulation(what):
    q, k, v, g, args, keep = _small(seed=8)
    table, table2, cap = (a.copy() for a in learned(args))
    EXTREMES[what](table, table2, cap, table.shape[1] // 2)
    bad = with_learned(args, (table, table2, cap))
    got = run(q, k, v, g, bad, **SMALL)
    want = dense(q, k, v, g, bad, keep)
    for d, ref in zip(got[:3] + learned(got[3]), want):
        close(d, ref)


def test_float32_extremes():
    # float64 q with a float32 table entry of 3e38 (one key per row): float64 arithmetic;
    # float32 q with a float64 one is refused (the float32 kernel's base-2 scores would
    # overflow), naming score_mod
    q, k, v, g, args, keep = _small(seed=9, dtype=np.float32)
    args[TABLE][0, args[TABLE].shape[1] // 2 - 2] = 3e38
    want = dense(q, k, v, g, args, keep)
    for d, ref in zip(learned(run(q, k, v, g, args, **SMALL)[3]), want[3:]):
        close(d, ref, 1e-7)  # float32 rounding of the results
    args64 = with_learned(args, tuple(a.astype(np.float64) for a in learned(args)))
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    with pytest.raises(ValueError, match="score_mod returned a score of magnitude 3e\\+38"):
        nbattn.flash_attention(q32, k32, v32, mod_args=args64, **MODS, **SMALL)


def test_float32_inputs_with_a_float64_table_entry_of_2e38():
    q, k, v, g, args, keep = _small(seed=9)
    args[TABLE][0, args[TABLE].shape[1] // 2 - 2] = 2e38  # below float32's largest / log2(e)
    q32, k32, v32, g32 = (x.astype(np.float32) for x in (q, k, v, g))
    want = dense(q32, k32, v32, g32, args, keep)
    got = run(q32, k32, v32, g32, args, **SMALL)
    for d, ref in zip(got[:3], want):
        close(d, ref, 1e-5)
    for d, ref in zip(learned(got[3]), want[3:]):
        close(d, ref, 1e-5)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_nan_or_inf_in_a_table_is_refused_by_the_backward_naming_out(value):
    q, k, v, g, args, keep = _small(seed=10)
    table = args[TABLE].copy()
    table[1, table.shape[1] // 2] = value  # the diagonal of head 1
    bad = with_args(args, table=table)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, mod_args=bad, **MODS, **SMALL)
    assert np.isnan(out[0, 1]).all(axis=-1).any() and not np.isnan(out[0, 0]).any()
    with pytest.raises(ValueError, match="out contains NaN or inf"):
        nbattn.flash_attention_backward(
            q, k, v, out, lse, g, mod_args=bad, score_mod_args_grad=args_grad_fn, **MODS, **SMALL
        )


def oob_fn(
    gs, score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, ids, left, right,
    pyf, spy, d_scalar, d_cap, d_slopes, d_table, d_table2, d_ids, d_left, d_right, d_pyf,
    d_spy,
):  # fmt: skip
    """Counts the calls of head 0 one element past the end of row 0 of the table's
    gradient."""
    if h == 0:
        d_table[0, table.shape[1]] += 1.0


def returns_fn(
    gs, score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, ids, left, right,
    pyf, spy, d_scalar, d_cap, d_slopes, d_table, d_table2, d_ids, d_left, d_right, d_pyf,
    d_spy,
):  # fmt: skip
    """The mistake of returning the gradient instead of adding it in."""
    return gs


def test_writes_past_a_row_land_in_the_next_row():
    # numba does not check bounds (as the docs say): d_table[0, cols] is d_table[1, 0] of
    # the same slot buffer; past the last row of the last slot it would be memory of
    # someone else, which nothing detects
    q, k, v, g, args, keep = _small()
    d_args = run(q, k, v, g, args, fn=oob_fn, **SMALL)[3]
    spilled = d_args[TABLE].copy()
    assert spilled[1, 0] == keep.sum()  # the calls of head 0: its admissible entries
    spilled[1, 0] = 0.0
    assert not spilled.any()


def test_a_function_that_returns_a_value_is_refused():
    q, k, v, g, args, keep = _small()
    with pytest.raises(ValueError, match="score_mod_args_grad"):
        run(q, k, v, g, args, fn=returns_fn, **SMALL)


def _refusal(match, **keywords):
    q, k, v, g, args, keep = _small()
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, mod_args=args, **MODS, **SMALL)
    call = dict(MODS, mod_args=args, score_mod_args_grad=args_grad_fn, **SMALL)
    call.update(keywords)
    kept = [x.copy() for x in (q, k, v, g, out, lse, *learned(args), args[DOC])]
    with pytest.raises(ValueError, match=match):
        nbattn.flash_attention_backward(q, k, v, out, lse, g, **call)
    for x, y in zip((q, k, v, g, out, lse, *learned(args), args[DOC]), kept):
        np.testing.assert_array_equal(x, y)


def test_refusals_name_the_argument_and_say_what_to_do():
    def short(
        gs, score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, ids,
        left, right, pyf, spy, d_scalar,
    ):  # fmt: skip
        pass

    _refusal(
        r"score_mod_args_grad must take \(grad_score, .*one gradient array.*26 in all",
        score_mod_args_grad=short,
    )
    _refusal("score_mod_args_grad must be a function", score_mod_args_grad="args_grad_fn")
    _refusal("score_mod_args_grad is given without score_mod", score_mod=None)
    _refusal(r"score_mod_args_grad runs on the CPU only \(device='cpu'", device="cuda")


def test_device_auto_runs_on_the_cpu():
    q, k, v, g, args, keep = _small()
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, mod_args=args, **MODS, **SMALL)
    call = dict(MODS, mod_args=args, score_mod_args_grad=args_grad_fn, **SMALL)
    auto = nbattn.flash_attention_backward(q, k, v, out, lse, g, device="auto", **call)
    cpu = nbattn.flash_attention_backward(q, k, v, out, lse, g, **call)
    for a, c in zip(auto[:3] + learned(auto[3]), cpu[:3] + learned(cpu[3])):
        assert a.tobytes() == c.tobytes()


def test_varlen_refuses_cuda():
    cu = np.array([0, 60], dtype=np.int64)
    q, k, v, g, args, keep = _small()
    q, k, v, g = (x[0, :, :60] for x in (q, k, v, g))
    with pytest.raises(ValueError, match="run on the CPU only"):
        nbattn.flash_attention_varlen_backward(
            q, k, v, v, np.zeros((H, 60)), g, cu, cu, mod_args=args, device="cuda",
            score_mod_args_grad=args_grad_fn, enable_gqa=True, **MODS,
        )  # fmt: skip


# ----------------------------------------------------------------- the torch adapter


def _torch_case(seed=20, n_b=2, L=45, S=50, h_kv=2, dtype=torch.float64):
    """q, k, v (requiring grad), mod_args as tensors (none requiring grad) and keep."""
    q, k, v, g = (torch.from_numpy(x) for x in make_qkv(seed, n_b, L, S, h_kv))
    args = make_args(seed, n_b, L, S, docs=2, spy=False)
    mod_args = to_torch(args)
    mod_args = with_learned(mod_args, [t.to(dtype) for t in learned(mod_args)])
    keep = keep_map(args, n_b, L, S, causal=True)
    return [x.requires_grad_() for x in (q, k, v)], g, mod_args, keep


def _adapter(q, k, v, mod_args, fn=args_grad_fn):
    from nbattn.torch import flash_attention

    kw = dict(causal=True, enable_gqa=q.shape[1] != k.shape[1])
    return flash_attention(q, k, v, mod_args=mod_args, score_mod_args_grad=fn, **kw, **MODS)


def test_torch_gradients_for_the_tensors_that_require_grad_only():
    (q, k, v), g, mod_args, keep = _torch_case()
    table, table2, cap = learned(mod_args)
    table.requires_grad_()
    cap.requires_grad_()
    ((_adapter(q, k, v, mod_args) * g).sum()).backward()
    got = [x.grad.clone() for x in (q, k, v, table, cap)]
    assert table2.grad is None
    for x in (q, k, v, table, cap):
        x.grad = None
    ((dense_out(q, k, v, table, table2, cap, mod_args[DIAG], keep) * g).sum()).backward()
    for a, b in zip(got, (q.grad, k.grad, v.grad, table.grad, cap.grad)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * max(1.0, b.abs().max().item()))


def test_torch_one_tensor_in_two_mod_args_entries_gets_both_gradients():
    (q, k, v), g, mod_args, keep = _torch_case(21)
    table = mod_args[TABLE].requires_grad_()
    twice = with_args(mod_args, table2=table)  # the relative table, read as the key bias too
    ((_adapter(q, k, v, twice) * g).sum()).backward()
    got = table.grad.clone()
    table.grad = None
    ((dense_out(q, k, v, table, table, twice[SCALAR], twice[DIAG], keep) * g).sum()).backward()
    torch.testing.assert_close(got, table.grad, rtol=0, atol=1e-10)


def test_torch_compile_aot_eager_gives_the_eager_gradients():
    (q, k, v), g, mod_args, _ = _torch_case(22)
    table, table2 = (mod_args[m].requires_grad_() for m in (TABLE, TABLE2))

    def loss(q, k, v, table, table2):
        return (_adapter(q, k, v, with_args(mod_args, table=table, table2=table2)) * g).sum()

    inputs = (q, k, v, table, table2)
    eager = torch.autograd.grad(loss(*inputs), inputs)
    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    for got, want in zip(torch.autograd.grad(compiled(*inputs), inputs), eager, strict=True):
        assert torch.equal(got, want)


def test_torch_gradcheck_on_a_tiny_case():
    (q, k, v), g, mod_args, _ = _torch_case(23, n_b=1, L=3, S=4, h_kv=H)
    table, table2, cap = (a.detach().clone().requires_grad_() for a in learned(mod_args))

    def f(q, k, v, table, table2, cap):
        return _adapter(q, k, v, with_learned(mod_args, (table, table2, cap)))

    assert torch.autograd.gradcheck(f, (q, k, v, table, table2, cap), eps=1e-6, atol=1e-8)


def test_torch_refusals_and_no_grad():
    from nbattn.torch import flash_attention

    (q, k, v), g, mod_args, _ = _torch_case(24)
    table = mod_args[TABLE].requires_grad_()
    with pytest.raises(ValueError, match=r"mod_args\[3\] requires grad.*pass score_mod_args_grad"):
        flash_attention(q, k, v, mod_args=mod_args, causal=True, enable_gqa=True, **MODS)
    with pytest.raises(RuntimeError, match="floating point"):  # torch's own rule
        mod_args[DOC].requires_grad_()
    with torch.no_grad():
        quiet = _adapter(q, k, v, mod_args)
    assert not quiet.requires_grad
    assert torch.equal(quiet, _adapter(q, k, v, mod_args).detach())
    assert table.grad is None


def test_torch_float16_tables_get_float16_gradients():
    (q, k, v), g, mod_args, keep = _torch_case(25, dtype=torch.float16)
    table, table2, cap = (a.requires_grad_() for a in learned(mod_args))
    ((_adapter(q, k, v, mod_args) * g).sum()).backward()
    assert [t.grad.dtype for t in (table, table2, cap)] == [torch.float16] * 3
    got = [t.grad.double() for t in (table, table2, cap)]
    wide = [t.detach().double().requires_grad_() for t in (table, table2, cap)]
    ((dense_out(q, k, v, *wide, mod_args[DIAG], keep) * g).sum()).backward()
    for a, w in zip(got, wide):
        torch.testing.assert_close(a, w.grad, rtol=2e-3, atol=1e-3)
