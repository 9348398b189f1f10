"""AICc widths (``nbattn.local.aicc``): the criterion against a brute-force hat matrix and
statsmodels' ``KernelReg.aic_hurvich``, the search against grids and statsmodels' own
search, the estimators' ``bandwidth="aicc"``, repeatability and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nbattn.local.aicc import fits_and_leverages, local_aicc, local_aicc_widths
from nbattn.local.engine import equivalent_weights
from nbattn.local.problem import check_columns, layout, rule_widths

_CASES = [  # (var_type, degree, kernel)
    ("c", 0, "gaussian"),
    ("c", 1, "epanechnikov"),
    ("c", 2, "tricube"),
    ("cc", 1, "gaussian"),
    ("cu", 0, "epanechnikov"),
    ("cu", 1, "gaussian"),
    ("co", 2, "gaussian"),
    ("cuo", 1, "tricube"),
    ("uo", 0, "gaussian"),
]


def _data(rng, var_type, n, ties=False, outputs=1):
    cols = []
    for kind in var_type:
        if kind == "c":
            x = rng.normal(size=n)
            cols.append(np.round(x, 0) if ties else x)
        else:
            cols.append(rng.integers(0, 3 if kind == "u" else 4, n).astype(float))
    X = np.column_stack(cols)
    signal = np.sin(2.0 * X[:, 0]) + 0.3 * X[:, -1]
    y = signal[:, None] + 0.3 * rng.normal(size=(n, outputs))
    return X, (y[:, 0] if outputs == 1 else y)


def _naive_aicc(X, y, widths, degree, var_type, kernel, weights):
    """AICc from the dense hat matrix (``equivalent_weights``): fits H y, tr H, weighted
    sigma2 per output, n the rows of positive weight."""
    spec, (Xc,) = check_columns({"X": X}, var_type=var_type, kernel=kernel)
    H = equivalent_weights(layout(spec, Xc, Xc, y, widths, degree, sample_weight=weights))
    Y = y.reshape(len(y), -1)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    u = w / w.sum()
    n = int(np.count_nonzero(w > 0))
    sigma2 = u @ (Y - H @ Y) ** 2
    trace = np.trace(H)
    if trace >= n - 2:
        return math.inf
    return float(np.mean(np.log(sigma2))) + (1 + trace / n) / (1 - (trace + 2) / n)


@pytest.mark.parametrize("case", range(len(_CASES)))
def test_criterion_is_the_brute_force_hat_matrix(case):
    var_type, degree, kernel = _CASES[case]
    for seed in range(6):
        rng = np.random.default_rng(100 * case + seed)
        n = int(rng.integers(12, 30))
        X, y = _data(rng, var_type, n, ties=seed % 3 == 1, outputs=1 + (seed % 2))
        spec, (Xc,) = check_columns({"X": X}, var_type=var_type, kernel=kernel)
        widths = rule_widths(spec, Xc) * np.where(spec.continuous, rng.uniform(0.3, 3.0), 1.0)
        weights = None
        if seed % 3 == 2:
            weights = rng.uniform(0.1, 3.0, n)
            weights[rng.integers(0, n)] = 0.0  # a row of weight 0: neither key nor term
        kw = {"var_type": var_type, "kernel": kernel, "sample_weight": weights}
        got = local_aicc(X, y, widths, degree, **kw)
        want = _naive_aicc(X, y, widths, degree, var_type, kernel, weights)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), (case, seed)


def test_missing_values_marginalized():
    rng = np.random.default_rng(7)
    for var_type in ("cu", "cco"):
        X, y = _data(rng, var_type, 20)
        X[rng.integers(0, 20, 4), rng.integers(0, len(var_type), 4)] = np.nan
        kw = {"var_type": var_type, "missing": "marginalize"}
        spec, (Xc,) = check_columns({"X": X}, **kw)
        widths = rule_widths(spec, Xc)
        for degree in (0, 1):
            H = equivalent_weights(layout(spec, Xc, Xc, y, widths, degree))
            n = len(y)
            trace = np.trace(H)
            want = np.log(np.mean((y - H @ y) ** 2)) + (1 + trace / n) / (1 - (trace + 2) / n)
            assert local_aicc(X, y, widths, degree, **kw) == pytest.approx(want, rel=1e-9)


def test_fallback_rows_take_the_nearest_key():
    """An ordered column at lambda = 1 weighs every pair 0: each row falls back to its
    nearest key (itself, or the first of its ties), H_ii = 1 or 0 as in the dense H."""
    rng = np.random.default_rng(5)
    X = np.column_stack([rng.normal(size=15), rng.integers(0, 3, 15)]).astype(float)
    X[3] = X[1]  # a tie: row 3's nearest key is row 1
    y = rng.normal(size=15)
    spec, (Xc,) = check_columns({"X": X}, var_type="co")
    problem = layout(spec, Xc, Xc, y, np.array([0.5, 1.0]), 1)
    fits, leverage = fits_and_leverages(problem)
    H = equivalent_weights(problem)
    np.testing.assert_allclose(leverage, np.diag(H), atol=1e-15)
    np.testing.assert_allclose(fits[:, 0], H @ y, atol=1e-14)
    assert leverage[3] == 0.0 and leverage[1] == 1.0


def _statsmodels(y, X, var_type, reg_type, bw):
    from statsmodels.nonparametric.kernel_regression import KernelReg

    return KernelReg(y, X, var_type=var_type, reg_type=reg_type, bw=bw)


def test_statsmodels_aic_hurvich_local_constant():
    """reg_type="lc": statsmodels' criterion is this one (unordered columns too)."""
    for seed, var_type in enumerate(("c", "cc", "cu", "c", "cc")):
        rng = np.random.default_rng(seed)
        X, y = _data(rng, var_type, 25)
        spec, (Xc,) = check_columns({"X": X}, var_type=var_type)
        widths = rule_widths(spec, Xc) * np.where(spec.continuous, rng.uniform(0.3, 2.0), 1.0)
        want = _statsmodels(y, X, var_type, "lc", widths).aic_hurvich(widths)
        got = local_aicc(X, y, widths, 0, var_type=var_type)
        assert got == pytest.approx(float(np.squeeze(want)), rel=1e-10)


