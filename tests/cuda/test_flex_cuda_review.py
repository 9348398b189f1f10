"""A hostile user's cases for programmable attention on the GPU (simulator).

``flash_attention(_backward)`` with ``score_mod`` / ``mask_mod`` / ``block_mask`` on
``device="cuda"`` is compared, forward (out, lse) and backward (dq, dk, dv), with the
dense float64 formulation (``naive.flex_attention_grads``, the reference the CPU flex
kernels are tested against in tests/attn/test_flex.py): every score_mod kind, every
mask kind, block masks of other shapes, odd shapes and dtypes, extreme magnitudes,
user functions of every form and wrong ``mod_args``.

No CPU flex kernel is compiled here: the GPU side runs as Python in the simulator,
the reference is NumPy. What compiles is the CPU's check of each user function (the
GPU refuses what the CPU refuses, with its messages) and ``create_block_mask``'s table.
"""

from __future__ import annotations

import os

import numba
import numpy as np
import pytest

import nbattn

from .. import naive

pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_ENABLE_CUDASIM") != "1", reason="runs under the CUDA simulator"
)

B, H, L, S, E, EV = 2, 2, 5, 6, 4, 3
#: The mod_args arrays cover up to 4 heads, 2 batch entries and 16 positions.
N_H, N_B, N = 4, 2, 16
WIDE = 10**6
#: Against the float64 dense formulation, relative to the reference's largest entry.
#: The worst over 10 seeds of every comparison in the two files (float32 the forward and
#: backward at the float32 cases): float64 1.8e-14 (E = 128; 5e-15 otherwise), float32
#: 7.9e-7; a margin of about 3 on each.
TOL = {np.float64: 1e-13, np.float32: 2e-6}


def score(score, b, h, q_idx, kv_idx, cap, slopes, table, scalar, doc, left, right, prefix):
    """A learned scalar, a tanh softcap (cap > 0), ALiBi slopes[h] (j - i) and a
    relative-position bias table[h, j - i + N]."""
    s = score * scalar
    if cap > 0:
        s = cap * nbattn.flex_tanh(s / cap)
    return s + slopes[h] * (kv_idx - q_idx) + table[h, kv_idx - q_idx + N]


def score_grad(score, b, h, q_idx, kv_idx, cap, slopes, table, scalar, doc, left, right,
               prefix):  # fmt: skip
    """The derivative of :func:`score` in its first argument (the dense reference's; the
    GPU takes the complex step)."""
    if cap > 0:
        t = np.tanh(score * scalar / cap)
        return scalar * (1.0 - t * t)
    return scalar + 0.0 * score


def mask(b, h, q_idx, kv_idx, cap, slopes, table, scalar, doc, left, right, prefix):
    """Same document and inside the window [i - left, i + right], or a key of the prefix."""
    same = doc[b, q_idx] == doc[b, kv_idx]
    inside = (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)
    return (same & inside) | (kv_idx < prefix)


def args(cap=0.0, alibi=False, table=False, scalar=1.0, docs=None, left=WIDE, right=WIDE,
         prefix=0):  # fmt: skip
    """The mod_args of :func:`score` and :func:`mask` (always the same types)."""
    rng = np.random.default_rng(11)
    slopes = 2.0 ** -(np.arange(N_H) + 1.0) if alibi else np.zeros(N_H)
    bias = rng.standard_normal((N_H, 2 * N + 1)) if table else np.zeros((N_H, 2 * N + 1))
    doc = np.zeros((N_B, N), dtype=np.int64)
    if docs is not None:
        doc[:, : len(docs)] = docs
        doc[:, len(docs) :] = docs[-1]
    return (float(cap), slopes, bias, float(scalar), doc, int(left), int(right), int(prefix))


def qkv(dtype=np.float64, shape=(B, H, L, S, E, EV), kv_heads=None, seed=0):
    n_b, n_h, n_q, n_k, e, ev = shape
    kv_heads = n_h if kv_heads is None else kv_heads
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_b, n_h, n_q, e)) * 1.5
    k = rng.standard_normal((n_b, kv_heads, n_k, e))
    v = rng.standard_normal((n_b, kv_heads, n_k, ev))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def both(q, k, v, device, grad=None, **kw):
    """(out, lse, dq, dk, dv) of one forward and backward on ``device``."""
    given = {"score_mod_grad": kw.pop("score_mod_grad")} if "score_mod_grad" in kw else {}
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device=device, **kw)
    if grad is None:
        grad = np.random.default_rng(3).standard_normal(out.shape).astype(out.dtype)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, grad, device=device, **kw, **given
    )  # fmt: skip
    return (out, lse, *grads)


