"""LearnedKernelRegressor, NadarayaWatsonRegressor(bandwidth="loo") and the spread methods."""

import io
import sys
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

import nbattn
from nbattn import config
from nbattn.app.datasets import seed_data
from nbattn.smoothing import learned_metric, loo, width_search
from nbattn.smoothing.regression import bandwidth_rule

from .. import naive
from .._config import config_values


def _relevance_data(seed, n=300):
    """2 relevant and 3 irrelevant features."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(2 * n, 5))
    f = np.sin(2 * X[:, 0]) + X[:, 1] ** 2
    y = f + 0.1 * rng.normal(size=2 * n)
    return X[:n], y[:n], X[n:], f[n:]


def test_learned_width_beats_scott_on_the_seed_data():
    data = seed_data()
    X = data.x_train[:, None]
    model = nbattn.LearnedKernelRegressor(metric="scalar").fit(X, data.y_train)
    learned = naive.loo_loss(X, data.y_train, bandwidth=model.bandwidth_)
    scott = naive.loo_loss(X, data.y_train, bandwidth=bandwidth_rule(X))
    assert learned < scott
    assert model.loss_ == pytest.approx(learned, rel=1e-10)
    assert model.loss_curve_[0] == pytest.approx(scott, rel=1e-10)
    assert model.loss_curve_[-1] == pytest.approx(learned, rel=1e-10)
    assert model.n_iter_ >= 1 and len(model.loss_curve_) == model.n_iter_ + 1
    # the one-factor LOO search and the learned scalar find the same optimum
    h_loo = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, data.y_train).bandwidth_
    assert h_loo == pytest.approx(model.bandwidth_, rel=1e-2)


def test_diagonal_switches_off_irrelevant_features():
    """Irrelevant features get wide, over ten draws (seeds 0-9, every one counted).

    The LOO optimum of an irrelevant width is a property of the sample: on some
    draws one irrelevant width stops at 4.5-10x Scott (still >= 15x the relevant
    widths, so the feature is practically switched off). So the promise is
    stated over the draws: every irrelevant width grows past 3x Scott and every
    relevant one narrows below Scott; the median widening of the irrelevant
    widths is >= 10x; in at least 9 of 10 draws the narrowest irrelevant width
    is >= 10x the widest relevant one; the diagonal metric predicts better than
    the scalar one in at least 8 of 10 and has the lower LOO loss in 9 of 10.
    """
    widenings, separated, better_mse, better_loss = [], 0, 0, 0
    for seed in range(10):
        X, y, X_test, f_test = _relevance_data(seed)
        scalar = nbattn.LearnedKernelRegressor(metric="scalar").fit(X, y)
        diagonal = nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, y)
        widening = diagonal.bandwidth_ / bandwidth_rule(X)
        assert np.all(widening[2:] >= 3.0) and np.all(widening[:2] < 1.0), (seed, widening)
        widenings.extend(widening[2:])
        separated += widening[2:].min() >= 10.0 * widening[:2].max()
        mse_scalar = np.mean((scalar.predict(X_test) - f_test) ** 2)
        mse_diagonal = np.mean((diagonal.predict(X_test) - f_test) ** 2)
        better_mse += mse_diagonal < mse_scalar
        better_loss += diagonal.loss_ < scalar.loss_
    assert np.median(widenings) >= 10.0, widenings
    assert separated >= 9 and better_mse >= 8 and better_loss >= 9, (
        separated,
        better_mse,
        better_loss,
    )


@pytest.mark.parametrize("n_components", [None, 2])
def test_full_metric(n_components):
    X, y, X_test, f_test = _relevance_data(1, n=150)
    model = nbattn.LearnedKernelRegressor(metric="full", n_components=n_components, max_iter=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X, y)
    k = 5 if n_components is None else 2
    assert model.components_.shape == (k, 5)
    assert model.loss_ < model.loss_curve_[0]
    assert model.loss_ == pytest.approx(
        naive.loo_loss(X - X.mean(axis=0), y, components=model.components_), rel=1e-10
    )
    # prediction is pooling in the projected space
    expected = naive.nadaraya_watson(X_test @ model.components_.T, X @ model.components_.T, y, 1.0)
    np.testing.assert_allclose(model.predict(X_test), expected, rtol=1e-10, atol=1e-12)
    weights = model.attention_weights(X_test[:7])
    np.testing.assert_allclose(weights @ y, expected[:7], rtol=1e-10, atol=1e-12)


def test_non_convergence_warns_and_never_returns_nan():
    X, y, _, _ = _relevance_data(2, n=80)
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        model = nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=1).fit(X, y)
    assert np.all(np.isfinite(model.bandwidth_)) and np.isfinite(model.loss_)


def test_non_finite_loss_raises(monkeypatch):
    X, y, _, _ = _relevance_data(3, n=30)
    monkeypatch.setattr(
        learned_metric, "prepared_loss_and_grad", lambda *a, **k: (np.nan, np.zeros(5))
    )
    with pytest.raises(FloatingPointError, match="non-finite"):
        nbattn.LearnedKernelRegressor().fit(X, y)


def test_constant_feature_keeps_its_width():
    rng = np.random.default_rng(4)
    X = np.column_stack([rng.uniform(0, 6, 60), np.full(60, 7.0)])
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=60)
    model = nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, y)
    assert np.all(np.isfinite(model.bandwidth_))
    assert model.bandwidth_[1] == pytest.approx(bandwidth_rule(X)[1], rel=1e-12)
    full = nbattn.LearnedKernelRegressor(metric="full").fit(X, y)
    assert np.all(np.isfinite(full.components_))


def test_bad_parameters():
    X, y, _, _ = _relevance_data(5, n=20)
    with pytest.raises(ValueError, match="n_samples=1"):
        nbattn.LearnedKernelRegressor().fit(X[:1], y[:1])
    with pytest.raises(ValueError, match="n_components=6"):
        nbattn.LearnedKernelRegressor(metric="full", n_components=6).fit(X, y)
    with pytest.raises(ValueError, match="init='random'"):
        nbattn.LearnedKernelRegressor(metric="diagonal", init="random").fit(X, y)
    with pytest.raises(ValueError, match="metric"):
        nbattn.LearnedKernelRegressor(metric="cosine").fit(X, y)


def test_float32_fit_matches_float64():
    data = seed_data()
    X = data.x_train[:, None]
    m64 = nbattn.LearnedKernelRegressor(metric="scalar").fit(X, data.y_train)
    m32 = nbattn.LearnedKernelRegressor(metric="scalar", dtype="float32").fit(X, data.y_train)
    assert m32.bandwidth_ == pytest.approx(m64.bandwidth_, rel=1e-3)
    assert m32.loss_ == pytest.approx(m64.loss_, rel=1e-5)


def test_regressor_loo_bandwidth_and_spread():
    data = seed_data()
    X = data.x_train[:, None]
    model = nbattn.NadarayaWatsonRegressor(bandwidth="loo").fit(X, data.y_train)
    np.testing.assert_allclose(model.bandwidth_, width_search.loo_bandwidth(X, data.y_train))
    Q = data.x_test[:, None]
    mean, std = model.predict(Q, return_std=True)
    m_ref, s_ref, n_ref = naive.weighted_spread(Q, X, data.y_train, model.bandwidth_)
    np.testing.assert_allclose(mean, model.predict(Q), rtol=1e-14)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-12)
    np.testing.assert_allclose(std, s_ref, rtol=1e-9)
    np.testing.assert_allclose(model.effective_n_neighbors(Q), n_ref, rtol=1e-12)
    # multi-output: one std per output
    Y = np.column_stack([data.y_train, -2 * data.y_train])
    m2, s2 = (
        nbattn.NadarayaWatsonRegressor(bandwidth=model.bandwidth_)
        .fit(X, Y)
        .predict(Q, return_std=True)
    )
    assert s2.shape == (len(Q), 2)
    np.testing.assert_allclose(s2[:, 1], 2 * s2[:, 0], rtol=1e-12)
    # average pooling: the global spread, every row is a neighbour
    avg = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, data.y_train)
    _, s_avg = avg.predict(Q, return_std=True)
    np.testing.assert_allclose(s_avg, data.y_train.std())
    np.testing.assert_allclose(avg.effective_n_neighbors(Q), len(X))


def test_learned_regressor_spread():
    X, y, X_test, _ = _relevance_data(6, n=100)
    model = nbattn.LearnedKernelRegressor(metric="diagonal").fit(X, y)
    mean, std = model.predict(X_test, return_std=True)
    m_ref, s_ref, n_ref = naive.weighted_spread(X_test, X, y, model.bandwidth_)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(std, s_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(model.effective_n_neighbors(X_test), n_ref, rtol=1e-10)


def test_run_seed_has_the_learned_width_row_and_figures(tmp_path):
    from nbattn.app.seed import run_seed

    table = run_seed(tmp_path)
    assert "learned_width" in table.index
    assert table.loc["learned_width", "mse"] < table.loc["nadaraya_watson_scott", "mse"]
    for name in ("learned_width.png", "heatmap_learned_width.png", "loo_curve.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_fit_verbose_lines_carry_the_loss_and_its_change(capfd):
    X, y, _, _ = _relevance_data(2, n=80)
    result = learned_metric.fit_learned_kernel(X, y, metric="diagonal", verbose=True)
    lines = [
        line
        for line in capfd.readouterr().err.splitlines()
        if line.startswith("fit_learned_kernel: iteration ")
    ]
    curve = result["loss_curve"]
    assert len(lines) == result["n_iter"] == len(curve) - 1
    elapsed = []
    for k, line in enumerate(lines, start=1):
        head, change = line.split("(change ")
        assert head.startswith(f"fit_learned_kernel: iteration {k}: LOO MSE ")
        assert float(head.split("LOO MSE ")[1]) == pytest.approx(curve[k], rel=1e-5)
        change, seconds = change.split(") [")
        assert float(change) == pytest.approx(curve[k] - curve[k - 1], rel=1e-2, abs=1e-9)
        assert seconds.endswith(" s]")  # the elapsed time, on every line
        elapsed.append(float(seconds.split()[0]))
    assert elapsed == sorted(elapsed)
    learned_metric.fit_learned_kernel(X, y, metric="diagonal")
    assert capfd.readouterr().err == ""  # quiet by default
    with pytest.raises(ValueError, match="verbose"):
        learned_metric.fit_learned_kernel(X, y, verbose="loud")


def test_subsample_ladder(monkeypatch):
    monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", 16)
    monkeypatch.setattr(config, "LEARN_SUBSAMPLE_GROWTH", 4)
    monkeypatch.setattr(config, "LEARN_ROWS_PER_PARAMETER", 2)
    assert learned_metric._subsample_ladder(31, 1) == [31]
    assert learned_metric._subsample_ladder(32, 1) == [16, 32]
    assert learned_metric._subsample_ladder(200, 1) == [16, 64, 200]
    assert learned_metric._subsample_ladder(10_000, 1) == [16, 64, 256, 1024, 4096, 10_000]
    assert learned_metric._subsample_ladder(200, 20) == [40, 200]  # 2 rows per parameter
    assert learned_metric._subsample_ladder(79, 20) == [79]
    monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", 0)
    assert learned_metric._subsample_ladder(10_000, 1) == [10_000]


def _ladder_and_full(monkeypatch, X, y, first, per_parameter, **kwargs):
    monkeypatch.setattr(config, "LEARN_ROWS_PER_PARAMETER", per_parameter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", 0)
        full = learned_metric.fit_learned_kernel(X, y, max_iter=300, **kwargs)
        monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", first)
        ladder = learned_metric.fit_learned_kernel(X, y, max_iter=300, **kwargs)
    assert full["stages"] == [len(X)] and len(ladder["stages"]) > 1
    if "components" in ladder:
        loss = loo.loo_loss(X, y, components=ladder["components"])
    else:
        loss = loo.loo_loss(X, y, ladder["bandwidth"])
    # the last stage is the full criterion: the reported loss is the full-data loss
    assert ladder["loss"] == pytest.approx(loss, rel=1e-10)
    assert len(ladder["loss_curve"]) == ladder["n_iter"] + 1
    return full, ladder


@pytest.mark.parametrize("metric", ["scalar", "diagonal", "full"])
def test_ladder_fit_reaches_the_full_data_optimum(monkeypatch, metric):
    """Subsample stages (at least 6 rows per parameter here), then the full criterion: over
    five draws the full-data LOO MSE of the result is within 0.5 % of the fit on the full
    criterion throughout."""
    gaps = []
    for seed in range(5):
        X, y, _, _ = _relevance_data(seed, n=240)
        extra = {"n_components": 2} if metric == "full" else {}
        full, ladder = _ladder_and_full(
            monkeypatch, X, y, 30, 6, metric=metric, random_state=seed, **extra
        )
        gaps.append(ladder["loss"] / full["loss"] - 1.0)
    assert max(gaps) <= 5e-3, gaps


@pytest.mark.parametrize("metric", ["diagonal", "full"])
def test_ladder_restarts_of_the_last_stage_never_end_worse(monkeypatch, metric):
    """The restarts of L-BFGS-B on the ladder's last stage start where the previous run
    stopped and keep the best point: over five draws the full-data loss with restarts is
    never above the one without, and never below the fit on the full criterion by more
    than the 0.5 % the ladder promises."""
    for seed in range(5):
        X, y, _, _ = _relevance_data(seed, n=240)
        extra = {"n_components": 2} if metric == "full" else {}
        monkeypatch.setattr(config, "LEARN_FINAL_RESTARTS", 0)
        _, once = _ladder_and_full(
            monkeypatch, X, y, 30, 6, metric=metric, random_state=seed, **extra
        )
        monkeypatch.setattr(config, "LEARN_FINAL_RESTARTS", 3)
        full, again = _ladder_and_full(
            monkeypatch, X, y, 30, 6, metric=metric, random_state=seed, **extra
        )
        assert again["loss"] <= once["loss"] * (1 + 1e-12), seed
        assert again["loss"] <= full["loss"] * (1 + 5e-3), seed


def test_ladder_never_worse_than_its_start(monkeypatch):
    """A subsample far too small for the parameters (12 rows for 10) can overfit it; the
    result is never worse than the start on the full criterion, over five draws."""
    for seed in range(5):
        X, y, _, _ = _relevance_data(seed, n=200)
        full, ladder = _ladder_and_full(
            monkeypatch, X, y, 12, 1, metric="full", n_components=2, random_state=seed
        )
        assert ladder["loss"] <= full["loss_curve"][0] * (1 + 1e-12), seed


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_learned_regressor_verbose_shows_iteration_loss_and_elapsed(capfd, monkeypatch):
    X, y, _, _ = _relevance_data(4, n=80)
    model = nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=6, verbose=1).fit(X, y)
    err = capfd.readouterr().err.splitlines()  # stderr is not a terminal: plain lines
    lines = [line for line in err if line.startswith("fit_learned_kernel: iteration ")]
    assert len(lines) == model.n_iter_ >= 1
    for k, line in enumerate(lines, start=1):
        loss = float(line.split("LOO MSE ")[1].split()[0])
        assert loss == pytest.approx(model.loss_curve_[k], rel=1e-5)
        assert line.endswith(" s]")
    assert all(line.endswith(" s]") for line in err)  # notes carry the elapsed time too
    again = nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=6).fit(X, y)
    assert capfd.readouterr().err == ""
    np.testing.assert_array_equal(again.bandwidth_, model.bandwidth_)  # verbose changes nothing

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    nbattn.LearnedKernelRegressor(metric="diagonal", max_iter=6, verbose=1).fit(X, y)
    text = stream.getvalue()
    assert "\r" in text and f"{model.n_iter_}/6" in text  # a tqdm bar: iterations of max_iter
    assert "LOO MSE" in text and "fit_learned_kernel: iteration" not in text


def test_ladder_restarts_when_the_subsample_misleads(monkeypatch, capfd):
    """A subsample criterion whose minimum is far from the full one (widths driven to
    e^9): the full stage finds the start better than the subsample's result, restarts
    from it and ends at the minimum the fit on the full criterion throughout finds."""
    real = learned_metric.prepared_loss_and_grad

    def misleading(X, y2, widths=None, components=None, *, dtype, device, n_rows=None, rtol=0.0):
        if n_rows is None:
            return real(X, y2, widths, components, dtype=dtype, device=device, rtol=rtol)
        return float(np.sum((np.log(widths) - 9.0) ** 2)), 2.0 * (np.log(widths) - 9.0)

    monkeypatch.setattr(learned_metric, "prepared_loss_and_grad", misleading)
    X, y, _, _ = _relevance_data(5, n=200)
    full, ladder = _ladder_and_full(monkeypatch, X, y, 30, 1, metric="diagonal", verbose=2)
    assert "restart" in capfd.readouterr().err
    # the same minimum (to L-BFGS-B's tolerances: the ladder's are relative to the loss)
    assert ladder["loss"] == pytest.approx(full["loss"], rel=1e-4)
    # (the widths of the irrelevant features sit on a flat stretch: not compared)
    np.testing.assert_allclose(ladder["bandwidth"][:2], full["bandwidth"][:2], rtol=0.05)


def test_ladder_progress_names_the_stages(monkeypatch, capfd):
    X, y, _, _ = _relevance_data(6, n=200)
    monkeypatch.setattr(config, "LEARN_ROWS_PER_PARAMETER", 1)
    monkeypatch.setattr(config, "LEARN_SUBSAMPLE_ROWS", 25)
    result = learned_metric.fit_learned_kernel(X, y, metric="diagonal", verbose=2)
    err = capfd.readouterr().err
    assert result["stages"] == [25, 100, 200]
    assert "a random subsample of 25 query rows against all 200 keys" in err
    assert "(estimate on 100 rows)" in err and "stage: the LOO criterion of all rows" in err
    iterations = [line for line in err.splitlines() if "iteration " in line]
    assert len(iterations) == result["n_iter"] == len(result["loss_curve"]) - 1


@pytest.mark.parametrize("metric", ["scalar", "diagonal", "full"])
def test_a_fit_on_subsamples_repeats_to_the_bit_without_a_seed(metric):
    """The ladder draws its subsamples from a fixed seed when random_state is None: two
    fits of the same data agree to the bit (they drew fresh rows each time before)."""
    rng = np.random.default_rng(8)
    X = rng.uniform(-2, 2, (400, 2))
    y = np.sin(2 * X[:, 0]) + 0.3 * rng.normal(size=400)
    with config_values(LEARN_SUBSAMPLE_ROWS=50, LEARN_ROWS_PER_PARAMETER=1):
        fits = [learned_metric.fit_learned_kernel(X, y, metric) for _ in "ab"]
    assert len(fits[0]["stages"]) > 1  # the ladder ran
    key = "components" if metric == "full" else "bandwidth"
    assert fits[0][key].tobytes() == fits[1][key].tobytes()
    assert fits[0]["loss_curve"].tobytes() == fits[1]["loss_curve"].tobytes()
