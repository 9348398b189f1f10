"""The leave-one-out criteria of Nadaraya-Watson regression: the loss and its exact gradient.

The attention-pooling walk-through, section 1.3.3, makes the kernel width a
parameter learned from the data. The criterion is the leave-one-out (LOO)
mean squared error of Nadaraya-Watson regression,

.. math::

    L = \\frac{1}{n p} \\sum_i \\| f_{-i}(x_i) - y_i \\|^2, \\qquad
    f_{-i}(x_i) = \\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij})\\, y_j

(p outputs), with one of three scores:

* ``scalar``:   ``s_ij = -1/2 sum_d ((x_id - x_jd) / (c h_d))^2``, one factor c
  on fixed base widths h (Scott's rule by default); the text's single w is 1/(c h).
* ``diagonal``: ``s_ij = -1/2 sum_d ((x_id - x_jd) / h_d)^2``, one width per feature.
* ``full``:     ``s_ij = -1/2 || L (x_i - x_j) ||^2`` with L (n_components, d):
  metric learning for kernel regression (MLKR, Weinberger & Tesauro 2007).

The gradient is exact and streamed (``nbattn.kernels.loo``): with
``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` and ``r_i = f_i - y_i``,

.. math::

    \\frac{\\partial L}{\\partial \\log h_d} = \\frac{2}{n p} \\sum_{i, j \\ne i}
        g_{ij} \\Big(\\frac{x_{id} - x_{jd}}{h_d}\\Big)^2, \\qquad
    \\frac{\\partial L}{\\partial L} = -\\frac{2}{n p}\\, L \\sum_{i, j \\ne i}
        g_{ij} (x_i - x_j)(x_i - x_j)^T .

With a tolerance ``rtol`` > 0 (CPU) both come from the boxed tiles
(:mod:`nbattn.smoothing.tiled_loo`) pruned at the gap log((n - 1) / rtol): each row
skips only keys weighing less than rtol / (n - 1) of its largest weight, so every
kernel sum of a leave-one-out fit (normaliser, weighted values) is within ``rtol``
of its exact value and each fit within ``rtol / (1 - rtol) max_j |y_j - f_-i(x_i)|``
of the exact one; each skipped pair's gradient term is its weight (below that
share) times its squared scaled distance, which the weight outruns.

Memory is O(n (d + p)) throughout: no n x n matrix is formed. The sums run over
row ranges (:mod:`nbattn.smoothing.loo_rows`); on the CPU the loss and gradient
take one pass over row tiles (:mod:`nbattn.smoothing.tiled_loo`), on the GPU the
two streaming passes. The width search (:mod:`nbattn.smoothing.width_search`) and
the learned metrics (:mod:`nbattn.smoothing.learned_metric`) minimise this criterion.
"""

from __future__ import annotations

import numpy as np

from .._core.numeric import power_of_two_scale
from .._core.validation import (
    as_columns,
    as_float_array,
    centred_columns,
    check_rtol,
    resolve_dtype,
)
from ..dispatch.device import resolve_device
from .loo_rows import loss_from_layout, loss_grad_rows, sum_over_rows, threads_for
from .regression import resolve_bandwidth, scaled_layout
from .tiled_loo import tiled_loss_and_grad_sums

__all__ = [
    "check_components",
    "cpu_for_rtol",
    "loo_loss",
    "loo_loss_and_grad",
    "prepare_xy",
    "prepared_loss_and_grad",
    "projected_layout",
]


#: How the errors of the scaled layout name X: the criteria scale X centred on its median.
_CENTRED_X = "X (centred on its median)"


def prepare_xy(X, y, dtype):
    """X (n, d) and y (n, p) checked (:func:`check_xy`) and centred (:func:`centred_xy`)."""
    return centred_xy(*check_xy(X, y))


def check_xy(X, y):
    """X (n, d) and y (n, p) as float64 columns with the same rows."""
    X = as_columns(X, "X", np.float64)
    y2 = as_columns(y, "y", np.float64)
    if y2.shape[0] != X.shape[0]:
        raise ValueError(f"y has {y2.shape[0]} rows but X has {X.shape[0]}")
    return X, y2


def centred_xy(X, y2):
    """Checked X (n, d) and y (n, p), n >= 2, each column centred on its median.

    Scores depend on differences of X and the LOO errors on differences of y
    (the weights sum to 1), so the centring changes nothing but float32
    rounding: a column far from 0 (temperatures in kelvin, incomes) keeps its
    digits.
    """
    if X.shape[0] < 2:
        raise ValueError(f"leave-one-out needs at least 2 samples, got n_samples={X.shape[0]}")
    return centred_columns(X), centred_columns(y2)


def projected_layout(points, components, dtype):
    """points @ L^T / sqrt(2) as (rows, transposed) in ``dtype``: the kernels' layout of
    the full metric's scores ``-1/2 ||L (x_i - x_j)||^2``."""
    z = np.ascontiguousarray(points @ (np.asarray(components).T / np.sqrt(2.0)), dtype=dtype)
    return z, np.ascontiguousarray(z.T)