def close(got, ref, dtype=np.float64, tol=None):
    """Equal non-finite entries; finite ones within a tolerance of the largest reference,
    and four of the dtype's smallest subnormals: results of subnormal size round on
    that grid at each step (float32 q of 1e-44 or v of 3e-45 against the float64
    reference: at most 2.5 of them over 10 seeds)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    np.testing.assert_array_equal(got[~finite], ref[~finite])
    size = max(np.abs(ref[finite]).max(initial=0.0), 1e-300)
    tol = TOL[dtype] if tol is None else tol
    slack = 4.0 * float(np.finfo(dtype).smallest_subnormal)
    assert np.abs(got[finite] - ref[finite]).max(initial=0.0) <= tol * size + slack


def gpu_equals_dense(q, k, v, dtype=np.float64, ref_mask=None, **kw):
    """The GPU's forward and backward (``kw``: flash_attention's keywords) equal the dense
    formulation (``ref_mask``: the mask of a ``block_mask``, its mod_args bound) within
    TOL[dtype], with the dtype rule (out and grads float32 when q, k, v all are, else
    float64; lse float64); returns the GPU's."""
    out_dtype = np.float32 if all(a.dtype == np.float32 for a in (q, k, v)) else np.float64
    grad = np.random.default_rng(3).standard_normal(q.shape[:-1] + v.shape[-1:])
    grad = grad.astype(out_dtype)
    got = both(q, k, v, "cuda", grad=grad, **kw)
    fn = kw.get("score_mod")
    assert fn in (None, score)  # the derivative below is score's
    ref = naive.flex_attention_grads(
        q, k, v, grad, fn, kw.get("mask_mod", ref_mask), kw.get("scale"), kw.get("mod_args", ()),
        score_grad=None if fn is None else score_grad, causal=kw.get("causal", False),
        window=kw.get("window"), enable_gqa=kw.get("enable_gqa", False),
    )  # fmt: skip
    for g, r, want in zip(got, ref, (out_dtype, np.float64, *[out_dtype] * 3), strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == want
        close(g, r, dtype)
    return got


def dense(q, k, v, score_mod=None, mask_mod=None, mod_args=(), grad=None, score_grad=None):
    """Dense (out, lse[, dq, dk, dv]) in float64 (``naive.flex_attention_grads``)."""
    return naive.flex_attention_grads(
        q, k, v, grad, score_mod, mask_mod, mod_args=mod_args, score_grad=score_grad
    )


PAIR = {"score_mod": score, "mask_mod": mask}

KINDS = {
    "softcap": args(cap=1.5),
    "alibi": args(alibi=True),
    "bias_table": args(table=True),
    "learned_scalar": args(scalar=-2.5),
    "causal": args(right=0),
    "documents": args(docs=[0, 0, 1, 1, 1, 2, 2]),
    "prefix_lm": args(right=0, prefix=3),
    "sliding_window": args(left=2, right=0),
    "everything_masked": args(left=-WIDE, right=-WIDE),
    "first_row_masked": args(right=-1),
    "all_of_them": args(
        cap=2.0,
        alibi=True,
        table=True,
        scalar=0.7,
        docs=[0, 0, 1, 1, 1, 1, 2],
        left=3,
        right=0,
        prefix=1,
    ),  # fmt: skip
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_equals_the_dense_formulation(kind):
    q, k, v = qkv()
    out, lse, *grads = gpu_equals_dense(q, k, v, mod_args=KINDS[kind], **PAIR)
    if kind == "everything_masked":
        np.testing.assert_array_equal(out, 0.0)
        np.testing.assert_array_equal(lse, -np.inf)
        for g in grads:
            np.testing.assert_array_equal(g, 0.0)
    if kind == "first_row_masked":
        assert np.all(lse[..., 0] == -np.inf) and np.isfinite(lse[..., 1:]).all()
        np.testing.assert_array_equal(grads[0][..., 0, :], 0.0)


@pytest.mark.parametrize("kind", ["all_of_them", "softcap", "documents"])
def test_float32_equals_the_dense_formulation(kind):
    q, k, v = qkv(np.float32)
    gpu_equals_dense(q, k, v, np.float32, mod_args=KINDS[kind], **PAIR)


@pytest.mark.parametrize(
    "shape",
    [(1, 2, 1, 6, 4, 3), (1, 2, 5, 1, 4, 3), (1, 2, 5, 6, 1, 1), (2, 1, 7, 9, 5, 3),
     (1, 2, 9, 3, 4, 2), (1, 2, 3, 4, 16, 7), (1, 1, 2, 3, 128, 128)],
    ids=["L1", "S1", "E1", "odd", "L_gt_S", "E16_Ev7", "E128"],
)  # fmt: skip
def test_shapes_equal_the_dense_formulation(shape):
    q, k, v = qkv(shape=shape)
    gpu_equals_dense(q, k, v, mod_args=args(cap=1.5, alibi=True, table=True, right=0), **PAIR)


def test_fewer_leading_dimensions_equal_the_dense_formulation():
    """q of shape (H, L, E) has b = 0 (the forward of q[None] bit for bit); (L, E) has
    b = h = 0; 5-D is refused."""
    q, k, v = qkv()
    mod_args = args(alibi=True, table=True, docs=[0, 0, 1, 1, 1, 2], right=0)
    three = gpu_equals_dense(q[1], k[1], v[1], mod_args=mod_args, **PAIR)
    four = nbattn.flash_attention(q[1:2], k[1:2], v[1:2], mod_args=mod_args, return_lse=True,
                                  device="cuda", **PAIR)  # fmt: skip
    for t, f in zip(three[:2], four, strict=True):
        np.testing.assert_array_equal(t, f[0])
    gpu_equals_dense(q[0, 1], k[0, 1], v[0, 1], mod_args=mod_args, **PAIR)
    with pytest.raises(ValueError, match="take q of shape \\(B, H, L, E\\)"):
        nbattn.flash_attention(q[None], k[None], v[None], mod_args=mod_args, device="cuda", **PAIR)


@pytest.mark.parametrize(("e", "ev"), [(129, 4), (4, 129)])
def test_head_dimension_129_is_refused(e, ev):
    q, k, v = qkv(shape=(1, 1, 2, 3, e, ev))
    with pytest.raises(ValueError, match="head dimensions up to 128.*device='cpu'"):
        nbattn.flash_attention(q, k, v, mod_args=args(), device="cuda", **PAIR)


def test_head_dimension_refusal_uses_the_api_names():
    q, k, v = qkv(shape=(1, 1, 2, 3, 129, 4))
    with pytest.raises(ValueError, match="E=129"):
        nbattn.flash_attention(q, k, v, mod_args=args(), device="cuda", **PAIR)


def test_gqa_equals_the_dense_formulation_and_bad_head_counts_are_refused():
    q, k, v = qkv(shape=(1, 4, 5, 6, 4, 3), kv_heads=2)
    mod_args = args(cap=1.5, alibi=True, table=True, right=0)
    gpu_equals_dense(q, k, v, mod_args=mod_args, enable_gqa=True, **PAIR)
    with pytest.raises(ValueError, match="set enable_gqa=True"):
        nbattn.flash_attention(q, k, v, mod_args=mod_args, device="cuda", **PAIR)
    q3, k3, v3 = qkv(shape=(1, 4, 5, 6, 4, 3), kv_heads=3)
    with pytest.raises(ValueError, match="H_kv=3 .* must divide the query heads H=4"):
        nbattn.flash_attention(
            q3, k3, v3, mod_args=mod_args, enable_gqa=True, device="cuda", **PAIR
        )


# --- block masks -------------------------------------------------------------------------

DOC_ARGS = args(docs=[0, 0, 1, 1, 1, 2], right=0)


def doc_mask(b, h, q_idx, kv_idx, *_):
    """``mask`` with DOC_ARGS: the dense reference of a block mask made of them."""
    return mask(b, h, q_idx, kv_idx, *DOC_ARGS)


@pytest.mark.parametrize(
    "made_for",
    [(3, 2, 5, 6), (2, 3, 5, 6), (2, 2, 4, 6), (2, 2, 5, 7), (2, 2, 6, 5), (1, 1, 6, 6)],
    ids=["B", "H", "L", "S", "L_S_swapped", "square"],
)
def test_block_mask_of_another_shape_is_refused(made_for):
    q, k, v = qkv()
    block_mask = nbattn.create_block_mask(mask, *made_for, mod_args=DOC_ARGS)
    with pytest.raises(ValueError, match="block_mask was made for \\(B, H, L, S\\)"):
        nbattn.flash_attention(q, k, v, block_mask=block_mask, device="cuda")
    out, lse = dense(q, k, v, mask_mod=mask, mod_args=DOC_ARGS)
    with pytest.raises(ValueError, match="block_mask was made for"):
        nbattn.flash_attention_backward(
            q, k, v, out, lse, out, block_mask=block_mask, device="cuda"
        )


def test_block_mask_for_query_heads_not_key_heads_under_gqa():
    q, k, v = qkv(shape=(2, 4, 5, 6, 4, 3), kv_heads=2)
    for_kv_heads = nbattn.create_block_mask(mask, 2, 2, 5, 6, mod_args=DOC_ARGS)
    with pytest.raises(ValueError, match="block_mask was made for"):
        nbattn.flash_attention(q, k, v, block_mask=for_kv_heads, enable_gqa=True, device="cuda")
    for_q_heads = nbattn.create_block_mask(mask, 2, 4, 5, 6, mod_args=DOC_ARGS)
    gpu_equals_dense(q, k, v, block_mask=for_q_heads, enable_gqa=True, score_mod=score,
                     mod_args=args(alibi=True), ref_mask=doc_mask)  # fmt: skip


def test_block_mask_reused_across_calls_and_broadcast():
    """One block mask serves several forward and backward calls: the first gives the
    bits of the per-element mask_mod, as does the same mask made with B = H = None
    (broadcast); the second, on new data and under causal=True, the dense values."""
    block_mask = nbattn.create_block_mask(mask, B, H, L, S, mod_args=DOC_ARGS)
    broadcast = nbattn.create_block_mask(mask, None, None, L, S, mod_args=DOC_ARGS)
    q, k, v = qkv(seed=1)
    per_element = both(q, k, v, "cuda", mask_mod=mask, mod_args=DOC_ARGS)
    for bm in (block_mask, broadcast):
        got = both(q, k, v, "cuda", block_mask=bm)
        for g, p in zip(got, per_element, strict=True):
            np.testing.assert_array_equal(g, p)
    q, k, v = qkv(seed=2)
    gpu_equals_dense(q, k, v, block_mask=block_mask, causal=True, ref_mask=doc_mask)
    with pytest.raises(ValueError, match="pass mask_mod or block_mask"):
        nbattn.flash_attention(q, k, v, block_mask=block_mask, mask_mod=mask,
                               mod_args=DOC_ARGS, device="cuda")  # fmt: skip
    with pytest.raises(ValueError, match="block_mask must come from nbattn.create_block_mask"):
        nbattn.flash_attention(q, k, v, block_mask=np.ones((L, S), bool), device="cuda")


# --- keywords ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [{"causal": True}, {"window": (2, 0)}, {"window": (1, 1)}, {"causal": True, "window": (2, 0)},
     {"window": (0, 0)}, {"scale": -2.0}, {"scale": 0.0}],
    ids=["causal", "window_left", "window_both", "causal_window", "window_0", "scale_neg",
         "scale_0"],
)  # fmt: skip
def test_keywords_combine_as_in_the_dense_formulation(kw):
    q, k, v = qkv()
    gpu_equals_dense(q, k, v, mod_args=args(alibi=True, docs=[0, 0, 1, 1, 1, 2]), **PAIR, **kw)


