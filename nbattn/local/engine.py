"""Local-polynomial regression with a mixed-type product kernel (functional layer).

The fit at a query q is the weighted least-squares polynomial of degree 0
(Nadaraya-Watson), 1 (local-linear) or 2 (local-quadratic) in the continuous
columns, centred at q, with the attention weights of a product kernel:

    beta(q) = argmin_b sum_j p_j(q) (y_j - b . x_j(q))^2,  fit(q) = beta_0(q)
    p_j(q)  = softmax_j( sum_c log K((k_jc - q_c) / h_c) + sum_k log L_k + log w_j )

``x_j(q) = (1, k_j - q, [products of pairs of k_j - q])`` over the continuous
columns only: categorical columns enter through the weights, as in R's np
(Li and Racine). Conventions follow statsmodels ``KernelReg`` so that results
compare with it:

* ``var_type`` one letter per column: 'c' continuous, 'u' unordered, 'o' ordered
  categorical; categorical columns hold float-coded integer codes 0 .. c-1.
* Continuous kernels K of u = (q - k)/h: "gaussian" exp(-u^2/2), "epanechnikov"
  (1 - u^2) on |u| <= 1 and "tricube" (1 - |u|^3)^3 on |u| <= 1, the scaling of
  statsmodels (h is the half-width of the support; constants cancel). Keys
  outside the support weigh exactly 0; a query with no key inside gets its
  nearest key's value (``nbattn.kernels.local``).
* Unordered (Aitchison-Aitken): L = 1 - l if equal, l / (c - 1) otherwise,
  l in [0, (c-1)/c]; ordered (Wang-van Ryzin): L = 1 - l if equal,
  (1 - l)/2 l^|x - y| otherwise, l in [0, 1]. l = 0 is exact matching.
* ``bandwidth`` holds one entry per column: h for 'c' columns, l for 'u'/'o'.

statsmodels' local-linear ``KernelReg`` puts the category codes into the local
design as if they were numbers; nbattn does not (np's convention), so with
categorical columns the two agree only for ``reg_type="lc"``.

The local system is solved with a relative ridge, ``(M + ridge diag(0, M_11, ..,
M_pp)) beta = V`` (M the normalised moment matrix; default ``ridge=1e-12``,
``config.LOCAL_RIDGE``), which does not depend on the units of any column and
changes a well-conditioned fit by about ``ridge`` times its condition number.
A term whose design column lies within ``config.LOCAL_PIVOT_TOL`` (1e-8,
relative) of the span of the earlier ones is dropped (coefficient 0), as a
truncated pseudo-inverse would: a singular design (a constant column, fewer
distinct neighbours than terms, a query far from every key) shrinks towards
the local constant, never to NaN. Pass a larger ``ridge`` to shrink the slopes
of ill-conditioned designs more.

Missing values (``missing="marginalize"``): a pair with column c missing on
either side leaves that column's kernel term out. In the local design a key
missing continuous column c sits at the query's coordinate (difference 0), so
it informs the level but not the slope; a query missing column c has slope 0
in c (the column drops out of its design).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import config
from .._core.columns import check_var_type
from .._core.numeric import plus_scaled, power_of_two_scale, sum_safe_units
from .._core.threads import serial_below
from .._core.validation import (
    as_float_array,
    check_bool,
    check_choice,
    check_positive_float,
    resolve_dtype,
)
from ..dispatch.device import kernels_for
from .distinct import distinct_problem, queries_of
from .leaves import TreeLayout, exact_leaves, tree_layout
from .neighbours import refuse_stretched
from .problem import (
    DEFAULT_RIDGE,
    KERNELS,
    LocalProblem,
    LocalSpec,
    check_columns,
    check_data,
    check_degree,
    check_n_categories,
    check_sample_weight,
    check_widths,
    default_widths,
    lambda_max,
    layout,
    prepare,
    resolve_widths,
    spec_options,
)
from .ties import tie_groups, tied_loo_fits

__all__ = [
    "DEFAULT_RIDGE",
    "KERNELS",
    "check_n_categories",
    "check_var_type",
    "check_widths",
    "default_widths",
    "lambda_max",
    "local_interval_sums",
    "local_loo_loss",
    "local_polynomial",
    "local_prediction_interval",
]


def threads_for(problem: LocalProblem):
    """One numba thread for calls with fewer than ``config.SERIAL_PAIRS`` pairs (a parallel
    launch costs more than it saves there; on a busy 2-core machine 30x more at n = 150)."""
    return serial_below(problem.q_cont.shape[0] * problem.log_weights.shape[0], config.SERIAL_PAIRS)


def fit_problem(problem: LocalProblem, want_mfx=False):
    """Run the first pass of the local fit (``kernels.local.local_fit``) on a prepared
    problem, on its spec's device; with ``spec.rtol > 0`` the pruned pass
    (``nbattn.local.leaves``). The ``LocalFit`` is in the problem's order.

    Each output's values are pooled divided by a power of two where their largest
    magnitude lies beyond 2**960 or below 2**-400
    (:func:`nbattn._core.numeric.sum_safe_units`; exact), and the fit and the marginal
    effects, linear in them, multiplied back: the moment sums of targets near 1.7e308
    would overflow (inf where the fit is finite)."""
    units = sum_safe_units(problem.values_t)
    scaled = bool(np.any(units != 1.0))
    if scaled:
        problem = dataclasses.replace(
            problem, values_t=np.ascontiguousarray(problem.values_t / units[:, None])
        )
    tree = tree_layout(problem)
    fit = tree.original_fit(fit_layout(tree, want_mfx))
    if scaled:
        with np.errstate(over="ignore"):  # a coefficient beyond float64 is inf
            fit = fit._replace(beta=fit.beta * units, mfx=fit.mfx * units)
    return fit


def fit_layout(tree: TreeLayout, want_mfx=False):
    """The first pass on a :func:`nbattn.local.leaves.tree_layout`, in its order (the
    state its second passes read), fallback ties settled as at rtol = 0."""
    problem = tree.problem
    module = kernels_for("local", problem.spec.device)
    with threads_for(problem):
        fit = module.local_fit(
            *problem.kernel_groups(),
            problem.values_t,
            bool(want_mfx),
            tree.leaves_on(problem.spec.device),
        )
    return tree.settled(fit)


def fit_values(problem: LocalProblem, return_gradient=False):
    """The local fit of the problem's values at its queries, float64 shaped like the
    values' rows (n_queries,) or (n_queries, n_outputs); with ``return_gradient``
    also the marginal effects (:func:`marginal_effects`). Tied keys are merged and
    tied queries fitted once (:mod:`nbattn.local.distinct`)."""
    if return_gradient and problem.degree == 0:
        refuse_stretched(problem, "the local constant's marginal effects")
    distinct = distinct_problem(problem)
    beta, _, _, _, nearest, mfx = fit_problem(distinct.problem, want_mfx=return_gradient)
    fell_back = np.flatnonzero(nearest >= 0)
    if distinct.keys_pooled and fell_back.size:
        # the nearest key is the first of its ties, not their merged mean: every key again
        rows = fell_back if distinct.first is None else distinct.first[fell_back]
        again = fit_problem(queries_of(problem, rows), want_mfx=return_gradient)
        beta[fell_back] = again.beta
        if mfx.shape[0] == beta.shape[0]:
            mfx[fell_back] = again.mfx
    if distinct.inverse is not None:  # back to every query
        beta = beta[distinct.inverse]
        if mfx.shape[0] == distinct.first.shape[0]:
            mfx = mfx[distinct.inverse]
    fit = beta[:, 0, :]
    if problem.values_1d:
        fit = fit[:, 0]
    if not return_gradient:
        return fit
    return fit, marginal_effects(problem, beta, mfx)


# --------------------------------------------------------------------------- public API
def local_polynomial(
    queries,
    keys,
    values,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    exclude_self=False,
    ridge=None,
    return_gradient=False,
    device="cpu",
    dtype=None,
    rtol=0.0,
    bandwidth_type="fixed",
):
    """Local-polynomial regression (degree 0: Nadaraya-Watson, 1: local-linear, 2: quadratic).

    .. math::

        \\hat f(q) = e_1^T \\Big(\\sum_j p_j x_j x_j^T + R\\Big)^{-1} \\sum_j p_j x_j y_j,
        \\qquad p_j = \\operatorname{softmax}_j\\big(\\textstyle\\sum_c \\log K_c(q_c, k_{jc})
        + \\log w_j\\big)

    with ``x_j = (1, k_j - q, ...)`` the centred monomials of the continuous
    columns up to ``degree`` and R the relative ridge (module docstring). One
    streaming pass per query accumulates the moments with the online softmax;
    nothing of size queries x keys is held.

    Parameters
    ----------
    queries : array-like (n_queries, d) or (n_queries,)
    keys : array-like (n_keys, d) or (n_keys,)
    values : array-like (n_keys,) or (n_keys, n_outputs)
    bandwidth : "scott", "silverman" or array (d,)
        h per continuous column, l per categorical column (see :func:`default_widths`).
    degree : 0, 1 or 2
    var_type : str, optional
        'c'/'u'/'o' per column; None: all continuous.
    n_categories : int or array (d,), optional
        Categories per categorical column; None: one more than the largest code
        of the keys (a query's code must be one of them).
    kernel : "gaussian", "epanechnikov" or "tricube"
        The continuous kernel.
    sample_weight : array (n_keys,), optional
        Non-negative key weights (0 leaves a key out).
    missing : "error" or "marginalize"
        With "marginalize", NaN entries leave their column's term out (module docstring).
    exclude_self : bool
        Skip the pair (i, i): the exact leave-one-out fit when queries are the keys.
    ridge : float, optional
        Relative ridge of the local solve; None is ``DEFAULT_RIDGE`` (1e-12).
    return_gradient : bool
        Also return the marginal effects d fit / d q_c of the continuous columns:
        the local slopes for degree >= 1; for degree 0 the analytic derivative
        of the softmax-weighted mean, sum_j p_j (y_j - fit) d s_j / d q_c (so
        not statsmodels' local-constant ``mfx``, whose scale is off).
    device : "cpu", "cuda" or "auto"
    dtype : "float64" or "float32", optional
        The output dtype (the computation is float64 throughout).
    rtol : float in [0, 1), default 0
        The relative error allowed on every kernel sum: 0 sums every key (exact).
        With ``rtol > 0`` (on the GPU: ``device="cuda"``; "auto" stays on the CPU)
        each chunk of neighbouring queries skips the
        leaves of keys, in k-d order, of smallest certified weight bound while their
        sum stays within ``rtol`` times a lower bound on each query's normaliser
        (``nbattn.local.leaves``): the normaliser and
        every moment sum move by at most ``rtol`` times the normaliser (the values'
        sums by that times ``max |y|``), and the fit by at most
        ``2 rtol / (1 - rtol) ||g||_1 max_j |y_j - x_j . beta|``, on top of the
        rounding of a sum taken in another order (the keys in k-d order), wherever
        both solves keep the same terms (a design at the edge of its rank, as three
        distinct keys under a local-linear fit in three columns, may drop another
        term under any perturbation, and the truncated solve jumps). Below
        ``config.LOCAL_TREE_MIN_KEYS`` keys, or with missing values, the exact
        path runs.
    bandwidth_type : "fixed", "generalized_nn" or "adaptive_nn"
        R np's ``bwtype``: with a nearest-neighbour type ``bandwidth`` holds an integer k
        per continuous column (l per categorical one), and each query (generalised) or
        each key (adaptive) takes the distance to its k-th nearest training value in that
        column as its width (:mod:`nbattn.local.neighbours`). Exact (``rtol`` 0), CPU
        and GPU; ``return_gradient`` at degree 0 is not available with them.

    Returns
    -------
    fit : ndarray (n_queries,) or (n_queries, n_outputs)
    gradient : ndarray (n_queries, d_cont) or (n_queries, d_cont, n_outputs),
        only with ``return_gradient=True``
    """
    dtype = resolve_dtype(dtype, queries, keys, values)
    return_gradient = check_bool(return_gradient, "return_gradient")
    problem = prepare(
        queries,
        keys,
        values,
        bandwidth,
        degree,
        sample_weight=sample_weight,
        exclude_self=exclude_self,
        **spec_options(locals()),
    )
    out = fit_values(problem, return_gradient)
    if not return_gradient:
        return np.asarray(out, dtype=dtype)
    return tuple(np.asarray(part, dtype=dtype) for part in out)


def marginal_effects(problem: LocalProblem, beta, mfx):
    """d fit / d q per continuous column from a first pass, in the data's units."""
    dc = problem.h.size
    if problem.degree >= 1 and dc > 0:
        grad = beta[:, 1 : 1 + dc, :] / problem.h[None, :, None]
    else:
        grad = mfx / problem.h[None, :, None]
    return grad[:, :, 0] if problem.values_1d else grad


def local_interval_sums(
    queries,
    keys,
    residuals,
    bandwidth="scott",
    degree=1,
    *,
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    exclude_self=False,
    ridge=None,
    device="cpu",
):
    """Per query ``sum_j l_j(q)^2 r_j^2``, the sandwich variance of the fit at q.

    ``l_j(q)`` are the equivalent-kernel weights of the local fit (``fit(q) =
    sum_j l_j(q) y_j``): the softmax weights for degree 0, ``p_j e_1^T (M + R)^-1
    x_j`` for degree >= 1. ``residuals`` (n_keys,) or (n_keys, n_outputs); the
    result has the same trailing shape. Two streaming passes (the fit's state,
    then the sum).
    """
    problem = prepare(
        queries,
        keys,
        residuals,
        bandwidth,
        degree,
        sample_weight=sample_weight,
        exclude_self=exclude_self,
        **spec_options(locals()),
    )
    return interval_sums(problem)


def interval_sums(problem: LocalProblem):
    """``sum_j l_j(q)^2 v_j^2`` per query of the problem, its values v the residuals
    (:func:`local_interval_sums`)."""
    fit = fit_problem(problem)
    module = kernels_for("local", problem.spec.device)
    with threads_for(problem):
        out = module.local_interval_sums(*problem.kernel_groups(), fit, problem.values_t)
    return out[:, 0] if problem.values_1d else out


def equivalent_weights(problem: LocalProblem) -> np.ndarray:
    """The local fit's equivalent-kernel weights (n_queries, n_keys), the rows of its hat
    matrix: ``l_j(q) = p_j(q) e_1^T (M/l + R)^-1 x_j(q)``, so that ``fit(q) = sum_j
    l_j(q) y_j`` for any values y (the softmax weights p_j at degree 0; at degree >= 1
    they sum to 1, reproduce polynomials of the degree exactly, and may be negative).
    Computed on the CPU whatever the spec's device: the result is a host matrix."""
    import dataclasses

    cpu = dataclasses.replace(problem, spec=dataclasses.replace(problem.spec, device="cpu"))
    module = kernels_for("local", "cpu")
    with threads_for(cpu):
        fit = module.local_fit(*cpu.kernel_groups(), cpu.values_t, False, exact_leaves(cpu))
        return module.local_equivalent_weights(*cpu.kernel_groups(), fit)


def local_prediction_interval(
    X,
    y,
    queries,
    bandwidth="scott",
    degree=1,
    *,
    alpha=0.05,
    kind="mean",
    var_type=None,
    n_categories=None,
    kernel="gaussian",
    sample_weight=None,
    missing="error",
    ridge=None,
    device="cpu",
    return_fit=False,
):
    """A pointwise (1 - alpha) normal interval for the local fit at ``queries``.

    With leave-one-out residuals r_j = y_j - fit_{-j}(x_j) of the training data,

        var_mean(q) = sum_j l_j(q)^2 r_j^2                    (sandwich, kind="mean")
        var_obs(q)  = var_mean(q) + sum_j p_j(q) r_j^2        (kind="observation")

    where l_j are the equivalent-kernel weights (:func:`local_interval_sums`) and
    the second term is the kernel-weighted mean of r^2 at q, the local residual
    variance. The interval is ``fit(q) -/+ z sqrt(var)`` with z the upper alpha/2 quantile
    of the standard normal (finite for every alpha in (0, 1), however small).

    Returns
    -------
    lower, upper : ndarrays like the fit; ``(fit, lower, upper)`` with ``return_fit``.
    """
    spec, (X,) = check_columns({"X": X}, **spec_options(locals()))
    y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows but X has {X.shape[0]}")
    queries = check_data(spec, queries, "queries")
    degree = check_degree(degree)
    widths = resolve_widths(spec, X, bandwidth)
    sample_weight = check_sample_weight(sample_weight, X.shape[0])
    fit, lower, upper = prediction_interval(
        spec, X, y, queries, widths, degree, sample_weight=sample_weight, alpha=alpha, kind=kind
    )
    return (fit, lower, upper) if return_fit else (lower, upper)


def prediction_interval(
    spec: LocalSpec, X, y, queries, widths, degree, *, sample_weight=None, alpha=0.05, kind="mean"
):
    """``(fit, lower, upper)`` of :func:`local_prediction_interval` on checked data
    (:func:`nbattn.local.problem.layout`)."""
    alpha = check_alpha(alpha)
    kind = check_choice(kind, "kind", ("mean", "observation"))

    # the residuals of y divided by a power of two near max |y| (exact: every fit is linear
    # in y; y - fit of targets of both signs near 1e308 would overflow), then by one near
    # their own largest magnitude, so that their squares neither overflow nor underflow;
    # the half-width is multiplied back by both
    y_unit = float(power_of_two_scale(np.max(np.abs(y)) if y.size else 0.0))
    residuals_t = loo_residuals(spec, X, y / y_unit, widths, degree, sample_weight=sample_weight).T
    unit = float(power_of_two_scale(np.max(np.abs(residuals_t)) if residuals_t.size else 0.0))
    residuals_t = np.ascontiguousarray(residuals_t / unit)
    problem = layout(spec, queries, X, y, widths, degree, sample_weight=sample_weight)
    state = fit_problem(problem)
    module = kernels_for("local", spec.device)
    with threads_for(problem):
        variance = module.local_interval_sums(*problem.kernel_groups(), state, residuals_t)
    if kind == "observation":
        squared = np.ascontiguousarray(residuals_t**2)
        groups = problem.kernel_groups(degree=0)
        with threads_for(problem):
            local_var = module.local_fit(*groups, squared, False, exact_leaves(problem))
            local_var = local_var.beta[:, 0, :]
        variance = variance + local_var
    z = normal_quantile_upper(alpha / 2.0, alpha)
    fit = state.beta[:, 0, :]
    # the half-width in units of unit * y_unit (both powers of two), the ends multiplied
    # back without overflowing on the way: inf only where an end lies beyond float64
    half = z * np.sqrt(np.maximum(variance, 0.0))
    exponent = int(np.frexp(unit)[1]) + int(np.frexp(y_unit)[1]) - 2
    lower, upper = plus_scaled(fit, -half, exponent), plus_scaled(fit, half, exponent)
    if problem.values_1d:
        fit, lower, upper = fit[:, 0], lower[:, 0], upper[:, 0]
    return fit, lower, upper


def check_alpha(alpha) -> float:
    """An interval's ``alpha`` as a float in (0, 1); a ValueError naming it otherwise."""
    alpha = check_positive_float(alpha, "alpha")
    if not alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    return alpha


def loo_residuals(spec: LocalSpec, X, y, widths, degree, *, sample_weight=None) -> np.ndarray:
    """The leave-one-out residuals y_j - fit_{-j}(x_j) of the training rows on checked
    data, (n, n_outputs): each row's fit from the other rows."""
    train = layout(spec, X, X, y, widths, degree, sample_weight=sample_weight, exclude_self=True)
    beta_loo = fit_problem(train)[0]
    return (train.values_t - beta_loo[:, 0, :].T).T


def normal_quantile_upper(tail, alpha) -> float:
    """z with P(Z > z) = ``tail`` for a standard normal Z: the upper-tail quantile read
    directly (``-ndtri(tail)``, what ``scipy.stats.norm.isf`` computes, without importing
    scipy.stats), not ``norm.ppf(1 - tail)``, where 1 - tail rounds to 1 below
    tail ~ 1e-17 and z becomes inf. ``tail`` = alpha / 2 underflows to 0 only for the
    smallest subnormal alpha: there z comes from log(alpha) - log 2."""
    from scipy import special

    if tail > 0.0:
        return float(-special.ndtri(tail))
    return float(-special.ndtri_exp(math.log(alpha) - math.log(2.0)))


def loo_term_weights(sample_weight, n):
    """The leave-one-out criterion's term weights, summing to 1 (uniform without weights);
    ``sample_weight`` checked (:func:`nbattn.local.problem.check_sample_weight`) or None."""
    if sample_weight is None:
        return np.full(n, 1.0 / n)
    # the largest weight brought to [1, 2) first (exact): a sum of weights near 1e308 is finite
    w = sample_weight / power_of_two_scale(sample_weight.max())
    return w / w.sum()


def local_loo_loss(
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
    bandwidth_type="fixed",
):
    """The leave-one-out mean squared error of the local fit at the training points.

        CV = sum_i w_i sum_o (y_io - fit_{-i}(x_i)_o)^2 / sum_i w_i

    (statsmodels ``KernelReg.cv_loo`` when unweighted and with one output), where
    fit_{-i} leaves row i out of the keys; ``sample_weight`` weighs both the
    keys of every fit and the terms of the sum. ``rtol``: as in
    :func:`local_polynomial`, for every leave-one-out fit; ``bandwidth_type`` as there
    (a training row's generalised width is the distance to its k-th nearest *other* value).
    """
    problem = prepare(
        X,
        X,
        y,
        bandwidth,
        degree,
        sample_weight=sample_weight,
        exclude_self=True,
        **spec_options(locals()),
    )
    return loo_loss(problem)


def loo_loss(problem: LocalProblem) -> float:
    """The (weighted) leave-one-out MSE of a problem whose queries are its keys
    (``exclude_self=True``); the key weights weigh the terms too. Tied rows are pooled
    where ``nbattn.local.ties`` takes them (as the width search's criterion does)."""
    ties = tie_groups(problem)
    tied = None if ties is None else tied_loo_fits(problem, ties)
    fits = tied.fits if tied is not None else fit_problem(problem)[0][:, 0, :]
    errors = ((fits - problem.values_t.T) ** 2).sum(axis=1)
    return float(errors @ loo_term_weights(problem.sample_weight, errors.shape[0]))
