"""Widths of the local fits by the improved Akaike information criterion (AICc).

Hurvich, Simonoff and Tsai (1998), "Smoothing parameter selection in nonparametric
regression using an improved Akaike information criterion": for a linear smoother
``g = H y`` of n rows,

    AICc(theta) = log sigma2 + (1 + tr(H)/n) / (1 - (tr(H) + 2)/n),
    sigma2 = (1/n) sum_i (y_i - g(x_i))^2,

with g the fit at the training rows, every row a key (no leave-one-out), and tr(H)
the trace of the hat matrix, the effective number of parameters. The criterion is
+inf where tr(H) >= n - 2 (never chosen). It is statsmodels' ``KernelReg.aic_hurvich``
and R np's ``npregbw(bwmethod="cv.aic")``; statsmodels' local-linear criterion takes
the Nadaraya-Watson hat matrix's trace whatever ``reg_type`` is, this one the trace of
the fit's own smoother (so the two agree for ``reg_type="lc"`` only).

**The trace, streamed.** ``H_ii = l_i(x_i)``, row i's equivalent-kernel weight in its
own fit. The first pass of the engine (:func:`nbattn.local.engine.fit_problem`) holds
per query ``g = (M/l + R)^-1 e_1``, the running maximum m and log l of its scores,
and row i's own design row is (1, 0, ..., 0), so

    H_ii = p_ii g_i[0],   p_ii = exp(s_ii - m_i - log l_i),
    s_ii = log w_i + sum_k log(1 - lambda_k)

(every continuous kernel is 1 at distance 0, ``log K(0) = 0``; a categorical column
contributes its term for equal codes, a missing entry nothing). No n x n matrix is
held. A row that no key reaches (the ordered kernel at lambda = 1, a row of weight 0
under a compact kernel) takes its nearest key's value: H_ii = 1 when that key is
itself, else 0.

**Tied rows** are each a row of H: H_ii is row i's own weight, not its group's, and
tr(H) counts every copy (the fit itself merges tied keys and fits tied queries once,
:mod:`nbattn.local.distinct`, which changes neither g nor m + log l).

**Sample weights** are precision weights, ``Var y_i = sigma^2 / w_i``: the Gaussian
likelihood's estimate is ``sigma2 = sum_i w_i r_i^2 / n`` up to a constant factor, so
``sigma2 = sum_i w_i r_i^2 / sum_i w_i`` here (the same minimiser, and unchanged when
every weight is multiplied by one constant), n the rows of positive weight, and H the
weighted fit's hat matrix (each key's weight enters p_ij). Integer weights are not
repetitions: a row given weight 2 counts once in n. statsmodels has no weights.

**Several outputs** (y of shape (n, m)) share H; the criterion is the mean over the
outputs of their AICc, ``(1/m) sum_o log sigma2_o + penalty`` (each output in its own
units: multiplying one output by a constant moves the criterion by a constant). An
output constant over the rows of positive weight is fitted exactly at every width and
left out; when every output is constant, any width fits and the start is returned.

**The search** is :func:`nbattn.local.search.search_widths` without descents (the
criterion has no gradient pass here), as for a classifier's widths: the rule, a common
factor of every h, exact matching in the categorical columns, sweeps of each width
alone, the best point ever evaluated kept, so the answer is never worse than the start
(the rule). The search sees ``exp(AICc - mean_o log var_o)``, var_o the weighted
variance of output o: the same minimiser, positive and free of y's units, so that the
search's relative tolerances (``config.LOO_RTOL``) are absolute ones on AICc. The sweeps
move one width at a time, which stalls in a valley that runs across two widths (on the
air-quality table's three continuous columns, 6e-4 above the minimum); a Nelder-Mead
polish (Nelder and Mead 1965, "A simplex method for function minimization";
:func:`nbattn.local.search.polish_without_gradient`) over the finite entries of theta
(log h, and t of each l) then follows that valley from the sweeps' best, with a first
simplex of half a grid step (a factor 10**(1/12)) in each, within the search's bounds;
the best point ever evaluated is still the one returned.
``rtol`` > 0: the fits and their g, m and log l come from the pruned passes (every
kernel sum within rtol, so every H_ii within about rtol of its exact value); the best
point and the rule are then evaluated exactly and the better returned.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .._core.local_groups import n_terms
from .._core.numeric import within_squares
from .._core.progress import FitProgress
from .distinct import distinct_problem
from .engine import fit_problem, loo_term_weights
from .problem import (
    LocalProblem,
    LocalSpec,
    check_widths,
    layout,
    resolve_widths,
    rule_widths,
    spec_options,
)
from .search import polish_without_gradient, search_widths, theta_to_widths, widths_to_theta
from .widths import LooCriterion, check_training

_LN2 = math.log(2.0)

__all__ = [
    "AiccCriterion",
    "aicc",
    "aicc_widths",
    "fits_and_leverages",
    "local_aicc",
    "local_aicc_widths",
]


def fits_and_leverages(problem: LocalProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(fits, leverages)``: the local fit at each query (n, n_outputs) and H_ii (n,) of a
    problem whose queries are its keys in the same order (``exclude_self=False``): the
    weight of key i in the fit at query i (module docstring), from one first pass."""
    n = problem.log_weights.shape[0]
    distinct = distinct_problem(problem)
    fit = fit_problem(distinct.problem)
    if distinct.keys_pooled and (fit.nearest >= 0).any():
        # a fallback's nearest key is the first of its ties, not their merged mean
        distinct, fit = None, fit_problem(problem)
    rows = np.arange(n) if distinct is None or distinct.inverse is None else distinct.inverse
    own = problem.log_weights.copy()  # s_ii: log w_i, log K(0) = 0, equal codes' terms
    for k in range(problem.q_cat.shape[1]):
        present = ~np.isnan(problem.q_cat[:, k])
        own[present] += problem.cat_params[k, 0]
    shift, log_norm = fit.shift[rows], fit.log_norm[rows]
    reached = log_norm > -np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        share = np.exp(np.where(reached, own - shift - log_norm, -np.inf))
    nearest = fit.nearest[rows]
    leverage = np.where(reached, share * fit.g[rows, 0], (nearest == np.arange(n)) * 1.0)
    return fit.beta[rows, 0, :], leverage


