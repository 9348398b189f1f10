"""The search for nearest-neighbour counts k (and categorical smoothings l) that minimise
a leave-one-out criterion (:mod:`nbattn.local.neighbours`).

The criterion of integer k has no gradient and is not convex in k (a count that puts a
width across a gap between clusters changes it in a step), so the search evaluates it:

* **one coordinate**: every k in [1, n - 1] where there are at most
  ``config.NN_EXHAUSTIVE_COUNTS`` of them; else a grid of at most that many counts,
  evenly spaced in log k and always holding both ends, is evaluated, the interval between
  the best count's neighbours in the grid becomes the next range, and so on until a
  range holds at most that many counts, each of which is evaluated (the best count so far
  stays on every grid; a range that the grid's rounding cannot narrow is halved about it).
  The answer is the best count evaluated (the smallest on ties), so it is never worse than
  any count the grids held, among them 1, n - 1 and every count near the answer; a
  criterion infinite at every count evaluated is an error, not an answer;
* **categorical columns**: l on a grid of ``config.NN_LAMBDA_GRID`` points over
  [0, l_max] (ends included), then the same grid between the best point's neighbours;
* **several columns**: first one count shared by every continuous column (the
  one-coordinate search), the categorical columns at their rule's l; then coordinate
  descent, each column searched with the others held, in column order, until a sweep
  changes nothing (at most ``config.NN_MAX_SWEEPS`` sweeps). Each step keeps the best
  point evaluated, so the criterion never rises.

Evaluations are cached by their exact widths, and nothing reads a clock or a random
number: two searches on the same data give the same bits.
"""

from __future__ import annotations

import math

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale
from .engine import loo_loss
from .problem import LocalSpec, lambda_max, layout, rule_lambdas

__all__ = ["count_grid", "neighbour_loo_widths", "search_neighbour_widths"]


def count_grid(low: int, high: int, size: int) -> np.ndarray:
    """At most ``size`` distinct integers in [low, high], both ends included, evenly spaced
    in log k (every integer where the range holds at most ``size``)."""
    if high - low + 1 <= size:
        return np.arange(low, high + 1, dtype=np.int64)
    points = np.exp(np.linspace(math.log(low), math.log(high), size))
    grid = np.unique(np.clip(np.rint(points), low, high).astype(np.int64))
    return np.unique(np.concatenate(([low], grid, [high])))


class _Criterion:
    """The criterion with its evaluations cached by the exact widths."""

    def __init__(self, function):
        self.function = function
        self.values = {}

    def __call__(self, widths) -> float:
        key = tuple(float(w) for w in widths)
        if key not in self.values:
            value = float(self.function(np.array(key)))
            self.values[key] = value if math.isfinite(value) else math.inf
        return self.values[key]


def _best(criterion, widths, position, candidates):
    """The candidate for ``widths[position]`` of smallest criterion (the first on ties),
    and its value."""
    best_value, best_candidate = math.inf, None
    for candidate in candidates:
        trial = widths.copy()
        trial[position] = candidate
        value = criterion(trial)
        if value < best_value:
            best_value, best_candidate = value, candidate
    return best_candidate, best_value


def _search_count(criterion, widths, positions, n_max):
    """The count k in [1, n_max] shared by ``positions`` (one column, or every continuous
    column at once) of smallest criterion, the others held (module docstring)."""
    size = max(4, int(config.NN_EXHAUSTIVE_COUNTS))
    low, high = 1, n_max

    def set_count(k):
        trial = widths.copy()
        trial[positions] = k
        return trial

    best_k, best_value = None, math.inf
    while True:
        grid = count_grid(low, high, size)
        if best_k is not None:  # the best so far stays on the grid: its bracket holds it
            grid = np.union1d(grid, [best_k])
        values = [criterion(set_count(k)) for k in grid]
        at = int(np.argmin(values))  # the smallest count on ties
        best_k, best_value = int(grid[at]), values[at]
        if grid.shape[0] == high - low + 1:  # every count of the range evaluated
            break
        bracket = int(grid[max(at - 1, 0)]), int(grid[min(at + 1, grid.shape[0] - 1)])
        if bracket == (low, high):  # rounding left too few counts to narrow: halve instead
            middle = (low + high) // 2
            bracket = (low, middle) if best_k <= middle else (middle, high)
        low, high = bracket
    return best_k, best_value


