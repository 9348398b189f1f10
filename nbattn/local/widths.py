"""Leave-one-out widths of the local fits: h per continuous column, l per categorical column.

The criterion is the (sample-weighted) leave-one-out mean squared error of
``nbattn.local.engine`` (statsmodels' ``cv_ls``),

    CV(theta) = sum_i w_i sum_o (y_io - fit_{-i}(x_i)_o)^2 / sum_i w_i,

over the parameters theta = (log h_c for each 'c' column, t_k for each 'u'/'o'
column) with the bounded smoothing l_k = lambda_max_k sigmoid(t_k)
(lambda_max = (c-1)/c for 'u', 1 for 'o'). Its exact gradient comes from one
more streaming pass (``kernels.local.local_loo_gradient``):

    d CV / d theta = sum_i 2 w_i (fit_{-i} - y_i) d fit_{-i} / d theta.

On all-continuous data with the Gaussian kernel, degree 0, no sample weights and no
missing values (Nadaraya-Watson with one width per column) the same criterion and
gradient come from the leave-one-out tiles of the learned metrics
(:class:`_PooledCriterion`, :mod:`nbattn.smoothing.tiled_loo`): GEMM gradients and k-d
pruning that the engine's general passes do not have, several times faster at the
narrow widths the search ends at, equal to rounding.

The search over theta (the rule, the common factor, the descents, the joint stage, the
sweeps; optionally a subsample first) is :mod:`nbattn.local.search`'s.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from .. import config
from .._core.numeric import (
    MIN_SUBSAMPLE_ROWS,
    median,
    row_ladder,
    sum_safe_units,
    within_squares,
)
from .._core.progress import FitProgress
from .._core.validation import as_float_array, check_positive_int, scaled_columns, shown
from ..dispatch.device import kernels_for
from ..smoothing.loo_rows import row_runner_active
from .engine import fit_layout, fit_problem, loo_term_weights, threads_for
from .leaves import tree_layout
from .neighbours import refuse_stretched
from .problem import (
    LocalProblem,
    LocalSpec,
    categorical_terms,
    check_columns,
    check_degree,
    check_sample_weight,
    check_widths,
    lambda_max,
    layout,
    rule_widths,
    spec_options,
)
from .rows import loo_fits_rows, loo_gradient_rows, squared_error_slopes
from .search import search_widths, sigmoid, theta_to_widths, widths_to_theta
from .staged import staged_search
from .ties import tie_groups, tied_loo_fits, tied_loo_gradient

__all__ = [
    "LooCriterion",
    "categorical_derivatives",
    "check_training",
    "local_loo_loss_and_grad",
    "local_loo_widths",
    "theta_to_widths",
    "widths_to_theta",
]


def categorical_derivatives(theta, var_type, n_categories):
    """(dk, 3) derivatives of the categorical score terms (a, b, t) with respect to t_k."""
    top = lambda_max(var_type, n_categories)
    rows = []
    for position, kind in enumerate(var_type):
        if kind == "c":
            continue
        s = sigmoid(float(theta[position]))
        if top[position] == 0:  # one category: nothing to smooth
            rows.append((0.0, 0.0, 0.0))
            continue
        lam = top[position] * s
        da = -lam * (1.0 - s) / (1.0 - lam)
        if kind == "u":
            rows.append((da, 1.0 - s, 0.0))
        else:
            rows.append((da, da, 1.0 - s))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 3)


def _column_order(var_type):
    """Positions of theta in the kernels' gradient order (continuous first, then categorical)."""
    cont = [p for p, k in enumerate(var_type) if k == "c"]
    cat = [p for p, k in enumerate(var_type) if k != "c"]
    return np.array(cont + cat, dtype=np.int64)


