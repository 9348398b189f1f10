"""The regressors' ``predict_interval(method="bootstrap")``: the wild replicates against
their brute-force sum over the equivalent-kernel weights (same multipliers), their
variance against the sandwich's, the band's coverage of E[g(x)] = H m over simulated data
at fixed widths, the pairs band against explicit weighted refits of the estimator, 2-D
targets per output, repeatability, extreme magnitudes, bad input, the model file's
Predictor and ``nbattn plot fit --band bootstrap``."""

import argparse
import contextlib
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from sklearn.base import clone

import nbattn
from nbattn.local import bands
from nbattn.local.engine import (
    equivalent_weights,
    local_interval_sums,
    local_prediction_interval,
    loo_residuals,
)
from nbattn.local.problem import layout
from nbattn.local.resampling import bootstrap_generator, pairs_counts, wild_multipliers
from nbattn.persistence.predictor import read_predictor

from ..strategies import seeds

LEVELS = (0.025, 0.975)


def _data(rng, n=40, d=1, noise=0.3):
    X = rng.uniform(-2.0, 2.0, (n, d))
    return X, np.sin(2.0 * X[:, 0]) + noise * (1.0 + 0.5 * np.abs(X[:, 0])) * rng.normal(size=n)


def _engine_inputs(model, Q):
    """(spec, keys, y, widths, degree, weights) of the model's intervals at the checked
    queries Q (all-continuous models without the full metric: the score coordinates are
    the columns themselves)."""
    spec = model._local_spec(Q)
    return spec, model.X_fit_, model.y_fit_, model.bandwidth_, model._degree(), model._weights()


def _brute_deviations(model, Q, seed, n_boot):
    """d_b(x) = sum_j l_j(x) r_j v_jb with numpy: l from ``equivalent_weights``, the same
    leave-one-out residuals and Mammen multipliers as the band."""
    spec, keys, y, widths, degree, sw = _engine_inputs(model, Q)
    H = equivalent_weights(layout(spec, Q, keys, y, widths, degree, sample_weight=sw))
    r = loo_residuals(spec, keys, y, widths, degree, sample_weight=sw)[:, 0]
    v = wild_multipliers(bootstrap_generator(seed), keys.shape[0], n_boot)
    return H @ (r[:, None] * v), H, r, np.abs(H) @ np.abs(r[:, None] * v)


MODELS = {
    "nw": lambda h: nbattn.NadarayaWatsonRegressor(bandwidth=h),
    "lp1": lambda h: nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h),
    "lp2": lambda h: nbattn.LocalPolynomialRegressor(degree=2, bandwidth=h),
    "epan": lambda h: nbattn.NadarayaWatsonRegressor(bandwidth=2 * h, kernel="epanechnikov"),
}


@settings(max_examples=12)
@given(
    name=st.sampled_from(sorted(MODELS)),
    n=st.integers(12, 40),
    d=st.integers(1, 2),
    n_boot=st.integers(1, 60),
    weighted=st.booleans(),
    seed=seeds,
)
def test_wild_replicates_are_the_equivalent_kernel_sums(name, n, d, n_boot, weighted, seed):
    rng = np.random.default_rng(seed)
    # a quadratic in two columns on a dozen rows is near-singular, where the engine's
    # truncated solve and its hat matrix part at ~1e-7: one column for it
    d = 1 if name == "lp2" else d
    X, y = _data(rng, n, d)
    sw = rng.uniform(0.2, 3.0, n) if weighted else None
    model = MODELS[name](rng.uniform(0.4, 1.0)).fit(X, y, sample_weight=sw)
    Q = rng.uniform(-2.2, 2.2, (5, d))
    # the rounding bound: the sums of |l_j r_j v_jb| (an extrapolating quadratic's weights
    # are large, of both signs, and its fit cancels them)
    expected, _, _, magnitude = _brute_deviations(model, Q, seed, n_boot)
    bound = 1e-10 * magnitude + 1e-300
    spec, keys, yy, widths, degree, w = _engine_inputs(model, Q)
    args = (spec, keys, yy, Q, widths, degree)
    for chunk in (None, 7):  # one pass, or passes of 7 replicates: the same draws
        got = bands.bootstrap_replicates(
            *args, sample_weight=w, n_boot=n_boot, rng=bootstrap_generator(seed), chunk=chunk
        )
        assert np.all(np.abs(got[:, 0, :] - expected) <= bound)
    with _warns_if(n_boot * 0.05 / 2 < 1):  # an end beyond the replicates' range
        band = model.predict_interval(Q, method="bootstrap", n_boot=n_boot, random_state=seed)
    fit = model.predict(Q)
    want = fit[:, None] + np.quantile(expected, LEVELS, axis=1).T
    limit = bound.max(axis=1, keepdims=True) + 1e-14 * np.abs(fit)[:, None]
    assert np.all(np.abs(band - want) <= limit)


