"""Bootstrap bands of the local fit at held widths (functional layer).

A pointwise (1 - alpha) band for the fit's expectation at the queries, E[g(x)] with the
widths held where the model put them (as the sandwich interval of
:func:`nbattn.local.engine.prediction_interval`); re-choosing the widths in every
replicate is not done. Two resamplings (:mod:`nbattn.local.resampling` draws them):

* ``"wild"`` (Wu 1986, "Jackknife, bootstrap and other resampling methods in regression
  analysis"; Mammen 1993, "Bootstrap and wild bootstrap for high dimensional linear
  models"; Haerdle and Marron 1991, "Bootstrap simultaneous error bars for nonparametric
  regression"): with r_j the training rows' leave-one-out residuals
  (:func:`nbattn.local.engine.loo_residuals`, the sandwich's) and v_jb Mammen's two-point
  multipliers, replicate b's deviation at x is

      d_b(x) = sum_j l_j(x) r_j v_jb,

  l_j the equivalent-kernel weights (``g(x) = sum_j l_j(x) y_j``), so that
  Var d(x) = sum_j l_j(x)^2 r_j^2 exactly, the sandwich variance. The fit is linear in
  its values, so every replicate comes from ONE engine pass whose values are the columns
  r v_b (in chunks of columns: about n_train * chunk * 8 bytes each). The band is the
  percentile interval of the replicates recentred on the fit:
  [g(x) + q_{alpha/2}(d(x)), g(x) + q_{1-alpha/2}(d(x))]. A row's multiplier is shared
  by every output of a 2-D target.
* ``"pairs"`` (Efron 1979, "Bootstrap methods: another look at the jackknife"): rows
  drawn with replacement, their counts c_jb multiplying the fit's own weights, the
  model refitted at the held widths (one engine pass per replicate), and the band the
  alpha/2 and 1 - alpha/2 percentiles of g*_b(x). A query that no drawn row reaches
  (a compact kernel) takes the nearest drawn row's target, what a model fitted on the
  drawn rows predicts there.

Percentiles are numpy's default (linear interpolation between order statistics, Hyndman
and Fan 1996's type 7), taken without overflow for replicates near +-1e308
(:func:`percentiles`); the wild band works on y divided by a power of two when it nears
float64's top, so that its residuals and deviations stay finite and only an end that
itself passes float64 is inf. No queries give empty ends and draw nothing.
With n_boot * alpha / 2 < 1 an end lies beyond the replicates'
range and is read as their extreme: a ``UserWarning`` says so (no minimum is imposed; R's
np imposes none either). The queries are taken in blocks whose replicates (n_block,
n_outputs, n_boot) hold about :data:`BAND_BYTES`; every block draws the same
multipliers (or counts) from a copy of the generator, which afterwards stands where one
pass over them leaves it.
"""

from __future__ import annotations

import copy
import warnings
from typing import NamedTuple

import numpy as np

from .._core.numeric import plus_scaled, power_of_two_scale
from .._core.validation import check_choice, check_positive_int
from .engine import check_alpha, fit_values, loo_residuals
from .problem import LocalSpec, layout
from .resampling import bootstrap_generator, pairs_counts, wild_multipliers

__all__ = [
    "BAND_BYTES",
    "BandOptions",
    "METHODS",
    "RESAMPLES",
    "bootstrap_band",
    "bootstrap_replicates",
    "check_band",
    "percentiles",
]

#: the interval methods of ``predict_interval``
METHODS = ("asymptotic", "bootstrap")
#: the bootstrap's resamplings
RESAMPLES = ("wild", "pairs")
#: about the bytes of one block of replicates, and of one chunk of the wild values
BAND_BYTES = 2**26


class BandOptions(NamedTuple):
    """``predict_interval``'s ``method`` and its bootstrap's keywords, as the user gave
    them (:func:`check_band` checks them)."""

    method: str = "asymptotic"
    n_boot: int = 999
    resample: str = "wild"
    random_state: object = None


