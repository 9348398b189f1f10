"""The classifier's width search against brute force on data sets built to break it.

The classifier's criterion (``nbattn.local.class_widths``: the smoothed leave-one-out
log-loss, profiled over the prior alpha) has no gradient, so its search is the common
factor and the column sweeps alone. Each data set below gives its curve over the
common factor of the rule's widths a shape that stops a careless search: the rule on a
flat stretch with the minimum a decade below it; two minima, the deeper on either side
of a rise; a minimum on a flat floor at the small end (tied rows); a minimum at the
large end (labels unrelated to x, where the curve falls towards the class frequencies).
The chosen (widths, alpha) must score never worse than the rule's widths, and end
within ``TOLERANCE`` of the way from the best point of a fine grid of common factors
(40 a decade over the search's four decades, each at its best alpha on a grid of step
0.02 in log alpha) back to the rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nbattn
from nbattn import config
from nbattn.local.class_widths import ALPHA_HIGH_PER_ROW, ALPHA_LOW
from nbattn.smoothing.regression import bandwidth_rule
from tests import naive

#: How far above the fine grid's best point the search may end, as a share of the
#: criterion's fall from the rule's widths to that point (the search refines a factor
#: to 0.5 % and alpha by golden sections; the grid only samples both).
TOLERANCE = 0.01
#: The fine grid of common factors: the span of ``config.LOO_GRID``, 40 points a decade.
FACTORS = np.logspace(
    math.log10(min(config.LOO_GRID)), math.log10(max(config.LOO_GRID)), 4 * 40 + 1
)


def _two_scales(seed):
    """Labels that follow x at two scales: a period of 1.5 and one of 20 on [0, 20]."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 20.0, 160)
    p = 0.5 + 0.2 * np.sign(np.sin(2 * np.pi * x / 1.5)) + 0.25 * np.sign(np.sin(np.pi * x / 10))
    return x[:, None], (rng.random(x.size) < p).astype(int)


def _fine_pattern():
    """A pattern of period 2 on [0, 20]: the rule (about 4) lies on the flat stretch of
    widths that average it away, the minimum a decade below."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 20.0, 120)
    p = 0.5 + 0.35 * np.sign(np.sin(np.pi * x))
    return x[:, None], (rng.random(x.size) < p).astype(int)


def _tied_levels():
    """Eight levels of x, twelve rows each, the label x's parity: every width below a
    third of the spacing gives the same floor (each row's eleven twins), the minimum."""
    x = np.repeat(np.arange(8.0), 12)
    return x[:, None], (x % 2).astype(int)


def _unrelated_labels():
    """Labels drawn apart from x: the curve falls (by 1e-5 of its height) all the way to
    the widest widths, the class frequencies."""
    rng = np.random.default_rng(4)
    return rng.normal(size=(100, 1)), rng.integers(0, 3, 100)


DATA = {
    "minimum-a-decade-below-a-flat-rule": _fine_pattern,
    "two-minima-deeper-wide": lambda: _two_scales(0),
    "two-minima-deeper-narrow": lambda: _two_scales(1),
    "flat-floor-at-the-small-end": _tied_levels,
    "minimum-at-the-large-end": _unrelated_labels,
}


def _curve(X, labels, widths_list):
    """(criterion at its best alpha on the fine alpha grid, median left-out mass) at each
    widths: the naive product kernel, Laplace's frequencies of the others (no weights)."""
    n = X.shape[0]
    onehot = np.eye(labels.max() + 1)[labels]
    prior = onehot.sum(axis=0)[labels] / (n - 1 + onehot.shape[1])  # (N_c - 1 + 1) / ...
    alphas = np.exp(np.arange(math.log(ALPHA_LOW), math.log(ALPHA_HIGH_PER_ROW * n), 0.02))
    values, masses = [], []
    for widths in widths_list:
        K = naive.product_kernel_matrix(X, X, widths, "c" * X.shape[1], [0] * X.shape[1])
        np.fill_diagonal(K, 0.0)
        mass, own = K.sum(axis=1), (K @ onehot)[np.arange(n), labels]
        p = (own + alphas[:, None] * prior) / (mass + alphas[:, None])
        values.append(float((-np.log(p).mean(axis=1)).min()))
        masses.append(float(np.median(mass)))
    return np.array(values), np.array(masses)


def test_the_curve_is_the_naive_smoothed_log_loss():
    """The test's vectorised curve is the reference's criterion at alpha's grid points."""
    X, labels = _two_scales(0)
    onehot = np.eye(2)[labels]
    h = bandwidth_rule(X) * 0.3
    value = _curve(X, labels, [h])[0][0]
    alphas = np.exp(np.arange(math.log(ALPHA_LOW), math.log(ALPHA_HIGH_PER_ROW * 160), 0.02))
    reference = min(
        naive.smoothed_class_loo_log_loss(X, onehot, h, "c", [0], a) for a in alphas[::10]
    )
    assert value <= reference * (1 + 1e-12)
    assert value >= reference * (1 - 1e-3)  # the every-tenth grid is close, not below


@pytest.mark.parametrize("bandwidth", ["loo", "loo_scale"])
@pytest.mark.parametrize("name", list(DATA))
def test_the_search_is_no_worse_than_a_fine_grid_nor_the_rule(name, bandwidth):
    X, labels = DATA[name]()
    h0 = bandwidth_rule(X)
    model = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth).fit(X, labels)
    again = nbattn.NadarayaWatsonClassifier(bandwidth=bandwidth).fit(X, labels)
    assert np.array_equal(model.bandwidth_, again.bandwidth_)
    assert model.prior_count_ == again.prior_count_
    onehot = np.eye(labels.max() + 1)[labels]
    chosen = naive.smoothed_class_loo_log_loss(
        X, onehot, model.bandwidth_, "c", [0], model.prior_count_
    )
    (rule,), (rule_mass,) = _curve(X, labels, [h0])
    grid, masses = _curve(X, labels, [f * h0 for f in FACTORS])
    # the search's fence: widths whose median left-out mass is below one row (or below
    # the rule's, where that is less) are not searched, so the grid leaves them out too
    admitted = masses >= min(1.0, rule_mass)
    best = float(grid[admitted].min())
    assert chosen <= rule * (1 + 1e-9), (chosen, rule)
    assert chosen <= best + TOLERANCE * (rule - best), (chosen, best, rule, model.bandwidth_)
