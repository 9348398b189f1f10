"""The width search against brute force where the categorical smoothing's best value is
far below the linear shares of its range and above exact matching: a narrow well in
log l with a barrier between it and the basin that the descents reach (as clarity's l
on ggplot2's diamonds: 0.01301 at 5e-5, 0.01302 at 1e-5, 0.01299 at 3e-7, 0.0147 at
exactly 0). The sweep tries the decades of l below its linear shares."""

import math

import numpy as np
import pytest

from nbattn.local.search import search_widths, sigmoid
from tests.local.test_search_rounds import _Curve, _well


def _small_l_curve(kind, log_share, depth, shallow=0.002, width=1.2):
    """f over (log h, t) of a continuous and a ``kind`` column (lambda_max = 1 for 'o',
    2/3 for 'u' with 3 categories): a bowl in log h, a shallow well at l / lambda_max
    = 0.05 and a deeper one, ``width`` wide in log l, at 10 ** ``log_share``; exact
    matching (t = -inf) sits on the bowl alone."""

    def f(theta):
        x, t = theta[..., 0], theta[..., 1]
        share = np.where(np.isneginf(t), 0.0, 1.0 / (1.0 + np.exp(-np.maximum(t, -700))))
        log_l = np.log10(np.maximum(share, 1e-300))
        bowl = 1.0 + 0.01 * (x - 0.3) ** 2
        near = shallow * _well(log_l, math.log10(0.05), 0.4)
        deep = depth * _well(log_l, log_share, width / 2) * _well(x, 0.3, 2.0)
        return bowl - near - deep

    return f


def _brute_force(function):
    x = np.linspace(-4.0, 4.0, 81)
    t = np.concatenate([[-np.inf], np.linspace(-30.0, 30.0, 6001)])
    mesh = np.stack(np.meshgrid(x, t, indexing="ij"), axis=-1)
    return float(np.min(function(mesh)))


@pytest.mark.parametrize("kind", ["o", "u"])
@pytest.mark.parametrize("log_share", [-3.5, -5.0, -6.5, -7.5])
@pytest.mark.parametrize("depth", [0.003, 0.01])
def test_a_well_at_a_tiny_l_is_found(kind, log_share, depth):
    """The search reaches the deep well (within 1e-4 of a dense brute-force grid over
    log h and t, exact matching included), the same from two identical searches."""
    function = _small_l_curve(kind, log_share, depth)
    found = []
    for _ in range(2):
        curve = _Curve(function, "c" + kind)
        found.append(search_widths(curve, np.array([1.0, 0.3])))
    np.testing.assert_array_equal(found[0], found[1])
    brute = _brute_force(function)
    assert curve.best[0] <= brute + 1e-4, (curve.best, brute)
    share = sigmoid(float(curve.best[1][1]))
    assert abs(math.log10(share) - log_share) < 1.0, share


@pytest.mark.parametrize("log_share", [-6.5, -4.5])
def test_a_well_wide_enough_for_the_decades_at_any_offset(log_share):
    """Wells 0.8 of a decade wide (in l) are found wherever they sit between two decades;
    over a grid of offsets."""
    for offset in np.arange(0.0, 1.0, 0.125):
        function = _small_l_curve("o", log_share + offset, 0.01, width=0.8)
        curve = _Curve(function, "co")
        search_widths(curve, np.array([1.0, 0.3]))
        assert curve.best[0] <= _brute_force(function) + 1e-4, (offset, curve.best)


@pytest.mark.xfail(
    strict=True,
    reason="the sweep tries whole decades of l: a well half a decade wide centred between "
    "two of them (here at 10^-5.5) shows 0.14 of its depth at either, less than "
    "the shallow basin near l = 0.05, so the search stays there",
)
def test_a_well_narrower_than_the_decades_between_them():
    function = _small_l_curve("o", -5.5, 0.01, width=0.5)
    curve = _Curve(function, "co")
    search_widths(curve, np.array([1.0, 0.3]))
    assert curve.best[0] <= _brute_force(function) + 1e-4