def test_statsmodels_aic_hurvich_local_linear_uses_the_local_constant_trace():
    """reg_type="ll": statsmodels takes sigma2 of the local-linear fit but tr(H) of the
    Nadaraya-Watson smoother; nbattn the local-linear smoother's own trace."""
    for seed in range(4):
        rng = np.random.default_rng(10 + seed)
        var_type = "cc" if seed % 2 else "c"
        X, y = _data(rng, var_type, 25)
        widths = np.std(X, axis=0) * rng.uniform(0.3, 1.5)
        want = float(np.squeeze(_statsmodels(y, X, var_type, "ll", widths).aic_hurvich(widths)))
        spec, (Xc,) = check_columns({"X": X}, var_type=var_type)
        fits, trace_ll = fits_and_leverages(layout(spec, Xc, Xc, y, widths, 1))
        trace_nw = fits_and_leverages(layout(spec, Xc, Xc, y, widths, 0))[1].sum()
        n = len(y)

        def penalty(t, n=n):
            return (1 + t / n) / (1 - (t + 2) / n)

        got = local_aicc(X, y, widths, 1, var_type=var_type)
        assert got - penalty(trace_ll.sum()) + penalty(trace_nw) == pytest.approx(want, rel=1e-9)
        assert np.log(np.mean((y - fits[:, 0]) ** 2)) + penalty(trace_nw) == pytest.approx(
            want, rel=1e-9
        )


def test_statsmodels_search_is_no_better_on_its_own_criterion():
    """KernelReg(bw="aic", reg_type="lc"): its aic_hurvich at nbattn's widths is no
    worse than at its own."""
    for seed in range(3):
        rng = np.random.default_rng(20 + seed)
        X, y = _data(rng, "c", 30)
        model = _statsmodels(y, X, "c", "lc", "aic")
        ours = local_aicc_widths(X, y, 0)
        at_ours = float(np.squeeze(model.aic_hurvich(ours)))
        at_theirs = float(np.squeeze(model.aic_hurvich(model.bw)))
        assert at_ours <= at_theirs + 1e-6, (seed, ours, model.bw)


def _several_minima(rng, n):
    x = np.sort(rng.uniform(-3, 3, n))
    y = np.sin(x) + 0.6 * np.sin(7 * x) + 0.25 * rng.normal(size=n)
    return x[:, None], y


def test_search_beats_a_grid_1d():
    for seed in range(4):
        rng = np.random.default_rng(30 + seed)
        X, y = _several_minima(rng, 40)
        degree = seed % 3
        widths = local_aicc_widths(X, y, degree)
        found = local_aicc(X, y, widths, degree)
        start = rule_widths(check_columns({"X": X})[0], X)
        grid = [local_aicc(X, y, start * f, degree) for f in np.geomspace(0.02, 50, 120)]
        assert found <= min(grid) + 1e-4, (seed, found, min(grid))
        assert found <= local_aicc(X, y, "scott", degree)


def test_search_beats_a_grid_2d():
    for seed in range(2):
        rng = np.random.default_rng(40 + seed)
        x = rng.uniform(-2, 2, (35, 2))
        y = np.sin(3 * x[:, 0]) + 0.2 * x[:, 1] + 0.2 * rng.normal(size=35)
        widths = local_aicc_widths(x, y, 0)
        found = local_aicc(x, y, widths, 0)
        factors = np.geomspace(0.05, 20, 22)
        start = rule_widths(check_columns({"X": x})[0], x)
        grid = min(local_aicc(x, y, start * np.array([a, b]), 0) for a in factors for b in factors)
        assert found <= grid + 1e-4, (seed, found, grid)


