"""Scoring functions of the attention chapter vs tests/naive.py, their registry and validation."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn import scores

from .. import naive
from ..strategies import attention_shapes, float_dtypes, seeds
from .test_softmax import assert_close


def _params(rng, eq, ek, hidden=5, dtype=np.float64):
    return {
        "W": rng.normal(size=(hidden, ek)).astype(dtype),
        "U": rng.normal(size=(hidden, eq)).astype(dtype),
        "v": rng.normal(size=hidden).astype(dtype),
    }


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_dot_and_scaled_dot(rng, dtype):
    q = rng.normal(size=(2, 3, 4, 6)).astype(dtype)
    k = rng.normal(size=(3, 7, 6)).astype(dtype)  # broadcasts over the first axis
    s = scores.dot(q, k)
    assert s.shape == (2, 3, 4, 7) and s.dtype == dtype
    assert_close(s, naive.dot_scores(q, k), dtype)
    assert_close(scores.scaled_dot(q, k), naive.scaled_dot_scores(q, k), dtype)
    assert_close(scores.scaled_dot(q, k, scale=0.3), naive.scaled_dot_scores(q, k, 0.3), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_additive(rng, dtype):
    q = rng.normal(size=(2, 5, 3)).astype(dtype)
    k = rng.normal(size=(2, 4, 6)).astype(dtype)  # Eq != Ek
    p = _params(rng, 3, 6, hidden=9, dtype=dtype)
    s = scores.additive(q, k, p["W"], p["U"], p["v"])
    assert s.shape == (2, 5, 4) and s.dtype == dtype
    assert_close(s, naive.additive_scores(q, k, p["W"], p["U"], p["v"]), dtype)


def test_additive_saturated_and_small_arguments(rng):
    # tanh near 0 (cancellation-prone) and far in the tails (saturation)
    q = np.concatenate([rng.normal(size=(3, 2)) * 1e-6, rng.normal(size=(3, 2)) * 50])
    k = rng.normal(size=(4, 2)) * 1e-6
    p = _params(rng, 2, 2, hidden=4)
    assert_close(
        scores.additive(q, k, p["W"], p["U"], p["v"]),
        naive.additive_scores(q, k, p["W"], p["U"], p["v"]),
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bilinear_full_and_low_rank(rng, dtype):
    q = rng.normal(size=(3, 4, 5)).astype(dtype)
    k = rng.normal(size=(3, 6, 2)).astype(dtype)
    W = rng.normal(size=(2, 5)).astype(dtype)
    assert_close(scores.bilinear(q, k, W), naive.bilinear_scores(q, k, W), dtype)
    U = rng.normal(size=(3, 2)).astype(dtype)
    V = rng.normal(size=(3, 5)).astype(dtype)
    assert_close(scores.bilinear(q, k, U=U, V=V), naive.bilinear_scores(q, k, U=U, V=V), dtype)
    # low rank equals the full form with W = U^T V
    assert_close(scores.bilinear(q, k, U=U, V=V), scores.bilinear(q, k, U.T @ V), dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gaussian(rng, dtype):
    q = rng.normal(size=(5, 3)).astype(dtype)
    k = rng.normal(size=(2, 7, 3)).astype(dtype)
    h = np.array([0.5, 1.0, 2.0])
    assert_close(scores.gaussian(q, k, h), naive.gaussian_attention_scores(q, k, h), dtype)
    assert_close(scores.gaussian(q, k, 0.7), naive.gaussian_attention_scores(q, k, 0.7), dtype)


def test_gaussian_attention_is_nadaraya_watson(rng):
    x = rng.uniform(0, 5, size=(30, 1))
    y = np.sin(x)
    xq = np.linspace(0, 5, 11)[:, None]
    out = nbattn.attention(xq, x, y, score="gaussian", bandwidth=0.4)
    ref = nbattn.nadaraya_watson(xq, x, y, bandwidth=0.4)
    assert_close(out, np.reshape(ref, out.shape))


def test_single_key_and_single_query(rng):
    q = rng.normal(size=(1, 4))
    k = rng.normal(size=(1, 4))
    assert_close(scores.dot(q, k), naive.dot_scores(q, k))
    assert_close(scores.gaussian(q, k), naive.gaussian_attention_scores(q, k))


def test_registry():
    assert set(scores.SCORES) == {"additive", "dot", "scaled_dot", "bilinear", "gaussian"}
    for name, record in scores.SCORES.items():
        assert scores.get_score(name) is record
        assert isinstance(record, scores.Score) and record.name == name
        assert record.function is getattr(scores, name)
    with pytest.raises(ValueError, match="score must be one of"):
        scores.get_score("cosine")
    # the flash path exists exactly for the scores that are scaled dot products
    assert {n for n, r in scores.SCORES.items() if r.flash} == {"dot", "scaled_dot", "bilinear"}


def test_records_are_callable_as_their_functions(rng):
    q, k = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    assert_close(scores.SCORES["scaled_dot"](q, k, 0.3), scores.scaled_dot(q, k, 0.3))
    assert_close(scores.SCORES["gaussian"](q, k, 0.7), scores.gaussian(q, k, 0.7))


@pytest.mark.parametrize("name", ["dot", "scaled_dot", "bilinear"])
def test_flash_form_is_the_score(rng, name):
    """scale * q' . k' of the record's flash form equals its score matrix."""
    q, k = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4))
    params = {"W": rng.normal(size=(4, 4))} if name == "bilinear" else {}
    record = scores.SCORES[name]
    p = record.validate(4, 4, params, np.float64)
    qd, kd, scale = record.flash(q, k, p)
    assert_close(scale * qd @ np.swapaxes(kd, 1, 2), record.cpu(q, k, p))