class LooCriterion:
    """CV(theta) and its gradient on one prepared training problem."""

    #: whether :meth:`_value` and :meth:`loss_and_grad` may take the pooled ties
    #: (``nbattn.local.ties``); a criterion that overrides both says False
    pools_ties = True

    def __init__(self, problem: LocalProblem):
        self.base = problem
        self.targets = problem.values_t.T.copy()  # (n, n_out)
        self.loo_weights = loo_term_weights(problem.sample_weight, self.targets.shape[0])
        self.order = _column_order(problem.spec.var_type)
        self.cont = problem.spec.continuous
        # the layout holds data / h; keep the data's scaled copy for h = 1
        h = problem.h
        self.q_unit = problem.q_cont * h
        self.k_unit = problem.keys_cont_t * h[:, None]
        self.best = (math.inf, None)
        self.cache = {}  # theta's bytes -> CV(theta): sweeps and stages revisit points
        self.n_loss = 0  # evaluations of the first pass alone (counted for benchmarks)
        self.n_grad = 0  # evaluations with the gradient pass
        # (value, theta): where each L-BFGS-B run stopped and each common factor's best,
        # the basins the search visited (the staged search carries them to more rows)
        self.basins = []
        self.log = None  # a FitProgress: a line per evaluation (verbose)
        # tied training rows pooled, one key per distinct row (None: the plain pass)
        self.ties = tie_groups(problem) if self.pools_ties else None

    def problem_at(self, theta):
        spec = self.base.spec
        widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
        h = widths[self.cont]
        # the search's widths reach config.WIDTH_BOUNDS of the start: data near the float
        # limits may overflow there, which the one scaling helper refuses by row and column
        name = "X (centred on its median)"
        return dataclasses.replace(
            self.base,
            q_cont=scaled_columns(self.q_unit, name, h, allow_nan=True),
            keys_cont_t=np.ascontiguousarray(
                scaled_columns(self.k_unit.T, name, h, allow_nan=True).T
            ),
            cat_params=categorical_terms(spec.var_type, spec.n_categories, widths),
            h=h,
            widths=widths,
        )

    def _record(self, value, theta):
        if value < self.best[0]:
            self.best = (value, np.array(theta, dtype=np.float64))
        if self.log is not None and self.log.enabled:
            spec = self.base.spec
            widths = theta_to_widths(self.best[1], spec.var_type, spec.n_categories)
            self.log.step(
                f"evaluation {self.n_loss + self.n_grad}: LOO criterion {value:.6g}; best "
                f"{self.best[0]:.6g} at widths {np.array2string(widths, precision=4)}"
                f"{self.best_detail()}"
            )

    def best_detail(self) -> str:
        """What else the progress line says of the best point (nothing here)."""
        return ""

    def loss(self, theta):
        """CV(theta) (+inf where it is not finite), each point evaluated once."""
        theta = np.asarray(theta, dtype=np.float64)
        key = theta.tobytes()
        if key in self.cache:
            return self.cache[key]
        self.n_loss += 1
        value = self._value(theta)
        value = value if math.isfinite(value) else math.inf
        self.cache[key] = value
        self._record(value, theta)
        return value

    def _value(self, theta) -> float:
        """The criterion at theta, computed (the hook a criterion of another loss overrides:
        :meth:`loss` caches, counts and records it)."""
        problem = self.problem_at(theta)
        tied = None if self.ties is None else tied_loo_fits(problem, self.ties)
        if tied is not None:
            return self.score(tied.fits)
        if _on_row_ranges(problem):
            return self.score(loo_fits_rows(tree_layout(problem)))
        return self.score(fit_problem(problem)[0][:, 0, :])

    def score(self, fits):
        """The criterion of the leave-one-out fits (n, n_out): the weighted squared error."""
        return float(((fits - self.targets) ** 2).sum(axis=1) @ self.loo_weights)

    def score_slopes(self, fits):
        """d criterion / d fit_{-i} (n, n_out) at the leave-one-out fits."""
        return squared_error_slopes(fits, self.targets, self.loo_weights)

    def loss_and_grad(self, theta):
        self.n_grad += 1
        problem = self.problem_at(theta)
        spec = problem.spec
        cat_dparams = categorical_derivatives(theta, spec.var_type, spec.n_categories)
        tied = None if self.ties is None else tied_loo_fits(problem, self.ties)
        if tied is not None:
            value = self.score(tied.fits)
            sums = tied_loo_gradient(tied, cat_dparams, self.score_slopes(tied.fits))
        else:
            value, sums = self._plain_loss_and_grad(problem, cat_dparams)
        self.cache[np.asarray(theta, dtype=np.float64).tobytes()] = (
            value if math.isfinite(value) else math.inf
        )
        grad = np.empty(len(spec.var_type))
        grad[self.order] = sums
        if not math.isfinite(value) or not np.isfinite(grad).all():
            return math.inf, np.zeros_like(grad)
        self._record(value, theta)
        return value, grad

    def _plain_loss_and_grad(self, problem, cat_dparams):
        """``(CV, gradient sums in the kernels' order)`` from the engine's two passes."""
        refuse_stretched(problem, "the widths' gradient (a search over h)")
        tree = tree_layout(problem)  # the keys each pass visits (all of them at rtol = 0)
        if _on_row_ranges(problem):  # the same rows, so the same sums, from the tasks
            fits, per_query = loo_gradient_rows(tree, self.targets, self.loo_weights, cat_dparams)
            return self.score(fits), per_query.sum(axis=0)
        fit = fit_layout(tree)
        fits = tree.from_layout(fit.beta[:, 0, :])
        out_weights = np.ascontiguousarray(tree.to_layout(self.score_slopes(fits)))
        module = kernels_for("local", problem.spec.device)
        with threads_for(problem):
            per_query = module.local_loo_gradient(
                *tree.problem.kernel_groups(exclude_self=True),
                fit,
                tree.problem.values_t,
                cat_dparams,
                out_weights,
                tree.leaves_on(problem.spec.device),
            )
        return self.score(fits), per_query.sum(axis=0)