def test_never_worse_than_the_rule_mixed_weighted_and_pruned():
    for seed in range(6):
        rng = np.random.default_rng(50 + seed)
        var_type, degree, kernel = _CASES[3 + seed]
        X, y = _data(rng, var_type, 40, ties=seed % 2 == 0)
        weights = rng.uniform(0.2, 2.0, 40) if seed % 2 else None
        kw = {"var_type": var_type, "kernel": kernel, "sample_weight": weights}
        rtol = 1e-3 if seed >= 3 else 0.0
        widths = local_aicc_widths(X, y, degree, rtol=rtol, **kw)
        again = local_aicc_widths(X, y, degree, rtol=rtol, **kw)
        assert widths.tobytes() == again.tobytes()
        assert local_aicc(X, y, widths, degree, **kw) <= local_aicc(X, y, "scott", degree, **kw)


def test_pruned_criterion_is_close_to_the_exact_one():
    rng = np.random.default_rng(60)
    X, y = _data(rng, "cc", 400)
    widths = np.array([0.3, 0.4])
    exact = local_aicc(X, y, widths, 1)
    pruned = local_aicc(X, y, widths, 1, rtol=1e-6)
    assert pruned == pytest.approx(exact, abs=1e-4)


def test_outputs_mean_and_constant_outputs():
    rng = np.random.default_rng(70)
    X, y = _data(rng, "c", 25, outputs=2)
    widths = np.array([0.5])
    both = local_aicc(X, y, widths, 1)
    penalty = local_aicc(X, y[:, 0], widths, 1) - np.log(
        np.mean((y[:, 0] - _fit(X, y[:, 0], widths)) ** 2)
    )
    per_output = [local_aicc(X, y[:, o], widths, 1) - penalty for o in range(2)]
    assert both - penalty == pytest.approx(np.mean(per_output), rel=1e-12)
    constant = np.column_stack([y[:, 0], np.full(25, 3.0)])
    assert local_aicc(X, constant, widths, 1) == pytest.approx(
        local_aicc(X, y[:, 0], widths, 1), rel=1e-12
    )
    with pytest.raises(ValueError, match="y is constant"):
        local_aicc(X, np.full(25, 3.0), widths, 1)
    start = rule_widths(check_columns({"X": X})[0], X)
    assert np.array_equal(local_aicc_widths(X, np.full(25, 3.0), 1), start)


def _fit(X, y, widths):
    from nbattn.local.engine import local_polynomial

    return local_polynomial(X, X, y, widths, 1)


def test_extreme_magnitudes_of_y():
    """y times 2**+-1000 (exact): the same widths to the bit; AICc moves by 2 log c."""
    rng = np.random.default_rng(80)
    X, y = _data(rng, "cu", 30)
    widths = local_aicc_widths(X, y, 1, var_type="cu")
    base = local_aicc(X, y, widths, 1, var_type="cu")
    for power in (1000, -1000):
        c = 2.0**power
        assert local_aicc_widths(X, y * c, 1, var_type="cu").tobytes() == widths.tobytes()
        got = local_aicc(X, y * c, widths, 1, var_type="cu")
        assert got == pytest.approx(base + 2 * power * math.log(2.0), rel=1e-12)


def test_too_few_rows_is_a_clear_error():
    X = np.array([[0.0], [1.0]])
    with pytest.raises(ValueError, match="aicc.*more than 3 rows"):
        local_aicc_widths(X, np.array([0.0, 1.0]), 0)
    X4 = np.arange(4.0)[:, None]  # local-linear: tr(H) >= 2 = n - 2
    with pytest.raises(ValueError, match="more than 4 rows"):
        local_aicc_widths(X4, np.sin(X4[:, 0]), 1)
    assert local_aicc(X, np.array([0.0, 1.0]), [1.0], 0) == math.inf


def test_estimators():
    from nbattn.estimators import (
        LocalPolynomialRegressor,
        NadarayaWatsonClassifier,
        NadarayaWatsonRegressor,
    )

    rng = np.random.default_rng(90)
    X, y = _data(rng, "cu", 40)
    weights = rng.uniform(0.5, 2.0, 40)
    for degree in (0, 1):
        model = LocalPolynomialRegressor(degree=degree, bandwidth="aicc", var_type="cu")
        first = model.fit(X, y).bandwidth_
        assert first.tobytes() == model.fit(X, y).bandwidth_.tobytes()
        want = local_aicc_widths(X, y, degree, var_type="cu")
        assert first.tobytes() == want.tobytes()
    nw = NadarayaWatsonRegressor(bandwidth="aicc")
    widths = nw.fit(X[:, :1], y, sample_weight=weights).bandwidth_
    again = nw.fit(X[:, :1], y, sample_weight=weights).bandwidth_
    assert widths.tobytes() == again.tobytes()
    kw = {"sample_weight": weights}
    assert local_aicc(X[:, :1], y, widths, 0, **kw) <= local_aicc(X[:, :1], y, "scott", 0, **kw)
    with pytest.raises(ValueError, match="bandwidth"):
        NadarayaWatsonClassifier(bandwidth="aicc").fit(X[:, :1], (y > 0).astype(int))


def test_command_line_names():
    from nbattn.app.arguments import width
    from nbattn.app.cli import make_estimator

    assert width("aicc") == "aicc"
    assert make_estimator("lp", bandwidth="aicc").bandwidth == "aicc"
    with pytest.raises(ValueError, match="aicc"):
        make_estimator("classifier", bandwidth="aicc")
