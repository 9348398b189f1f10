"""loo_loss / loo_loss_and_grad(..., rtol=): the pruned leave-one-out tiles within their bound.

The rule (``nbattn.smoothing.tiled_loo.prune_gap``): a row skips only keys weighing less
than rtol / (n - 1) of its largest weight, so each leave-one-out fit is within
rtol / (1 - rtol) max_j |y_j - f_-i| of the exact one (per output). The loss bound below
follows from it; the properties force the pruned tiles at small sizes (leaves of 4 keys,
whatever share they keep) and compare with the full-matrix reference.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn.smoothing import tiled_loo
from nbattn.smoothing.loo import loo_loss, loo_loss_and_grad

from .. import naive
from .._config import config_values
from ..strategies import seeds

KINDS = ["uniform", "clustered", "duplicates", "far", "huge", "tiny"]

#: The pruned tiles at any size: from 2 rows, leaves of 4 keys, kept whatever they keep.
_PRUNE_ALWAYS = {"LOO_PRUNE_MIN_ROWS": 2, "LOO_TILE_LEAF_KEYS": 4, "LOO_BOXED_MAX_SHARE": 1.0}


def _problem(kind, seed, n, d, p):
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.uniform(-5, 5, (4, d))
        X = centres[rng.integers(0, 4, n)] + 0.2 * rng.normal(size=(n, d))
    elif kind == "duplicates":
        X = rng.normal(size=(3, d))[rng.integers(0, 3, n)] + 1e-3 * rng.normal(size=(n, d))
    else:
        X = rng.uniform(-2, 2, (n, d))
    if kind == "far":  # a few rows thousands of widths from every other
        X[::9] += 1e4 * (1.0 + rng.uniform(size=(X[::9].shape[0], d)))
    y = np.sin(X[:, :1] * 2.0) + 0.3 * rng.normal(size=(n, p)) + 3.0
    h = rng.uniform(0.15, 0.6, d)
    scale = {"huge": 1e150, "tiny": 1e-150}.get(kind, 1.0)
    return X * scale, y * scale, h * scale


def _exact_fits(X, y, h):
    return naive.nadaraya_watson(X, X, y, h, exclude_self=True)


def _loss_bound(X, y, h, rtol):
    """The largest |loss(rtol) - loss| the rule allows: each fit f moves by at most
    delta = rtol / (1 - rtol) max_j |y_j - f|, so each squared error by at most
    delta (2 |f - y| + delta)."""
    f = _exact_fits(X, y, h)
    spread = np.maximum(y.max(axis=0) - f, f - y.min(axis=0))
    delta = rtol / (1.0 - rtol) * spread
    return float(np.mean(delta * (2.0 * np.abs(f - y) + delta)))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=seeds,
    n=st.integers(2, 160),
    d=st.integers(1, 3),
    p=st.integers(1, 2),
    rtol=st.sampled_from([1e-12, 1e-6, 1e-3, 0.1, 0.6]),
)
def test_loss_within_the_stated_bound(kind, seed, n, d, p, rtol):
    X, y, h = _problem(kind, seed, n, d, p)
    exact = naive.loo_loss(X, y, bandwidth=h)
    with config_values(**_PRUNE_ALWAYS):
        pruned = loo_loss(X, y, h, rtol=rtol)
        pruned_with_grad, _ = loo_loss_and_grad(X, y, h, rtol=rtol)
    allowed = _loss_bound(X, y, h, rtol) + 1e-10 * exact
    assert abs(pruned - exact) <= allowed
    assert pruned == pruned_with_grad  # one path: the loss alone is the pass's loss


def _gradient_terms(X, y, h):
    """The absolute sum, per log h_d, of the gradient's pair terms (naive.loo_grad's sum
    with every factor taken positive): the scale its pruning error is measured on."""
    y2 = y.reshape(len(X), -1)
    n, p = y2.shape
    z = X / h
    scores = -0.5 * np.sum((z[:, None, :] - z[None, :, :]) ** 2, axis=2)
    np.fill_diagonal(scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    f = w @ y2
    r = np.abs(f - y2)
    pair = 2.0 / (n * p) * w * (r @ np.abs(y2.T) + np.sum(r * np.abs(f), axis=1, keepdims=True))
    return np.einsum("ij,ijd->d", pair, (z[:, None, :] - z[None, :, :]) ** 2)


@settings(max_examples=40, deadline=None)
@given(
    kind=st.sampled_from(["uniform", "clustered", "duplicates"]),
    seed=seeds,
    n=st.integers(3, 120),
    d=st.integers(1, 3),
    rtol=st.sampled_from([1e-12, 1e-9, 1e-6]),
)
def test_gradient_moves_by_a_share_of_rtol(kind, seed, n, d, rtol):
    """An envelope, not a proof: the gradient's pruned terms each weigh below rtol / (n - 1)
    of their row's largest weight times a squared distance of at most a few gaps, so the
    gradient moves by at most rtol (1 + gap) times the absolute sum of its terms."""
    X, y, h = _problem(kind, seed, n, d, 1)
    exact = naive.loo_grad(X, y, bandwidth=h)
    with config_values(**_PRUNE_ALWAYS):
        _, grad = loo_loss_and_grad(X, y, h, rtol=rtol)
    gap = tiled_loo.prune_gap(n, rtol)
    allowed = 4.0 * rtol * (1.0 + gap) * _gradient_terms(X, y, h) + 1e-9 * np.abs(exact).max()
    assert np.all(np.abs(grad - exact) <= allowed)


def test_gap_is_log_of_keys_over_rtol_and_never_wider_than_exact():
    exact = tiled_loo.prune_gap(1000)
    assert tiled_loo.prune_gap(1000, 0.0) == exact
    assert tiled_loo.prune_gap(1000, 1e-6) == pytest.approx(math.log(999 / 1e-6))
    assert tiled_loo.prune_gap(10**9, 1e-300) == exact  # never more than the exact gap
    assert tiled_loo.prune_gap(1, 0.5) == exact  # one key: nothing to skip


def test_rtol_prunes_more_and_stays_within_the_bound():
    """On clustered data at narrow widths the tiles keep fewer keys with rtol (the cost
    model's share estimate falls), and the loss stays within the bound."""
    rng = np.random.default_rng(3)
    centres = rng.uniform(size=(40, 2))
    X = centres[rng.integers(0, 40, 3000)] + 0.02 * rng.normal(size=(3000, 2))
    y = np.sin(8 * X[:, 0]) + 0.1 * rng.normal(size=3000)
    h = np.full(2, 0.01)
    z = X / (h * np.sqrt(2.0))
    z = z - np.median(z, axis=0)
    shares = [tiled_loo.reach_share(z, gap=tiled_loo.prune_gap(3000, r)) for r in (0.0, 1e-3)]
    assert shares[1] < shares[0]
    exact = loo_loss(X, y, h)
    pruned = loo_loss(X, y, h, rtol=1e-3)
    assert abs(pruned - exact) <= _loss_bound(X, y.reshape(-1, 1), h, 1e-3) + 1e-12 * exact


@pytest.mark.parametrize("bad", [-0.1, 1.0, math.nan, "x", True, None])
def test_bad_rtol_is_refused_by_name(bad):
    X = np.arange(10.0).reshape(-1, 1)
    with pytest.raises(ValueError, match="rtol"):
        loo_loss(X, X[:, 0], rtol=bad)
    with pytest.raises(ValueError, match="rtol"):
        loo_loss_and_grad(X, X[:, 0], 1.0, rtol=bad)


def test_rtol_on_the_gpu_is_refused(monkeypatch):
    from nbattn.smoothing import loo

    monkeypatch.setattr(loo, "resolve_device", lambda device: "cuda")
    X = np.arange(10.0).reshape(-1, 1)
    with pytest.raises(NotImplementedError, match="CPU only"):
        loo_loss(X, X[:, 0], rtol=1e-6, device="cuda")
    with pytest.raises(NotImplementedError, match="CPU only"):
        loo_loss_and_grad(X, X[:, 0], 1.0, rtol=1e-6, device="cuda")


def test_components_take_rtol_too():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(200, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=200)
    L = rng.normal(size=(2, 3)) * 3.0
    with config_values(**_PRUNE_ALWAYS):
        loss, grad = loo_loss_and_grad(X, y, components=L, rtol=1e-9)
        alone = loo_loss(X, y, components=L, rtol=1e-9)
    exact = naive.loo_loss(X, y, components=L)
    assert loss == alone
    assert loss == pytest.approx(exact, rel=1e-6)
    np.testing.assert_allclose(grad, naive.loo_grad(X, y, components=L), rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("exponent", [-80, -100, -300, 200])
def test_targets_far_from_unit_size_keep_their_digits(exponent):
    """The tiles' weighted sums of y near 1e-80 underflowed (a loss 1% off and a gradient
    30,000 times too large, found in review): y is brought to unit size by a power of two
    first, so the loss and gradient are the unit-size ones times its square, exactly."""
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (400, 1))
    y = np.sin(3 * X[:, 0]) + 0.3 * rng.normal(size=400)
    h = np.array([5e-4])
    unit_loss, unit_grad = loo_loss_and_grad(X, y, h)
    for rtol in (0.0, 1e-12):
        loss, grad = loo_loss_and_grad(X, np.ldexp(y, exponent), h, rtol=rtol)
        np.testing.assert_allclose(np.ldexp(loss, -2 * exponent), unit_loss, rtol=1e-12)
        np.testing.assert_allclose(np.ldexp(grad, -2 * exponent), unit_grad, rtol=1e-9)


def test_auto_stays_on_the_cpu_with_rtol(monkeypatch):
    """As the estimators' device: "auto" on a GPU machine runs rtol > 0 on the CPU."""
    from nbattn.smoothing import loo

    monkeypatch.setattr(loo, "resolve_device", lambda device: "cpu" if device == "cpu" else "cuda")
    X = np.arange(20.0).reshape(-1, 1)
    assert loo_loss(X, np.sin(X[:, 0]), rtol=1e-6, device="auto") == pytest.approx(
        loo_loss(X, np.sin(X[:, 0]), device="cpu"), rel=1e-9
    )