@contextlib.contextmanager
def _warns_if(expected):
    """A UserWarning naming n_boot where ``expected``, none otherwise."""
    if expected:
        with pytest.warns(UserWarning, match="n_boot"):
            yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        yield


def test_replicates_variance_is_the_sandwich():
    """Var d(x) = sum_j l_j^2 r_j^2 (``local_interval_sums``): the empirical variance of
    4,000 replicates lies within 4.5 Monte Carlo standard errors of it at every query,
    the error from the fourth moment of d (Mammen's v: E v^4 = 2)."""
    rng = np.random.default_rng(3)
    X, y = _data(rng, 30)
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.5).fit(X, y)
    Q = np.linspace(-2.0, 2.0, 9)[:, None]
    spec, keys, yy, widths, degree, sw = _engine_inputs(model, Q)
    n_boot = 4000
    reps = bands.bootstrap_replicates(spec, keys, yy, Q, widths, degree, n_boot=n_boot)[:, 0]
    _, H, r, _ = _brute_deviations(model, Q, None, 1)
    sandwich = local_interval_sums(Q, X, r, widths, degree)
    a = H * r  # d = sum_j a_j v_j
    fourth = 3.0 * sandwich**2 - np.sum(a**4, axis=1)  # E d^4, kurtosis of v: 2 - 3 = -1
    se = np.sqrt((fourth - sandwich**2) / n_boot)
    z = (np.mean(reps**2, axis=1) - sandwich) / se  # E d = 0 exactly
    assert np.all(np.abs(z) < 4.5), z
    assert np.all(np.abs(reps.mean(axis=1)) < 4.5 * np.sqrt(sandwich / n_boot))


def test_wild_band_covers_the_expectation_at_fixed_widths():
    """Over 150 simulated data sets on one design, the 90% wild band at four queries
    (three widths apart) covers E[g(x)] = sum_j l_j(x) m(x_j) at a rate within the 99%
    binomial limits of 0.9. (With a dozen rows within a width, 80 rows here, it covers
    about 87%, as the normal interval of the sandwich does: the variance estimate from
    a few residuals is noisy.)"""
    rng = np.random.default_rng(11)
    n, h = 200, 0.3  # about 35 rows within a width of each query
    X = rng.uniform(-2.0, 2.0, (n, 1))
    mean = np.sin(2.0 * X[:, 0])
    sd = 0.3 * (1.0 + 0.5 * np.abs(X[:, 0]))
    Q = np.array([[-1.5], [-0.5], [0.5], [1.5]])
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=h)
    model.fit(X, mean)
    spec, keys, _, widths, degree, _ = _engine_inputs(model, Q)
    truth = equivalent_weights(layout(spec, Q, keys, mean, widths, degree)) @ mean
    n_sets, covered = 150, 0
    for k in range(n_sets):
        model.fit(X, mean + sd * rng.normal(size=n))
        band = model.predict_interval(Q, alpha=0.1, method="bootstrap", n_boot=199, random_state=k)
        covered += int(np.sum((band[:, 0] <= truth) & (truth <= band[:, 1])))
    low, high = stats.binom.interval(0.99, n_sets * len(Q), 0.9)
    assert low <= covered <= high, (covered, n_sets * len(Q))


def test_pairs_band_is_the_percentiles_of_weighted_refits():
    """Each pairs replicate is the estimator refitted with the drawn counts times the
    sample weights at the held widths; an Epanechnikov model's query beyond every key's
    reach takes the nearest drawn row, as the refit predicts."""
    rng = np.random.default_rng(5)
    n, n_boot, seed = 25, 40, 9
    X, y = _data(rng, n)
    sw = rng.uniform(0.5, 2.0, n)
    Q = np.array([[-1.9], [-0.3], [0.8], [3.5]])
    for model in (
        nbattn.NadarayaWatsonRegressor(bandwidth=0.5),
        nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.6),
        nbattn.NadarayaWatsonRegressor(bandwidth=0.5, kernel="epanechnikov"),
    ):
        model.fit(X, y, sample_weight=sw)
        counts = pairs_counts(bootstrap_generator(seed), n, n_boot)
        refits = np.array(
            [
                clone(model)
                .set_params(bandwidth=model.bandwidth_)
                .fit(X, y, sample_weight=c * sw)
                .predict(Q)
                for c in counts
            ]
        )
        band = model.predict_interval(
            Q, method="bootstrap", resample="pairs", n_boot=n_boot, random_state=seed
        )
        np.testing.assert_allclose(band, np.quantile(refits, LEVELS, axis=0).T, atol=1e-10)