def test_adding_a_score_is_one_registry_entry(rng, monkeypatch):
    """A new record drives attention through both its paths (flash form and weight matrix)."""

    def check(eq, ek, params, dtype):
        return {"temperature": float(params.get("temperature", 1.0))}

    def form(qf, kf, params):
        return -qf, kf, 1.0 / params["temperature"]

    def cpu(qf, kf, params):
        qd, kd, scale = form(qf, kf, params)
        return scale * qd @ np.swapaxes(kd, 1, 2)

    record = scores.Score(
        "negative_dot",
        function=lambda q, k, **kw: None,
        params=frozenset({"temperature"}),
        same_width=True,
        check=check,
        cpu=cpu,
        flash=form,
    )
    monkeypatch.setitem(scores.SCORES, "negative_dot", record)
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    fn = lambda a, b: -naive.dot_scores(a, b) / 2.0  # noqa: E731
    ref, ref_w = naive.attention(q, k, v, fn)
    out = nbattn.attention(q, k, v, score="negative_dot", temperature=2.0)
    out_w, w = nbattn.attention(q, k, v, "negative_dot", return_weights=True, temperature=2.0)
    assert_close(out, ref)
    assert_close(out_w, ref)
    assert_close(w, ref_w)
    with pytest.raises(ValueError, match="unknown"):
        nbattn.attention(q, k, v, score="negative_dot", bandwidth=1.0)


def test_inputs_not_modified(rng):
    q = rng.normal(size=(3, 4))
    k = rng.normal(size=(5, 4))
    q0, k0 = q.copy(), k.copy()
    scores.gaussian(q, k, 0.5)
    scores.bilinear(q, k, np.eye(4))
    assert np.array_equal(q, q0) and np.array_equal(k, k0)


def test_validation(rng):
    q = rng.normal(size=(3, 4))
    k = rng.normal(size=(5, 4))
    with pytest.raises(ValueError, match="same width"):
        scores.dot(q, rng.normal(size=(5, 3)))
    with pytest.raises(ValueError, match="q contains NaN"):
        scores.dot(np.full((3, 4), np.nan), k)
    with pytest.raises(ValueError, match="k contains NaN or inf"):
        scores.scaled_dot(q, np.full((5, 4), np.inf))
    with pytest.raises(ValueError, match="q must have at least 2"):
        scores.dot(np.ones(4), k)
    with pytest.raises(ValueError, match="batch"):
        scores.dot(np.ones((2, 3, 4)), np.ones((3, 5, 4)))
    with pytest.raises(ValueError, match="W must have shape"):
        scores.bilinear(q, k, np.ones((3, 3)))
    with pytest.raises(ValueError, match="either W or"):
        scores.bilinear(q, k, np.eye(4), U=np.eye(4), V=np.eye(4))
    with pytest.raises(ValueError, match="U must have shape"):
        scores.additive(q, k, np.ones((2, 4)), np.ones((3, 4)), np.ones(2))
    with pytest.raises(ValueError, match="v must have shape"):
        scores.additive(q, k, np.ones((2, 4)), np.ones((2, 4)), np.ones(3))
    with pytest.raises(ValueError, match="bandwidth"):
        scores.gaussian(q, k, -1.0)
    with pytest.raises(ValueError, match="scale"):
        scores.scaled_dot(q, k, scale=np.nan)


@settings(max_examples=25)
@given(
    shape=attention_shapes(batch=(2, 3), queries=6, keys=6, features=5),
    hidden=st.integers(1, 4),
    seed=seeds,
    dtype=float_dtypes,
)
def test_scores_property(shape, hidden, seed, dtype):
    batch, L, S, E = shape
    rng = np.random.default_rng(seed)
    q = rng.normal(size=batch + (L, E)).astype(dtype)
    k = rng.normal(size=batch + (S, E)).astype(dtype)
    assert_close(scores.scaled_dot(q, k), naive.scaled_dot_scores(q, k), dtype)
    assert_close(scores.gaussian(q, k), naive.gaussian_attention_scores(q, k), dtype)
    p = _params(rng, E, E, hidden, dtype)
    assert_close(
        scores.additive(q, k, p["W"], p["U"], p["v"]),
        naive.additive_scores(q, k, p["W"], p["U"], p["v"]),
        dtype,
    )


def test_gaussian_scores_far_from_zero_and_overflowing():
    """The Gaussian score is a difference: data near 1e300 gives the right scores (the
    columns centred first), and data that overflows once divided by the width is refused
    by row and column, with no RuntimeWarning."""
    import warnings

    q = np.array([[1e300, 0.0]])
    k = np.array([[1e300, 1.0], [-1e300, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = scores.gaussian(q, k, 1e150)
        np.testing.assert_allclose(s, [[-5e-301, -2e300]], rtol=1e-12)
        with pytest.raises(ValueError, match=r"q row \(0, 0\), column 0: .*overflows"):
            scores.gaussian(np.array([[1e300]]), np.array([[0.0]]), 1e-10)
