"""Gradients with respect to the arrays of ``mod_args`` (``score_mod_args_grad``).

Against torch autograd on the dense formulation (float64, 1e-10), finite differences,
varlen against flash on each sequence alone, float32, bit-identical repeats on one and
two threads, the refusals and the torch adapter learning a bias table. Every case runs
the same module-level functions (``score_fn`` and ``mask_fn`` of ``tests/flex_cases.py``,
shared with other files, and :func:`args_grad_fn`, shared with
``test_flex_args_grad_review.py``) with different ``mod_args``, so the
file compiles one specialisation per dtype: a learned softcap cap (0-d; none when 0),
ALiBi slopes[h] (j - i), a relative position bias table[h, j - i + centre], documents
and, when causal, a window of right side 0.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import nbattn
from tests.flex_cases import (
    CAP,
    DOC,
    MODS,
    RIGHT,
    SLOPES,
    TABLE,
    WIDE,
    make_args,
    mask_fn,
    score_fn,
    to_torch,
    with_args,
)

torch = pytest.importorskip("torch")

# L crosses the flash tiles of the default sizes (the small tiles of the conftest's
# fixture would turn numba's on-disk cache off, a compile of the kernels every run) and
# makes the calls large enough to run on every thread.
B, H, L, E = 2, 4, 300, 8
CENTRE = L - 1  # the table's column of kv_idx - q_idx = 0


def args_grad_fn(
    grad_score, score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, doc, left,
    right, diag, spy, d_scalar, d_cap, d_slopes, d_table, d_table2, d_doc, d_left, d_right,
    d_diag, d_spy,
):  # fmt: skip
    """d score_fn / d (scalar, cap, slopes, table, table2) times grad_score, added in. Also
    test_flex_args_grad_review.py's (one args module for both files), hence: it writes
    into the placeholders of doc and diag too (no gradient: the writes go unseen) and
    counts its calls in d_spy[b, h, i, j] when spy is (B, H, L, S), not the (1, 1, 1, 1)
    stand-in of this file."""
    s = score * scalar[()]
    c = cap[()]
    if c > 0:
        t = np.tanh(s / c)
        d_cap[()] += grad_score * (t - s / c * (1.0 - t * t))
        d_scalar[()] += grad_score * score * (1.0 - t * t)
    else:
        d_scalar[()] += grad_score * score
    d_slopes[h] += grad_score * (kv_idx - q_idx)
    d_table[h % table.shape[0], kv_idx - q_idx + table.shape[1] // 2] += grad_score
    d_table2[h % table2.shape[0], kv_idx % table2.shape[1]] += grad_score
    d_doc[b, 0, q_idx] += grad_score
    d_diag[0] += grad_score
    if spy.shape[1] > 1:
        d_spy[b, h, q_idx, kv_idx] += 1.0


LEARNED = (CAP, SLOPES, TABLE)  # the mod_args entries with gradients here


def _learned(d_args):
    return tuple(d_args[m] for m in LEARNED)


def _args(seed, cap=0.0, docs=1, causal=0, n=L, n_b=B, dtype=np.float64):
    rng = np.random.default_rng(seed)
    doc = np.zeros((n_b, n), dtype=np.int64)
    if docs > 1:
        for b in range(n_b):
            cuts = np.sort(rng.choice(np.arange(1, n), docs - 1, replace=False))
            doc[b] = np.searchsorted(cuts, np.arange(n), "right")
    slopes = 0.5 * rng.standard_normal(H)
    table = rng.standard_normal((H, 2 * n - 1))
    right = 0 if causal else WIDE
    cap, slopes, table = (np.asarray(x, dtype=dtype) for x in (cap, slopes, table))
    return make_args(n_b, H, n, cap=cap, slopes=slopes, table=table, doc=doc, right=right)


def _qkv(seed, h_kv=H, n_b=B, dtype=np.float64):
    rng = np.random.default_rng(seed + 100)
    q = rng.standard_normal((n_b, H, L, E)).astype(dtype)
    k = rng.standard_normal((n_b, h_kv, L, E)).astype(dtype)
    v = rng.standard_normal((n_b, h_kv, L, E)).astype(dtype)
    return q, k, v, rng.standard_normal((n_b, H, L, E)).astype(dtype)


def _nbattn(q, k, v, g, args, gqa=False):
    out, lse = nbattn.flash_attention(
        q, k, v, return_lse=True, enable_gqa=gqa, mod_args=args, **MODS
    )
    return nbattn.flash_attention_backward(
        q, k, v, out, lse, g, enable_gqa=gqa, mod_args=args, score_mod_args_grad=args_grad_fn,
        **MODS,
    )  # fmt: skip


def _dense(q, k, v, g, args):
    """Gradients of sum(g o out) by torch autograd on the explicit dense formulation."""
    cap, table, doc, causal = args[CAP], args[TABLE], args[DOC][:, 0], args[RIGHT] == 0
    t = [torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in (q, k, v)]
    tc, ts, tt = (
        torch.tensor(np.asarray(x, dtype=np.float64), requires_grad=True) for x in _learned(args)
    )
    tq, tk, tv = t
    reps = tq.shape[1] // tk.shape[1]
    kk, vv = tk.repeat_interleave(reps, 1), tv.repeat_interleave(reps, 1)
    s = tq @ kk.transpose(-1, -2) / np.sqrt(q.shape[-1])
    if float(cap) > 0:
        s = tc * torch.tanh(s / tc)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    rel = torch.tensor(j - i)
    s = s + ts[:, None, None] * rel + tt[:, torch.tensor(j - i + table.shape[1] // 2)]
    keep = doc[:, None, :, None] == doc[:, None, None, :]
    if causal:
        keep = keep & (j <= i)
    s = torch.where(torch.tensor(keep), s, -torch.inf)
    out = torch.softmax(s, -1) @ vv
    (out * torch.tensor(np.asarray(g, dtype=np.float64))).sum().backward()
    d_cap = tc.grad.numpy() if float(cap) > 0 else np.zeros(())
    return [x.grad.numpy() for x in t], (d_cap, ts.grad.numpy(), tt.grad.numpy())


CASES = {
    "bias_table": dict(),
    "alibi_and_table_with_documents": dict(docs=3),
    "softcap": dict(cap=1.3),
    "causal_gqa": dict(causal=1, h_kv=2),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_matches_torch_autograd_of_the_dense_formulation(case, seed):
    spec = dict(CASES[case])
    h_kv = spec.pop("h_kv", H)
    q, k, v, g = _qkv(seed, h_kv)
    args = _args(seed, **spec)
    copies = [x.copy() for x in (q, k, v, g, *_learned(args), args[DOC])]
    dq, dk, dv, d_args = _nbattn(q, k, v, g, args, gqa=h_kv != H)
    (tq, tk, tv), want = _dense(q, k, v, g, args)
    for got, ref in zip((dq, dk, dv) + _learned(d_args), [tq, tk, tv, *want]):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))
    assert d_args[DOC] is None and d_args[RIGHT] is None  # doc ids, the window side
    for x, y in zip((q, k, v, g, *_learned(args), args[DOC]), copies):
        np.testing.assert_array_equal(x, y)  # inputs never modified


def test_finite_differences():
    q, k, v, g = _qkv(3)
    args = _args(3, cap=1.7, docs=2)
    d_args = _nbattn(q, k, v, g, args)[3]

    def loss(a):
        return float(np.sum(g * nbattn.flash_attention(q, k, v, mod_args=a, **MODS)))

    rng = np.random.default_rng(3)
    picks = [(CAP, ()), (SLOPES, (2,)), (TABLE, (1, CENTRE)), (TABLE, (3, CENTRE - 5))]
    picks += [(TABLE, (0, CENTRE + 9))]
    picks += [(TABLE, (int(rng.integers(H)), int(rng.integers(2 * L - 1)))) for _ in range(3)]
    for m, index in picks:
        step = 1e-6
        up = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        down = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        up[m][index] += step
        down[m][index] -= step
        diff = (loss(tuple(up)) - loss(tuple(down))) / (2 * step)
        assert abs(d_args[m][index] - diff) < 1e-6 * max(1.0, abs(diff)), (m, index)


def test_varlen_sums_the_gradients_of_each_sequence_alone():
    rng = np.random.default_rng(5)
    lengths = [L, 9, 140]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    q, k, v, g = (rng.standard_normal((H, cu[-1], E)) for _ in range(4))
    # one document per sequence (b is the sequence), causal
    args = _args(5, cap=1.1, causal=1, n=L, n_b=len(lengths))
    out, lse = nbattn.flash_attention_varlen(
        q, k, v, cu, cu, return_lse=True, mod_args=args, **MODS
    )
    dq, dk, dv, d_args = nbattn.flash_attention_varlen_backward(
        q, k, v, out, lse, g, cu, cu, mod_args=args, score_mod_args_grad=args_grad_fn, **MODS
    )
    total = [np.zeros_like(a) for a in _learned(args)]
    for s in range(len(lengths)):
        rows = slice(cu[s], cu[s + 1])
        alone = _nbattn(*(x[None, :, rows] for x in (q, k, v, g)), args)
        for got, want in zip((dq, dk, dv), alone[:3]):
            np.testing.assert_allclose(got[:, rows], want[0], rtol=0, atol=1e-13)
        for t, d in zip(total, _learned(alone[3])):
            t += d
    for got, want in zip(_learned(d_args), total):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_float32_within_float32_rounding():
    q, k, v, g = _qkv(7, h_kv=2, dtype=np.float32)
    args = _args(7, cap=1.5, docs=2, dtype=np.float32)
    dq, dk, dv, d_args = _nbattn(q, k, v, g, args, gqa=True)
    _, want = _dense(q, k, v, g, args)
    for got, ref in zip(_learned(d_args), want):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_one_and_two_threads_and_two_runs_give_the_same_bytes():
    q, k, v, g = _qkv(9, h_kv=2)
    args = _args(9, cap=1.2, docs=3, causal=1)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _nbattn(q, k, v, g, args, gqa=True)[3]
        numba.set_num_threads(2)
        two = _nbattn(q, k, v, g, args, gqa=True)[3]
        again = _nbattn(q, k, v, g, args, gqa=True)[3]
    finally:
        numba.set_num_threads(saved)
    for a, b, c in zip(_learned(one), _learned(two), _learned(again)):
        assert a.tobytes() == b.tobytes() == c.tobytes()


def test_refusals():
    q, k, v, g = _qkv(0, n_b=1)
    args = _args(0, n_b=1)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, mod_args=args, **MODS)
    call = (q, k, v, out, lse, g)

    def wrong_arity(grad_score, score, b, h, q_idx, kv_idx, cap, slopes, table, doc, causal):
        return None

    with pytest.raises(ValueError, match="score_mod_args_grad must take"):
        nbattn.flash_attention_backward(
            *call, mod_args=args, score_mod_args_grad=wrong_arity, **MODS
        )
    with pytest.raises(ValueError, match="score_mod_args_grad is given without score_mod"):
        nbattn.flash_attention_backward(
            *call, mask_mod=mask_fn, mod_args=args, score_mod_args_grad=args_grad_fn
        )

    def complex_into_float(
        gs, s, b, h, i, j, scalar, cap, slopes, table, table2, doc, left, right, diag,
        spy, *grads,
    ):  # fmt: skip
        grads[3][h, 0] = gs * 1j  # d_table: the gradient arrays are float64

    with pytest.raises(ValueError, match="score_mod_args_grad.*could not be compiled"):
        nbattn.flash_attention_backward(
            *call, mod_args=args, score_mod_args_grad=complex_into_float, **MODS
        )


def _torch_dense(q, k, v, table):
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    s = q @ k.transpose(-1, -2) / np.sqrt(E) + table[:, j - i + CENTRE]
    return torch.softmax(s.masked_fill(j > i, -torch.inf), -1) @ v


def test_torch_adapter_learns_a_bias_table():
    from nbattn.torch import flash_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, L, E, dtype=torch.float64) for _ in range(3))
    base = to_torch(_args(0, n_b=1))
    table = torch.zeros(H, 2 * L - 1, dtype=torch.float64, requires_grad=True)
    target = _torch_dense(q, k, v, torch.randn(H, 2 * L - 1, dtype=torch.float64))

    def loss_of(t):
        mod_args = with_args(base, slopes=base[SLOPES] * 0, table=t, right=0)
        out = flash_attention(q, k, v, mod_args=mod_args, score_mod_args_grad=args_grad_fn, **MODS)
        return ((out - target) ** 2).sum()

    loss = loss_of(table)
    loss.backward()
    reference = table.detach().clone().requires_grad_(True)
    ((_torch_dense(q, k, v, reference) - target) ** 2).sum().backward()
    torch.testing.assert_close(table.grad, reference.grad, rtol=0, atol=1e-10)

    with pytest.raises(ValueError, match="mod_args\\[3\\] requires grad.*score_mod_args_grad"):
        flash_attention(q, k, v, mod_args=with_args(base, table=table, right=0), **MODS)

    optimiser = torch.optim.Adam([table], lr=0.1)
    losses = []
    for _ in range(5):
        optimiser.zero_grad()
        loss = loss_of(table)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.75 * losses[0], losses


def test_torch_compile_and_opcheck_of_the_backward_with_mod_args_gradients():
    import torch._dynamo.testing

    import nbattn.torch as nbt

    n = 50
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, H, n, E, dtype=torch.float64, requires_grad=True) for _ in range(3))
    base = to_torch(_args(1, 1.4, n=n, n_b=1))
    slopes, table = base[SLOPES].requires_grad_(), base[TABLE].requires_grad_()

    def loss(q, k, v, slopes, table):
        mod_args = with_args(base, slopes=slopes, table=table)
        out = nbt.flash_attention(
            q, k, v, mod_args=mod_args, score_mod_args_grad=args_grad_fn, **MODS
        )
        return out.square().sum()

    inputs = (q, k, v, slopes, table)
    eager = torch.autograd.grad(loss(*inputs), inputs)
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss, backend=counter, fullgraph=True)
    for got, want in zip(torch.autograd.grad(compiled(*inputs), inputs), eager, strict=True):
        assert torch.equal(got, want)
    graphs = counter.frame_count
    new_table = (2.0 * table).detach().requires_grad_()
    compiled(q, k, v, slopes, new_table).backward()  # a new table: no recompile
    assert counter.frame_count == graphs and new_table.grad is not None
    assert sum("nbattn.flash_attention.default" in g.code for g in counter.graphs) == 1

    mod_args = with_args(base, slopes=slopes.detach(), table=table.detach())
    out, lse = nbt.flash_attention(q, k, v, mod_args=mod_args, return_lse=True, **MODS)
    handles = nbt._mod_handles(score_fn, mask_fn, None, None, args_grad_fn)
    constants = [a for a in mod_args if isinstance(a, torch.Tensor)]
    ints, floats = [WIDE, WIDE], [0.0]  # left, right; diag
    settings = (ints, floats, "ttttttiift", False, None, False, None, None, "top_left", None, 0.0)
    backward = (q, k, v, out.detach(), lse, torch.ones_like(out), None, None)
    backward += (constants, *settings, *handles.values())
    checks = ("test_schema", "test_faketensor")  # no autograd: no second derivatives
    torch.library.opcheck(
        torch.ops.nbattn.flash_attention_backward.default, backward, test_utils=checks
    )


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_placeholders_of_entries_without_gradient_have_one_type_per_ndim(ndim):
    """The stand-ins for non-float mod_args entries (an int document table, a number) are
    typed alike whatever their shape and the slot count, so a batch of 1 after a batch of
    2 does not compile the gradient kernels again (a (1, ..., 1) stand-in was C-contiguous
    and the others not)."""
    from nbattn.attn.flex import _args_buffers

    rng = np.random.default_rng(ndim)
    seen = set()
    for _ in range(20):
        shape = tuple(int(n) for n in rng.integers(1, 4, ndim))
        table = np.zeros(shape, dtype=np.int64)
        for n_slots in (1, 2, 5):
            stand_in, number = _args_buffers((table, 3), n_slots)
            assert stand_in.shape[1:] == shape and stand_in.shape[0] >= n_slots
            stand_in[n_slots - 1, ...] = 1.0  # every element is the slot's one scratch value
            assert (stand_in[n_slots - 1] == 1.0).all()
            seen.add((numba.typeof(stand_in), numba.typeof(number)))
    assert len(seen) == 1, seen
