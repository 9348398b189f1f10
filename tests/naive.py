"""Plain-NumPy references for every kernel: slow, obvious, float64.

CPU and GPU tests compare against the same functions here. They hold the full
queries x keys matrix, so keep the inputs small.
"""

from __future__ import annotations

import numpy as np


def softmax_rows(scores):
    """Row-wise softmax with the max subtracted; a row of all -inf gives zeros."""
    scores = np.asarray(scores, dtype=np.float64)
    row_max = scores.max(axis=-1, keepdims=True)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(scores - safe_max)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def gaussian_scores(queries, keys, bandwidth):
    """s_ij = -1/2 sum_d ((q_id - k_jd) / h_d)^2."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    h = np.broadcast_to(np.asarray(bandwidth, dtype=np.float64), (q.shape[1],))
    diff = (q[:, None, :] - k[None, :, :]) / h
    return -0.5 * np.sum(diff**2, axis=-1)


def nadaraya_watson_weights(queries, keys, bandwidth, exclude_self=False):
    scores = gaussian_scores(queries, keys, bandwidth)
    if exclude_self:
        np.fill_diagonal(scores, -np.inf)
    return softmax_rows(scores)


def nadaraya_watson(queries, keys, values, bandwidth, exclude_self=False):
    """sum_j softmax_j(s_ij) v_j, values (n_keys,) or (n_keys, n_outputs)."""
    weights = nadaraya_watson_weights(queries, keys, bandwidth, exclude_self)
    return weights @ np.asarray(values, dtype=np.float64)


def nadaraya_watson_lse(queries, keys, bandwidth, exclude_self=False):
    """log sum_j exp(s_ij)."""
    scores = gaussian_scores(queries, keys, bandwidth)
    if exclude_self:
        np.fill_diagonal(scores, -np.inf)
    m = scores.max(axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return safe + np.log(np.exp(scores - safe[:, None]).sum(axis=1))


def textbook_nadaraya_watson(queries, keys, values, bandwidth):
    """The seed's formula as written, K(q, k) / sum K: underflows to 0/0 far from the data."""
    k = np.exp(gaussian_scores(queries, keys, bandwidth))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (k @ np.asarray(values, dtype=np.float64)) / k.sum(axis=1)


# --- batch work (issue 7): the spread written by `nbattn predict --std` ---------------


def nadaraya_watson_std(queries, keys, values, bandwidth):
    """sqrt(sum_j w_ij (v_j - f_i)^2), the attention-weighted std of 1-D values."""
    weights = nadaraya_watson_weights(queries, keys, bandwidth)
    v = np.asarray(values, dtype=np.float64)
    f = weights @ v
    return np.sqrt(np.sum(weights * (v[None, :] - f[:, None]) ** 2, axis=1))


# ---------------------------------------------------------------- learned kernels (issue 3)


def _loo_weights(points_scaled):
    """softmax_{j != i}(-1/2 ||z_i - z_j||^2) for already-scaled points z (n, k)."""
    scores = gaussian_scores(points_scaled, points_scaled, 1.0)
    np.fill_diagonal(scores, -np.inf)
    return softmax_rows(scores)


def loo_loss(X, y, bandwidth=None, components=None):
    """1/(n p) sum_i ||f_-i(x_i) - y_i||^2 with the full n x n weight matrix."""
    X = np.asarray(X, dtype=np.float64)
    y2 = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
    z = X @ np.asarray(components).T if components is not None else X / bandwidth
    w = _loo_weights(z)
    return np.mean((w @ y2 - y2) ** 2)


def loo_grad(X, y, bandwidth=None, components=None):
    """The LOO loss gradient with respect to log h (d,) or L (k, d), from full matrices.

    dL/ds_ij = 2/(n p) w_ij sum_c r_ic (y_jc - f_ic), r = f - y; then
    ds_ij/dlog h_d = ((x_id - x_jd)/h_d)^2 and ds_ij/dL = -L (x_i - x_j)(x_i - x_j)^T.
    """
    X = np.asarray(X, dtype=np.float64)
    y2 = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
    n, p = y2.shape
    z = X @ np.asarray(components).T if components is not None else X / bandwidth
    w = _loo_weights(z)
    f = w @ y2
    r = f - y2
    dl_ds = 2.0 / (n * p) * w * (r @ y2.T - np.sum(r * f, axis=1, keepdims=True))
    delta = X[:, None, :] - X[None, :, :]
    if components is None:
        return np.einsum("ij,ijd->d", dl_ds, (delta / bandwidth) ** 2)
    outer = np.einsum("ij,ija,ijb->ab", dl_ds, delta, delta)
    return -np.asarray(components) @ outer


def weighted_spread(queries, keys, values, bandwidth):
    """(mean, std, n_eff) of Gaussian attention pooling with the full weight matrix."""
    w = nadaraya_watson_weights(queries, keys, bandwidth)
    v = np.asarray(values, dtype=np.float64)
    v2 = v.reshape(len(v), -1)
    mean = w @ v2
    var = w @ v2**2 - mean**2
    std = np.sqrt(np.maximum(var, 0.0))
    n_eff = 1.0 / np.sum(w**2, axis=1)
    if v.ndim == 1:
        return mean[:, 0], std[:, 0], n_eff
    return mean, std, n_eff


# ---------------------------------------------------------------------------
# Blocked (flash) attention: full-matrix scaled dot-product attention
# ---------------------------------------------------------------------------


def sdpa_scores(q, k, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """s_ij = scale q_i.k_j + b_j + slope (j - i), -inf above the diagonal if causal.

    q (..., L, E), k (..., S, E); key_bias broadcasts to (..., S), alibi_slopes to
    the leading dimensions. Causal is aligned at the top left (j <= i), as torch.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = scale * (q @ np.swapaxes(k, -1, -2))
    n_q, n_k = s.shape[-2:]
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if key_bias is not None:
        s = s + np.asarray(key_bias, dtype=np.float64)[..., None, :]
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=np.float64)[..., None, None]
        s = s + slopes * (j - i)
    if causal:
        s = np.where(j <= i, s, -np.inf)
    return s


def sdpa(q, k, v, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """(out, lse): softmax(s) v and log sum_j exp(s_ij); rows without keys -> 0, -inf."""
    s = sdpa_scores(q, k, causal, scale, key_bias, alibi_slopes)
    p = softmax_rows(s)
    m = s.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        lse = (safe + np.log(np.exp(s - safe).sum(axis=-1, keepdims=True)))[..., 0]
    return p @ np.asarray(v, dtype=np.float64), lse


def sdpa_backward(q, k, v, grad_out, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """(dq, dk, dv) of sdpa by the explicit formulas, with the full matrix P.

    dV = P^T dO, dP = dO V^T, dS_ij = P_ij (dP_ij - sum_l P_il dP_il),
    dQ = scale dS K, dK = scale dS^T Q (leading dimensions as given, no broadcasting).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    g = np.asarray(grad_out, dtype=np.float64)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    p = softmax_rows(sdpa_scores(q, k, causal, scale, key_bias, alibi_slopes))
    dv = np.swapaxes(p, -1, -2) @ g
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * (ds @ k)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q)
    return dq, dk, dv
