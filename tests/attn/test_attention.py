"""nbattn.attention (soft / hard / sample), hierarchical attention vs naive.py and torch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config

from .. import naive
from .._scripts import load_script
from ..strategies import attention_shapes, float_dtypes, huge_values, magnitude_cases, seeds
from .test_softmax import assert_close


def _qkv(rng, batch, L, S, E, Ev, dtype=np.float64):
    q = rng.normal(size=batch + (L, E)).astype(dtype)
    k = rng.normal(size=batch + (S, E)).astype(dtype)
    v = rng.normal(size=batch + (S, Ev)).astype(dtype)
    return q, k, v


def _both_paths(q, k, v, **kw):
    """The streaming path (no weights) and the weight-matrix path must agree."""
    fast = nbattn.attention(q, k, v, **kw)
    out, w = nbattn.attention(q, k, v, return_weights=True, **kw)
    return fast, out, w


CASES = [
    # batch, L, S, E, Ev
    ((), 5, 7, 4, 3),
    ((2,), 1, 1, 3, 2),  # S = 1, L = 1
    ((2, 3), 6, 4, 5, 8),  # batch and head dimensions, L > S
    ((3,), 4, 9, 2, 1),  # L < S
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("causal", [False, True])
def test_soft_scaled_dot_matches_naive(rng, dtype, case, causal):
    batch, L, S, E, Ev = case
    q, k, v = _qkv(rng, batch, L, S, E, Ev, dtype)
    fast, out, w = _both_paths(q, k, v, causal=causal)
    ref, ref_w = naive.attention(q, k, v, causal=causal)
    for got in (fast, out):
        assert got.dtype == dtype and got.shape == batch + (L, Ev)
        assert_close(got, ref, dtype)
    assert_close(w, ref_w, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_soft_with_masks_and_broadcast(rng, dtype):
    q, k, v = _qkv(rng, (2, 3), 5, 6, 4, 3, dtype)
    bool_mask = rng.random((5, 6)) > 0.4
    bool_mask[1] = False  # a fully masked query row
    key_pad = rng.random((2, 1, 1, 6)) > 0.3  # key padding, per batch entry
    float_mask = rng.normal(size=(3, 5, 6)).astype(dtype)  # per head
    for mask in (bool_mask, key_pad, float_mask):
        for causal in (False, True):
            fast, out, w = _both_paths(q, k, v, mask=mask, causal=causal)
            ref, ref_w = naive.attention(q, k, v, mask=mask, causal=causal)
            assert_close(fast, ref, dtype)
            assert_close(out, ref, dtype)
            assert_close(w, ref_w, dtype)
    fast = nbattn.attention(q, k, v, mask=bool_mask)
    assert np.all(fast[:, :, 1] == 0) and not np.isnan(fast).any()


def test_broadcast_over_mask_batch(rng):
    # the mask brings the batch dimension: q, k, v unbatched
    q, k, v = _qkv(rng, (), 3, 4, 2, 2)
    mask = rng.random((5, 3, 4)) > 0.3
    fast, out, w = _both_paths(q, k, v, mask=mask)
    ref, ref_w = naive.attention(q, k, v, mask=mask)
    assert fast.shape == (5, 3, 2)
    assert_close(fast, ref)
    assert_close(w, ref_w)


def test_many_keys_cross_blocks_and_rescale(rng):
    # S spans several key blocks; increasing scores force the running-max rescale
    # and L spans several query tiles, the last one partial
    S = 2 * config.KEY_BLOCK + 37
    L = 2 * config.QUERY_BLOCK + 3
    q, k, v = _qkv(rng, (2,), L, S, 3, 2)
    k[..., 0] += np.linspace(0, 6, S)
    q[..., 0] = 3.0
    mask = rng.random((L, S)) > 0.2
    for causal in (False, True):
        fast, out, w = _both_paths(q, k, v, mask=mask, causal=causal)
        ref, ref_w = naive.attention(q, k, v, mask=mask, causal=causal)
        assert_close(fast, ref)
        assert_close(out, ref)


def test_extreme_scores_are_stable(rng):
    q, k, v = _qkv(rng, (), 4, 6, 3, 2)
    q *= 300.0  # scores of order 1e3: the textbook exp overflows
    fast, out, _ = _both_paths(q, k, v)
    ref, _ = naive.attention(q, k, v)
    assert_close(fast, ref)
    assert np.isfinite(fast).all()


SCORE_CASES = ["dot", "scaled_dot", "additive", "bilinear", "bilinear_lowrank", "gaussian"]


@pytest.mark.parametrize("name", SCORE_CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_score_through_attention(rng, name, dtype):
    Eq = 4
    Ek = 3 if name in ("additive", "bilinear", "bilinear_lowrank") else 4
    q = rng.normal(size=(2, 5, Eq)).astype(dtype)
    k = rng.normal(size=(2, 6, Ek)).astype(dtype)
    v = rng.normal(size=(2, 6, 3)).astype(dtype)
    mask = rng.random((5, 6)) > 0.3
    if name == "additive":
        W, U, a = rng.normal(size=(7, Ek)), rng.normal(size=(7, Eq)), rng.normal(size=7)
        kw = {"score": "additive", "score_params": {"W": W, "U": U, "v": a}}

        def fn(q, k):
            return naive.additive_scores(q, k, W, U, a)
    elif name == "bilinear":
        W = rng.normal(size=(Ek, Eq))
        kw = {"score": "bilinear", "W": W}

        def fn(q, k):
            return naive.bilinear_scores(q, k, W)
    elif name == "bilinear_lowrank":
        U, V = rng.normal(size=(2, Ek)), rng.normal(size=(2, Eq))
        kw = {"score": "bilinear", "U": U, "V": V}

        def fn(q, k):
            return naive.bilinear_scores(q, k, U=U, V=V)
    elif name == "gaussian":
        kw = {"score": "gaussian", "bandwidth": 0.8}

        def fn(q, k):
            return naive.gaussian_attention_scores(q, k, 0.8)
    else:
        kw = {"score": name}
        fn = naive.dot_scores if name == "dot" else naive.scaled_dot_scores
    fast, out, w = _both_paths(q, k, v, mask=mask, causal=True, **kw)
    ref, ref_w = naive.attention(q, k, v, fn, mask=mask, causal=True)
    assert_close(fast, ref, dtype)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)


@pytest.mark.parametrize("mode", ["soft", "hard", "sample"])
def test_row_slices_bound_the_score_matrix(rng, monkeypatch, mode):
    # with a small limit the weight-matrix path runs in slices of query rows
    q, k, v = _qkv(rng, (2,), 7, 5, 3, 2)
    mask = rng.random((7, 5)) > 0.3
    kw = {"score": "gaussian", "mask": mask, "causal": True, "mode": mode, "random_state": 5}
    whole = nbattn.attention(q, k, v, **kw)
    ref, _ = naive.attention(
        q,
        k,
        v,
        naive.gaussian_attention_scores,
        mask=mask,
        causal=True,
        mode=mode,
        random_state=5,
    )
    assert_close(whole, ref)
    monkeypatch.setattr(config, "MAX_WEIGHT_MATRIX_ELEMENTS", 2 * 2 * 5)  # 2 rows per slice
    assert_close(nbattn.attention(q, k, v, **kw), ref)
    with pytest.raises(ValueError, match="MAX_WEIGHT_MATRIX_ELEMENTS"):
        nbattn.attention(q, k, v, return_weights=True)


def test_callable_score(rng):
    q, k, v = _qkv(rng, (2,), 3, 4, 5, 2)
    out = nbattn.attention(q, k, v, score=lambda q, k: -naive.dot_scores(q, k))
    ref, _ = naive.attention(q, k, v, lambda q, k: -naive.dot_scores(q, k))
    assert_close(out, ref)
    with pytest.raises(ValueError, match="score callable returned shape"):
        nbattn.attention(q, k, v, score=lambda q, k: np.zeros((1, 1)))


def test_key_value_with_k_equal_v_is_plain_soft_attention(rng):
    x = rng.normal(size=(6, 3))
    q = rng.normal(size=(2, 3))
    ref, _ = naive.attention(q, x, x)
    assert_close(nbattn.attention(q, x, x), ref)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hard_attention(rng, dtype):
    q, k, v = _qkv(rng, (2, 2), 5, 6, 3, 4, dtype)
    mask = rng.random((5, 6)) > 0.3
    mask[2] = False
    out, w = nbattn.attention(q, k, v, mask=mask, causal=True, mode="hard", return_weights=True)
    ref, ref_w = naive.attention(q, k, v, mask=mask, causal=True, mode="hard")
    assert_close(out, ref, dtype)
    assert np.array_equal(w, ref_w)
    assert np.all(out[..., 2, :] == 0)
    assert_close(nbattn.attention(q, k, v, mask=mask, causal=True, mode="hard"), ref, dtype)


def test_sample_attention_matches_naive_draws(rng):
    q, k, v = _qkv(rng, (3,), 4, 5, 2, 3)
    mask = rng.random((4, 5)) > 0.3
    out, w = nbattn.attention(
        q, k, v, mask=mask, mode="sample", random_state=7, return_weights=True
    )
    ref, ref_w = naive.attention(q, k, v, mask=mask, mode="sample", random_state=7)
    assert np.array_equal(w, ref_w)
    assert_close(out, ref)
    again = nbattn.attention(
        q, k, v, mask=mask, mode="sample", random_state=np.random.default_rng(7)
    )
    assert np.array_equal(again, out)


def test_sample_attention_frequencies_follow_the_distribution(rng):
    # one query, repeated: the selection frequencies estimate alpha
    n = 20000
    q = np.tile(rng.normal(size=(1, 3)), (n, 1))
    k = rng.normal(size=(4, 3))
    v = np.eye(4)
    _, alpha = nbattn.attention(q[:1], k, v, return_weights=True)
    picks = nbattn.attention(q, k, v, mode="sample", random_state=3)
    freq = picks.mean(axis=0)
    sd = np.sqrt(alpha[0] * (1 - alpha[0]) / n)
    assert np.all(np.abs(freq - alpha[0]) < 5 * sd + 1e-12)


def test_fully_masked_rows_are_zero_not_nan(rng):
    q, k, v = _qkv(rng, (2,), 3, 4, 2, 2)
    mask = np.ones((3, 4), bool)
    mask[0] = False
    for mode in ("soft", "hard", "sample"):
        out, w = nbattn.attention(
            q, k, v, mask=mask, mode=mode, random_state=0, return_weights=True
        )
        assert not np.isnan(out).any()
        assert np.all(out[:, 0] == 0) and np.all(w[:, 0] == 0)
    fast = nbattn.attention(q, k, v, mask=np.zeros((3, 4), bool))
    assert np.all(fast == 0)
    fmask = np.where(mask, 0.0, -np.inf)
    assert np.all(nbattn.attention(q, k, v, mask=fmask)[:, 0] == 0)


def test_inputs_not_modified(rng):
    q, k, v = _qkv(rng, (2,), 3, 4, 2, 2)
    mask = rng.normal(size=(3, 4))
    saved = [a.copy() for a in (q, k, v, mask)]
    nbattn.attention(q, k, v, mask=mask, causal=True)
    nbattn.attention(q, k, v, mask=mask, return_weights=True, mode="hard")
    for a, b in zip((q, k, v, mask), saved):
        assert np.array_equal(a, b)


def test_validation(rng):
    q, k, v = _qkv(rng, (2,), 3, 4, 5, 2)
    with pytest.raises(ValueError, match="k and v must have the same number of keys"):
        nbattn.attention(q, k, v[:, :3])
    with pytest.raises(ValueError, match="same width"):
        nbattn.attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="mask has shape"):
        nbattn.attention(q, k, v, mask=np.ones((3, 5), bool))
    with pytest.raises(ValueError, match="batch"):
        nbattn.attention(q, k, v, mask=np.ones((3, 3, 4), bool))
    with pytest.raises(ValueError, match="mask must be boolean"):
        nbattn.attention(q, k, v, mask=np.ones((3, 4), int))
    with pytest.raises(ValueError, match="score must be one of"):
        nbattn.attention(q, k, v, score="cosine")
    with pytest.raises(ValueError, match="mode must be one of"):
        nbattn.attention(q, k, v, mode="greedy")
    with pytest.raises(ValueError, match="v contains NaN"):
        nbattn.attention(q, k, np.full_like(v, np.nan))
    with pytest.raises(ValueError, match="q contains NaN or inf"):
        nbattn.attention(np.full_like(q, np.inf), k, v)
    with pytest.raises(ValueError, match="unknown"):
        nbattn.attention(q, k, v, W=np.eye(5))
    with pytest.raises(ValueError, match="needs the parameter v"):
        nbattn.attention(q, k, v, score="additive", W=np.eye(5), U=np.eye(5))
    with pytest.raises(ValueError, match="causal"):
        nbattn.attention(q, k, v, causal="yes")


def test_matches_torch_sdpa(rng):
    torch = pytest.importorskip("torch")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = _qkv(rng, (2, 3), 5, 7, 4, 6)
    T = [torch.tensor(a) for a in (q, k, v)]
    bool_mask = rng.random((2, 1, 5, 7)) > 0.3
    bool_mask[..., 0] = True  # no fully masked rows: torch gives NaN there
    float_mask = rng.normal(size=(5, 7))
    checks = [
        ({}, {}),
        ({"mask": bool_mask}, {"attn_mask": torch.tensor(bool_mask)}),
        ({"mask": float_mask}, {"attn_mask": torch.tensor(float_mask)}),
        ({"causal": True}, {"is_causal": True}),
        ({"scale": 0.7}, {"scale": 0.7}),
    ]
    for ours, theirs in checks:
        ref = sdpa(*T, **theirs).numpy()
        fast, out, _ = _both_paths(q, k, v, **ours)
        np.testing.assert_allclose(fast, ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    # float32 and L > S causal
    q32, k32, v32 = (a.astype(np.float32) for a in _qkv(rng, (4,), 8, 3, 16, 5))
    ref = sdpa(*(torch.tensor(a) for a in (q32, k32, v32)), is_causal=True).numpy()
    out = nbattn.attention(q32, k32, v32, causal=True)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_fully_masked_rows_vs_torch(rng):
    # older torch returns NaN on a fully masked row, torch 2.5+ (math backend) zeros;
    # nbattn always gives zeros

    torch = pytest.importorskip("torch")
    q, k, v = _qkv(rng, (), 3, 4, 2, 2)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(a) for a in (q, k, v)), attn_mask=torch.tensor(mask)
    ).numpy()
    out = nbattn.attention(q, k, v, mask=mask)
    assert np.isnan(ref[1]).all() or np.all(ref[1] == 0)
    assert np.all(out[1] == 0)
    np.testing.assert_allclose(out[[0, 2]], ref[[0, 2]], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- hierarchical
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hierarchical_attention_matches_naive(rng, dtype):
    x = rng.normal(size=(10, 4)).astype(dtype)
    ids = np.array([3, 3, 1, 1, 1, 7, 3, 7, 1, 9])  # unsorted, non-contiguous labels
    uw = rng.normal(size=4).astype(dtype)
    us = rng.normal(size=4).astype(dtype)
    res = nbattn.hierarchical_attention(x, ids, uw, us)
    doc, segs, item_w, seg_w = naive.hierarchical_attention(x, ids, uw, us)
    assert np.array_equal(res.segment_labels, [1, 3, 7, 9])
    assert_close(res.output, doc, dtype)
    assert_close(res.segments, segs, dtype)
    assert_close(res.item_weights, item_w, dtype)
    assert_close(res.segment_weights, seg_w, dtype)
    for g in res.segment_labels:
        np.testing.assert_allclose(res.item_weights[ids == g].sum(), 1.0, rtol=1e-5)


def test_hierarchical_attention_values_and_validation(rng):
    x = rng.normal(size=(5, 3))
    vals = rng.normal(size=(5, 2))
    ids = np.array([0, 0, 1, 1, 1])
    res = nbattn.hierarchical_attention(x, ids, rng.normal(size=3), rng.normal(size=2), values=vals)
    assert res.output.shape == (2,) and res.segments.shape == (2, 2)
    assert_close(res.segments[0], res.item_weights[:2] @ vals[:2])
    with pytest.raises(ValueError, match="segment_ids"):
        nbattn.hierarchical_attention(x, ids[:4], np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="segment_ids"):
        nbattn.hierarchical_attention(x, ids.astype(float), np.ones(3), np.ones(3))
    with pytest.raises(ValueError, match="item_query"):
        nbattn.hierarchical_attention(x, ids, np.ones((1, 3)), np.ones(3))
    with pytest.raises(ValueError, match="same width"):
        nbattn.hierarchical_attention(x, ids, np.ones(2), np.ones(3))


# --------------------------------------------------------------------------- properties
@settings(max_examples=30)
@given(
    shape=attention_shapes(batch=(2, 3), queries=7, keys=7, features=5),
    Ev=st.integers(1, 4),
    causal=st.booleans(),
    with_mask=st.booleans(),
    dtype=float_dtypes,
    seed=seeds,
)
def test_attention_property(shape, Ev, causal, with_mask, dtype, seed):
    batch, L, S, E = shape
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, batch, L, S, E, Ev, dtype)
    mask = rng.random((L, S)) > 0.3 if with_mask else None
    fast, out, w = _both_paths(q, k, v, mask=mask, causal=causal)
    ref, ref_w = naive.attention(q, k, v, mask=mask, causal=causal)
    assert_close(fast, ref, dtype)
    assert_close(out, ref, dtype)
    assert_close(w, ref_w, dtype)
    rows = w.sum(axis=-1)
    assert np.all((np.abs(rows - 1) < 1e-5) | (rows == 0))


# --------------------------------------------------------------------------- figures
def test_show_heatmaps(rng, tmp_path):
    from nbattn.app.plotting import show_heatmaps

    _, w = nbattn.attention(*_qkv(rng, (2, 3), 4, 5, 2, 2), return_weights=True)
    fig = show_heatmaps(w, "keys", "queries", ["a", "b", "c"])
    assert len(fig.axes) == 2 * 3 + 1  # panels and the colour bar
    assert [ax.get_title() for ax in fig.axes[:3]] == ["a", "b", "c"]
    show_heatmaps(w[0, 0], path=tmp_path / "one.png")
    assert (tmp_path / "one.png").stat().st_size > 0
    with pytest.raises(ValueError, match="titles"):
        show_heatmaps(w, titles=["a", "b"])
    with pytest.raises(ValueError, match="weights must be"):
        show_heatmaps(np.zeros((1, 1, 1, 2, 2)))


def test_attention_tour_writes_its_figures(tmp_path):
    load_script("attention_tour").main(tmp_path)
    assert len(list(tmp_path.glob("*.png"))) == 7


# --------------------------------------------------------------------------- kernel state
def _naive_lse(s):
    m = s.max(axis=-1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(s - safe[..., None]).sum(axis=-1))


def test_streaming_kernel_lse_and_key_split_merge(rng):
    # the single entry point of the streaming path returns (out, lse); two key halves
    # merged with merge_attention_states equal attention over all keys
    from nbattn.attn.attention import _soft_attention as soft_owned
    from nbattn.attn.softmax import merge_attention_states

    def _soft_attention(q, k, v, *args):  # it takes arrays it may modify: give it copies
        return soft_owned(q.copy(), k.copy(), v.copy(), *args)

    q, k, v = _qkv(rng, (3,), 6, 11, 4, 2)
    mask = rng.random((6, 11)) > 0.3
    mask[2] = False
    mask[4, :5] = False  # row 4: nothing in the first half
    bias = np.where(mask, 0.0, -np.inf)[None]
    scale = 0.5
    out, lse = _soft_attention(q, k, v, scale, bias, False)
    s = naive.dot_scores(q, k) * scale + bias
    ref, _ = naive.attention(q, k, v, lambda q, k: naive.dot_scores(q, k) * scale, mask=mask)
    assert_close(out, ref)
    assert_close(lse, _naive_lse(s))
    a = _soft_attention(q, k[:, :5], v[:, :5], scale, np.ascontiguousarray(bias[..., :5]), False)
    b = _soft_attention(q, k[:, 5:], v[:, 5:], scale, np.ascontiguousarray(bias[..., 5:]), False)
    merged, merged_lse = merge_attention_states(*a, *b)
    assert_close(merged, ref)
    assert_close(merged_lse, _naive_lse(s))


def test_submodule_imports():
    from nbattn.attn.hierarchical import hierarchical_attention
    from nbattn.attn.multihead import multi_head_attention

    assert hierarchical_attention is nbattn.hierarchical_attention
    assert multi_head_attention is nbattn.multi_head_attention


def test_hierarchical_attention_with_additive_and_gaussian_scores(rng):
    x = rng.normal(size=(7, 3))
    ids = np.array([0, 1, 0, 1, 1, 2, 2])
    uw, us = rng.normal(size=3), rng.normal(size=3)
    W, U, a = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=4)
    res = nbattn.hierarchical_attention(
        x,
        ids,
        uw,
        us,
        score="additive",
        item_score_params={"W": W, "U": U, "v": a},
        segment_score_params={"W": W, "U": U, "v": a},
    )
    segs = []
    for g in range(3):
        xs = x[ids == g]
        alpha = naive.softmax_rows(naive.additive_scores(uw[None], xs, W, U, a))[0]
        assert_close(res.item_weights[ids == g], alpha)
        segs.append(alpha @ xs)
    segs = np.array(segs)
    beta = naive.softmax_rows(naive.additive_scores(us[None], segs, W, U, a))[0]
    assert_close(res.segment_weights, beta)
    assert_close(res.output, beta @ segs)
    res_g = nbattn.hierarchical_attention(x, ids, uw, us, score="gaussian")
    beta_g = naive.softmax_rows(naive.gaussian_attention_scores(us[None], res_g.segments))[0]
    assert_close(res_g.segment_weights, beta_g)


# --------------------------------------------------------------------------- extreme magnitudes
@settings(max_examples=40)
@given(**magnitude_cases([0, 100, 300, 308], 6))
def test_huge_float_masks_match_long_double(exponent, L, S, causal, dtype, seed):
    """A float mask up to 1e308 (float64 scores, or float32 scores with a float64 mask)."""
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, (2,), L, S, 3, 2, dtype)
    mask = huge_values(rng, (L, S), exponent)
    s = naive.scaled_dot_scores(q, k).astype(np.longdouble) + mask.astype(np.longdouble)
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    w_ref = naive.softmax_extended(s)
    ref = (w_ref @ v.astype(np.longdouble)).astype(np.float64)
    fast, out, w = _both_paths(q, k, v, mask=mask, causal=causal)
    for got in (fast, out):
        assert not np.isnan(got).any()
        assert_close(got, ref, dtype)
    assert_close(w, w_ref.astype(np.float64), dtype)