def _on_row_ranges(problem: LocalProblem) -> bool:
    """Whether the plain passes run as ranges of rows through a row runner
    (``nbattn.local.rows``; ``nbattn.dask.sharded_training``): where one is in force and
    no values need the power-of-two rescaling of ``engine.fit_problem``."""
    return row_runner_active() and not np.any(sum_safe_units(problem.values_t) != 1.0)


class _PooledCriterion(LooCriterion):
    """The criterion of :class:`LooCriterion` for Nadaraya-Watson on continuous columns
    (:func:`criterion_for` says when), from the one-pass leave-one-out tiles of
    :mod:`nbattn.smoothing.tiled_loo`: the loss and its gradient with respect to log h
    in one pass, pruned at exp(-50) of each row's largest weight (exact to rounding) or,
    with ``spec.rtol`` > 0, at rtol / (n - 1) of it (every kernel sum within rtol). A
    loss alone takes the same pass (its gradient is cheap beside the scores)."""

    pools_ties = False  # the tiles compute it

    def _tiles(self, theta):
        from ..smoothing.loo import prepared_loss_and_grad

        h = np.exp(np.asarray(theta, dtype=np.float64))
        loss, grad = prepared_loss_and_grad(
            self.q_unit,
            self.centred_targets,
            h,
            dtype=np.float64,
            device="cpu",
            rtol=self.base.spec.rtol,
        )
        # their loss and gradient are means over the n p terms; this criterion is the
        # mean over rows of each row's sum over outputs (loo_term_weights: 1 / n)
        outputs = self.targets.shape[1]
        return float(loss) * outputs, np.asarray(grad, dtype=np.float64) * outputs

    def __init__(self, problem: LocalProblem):
        super().__init__(problem)
        # the tiles' contract (prepare_xy): y centred on its median, which no left-out fit's
        # residual depends on, and without which offset targets lose the gradient's digits
        self.centred_targets = self.targets - median(self.targets)

    def _value(self, theta) -> float:
        return self._tiles(theta)[0]

    def loss_and_grad(self, theta):
        self.n_grad += 1
        value, grad = self._tiles(theta)
        if not math.isfinite(value) or not np.isfinite(grad).all():
            self.cache[np.asarray(theta, dtype=np.float64).tobytes()] = math.inf
            return math.inf, np.zeros_like(grad)
        self.cache[np.asarray(theta, dtype=np.float64).tobytes()] = value
        self._record(value, theta)
        return value, grad


