"""Distribution functions of a mixed-type product kernel on the GPU: the twin of
``nbattn.kernels.density`` (its module docstring has the formulas).

* ``log_kernel_sums``: per query

      log sum_j w_j prod_c A_c prod_k B_k,

  each factor the column's integrated kernel (G, or the categorical C_k summed over
  the codes up to the query's) where its flag is set, else its kernel (log K without
  its constant; the engine's categorical term of ``cat_params``, ``category_term`` of
  ``nbattn.cuda.local_pairs``). One thread per query, the block walking the keys in
  shared-memory tiles (``load_tile`` of the local kernels: continuous rows,
  categorical rows, the log weight), the sum kept as an online log-sum-exp (the
  running maximum, the total rescaled when it grows), every factor's logarithm taken
  directly (log Phi by Mills' ratio's series far in the lower tail), as on the CPU.
* ``conditional_quantile_roots``: the roots u of F(u | x_i) = tau, iterated on the
  host. A GPU thread cannot hold a row's n_k mixture weights (the CPU computes them
  once per row into O(n_k) scratch), so every evaluation of F re-walks the keys
  whichever loop drives it; the host loop drives the one sums kernel above,
  vectorised over the rows still iterating, with F(u | x) = exp(log N(u) - log D)
  (N: y's column integrated; D: x's kernels alone, computed once), and runs the
  CPU's iteration step for step: the levels in the order given, each bracket
  starting at the previous level's root, regula falsi with the Illinois rule and a
  bisection every fourth step, the same stopping rules. Two departures, both within
  the tolerance: the initial bracket is [min y_j + z, max y_j + z] over every key of
  positive weight (the CPU's spans only the keys above ``QUANTILE_WEIGHT_FLOOR`` of
  its row's largest weight: a wider bracket, a few more steps, the same root), and
  those keys below the floor stay in F (they move it by at most 1e-20 n).

float64 only, as the CPU kernels. The host wrappers take the CPU kernels' NumPy
arguments (``log_kernel_sums`` also takes its queries, keys and log weights as device
arrays) and return NumPy arrays; the launched kernel (``sums_kernel``, compiled per (dc, dk,
kernel)) takes flat arrays, as the PTX catalogue (``scripts/ptx.py``) compiles it.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._core.local_groups import (
    EPANECHNIKOV,
    GAUSSIAN,
    QUANTILE_MAX_STEPS,
    QUANTILE_ULPS,
    UNORDERED,
)
from .common import compiled, imin, jit, launch, tile_rows, to_device
from .local_pairs import _TILE_TYPE, category_term, load_tile, tile_floats

__all__ = [
    "conditional_quantile_roots",
    "log_kernel_sums",
    "sums_kernel",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


# --------------------------------------------------------------------------- device functions


@jit(device=True, inline=True)
def log_normal_cdf(z):
    """log Phi(z): erfc while Phi(z) is a normal float64, then Mills' ratio's series."""
    if z > -37.0:
        return math.log(0.5 * math.erfc(-z / math.sqrt(2.0)))
    r = 1.0 / (z * z)
    series = 1.0 - r * (1.0 - 3.0 * r * (1.0 - 5.0 * r * (1.0 - 7.0 * r)))
    return -0.5 * z * z - math.log(-z) - _HALF_LOG_2PI + math.log(series)


@jit(device=True, inline=True)
def log_integrated_kernel(z, kernel):
    """log G(z), the integrated continuous kernel."""
    if kernel == GAUSSIAN:
        return log_normal_cdf(z)
    if z <= -1.0:
        return -math.inf
    if z >= 1.0:
        return 0.0
    if kernel == EPANECHNIKOV:
        return math.log((1.0 + z) * (1.0 + z) * (2.0 - z) * 0.25)
    a = abs(z)
    a3 = a * a * a
    half_mass = (70.0 / 81.0) * a * (1.0 - a3 * (0.75 - a3 * (3.0 / 7.0 - 0.1 * a3)))
    value = 0.5 + half_mass if z >= 0.0 else 0.5 - half_mass
    return math.log(value) if value > 0.0 else -math.inf


@jit(device=True, inline=True)
def log_category_cdf(q, x, kind, lam, count):
    """log C(q, x): a key's categorical kernel summed over the codes 0 .. min(floor(q), c - 1)."""
    if q < 0.0:
        return -math.inf
    top = imin(math.floor(q), count - 1.0)
    below = x <= top
    if kind == UNORDERED:
        m = top + 1.0
        if count <= 1.0:
            return 0.0
        share = lam / (count - 1.0)
        value = (1.0 - lam) + (m - 1.0) * share if below else m * share
    elif below:
        value = (1.0 - lam) + 0.5 * lam * (1.0 - lam**x) + 0.5 * lam * (1.0 - lam ** (top - x))
    else:
        value = 0.5 * lam ** (x - top) * (1.0 - lam ** (top + 1.0))
    return math.log(value) if value > 0.0 else -math.inf