def test_causal_with_more_queries_than_keys():
    q, k, v = qkv(shape=(1, 2, 7, 3, 4, 3))
    gpu_equals_dense(q, k, v, mod_args=args(table=True), causal=True, **PAIR)


def test_features_without_a_gpu_form_are_refused_by_name():
    q, k, v = qkv()
    mod_args = args()
    for kw, name in (({"dropout_p": 0.1}, "dropout_p"), ({"mask": np.ones((L, S), bool)}, "mask")):
        with pytest.raises(ValueError, match=f"^{name} cannot be combined with score_mod"):
            nbattn.flash_attention(q, k, v, mod_args=mod_args, device="cuda", **PAIR, **kw)
    out = nbattn.flash_attention(q, k, v, mod_args=mod_args, dropout_p=0.0, device="cuda", **PAIR)
    ref = nbattn.flash_attention(q, k, v, mod_args=mod_args, device="cuda", **PAIR)
    np.testing.assert_array_equal(out, ref)


def test_auto_return_lse_and_repeat_calls_are_bit_identical():
    """device="auto" (the simulator counts as a GPU) gives the cuda bits; return_lse=False
    the same out; two calls, under 1 and 2 numba threads, the same bits; no input (q, k,
    v, out, lse, grad_out, mod_args) is written."""
    q, k, v = qkv(np.float32)
    mod_args = KINDS["all_of_them"]
    grad = np.random.default_rng(3).standard_normal((B, H, L, EV)).astype(np.float32)
    keep = [a.copy() for a in (q, k, v, *mod_args[1:3], mod_args[4], grad)]
    kw = dict(mod_args=mod_args, **PAIR)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device="cuda", **kw)
        results = [out.copy(), lse.copy()]
        grads = nbattn.flash_attention_backward(q, k, v, out, lse, grad, device="cuda", **kw)
        one = (out, lse, *grads)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = both(q, k, v, "cuda", grad=grad, **kw)
    finally:
        numba.set_num_threads(threads)
    auto = both(q, k, v, "auto", grad=grad, **kw)
    for a, b, c in zip(one, two, auto, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    plain = nbattn.flash_attention(q, k, v, device="cuda", **kw)
    np.testing.assert_array_equal(plain, out)
    inputs = [q, k, v, *mod_args[1:3], mod_args[4], grad, out, lse]
    for a, b in zip(keep + results, inputs, strict=True):
        np.testing.assert_array_equal(a, b)


# --- dtypes, layouts, magnitudes -----------------------------------------------------------


def test_mixed_and_half_dtypes_compute_in_float64():
    """float32 with float64, and float16, compute in float64 (the CPU's rule): float64
    results within float64's tolerance of the dense formulation."""
    q, k, v = qkv(np.float32)
    mod_args = KINDS["all_of_them"]
    gpu_equals_dense(q.astype(np.float64), k, v, mod_args=mod_args, **PAIR)
    half = [a.astype(np.float16) for a in (q, k, v)]
    gpu_equals_dense(*half, mod_args=mod_args, **PAIR)


@pytest.mark.parametrize("layout", ["strided", "fortran", "read_only", "broadcast_kv"])
def test_layouts_give_the_bits_of_contiguous_copies(layout):
    q, k, v = qkv(shape=(B, H, L, S, 8, 6))
    if layout == "strided":
        q, k, v = q[..., ::2], k[..., ::2], v[..., ::2]
    elif layout == "fortran":
        q, k, v = (np.asfortranarray(a) for a in (q, k, v))
    elif layout == "read_only":
        for a in (q, k, v):
            a.flags.writeable = False
    else:
        k, v = np.broadcast_to(k[:1], k.shape), np.broadcast_to(v[:1], v.shape)
    keep = [a.copy() for a in (q, k, v)]
    mod_args = KINDS["all_of_them"]
    got = both(q, k, v, "cuda", mod_args=mod_args, **PAIR)
    ref = both(*(np.array(a) for a in (q, k, v)), "cuda", mod_args=mod_args, **PAIR)
    for g, r in zip(got, ref, strict=True):
        np.testing.assert_array_equal(g, r)
    for a, b in zip(keep, (q, k, v), strict=True):
        np.testing.assert_array_equal(a, b)


def _scaled(q, k, v, what, factor):
    return {"q": (q * factor, k, v), "v": (q, k, v * factor), "qv": (q * factor, k, v * factor)}[
        what
    ]


@pytest.mark.parametrize(
    ("dtype", "what", "factor"),
    [
        (np.float64, "v", 1e300),
        (np.float32, "v", 1e30),
        (np.float64, "q", 1e-320),
        (np.float32, "q", 1e-44),
        (np.float64, "v", 1e-320),
        (np.float32, "v", 3e-45),
        (np.float64, "qv", -0.0),
    ],
    ids=["v_1e300", "v_1e30_f32", "q_subnormal", "q_subnormal_f32", "v_subnormal",
         "v_subnormal_f32", "minus_zero"],
)  # fmt: skip
def test_extreme_magnitudes_equal_the_dense_formulation(dtype, what, factor):
    q, k, v = _scaled(*qkv(dtype), what, factor)
    gpu_equals_dense(*(a.astype(dtype) for a in (q, k, v)), dtype, mod_args=args(right=0), **PAIR)


@pytest.mark.parametrize(("dtype", "factor"), [(np.float64, 1e300), (np.float32, 1e30)])
def test_huge_scores_forward_equals_the_dense_formulation(dtype, factor):
    q, k, v = (a.astype(dtype) for a in _scaled(*qkv(dtype), "q", factor))
    mod_args = args(right=0)
    out, lse = nbattn.flash_attention(q, k, v, mod_args=mod_args, return_lse=True, device="cuda",
                                      **PAIR)  # fmt: skip
    ref_out, ref_lse = dense(q, k, v, score, mask, mod_args)
    close(out, ref_out, dtype)
    close(lse, ref_lse, dtype)


@pytest.mark.parametrize(("dtype", "factor"), [(np.float32, 1e30), (np.float64, 1e20)])
def test_huge_scores_backward_stays_finite(dtype, factor):
    q, k, v = (a.astype(dtype) for a in _scaled(*qkv(dtype), "q", factor))
    grad = np.random.default_rng(3).standard_normal((B, H, L, EV)).astype(dtype)
    mod_args = args(right=0)
    got = both(q, k, v, "cuda", grad=grad, mod_args=mod_args, **PAIR)
    ref = dense(q, k, v, score, mask, mod_args, grad=grad, score_grad=score_grad)
    close(got[4], ref[4], dtype, tol=1e-6)


def test_float32_backward_at_large_scores_is_as_accurate_as_the_cpu():
    q, k, v = (a.astype(np.float32) for a in _scaled(*qkv(np.float32), "q", 300.0))
    grad = np.random.default_rng(3).standard_normal((B, H, L, EV)).astype(np.float32)
    mod_args = args(right=0)
    got = both(q, k, v, "cuda", grad=grad, mod_args=mod_args, **PAIR)
    ref = dense(q, k, v, score, mask, mod_args, grad=grad, score_grad=score_grad)
    close(got[4], ref[4], np.float32, tol=1e-6)


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_inputs_are_refused_by_name(name, bad):
    arrays = dict(zip("qkv", qkv(), strict=True))
    arrays[name][0, 1, 2, 0] = bad
    with pytest.raises(ValueError, match=f"^{name} contains NaN or inf"):
        nbattn.flash_attention(**arrays, mod_args=args(), device="cuda", **PAIR)


def test_nan_inf_and_minus_inf_from_score_mod_as_on_the_cpu():
    """NaN or +inf on an admissible entry: the row's out and lse are NaN (as in the dense
    formulation, and on the CPU); -inf masks the entry (a row of -inf only: zeros and
    lse = -inf); a finite score beyond max / log2(e) is refused, in float32 too, with
    the CPU's message."""
    q, k, v = qkv()
    mod_args = list(args(table=True))
    table = mod_args[2].copy()
    table[1, N + 1] = np.nan  # head 1: the entries j = i + 1
    table[0, N - 2] = np.inf  # head 0: j = i - 2
    table[0, N - 1] = -np.inf  # head 0: j = i - 1 masked
    mod_args[2] = table
    kw = dict(mod_args=tuple(mod_args), return_lse=True, **PAIR)
    got = nbattn.flash_attention(q, k, v, device="cuda", **kw)
    ref = dense(q, k, v, score, mask, tuple(mod_args))
    assert np.isnan(got[1][:, 1, : L - 1]).all() and np.isnan(got[1][:, 0, 2:]).all()
    for g, r in zip(got, ref, strict=True):
        close(g, r)
    table = np.full_like(table, -np.inf)
    mod_args[2] = table
    out, lse, *grads = gpu_equals_dense(q, k, v, mod_args=tuple(mod_args), **PAIR)
    np.testing.assert_array_equal(lse, -np.inf)
    q32, k32, v32 = qkv(np.float32)
    mod_args[2] = np.zeros_like(table)
    mod_args[2][0, N] = 3e38
    # the CPU kernel's refusal, with this message, is tested in the CPU suite
    # (tests/attn/test_flex_args_grad_review.py): here it would compile that kernel
    with pytest.raises(ValueError, match="score_mod returned a score of magnitude 3e\\+38"):
        nbattn.flash_attention(q32, k32, v32, device="cuda", mod_args=tuple(mod_args), **PAIR)


# --- user functions ----------------------------------------------------------------------

FACTOR = 2.0
TABLE = np.arange(4.0)


def doubled(score, b, h, q_idx, kv_idx):
    return score * 2.0


def reads_factor(score, b, h, q_idx, kv_idx):
    return score * FACTOR


def reads_global_array(score, b, h, q_idx, kv_idx):
    return score + TABLE[h]


def scaled_by(c):
    def scaled(score, b, h, q_idx, kv_idx):
        return score * c

    return scaled


def biased_by(bias):
    def biased(score, b, h, q_idx, kv_idx):
        return score + bias[h]

    return biased


def constant_int(score, b, h, q_idx, kv_idx):
    return 1


def distance_int(score, b, h, q_idx, kv_idx):
    return kv_idx - q_idx


def positive(score, b, h, q_idx, kv_idx):
    return score > 0


def five(score, b, h, q_idx, kv_idx):
    """Not the derivative of ``doubled`` (2): the backward must use it as given."""
    return 5.0 + 0.0 * score


def _dense_scaled(q, k, v, c, grad=None, score_grad=None):
    return dense(q, k, v, lambda s, *_: s * c, grad=grad, score_grad=score_grad)


def test_lambdas_njit_and_closures_of_one_code():
    """A lambda, an njit'ed function and a def of one formula give the same bits; closures
    of one code over different numbers give their own results (no kernel shared between
    them), equal ones the same bits; each equals the dense formulation."""
    q, k, v = qkv()
    ref = both(q, k, v, "cuda", score_mod=doubled)
    for fn in (lambda s, b, h, i, j: s * 2.0, numba.njit(doubled), scaled_by(2.0), scaled_by(2.0)):
        for g, r in zip(both(q, k, v, "cuda", score_mod=fn), ref, strict=True):
            np.testing.assert_array_equal(g, r)
    for c in (-1.0, 0.5, 2.0):
        got = nbattn.flash_attention(
            q, k, v, score_mod=scaled_by(c), return_lse=True, device="cuda"
        )
        for g, r in zip(got, _dense_scaled(q, k, v, c), strict=True):
            close(g, r)


def test_a_changed_global_scalar_is_seen(monkeypatch):
    q, k, v = qkv()
    for c in (2.0, -3.0):
        monkeypatch.setattr(f"{__name__}.FACTOR", c)
        got = nbattn.flash_attention(
            q, k, v, score_mod=reads_factor, return_lse=True, device="cuda"
        )
        for g, r in zip(got, _dense_scaled(q, k, v, c), strict=True):
            close(g, r)


def helper_times(c):
    """A CUDA device function x -> c x (its name is ``helper`` whatever ``c``)."""
    from numba import cuda

    @cuda.jit(device=True)
    def helper(x):
        return x * c

    return helper


def calling(helper):
    def score_mod(score, b, h, q_idx, kv_idx):
        return helper(score)

    return score_mod


def test_closures_over_different_cuda_device_functions_are_not_confused():
    q, k, v = qkv()
    for c in (2.0, -3.0):
        got = nbattn.flash_attention(q, k, v, score_mod=calling(helper_times(c)), return_lse=True,
                                     device="cuda")  # fmt: skip
        for g, r in zip(got, _dense_scaled(q, k, v, c), strict=True):
            close(g, r)


def test_arrays_in_globals_or_closures_are_refused():
    q, k, v = qkv()
    for fn, where in ((reads_global_array, "'TABLE' from its globals"),
                      (biased_by(np.zeros(H)), "'closure bias' from its closure")):  # fmt: skip
        with pytest.raises(ValueError, match=f"score_mod reads the array {where}.*mod_args"):
            nbattn.flash_attention(q, k, v, score_mod=fn, device="cuda")


def test_objects_that_are_not_plain_functions_are_refused_by_name():
    import functools

    from numba import cuda

    q, k, v = qkv()

    class Callable:
        def __call__(self, score, b, h, q_idx, kv_idx):
            return score

    with pytest.raises(ValueError, match="score_mod must be a function, got float"):
        nbattn.flash_attention(q, k, v, score_mod=2.0, device="cuda")
    for fn in (max, Callable(), functools.partial(doubled), cuda.jit(device=True)(doubled)):
        with pytest.raises(TypeError, match="score_mod must be a plain function"):
            nbattn.flash_attention(q, k, v, score_mod=fn, device="cuda")
    for kw, name in (
        ({"score_mod": lambda s, b, h, i: s}, "score_mod"),
        ({"mask_mod": lambda s, b, h, i, j: True}, "mask_mod"),
        ({"score_mod": doubled, "score_mod_grad": lambda s, b, h: 2.0}, "score_mod_grad"),
    ):
        with pytest.raises(ValueError, match=f"^{name} must take"):
            both(q, k, v, "cuda", **kw)
    with pytest.raises(ValueError, match="score_mod_grad is given without score_mod"):
        nbattn.flash_attention_backward(
            q, k, v, q[..., :EV], q[..., 0], q[..., :EV], mask_mod=lambda b, h, i, j: True,
            score_mod_grad=five, device="cuda",
        )  # fmt: skip


@pytest.mark.parametrize("fn", [constant_int, distance_int])
def test_score_mod_returning_ints_forward(fn):
    q, k, v = qkv()
    got = nbattn.flash_attention(q, k, v, score_mod=fn, return_lse=True, device="cuda")
    for g, r in zip(got, dense(q, k, v, fn), strict=True):
        close(g, r)


def test_score_mod_returning_ints_backward_is_refused_as_on_the_cpu():
    """Refused by the check of the function before any kernel (the forward's results
    from the dense formulation: no CPU kernel compiles)."""
    q, k, v = qkv()
    out, lse = dense(q, k, v, distance_int)
    for device in ("cpu", "cuda"):
        with pytest.raises(ValueError, match="not differentiable by complex step"):
            nbattn.flash_attention_backward(
                q, k, v, out, lse, out, score_mod=distance_int, device=device
            )


def test_score_mod_returning_bool_is_refused_as_on_the_cpu():
    q, k, v = qkv()
    for device in ("cpu", "cuda"):
        with pytest.raises(ValueError, match="score_mod must return a real number"):
            nbattn.flash_attention(q, k, v, score_mod=positive, device=device)


def test_score_mod_grad_is_used_as_given():
    """The backward takes score_mod_grad as the derivative, right or wrong (5 where the
    derivative is 2): dense dS = P o (dP - D) o score_mod_grad; without it, the complex
    step's 2 (one forward serves both)."""
    q, k, v = qkv()
    grad = np.random.default_rng(3).standard_normal((B, H, L, EV))
    out, lse = nbattn.flash_attention(q, k, v, score_mod=doubled, return_lse=True, device="cuda")
    for given, derivative in (({"score_mod_grad": five}, five),
                              ({}, lambda s, *_: 2.0 + 0 * s)):  # fmt: skip
        got = nbattn.flash_attention_backward(
            q, k, v, out, lse, grad, score_mod=doubled, device="cuda", **given
        )
        ref = _dense_scaled(q, k, v, 2.0, grad=grad, score_grad=derivative)
        for g, r in zip((out, lse, *got), ref, strict=True):
            close(g, r)


# --- mod_args ----------------------------------------------------------------------------


def _with(mod_args, index, value):
    return mod_args[:index] + (value,) + mod_args[index + 1 :]


def test_mod_args_in_other_layouts_give_the_native_bits():
    """Big-endian, Fortran, strided, read-only and float16 arrays (exact values) and
    numpy scalars give the bits of native C-contiguous float64 arrays (one call per
    variant of the table, the other entries' variants spread over them)."""
    q, k, v = qkv(shape=(1, H, L, S, E, EV))
    mod_args = KINDS["all_of_them"]
    ref = both(q, k, v, "cuda", mod_args=mod_args, **PAIR)
    table = mod_args[2]
    wide = np.zeros((table.shape[0], 2 * table.shape[1]))
    wide[:, ::2] = table
    read_only = table.copy()
    read_only.flags.writeable = False
    for changes in (
        {1: mod_args[1].astype(">f8"), 2: np.asfortranarray(table), 4: mod_args[4].astype(">i8"),
         0: np.float64(mod_args[0]), 5: np.int32(mod_args[5])},
        {1: mod_args[1].astype(np.float16), 2: wide[:, ::2]},
        {2: read_only},
    ):  # fmt: skip
        changed = tuple(changes.get(i, a) for i, a in enumerate(mod_args))
        got = both(q, k, v, "cuda", mod_args=changed, **PAIR)
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_array_equal(g, r)


def test_bad_mod_args_are_refused_by_name():
    q, k, v = qkv()
    mod_args = KINDS["all_of_them"]
    cases = [
        (list(mod_args), "mod_args must be a tuple"),
        (
            _with(mod_args, 1, mod_args[1].astype(complex)),
            "mod_args\\[1\\] must be a bool, int or float",
        ),
        (_with(mod_args, 1, np.array([0.5, None])), "mod_args\\[1\\] must be a bool, int or float"),
        (_with(mod_args, 1, [0.5, 0.25]), "mod_args\\[1\\] must be a NumPy array or a number"),
        (_with(mod_args, 1, np.ma.masked_array(mod_args[1])), "mod_args\\[1\\] is a masked array"),
        (_with(mod_args, 3, np.longdouble(1.0)), "mod_args\\[3\\] has dtype float128"),
        (_with(mod_args, 7, 2**64), "mod_args\\[7\\] = 18446744073709551616 is beyond"),
        (mod_args[:-1], "score_mod must take .* \\(7 given\\)"),
        (mod_args + (1,), "score_mod must take .* \\(9 given\\)"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            nbattn.flash_attention(q, k, v, mod_args=bad, device="cuda", **PAIR)
    with pytest.raises(ValueError, match="mod_args are the trailing arguments"):
        nbattn.flash_attention(q, k, v, mod_args=mod_args, device="cuda")