def criterion_for(problem: LocalProblem) -> LooCriterion:
    """The leave-one-out MSE criterion of a training problem: :class:`_PooledCriterion`
    where the tiles compute it (every column continuous, the Gaussian kernel, degree 0,
    no sample weights, no missing value, the CPU), else the engine's :class:`LooCriterion`."""
    spec = problem.spec
    pooled = (
        spec.continuous.all()
        and spec.kernel == "gaussian"
        and problem.degree == 0
        and problem.sample_weight is None
        and spec.device == "cpu"
        and problem.q_cont.shape[0] >= 2
        and not np.isnan(problem.q_cont).any()
    )
    return _PooledCriterion(problem) if pooled else LooCriterion(problem)


def check_training(X, y, degree, sample_weight, **options):
    """The public functions' checks: ``(spec, X, y, degree, sample_weight)``."""
    spec, (X,) = check_columns({"X": X}, **options)
    y = as_float_array(y, "y", ndim=(1, 2), dtype="float64")
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows but X has {X.shape[0]}")
    return spec, X, y, check_degree(degree), check_sample_weight(sample_weight, X.shape[0])


def _training_problem(spec, X, y, degree, sample_weight, widths) -> LocalProblem:
    """The leave-one-out problem of checked training data at ``widths``."""
    return layout(spec, X, X, y, widths, degree, sample_weight=sample_weight, exclude_self=True)