@jit(device=True, inline=True)
def log_kernel(d, kernel):
    """log K(d) of a continuous kernel without its constant (-inf outside its support),
    one column at a time (the engine's ``pair_score`` forms the product of all of them)."""
    if kernel == GAUSSIAN:
        return -0.5 * d * d
    if kernel == EPANECHNIKOV:
        inside = 1.0 - d * d
        return math.log(inside) if inside > 0.0 else -math.inf
    inside = 1.0 - abs(d) ** 3
    return 3.0 * math.log(inside) if inside > 0.0 else -math.inf


# --------------------------------------------------------------------------- the sums kernel


def _make_sums_kernel(dc, dk, kernel):
    dc1, dk1 = max(dc, 1), max(dk, 1)  # local arrays need a positive size
    weight_row = dc + dk
    minus_inf = -math.inf

    @jit
    def log_kernel_sums_kernel(
        q_cont,
        keys_cont_t,
        q_cat,
        keys_cat_t,
        cont_integrated,
        cat_integrated,
        cat_params,
        cat_kind,
        cat_lambda,
        cat_count,
        log_weights,
        no_rows,
        block_k,
        out,
    ):
        """The log sum of query i = this thread (module docstring); ``no_rows`` (0, 1):
        the tile carries no value rows."""
        i = cuda.grid(1)
        active = i < q_cont.shape[0]
        tile = cuda.shared.array(0, dtype=_TILE_TYPE)  # (dc + dk + 1) x block_k
        q_cont_row = cuda.local.array(dc1, dtype=np.float64)
        q_cat_row = cuda.local.array(dk1, dtype=np.float64)
        for c in range(dc):
            q_cont_row[c] = q_cont[i, c] if active else 0.0
        for k in range(dk):
            q_cat_row[k] = q_cat[i, k] if active else 0.0
        top = minus_inf
        total = 0.0
        n_k = log_weights.shape[0]
        for j0 in range(0, n_k, block_k):
            nb = imin(block_k, n_k - j0)
            load_tile(tile, block_k, j0, nb, keys_cont_t, keys_cat_t, log_weights, no_rows)
            cuda.syncthreads()
            if active:
                for jj in range(nb):
                    term = tile[weight_row * block_k + jj]
                    for c in range(dc):
                        if term == minus_inf:
                            break
                        d = q_cont_row[c] - tile[c * block_k + jj]
                        if cont_integrated[c]:
                            term += log_integrated_kernel(d, kernel)
                        else:
                            term += log_kernel(d, kernel)
                    for k in range(dk):
                        if term == minus_inf:
                            break
                        xk = tile[(dc + k) * block_k + jj]
                        if cat_integrated[k]:
                            term += log_category_cdf(
                                q_cat_row[k], xk, cat_kind[k], cat_lambda[k], cat_count[k]
                            )
                        else:
                            term += category_term(
                                xk,
                                q_cat_row[k],
                                cat_params[k, 0],
                                cat_params[k, 1],
                                cat_params[k, 2],
                            )
                    if term == minus_inf:
                        continue
                    if term > top:
                        total = total * math.exp(top - term) + 1.0
                        top = term
                    else:
                        total += math.exp(term - top)
            cuda.syncthreads()
        if active:
            out[i] = top + math.log(total) if total > 0.0 else minus_inf

    return log_kernel_sums_kernel


