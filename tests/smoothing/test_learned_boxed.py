"""The fit's LOO tiles on keys in k-d order, pruned by leaf boxes (kernels.loo_tiles_boxed)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nbattn import config
from nbattn.kernels import kd_order, loo_1d, loo_tiles
from nbattn.smoothing import learned_metric, tiled_loo
from nbattn.smoothing.loo import prepare_xy, prepared_loss_and_grad

from .. import naive
from ..strategies import seeds


def _table(seed, n=240, outputs=1):
    """A table built to break box pruning: a near-exact category (width 0.05 on integer
    codes), a smooth feature, a feature on a tiny scale, tied rows and an outlier."""
    rng = np.random.default_rng(seed)
    X = np.column_stack(
        [
            rng.integers(0, 4, n).astype(float),
            rng.uniform(-3.0, 3.0, n),
            rng.normal(0.0, 1e-3, n),
        ]
    )
    X[10:20] = X[0]  # ties: ten copies of row 0
    X[-1, 1] = 40.0  # far along the smooth feature
    y = np.sin(X[:, 1]) + 0.3 * X[:, 0] + 0.1 * rng.normal(size=n)
    if outputs > 1:
        y = np.column_stack([y, np.cos(X[:, 1]) + 0.1 * rng.normal(size=n)])
    return X, y


def _boxed(monkeypatch, leaf_keys=8):
    monkeypatch.setattr(config, "LOO_PRUNE_MIN_ROWS", 16)
    monkeypatch.setattr(config, "LOO_BOXED_MAX_SHARE", 1.0)  # boxed whatever they keep
    monkeypatch.setattr(config, "LOO_TILE_LEAF_KEYS", leaf_keys)
    monkeypatch.setattr(config, "LOO_TILE_ROWS", 16)


@settings(max_examples=25)
@given(
    n=st.integers(1, 300),
    k=st.integers(1, 4),
    leaf_keys=st.integers(1, 40),
    ties=st.booleans(),
    seed=seeds,
)
def test_kd_order_leaves_partition_the_keys(n, k, leaf_keys, ties, seed):
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, k)) * rng.uniform(0.1, 10.0, size=k)
    if ties:
        z = np.round(z)  # many equal coordinates, whole equal rows
    order, starts = kd_order.kd_order(z, leaf_keys)
    # the same order as the plain-Python split (the kernel permutes a copy of the keys
    # with the order instead of reading them through it)
    ref_order, ref_starts = naive.kd_order(z, leaf_keys)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(starts, ref_starts)
    assert np.array_equal(np.sort(order), np.arange(n))
    assert starts[0] == 0 and starts[-1] == n
    sizes = np.diff(starts)
    assert np.all(sizes >= 1) and np.all(sizes <= max(leaf_keys, 1))
    z_t = np.ascontiguousarray(z[order].T)
    lo, hi = kd_order.leaf_boxes(z_t, starts)
    for leaf in range(len(starts) - 1):
        keys = z[order[starts[leaf] : starts[leaf + 1]]]
        np.testing.assert_array_equal(lo[leaf], keys.min(axis=0))
        np.testing.assert_array_equal(hi[leaf], keys.max(axis=0))


@pytest.mark.parametrize("seed", range(4))
def test_kept_leaves_hold_every_key_within_reach(seed):
    """Brute force over every tile of several tables: a key whose squared distance to one of
    the tile's rows is within gap of that row's nearest key is in a kept leaf."""
    X, _ = _table(seed, n=200)
    z = X / np.array([0.05, 0.4, 1e-3])
    order, starts = kd_order.kd_order(z, 8)
    z_sorted = z[order]
    z_t = np.ascontiguousarray(z_sorted.T)
    box_lo, box_hi = kd_order.leaf_boxes(z_t, starts)
    leaf_of = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
    d2 = ((z_sorted[:, None, :] - z_sorted[None, :, :]) ** 2).sum(axis=-1)
    np.fill_diagonal(d2, np.inf)
    nearest = d2.min(axis=1)
    rows = np.arange(len(z), dtype=np.int64)
    gap = 6.0
    reach = np.empty(16)
    keep = np.empty(len(starts) - 1, dtype=np.bool_)
    skipped = 0
    for i0 in range(0, len(z), 16):
        nb = min(16, len(z) - i0)
        kd_order.kept_leaves(z_t, rows, i0, nb, box_lo, box_hi, gap, reach, keep)
        block = slice(i0, i0 + nb)
        needed = np.any(d2[block] <= nearest[block, None] + gap, axis=0)
        assert np.all(keep[leaf_of[needed]]), i0
        skipped += np.sum(~keep)
    assert skipped > 0  # the boxes did prune


@pytest.mark.parametrize("metric", ["diagonal", "full"])
@pytest.mark.parametrize("n_rows", [None, 60])
@pytest.mark.parametrize("outputs", [1, 2])
def test_boxed_loss_and_gradient_match_naive(monkeypatch, metric, n_rows, outputs):
    _boxed(monkeypatch)
    for seed in range(3):
        X, y = _table(seed, outputs=outputs)
        X2, y2 = prepare_xy(X, y, np.float64)
        rng = np.random.default_rng(seed)
        if metric == "diagonal":
            h = np.array([0.05, 0.4, 1e-3]) * rng.uniform(0.7, 1.4, size=3)
            loss, grad = prepared_loss_and_grad(
                X2, y2, h, dtype=np.float64, device="cpu", n_rows=n_rows
            )
            ref = naive.loo_loss_and_grad_rows(X, y, n_rows or len(X), bandwidth=h)
        else:
            L = rng.normal(size=(2, 3)) * np.array([20.0, 2.5, 1e3])
            loss, grad = prepared_loss_and_grad(
                X2, y2, components=L, dtype=np.float64, device="cpu", n_rows=n_rows
            )
            ref = naive.loo_loss_and_grad_rows(X, y, n_rows or len(X), components=L)
        assert loss == pytest.approx(ref[0], rel=1e-10)
        np.testing.assert_allclose(grad, ref[1], rtol=1e-8, atol=1e-10 * np.abs(ref[1]).max())


def test_boxed_tiles_pruning_bound():
    """With a small gap the boxes skip keys, and the loss moves by at most the bound of the
    skipped mass; at the default gap it is the exact loss."""
    rng = np.random.default_rng(7)
    n = 300
    z = np.column_stack([rng.uniform(0.0, 40.0, n), rng.integers(0, 3, n) * 4.0])
    y = np.sin(z[:, 0] / 3.0) + 0.1 * rng.normal(size=n)
    order, starts = kd_order.kd_order(z, 8)
    zs, ys = z[order], y[order]
    z_t = np.ascontiguousarray(zs.T)
    box_lo, box_hi = kd_order.leaf_boxes(z_t, starts)
    rows = np.arange(n, dtype=np.int64)
    sse_exact = naive.loo_loss(zs * np.sqrt(2.0), ys, bandwidth=1.0) * n
    r_exact = naive._loo_weights(zs * np.sqrt(2.0)) @ ys - ys

    def sse(gap):
        out = loo_tiles.loo_tiles_boxed(
            z_t, zs.copy(), ys[None, :].copy(), ys[:, None].copy(), rows, 16, False, 64.0,
            starts, box_lo, box_hi, gap,
        )  # fmt: skip
        assert not np.any(out[3])
        return out[0]

    assert sse(float(config.PRUNE_GAP_FLOAT64)) == pytest.approx(sse_exact, rel=1e-12)
    for gap in (1.0, 3.0, 6.0):
        eps = 2.0 * n * np.exp(-gap) * np.abs(y).max()  # bound on |f_i - f_i exact|
        bound = np.sum(eps * (2.0 * np.abs(r_exact) + eps))
        assert abs(sse(gap) - sse_exact) <= bound, gap
    assert sse(1.0) != pytest.approx(sse_exact, rel=1e-6)  # keys were skipped


def test_boxed_far_rows_and_float32(monkeypatch):
    """A row far from every key (its best score below -FAR_SCORE_FLOAT64) goes to the
    anchored two-pass kernels and gets its nearest key's value; float32 agrees with float64
    to float32 rounding."""
    _boxed(monkeypatch)
    X, y = _table(3)
    X[5] = [1.0, -3.0, 50.0]  # 5e4 widths away along the tiny feature
    X2, y2 = prepare_xy(X, y, np.float64)
    h = np.array([0.05, 0.4, 1e-3])
    z = X2 / (h * np.sqrt(2.0))
    d2 = ((z[5] - z) ** 2).sum(axis=1)
    d2[5] = np.inf
    assert d2.min() > config.FAR_SCORE_FLOAT64
    args = dict(device="cpu", n_rows=None)
    loss, grad = prepared_loss_and_grad(X2, y2, h, dtype=np.float64, **args)
    with monkeypatch.context() as unpruned:  # the plain one-pass tiles, every key
        unpruned.setattr(config, "LOO_PRUNE_MIN_ROWS", 10**9)
        ref_loss, ref_grad = prepared_loss_and_grad(X2, y2, h, dtype=np.float64, **args)
    assert loss == pytest.approx(ref_loss, rel=1e-12)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-9, atol=1e-12 * np.abs(ref_grad).max())
    assert loss == pytest.approx(naive.loo_loss_exact(X, y, h), rel=1e-10)
    loss32, grad32 = prepared_loss_and_grad(X2, y2, h, dtype=np.float32, **args)
    assert loss32 == pytest.approx(loss, rel=1e-4)
    np.testing.assert_allclose(grad32, grad, rtol=1e-3, atol=1e-4 * np.abs(grad).max())


def test_fit_on_boxed_tiles_reports_the_full_data_loss(monkeypatch):
    _boxed(monkeypatch, leaf_keys=16)
    monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", 40)
    monkeypatch.setattr(config, "LEARN_ROWS_PER_PARAMETER", 1)
    X, y = _table(1)
    result = learned_metric.fit_learned_kernel(X, y, metric="diagonal", random_state=0)
    assert len(result["stages"]) > 1
    assert result["loss"] == pytest.approx(naive.loo_loss(X, y, result["bandwidth"]), rel=1e-9)
    assert result["loss"] < result["loss_curve"][0]
    assert loo_1d.prune_gap_for(np.float64) == config.PRUNE_GAP_FLOAT64


def test_boxed_share_estimate_follows_the_width():
    """The estimate that picks between the boxed and the plain tiles: near 1 for a width
    wide against the data, small for a narrow one; it matches the share of keys within
    reach computed by brute force over every row, to the sampling error."""
    rng = np.random.default_rng(11)
    n, k = 600, 3
    z = rng.uniform(0.0, 1.0, size=(n, k))
    y = rng.normal(size=(n, 1))
    gap = float(config.PRUNE_GAP_FLOAT64)
    for scale in (0.5, 4.0, 40.0):
        zs = np.ascontiguousarray(z * scale)
        keys = tiled_loo.boxed_keys(zs, zs, y)
        share = tiled_loo.boxed_share(keys, n_sample=n)
        _, (starts, lo, hi, _), _, z_t, _, _ = keys
        sizes = np.diff(starts)
        brute = 0.0
        for i in range(n):
            q = z_t[:, i]
            near = [j for j in range(max(i - 4, 0), min(i + 5, n)) if j != i]
            bound = min(np.sum((z_t[:, j] - q) ** 2) for j in near)
            dist = np.sum(np.maximum(np.maximum(lo - q, q - hi), 0.0) ** 2, axis=1)
            brute += sizes[dist <= bound + gap].sum() / n
        assert share == pytest.approx(brute / n, abs=1e-12)
        if scale == 0.5:
            assert share == 1.0
        if scale == 40.0:
            assert share < 0.5


def test_both_tile_paths_give_the_same_loss(monkeypatch):
    """Whichever tiles the share estimate picks, the loss and gradient are the same (to
    rounding): the choice is about speed only."""
    X, y = _table(5)
    X2, y2 = prepare_xy(X, y, np.float64)
    h = np.array([0.05, 0.4, 1e-3])
    monkeypatch.setattr(config, "LOO_PRUNE_MIN_ROWS", 16)
    results = []
    for share in (0.0, 1.0):  # 0: plain tiles always; 1: boxed tiles always
        monkeypatch.setattr(config, "LOO_BOXED_MAX_SHARE", share)
        results.append(prepared_loss_and_grad(X2, y2, h, dtype=np.float64, device="cpu"))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-12)
    scale = np.abs(results[1][1]).max()
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-9, atol=1e-12 * scale)