def test_two_outputs_share_the_rows_multipliers():
    """A 2-D target's band per output is the band of a model fitted on that output alone
    (the same row multipliers, the same counts)."""
    rng = np.random.default_rng(2)
    X, y = _data(rng, 30, 2)
    Y = np.column_stack([y, np.cos(X[:, 1]) + 0.2 * rng.normal(size=30)])
    Q = rng.uniform(-2.0, 2.0, (6, 2))
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.6, 0.7])
    for resample in ("wild", "pairs"):
        both = model.fit(X, Y).predict_interval(
            Q, method="bootstrap", n_boot=40, resample=resample, random_state=4
        )
        assert both.shape == (6, 2, 2)
        for o in range(2):
            one = model.fit(X, Y[:, o]).predict_interval(
                Q, method="bootstrap", n_boot=40, resample=resample, random_state=4
            )
            np.testing.assert_allclose(both[:, o, :], one, rtol=1e-12, atol=1e-12)


def test_repeatable_and_seeded(monkeypatch):
    rng = np.random.default_rng(8)
    X, y = _data(rng, 30)
    Q = np.linspace(-2, 2, 7)[:, None]
    for model in (
        nbattn.NadarayaWatsonRegressor(bandwidth="scott"),
        nbattn.LearnedKernelRegressor(metric="full"),
        nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.6),
    ):
        model.fit(X, y)
        for resample in ("wild", "pairs"):
            options = dict(method="bootstrap", n_boot=50, resample=resample)
            first = model.predict_interval(Q, **options)
            assert np.array_equal(first, model.predict_interval(Q, **options))  # None: fixed
            assert np.array_equal(first, model.predict_interval(Q, **options, random_state=0))
            other = model.predict_interval(Q, **options, random_state=1)
            assert not np.array_equal(first, other)
            gen = np.random.default_rng(1)  # a Generator: used as given, and advanced
            assert np.array_equal(other, model.predict_interval(Q, **options, random_state=gen))
            assert not np.array_equal(other, model.predict_interval(Q, **options, random_state=gen))
            assert np.all(first[:, 0] <= first[:, 1])
    # blocks of queries and chunks of replicates: the same draws, the generator left as
    # one pass over them leaves it
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.6).fit(X, y)
    whole = model.predict_interval(Q, method="bootstrap", n_boot=50)
    monkeypatch.setattr(bands, "BAND_BYTES", 8 * 50 * 3)  # 3 queries a block, 1 replicate a pass
    gen = np.random.default_rng(0)
    blocks = model.predict_interval(Q, method="bootstrap", n_boot=50, random_state=gen)
    np.testing.assert_allclose(blocks, whole, rtol=0, atol=1e-12)
    reference = np.random.default_rng(0)
    wild_multipliers(reference, X.shape[0], 50)
    assert gen.random() == reference.random()


def test_asymptotic_interval_unchanged():
    rng = np.random.default_rng(4)
    X, y = _data(rng, 30)
    Q = np.linspace(-2, 2, 5)[:, None]
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.6).fit(X, y)
    lower, upper = local_prediction_interval(X, y, Q, model.bandwidth_, 1)
    for kind in ("mean", "observation"):
        default = model.predict_interval(Q, kind=kind)
        explicit = model.predict_interval(
            Q, kind=kind, method="asymptotic", n_boot=5, resample="pairs", random_state=3
        )
        assert np.array_equal(default, explicit)
    assert np.array_equal(model.predict_interval(Q), np.column_stack([lower, upper]))


