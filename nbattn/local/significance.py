"""Significance tests of a local fit's columns, by the wild bootstrap at held widths.

For a group G of columns (one column, or several tested jointly) the statistic is
Racine's (1997, "Consistent significance testing for nonparametric regression") for
the continuous columns and Racine, Hart and Li's (2006, "Testing the significance of
categorical predictor variables in nonparametric regression models") for the
categorical ones, summed over the group:

    I = sum_i w_i [ sum_{c in G, continuous} (d g / d x_c (x_i))^2
                    + sum_{c in G, categorical} sum_{l > l_0} (g(x_i; c = l) - g(x_i; c = l_0))^2 ]

with g the local fit at the held widths, w_i = 1/n (or the rows' weights, normalised),
and l_0 < l_1 < ... the levels of column c present in the data (statsmodels'
``TestRegCoefC`` / ``TestRegCoefD`` compute the same sums for one column kind).

Under the null hypothesis the columns of G do not enter E[y | x]. Its distribution is
the wild bootstrap's (R np's ``npsigtest(boot.method="wild", pivot=FALSE)``): the
restricted fit g_r leaves the columns of G out (the same kernel, degree and widths on
the other columns; the weighted mean of y when none is left), and replicate b is

    y*_ib = g_r(x_i) + e_i v_ib,   v from :func:`nbattn.local.resampling.wild_multipliers`,
    e_i = (r_i - mean r) sd(u) / sd(r),   r = y - g_r(x),   u_i = y_i - g_{-i}(x_i),

the restricted residuals centred and brought to the spread of the unrestricted model's
leave-one-out residuals u (means and spreads weighted by w). The restricted residuals
alone also hold the tested columns' signal, and replicates that noisy hide it (no power
against a modest slope); np brings them to the spread of the unrestricted in-sample
residuals instead, which the fit shrinks, so its replicates are too quiet under the
null (that rescaling here: 12.5 % rejections at 5 % on 200 simulated data sets of 80
rows, against 4.5 % with u). np's restricted fit holds the columns at their median in
the unrestricted fit rather than leaving them out. Its statistic I*_b is computed as I
with the fit of y*_b at the same widths. The p-value is (1 + #{b : I*_b >= I}) / (B + 1),
never 0 (Davison and Hinkley 1997, "Bootstrap methods and their application", section 4.2).

The fit is linear in its values, so the B replicates are B columns of values of one
engine pass (:func:`nbattn.local.engine.fit_values`), in chunks of columns that bound
the memory of the slopes to about ``CHUNK_FLOATS`` floats. y is first taken about its
mid-range, which no fit sees (each reproduces a constant), so that a constant y gives
I = 0 and p = 1 exactly rather than a test of the fits' rounding.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from .._core.numeric import power_of_two_scale
from .engine import fit_values, loo_residuals, loo_term_weights
from .problem import LocalSpec, layout
from .resampling import wild_multipliers

__all__ = [
    "CHUNK_FLOATS",
    "GroupTest",
    "combined",
    "restricted_fit",
    "significance_tests",
    "statistics",
]

#: the most float64 numbers (8 bytes each) a chunk of replicates' fits and slopes holds
CHUNK_FLOATS = 1 << 24


class GroupTest(NamedTuple):
    """One group's result: the statistic I, its p-value and the B replicates' I*;
    ``out_of_range``: I > 0 lies beyond float64's range in the units of y and X (it is
    reported as 0 or inf; the p-value, computed in scaled units, is exact)."""

    statistic: float
    p_value: float
    replicates: np.ndarray
    out_of_range: bool = False


def _levels(column: np.ndarray) -> np.ndarray:
    """The sorted category codes present in a column (missing values left out)."""
    return np.unique(column[~np.isnan(column)])


def statistics(spec: LocalSpec, X, values, widths, degree, columns, *, sample_weight=None):
    """Each column's term of the statistic I for each column of ``values`` (n, m):
    (len(columns), m) float64 (module docstring), the fits at the held ``widths``. A
    continuous column's term is in units of its width, ``sum_i w_i (h_c dg/dx_c)^2``
    (scale-free in x: :func:`combined` divides by h_c^2)."""
    n, m = values.shape
    term_weights = loo_term_weights(sample_weight, n)
    kinds = spec.var_type
    continuous = np.flatnonzero(spec.continuous)
    per_row = 1 + sum(1 if kinds[c] == "c" else _levels(X[:, c]).size for c in columns)
    chunk = int(max(1, min(m, CHUNK_FLOATS // max(1, n * per_row))))
    terms = np.zeros((len(columns), m))
    slopes = [t for t, c in enumerate(columns) if kinds[c] == "c"]
    for start in range(0, m, chunk):
        part = np.ascontiguousarray(values[:, start : start + chunk])
        stop = start + part.shape[1]
        if slopes:
            problem = layout(spec, X, X, part, widths, degree, sample_weight=sample_weight)
            _, grad = fit_values(problem, return_gradient=True)  # (n, d_c, chunk)
            for t in slopes:
                c = columns[t]
                slope = grad[:, int(np.searchsorted(continuous, c)), :] * widths[c]
                terms[t, start:stop] = term_weights @ slope**2
        for t, c in enumerate(columns):
            levels = _levels(X[:, c]) if kinds[c] != "c" else None
            if levels is None or levels.size < 2:
                continue  # continuous, or one level: the fit cannot change across levels
            queries = np.tile(X, (levels.size, 1))
            queries[:, c] = np.repeat(levels, n)
            problem = layout(spec, queries, X, part, widths, degree, sample_weight=sample_weight)
            fits = fit_values(problem).reshape(levels.size, n, -1)
            terms[t, start:stop] = term_weights @ ((fits[1:] - fits[0]) ** 2).sum(axis=0)
    return terms


def combined(spec: LocalSpec, widths, columns, terms):
    """(the terms summed with weights 1/h_c^2 for continuous columns and 1 for categorical
    ones, each divided by the largest weight so that nothing overflows: the order of I
    and its replicates; the log of that largest weight)."""
    log_weights = np.array(
        [-2.0 * np.log(widths[c]) if spec.var_type[c] == "c" else 0.0 for c in columns]
    )
    top = float(log_weights.max())
    return np.exp(log_weights - top) @ terms, top


def restricted_fit(spec: LocalSpec, X, y, widths, degree, columns, *, sample_weight=None):
    """The fit of y (n,) at the rows of X without the columns ``columns``: the same
    kernel, degree and widths on the others; the (weighted) mean of y if none is left."""
    keep = np.setdiff1d(np.arange(len(spec.var_type)), np.asarray(columns, dtype=np.int64))
    if keep.size == 0:
        if sample_weight is None:
            return np.full(y.shape[0], y.mean())
        return np.full(y.shape[0], loo_term_weights(sample_weight, y.shape[0]) @ y)
    restricted = dataclasses.replace(
        spec,
        var_type="".join(spec.var_type[c] for c in keep),
        n_categories=tuple(spec.n_categories[c] for c in keep),
    )
    Xr = np.ascontiguousarray(X[:, keep])
    problem = layout(restricted, Xr, Xr, y, widths[keep], degree, sample_weight=sample_weight)
    return fit_values(problem)


def _spread(r, w) -> float:
    """The weighted standard deviation of r about its weighted mean."""
    return float(np.sqrt(w @ (r - w @ r) ** 2))


def significance_tests(
    spec: LocalSpec,
    X,
    y,
    widths,
    degree,
    groups,
    rng: np.random.Generator,
    *,
    sample_weight=None,
    n_boot=399,
    multipliers="mammen",
) -> list:
    """One :class:`GroupTest` per group of column positions in ``groups``, on checked data:
    X (n, d) float64 columns of ``spec``, y (n,), ``widths`` (d,) checked. The
    multipliers are drawn once, (n, n_boot), and shared by the groups."""
    v = wild_multipliers(rng, y.shape[0], n_boot, multipliers)
    # y about its mid-range, in units of a power of two (exact): every fit reproduces a
    # constant, so I and the I* do not change, but a constant y is then exactly 0 (I = 0,
    # p = 1, not a coin toss on rounding noise) and the spreads cannot overflow
    centre = y.min() + (y.max() / 2.0 - y.min() / 2.0)  # no overflow; y.min() if constant
    y = y - centre
    unit = float(power_of_two_scale(np.max(np.abs(y))))
    y = y / unit
    w = loo_term_weights(sample_weight, y.shape[0])
    spread = _spread(
        loo_residuals(spec, X, y, widths, degree, sample_weight=sample_weight)[:, 0], w
    )
    out = []
    for columns in groups:
        g_r = restricted_fit(spec, X, y, widths, degree, columns, sample_weight=sample_weight)
        r = y - g_r
        r = r - w @ r
        spread_r = _spread(r, w)
        e = r * (spread / spread_r) if spread_r > 0.0 else np.zeros_like(r)
        replicates = g_r[:, None] + e[:, None] * v
        values = np.column_stack([y, replicates])
        terms = statistics(spec, X, values, widths, degree, columns, sample_weight=sample_weight)
        both, log_weight = combined(spec, widths, columns, terms)
        p_value = (1.0 + np.count_nonzero(both[1:] >= both[0])) / (n_boot + 1.0)
        # back to y's units and the weights' scale: inf or 0 only beyond float64's range
        with np.errstate(over="ignore", under="ignore", divide="ignore"):
            scaled = np.exp(np.log(both) + log_weight + 2.0 * np.log(unit))
        lost = bool(both[0] > 0.0 and (scaled[0] == 0.0 or not np.isfinite(scaled[0])))
        out.append(GroupTest(float(scaled[0]), float(p_value), scaled[1:], lost))
    return out