def _output_units(values_t):
    """``(scaled, log_units)``: each output's values (a row of ``values_t``) divided by a
    power of two where their largest magnitude lies beyond 2**+-400
    (:func:`nbattn._core.numeric.within_squares`; exact), and the log of that divisor."""
    scaled = np.empty_like(values_t)
    log_units = np.zeros(values_t.shape[0])
    for o, row in enumerate(values_t):
        scaled[o] = within_squares(row)
        top = float(np.max(np.abs(row))) if row.size else 0.0
        if top > 0.0:
            log_units[o] = math.log(top / float(np.max(np.abs(scaled[o]))))  # exact: 2**k
    return np.ascontiguousarray(scaled), log_units


def _log_mean_square_parts(r, weights) -> tuple[int, float]:
    """``(e, log m)`` with ``sum_i u_i r_i^2 = 4**e m`` (u summing to 1): r divided first by
    2**e, the power of two at its largest magnitude among positive u (exact), so that the
    squares neither overflow nor vanish; ``(0, -inf)`` where every such r is 0. A factor
    2**k on r moves e by k and leaves log m to the bit."""
    top = float(np.max(np.abs(r[weights > 0]))) if (weights > 0).any() else 0.0
    if not top > 0.0:
        return 0, -math.inf
    e = math.frexp(top)[1] - 1
    return e, math.log(float(weights @ (r / math.ldexp(1.0, e)) ** 2))


def _weighted_log_mean_square(r, weights) -> float:
    """``log sum_i u_i r_i^2`` (:func:`_log_mean_square_parts`)."""
    e, log_m = _log_mean_square_parts(r, weights)
    return 2.0 * e * _LN2 + log_m


def penalty(trace, n) -> float:
    """``(1 + tr(H)/n) / (1 - (tr(H) + 2)/n)``, +inf where tr(H) >= n - 2."""
    if not trace < n - 2:
        return math.inf
    return (1.0 + trace / n) / (1.0 - (trace + 2.0) / n)


def _rows_counted(problem: LocalProblem) -> int:
    """n of the criterion: the rows of positive weight."""
    if problem.sample_weight is None:
        return problem.log_weights.shape[0]
    return int(np.count_nonzero(problem.sample_weight > 0))


def _log_sigma2(problem: LocalProblem, weights):
    """``(log sigma2_o per output (n_outputs,), tr(H))`` of a problem whose values are
    within 2**+-400 (:func:`_output_units`)."""
    fits, leverage = fits_and_leverages(problem)
    residuals = problem.values_t.T - fits
    logs = np.array([_weighted_log_mean_square(r, weights) for r in residuals.T])
    return logs, float(leverage.sum())


def _varying(values_t, weights) -> np.ndarray:
    """Which outputs take more than one value over the rows of positive weight."""
    rows = values_t[:, weights > 0]
    return rows.max(axis=1) > rows.min(axis=1)


