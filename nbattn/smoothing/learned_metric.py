"""Learned metrics: the kernel's widths or linear map that minimise the leave-one-out MSE.

:func:`fit_learned_kernel` minimises the LOO MSE of Nadaraya-Watson regression
(:mod:`nbattn.smoothing.loo`) with L-BFGS-B and the exact gradient, over one of
three metrics on the standardised features:

* ``scalar``: widths ``c h_scott``, the log-factor ``log c`` learned;
* ``diagonal``: one width per feature, the log-widths learned, each bounded to
  ``config.WIDTH_BOUNDS`` times its Scott width;
* ``full``: a linear map L (n_components, d), score ``-1/2 ||L (x_i - x_j)||^2``
  (metric learning for kernel regression, MLKR, Weinberger & Tesauro 2007).

One fit (:class:`_MetricFit`) runs in stages: the initial point (Scott's widths,
the leading principal directions, random components or the caller's array); on
many rows, a ladder of row subsamples (the criterion of m query rows against all n
keys, then of more rows, each stage from where the last ended and afresh from the
initial point when that is better); an L-BFGS-B run per stage; on the last stage
of a ladder, restarts with fresh curvature pairs while they gain more than ``tol``;
the result in the features' units.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from .. import config
from .._core.numeric import median, row_ladder
from .._core.progress import FitProgress, check_verbose
from .._core.validation import check_choice, check_rtol, resolve_dtype, scaled_columns
from .loo import (
    check_components,
    cpu_for_rtol,
    prepare_xy,
    prepared_loss_and_grad,
    projected_layout,
)
from .loo_rows import loss_from_layout
from .regression import bandwidth_rule, feature_spread, scaled_layout
from .tiled_loo import prune_gap, pruned_keys

__all__ = ["fit_learned_kernel"]


def fit_learned_kernel(
    X,
    y,
    metric="diagonal",
    *,
    n_components=None,
    init="scott",
    max_iter=200,
    tol=1e-6,
    random_state=None,
    dtype=None,
    device="cpu",
    verbose=False,
    rtol=0.0,
):
    """Minimise the LOO MSE over the kernel's metric with L-BFGS-B and the exact gradient.

    Parameters
    ----------
    X : array-like (n, d), n >= 2
    y : array-like (n,) or (n, p)
    metric : "scalar", "diagonal" or "full"
        * "scalar": widths ``c * h_scott``, c learned (the seed's single w);
        * "diagonal": one width per feature, learned on the log scale;
        * "full": a linear map L (n_components, d), score ``-1/2 ||L(x - x')||^2``.

        Scalar and diagonal log-widths are bounded to ``config.WIDTH_BOUNDS``
        times the Scott widths (1e-3 ... 1e4), so an irrelevant feature's width
        grows until the bound instead of overflowing.
    n_components : int, only for "full" (default d)
    init : "scott", "random" (full only) or an array
        "scott" starts from Scott's widths (full: ``L = diag(1/h_scott)``, or
        the leading principal directions when n_components < d). An array
        gives the initial widths (d,) or factor (scalar), or L (full).
    max_iter, tol : L-BFGS-B's ``maxiter`` and ``tol`` (on the loss divided
        by the variance of y, so that ``tol`` does not depend on y's units).
    random_state : seed for init="random" and for the subsamples of the ladder; None
        draws the subsamples with a fixed seed (0), so that two fits of the same data
        give the same bits (only init="random" is then random)
    dtype : "float64" or "float32"
    device : "cpu", "cuda" or "auto": where the LOO loss and gradient run
    verbose : bool or int
        Progress on stderr (:mod:`nbattn._core.progress`): the iteration, the
        LOO MSE and its change; a tqdm bar on a terminal, plain lines
        otherwise or with ``verbose=2``.
    rtol : float in [0, 1), default 0 (exact)
        Every evaluation on the pruned tiles of
        :func:`nbattn.smoothing.loo.loo_loss_and_grad` (each leave-one-out fit
        within ``rtol / (1 - rtol) max_j |y_j - f_-i|`` of the exact one; CPU only).
        The answer is then checked exactly: its exact LOO MSE is compared with the
        start's, and the start is returned if it is no worse (see Notes).

    Returns
    -------
    dict with ``bandwidth`` (d,) or ``components`` (k, d), ``loss`` (final LOO
    MSE, on all rows), ``loss_curve`` (the criterion at the start and after each
    iteration: the subsample estimates during the early stages), ``n_iter`` (all
    stages), ``converged`` and ``message`` (of the last stage) and ``stages``
    (the query rows of each stage, the last one n).

    Notes
    -----
    Many rows (the ladder). One evaluation costs n^2 pairs. With
    n >= 2 m, m = max(``config.LEARN_SUBSAMPLE_ROWS``,
    ``config.LEARN_ROWS_PER_PARAMETER`` x parameters), the rows are shuffled and
    L-BFGS-B first minimises the criterion of the first m rows, each left out and
    predicted against all n keys (an unbiased estimate of the LOO MSE, with its
    exact gradient; m n pairs), then of ``LEARN_SUBSAMPLE_GROWTH`` times more rows
    while that is at most n / 2, each stage starting where the last one ended,
    and finishes on the full criterion. A stage whose criterion is lower at the
    initial point than at the previous stage's result (the subsample was
    overfitted) starts afresh from the initial point, so the result is never
    worse than the start. In the ladder, ``tol`` is relative to each stage's
    starting loss (not to the variance of y: a warm start is near a minimum),
    and the last stage minimises the full criterion.

    Many keys (on the CPU, n >= ``config.LOO_PRUNE_MIN_ROWS``): each evaluation
    orders the keys by a k-d split of the current score space and each tile of
    query rows takes only the leaves whose bounding box comes within reach of
    one of its rows (``kernels.loo_tiles.loo_tiles_boxed``): the skipped keys
    weigh less than exp(-``config.PRUNE_GAP_FLOAT64``) of their row's largest
    weight, so the loss and gradient are those of all keys to rounding.

    With ``rtol > 0`` the final point's loss is computed exactly (``loss`` is
    exact). The start's is not, where a bound settles it: each left-out fit moves by
    at most rtol / (1 - rtol) R (R the range of its output of y), so the root of the
    loss, the fits' RMS error, by at most rtol / (1 - rtol) times the RMS of the
    ranges; a final exact root below the start's pruned root less that margin is
    below the start's exact one. Otherwise the start's exact loss is computed too,
    and the better point returned (the start on ties).

    Warns
    -----
    sklearn.exceptions.ConvergenceWarning
        when L-BFGS-B stops without meeting its tolerance (e.g. ``max_iter``).

    Raises
    ------
    FloatingPointError
        if the loss or gradient ever becomes non-finite (never returned silently).
    """
    check_choice(metric, "metric", ("scalar", "diagonal", "full"))
    check_verbose(verbose)
    dtype = resolve_dtype(dtype, X, y)
    rtol = check_rtol(rtol)
    device = cpu_for_rtol(device, rtol)
    X, y2 = prepare_xy(X, y, dtype)
    fit = _MetricFit(X, y2, metric, n_components, init, random_state, dtype, device, rtol)
    with FitProgress(verbose, "fit_learned_kernel", total=int(max_iter), unit="iter") as log:
        res = fit.run(max_iter, tol, log)
        if rtol > 0.0:
            res = fit.settle_exactly(res)
    if not res.success:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(
            f"L-BFGS-B did not converge in {fit.n_iter} iterations ({res.message}); "
            "increase max_iter or loosen tol",
            ConvergenceWarning,
            stacklevel=2,
        )
    return fit.result(res)


class _MetricFit:
    """One fit of :func:`fit_learned_kernel`, stage by stage.

    The parameters p of L-BFGS-B are the log-factor of Scott's widths (scalar), the
    log-widths (diagonal) or L raveled (full), all in the coordinates of the
    standardised features ``Xs``. With a ladder the rows of ``Xs`` and ``y2`` are in
    a random order, so rows [0, m) are a random subsample of m rows.

    Attributes
    ----------
    x0, bounds : the initial point and L-BFGS-B's bounds (None for the full metric)
    stages : the query rows of each stage (:func:`_subsample_ladder`), the last one n
    stage_rows : the query rows of the running stage, None for all of them
    scale : what the objective divides the criterion by: var(y), or on a ladder the
        stage's starting loss (``tol`` is relative to it)
    curve : the criterion at the start and after each iteration
    n_iter : the iterations of every stage so far
    """

    def __init__(self, X, y2, metric, n_components, init, random_state, dtype, device, rtol=0.0):
        self.metric, self.dtype, self.device, self.rtol = metric, dtype, device, rtol
        self.n, self.d = X.shape
        self.Xs, self.sigma = _standardise(X)
        self.h_std = bandwidth_rule(self.Xs, "scott")  # Scott widths of the standardised data
        y_var = float(np.mean(np.var(y2, axis=0)))
        self.norm = y_var if y_var > 0 else 1.0
        self.y2 = y2
        rng = np.random.default_rng(random_state)
        if metric == "full":
            self.x0, self.bounds = self._initial_components(init, n_components, rng)
        else:
            self.x0, self.bounds = self._initial_widths(init)
        self.stages = _subsample_ladder(self.n, self.x0.size)
        if len(self.stages) > 1:
            # the subsamples are how the fit is computed, not a randomness the user asked
            # for: without a seed they come from a fixed one, and every fit repeats
            order = (rng if random_state is not None else np.random.default_rng(0)).permutation(
                self.n
            )
            self.Xs = np.ascontiguousarray(self.Xs[order])
            self.y2 = np.ascontiguousarray(self.y2[order])
        self.stage_rows = None
        self.scale = self.norm
        self.curve = []
        self.n_iter = 0
        self._last = {}  # the last evaluation, so that a stage's start check costs nothing
        self.start_all_rows = None  # the criterion of all rows at x0, once evaluated

    # ---- the initial point

    def _initial_widths(self, init):
        """x0 and bounds of the scalar and diagonal metrics: Scott's widths, or the widths
        (d,) or factor (scalar) of an array, in log, clipped to config.WIDTH_BOUNDS."""
        d, h_std = self.d, self.h_std
        if not isinstance(init, str):
            h_init = np.broadcast_to(np.asarray(init, dtype=np.float64).reshape(-1), (d,))
            h_init = h_init / self.sigma
            if self.metric == "scalar":
                h_init = np.full(d, float(np.mean(h_init / h_std))) * h_std
        elif init == "scott":
            h_init = h_std.copy()
        else:
            raise ValueError(f"init must be 'scott' or an array for metric={self.metric!r}")
        if not np.all(np.isfinite(h_init)) or np.any(h_init <= 0):
            raise ValueError("init widths must be positive and finite")
        lo, hi = np.log(config.WIDTH_BOUNDS[0]), np.log(config.WIDTH_BOUNDS[1])
        if self.metric == "scalar":
            x0 = np.array([np.log(h_init[0] / h_std[0])])
            bounds = [(lo, hi)]
        else:
            x0 = np.log(h_init)
            log_h = np.log(h_std)
            bounds = list(zip(log_h + lo, log_h + hi))
        return np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds]), bounds

    def _initial_components(self, init, n_components, rng):
        """x0 of the full metric (no bounds): L of an array, in standardised coordinates,
        ``diag(1/h_scott)``, the leading principal directions of the standardised data
        scaled like Scott (n_components < d), or random components."""
        d, h_std = self.d, self.h_std
        k = d if n_components is None else int(n_components)
        if not 1 <= k <= d:
            raise ValueError(f"n_components must be in [1, {d}], got {n_components!r}")
        self.k = k
        if not isinstance(init, str):
            L0 = check_components(init, d) * self.sigma  # to standardised coordinates
            if L0.shape[0] != k:
                raise ValueError(f"init has {L0.shape[0]} rows but n_components is {k}")
        elif init == "scott" and k == d:
            L0 = np.diag(1.0 / h_std)
        elif init == "scott":
            _, _, vt = np.linalg.svd(self.Xs, full_matrices=False)
            L0 = vt[:k] / h_std[:k].mean()
        elif init == "random":
            L0 = rng.standard_normal((k, d)) / (np.sqrt(d) * h_std.mean())
        else:
            raise ValueError(f"init must be 'scott', 'random' or an array, got {init!r}")
        return L0.ravel(), None

    # ---- the metric of parameters p

    def widths(self, p):
        """The standardised widths of p (scalar and diagonal metrics)."""
        return np.exp(p[0]) * self.h_std if self.metric == "scalar" else np.exp(p)

    def layout(self, p):
        """The kernels' layout of the standardised points under the metric of p."""
        if self.metric == "full":
            components = p.reshape(self.k, self.d)
            return projected_layout(self.Xs - self.Xs.mean(axis=0), components, self.dtype)
        widths = self.widths(p)
        return scaled_layout(
            self.Xs, 1.0 / widths, self.dtype, name="X (standardised)", widths=widths
        )

    def loss_and_grad(self, p, n_rows, rtol=None):
        """The criterion of rows [0, n_rows) (None: all) and its gradient in p, within
        ``rtol`` (None: the fit's)."""
        rtol = self.rtol if rtol is None else rtol
        common = {"dtype": self.dtype, "device": self.device, "n_rows": n_rows, "rtol": rtol}
        if self.metric == "full":
            components = p.reshape(self.k, self.d)
            return prepared_loss_and_grad(self.Xs, self.y2, components=components, **common)
        loss, grad = prepared_loss_and_grad(self.Xs, self.y2, self.widths(p), **common)
        if self.metric == "scalar":  # one factor of every width: the sum over log-widths
            return loss, np.array([grad.sum()])
        return loss, grad

    # ---- evaluations

    def raw(self, p):
        """The running stage's criterion and gradient at p, checked finite; the first
        evaluation of the fit (L-BFGS-B evaluates x0 first) starts the loss curve."""
        key = (self.stage_rows, p.tobytes())
        if key not in self._last:
            self._last.clear()
            self._last[key] = self.loss_and_grad(p, self.stage_rows)
        loss, grad = self._last[key]
        if not np.isfinite(loss) or not np.all(np.isfinite(grad)):
            raise FloatingPointError(
                f"the LOO loss or its gradient became non-finite (loss={loss!r})"
            )
        if not self.curve:
            self.curve.append(float(loss))
        return loss, grad

    def objective(self, p):
        """What L-BFGS-B minimises: the criterion and its gradient divided by ``scale``."""
        loss, grad = self.raw(p)
        return loss / self.scale, np.ravel(grad) / self.scale

    def start_loss(self):
        """The criterion of this stage at x0. Where the tiles would not prune (the
        start's widths are often wide), without its gradient: the loss-only kernel
        costs a third of the tile pass (diamonds, all rows at Scott's widths: 1.8 s
        against 6.6 s); where they would, by the pruned tile pass."""
        rows = self.stage_rows
        z, z_t = self.layout(self.x0)
        if self.device == "cpu":
            z64 = np.ascontiguousarray(z, dtype=np.float64)
            gap = prune_gap(z64.shape[0], self.rtol)
            if pruned_keys(z64, z64, self.y2, gap) is not None:
                return self.raw(self.x0)[0]
        return loss_from_layout(
            z,
            z_t,
            self.y2,
            self.dtype,
            rows=None if rows is None else np.arange(rows),
            device=self.device,
        )

    # ---- the stages

    def run(self, max_iter, tol, log):
        """Every stage of the ladder; returns the last stage's L-BFGS-B result."""
        self.log = log
        if log.enabled:
            log.note(f"{self.metric} metric, {self.n} rows, {self.d} features")
        x = self.x0
        for rows in self.stages:
            x = self._begin_stage(rows, x)
            last = len(self.stages) > 1 and rows == self.n
            restarts = int(config.LEARN_FINAL_RESTARTS) if last else 0
            res, x = self._minimize(x, restarts, max_iter, tol)
        if log.enabled:
            log.note(
                f"{'converged' if res.success else 'stopped'} after {self.n_iter} iterations: "
                f"LOO MSE {float(res.fun) * self.scale:.6g} (start {self.curve[0]:.6g}); "
                f"{res.message}"
            )
        return res

    def _begin_stage(self, rows, x):
        """Make ``rows`` the running stage; returns where it starts: x, or x0 when the
        criterion of these rows is lower at x0 (the previous subsample was overfitted)."""
        ladder = len(self.stages) > 1
        self.stage_rows = None if rows == self.n else rows
        if self.log.enabled and ladder:
            what = "all rows" if rows == self.n else f"a random subsample of {rows} query rows"
            self.log.note(f"stage: the LOO criterion of {what} against all {self.n} keys")
        if rows == self.stages[0]:
            restart = False
            if rows == self.n:  # one stage: x is x0, L-BFGS-B's first evaluation
                self.start_all_rows = self.raw(x)[0]
        else:
            start = self.start_loss()
            if rows == self.n:
                self.start_all_rows = start
            restart = start < self.raw(x)[0]
        if restart:
            if self.log.enabled:
                self.log.note("the previous stage's result is worse than the start here: restart")
            x = self.x0
        if ladder:
            # relative to the stage's starting loss, not var(y): a warm start is near a
            # minimum, and a tolerance on loss / var(y) (LOO MSE << var(y)) would end the
            # stage after a step or two
            start = float(self.raw(x)[0])
            self.scale = start if start > 0 else self.norm
        return x

    def _minimize(self, x, restarts, max_iter, tol):
        """L-BFGS-B from x, then up to ``restarts`` times again from where it stopped,
        with fresh curvature pairs, while that gains more than ``tol``: a warm start in
        a long flat valley (a width that barely matters) stops on a short step far from
        the minimum. Returns the best run's result and point."""
        res = None
        for _ in range(1 + restarts):
            again = self._lbfgsb(x, max_iter, tol)
            gained = res is None or res.fun - again.fun > tol * abs(res.fun)
            if res is None or again.fun <= res.fun:
                res, x = again, again.x
            if not gained or self.n_iter >= int(max_iter):
                break
        return res, x

    def _lbfgsb(self, x, max_iter, tol):
        """One L-BFGS-B run from x, with the iterations left of ``max_iter`` (at least 1)."""
        from scipy.optimize import minimize

        res = minimize(
            self.objective,
            x,
            jac=True,
            method="L-BFGS-B",
            bounds=self.bounds,
            tol=tol,
            callback=self._iteration,
            options={"maxiter": max(int(max_iter) - self.n_iter, 1)},
        )
        self.n_iter += int(res.nit)
        return res

    def _iteration(self, intermediate_result):
        """L-BFGS-B's callback: the loss curve and a progress line."""
        self.curve.append(float(intermediate_result.fun) * self.scale)
        estimate = "" if self.stage_rows is None else f" (estimate on {self.stage_rows} rows)"
        self.log.step(
            f"iteration {len(self.curve) - 1}: LOO MSE {self.curve[-1]:.6g}{estimate} "
            f"(change {self.curve[-1] - self.curve[-2]:+.3g})"
        )

    # ---- the result

    def settle_exactly(self, res):
        """With ``rtol`` > 0: the final point's exact loss, and the start instead where its
        exact loss is no higher (fit_learned_kernel's Notes: a bound on the pruning
        settles most fits without the start's exact loss). Returns ``res`` with the
        point kept and its exact loss (``fun`` divided by ``scale``)."""
        found = self.loss_and_grad(res.x, None, rtol=0.0)[0]
        # every fit moves by at most rtol / (1 - rtol) times the range of its output, so
        # the root of the loss (the fits' RMS error) by at most that share of the ranges'
        # RMS: below the start's pruned root by more, the answer is below its exact one
        share = self.rtol / (1.0 - self.rtol)
        margin = share * float(np.sqrt(np.mean(np.ptp(self.y2, axis=0) ** 2)))
        x = res.x
        if not math.sqrt(found) < math.sqrt(self.start_all_rows) - margin:
            start = self.loss_and_grad(self.x0, None, rtol=0.0)[0]
            if start <= found:
                x, found = self.x0, start
                if self.log.enabled:
                    self.log.note("the start's exact LOO MSE is no higher: the start is kept")
        res.x, res.fun = x, found / self.scale
        return res

    def result(self, res):
        """:func:`fit_learned_kernel`'s dictionary, the metric in the features' units."""
        result = {
            "loss": float(res.fun) * self.scale,
            "loss_curve": np.array(self.curve),
            "n_iter": self.n_iter,
            "converged": bool(res.success),
            "message": str(res.message),
            "stages": self.stages,
        }
        if self.metric == "full":
            result["components"] = res.x.reshape(-1, self.d) / self.sigma
        else:
            result["bandwidth"] = self.widths(res.x) * self.sigma
        return result


def _standardise(X):
    """(X - median) / spread per column, with the spread computed at any magnitude."""
    sigma = feature_spread(X)
    sigma = np.where(sigma > 0, sigma, 1.0)
    centre = median(X)
    return scaled_columns(X, "X", sigma, centre=centre, width_name="spread"), sigma


def _subsample_ladder(n, n_params):
    """Query rows of each fitting stage: :func:`nbattn._core.numeric.row_ladder` from m,
    the larger of ``config.LEARN_SUBSAMPLE_ROWS`` and ``config.LEARN_ROWS_PER_PARAMETER *
    n_params``, growing by ``config.LEARN_SUBSAMPLE_GROWTH``; ``[n]`` when
    LEARN_SUBSAMPLE_ROWS = 0."""
    if int(config.LEARN_SUBSAMPLE_ROWS) <= 0:
        return [n]
    first = max(int(config.LEARN_SUBSAMPLE_ROWS), int(config.LEARN_ROWS_PER_PARAMETER) * n_params)
    return row_ladder(n, first, config.LEARN_SUBSAMPLE_GROWTH)