def check_components(components, d):
    """``components`` as a float64 (k, d) array for data of d features."""
    L = as_float_array(components, "components", ndim=(2,), dtype=np.float64)
    if L.shape[1] != d:
        raise ValueError(f"components has {L.shape[1]} columns but X has {d} features")
    return L


def loo_loss(X, y, bandwidth="scott", *, components=None, dtype=None, device="cpu", rtol=0.0):
    """Leave-one-out mean squared error of Nadaraya-Watson regression.

    .. math::

        L = \\frac{1}{n p} \\sum_{i=1}^n \\sum_{c=1}^p
            \\Big(\\sum_{j \\ne i} \\operatorname{softmax}_{j \\ne i}(s_{ij}) y_{jc}
            - y_{ic}\\Big)^2

    with ``s_ij = -1/2 sum_d ((x_id - x_jd)/h_d)^2``, or ``-1/2 ||L(x_i - x_j)||^2``
    when ``components`` (L, shape (k, d)) is given (then ``bandwidth`` is ignored).

    Parameters
    ----------
    X : array-like (n, d) or (n,)
    y : array-like (n,) or (n, p); with p outputs the mean runs over outputs too
    bandwidth : "scott", "silverman", float or array (d,)
    components : array-like (k, d), optional
    dtype : "float64" or "float32"; the sum is accumulated in float64 either way
    device : "cpu", "cuda" or "auto" (the CUDA twin ``nbattn.cuda.loo``)
    rtol : float in [0, 1), default 0 (exact)
        Each leave-one-out fit within ``rtol / (1 - rtol) max_j |y_j - f_-i(x_i)|`` of
        the exact one (per output; the module docstring states the rule): the pruned
        tiles of :func:`loo_loss_and_grad`. CPU only.

    Raises
    ------
    ValueError
        fewer than 2 samples, NaN/inf, mismatched shapes, rtol outside [0, 1).
    NotImplementedError
        ``rtol > 0`` on the GPU.
    """
    dtype = resolve_dtype(dtype, X, y)
    rtol = check_rtol(rtol)
    if rtol > 0.0:
        cpu_for_rtol(device, rtol)
        loss, _ = loo_loss_and_grad(
            X,
            y,
            None if components is not None else bandwidth,
            components=components,
            dtype=dtype,
            rtol=rtol,
        )
        return loss
    X, y2 = prepare_xy(X, y, dtype)
    if components is not None:
        z, z_t = projected_layout(
            X - X.mean(axis=0), check_components(components, X.shape[1]), dtype
        )
    else:
        h = resolve_bandwidth(bandwidth, X, "X")
        z, z_t = scaled_layout(X, 1.0 / h, dtype, name=_CENTRED_X, widths=h, width_name="bandwidth")
    return loss_from_layout(z, z_t, y2, dtype, device=device)


def loo_loss_and_grad(X, y, bandwidth=None, *, components=None, dtype=None, device="cpu", rtol=0.0):
    """The LOO MSE and its exact gradient (two streaming passes).

    Parameters
    ----------
    X, y : as in :func:`loo_loss`
    bandwidth : "scott", "silverman", float or array (d,)
        Score ``-1/2 sum_d ((x_id - x_jd)/h_d)^2``; the gradient is with respect
        to the log-widths ``log h_d``, shape (d,). For one shared width scale
        (``h = c * h0``) the derivative with respect to ``log c`` is its sum.
    components : array-like (k, d)
        Score ``-1/2 ||L (x_i - x_j)||^2``; the gradient is with respect to L,
        shape (k, d). Give exactly one of ``bandwidth`` and ``components``.
    dtype : "float64" or "float32"
    device : "cpu", "cuda" or "auto"
        Both passes run on the GPU with "cuda"; only the n x (d + p) inputs
        and the pass-1 outputs cross to and from the host.
    rtol : float in [0, 1), default 0 (exact)
        The tiles skip keys weighing less than rtol / (n - 1) of their row's
        largest weight (module docstring): each fit within
        ``rtol / (1 - rtol) max_j |y_j - f_-i(x_i)|`` of the exact one. CPU only.

    Returns
    -------
    loss : float
    grad : ndarray (d,) or (k, d), float64

    Notes
    -----
    Pass 1 is the streaming pool with the pair (i, i) excluded, giving
    ``f_i = f_{-i}(x_i)`` and ``lse_i``; pass 2 recomputes each score, takes the
    exact weight ``w_ij = exp(s_ij - lse_i)`` and accumulates
    ``g_ij = w_ij sum_c r_ic (y_jc - f_ic)`` times the squared (scaled)
    differences (diagonal) or the outer products ``(x_i - x_j)(x_i - x_j)^T``
    (full; a d x d accumulator per thread). Then

        dL/dlog h_d = 2/(n p) sum_ij g_ij ((x_id - x_jd)/h_d)^2
        dL/dL       = -2/(n p) L sum_ij g_ij (x_i - x_j)(x_i - x_j)^T
    """
    if (bandwidth is None) == (components is None):
        raise ValueError("give exactly one of bandwidth and components")
    dtype = resolve_dtype(dtype, X, y)
    rtol = check_rtol(rtol)
    device = cpu_for_rtol(device, rtol)
    X, y2 = prepare_xy(X, y, dtype)
    if components is None:
        h = resolve_bandwidth(bandwidth, X, "X")
        return prepared_loss_and_grad(X, y2, h, dtype=dtype, device=device, rtol=rtol)
    L = check_components(components, X.shape[1])
    return prepared_loss_and_grad(X, y2, components=L, dtype=dtype, device=device, rtol=rtol)


