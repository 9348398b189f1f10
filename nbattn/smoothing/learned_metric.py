"""Learned metrics: the kernel's widths or linear map that minimise the leave-one-out MSE.

:func:`fit_learned_kernel` minimises the LOO MSE of Nadaraya-Watson regression
(:mod:`nbattn.smoothing.loo`) with L-BFGS-B and the exact gradient, over one of
three metrics on the standardised features: ``scalar`` (widths ``c h_scott``),
``diagonal`` (one width per feature) or ``full`` (a linear map L: metric learning
for kernel regression, MLKR, Weinberger & Tesauro 2007). On many rows it climbs a
ladder of row subsamples (:func:`_subsample_ladder`). The bounds
(``config.WIDTH_BOUNDS``) and the ladder's sizes live in :mod:`nbattn.config`.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import config
from .._core.progress import FitProgress, check_verbose
from .._core.validation import resolve_dtype
from ..dispatch.device import resolve_device
from .loo import check_components, prepare_xy, prepared_loss_and_grad, projected_layout
from .loo_rows import loss_from_layout
from .regression import bandwidth_rule, feature_spread, scaled_layout
from .tiled_loo import pruned_keys

__all__ = ["fit_learned_kernel"]


def _standardise(X):
    """(X - median) / spread per column, with the spread computed at any magnitude."""
    sigma = feature_spread(X)
    sigma = np.where(sigma > 0, sigma, 1.0)
    return (X - np.median(X, axis=0)) / sigma, sigma


def _initial_components(Xs, h_std, n_components, init, rng):
    d = Xs.shape[1]
    if isinstance(init, str) and init == "scott":
        if n_components == d:
            return np.diag(1.0 / h_std)
        # the leading principal directions of the standardised data, scaled like Scott
        _, _, vt = np.linalg.svd(Xs, full_matrices=False)
        return vt[:n_components] / h_std[:n_components].mean()
    if isinstance(init, str) and init == "random":
        return rng.standard_normal((n_components, d)) / (np.sqrt(d) * h_std.mean())
    raise ValueError(f"init must be 'scott', 'random' or an array, got {init!r}")


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
    random_state : seed for init="random" and for the subsamples of the ladder
    dtype : "float64" or "float32"
    device : "cpu", "cuda" or "auto": where the LOO loss and gradient run
    verbose : bool or int
        Progress on stderr (:mod:`nbattn._core.progress`): the iteration, the
        LOO MSE and its change; a tqdm bar on a terminal, plain lines
        otherwise or with ``verbose=2``.

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

    Warns
    -----
    sklearn.exceptions.ConvergenceWarning
        when L-BFGS-B stops without meeting its tolerance (e.g. ``max_iter``).

    Raises
    ------
    FloatingPointError
        if the loss or gradient ever becomes non-finite (never returned silently).
    """
    from scipy.optimize import minimize

    if metric not in ("scalar", "diagonal", "full"):
        raise ValueError(f"metric must be 'scalar', 'diagonal' or 'full', got {metric!r}")
    check_verbose(verbose)
    dtype = resolve_dtype(dtype, X, y)
    device = resolve_device(device)
    X, y2 = prepare_xy(X, y, dtype)
    n, d = X.shape
    Xs, sigma = _standardise(X)
    h_std = bandwidth_rule(Xs, "scott")  # Scott widths of the standardised data
    y_var = float(np.mean(np.var(y2, axis=0)))
    norm = y_var if y_var > 0 else 1.0
    rng = np.random.default_rng(random_state)
    is_array_init = not isinstance(init, str)

    if metric in ("scalar", "diagonal"):
        if is_array_init:
            h_init = np.broadcast_to(np.asarray(init, dtype=np.float64).reshape(-1), (d,)) / sigma
            if metric == "scalar":
                h_init = np.full(d, float(np.mean(h_init / h_std))) * h_std
        elif init == "scott":
            h_init = h_std.copy()
        else:
            raise ValueError(f"init must be 'scott' or an array for metric={metric!r}")
        if not np.all(np.isfinite(h_init)) or np.any(h_init <= 0):
            raise ValueError("init widths must be positive and finite")
        lo, hi = np.log(config.WIDTH_BOUNDS[0]), np.log(config.WIDTH_BOUNDS[1])
        if metric == "scalar":
            x0 = np.array([np.log(h_init[0] / h_std[0])])
            bounds = [(lo, hi)]

            def widths(p):
                return np.exp(p[0]) * h_std

            def fun(p, n_rows):
                loss, g = prepared_loss_and_grad(
                    Xs, y2, widths(p), dtype=dtype, device=device, n_rows=n_rows
                )
                return loss, np.array([g.sum()])
        else:
            x0 = np.log(h_init)
            log_h = np.log(h_std)
            bounds = list(zip(log_h + lo, log_h + hi))

            def widths(p):
                return np.exp(p)

            def fun(p, n_rows):
                return prepared_loss_and_grad(
                    Xs, y2, widths(p), dtype=dtype, device=device, n_rows=n_rows
                )

        def layout(p):
            return scaled_layout(Xs, 1.0 / widths(p), dtype)

        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
    else:
        k = d if n_components is None else int(n_components)
        if not 1 <= k <= d:
            raise ValueError(f"n_components must be in [1, {d}], got {n_components!r}")
        if is_array_init:
            L0 = check_components(init, d) * sigma  # to standardised coordinates
            if L0.shape[0] != k:
                raise ValueError(f"init has {L0.shape[0]} rows but n_components is {k}")
        else:
            L0 = _initial_components(Xs, h_std, k, init, rng)
        x0 = L0.ravel()
        bounds = None

        def fun(p, n_rows):
            return prepared_loss_and_grad(
                Xs, y2, components=p.reshape(k, d), dtype=dtype, device=device, n_rows=n_rows
            )

        def layout(p):
            return projected_layout(Xs - Xs.mean(axis=0), p.reshape(k, d), dtype)

    stages = _subsample_ladder(n, x0.size)
    if len(stages) > 1:
        # the rows in a random order: rows [0, m) are a random subsample of m rows
        order = rng.permutation(n)
        Xs, y2 = np.ascontiguousarray(Xs[order]), np.ascontiguousarray(y2[order])
    curve = []
    stage_rows = [None]
    scale = [norm]  # the objective is loss / scale: tol is relative to it
    last = {}  # the last evaluation, so that a stage's start check costs L-BFGS-B nothing

    def raw(p):
        key = (stage_rows[0], p.tobytes())
        if key not in last:
            last.clear()
            last[key] = fun(p, stage_rows[0])
        loss, grad = last[key]
        if not np.isfinite(loss) or not np.all(np.isfinite(grad)):
            raise FloatingPointError(
                f"the LOO loss or its gradient became non-finite (loss={loss!r})"
            )
        if not curve:  # L-BFGS-B evaluates x0 first: the start of the loss curve
            curve.append(float(loss))
        return loss, grad

    def objective(p):
        loss, grad = raw(p)
        return loss / scale[0], np.ravel(grad) / scale[0]

    def start_loss():
        """The criterion of this stage at x0. Where the tiles would not prune (the
        start's widths are often wide), without its gradient: the loss-only kernel
        costs a third of the tile pass (diamonds, all rows at Scott's widths: 1.8 s
        against 6.6 s); where they would, by the pruned tile pass."""
        rows = stage_rows[0]
        z, z_t = layout(x0)
        if device == "cpu":
            z64 = np.ascontiguousarray(z, dtype=np.float64)
            if pruned_keys(z64, z64, y2) is not None:
                return raw(x0)[0]
        return loss_from_layout(
            z, z_t, y2, dtype, rows=None if rows is None else np.arange(rows), device=device
        )

    n_iter, x = 0, x0
    with FitProgress(verbose, "fit_learned_kernel", total=int(max_iter), unit="iter") as log:

        def callback(intermediate_result):
            curve.append(float(intermediate_result.fun) * scale[0])
            estimate = "" if stage_rows[0] is None else f" (estimate on {stage_rows[0]} rows)"
            log.step(
                f"iteration {len(curve) - 1}: LOO MSE {curve[-1]:.6g}{estimate} "
                f"(change {curve[-1] - curve[-2]:+.3g})"
            )

        if log.enabled:
            log.note(f"{metric} metric, {n} rows, {d} features")
        for rows in stages:
            stage_rows[0] = None if rows == n else rows
            if log.enabled and len(stages) > 1:
                what = "all rows" if rows == n else f"a random subsample of {rows} query rows"
                log.note(f"stage: the LOO criterion of {what} against all {n} keys")
            if rows != stages[0] and start_loss() < raw(x)[0]:
                # the subsample led somewhere worse than the start on this stage's
                # criterion (it was overfitted): start this stage afresh
                if log.enabled:
                    log.note("the previous stage's result is worse than the start here: restart")
                x = x0
            if len(stages) > 1:
                # relative to the stage's starting loss, not var(y): a warm start is
                # near a minimum, and a tolerance on loss / var(y) (LOO MSE << var(y))
                # would end the stage after a step or two
                start = float(raw(x)[0])
                scale[0] = start if start > 0 else norm
            restarts = int(config.LEARN_FINAL_RESTARTS) if len(stages) > 1 and rows == n else 0
            res = None
            for _ in range(1 + restarts):
                # On the last stage of the ladder, L-BFGS-B starts again from where it
                # stopped, with fresh curvature pairs, while that gains more than tol: a
                # warm start in a long flat valley (a width that barely matters) stops on
                # a short step far from the minimum.
                again = minimize(
                    objective,
                    x,
                    jac=True,
                    method="L-BFGS-B",
                    bounds=bounds,
                    tol=tol,
                    callback=callback,
                    options={"maxiter": max(int(max_iter) - n_iter, 1)},
                )
                n_iter += int(again.nit)
                gained = res is None or res.fun - again.fun > tol * abs(res.fun)
                if res is None or again.fun <= res.fun:
                    res, x = again, again.x
                if not gained or n_iter >= int(max_iter):
                    break
        converged = bool(res.success)
        if log.enabled:
            log.note(
                f"{'converged' if converged else 'stopped'} after {n_iter} iterations: "
                f"LOO MSE {float(res.fun) * scale[0]:.6g} (start {curve[0]:.6g}); {res.message}"
            )
    if not converged:
        from sklearn.exceptions import ConvergenceWarning

        warnings.warn(
            f"L-BFGS-B did not converge in {n_iter} iterations ({res.message}); "
            "increase max_iter or loosen tol",
            ConvergenceWarning,
            stacklevel=2,
        )
    result = {
        "loss": float(res.fun) * scale[0],
        "loss_curve": np.array(curve),
        "n_iter": n_iter,
        "converged": converged,
        "message": str(res.message),
        "stages": stages,
    }
    if metric == "full":
        result["components"] = res.x.reshape(-1, d) / sigma
    else:
        result["bandwidth"] = widths(res.x) * sigma
    return result


def _subsample_ladder(n, n_params):
    """Query rows of each fitting stage: ``[m, g m, g^2 m, ..., n]`` with m the larger of
    ``config.LEARN_SUBSAMPLE_ROWS`` and ``config.LEARN_ROWS_PER_PARAMETER * n_params``
    and g = ``config.LEARN_SUBSAMPLE_GROWTH``, every subsample at most half of the
    rows; ``[n]`` when n < 2 m (or LEARN_SUBSAMPLE_ROWS = 0)."""
    if int(config.LEARN_SUBSAMPLE_ROWS) <= 0:
        return [n]
    first = max(int(config.LEARN_SUBSAMPLE_ROWS), int(config.LEARN_ROWS_PER_PARAMETER) * n_params)
    growth = max(int(config.LEARN_SUBSAMPLE_GROWTH), 2)
    stages = []
    rows = first
    while 0 < rows and 2 * rows <= n:
        stages.append(rows)
        rows *= growth
    return stages + [n]