def test_extreme_magnitudes_scale_the_band():
    rng = np.random.default_rng(6)
    X, y = _data(rng, 30)
    Q = np.linspace(-2, 2, 5)[:, None]
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=0.6)
    for resample in ("wild", "pairs"):
        options = dict(method="bootstrap", n_boot=40, resample=resample)
        base = model.fit(X, y).predict_interval(Q, **options)
        for scale in (1e300, 1e-300, 2.0**1000):
            band = model.fit(X, y * scale).predict_interval(Q, **options)
            assert np.all(np.isfinite(band))
            np.testing.assert_allclose(band / scale, base, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"n_boot": 0}, "n_boot"),
        ({"n_boot": -1}, "n_boot"),
        ({"n_boot": 1.5}, "n_boot"),
        ({"n_boot": True}, "n_boot"),
        ({"resample": "x"}, "resample"),
        ({"random_state": "abc"}, "random_state"),
        ({"alpha": 1.0}, "alpha"),
        ({"kind": "observation"}, "method='bootstrap'.*kind='observation'"),
        ({"kind": "quantile"}, "method='bootstrap'.*kind='quantile'"),
    ],
)
def test_bad_input_names_the_argument(options, match):
    rng = np.random.default_rng(1)
    X, y = _data(rng, 20)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y)
    Q = X[:3].copy()
    with pytest.raises(ValueError, match=match):
        model.predict_interval(Q, **{"method": "bootstrap", **options})
    assert np.array_equal(Q, X[:3])


def test_bad_method_and_average_kernel():
    rng = np.random.default_rng(1)
    X, y = _data(rng, 20)
    model = nbattn.NadarayaWatsonRegressor(bandwidth=0.5).fit(X, y)
    with pytest.raises(ValueError, match="method"):
        model.predict_interval(X[:3], method="x")
    average = nbattn.NadarayaWatsonRegressor(kernel="average").fit(X, y)
    with pytest.raises(ValueError, match="kernel='average'"):
        average.predict_interval(X[:3], method="bootstrap")


def test_predictor_gives_the_estimators_band(tmp_path):
    rng = np.random.default_rng(7)
    colour = np.array(["red", "blue"])[rng.integers(0, 2, 30)]
    x, y = _data(rng, 30)
    frame = pd.DataFrame({"x": x[:, 0], "colour": colour})
    model = nbattn.LocalPolynomialRegressor(degree=1, bandwidth=[0.6, 0.3]).fit(frame, y)
    predictor, _ = read_predictor(nbattn.save(model, tmp_path / "m.nbattn"))
    for resample in ("wild", "pairs"):
        options = dict(method="bootstrap", n_boot=40, resample=resample, random_state=2)
        assert np.array_equal(
            predictor.predict_interval(frame[:6], **options),
            model.predict_interval(frame[:6], **options),
        )


def test_plot_fit_draws_the_bootstrap_band(tmp_path):
    """``nbattn plot fit``'s figure with ``--band bootstrap``: the model file's figure, its
    band the wild bootstrap's (the filled area spans the estimator's band along the grid)."""
    from nbattn.app import cli, plot_commands, plotting

    rng = np.random.default_rng(3)
    x, y = _data(rng, 40)
    pd.DataFrame({"x": x[:, 0], "y": y}).to_csv(tmp_path / "d.csv", index=False)
    fit = [
        "fit",
        str(tmp_path / "d.csv"),
        "--target",
        "y",
        "--model",
        "lp",
        "--bandwidth",
        "0.6",
        "-q",
    ]
    assert cli.main([*fit, "-o", str(tmp_path / "m.npz")]) == 0
    args = argparse.Namespace(
        model=str(tmp_path / "m.npz"),
        data=str(tmp_path / "d.csv"),
        target=None,
        on_nan="error",
        band="bootstrap",
    )
    fig = plot_commands._fit(args)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert plotting.BAND_LABELS["bootstrap"] in labels
    model = nbattn.load(tmp_path / "m.npz")
    grid = np.linspace(x.min(), x.max(), 400)
    band = model.predict_interval(pd.DataFrame({"x": grid}), method="bootstrap")
    (area,) = ax.collections[1:2]
    vertices = area.get_paths()[0].vertices
    np.testing.assert_allclose(vertices[:, 1].max(), band[:, 1].max())
    np.testing.assert_allclose(vertices[:, 1].min(), band[:, 0].min())
    plotting.pyplot().close(fig)


def test_cli_plot_fit_band_option(tmp_path):
    """``nbattn plot fit MODEL DATA --band bootstrap -o FIG`` writes the figure."""
    from nbattn.app import cli

    rng = np.random.default_rng(3)
    x, y = _data(rng, 40)
    pd.DataFrame({"x": x[:, 0], "y": y}).to_csv(tmp_path / "d.csv", index=False)
    fit = ["fit", str(tmp_path / "d.csv"), "--target", "y", "--model", "lp", "--bandwidth", "0.6"]
    assert cli.main([*fit, "-q", "-o", str(tmp_path / "m.npz")]) == 0
    out = tmp_path / "band.png"
    plot = ["plot", "fit", str(tmp_path / "m.npz"), str(tmp_path / "d.csv"), "-o", str(out)]
    assert cli.main([*plot, "--band", "bootstrap", "-q"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