def aicc(problem: LocalProblem) -> float:
    """AICc of the local fit of a problem whose queries are its keys (module docstring),
    in the units of its values: the mean over the outputs of log sigma2_o plus the
    penalty of tr(H). ValueError where every output is constant (sigma2 = 0 at every
    width: AICc is -inf)."""
    weights = loo_term_weights(problem.sample_weight, problem.log_weights.shape[0])
    varying = _varying(problem.values_t, weights)
    if not varying.any():
        raise ValueError(
            "y is constant over the rows of positive weight: every width fits it exactly "
            "and AICc is -inf"
        )
    scaled, log_units = _output_units(problem.values_t[varying])
    logs, trace = _log_sigma2(dataclasses.replace(problem, values_t=scaled), weights)
    return float(np.mean(logs + 2.0 * log_units)) + penalty(trace, _rows_counted(problem))


class AiccCriterion(LooCriterion):
    """The AICc of one training problem (every row a key and a query) as the search sees
    it, ``exp(AICc - mean_o log var_o)`` (module docstring); no gradient."""

    pools_ties = False  # no leave-one-out fits to pool
    has_gradient = False

    def __init__(self, problem: LocalProblem):
        weights = loo_term_weights(problem.sample_weight, problem.log_weights.shape[0])
        varying = _varying(problem.values_t, weights)
        scaled, log_units = _output_units(problem.values_t[varying])
        super().__init__(dataclasses.replace(problem, values_t=scaled))
        self.n = _rows_counted(problem)
        self.weights = weights
        #: the weighted variance of each output about its weighted mean, (e, log m)
        self.var_parts = [_log_mean_square_parts(row - weights @ row, weights) for row in scaled]
        #: whether some output varies (else every width fits y exactly: nothing to search)
        self.varying = bool(varying.any())
        #: AICc minus the log of the search's value: mean_o log var_o in y's units
        self.log_scale = 0.0
        if self.varying:
            log_var = np.array([2.0 * e * _LN2 + m for e, m in self.var_parts])
            self.log_scale = float(np.mean(log_var + 2.0 * log_units))
        self.best_aicc = math.inf

    def _value(self, theta) -> float:
        """``exp(mean_o log(sigma2_o / var_o) + penalty)``: the ratios from the exponents'
        differences and the mantissas' logs (:func:`_log_mean_square_parts`), so that y
        times a power of two gives the same value to the bit."""
        problem = self.problem_at(theta)
        fits, leverage = fits_and_leverages(problem)
        ratios = []
        for r, (e_var, m_var) in zip(problem.values_t - fits.T, self.var_parts):
            e, m = _log_mean_square_parts(r, self.weights)
            ratios.append(2.0 * (e - e_var) * _LN2 + (m - m_var))
        total = float(np.mean(ratios)) + penalty(float(leverage.sum()), self.n)
        # beyond log var + 709, exp overflows: such a point is never the best one
        return math.exp(total) if total <= 709.0 else math.inf

    def _record(self, value, theta):
        if value < self.best[0]:
            self.best = (value, np.array(theta, dtype=np.float64))
            self.best_aicc = math.log(value) + self.log_scale if value > 0 else -math.inf
        if self.log is not None and self.log.enabled:
            spec = self.base.spec
            widths = theta_to_widths(self.best[1], spec.var_type, spec.n_categories)
            self.log.step(
                f"evaluation {self.n_loss}: best AICc {self.best_aicc:.6g} at widths "
                f"{np.array2string(widths, precision=4)}"
            )

    def loss_and_grad(self, theta):
        raise NotImplementedError("AICc has no gradient pass")


def _check_rows(spec: LocalSpec, n, degree):
    """ValueError where AICc is +inf at every width: tr(H) is at least the p terms of the
    local design (the global polynomial's trace, which the widest widths reach), so n
    rows of positive weight need n - 2 > p."""
    p = n_terms(int(spec.continuous.sum()), degree)
    if not n > p + 2:
        raise ValueError(
            f"bandwidth 'aicc' needs more than {p + 2} rows of positive weight for a degree "
            f"{degree} fit with {int(spec.continuous.sum())} continuous column(s), got {n}: "
            f"AICc is +inf wherever tr(H) >= n - 2, and tr(H) reaches {p} at the widest "
            "widths"
        )


