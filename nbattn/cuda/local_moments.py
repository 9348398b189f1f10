"""The weighted moment sums of the local-polynomial fit on the GPU and its small solve.

The twin of ``nbattn.kernels.local_moments``. One thread per query adds each
admissible pair to its moments with the online softmax (``moments_function``):
when the pair's score s exceeds the running maximum m, the sums so far are
rescaled by exp(m - s) and m = s; then, with w = exp(s - m),

    M_ab += w x_a x_b  (a <= b),   V_ao += w x_a y_o,
    dsum_c += w ds_c,  dysum_co += w ds_c y_o   (local-constant marginal effects),

ds_c = -s'(d_c). ``solve_function`` is the ridge-stabilised Cholesky solve,
written step for step like the CPU's ``solve`` so that both drop the same terms.
Sizes are compile-time constants, so the accumulators stay in registers.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .. import config
from .common import compiled, jit
from .local_pairs import dlog_kernel_function


def _make_moments(p, n_out, dc, dk, kernel, do_mfx):
    dlog_kernel = dlog_kernel_function(kernel)
    value_row = dc + dk + 1  # the values' first row in the tile (``load_tile``)
    minus_inf = -math.inf

    @jit(device=True, inline=True)
    def add_pair(s, m, x, tile, block_k, jj, q_cont_row, q_cat_row, sums):
        """Adds the pair of score ``s`` > -inf and design ``x`` (values in the tile's
        column ``jj``) to the sums (moments, rhs, dsum, dysum); returns the new maximum
        (the visitor of ``local_pairs.key_walk_function``; the query row is not read)."""
        moments, rhs, dsum, dysum = sums
        if s > m:
            if m > minus_inf:
                factor = math.exp(m - s)
                for a in range(p):
                    for b in range(a, p):
                        moments[a, b] *= factor
                    for o in range(n_out):
                        rhs[a, o] *= factor
                if do_mfx:
                    for c in range(dc):
                        dsum[c] *= factor
                        for o in range(n_out):
                            dysum[c, o] *= factor
            m = s
        w = math.exp(s - m)
        for a in range(p):
            wa = w * x[a]
            for b in range(a, p):
                moments[a, b] += wa * x[b]
            for o in range(n_out):
                rhs[a, o] += wa * tile[(value_row + o) * block_k + jj]
        if do_mfx:
            for c in range(dc):
                wd = -dlog_kernel(x[1 + c]) * w
                dsum[c] += wd
                for o in range(n_out):
                    dysum[c, o] += wd * tile[(value_row + o) * block_k + jj]
        return m

    return add_pair


def moments_function(p, n_out, dc, dk, kernel, do_mfx):
    """The device function ``add_pair`` for these compile-time sizes and flags."""
    args = (int(p), int(n_out), int(dc), int(dk), int(kernel), bool(do_mfx))
    return compiled(("local_moments", *args), lambda: _make_moments(*args))


def _make_solve(p, n_out):
    pivot_tol = float(config.LOCAL_PIVOT_TOL)

    @jit(device=True)
    def solve(moments, rhs, ridge, i, g, beta):
        """Solve (M + ridge diag(0, M_11, ...)) [g, beta] = [e_1, rhs] for query i.

        ``moments`` (p, p) symmetric and ``rhs`` (p, n_out) are normalised by l;
        writes g[i, :] and beta[i, :, :]. Cholesky with the CPU's pivot rule: a
        pivot not above ``config.LOCAL_PIVOT_TOL`` (read when compiled) of its
        (ridged) diagonal, or a zero diagonal, drops its term (coefficient 0).
        """
        a = cuda.local.array((p, p), dtype=np.float64)
        keep = cuda.local.array(p, dtype=np.int32)
        z = cuda.local.array(p, dtype=np.float64)
        for t in range(p):
            for u in range(p):
                a[t, u] = moments[t, u]
        for t in range(1, p):
            a[t, t] += ridge * a[t, t]
        for t in range(p):
            keep[t] = 1
            for u in range(t):
                if keep[u] == 0:
                    continue
                a[t, t] -= a[t, u] * a[t, u]
            diag_scale = moments[t, t] * (1.0 + ridge)
            if not (a[t, t] > pivot_tol * diag_scale) or not (diag_scale > 0.0):
                keep[t] = 0
                for v in range(t, p):
                    a[v, t] = 0.0
                continue
            a[t, t] = math.sqrt(a[t, t])
            for v in range(t + 1, p):
                acc = a[v, t]
                for u in range(t):
                    acc -= a[v, u] * a[t, u]
                a[v, t] = acc / a[t, t]
        for col in range(n_out + 1):
            for t in range(p):
                z[t] = 0.0
            for t in range(p):
                if keep[t] == 0:
                    continue
                if col == 0:
                    acc = 1.0 if t == 0 else 0.0
                else:
                    acc = rhs[t, col - 1]
                for u in range(t):
                    acc -= a[t, u] * z[u]
                z[t] = acc / a[t, t]
            for t in range(p - 1, -1, -1):
                if keep[t] == 0:
                    z[t] = 0.0
                    continue
                acc = z[t]
                for u in range(t + 1, p):
                    acc -= a[u, t] * z[u]
                z[t] = acc / a[t, t]
            if col == 0:
                for t in range(p):
                    g[i, t] = z[t]
            else:
                for t in range(p):
                    beta[i, t, col - 1] = z[t]

    return solve


def solve_function(p, n_out):
    """The device function ``solve`` for p terms and n_out outputs."""
    return compiled(("local_solve", int(p), int(n_out)), lambda: _make_solve(int(p), int(n_out)))