def _search_lambda(criterion, widths, position, top):
    """l in [0, top] for categorical column ``position`` by two grids (module docstring)."""
    size = max(3, int(config.NN_LAMBDA_GRID))
    grid = np.linspace(0.0, top, size)
    best, value = _best(criterion, widths, position, grid)
    at = int(np.argmin(np.abs(grid - best)))
    fine = np.linspace(grid[max(at - 1, 0)], grid[min(at + 1, size - 1)], size)
    fine_best, fine_value = _best(criterion, widths, position, fine)
    return (fine_best, fine_value) if fine_value < value else (best, value)


def search_neighbour_widths(function, var_type, start, lambda_top, n_max):
    """Widths (d,) minimising ``function(widths)``: integer counts k in [1, n_max] for the
    continuous columns, l in [0, lambda_top[c]] for the categorical ones, starting at
    ``start`` (its categorical entries: the rule's l). ``function`` returns a float (inf
    where the criterion is undefined). Returns ``(widths, value, n_evaluations)``."""
    criterion = _Criterion(function)
    widths = np.asarray(start, dtype=np.float64).copy()
    cont = np.array([kind == "c" for kind in var_type], dtype=bool)
    positions = np.flatnonzero(cont)
    if positions.size:
        k, value = _search_count(criterion, widths, positions, n_max)
        widths[positions] = k
    else:
        value = criterion(widths)
    if not math.isfinite(value):
        raise ValueError(
            "the leave-one-out criterion is infinite at every count k the search evaluated "
            "(a compact kernel leaves some row no other row within reach): use the "
            "Gaussian kernel or given counts"
        )
    if len(var_type) > 1:
        for _ in range(int(config.NN_MAX_SWEEPS)):
            before = widths.copy()
            for position, kind in enumerate(var_type):
                if kind == "c":
                    k, trial_value = _search_count(criterion, widths, [position], n_max)
                    candidate = k
                else:
                    candidate, trial_value = _search_lambda(
                        criterion, widths, position, float(lambda_top[position])
                    )
                if trial_value < value:
                    widths[position], value = candidate, trial_value
            if np.array_equal(widths, before):
                break
    return widths, value, len(criterion.values)


def neighbour_loo_widths(spec: LocalSpec, X, Y, degree, sample_weight=None):
    """The nearest-neighbour widths of a regression (counts k, and l per categorical
    column) minimising the engine's leave-one-out MSE (``loo_loss``: the key weights weigh
    the terms too) on checked training rows X (n, d) and values Y (n, m), searched on Y
    divided by a power of two (exact). Returns ``(widths, criterion, n_evaluations)``."""
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"nearest-neighbour widths need at least 2 samples, got n_samples={n}")

    # y divided by a power of two near its largest magnitude (exact): the squared errors
    # of y near 1e300 stay finite and compare as they would at y / 1e300
    unit = float(power_of_two_scale(np.max(np.abs(Y)))) if Y.size else 1.0
    Y = Y / unit

    def criterion(widths):
        problem = layout(
            spec, X, X, Y, widths, degree, sample_weight=sample_weight, exclude_self=True
        )
        return loo_loss(problem)

    start = rule_lambdas(spec.var_type, spec.counts, n)
    top = lambda_max(spec.var_type, spec.counts)
    widths, value, evaluations = search_neighbour_widths(
        criterion, spec.var_type, start, top, n - 1
    )
    with np.errstate(over="ignore"):  # in y's units: inf only beyond float64
        return widths, value * unit * unit, evaluations