def check_band(options: BandOptions, kind) -> BandOptions:
    """``options`` checked: ``method`` one of :data:`METHODS`, ``n_boot`` an int >= 1,
    ``resample`` one of :data:`RESAMPLES`; the bootstrap is a band of the mean only
    (``kind="mean"``). ``random_state`` is checked where the draws start."""
    method = check_choice(options.method, "method", METHODS)
    n_boot = check_positive_int(options.n_boot, "n_boot")
    resample = check_choice(options.resample, "resample", RESAMPLES)
    if method == "bootstrap" and kind != "mean":
        raise ValueError(
            f"method='bootstrap' gives a band of the mean (kind='mean') only; kind={kind!r} "
            "is for method='asymptotic'"
        )
    return options._replace(method=method, n_boot=n_boot, resample=resample)


def bootstrap_replicates(
    spec: LocalSpec,
    keys,
    y,
    queries,
    widths,
    degree,
    *,
    sample_weight=None,
    n_boot=999,
    resample="wild",
    rng=None,
    residuals=None,
    chunk=None,
):
    """The replicates at the queries, (n_queries, n_outputs, n_boot), on checked data
    (:func:`nbattn.local.problem.layout`'s inputs; ``y`` (n, n_outputs)).

    ``"wild"``: the deviations d_b(x) = sum_j l_j(x) r_j v_jb (module docstring), r the
    ``residuals`` (n, n_outputs) (None: :func:`nbattn.local.engine.loo_residuals`);
    ``"pairs"``: the refits g*_b(x) with weights c_jb s_j. ``rng`` a numpy Generator
    (None: the fixed seed of :func:`nbattn.local.resampling.bootstrap_generator`),
    advanced by the draws; ``chunk`` the wild replicates per engine pass (None: as many
    as fit in :data:`BAND_BYTES` of values).
    """
    reps, unit = _scaled_replicates(
        spec,
        keys,
        y,
        queries,
        widths,
        degree,
        sample_weight,
        n_boot,
        resample,
        rng,
        residuals,
        chunk,
    )
    with np.errstate(over="ignore"):  # a deviation beyond float64 is inf
        return reps * unit