def sums_kernel(dc, dk, kernel):
    """The compiled sums kernel for dc continuous and dk categorical columns and a kernel."""
    args = (int(dc), int(dk), int(kernel))
    return compiled(("density_sums", *args), lambda: _make_sums_kernel(*args))


def _device_array(a, dtype=np.float64):
    """``a`` on the device: host arrays as C-contiguous ``dtype``, device arrays as they are."""
    return to_device(np.ascontiguousarray(a, dtype=dtype) if isinstance(a, np.ndarray) else a)


class _Keys:
    """The keys and the per-column arguments of the sums kernel, on the device once."""

    def __init__(self, keys_cont_t, keys_cat_t, cat_params, cat_kind, cat_lambda, cat_count, lw):
        self.keys_cont_t = _device_array(keys_cont_t)
        self.keys_cat_t = _device_array(keys_cat_t)
        self.cat_params = _device_array(np.asarray(cat_params, dtype=np.float64).reshape(-1, 3))
        self.cat_kind = _device_array(np.asarray(cat_kind), np.int64)
        self.cat_lambda = _device_array(np.asarray(cat_lambda))
        self.cat_count = _device_array(np.asarray(cat_count))
        self.log_weights = _device_array(lw)
        self.no_rows = to_device(np.zeros((0, 1)))

    def sums(self, q_cont, q_cat, cont_integrated, cat_integrated, kernel):
        """log_kernel_sums of these keys at the queries (host or device arrays), (n_q,)."""
        dc, dk = self.keys_cont_t.shape[0], self.keys_cat_t.shape[0]
        n_q = q_cont.shape[0]
        if n_q == 0:
            return np.empty(0)
        per_key = tile_floats(dc, dk, 0)
        block_k = tile_rows(per_key, 8)
        out = cuda.device_array(n_q, dtype=np.float64)
        args = (
            _device_array(q_cont),
            self.keys_cont_t,
            _device_array(q_cat),
            self.keys_cat_t,
            _device_array(np.asarray(cont_integrated, dtype=np.bool_), np.bool_),
            _device_array(np.asarray(cat_integrated, dtype=np.bool_), np.bool_),
            self.cat_params,
            self.cat_kind,
            self.cat_lambda,
            self.cat_count,
            self.log_weights,
            self.no_rows,
            block_k,
            out,
        )
        launch(sums_kernel(dc, dk, kernel), n_q, args, shared=per_key * block_k * 8)
        return out.copy_to_host()


def log_kernel_sums(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cont_integrated,
    cat_integrated,
    cat_params,
    cat_kind,
    cat_lambda,
    cat_count,
    log_weights,
    kernel,
):
    """The GPU twin of :func:`nbattn.kernels.density.log_kernel_sums` (same arguments,
    same result: log sum_j w_j prod_c A_c prod_k B_k per query, (n_q,) NumPy float64;
    -inf where every term is 0)."""
    keys = _Keys(keys_cont_t, keys_cat_t, cat_params, cat_kind, cat_lambda, cat_count, log_weights)
    return keys.sums(q_cont, q_cat, cont_integrated, cat_integrated, int(kernel))


# --------------------------------------------------------------------------- quantiles


def _mixture_cdf(joint, x_cont, x_cat, log_denominator, u, flags, kernel):
    """F(u_r | x_r) = exp(log N(u_r, x_r) - log D_r) for the rows given (host arrays)."""
    q_cont = np.ascontiguousarray(np.column_stack([u, x_cont]))
    numerator = joint.sums(q_cont, x_cat, *flags, kernel)
    with np.errstate(invalid="ignore"):
        return np.exp(numerator - log_denominator)