def aicc_widths(spec: LocalSpec, X, y, degree, *, sample_weight=None, init=None, verbose=0):
    """:func:`local_aicc_widths` on checked inputs (:func:`nbattn.local.problem.check_columns`;
    ``init`` checked widths or None, the rule's then); ``verbose`` a line per evaluation
    (:class:`nbattn._core.progress.FitProgress`)."""
    start = rule_widths(spec, X) if init is None else init
    problem = layout(spec, X, X, y, start, degree, sample_weight=sample_weight)
    _check_rows(spec, _rows_counted(problem), degree)
    criterion = AiccCriterion(problem)
    if not criterion.varying:
        return start  # every output constant: every width fits it exactly
    with FitProgress(verbose, "aicc_widths", unit="evaluation") as criterion.log:
        try:
            search_widths(criterion, start)
            theta = polish_without_gradient(
                criterion, widths_to_theta(start, spec.var_type, spec.n_categories)
            )
        except ValueError:
            if criterion.best[1] is not None:
                raise
            raise ValueError(
                f"AICc is +inf at every width tried: tr(H) >= n - 2 = {criterion.n - 2} "
                "there (too few distinct rows for the local design)"
            ) from None
    if spec.rtol > 0.0:
        rule = widths_to_theta(start, spec.var_type, spec.n_categories)
        exact = AiccCriterion(
            dataclasses.replace(problem, spec=dataclasses.replace(spec, rtol=0.0))
        )
        if not exact.loss(theta) < exact.loss(rule):
            theta = rule
    return theta_to_widths(theta, spec.var_type, spec.n_categories)


def local_aicc_widths(
    X,
    y,
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    ridge=None,
    init=None,
    device="cpu",
    rtol=0.0,
):
    """Widths (h per 'c' column, l per 'u'/'o' column) that minimise AICc (Hurvich,
    Simonoff and Tsai 1998; the module docstring).

    .. math::

        \\mathrm{AICc} = \\log \\hat\\sigma^2
        + \\frac{1 + \\operatorname{tr} H / n}{1 - (\\operatorname{tr} H + 2)/n},
        \\qquad \\hat\\sigma^2 = \\frac{\\sum_i w_i (y_i - \\hat g(x_i))^2}{\\sum_i w_i}

    with H the hat matrix of the local fit at the training rows (+inf where
    tr H >= n - 2, n the rows of positive weight).

    Parameters
    ----------
    X : array-like (n, d)
    y : array-like (n,) or (n, n_outputs)
        Several outputs: the mean of their AICc (each in its own units); an output
        constant over the rows is left out, and when every output is, the start is
        returned.
    degree, var_type, n_categories, kernel, sample_weight, missing, ridge
        As in :func:`nbattn.local.engine.local_polynomial`; ``sample_weight`` weighs the
        keys of every fit and the terms of sigma2 (precision weights; n counts rows).
    init : array (d,), optional
        Starting widths; None: the Scott rule (:func:`nbattn.local.engine.default_widths`).
    rtol : float in [0, 1), default 0
        The search's fits from the pruned passes of
        :func:`nbattn.local.engine.local_polynomial`; the best point and the start are
        then evaluated exactly and the better returned, so the answer is never worse
        than the start.

    Returns
    -------
    widths : ndarray (d,)

    Raises
    ------
    ValueError
        With no more than p + 2 rows of positive weight (p the terms of the local design:
        1 at degree 0, 1 + d_c at degree 1), where AICc is +inf at every width.

    Notes
    -----
    The search (:func:`nbattn.local.search.search_widths`) has no gradient here: the
    common factor of every h within ``config.WIDTH_BOUNDS`` of the start, exact matching
    in the categorical columns, and sweeps of each width alone; the best point ever
    evaluated is returned, never worse than the start. statsmodels' ``KernelReg(bw="aic")``
    minimises the same criterion for ``reg_type="lc"``.
    """
    spec, X, y, degree, sample_weight = check_training(
        X, y, degree, sample_weight, **spec_options(locals())
    )
    if init is not None:
        init = check_widths(init, spec.var_type, spec.counts, name="init")
    return aicc_widths(spec, X, y, degree, sample_weight=sample_weight, init=init)


def local_aicc(
    X,
    y,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    ridge=None,
    device="cpu",
    rtol=0.0,
):
    """AICc of the local fit of y on X at ``bandwidth`` (a rule name or widths), in y's
    units (:func:`local_aicc_widths` gives the formula): statsmodels'
    ``KernelReg(..., reg_type="lc").aic_hurvich(bw)`` for ``degree=0`` on continuous
    columns. +inf where tr H >= n - 2; ValueError where y is constant."""
    spec, X, y, degree, sample_weight = check_training(
        X, y, degree, sample_weight, **spec_options(locals())
    )
    widths = resolve_widths(spec, X, bandwidth)
    return aicc(layout(spec, X, X, y, widths, degree, sample_weight=sample_weight))
