"""The width search's later rounds of sweeps against brute force, on synthetic criteria of
theta built to break a shortcut: a later round skips a column only where one grid step
of it gains nothing *and* the other parameters stayed within a grid step of where that
column was last swept. Each curve hides a deep well in one column that opens only once
an earlier sweep of the other column has moved it far: the first round cannot see it,
and one step either side of the second round's start cannot either."""

import math
import types

import numpy as np
import pytest

from nbattn import config
from nbattn.local.problem import check_columns
from nbattn.local.search import SearchPolicy, search_widths, theta_to_widths

_GRID_STEP = math.log(config.LOO_GRID[1] / config.LOO_GRID[0])


class _Curve:
    """A criterion of theta with the interface the search reads (``loss``,
    ``loss_and_grad``, ``best``, ``base.spec``, ``targets``), the gradient by central
    differences, every evaluation counted."""

    def __init__(self, function, var_type):
        spec, _ = check_columns(
            {"X": np.zeros((4, len(var_type)))},
            var_type=var_type,
            n_categories=[0 if k == "c" else 3 for k in var_type],
        )
        self.base = types.SimpleNamespace(spec=spec)
        self.targets = np.zeros(4)
        self.function = function
        self.best = (math.inf, None)
        self.basins = []
        self.evaluations = 0

    def loss(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        value = float(self.function(theta))
        self.evaluations += 1
        if value < self.best[0]:
            self.best = (value, theta.copy())
        return value

    def loss_and_grad(self, theta):
        theta = np.asarray(theta, dtype=np.float64)
        grad = np.zeros_like(theta)
        for j in range(theta.size):
            step = np.zeros_like(theta)
            step[j] = 1e-6
            grad[j] = (self.function(theta + step) - self.function(theta - step)) / 2e-6
        return self.loss(theta), grad


def _well(x, centre, width):
    return np.exp(-((x - centre) ** 2) / (2.0 * width**2))


def _hidden_well_curve(first, second, depth_first, depth_second, wide=0.5, narrow=0.2):
    """f over (theta[first], theta[second]) = (x, y): a shallow bowl at 0 and two wells.
    The first, at y = 3, is open only while x stays near 0 (a sweep of y from the start
    finds it); the second, at x = -3, is open only while y is near 3, where the first well
    took it: the first round swept x from y = 0 and saw nothing."""

    def f(theta):
        x, y = theta[..., first], theta[..., second]
        bowl = 1.0 + 0.01 * (x**2 + y**2)
        one = depth_first * _well(y, 3.0, narrow) * _well(x, 0.0, wide)
        two = depth_second * _well(x, -3.0, narrow) * _well(y, 3.0, wide)
        return bowl - one - two

    return f


def _brute_force(function, n_params, span=(-6.0, 8.0), points=281):
    axis = np.linspace(*span, points)
    mesh = np.stack(np.meshgrid(*([axis] * n_params), indexing="ij"), axis=-1)
    return float(np.min(function(mesh)))


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
@pytest.mark.parametrize("depths", [(0.5, 1.0), (0.3, 0.6), (0.8, 2.0)])
def test_a_well_opened_by_a_sweep_is_found_by_the_next_round(order, depths):
    """Two continuous columns, either order: the search lands in the deeper, hidden well,
    within 1e-3 of a dense brute-force grid, the same from two identical searches."""
    function = _hidden_well_curve(*order, *depths)
    found = []
    for _ in range(2):
        curve = _Curve(function, "cc")
        theta = search_widths(curve, np.ones(2))
        found.append(theta)
    np.testing.assert_array_equal(found[0], found[1])
    brute = _brute_force(function, 2)
    assert curve.best[0] <= brute + 1e-3, (order, depths, curve.best, brute)
    assert math.isclose(theta[order[0]], -3.0, abs_tol=0.3), theta


def test_three_columns_the_third_untouched():
    """A third continuous column that only adds a bowl: the hidden well is still found."""
    base = _hidden_well_curve(0, 2, 0.5, 1.0)

    def function(theta):
        return base(theta) + 0.02 * (theta[..., 1] - 0.5) ** 2

    curve = _Curve(function, "ccc")
    search_widths(curve, np.ones(3))
    brute = _brute_force(function, 3, points=57)  # a coarse grid: the wells' floors are wide
    assert curve.best[0] <= brute + 2e-3, (curve.best, brute)


def test_the_shortcut_still_saves_where_nothing_moved():
    """A plain bowl (nothing hidden): a later round, if any, sweeps no column whose point
    stood still, so the shortcut evaluates fewer than the full rounds."""

    def function(theta):
        return 1.0 + 0.05 * np.sum((theta - 0.7) ** 2, axis=-1) + 0.02 * np.sin(3 * theta[..., 0])

    counts = {}
    for repeats in (True, False):
        curve = _Curve(function, "ccc")
        search_widths(curve, np.ones(3), policy=SearchPolicy(verify_repeats=repeats))
        counts[repeats] = (curve.evaluations, curve.best[0])
    assert counts[True][1] <= counts[False][1] * (1 + config.LOO_RTOL)
    assert counts[True][0] <= counts[False][0]


def test_widths_of_the_hidden_well():
    """theta maps to widths as the estimator reads them (log h per continuous column)."""
    widths = theta_to_widths(np.array([-3.0, 3.0]), "cc", [0, 0])
    np.testing.assert_allclose(widths, np.exp([-3.0, 3.0]))