def conditional_quantile_roots(
    q_cont,
    keys_cont_t,
    q_cat,
    keys_cat_t,
    cat_params,
    log_weights,
    keys_y,
    levels,
    z,
    kernel,
    xtol,
):
    """The GPU twin of :func:`nbattn.kernels.density.conditional_quantile_roots`: the
    roots u of F(u | x_i) = tau (n_q, n_levels), NaN for a row that no key reaches; the
    sums on the GPU, the iteration on the host (module docstring)."""
    kernel = int(kernel)
    q_cont = np.ascontiguousarray(q_cont, dtype=np.float64)
    q_cat = np.ascontiguousarray(q_cat, dtype=np.float64)
    keys_y = np.ascontiguousarray(keys_y, dtype=np.float64)
    log_weights = np.ascontiguousarray(log_weights, dtype=np.float64)
    levels = np.asarray(levels, dtype=np.float64)
    z = np.asarray(z, dtype=np.float64)
    n_q, n_levels = levels.shape
    dc, dk = q_cont.shape[1], q_cat.shape[1]
    out = np.full((n_q, n_levels), np.nan)
    no_kind, no_float = np.zeros(dk, np.int64), np.zeros(dk)
    marginal = _Keys(keys_cont_t, keys_cat_t, cat_params, no_kind, no_float, no_float, log_weights)
    log_denominator = marginal.sums(q_cont, q_cat, np.zeros(dc, bool), np.zeros(dk, bool), kernel)
    rows = np.flatnonzero(log_denominator > -np.inf)
    if rows.size == 0 or n_levels == 0:
        return out
    joint_cont_t = np.vstack(
        [keys_y[None, :], np.asarray(keys_cont_t, dtype=np.float64).reshape(dc, keys_y.size)]
    )
    joint = _Keys(joint_cont_t, keys_cat_t, cat_params, no_kind, no_float, no_float, log_weights)
    flags = (np.arange(1 + dc) == 0, np.zeros(dk, bool))
    x_cont, x_cat, log_d = q_cont[rows], q_cat[rows], log_denominator[rows]
    reached = keys_y[log_weights > -np.inf]
    low_y, high_y = reached.min(), reached.max()

    def f(u, active, tau):
        return (
            _mixture_cdf(joint, x_cont[active], x_cat[active], log_d[active], u, flags, kernel)
            - tau
        )

    previous = np.full(rows.size, -np.inf)
    everyone = np.arange(rows.size)
    for level in range(n_levels):
        tau = levels[rows, level]
        lo = np.maximum(low_y + z[rows, level], previous)
        hi = np.maximum(high_y + z[rows, level], lo)
        ends = f(np.concatenate([lo, hi]), np.concatenate([everyone, everyone]), np.tile(tau, 2))
        f_lo, f_hi = ends[: rows.size], ends[rows.size :]
        side = np.zeros(rows.size, dtype=np.int64)
        going = np.ones(rows.size, dtype=bool)
        for step in range(QUANTILE_MAX_STEPS):
            width = hi - lo
            closed = width <= QUANTILE_ULPS * np.maximum(np.abs(lo), np.abs(hi))
            going &= ~((width <= xtol) | closed)
            low_above = going & (f_lo >= 0.0)
            hi[low_above] = lo[low_above]
            going &= ~low_above
            high_below = going & (f_hi <= 0.0)
            lo[high_below] = hi[high_below]
            going &= ~high_below
            active = np.flatnonzero(going)
            if active.size == 0:
                break
            a_lo, a_hi, fa_lo, fa_hi = lo[active], hi[active], f_lo[active], f_hi[active]
            with np.errstate(divide="ignore", invalid="ignore"):
                u = a_hi - fa_hi * (a_hi - a_lo) / (fa_hi - fa_lo)
            bisect = ~((a_lo < u) & (u < a_hi)) | (step % 4 == 3)
            u = np.where(bisect, 0.5 * (a_lo + a_hi), u)
            f_u = f(u, active, tau[active])
            below, above = active[f_u < 0.0], active[f_u > 0.0]
            hit = active[~((f_u < 0.0) | (f_u > 0.0))]  # 0 (or NaN): the CPU closes there
            f_hi[below[side[below] == -1]] *= 0.5
            f_lo[above[side[above] == 1]] *= 0.5
            lo[below], f_lo[below], side[below] = u[f_u < 0.0], f_u[f_u < 0.0], -1
            hi[above], f_hi[above], side[above] = u[f_u > 0.0], f_u[f_u > 0.0], 1
            lo[hit] = hi[hit] = u[~((f_u < 0.0) | (f_u > 0.0))]
        root = 0.5 * (lo + hi)
        out[rows, level] = root
        previous = root
    return out