def local_loo_loss_and_grad(
    X,
    y,
    theta,
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
    """CV(theta) and its exact gradient with respect to theta (module docstring).

    ``theta`` (d,): log h for 'c' columns, t for 'u'/'o' columns
    (l = lambda_max sigmoid(t); see :func:`theta_to_widths`). ``rtol`` > 0: the
    criterion of the pruned fits (:func:`nbattn.local.engine.local_polynomial`) and
    its exact gradient.
    """
    spec, X, y, degree, sample_weight = check_training(
        X, y, degree, sample_weight, **spec_options(locals())
    )
    theta = np.asarray(theta, dtype=np.float64).reshape(-1)
    if theta.shape != (X.shape[1],):
        raise ValueError(f"theta must have one entry per column ({X.shape[1]}), got {theta.shape}")
    widths = theta_to_widths(theta, spec.var_type, spec.n_categories)
    problem = _training_problem(spec, X, y, degree, sample_weight, widths)
    return LooCriterion(problem).loss_and_grad(theta)


def local_loo_widths(
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
    maxiter=200,
    rtol=0.0,
    subsample=None,
):
    """Widths (h per 'c' column, l per 'u'/'o' column) that minimise the LOO error.

    Parameters
    ----------
    X : array-like (n, d)
    y : array-like (n,) or (n, n_outputs)
    degree, var_type, n_categories, kernel, sample_weight, missing, ridge
        As in :func:`nbattn.local.engine.local_polynomial`; ``sample_weight`` weighs
        the keys of every fit and the terms of the criterion.
    init : array (d,), optional
        Starting widths; None: the Scott rule (:func:`nbattn.local.engine.default_widths`).
    maxiter : int >= 1
        Iterations of L-BFGS-B.
    rtol : float in [0, 1), default 0
        The search's criterion and gradient from the pruned fits of
        :func:`nbattn.local.engine.local_polynomial` (every kernel sum within
        ``rtol``); the best point and the rule widths are then evaluated exactly and
        the better returned, so the answer is never worse than the rule.
    subsample : int >= 10 or None, default None
        On at least twice this many rows, run the search on a random subsample of
        this many rows first (a fixed seed: the same rows every call) and carry its
        widths to all rows (:func:`nbattn.local.staged.staged_search`): faster, never
        worse than the rule, but it may stop in another basin than the search on
        every row. None: every row from the start.

    Returns
    -------
    widths : ndarray (d,)

    Notes
    -----
    The h are bounded to ``config.WIDTH_BOUNDS`` times their start, the
    categorical parameters t to [-30, 30] (l within 1e-13 of either end) in the
    descent; the joint stage and the sweeps also try l = 0 exactly.
    """
    spec, X, y, degree, sample_weight = check_training(
        X, y, degree, sample_weight, **spec_options(locals())
    )
    if init is not None:
        init = check_widths(init, spec.var_type, spec.counts, name="init")
    maxiter = check_positive_int(maxiter, "maxiter")
    return loo_widths(
        spec,
        X,
        y,
        degree,
        sample_weight=sample_weight,
        init=init,
        maxiter=maxiter,
        subsample=check_subsample(subsample),
    )


def check_subsample(subsample):
    """``subsample`` as an int >= ``MIN_SUBSAMPLE_ROWS``, or None."""
    if subsample is None:
        return None
    integral = isinstance(subsample, numbers.Integral) and not isinstance(
        subsample, bool | np.bool_
    )
    if not integral or subsample < MIN_SUBSAMPLE_ROWS:
        raise ValueError(
            f"subsample must be an int >= {MIN_SUBSAMPLE_ROWS} or None, got {shown(subsample)}"
        )
    return int(subsample)


def loo_widths(
    spec: LocalSpec,
    X,
    y,
    degree,
    *,
    sample_weight=None,
    init=None,
    maxiter=200,
    verbose=0,
    subsample=None,
):
    """:func:`local_loo_widths` on checked inputs (:func:`nbattn.local.problem.check_columns`;
    ``init`` checked widths or None, ``subsample`` checked); ``verbose`` a line per
    evaluation (:class:`nbattn._core.progress.FitProgress`)."""
    start = rule_widths(spec, X) if init is None else init
    y = within_squares(y)
    criterion = criterion_for(_training_problem(spec, X, y, degree, sample_weight, start))
    # a row of weight 0 is neither a key nor a term of the criterion: the subsamples are
    # drawn from the other rows, and only they count towards the stages
    pool = np.arange(X.shape[0]) if sample_weight is None else np.flatnonzero(sample_weight > 0)
    stages = row_ladder(pool.size, subsample or 0, config.LOCAL_LOO_STAGE_GROWTH)
    with FitProgress(verbose, "loo_widths", unit="evaluation") as criterion.log:
        if len(stages) == 1:
            theta = search_widths(criterion, start, maxiter=maxiter)
        else:

            def stage_criterion(rows, widths):
                rows = pool[rows]
                return criterion_for(
                    _training_problem(
                        spec,
                        X[rows],
                        y[rows],
                        degree,
                        None if sample_weight is None else sample_weight[rows],
                        widths,
                    )
                )

            theta = staged_search(criterion, stage_criterion, start, stages, maxiter=maxiter)
    if spec.rtol > 0.0:
        rule = widths_to_theta(start, spec.var_type, spec.n_categories)
        theta = _better_exactly(criterion, theta, rule)
    return theta_to_widths(theta, spec.var_type, spec.n_categories)


def _better_exactly(criterion, found, start):
    """Of the search's point and the start (the rule), the one of lower criterion computed
    exactly (rtol = 0): a search on the pruned criterion is never worse than the rule; the
    start wins ties."""
    exact = criterion_for(
        dataclasses.replace(criterion.base, spec=dataclasses.replace(criterion.base.spec, rtol=0.0))
    )
    return found if exact.loss(found) < exact.loss(start) else start