def cpu_for_rtol(device, rtol):
    """The resolved ``device`` ("cpu", "cuda" or "auto" as given): with ``rtol`` > 0 the
    pruned tiles run on the CPU only, so "auto" stays there and "cuda" is refused (as the
    estimators' ``device``)."""
    if rtol > 0.0 and device == "auto":
        return "cpu"
    device = resolve_device(device)
    if rtol > 0.0 and device != "cpu":
        raise NotImplementedError(
            f"rtol={rtol!r} (the pruned leave-one-out tiles) runs on the CPU only: pass "
            "device='cpu', or rtol=0 for the exact GPU passes"
        )
    return device


def prepared_loss_and_grad(
    X, y2, widths=None, components=None, *, dtype, device, n_rows=None, rtol=0.0
):
    """:func:`loo_loss_and_grad` on inputs already checked and centred by :func:`prepare_xy`;
    with ``n_rows``, the estimate on rows [0, n_rows) (each left out and predicted
    against all keys: a random subsample when the rows were shuffled); ``rtol`` checked
    (> 0 on the CPU only)."""
    # targets far from unit size divided by a power of two near max |y| (exact; the loss
    # and gradient are quadratic in y, so they are multiplied back by its square): the
    # tiles' weighted sums of y near 1e-80 underflowed and lost every digit
    top = float(np.max(np.abs(y2))) if y2.size else 0.0
    unit = 1.0 if top == 0.0 or 2.0**-60 <= top <= 2.0**60 else float(power_of_two_scale(top))
    if unit != 1.0:
        loss, grad = prepared_loss_and_grad(
            X, y2 / unit, widths, components, dtype=dtype, device=device, n_rows=n_rows, rtol=rtol
        )
        with np.errstate(over="ignore", under="ignore"):
            return loss * unit * unit, grad * (unit * unit)
    v_t = np.ascontiguousarray(y2.T, dtype=dtype)
    if components is None:
        z, z_t = scaled_layout(
            X, 1.0 / widths, dtype, name=_CENTRED_X, widths=widths, width_name="bandwidth"
        )
    else:
        # scores on the mean-centred points (the layout of the loss-only kernels); the
        # gradient's coordinates keep prepare_xy's median centring: M depends on
        # differences only, and an outlying row pulls the mean away from the bulk, where
        # the expanded sums of kernels.loo_tiles (x x^T terms) would then lose digits
        z, z_t = projected_layout(X - X.mean(axis=0), components, dtype)
    n_queries = X.shape[0] if n_rows is None else n_rows
    with threads_for(n_queries * X.shape[0]):
        return _loss_and_grad_passes(
            X, y2, z, z_t, v_t, dtype, components is None, components, device, n_rows, rtol
        )


def _loss_and_grad_passes(
    X, y2, z, z_t, v_t, dtype, diagonal, L, device="cpu", n_rows=None, rtol=0.0
):
    """LOO MSE and gradient of rows [0, n_rows) (all rows by default): on the CPU one
    pass over row tiles (pruned within ``rtol``), on the GPU the two streaming passes."""
    n = z.shape[0] if n_rows is None else int(n_rows)
    size = n * y2.shape[1]
    scale = 2.0 / size
    if device == "cpu":
        sse, sums = tiled_loss_and_grad_sums(X, y2, z, z_t, v_t, dtype, diagonal, n, rtol)
    elif diagonal:
        sse, sums = sum_over_rows(loss_grad_rows, n, z, z_t, v_t, y2, None, None, dtype, device)
    else:
        pts = np.ascontiguousarray(X, dtype=dtype)
        pts_t = np.ascontiguousarray(pts.T)
        sse, sums = sum_over_rows(loss_grad_rows, n, z, z_t, v_t, y2, pts, pts_t, dtype, device)
    if diagonal:
        # (x_id - x_jd)^2 / h_d^2 = 2 (z_id - z_jd)^2 with the sqrt(2) of the layout
        return sse / size, 2.0 * scale * sums
    return sse / size, -scale * (L @ sums)