def _scaled_replicates(
    spec, keys, y, queries, widths, degree, sample_weight, n_boot, resample, rng, residuals, chunk
):
    """``(reps, unit)``: :func:`bootstrap_replicates`'s replicates divided by the power of
    two ``unit`` (1 for ``"pairs"``), so that wild deviations beyond float64 stay finite
    until their percentiles are taken."""
    rng = bootstrap_generator(None) if rng is None else rng
    n, m = y.shape
    out = np.empty((queries.shape[0], m, n_boot))
    if resample == "pairs":
        weights = np.ones(n) if sample_weight is None else sample_weight
        chunk = max(1, BAND_BYTES // (8 * n))  # counts drawn for this many replicates at once
        for start in range(0, n_boot, chunk):
            for b, count in enumerate(pairs_counts(rng, n, min(chunk, n_boot - start)), start):
                refit = layout(
                    spec, queries, keys, y, widths, degree, sample_weight=count * weights
                )
                out[:, :, b] = fit_values(refit).reshape(-1, m)
        return out, 1.0
    if residuals is None:
        residuals = loo_residuals(spec, keys, y, widths, degree, sample_weight=sample_weight)
    # divided by a power of two near their largest magnitude (exact), so that r v stays
    # finite for residuals near 1.7e308; the deviations are multiplied back
    unit = float(power_of_two_scale(np.max(np.abs(residuals)) if residuals.size else 0.0))
    scaled = residuals / unit
    chunk = max(1, BAND_BYTES // (8 * n * m)) if chunk is None else int(chunk)
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        v = wild_multipliers(rng, n, size)
        values = (scaled[:, :, None] * v[:, None, :]).reshape(n, m * size)
        problem = layout(spec, queries, keys, values, widths, degree, sample_weight=sample_weight)
        out[:, :, start : start + size] = fit_values(problem).reshape(-1, m, size)
    return out, unit


def percentiles(reps, levels):
    """``np.quantile(reps, levels, axis=-1)`` (type 7: a + (b - a) t between the order
    statistics a <= b) without its overflow: where b - a would pass float64 (replicates
    of both signs near 1e308) the row is divided by 4 first and its percentiles multiplied
    back, both exact, so the percentile is the finite value between a and b, never an
    inf or NaN that the replicates do not hold."""
    reps = np.asarray(reps, dtype=np.float64)
    big = np.max(np.abs(reps), axis=-1, initial=0.0) > 2.0**1021
    if not big.any():
        return np.quantile(reps, levels, axis=-1)
    scale = np.where(big, 4.0, 1.0)
    out = np.quantile(reps / scale[..., None], levels, axis=-1)
    with np.errstate(over="ignore"):  # only an end beyond float64 itself
        return out * scale


def bootstrap_band(
    spec: LocalSpec,
    keys,
    y,
    queries,
    widths,
    degree,
    *,
    sample_weight=None,
    alpha=0.05,
    n_boot=999,
    resample="wild",
    random_state=None,
    centre=None,
):
    """``(lower, upper)``, each (n_queries, n_outputs): the pointwise (1 - alpha)
    bootstrap band of the fit's expectation at the queries, widths held (module
    docstring), on checked data (``y`` (n, n_outputs)).

    ``"wild"``: ``centre + percentiles of d(x)``, ``centre`` the fit g at the queries
    (None: :func:`nbattn.local.engine.fit_values` of this layout); ``"pairs"``: the
    percentiles of the refits g*_b(x). ``random_state``: None (a fixed seed), an int, a
    numpy Generator (advanced) or a RandomState
    (:func:`nbattn.local.resampling.bootstrap_generator`).
    """
    alpha = check_alpha(alpha)
    n_boot = check_positive_int(n_boot, "n_boot")
    resample = check_choice(resample, "resample", RESAMPLES)
    rng = bootstrap_generator(random_state)
    if n_boot * alpha / 2.0 < 1.0:
        warnings.warn(
            f"n_boot={n_boot} replicates at alpha={alpha!r}: n_boot * alpha / 2 < 1, so the "
            "band's ends are the replicates' extremes (it is too narrow); take n_boot of "
            f"at least 2 / alpha = {2.0 / alpha:.6g}",
            UserWarning,
            stacklevel=4,  # the caller of an estimator's predict_interval
        )
    n_queries, m = queries.shape[0], y.shape[1]
    if n_queries == 0:  # nothing to resample: no draws, the generator stays where it is
        return np.empty((0, m)), np.empty((0, m))
    residuals, unit = None, 1.0
    if resample == "wild":
        # y divided by a power of two when near float64's top (exact; the fit is linear in
        # y), so that a leave-one-out residual y_j - g_-j(x_j) of about 2 max|y| is finite
        top = float(np.max(np.abs(y), initial=0.0))
        unit = float(power_of_two_scale(top)) * 2.0**-1000 if top > 2.0**1000 else 1.0
        residuals = loo_residuals(spec, keys, y / unit, widths, degree, sample_weight=sample_weight)
        if centre is None:
            fit = layout(spec, queries, keys, y, widths, degree, sample_weight=sample_weight)
            centre = fit_values(fit)
        centre = np.asarray(centre, dtype=np.float64).reshape(n_queries, m)
    levels = [alpha / 2.0, 1.0 - alpha / 2.0]
    lower = np.empty((n_queries, m))
    upper = np.empty_like(lower)
    block = max(1, BAND_BYTES // (8 * m * n_boot))
    start_state = copy.deepcopy(rng)
    for start in range(0, queries.shape[0], block):
        rows = slice(start, start + block)
        gen = copy.deepcopy(start_state)
        reps, scale = _scaled_replicates(
            spec,
            keys,
            y,
            queries[rows],
            widths,
            degree,
            sample_weight,
            n_boot,
            resample,
            gen,
            residuals,
            None,
        )
        lower[rows], upper[rows] = percentiles(reps, levels)
    rng.bit_generator.state = gen.bit_generator.state  # as one pass over the draws leaves it
    if resample == "wild":
        # the deviations' power of two, 2**exponent = unit * scale (the same in every
        # block), which may pass float64 where the deviations do not
        exponent = int(np.frexp(unit)[1]) + int(np.frexp(scale)[1]) - 2
        lower, upper = plus_scaled(centre, lower, exponent), plus_scaled(centre, upper, exponent)
    return lower, upper
