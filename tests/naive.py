"""Plain-NumPy references for every kernel: slow, obvious, float64.

CPU and GPU tests compare against the same functions here. They hold the full
queries x keys matrix, so keep the inputs small.
"""

from __future__ import annotations

import numpy as np


def softmax_rows(scores, dtype=np.float64):
    """Row-wise softmax with the max subtracted, in ``dtype``; a row of all -inf gives zeros."""
    scores = np.asarray(scores, dtype=dtype)
    row_max = scores.max(axis=-1, keepdims=True)
    safe_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.exp(scores - safe_max)
    total = e.sum(axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def logsumexp_rows(scores, dtype=np.float64):
    """log sum_j exp(s_ij) along the last axis, with the max subtracted, in ``dtype``; a row
    of all -inf gives -inf."""
    scores = np.asarray(scores, dtype=dtype)
    m = scores.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return (safe + np.log(np.exp(scores - safe).sum(axis=-1, keepdims=True)))[..., 0]


def softmax_grads(s, q, k, v, grad_out, scale, drop=None, tanh=None):
    """(dq, dk, dv) of out = (P o Z) V, P = softmax(s) along the last axis, s the scores
    scale q k^T (after a softcap c tanh(x / c) when ``tanh`` holds its tanh values, plus
    terms that do not depend on q and k), Z the dropout factors ``drop`` (ones if None):

    dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - rowsum(P o dP)) o (1 - tanh^2),
    dQ = scale dS K, dK = scale dS^T Q (leading dimensions as given, no broadcasting).
    """
    g = np.asarray(grad_out, dtype=np.float64)
    p = softmax_rows(s)
    z = 1.0 if drop is None else drop
    dv = np.swapaxes(p * z, -1, -2) @ g
    dp = (g @ np.swapaxes(v, -1, -2)) * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if tanh is not None:
        ds = ds * (1.0 - tanh**2)
    return scale * (ds @ k), scale * (np.swapaxes(ds, -1, -2) @ q), dv


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
    return logsumexp_rows(scores)


def textbook_nadaraya_watson(queries, keys, values, bandwidth):
    """The seed's formula as written, K(q, k) / sum K: underflows to 0/0 far from the data."""
    k = np.exp(gaussian_scores(queries, keys, bandwidth))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (k @ np.asarray(values, dtype=np.float64)) / k.sum(axis=1)


# --- batch work: the spread written by `nbattn predict --std` ---------------


def nadaraya_watson_std(queries, keys, values, bandwidth):
    """sqrt(sum_j w_ij (v_j - f_i)^2), the attention-weighted std of 1-D values."""
    weights = nadaraya_watson_weights(queries, keys, bandwidth)
    v = np.asarray(values, dtype=np.float64)
    f = weights @ v
    return np.sqrt(np.sum(weights * (v[None, :] - f[:, None]) ** 2, axis=1))


# ---------------------------------------------------------------- learned kernels


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


def loo_grad_sums_full(queries, points, values_t, resid, centers, lse):
    """``kernels.loo.loo_grad_full``'s sums with every query its own key (self_offset 0):

    M_ab = sum_i sum_{j != i} g_ij (x_ia - x_ja)(x_ib - x_jb),
    g_ij = w_ij sum_c r_ic (y_jc - f_ic),  w_ij = exp(s_ij - lse_i),  s_ij = -||z_i - z_j||^2

    for the score-space ``queries`` z (n, k), the ``points`` x (n, d), ``values_t`` y^T
    (p, n), ``resid`` r and ``centers`` f (n, p) and ``lse`` (n,), in float64.
    """
    z, x, y_t, r, f, lse = (np.asarray(a, dtype=np.float64)
                            for a in (queries, points, values_t, resid, centers, lse))  # fmt: skip
    w = np.exp(-((z[:, None, :] - z[None, :, :]) ** 2).sum(axis=-1) - lse[:, None])
    np.fill_diagonal(w, 0.0)
    g = w * np.einsum("ic,ijc->ij", r, y_t.T[None, :, :] - f[:, None, :])
    delta = x[:, None, :] - x[None, :, :]
    return np.einsum("ij,ija,ijb->ab", g, delta, delta)


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


def sdpa_scores(q, k, causal=False, scale=None, key_bias=None, alibi_slopes=None, dtype=np.float64):
    """s_ij = scale q_i.k_j + b_j + slope (j - i), -inf above the diagonal if causal,
    computed in ``dtype``.

    q (..., L, E), k (..., S, E); key_bias broadcasts to (..., S), alibi_slopes to
    the leading dimensions. Causal is aligned at the top left (j <= i), as torch.
    """
    q = np.asarray(q, dtype=dtype)
    k = np.asarray(k, dtype=dtype)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = dtype(scale) * (q @ np.swapaxes(k, -1, -2))
    n_q, n_k = s.shape[-2:]
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if key_bias is not None:
        s = s + np.asarray(key_bias, dtype=dtype)[..., None, :]
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, dtype=dtype)[..., None, None]
        s = s + slopes * (j - i)
    if causal:
        s = np.where(j <= i, s, -np.inf)
    return s


def sdpa(q, k, v, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """(out, lse): softmax(s) v and log sum_j exp(s_ij); rows without keys -> 0, -inf."""
    s = sdpa_scores(q, k, causal, scale, key_bias, alibi_slopes)
    return softmax_rows(s) @ np.asarray(v, dtype=np.float64), logsumexp_rows(s)


def sdpa_backward(q, k, v, grad_out, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """(dq, dk, dv) of sdpa by the explicit formulas (:func:`softmax_grads`), with the
    full matrix P: dV = P^T dO, dP = dO V^T, dS_ij = P_ij (dP_ij - sum_l P_il dP_il),
    dQ = scale dS K, dK = scale dS^T Q (leading dimensions as given, no broadcasting).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = sdpa_scores(q, k, causal, scale, key_bias, alibi_slopes)
    return softmax_grads(s, q, k, v, grad_out, scale)


# ---------------------------------------------------------------------------
# Attention mechanisms: softmax, scores, attention, multi-head,
# hierarchical attention, positional encodings. Loops and broadcasting, float64.
# ---------------------------------------------------------------------------


def softmax(x, axis=-1):
    """softmax along axis; a slice of all -inf gives zeros."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    return np.moveaxis(softmax_rows(x), -1, axis)


def log_softmax(x, axis=-1):
    """x - max - log sum exp(x - max); a slice of all -inf stays -inf."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)
    m = x.max(axis=-1, keepdims=True)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = safe + np.log(np.exp(x - safe).sum(axis=-1, keepdims=True))
        out = np.where(np.isfinite(lse), x - lse, -np.inf)
    return np.moveaxis(out, -1, axis)


def mask_to_bias(mask):
    """Boolean mask (True = attend) -> 0 / -inf; float masks pass through."""
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return np.where(mask, 0.0, -np.inf)
    return mask.astype(np.float64)


def masked_softmax(scores, valid_lens):
    """d2l's masked softmax, but a valid length of 0 gives zeros: row loop."""
    x = np.asarray(scores, dtype=np.float64)
    lens = np.asarray(valid_lens)
    lens = lens.reshape(lens.shape + (1,) * (x.ndim - 1 - lens.ndim))
    lens = np.broadcast_to(lens, x.shape[:-1])
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        n = int(lens[idx])
        if n:
            out[idx][:n] = softmax_rows(x[idx][:n])
    return out


def additive_scores(q, k, W, U, v):
    """v^T tanh(W k_j + U q_i), materialising the (..., L, S, H) tensor."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    uq = q @ np.asarray(U, dtype=np.float64).T  # (..., L, H)
    wk = k @ np.asarray(W, dtype=np.float64).T  # (..., S, H)
    return np.tanh(uq[..., :, None, :] + wk[..., None, :, :]) @ np.asarray(v, dtype=np.float64)


def dot_scores(q, k):
    """sum_e q_ie k_je, as an explicit sum over broadcast products."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    return (q[..., :, None, :] * k[..., None, :, :]).sum(axis=-1)


def scaled_dot_scores(q, k, scale=None):
    q = np.asarray(q, dtype=np.float64)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    return dot_scores(q, k) * scale


def bilinear_scores(q, k, W=None, U=None, V=None):
    """k^T W q, or (U k)^T (V q) via W = U^T V."""
    if W is None:
        W = np.asarray(U, dtype=np.float64).T @ np.asarray(V, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    return np.einsum("...je,ef,...if->...ij", k, np.asarray(W, dtype=np.float64), q)


def gaussian_attention_scores(q, k, bandwidth=1.0):
    """-1/2 sum_d ((q_d - k_d) / h_d)^2 with batch dimensions."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    h = np.asarray(bandwidth, dtype=np.float64)
    diff = (q[..., :, None, :] - k[..., None, :, :]) / h
    return -0.5 * (diff**2).sum(axis=-1)


def attention(
    q, k, v, scores_fn=scaled_dot_scores, mask=None, causal=False, mode="soft", random_state=None
):
    """Textbook attention: scores, masks, softmax, then mode. Returns (out, weights)."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    s = scores_fn(q, k)
    L, S = s.shape[-2:]
    if mask is not None:
        s = s + mask_to_bias(mask)
    if causal:
        s = np.where(np.tril(np.ones((L, S), dtype=bool)), s, -np.inf)
    w = softmax_rows(s)
    batch = np.broadcast_shapes(s.shape[:-2], v.shape[:-2])
    w = np.broadcast_to(w, batch + (L, S))
    v = np.broadcast_to(v, batch + v.shape[-2:])
    if mode == "soft":
        return w @ v, w
    rng = np.random.default_rng(random_state) if mode == "sample" else None
    u = rng.random(batch + (L,)) if mode == "sample" else None
    s = np.broadcast_to(s, batch + (L, S))
    out = np.zeros(batch + (L, v.shape[-1]))
    onehot = np.zeros(batch + (L, S))
    for idx in np.ndindex(*batch, L):
        row = w[idx]
        if row.sum() == 0:
            continue
        if mode == "hard":
            j = int(np.argmax(s[idx]))
        else:
            cdf = np.cumsum(row)
            j = int(np.searchsorted(cdf, u[idx] * cdf[-1], side="right"))
            j = min(j, int(np.nonzero(row > 0)[0][-1]))
        onehot[idx + (j,)] = 1.0
        out[idx] = v[idx[:-1] + (j,)]
    return out, onehot


def multi_head_attention(query, key, value, num_heads, wq, wk, wv, bq, bk, bv, wo, bo, mask=None):
    """Per-head loop: project, attend with the scaled dot score, concatenate, project.

    Returns (out, per-head weights (..., H, L, S)).
    """
    query = np.asarray(query, dtype=np.float64)
    key = np.asarray(key, dtype=np.float64)
    value = np.asarray(value, dtype=np.float64)
    E = wq.shape[0]
    d = E // num_heads
    Q = query @ wq.T + bq
    K = key @ wk.T + bk
    V = value @ wv.T + bv
    heads, weights = [], []
    for h in range(num_heads):
        sl = slice(h * d, (h + 1) * d)
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim >= 3:  # (..., H or 1, L, S): this head's slice
                m = m[..., h if m.shape[-3] == num_heads else 0, :, :]
        o, w = attention(Q[..., sl], K[..., sl], V[..., sl], mask=m)
        heads.append(o)
        weights.append(w)
    return np.concatenate(heads, axis=-1) @ wo.T + bo, np.stack(weights, axis=-3)


def hierarchical_attention(x, segment_ids, item_query, segment_query):
    """Two-level pooling with the scaled dot score: loops over segments."""
    x = np.asarray(x, dtype=np.float64)
    labels = np.unique(segment_ids)
    segs, item_w = [], np.zeros(len(x))
    for g in labels:
        idx = np.nonzero(np.asarray(segment_ids) == g)[0]
        s = x[idx] @ item_query / np.sqrt(x.shape[1])
        a = np.exp(s - s.max())
        a /= a.sum()
        item_w[idx] = a
        segs.append(a @ x[idx])
    segs = np.array(segs)
    s = segs @ segment_query / np.sqrt(segs.shape[1])
    b = np.exp(s - s.max())
    b /= b.sum()
    return b @ segs, segs, item_w, b


def sinusoidal(n, d, base=10000.0):
    """P[i, 2j] = sin(i / base^(2j/d)), P[i, 2j+1] = cos(same), element by element."""
    P = np.zeros((n, d))
    for i in range(n):
        for c in range(d):
            angle = i / base ** ((c - c % 2) / d)
            P[i, c] = np.sin(angle) if c % 2 == 0 else np.cos(angle)
    return P


def rope(x, positions=None, base=10000.0, interleaved=False):
    """Rotate each feature pair by a 2x2 rotation matrix, position by position."""
    x = np.asarray(x, dtype=np.float64)
    L, D = x.shape[-2:]
    pos = np.arange(L) if positions is None else np.asarray(positions, dtype=np.float64)
    out = np.array(x)
    for i in range(L):
        for j in range(D // 2):
            theta = pos[i] * base ** (-2.0 * j / D)
            a, b = (2 * j, 2 * j + 1) if interleaved else (j, j + D // 2)
            rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
            pair = np.stack([x[..., i, a], x[..., i, b]], axis=-1) @ rot.T
            out[..., i, a], out[..., i, b] = pair[..., 0], pair[..., 1]
    return out


def alibi_slopes(n):
    """Press et al.'s reference get_slopes, written out recursively."""

    def pow2(m):
        start = 2 ** (-(2 ** -(np.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if np.log2(n).is_integer():
        return np.array(pow2(n))
    closest = 2 ** int(np.floor(np.log2(n)))
    return np.array(pow2(closest) + list(alibi_slopes(2 * closest)[0::2][: n - closest]))


def alibi_bias(num_heads, L, S):
    slopes = alibi_slopes(num_heads)
    out = np.zeros((num_heads, L, S))
    for h in range(num_heads):
        for i in range(L):
            for j in range(S):
                out[h, i, j] = -slopes[h] * abs(i - j)
    return out


def relative_position_bias(table, L, S):
    """b_ij = table[clip(j - i, -K, K) + K] by loops; table (2K+1,) or (2K+1, H)."""
    table = np.asarray(table, dtype=np.float64)
    K = (table.shape[0] - 1) // 2
    out = np.zeros((L, S) + table.shape[1:])
    for i in range(L):
        for j in range(S):
            out[i, j] = table[min(max(j - i, -K), K) + K]
    return out if table.ndim == 1 else np.moveaxis(out, -1, 0)


# ---------------------------------------------------------------------------
# Extended-range references (np.longdouble, x87 80-bit on x86: range ~1e4932),
# for inputs near the float64 limits where a float64 reference would overflow.
# ---------------------------------------------------------------------------


def softmax_extended(scores):
    """Row-wise softmax in long double (the sums of huge scores and masks cannot overflow)."""
    return softmax_rows(scores, dtype=np.longdouble)


def sdpa_extended(q, k, v, causal=False, scale=None, key_bias=None, alibi_slopes=None):
    """(out, lse) of scaled dot-product attention computed in long double."""
    s = sdpa_scores(q, k, causal, scale, key_bias, alibi_slopes, dtype=np.longdouble)
    out = softmax_extended(s) @ np.asarray(v, dtype=np.longdouble)
    return out.astype(np.float64), logsumexp_rows(s, dtype=np.longdouble).astype(np.float64)


# ------------------------------------------------ exact at extreme magnitudes


def _exact_scores(queries, keys, bandwidth):
    """s_ij = -1/2 sum_d ((q_id - k_jd) / h_d)^2 as exact fractions of the float inputs."""
    from fractions import Fraction

    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    q = q[:, None] if q.ndim == 1 else q
    k = k[:, None] if k.ndim == 1 else k
    h = np.broadcast_to(np.asarray(bandwidth, dtype=np.float64), (q.shape[1],))
    inv_2h2 = [Fraction(1, 2) / (Fraction(float(hd)) ** 2) for hd in h]
    qf = [[Fraction(float(v)) for v in row] for row in q]
    kf = [[Fraction(float(v)) for v in row] for row in k]
    return [[-sum((a - b) ** 2 * c for a, b, c in zip(qi, kj, inv_2h2)) for kj in kf] for qi in qf]


def nadaraya_watson_exact_weights(queries, keys, bandwidth, exclude_self=False):
    """softmax_j(s_ij) with the scores and their gaps to the row's best exact.

    Scale-safe: nothing overflows or cancels before the exponential, so a
    query far from every key gets its nearest key's weight 1 (ties share it).
    Only exp(gap) is rounded; a gap below -2000 weighs exactly 0. Small
    inputs only (Python fractions).
    """
    import math

    rows = []
    for i, row in enumerate(_exact_scores(queries, keys, bandwidth)):
        admissible = [j for j in range(len(row)) if not (exclude_self and j == i)]
        w = np.zeros(len(row))
        if admissible:
            best = max(row[j] for j in admissible)
            for j in admissible:
                gap = row[j] - best
                w[j] = 0.0 if gap < -2000 else math.exp(float(gap))
            w /= math.fsum(w)
        rows.append(w)
    return np.array(rows)


def nadaraya_watson_exact(queries, keys, values, bandwidth, exclude_self=False):
    """sum_j softmax_j(s_ij) v_j from the exact weights; values (n_keys,) or (n_keys, p)."""
    w = nadaraya_watson_exact_weights(queries, keys, bandwidth, exclude_self)
    v = np.asarray(values, dtype=np.float64)
    v2 = v[:, None] if v.ndim == 1 else v
    # scale the values by a power of two so that the sums cannot overflow
    big = np.abs(v2).max() if v2.size else 0.0
    scale = np.ldexp(1.0, int(np.frexp(big)[1])) if big > 0 else 1.0
    out = (w @ (v2 / scale)) * scale
    return out[:, 0] if v.ndim == 1 else out


def weighted_spread_exact(queries, keys, values, bandwidth):
    """(mean, std, n_eff) of the exact weights; deviations scaled like the values."""
    w = nadaraya_watson_exact_weights(queries, keys, bandwidth)
    v = np.asarray(values, dtype=np.float64)
    v2 = v[:, None] if v.ndim == 1 else v
    big = np.abs(v2).max()
    scale = np.ldexp(1.0, int(np.frexp(big)[1])) if big > 0 else 1.0
    vs = v2 / scale
    mean = w @ vs
    var = np.einsum("ij,ijc->ic", w, (vs[None, :, :] - mean[:, None, :]) ** 2)
    out = (mean * scale, np.sqrt(var) * scale, 1.0 / np.sum(w**2, axis=1))
    if v.ndim == 1:
        return out[0][:, 0], out[1][:, 0], out[2]
    return out


def loo_loss_exact(X, y, bandwidth):
    """Leave-one-out MSE from the exact weights (scale-safe twin of loo_loss)."""
    X = np.asarray(X, dtype=np.float64)
    X = X[:, None] if X.ndim == 1 else X
    y = np.asarray(y, dtype=np.float64)
    y2 = y[:, None] if y.ndim == 1 else y
    pred = nadaraya_watson_exact(X, X, y2, bandwidth, exclude_self=True)
    return float(np.mean((pred - y2) ** 2))


# --------------------------------------------------------------------------- local polynomials
def product_kernel_matrix(queries, keys, widths, var_type, n_categories, kernel="gaussian"):
    """K[i, j] = prod_c K_c(q_ic, k_jc), the mixed-type product kernel (constants dropped).

    Continuous (u = (k - q) / h): gaussian exp(-u^2/2), epanechnikov max(1 - u^2, 0),
    tricube max(1 - |u|^3, 0)^3; unordered (Aitchison-Aitken) 1 - l or l / (c - 1);
    ordered (Wang-van Ryzin) 1 - l or (1 - l)/2 l^|x - y|. A NaN on either side
    makes its column's factor 1.
    """
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    k = np.atleast_2d(np.asarray(keys, dtype=np.float64))
    K = np.ones((q.shape[0], k.shape[0]))
    for c, kind in enumerate(var_type):
        a, b = q[:, c][:, None], k[:, c][None, :]
        lam = widths[c]
        if kind == "c":
            u = (b - a) / lam
            if kernel == "gaussian":
                f = np.exp(-0.5 * u**2)
            elif kernel == "epanechnikov":
                f = np.maximum(1.0 - u**2, 0.0)
            else:
                f = np.maximum(1.0 - np.abs(u) ** 3, 0.0) ** 3
        elif kind == "u":
            n_cat = n_categories[c]
            other = lam / (n_cat - 1) if n_cat > 1 else 0.0
            f = np.where(a == b, 1.0 - lam, other)
        else:
            with np.errstate(invalid="ignore"):
                f = np.where(a == b, 1.0 - lam, 0.5 * (1.0 - lam) * lam ** np.abs(a - b))
        f = np.where(np.isnan(a) | np.isnan(b), 1.0, f)
        K = K * f
    return K


def local_design(queries, keys, var_type, degree):
    """x_ij = (1, k_j - q_i, [(k_jc - q_ic)(k_jc' - q_ic') for c <= c']) over the 'c'
    columns, a NaN difference counted as 0; shape (n_q, n_k, p)."""
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    k = np.atleast_2d(np.asarray(keys, dtype=np.float64))
    cont = [c for c, kind in enumerate(var_type) if kind == "c"]
    diff = k[None, :, cont] - q[:, None, cont]
    diff = np.where(np.isnan(diff), 0.0, diff)
    cols = [np.ones(diff.shape[:2])]
    if degree >= 1:
        cols += [diff[:, :, c] for c in range(len(cont))]
    if degree >= 2:
        for c in range(len(cont)):
            for c2 in range(c, len(cont)):
                cols.append(diff[:, :, c] * diff[:, :, c2])
    return np.stack(cols, axis=-1)


def local_design_condition(queries, keys, weights, var_type, degree):
    """Per query, the condition number of its local design M = sum_j w_ij x_ij x_ij^T
    (``weights`` (n_q, n_k) as :func:`local_polynomial_exact` returns them) scaled to a
    unit diagonal (Jacobi); 1 for a query that no key weighs. Above about 1e6 a design
    has no well-determined fit: its nearly dependent terms are dropped or kept by
    rounding, so two passes that should agree may not."""
    design = local_design(queries, keys, var_type, degree)
    cond = np.ones(design.shape[0])
    for i in range(design.shape[0]):
        if not weights[i].any():
            continue
        M = np.einsum("j,ja,jb->ab", weights[i], design[i], design[i])
        diag = np.sqrt(np.maximum(np.diag(M), 1e-300))
        cond[i] = np.linalg.cond(M / np.outer(diag, diag))
    return cond


def local_polynomial_exact(
    queries,
    keys,
    values,
    widths,
    var_type,
    n_categories,
    degree,
    kernel="gaussian",
    sample_weight=None,
    exclude_self=False,
    ridge=1e-12,
    pivot_tol=1e-8,
):
    """(fit, coefficients, weights): the weighted least-squares local polynomial per query,

        (M / l + ridge diag(0, M_11/l, ...)) beta = V / l,  M = sum_j K_ij w_j x_ij x_ij^T,

    solved with numpy in raw units; a term whose pivot (Schur complement on the kept
    earlier terms) is at most ``pivot_tol`` times its diagonal entry is dropped
    (coefficient 0). A query whose weights are all 0 takes the value of its nearest admissible key
    (fewest unequal categories, then smallest sum of squared scaled differences).
    """
    q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
    k = np.atleast_2d(np.asarray(keys, dtype=np.float64))
    y = np.asarray(values, dtype=np.float64)
    y2 = y[:, None] if y.ndim == 1 else y
    K = product_kernel_matrix(q, k, widths, var_type, n_categories, kernel)
    w = np.ones(k.shape[0]) if sample_weight is None else np.asarray(sample_weight, float)
    K = K * w[None, :]
    if exclude_self:
        np.fill_diagonal(K, 0.0)
    X = local_design(q, k, var_type, degree)
    n_q, p = q.shape[0], X.shape[2]
    fit = np.zeros((n_q, y2.shape[1]))
    coef = np.zeros((n_q, p, y2.shape[1]))
    weights = np.zeros_like(K)
    cont = [c for c, kind in enumerate(var_type) if kind == "c"]
    for i in range(n_q):
        total = K[i].sum()
        if not total > 0:
            admissible = np.flatnonzero(w > 0)
            if exclude_self:
                admissible = admissible[admissible != i]
            if admissible.size == 0:
                continue
            cat = [c for c, kind in enumerate(var_type) if kind != "c"]
            mis = np.zeros(admissible.size)
            for c in cat:
                a, b = q[i, c], k[admissible, c]
                mis += (a != b) & ~np.isnan(b) & ~np.isnan(a)
            d = (k[admissible][:, cont] - q[i, cont]) / np.asarray(widths)[cont]
            dist = np.nansum(np.where(np.isnan(d), 0.0, d) ** 2, axis=1)
            order = np.lexsort((np.arange(admissible.size), dist, mis))
            j = admissible[order[0]]
            fit[i] = y2[j]
            coef[i, 0] = y2[j]
            weights[i, j] = 1.0
            continue
        p_i = K[i] / total
        weights[i] = p_i
        M = np.einsum("j,ja,jb->ab", p_i, X[i], X[i])
        V = np.einsum("j,ja,jo->ao", p_i, X[i], y2)
        A = M + ridge * np.diag(np.r_[0.0, np.diag(M)[1:]])
        keep = np.zeros(p, dtype=bool)
        keep[0] = True
        for t in range(1, p):  # drop a term whose Schur complement is below tol * A_tt
            S = np.flatnonzero(keep)
            pivot = A[t, t] - A[t, S] @ np.linalg.solve(A[np.ix_(S, S)], A[S, t])
            keep[t] = A[t, t] > 0 and pivot > pivot_tol * A[t, t]
        sol = np.linalg.solve(A[np.ix_(keep, keep)], V[keep])
        coef[i, keep] = sol
        fit[i] = sol[0]
    if y.ndim == 1:
        return fit[:, 0], coef[:, :, 0], weights
    return fit, coef, weights


def local_equivalent_weights(queries, keys, widths, var_type, n_categories, degree, **kwargs):
    """l_ij with fit_i = sum_j l_ij y_j (the equivalent kernel), from the exact solve."""
    k = np.atleast_2d(np.asarray(keys, dtype=np.float64))
    eye = np.eye(k.shape[0])
    fit, _, _ = local_polynomial_exact(
        queries, keys, eye, widths, var_type, n_categories, degree, **kwargs
    )
    return fit


def local_loo_loss_exact(X, y, widths, var_type, n_categories, degree, **kwargs):
    """Mean squared leave-one-out error of local_polynomial_exact (optionally weighted)."""
    weights = kwargs.get("sample_weight")
    fit, _, _ = local_polynomial_exact(
        X, X, y, widths, var_type, n_categories, degree, exclude_self=True, **kwargs
    )
    y2 = np.asarray(y, float).reshape(fit.shape)
    err = (fit - y2) ** 2
    err = err.reshape(err.shape[0], -1).sum(axis=1)
    w = np.ones(err.shape[0]) if weights is None else np.asarray(weights, float)
    return float(err @ (w / w.sum()))


def loo_loss_and_grad_rows(X, y, n_rows, bandwidth=None, components=None):
    """The LOO loss of the first ``n_rows`` rows, each left out and predicted from all the
    other rows, and its gradient (log h (d,) or L (k, d)), from full matrices:

    L_m = 1/(m p) sum_{i < m} ||f_-i(x_i) - y_i||^2.
    """
    X = np.asarray(X, dtype=np.float64)
    y2 = np.asarray(y, dtype=np.float64).reshape(len(X), -1)
    p = y2.shape[1]
    z = X @ np.asarray(components).T if components is not None else X / bandwidth
    w = _loo_weights(z)[:n_rows]
    f = w @ y2
    r = f - y2[:n_rows]
    loss = np.sum(r**2) / (n_rows * p)
    dl_ds = 2.0 / (n_rows * p) * w * (r @ y2.T - np.sum(r * f, axis=1, keepdims=True))
    delta = X[:n_rows, None, :] - X[None, :, :]
    if components is None:
        return loss, np.einsum("ij,ijd->d", dl_ds, (delta / bandwidth) ** 2)
    outer = np.einsum("ij,ija,ijb->ab", dl_ds, delta, delta)
    return loss, -np.asarray(components) @ outer


def attention_bottom_right(
    q, k, v, causal=False, scale=None, window=None, softcap=None, bottom_right=True
):
    """Dense attention of one sequence with GQA, windows and softcap: returns (out, lse).

    q (H, L, E), k (H_kv, S, E), v (H_kv, S, Ev); query head h reads kv head
    h // (H / H_kv). Query i sits at position p = i + S - L (``bottom_right``)
    or p = i, and admits key j iff j <= p (causal) and p - left <= j <= p + right
    (``window`` = (left, right), None sides unbounded). Scores
    s = scale q.k, then c tanh(s / c) with ``softcap`` c. Rows with no key: 0, -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    H, L, E = q.shape
    n_rep = H // k.shape[0]
    k = np.repeat(k, n_rep, axis=0)
    v = np.repeat(v, n_rep, axis=0)
    S = k.shape[1]
    scale = 1.0 / np.sqrt(E) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    p = np.arange(L)[:, None] + (S - L if bottom_right else 0)
    j = np.arange(S)[None, :]
    ok = np.ones((L, S), dtype=bool)
    if causal:
        ok &= j <= p
    if window is not None:
        left, right = window
        if left is not None:
            ok &= j >= p - left
        if right is not None:
            ok &= j <= p + right
    s = np.where(ok, s, -np.inf)
    out = np.zeros((H, L, v.shape[-1]))
    lse = np.full((H, L), -np.inf)
    if S == 0:
        return out, lse
    return softmax_rows(s) @ v, logsumexp_rows(s)


# ---------------------------------------------------------------------------
# Flash attention features: masks, grouped heads, windows, alignment, softcap,
# dropout -- full matrices in float64, the formulas written out.
# ---------------------------------------------------------------------------


def dropout_keep(seed, counter, threshold):
    """The dropout decision of one weight, in Python integers (the spec's definition).

    z = seed + (counter + 1) 0x9E3779B97F4A7C15, then the SplitMix64 finaliser;
    keep iff (z >> 40) >= threshold (all arithmetic modulo 2**64).
    """
    mask = 2**64 - 1
    z = (int(seed) + (int(counter) + 1) * 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 40) >= int(threshold)


def dropout_factors(seed, n_bh, n_q, n_k, dropout_p):
    """(BH, L, S) dropout factors: 1 / (1 - p) where kept, 0 where dropped (NumPy uint64)."""
    with np.errstate(over="ignore"):
        counter = np.arange(n_bh * n_q * n_k, dtype=np.uint64).reshape(n_bh, n_q, n_k)
        z = np.uint64(seed) + (counter + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    threshold = np.uint64(round(dropout_p * 2**24))
    return np.where((z >> np.uint64(40)) >= threshold, 1.0 / (1.0 - dropout_p), 0.0)


def band_mask(n_q, n_k, causal=False, window=None, alignment="top_left"):
    """(L, S) boolean: key j admissible for query i (causal / window, aligned)."""
    offset = n_k - n_q if alignment == "bottom_right" else 0
    d = np.arange(n_k)[None, :] - np.arange(n_q)[:, None] - offset
    ok = np.ones((n_q, n_k), dtype=bool)
    if causal:
        ok &= d <= 0
    if window is not None:
        left, right = window
        if left is not None:
            ok &= d >= -left
        if right is not None:
            ok &= d <= right
    return ok


def _flash_parts(
    q,
    k,
    v,
    mask=None,
    causal=False,
    scale=None,
    window=None,
    alignment="top_left",
    softcap=None,
    enable_gqa=False,
):
    """The options of :func:`flash_features` and :func:`flash_features_backward`, applied:
    (q, k, v) in float64 with grouped heads repeated, the masked, capped scores s, the
    tanh of the scaled scores (None without a cap) and the scale."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k = np.repeat(k, group, axis=-3)
        v = np.repeat(v, group, axis=-3)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    raw = scale * (q @ np.swapaxes(k, -1, -2))
    th = np.tanh(raw / softcap) if softcap is not None else None
    s = softcap * th if softcap is not None else raw
    if mask is not None:
        m = np.asarray(mask)
        s = s + (np.where(m, 0.0, -np.inf) if m.dtype == bool else m.astype(np.float64))
    n_q, n_k = s.shape[-2:]
    s = np.where(band_mask(n_q, n_k, causal, window, alignment), s, -np.inf)
    return q, k, v, s, th, scale


def flash_features(q, k, v, dropout=None, **options):
    """(out, lse) of softmax(cap(scale q k^T) + mask) (o dropout) v, full matrices.

    ``options``: mask, causal, scale, window, alignment, softcap and enable_gqa, as
    flash attention takes them (defaults in :func:`_flash_parts`).
    cap(x) = softcap tanh(x / softcap); ``dropout`` (..., L, S) factors (0 or
    1/(1-p)) multiply the weights after the softmax; lse is before dropout.
    Rows without an admissible key: zeros and -inf.
    """
    q, k, v, s, _, _ = _flash_parts(q, k, v, **options)
    p = softmax_rows(s)
    if dropout is not None:
        p = p * dropout
    return p @ v, logsumexp_rows(s)


def flash_features_backward(q, k, v, grad_out, dropout=None, **options):
    """(dq, dk, dv) of :func:`flash_features` (the same ``dropout`` and ``options``) by the
    explicit formulas.

    dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - rowsum(P o dP)) o (1 - tanh^2),
    dQ = scale dS K, dK = scale dS^T Q; with grouped heads dK, dV are summed over
    each group.
    """
    q0, k0 = np.asarray(q), np.asarray(k)
    q, k, v, s, th, scale = _flash_parts(q, k, v, **options)
    dq, dk, dv = softmax_grads(s, q, k, v, grad_out, scale, drop=dropout, tanh=th)
    if options.get("enable_gqa", False) and k0.shape[-3] != q0.shape[-3]:
        group = q0.shape[-3] // k0.shape[-3]
        shape = dk.shape[:-3] + (k0.shape[-3], group) + dk.shape[-2:]
        dk = dk.reshape(shape).sum(axis=-3)
        dv = dv.reshape(dv.shape[:-3] + (k0.shape[-3], group) + dv.shape[-2:]).sum(axis=-3)
    return dq, dk, dv


# ------------------------------------------------ flash kernels' layout (slices, band, drop)


def _slice_scores(q, k, kv_index, scale, bias, band, softcap, slopes):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)[np.asarray(kv_index)]
    s = scale * (q @ np.swapaxes(k, -1, -2))
    th = np.zeros_like(s)
    if softcap is not None:
        th = np.tanh(s / softcap)
        s = softcap * th
    n_q, n_k = s.shape[-2:]
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    if slopes is not None:
        s = s + np.asarray(slopes, dtype=np.float64)[:, None, None] * (j - i)
    offset, left, right = band
    inside = (j - i - offset >= -left) & (j - i - offset <= right)
    return np.where(inside, s, -np.inf), th


def flash_slices(q, k, v, kv_index, scale, bias=None, band=(0, 10**9, 10**9), softcap=None,
                 slopes=None, drop=None):  # fmt: skip
    """(out, lse) of attention on the flash kernels' layout, with the full score matrix.

    q (BH, L, E); k, v (BKV, S, .) read by query slice bh at kv_index[bh]; bias
    (BH, L, S) added after the softcap c tanh(s / c) (-inf excludes); slopes (BH,)
    add slope (j - i); band (offset, left, right) admits i + offset - left <= j <=
    i + offset + right; drop (BH, L, S) multiplies the weights after the softmax.
    """
    s, _ = _slice_scores(q, k, kv_index, scale, bias, band, softcap, slopes)
    p = softmax_rows(s)
    if drop is not None:
        p = p * drop
    return p @ np.asarray(v, dtype=np.float64)[np.asarray(kv_index)], logsumexp_rows(s)


def flash_slices_backward(q, k, v, grad_out, kv_index, scale, bias=None, band=(0, 10**9, 10**9),
                          softcap=None, slopes=None, drop=None):  # fmt: skip
    """(dq, dk, dv) of :func:`flash_slices` by the explicit formulas: with P the softmax,
    Z the dropout factors, dV = (P o Z)^T dO, dP = (dO V^T) o Z, dS = P o (dP - rowsum(P o
    dP)) o (1 - tanh^2), dQ = scale dS K, dK = scale dS^T Q (dk, dv summed per K/V slice)."""
    kv_index = np.asarray(kv_index)
    q = np.asarray(q, dtype=np.float64)
    vv = np.asarray(v, dtype=np.float64)[kv_index]
    kk = np.asarray(k, dtype=np.float64)[kv_index]
    s, th = _slice_scores(q, k, kv_index, scale, bias, band, softcap, slopes)
    tanh = th if softcap is not None else None
    dq, dk_slices, dv_slices = softmax_grads(s, q, kk, vv, grad_out, scale, drop=drop, tanh=tanh)
    dk = np.zeros(np.shape(k))
    dv = np.zeros(np.shape(v))
    np.add.at(dk, kv_index, dk_slices)
    np.add.at(dv, kv_index, dv_slices)
    return dq, dk, dv


# ------------------------------------------------------------------ 1-D boxed Hermite series
def hermite_functions(s, n_terms):
    """h_k(s) = H_k(s) exp(-s^2), k < n_terms (physicists' Hermite polynomials), shape
    (n_terms, len(s)), by numpy.polynomial.hermite (one basis polynomial at a time)."""
    from numpy.polynomial import hermite

    s = np.asarray(s, dtype=np.float64)
    return np.array(
        [hermite.hermval(s, np.eye(n_terms)[k]) * np.exp(-s * s) for k in range(n_terms)]
    )


def loo_sse_boxed_1d(zs, values_t, targets, rows, half_width, n_terms, reach):
    """The boxed Hermite series of kernels.loo_1d.loo_squared_error_boxed_1d for every row of
    ``rows`` (no fallback): box of width 2 r from zs[0], weights
    sum_k (z_i - c)^k / k! h_k(z_j - c) over keys within ``reach`` of the centre c,
    the own key (1, v_i) subtracted. Returns the per-row squared errors."""
    from math import factorial

    zs = np.asarray(zs, dtype=np.float64)
    v = np.asarray(values_t, dtype=np.float64)
    out = []
    for i in rows:
        centre = zs[0] + 2 * half_width * (np.floor((zs[i] - zs[0]) / (2 * half_width)) + 0.5)
        near = np.abs(zs - centre) <= reach
        h = hermite_functions(zs[near] - centre, n_terms)
        t = zs[i] - centre
        coef = np.array([t**k / factorial(k) for k in range(n_terms)])
        weights = coef @ h
        total = weights.sum() - 1.0
        f = (v[:, near] @ weights - v[:, i]) / total
        out.append(np.sum((f - targets[i]) ** 2))
    return np.array(out)


# ------------------------------------------------------------- LOO gradient, differences first


def loo_grad_differences(X, y, bandwidth=None, components=None, dtype=np.float64):
    """:func:`loo_grad` with g_ij = w_ij sum_c r_ic (y_jc - f_ic) formed from the
    differences y_jc - f_ic (not r_i . y_j - r_i . f_i): exact where a row's weight sits
    on one key (f_i = y_j), so that (x_i - x_j)^2 of points far apart does not magnify
    the rounding of a cancelled sum. ``dtype=np.longdouble`` (80-bit on x86-64) computes
    it all in extended precision: a reference for rows far from every other, where the
    float64 formula itself is off by 1e-7 of the gradient's scale."""
    X = np.asarray(X, dtype=dtype)
    y2 = np.asarray(y, dtype=dtype).reshape(len(X), -1)
    n, p = y2.shape
    z = X @ np.asarray(components, dtype=dtype).T if components is not None else X / bandwidth
    scores = -0.5 * np.sum((z[:, None, :] - z[None, :, :]) ** 2, axis=-1)
    np.fill_diagonal(scores, -np.inf)
    w = np.exp(scores - scores.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    f = w @ y2
    r = f - y2
    inner = np.einsum("ic,ijc->ij", r, y2[None, :, :] - f[:, None, :])
    dl_ds = 2.0 / (n * p) * w * inner
    delta = X[:, None, :] - X[None, :, :]
    if components is None:
        return np.einsum("ij,ijd->d", dl_ds, (delta / bandwidth) ** 2)
    outer = np.einsum("ij,ija,ijb->ab", dl_ds, delta, delta)
    return -np.asarray(components, dtype=dtype) @ outer


# --------------------------------------------------------------------------- classifiers
def smoothed_class_probabilities(
    queries,
    keys,
    onehot,
    widths,
    var_type,
    n_categories,
    alpha,
    sample_weight=None,
    kernel="gaussian",
    exclude_self=False,
):
    """(S_c + alpha pi_c) / (S + alpha) with S_c = sum_j s_j K(q, k_j) [y_j = c], s the
    sample weights over their mean and pi Laplace's class frequencies
    (sum_j s_j [y_j = c] + 1) / (n + K) over the keys (with ``exclude_self``, query i's
    over the keys but key i). alpha = 0: the plain Nadaraya-Watson probabilities S_c / S."""
    onehot = np.asarray(onehot, dtype=np.float64)
    n, n_classes = onehot.shape
    s = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    s = s / s.mean()
    K = product_kernel_matrix(queries, keys, widths, var_type, n_categories, kernel) * s
    counts = np.broadcast_to(s @ onehot, (K.shape[0], n_classes)).copy()
    if exclude_self:
        np.fill_diagonal(K, 0.0)
        counts -= s[:, None] * onehot
    prior = (counts + 1.0) / (counts.sum(axis=1, keepdims=True) + n_classes)
    mass = K @ onehot
    return (mass + alpha * prior) / (mass.sum(axis=1, keepdims=True) + alpha)


def smoothed_class_loo_log_loss(
    X, onehot, widths, var_type, n_categories, alpha, sample_weight=None, kernel="gaussian"
):
    """The weighted leave-one-out log-loss of :func:`smoothed_class_probabilities`."""
    p = smoothed_class_probabilities(
        X, X, onehot, widths, var_type, n_categories, alpha, sample_weight, kernel, True
    )
    own = p[np.arange(p.shape[0]), np.argmax(onehot, axis=1)]
    s = np.ones(p.shape[0]) if sample_weight is None else np.asarray(sample_weight, float)
    return float(-(s @ np.log(own)) / s.sum())


# --------------------------------------------------------------------------- densities
def _kde_kernel_matrix(queries, keys, widths, var_type, n_categories, kernel, column):
    """K[i, j] = prod_c column(kind, q_ic, k_jc, width_c, count_c, kernel): the product
    kernel of a density over queries (n_q, d) and keys (n, d) (1-D: one column), one
    factor per column (no NaN handling: densities take complete data)."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    q, k = (q[:, None] if q.ndim == 1 else q), (k[:, None] if k.ndim == 1 else k)
    K = np.ones((q.shape[0], k.shape[0]))
    for c, kind in enumerate(var_type):
        a, b = q[:, c][:, None], k[:, c][None, :]
        K = K * column(kind, a, b, float(widths[c]), int(n_categories[c]), kernel)
    return K


def _continuous_pdf(u, kernel):
    """The continuous kernel normalised to integrate to 1 over u."""
    if kernel == "gaussian":
        return np.exp(-0.5 * u**2) / np.sqrt(2.0 * np.pi)
    inside = np.abs(u) <= 1.0
    if kernel == "epanechnikov":
        return np.where(inside, 0.75 * (1.0 - u**2), 0.0)
    return np.where(inside, 70.0 / 81.0 * (1.0 - np.abs(u) ** 3) ** 3, 0.0)


def _category_pdf(kind, a, b, lam, count):
    """Aitchison-Aitken ('u': 1 - l if equal, l / (c - 1) otherwise) or Wang-van Ryzin
    ('o': 1 - l if equal, (1 - l) / 2 l^|x - y| otherwise)."""
    if kind == "u":
        other = lam / (count - 1) if count > 1 else 0.0
        return np.where(a == b, 1.0 - lam, other)
    distance = np.abs(a - b)
    return np.where(distance == 0, 1.0 - lam, 0.5 * (1.0 - lam) * lam ** np.maximum(distance, 1))


def _density_column(kind, a, b, width, count, kernel):
    if kind == "c":
        return _continuous_pdf((a - b) / width, kernel) / width
    return _category_pdf(kind, a, b, width, count)


# Gauss-Legendre nodes: exact for the polynomial pieces of the compact kernels (degree <= 9)
_LEGENDRE = np.polynomial.legendre.leggauss(12)


def _integrated_kernel(z, kernel):
    """G(z) = integral of the normalised kernel from -inf to z: Phi by erfc for the
    Gaussian; for the compact kernels 1/2 + sign(z) times the kernel integrated over
    [0, min(|z|, 1)] by Gauss-Legendre quadrature (exact for their polynomials)."""
    from math import erfc, sqrt

    z = np.asarray(z, dtype=np.float64)
    if kernel == "gaussian":
        return np.vectorize(lambda t: 0.5 * erfc(-t / sqrt(2.0)))(z)
    a = np.minimum(np.abs(z), 1.0)
    nodes, weights = _LEGENDRE
    u = 0.5 * a[..., None] * (nodes + 1.0)  # the nodes mapped onto [0, a]
    half = 0.5 * a * np.sum(weights * _continuous_pdf(u, kernel), axis=-1)
    return 0.5 + np.sign(z) * half


def _cdf_column(kind, a, b, width, count, kernel):
    if kind == "c":
        return _integrated_kernel((a - b) / width, kernel)
    # the categorical kernel summed over the codes v = 0 .. min(floor(q), c - 1)
    top = np.minimum(np.floor(a), count - 1)
    total = np.zeros(np.broadcast_shapes(a.shape, b.shape))
    for v in range(count):
        total = total + np.where(v <= top, _category_pdf(kind, float(v), b, width, count), 0.0)
    return total


def kde_pdf(queries, keys, widths, var_type, n_categories, kernel="gaussian", sample_weight=None):
    """f(q) = sum_j w_j prod_c K((q_c - k_jc) / h_c) / h_c prod_k L_k(q_k, k_jk) / sum_j w_j
    with normalised continuous kernels: gaussian exp(-u^2/2) / sqrt(2 pi), epanechnikov
    3/4 (1 - u^2) and tricube 70/81 (1 - |u|^3)^3 on |u| <= 1; Aitchison-Aitken for 'u'
    and Wang-van Ryzin for 'o' columns (:func:`_category_pdf`)."""
    K = _kde_kernel_matrix(queries, keys, widths, var_type, n_categories, kernel, _density_column)
    w = np.ones(K.shape[1]) if sample_weight is None else np.asarray(sample_weight, float)
    return K @ w / w.sum()


def kde_cdf(queries, keys, widths, var_type, n_categories, kernel="gaussian", sample_weight=None):
    """F(q) = sum_j w_j prod_c G((q_c - k_jc) / h_c) prod_k C_k(q_k, k_jk) / sum_j w_j, G the
    integrated continuous kernel and C_k the categorical kernel summed over the codes
    0 .. min(floor(q_k), c_k - 1) (statsmodels' convention, unordered columns too)."""
    K = _kde_kernel_matrix(queries, keys, widths, var_type, n_categories, kernel, _cdf_column)
    w = np.ones(K.shape[1]) if sample_weight is None else np.asarray(sample_weight, float)
    return K @ w / w.sum()


def _log_density_column(kind, a, b, width, count, kernel):
    """log of :func:`_density_column`, the Gaussian's in closed form (no underflow)."""
    if kind == "c" and kernel == "gaussian":
        return -0.5 * ((a - b) / width) ** 2 - np.log(np.sqrt(2.0 * np.pi) * width)
    with np.errstate(divide="ignore"):
        return np.log(_density_column(kind, a, b, width, count, kernel))


def kde_loo_log_likelihood(
    X, widths, var_type, n_categories, kernel="gaussian", sample_weight=None
):
    """-sum_i (w_i / mean w) log f_-i(x_i), f_-i the density (:func:`kde_pdf`) of the rows
    other than i: sum_{j != i} w_j K_ij / sum_{j != i} w_j, summed in log space (the
    log kernel the sum of the columns' logs, then a log-sum-exp over j). Rows of weight
    0 count for nothing; +inf where a row of positive weight gets no kernel weight from
    the others."""
    X = np.asarray(X, dtype=np.float64)
    X = X[:, None] if X.ndim == 1 else X
    n = X.shape[0]
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, float)
    log_K = np.zeros((n, n))
    for c, kind in enumerate(var_type):
        a, b = X[:, c][:, None], X[:, c][None, :]
        log_K = log_K + _log_density_column(
            kind, a, b, float(widths[c]), int(n_categories[c]), kernel
        )
    with np.errstate(divide="ignore"):
        log_K = log_K + np.log(w)[None, :]
    np.fill_diagonal(log_K, -np.inf)
    log_mass = logsumexp_rows(log_K)
    others = w.sum() - w
    counted = w > 0
    if np.any(~(log_mass[counted] > -np.inf)) or np.any(~(others[counted] > 0)):
        return np.inf
    log_f = log_mass[counted] - np.log(others[counted])
    return float(-(w[counted] / w.mean()) @ log_f)


def kde_log_pdf(
    queries, keys, widths, var_type, n_categories, kernel="gaussian", sample_weight=None
):
    """log f(q) of :func:`kde_pdf` summed in log space (each column's log kernel, the
    Gaussian's in closed form, then a log-sum-exp over the keys): finite where f
    underflows, -inf where no key has kernel weight."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    q, k = (q[:, None] if q.ndim == 1 else q), (k[:, None] if k.ndim == 1 else k)
    w = np.ones(k.shape[0]) if sample_weight is None else np.asarray(sample_weight, float)
    with np.errstate(divide="ignore"):
        log_K = np.broadcast_to(np.log(w)[None, :], (q.shape[0], k.shape[0])).copy()
    for c, kind in enumerate(var_type):
        a, b = q[:, c][:, None], k[:, c][None, :]
        log_K = log_K + _log_density_column(
            kind, a, b, float(widths[c]), int(n_categories[c]), kernel
        )
    return logsumexp_rows(log_K) - np.log(w.sum())


def _quadrature_axis(values, width, kernel, n_nodes=10):
    """Nodes and weights of a composite Gauss-Legendre rule on the line for a density of
    keys ``values`` with width h: panels of width h over [min - 12 h, max + 12 h] for the
    Gaussian; for a compact kernel panels between the sorted points x_j +- h, on which the
    density is one polynomial (the rule is exact for its square there)."""
    nodes, weights = np.polynomial.legendre.leggauss(n_nodes)
    values = np.asarray(values, dtype=np.float64)
    if kernel == "gaussian":
        ends = np.arange(values.min() - 12.0 * width, values.max() + 12.0 * width + width, width)
    else:
        ends = np.unique(np.concatenate((values - width, values + width)))
    low, high = ends[:-1, None], ends[1:, None]
    x = (0.5 * (high - low) * (nodes + 1.0) + low).ravel()
    w = (0.5 * (high - low) * weights).ravel()
    return x, w


def _integration_points(keys, widths, var_type, n_categories, kernel):
    """Every point of the tensor rule over the columns (quadrature for continuous ones,
    every code 0 .. c - 1 with weight 1 for categorical ones): (points (m, d), weights (m,))."""
    axes, axis_weights = [], []
    for c, kind in enumerate(var_type):
        if kind == "c":
            x, w = _quadrature_axis(keys[:, c], float(widths[c]), kernel)
        else:
            x, w = np.arange(float(n_categories[c])), np.ones(int(n_categories[c]))
        axes.append(x)
        axis_weights.append(w)
    grids = np.meshgrid(*axes, indexing="ij")
    weights = np.ones_like(grids[0])
    for grid in np.meshgrid(*axis_weights, indexing="ij"):
        weights = weights * grid
    return np.column_stack([g.ravel() for g in grids]), weights.ravel()


def kde_ls_cv(X, widths, var_type, n_categories, kernel="gaussian", sample_weight=None):
    """Least-squares cross-validation of a density, by brute force: int f^2 by quadrature
    (:func:`_integration_points`: f of :func:`kde_pdf` at every point of a tensor rule,
    squared and summed; a sum over the codes of categorical columns), less
    2 sum_i u_i f_-i(x_i), f_-i = sum_{j != i} w_j K_ij / sum_{j != i} w_j by a double loop
    (u_i = w_i / sum w)."""
    X = np.asarray(X, dtype=np.float64)
    X = X[:, None] if X.ndim == 1 else X
    n = X.shape[0]
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, float)
    points, point_weights = _integration_points(X, widths, var_type, n_categories, kernel)
    integral = 0.0
    for start in range(0, points.shape[0], 20_000):  # the (points x keys) matrix in blocks
        block = points[start : start + 20_000]
        f = kde_pdf(block, X, widths, var_type, n_categories, kernel, w)
        integral += float(point_weights[start : start + 20_000] @ (f * f))
    loo = 0.0
    for i in range(n):
        total, mass = 0.0, 0.0
        for j in range(n):
            if j == i:
                continue
            K = _kde_kernel_matrix(
                X[i : i + 1], X[j : j + 1], widths, var_type, n_categories, kernel, _density_column
            )[0, 0]
            total += w[j] * K
            mass += w[j]
        loo += w[i] / w.sum() * total / mass
    return integral - 2.0 * loo


def kde_conditional_ls_cv(
    X, widths, var_type, n_categories, n_response=1, kernel="gaussian", sample_weight=None
):
    """Least-squares cross-validation of the conditional density of y (X's first
    ``n_response`` columns) given x (the others), by brute force: per row l the weights
    p_j = w_j K_x(x_l, x_j) / sum_{j != l} w_j K_x(x_l, x_j) over j != l, the left-out
    conditional density g(y) = sum_j p_j K_y(y, y_j) squared and integrated over y by
    quadrature (:func:`_integration_points`), less 2 g(y_l); the terms weighted by
    u_l = w_l / sum w."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, float)
    r = n_response
    y_args = (widths[:r], var_type[:r], n_categories[:r])
    x_args = (widths[r:], var_type[r:], n_categories[r:])
    points, point_weights = _integration_points(X[:, :r], *y_args, kernel)
    out = 0.0
    for row in range(n):
        others = np.array([j for j in range(n) if j != row])
        Kx = _kde_kernel_matrix(
            X[row : row + 1, r:], X[others, r:], *x_args, kernel, _density_column
        )
        p = w[others] * Kx[0]
        p = p / p.sum()
        Ky = _kde_kernel_matrix(points, X[others, :r], *y_args, kernel, _density_column)
        g = Ky @ p
        at_y = _kde_kernel_matrix(
            X[row : row + 1, :r], X[others, :r], *y_args, kernel, _density_column
        )
        out += w[row] / w.sum() * (float(point_weights @ (g * g)) - 2.0 * float(at_y[0] @ p))
    return out


def conditional_cdf_cv(
    X, widths, var_type, n_categories, kernel="gaussian", sample_weight=None, n_points=32
):
    """Cross-validation of the conditional CDF of y (X's first column) given x (the
    others), by brute force: per row l the weights p_j = w_j K_x(x_l, x_j) / sum_{j != l}
    w_j K_x(x_l, x_j) over j != l, and the mean over points t of (1{y_l <= t} -
    sum_j p_j G((t - y_j) / h_y))^2, weighted by u_l = w_l / sum w. The points: a
    continuous y's ``n_points`` weighted quantiles among its values (the value where the
    cumulative weight first reaches (g + 1/2) / n_points of the total, duplicates merged);
    a categorical y's codes, an ordered y's cumulative kernel summed over the codes up to
    t, an unordered y's probabilities 1{y_l = t} against sum_j p_j L(t, y_j)."""
    X = np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, float)
    y, kind, width, count = X[:, 0], var_type[0], float(widths[0]), int(n_categories[0])
    if kind == "c":
        order = np.argsort(y, kind="stable")
        cumulative = np.cumsum(w[order])
        picks = []
        for g in range(n_points):
            level = (g + 0.5) / n_points * cumulative[-1]
            picks.append(y[order][min(int(np.argmax(cumulative >= level)), n - 1)])
        points = np.unique(picks)
    else:
        points = np.arange(count, dtype=np.float64)
    out = 0.0
    for row in range(n):
        others = np.array([j for j in range(n) if j != row])
        Kx = _kde_kernel_matrix(
            X[row : row + 1, 1:],
            X[others, 1:],
            widths[1:],
            var_type[1:],
            n_categories[1:],
            kernel,
            _density_column,
        )
        p = w[others] * Kx[0]
        p = p / p.sum()
        a, b = points[:, None], y[others][None, :]
        if kind == "u":
            values, target = _category_pdf("u", a, b, width, count), y[row] == points
        else:
            values, target = _cdf_column(kind, a, b, width, count, kernel), y[row] <= points
        F = values @ p
        out += w[row] / w.sum() * float(np.mean((target - F) ** 2))
    return out


# ---------------------------------------------------------------------------
# Programmable attention (score_mod / mask_mod), dense, float64.
# ---------------------------------------------------------------------------


def flex_attention(q, k, v, score_mod=None, mask_mod=None, scale=None, mod_args=()):
    """(out, lse) of FlexAttention's formula with the whole (B, H, L, S) score array:

    s = score_mod(scale q k^T, b, h, i, j, *mod_args), -inf where not
    mask_mod(b, h, i, j, *mod_args); out = softmax(s) v, lse = logsumexp(s).

    q (B, H, L, E), k and v (B, H, S, .). The functions are called once, on
    broadcast index arrays (their Python form: ``.py_func`` of a jitted
    function), so they must be written with NumPy operations (``&``, ``|``,
    ``np.tanh``). A row with no admissible key gives zeros and lse = -inf.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    n_b, n_h, n_q, _ = q.shape
    n_k = k.shape[-2]
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    s = (q @ np.swapaxes(k, -1, -2)) * scale
    b = np.arange(n_b)[:, None, None, None]
    h = np.arange(n_h)[None, :, None, None]
    i = np.arange(n_q)[None, None, :, None]
    j = np.arange(n_k)[None, None, None, :]
    if score_mod is not None:
        s = np.broadcast_to(
            getattr(score_mod, "py_func", score_mod)(s, b, h, i, j, *mod_args), s.shape
        )
    if mask_mod is not None:
        keep = getattr(mask_mod, "py_func", mask_mod)(b, h, i, j, *mod_args)
        s = np.where(np.broadcast_to(keep, s.shape), s, -np.inf)
    return softmax_rows(s) @ v, logsumexp_rows(s)


def flex_attention_grads(
    q, k, v, grad_out=None, score_mod=None, mask_mod=None, scale=None, mod_args=(), *,
    score_grad=None, causal=False, window=None, enable_gqa=False,
):  # fmt: skip
    """(out, lse) of :func:`flex_attention` and, with ``grad_out``, (out, lse, dq, dk, dv)
    by the softmax backward with the whole score array, in float64:

    r = scale q k^T, s = score_mod(r, b, h, i, j, *mod_args), -inf where not admissible,
    P = softmax(s), dV = P^T dO, dP = dO V^T, dS = P o (dP - rowsum(P o dP)) o
    score_grad(r, b, h, i, j, *mod_args), dQ = scale dS K, dK = scale dS^T Q.

    ``score_grad`` is d score_mod / d r (required with ``score_mod`` and ``grad_out``;
    1 without ``score_mod``). Admissible: ``mask_mod`` true, and j <= i under
    ``causal`` (top left), i - left <= j <= i + right under ``window=(left, right)``.
    A row with NaN or +inf on an admissible entry has P, out and lse NaN (the kernels'
    rule); a row without admissible entries zeros and lse = -inf.
    q is (B, H, L, E), (H, L, E) (b = 0) or (L, E) (b = h = 0); k and v have q's
    leading dimensions, or H_kv heads dividing H under ``enable_gqa`` (query head h
    reads key head h // (H / H_kv); dK and dV sum over the heads that read them).
    """
    shapes = [np.shape(a) for a in (q, k, v)]
    q, k, v = (np.asarray(a, dtype=np.float64).reshape((1,) * (4 - a.ndim) + a.shape)
               for a in map(np.asarray, (q, k, v)))  # fmt: skip
    group = q.shape[1] // k.shape[1] if enable_gqa else 1
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    raw = (q @ np.swapaxes(k, -1, -2)) * scale
    b, h, i, j = np.ix_(*(np.arange(n) for n in raw.shape))
    fn = getattr(score_mod, "py_func", score_mod)
    s = raw if fn is None else np.broadcast_to(fn(raw, b, h, i, j, *mod_args), raw.shape)
    keep = np.ones(raw.shape, dtype=bool)
    if mask_mod is not None:
        keep &= getattr(mask_mod, "py_func", mask_mod)(b, h, i, j, *mod_args)
    if causal:
        keep &= j <= i
    if window is not None:
        keep &= (j >= i - window[0]) & (j <= i + window[1])
    s = np.where(keep, s, -np.inf)
    with np.errstate(invalid="ignore"):  # inf / inf in a row with +inf: set to NaN below
        p, lse = softmax_rows(s), logsumexp_rows(s)
    undefined = (np.isnan(s) | (s == np.inf)).any(axis=-1)
    p[undefined], lse[undefined] = np.nan, np.nan
    out = p @ v
    lead = shapes[0][:-1]
    if grad_out is None:
        return out.reshape(lead + (v.shape[-1],)), lse.reshape(lead)
    if score_mod is not None and score_grad is None:
        raise ValueError("flex_attention_grads needs score_grad, d score_mod / d score")
    g = np.asarray(grad_out, dtype=np.float64).reshape(out.shape)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    if score_grad is not None:
        fn = getattr(score_grad, "py_func", score_grad)
        ds = np.where(p > 0, ds * np.broadcast_to(fn(raw, b, h, i, j, *mod_args), ds.shape), 0.0)
    dq = scale * ds @ k
    dk = scale * np.swapaxes(ds, -1, -2) @ q
    dv = np.swapaxes(p, -1, -2) @ g
    n_b, n_h = q.shape[:2]
    dk, dv = (d.reshape(n_b, n_h // group, group, *d.shape[2:]).sum(2) for d in (dk, dv))
    return (out.reshape(lead + (v.shape[-1],)), lse.reshape(lead), dq.reshape(shapes[0]),
            dk.reshape(shapes[1]), dv.reshape(shapes[2]))  # fmt: skip


def kd_order(z, leaf_keys, trace=None, scan_per_key=32):
    """``nbattn.kernels.kd_order.kd_order`` in plain Python, reading the keys through the
    order as it is permuted: (order, leaf_start). Each node [a, b) of more than
    ``leaf_keys`` keys is split at mid = (a + b) // 2 along its widest coordinate by
    Hoare's selection (the same pivots and swaps as the kernel, so the same order);
    leaves come out depth first. Keys are compared as float64.

    The kernel's guard: a node's passes add the keys they scan (hi - lo + 1); a pass that
    would take the count past ``scan_per_key`` (b - a) + 256 is not made and [lo, hi] is sorted
    instead by the key, NaN last, ties in their present order. ``trace``: a list that,
    when given, receives (a, b, scanned, sorted) of each split node: the keys its passes
    scanned (the refused pass not counted) and whether the guard sorted."""
    z = np.asarray(z, dtype=np.float64)
    n, k = z.shape
    order = list(range(n))
    if n == 0:  # no keys: no leaf, only the end
        return np.array(order, dtype=np.int64), np.array([0], dtype=np.int64)
    leaf_keys = max(leaf_keys, 1)  # as the kernel: below 1 would split one key forever
    starts = []
    stack = [(0, n)]
    while stack:
        a, b = stack.pop()
        if b - a <= leaf_keys:
            starts.append(a)
            continue
        extents = [
            max([-np.inf] + [z[order[t], f] for t in range(a, b)])
            - min([np.inf] + [z[order[t], f] for t in range(a, b)])
            for f in range(k)
        ]
        dim, widest = 0, -1.0
        for f, extent in enumerate(extents):  # the first widest; a NaN extent never wins
            if extent > widest:
                dim, widest = f, extent
        mid = (a + b) // 2
        lo, hi = a, b - 1
        budget, scanned, guarded = scan_per_key * (b - a) + 256, 0, False
        while lo < hi:
            if scanned + hi - lo + 1 > budget:
                values = [float(z[order[t], dim]) for t in range(lo, hi + 1)]
                # NaN last; sorted is stable: ties (-0.0 and 0.0 among them) keep their order
                nan = [value != value for value in values]
                rank = sorted(
                    range(hi + 1 - lo), key=lambda t: (nan[t], 0.0 if nan[t] else values[t])
                )
                order[lo : hi + 1] = [order[lo + t] for t in rank]
                guarded = True
                break
            scanned += hi - lo + 1
            pivot = z[order[(lo + hi) // 2], dim]
            i, j = lo, hi
            while i <= j:
                while z[order[i], dim] < pivot:
                    i += 1
                while z[order[j], dim] > pivot:
                    j -= 1
                if i <= j:
                    order[i], order[j] = order[j], order[i]
                    i += 1
                    j -= 1
            if mid <= j:
                hi = j
            elif mid >= i:
                lo = i
            else:
                break
        if trace is not None:
            trace.append((a, b, scanned, guarded))
        stack.append((mid, b))
        stack.append((a, mid))
    starts.append(n)
    return np.array(order, dtype=np.int64), np.array(starts, dtype=np.int64)


def assert_valid_kd_split(z, leaf_keys, order, starts):
    """``kd_order``'s (order, starts) for keys ``z`` without NaN: a permutation, leaves
    as ``kd_nodes`` expects, none over ``leaf_keys``, and at each node the left half no
    larger than the right along the node's widest axis (the first widest, as the
    kernel's strict >)."""
    from nbattn.kernels import kd_order as kd

    n = z.shape[0]
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
    z_t = np.ascontiguousarray(z[order].T)
    start, stop, right, lo, hi = kd.kd_nodes(z_t, leaf_keys)
    leaves = right < 0
    np.testing.assert_array_equal(np.append(start[leaves], n), starts)
    assert np.all(stop[leaves] - start[leaves] <= leaf_keys)
    for node in np.flatnonzero(~leaves):
        dim = int(np.argmax(hi[node] - lo[node]))
        left, rite = node + 1, right[node]
        assert stop[left] == start[rite] == (start[node] + stop[node]) // 2
        assert hi[left, dim] <= lo[rite, dim]


# --------------------------------------------------------------------------- nearest neighbours
def nn_widths(values, points, k, skip_self=False):
    """(m,) per point, the k-th smallest of |values - point| (k counted from 1), sorted
    one point at a time; with ``skip_self`` each point is one of ``values`` and one zero
    distance (its own) is dropped first. Where that distance is 0 (k tied values at the
    point), the smallest positive distance instead (the nearest value unequal to the
    point); 0 where there is none."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    p = np.asarray(points, dtype=np.float64).reshape(-1)
    out = np.empty(p.shape[0])
    for i, x in enumerate(p):
        d = np.sort(np.abs(v - x))
        if skip_self:
            assert d[0] == 0.0, "skip_self: the point must be one of the values"
            d = d[1:]
        width = d[int(k) - 1]
        if width == 0.0:
            positive = d[d > 0.0]
            width = positive[0] if positive.size else 0.0
        out[i] = width
    return out


def _nn_continuous_factor(u, kernel, normalised):
    """The continuous kernel at u: gaussian exp(-u^2/2), epanechnikov max(1 - u^2, 0),
    tricube max(1 - |u|^3, 0)^3, or with ``normalised`` the density kernels of
    :func:`_continuous_pdf`."""
    if normalised:
        return _continuous_pdf(u, kernel)
    if kernel == "gaussian":
        return np.exp(-0.5 * u**2)
    if kernel == "epanechnikov":
        return np.maximum(1.0 - u**2, 0.0)
    return np.maximum(1.0 - np.abs(u) ** 3, 0.0) ** 3


def nn_kernel_matrix(
    queries,
    keys,
    widths,
    var_type,
    n_categories,
    bandwidth_type,
    kernel="gaussian",
    exclude_self=False,
    normalised=False,
):
    """K[i, j] = prod_c K_c(q_ic, k_jc) under nearest-neighbour widths (R np's bwtype):
    for a continuous column c with count k = widths[c], K((k_jc - q_ic) / h) / h with

    * "generalized_nn": h = h(q_i), :func:`nn_widths` of the query among the keys' values
      of the column (with ``exclude_self``, the queries are the keys and h is the k-th
      nearest *other* value);
    * "adaptive_nn": h = h_j, the key's k-th nearest other key value;

    and a categorical column's factor the Aitchison-Aitken ('u') or Wang-van Ryzin ('o')
    kernel of :func:`_category_pdf` at l = widths[c]. With ``exclude_self`` the diagonal
    is 0. ``normalised``: the density kernels (integrating to 1), else the regression's
    (constants dropped; the 1 / h factors kept)."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    q, k = (q[:, None] if q.ndim == 1 else q), (k[:, None] if k.ndim == 1 else k)
    K = np.ones((q.shape[0], k.shape[0]))
    for c, kind in enumerate(var_type):
        a, b = q[:, c][:, None], k[:, c][None, :]
        if kind != "c":
            K = K * _category_pdf(kind, a, b, float(widths[c]), int(n_categories[c]))
            continue
        count = int(widths[c])
        if bandwidth_type == "generalized_nn":
            h = nn_widths(k[:, c], q[:, c], count, skip_self=exclude_self)[:, None]
        elif bandwidth_type == "adaptive_nn":
            h = nn_widths(k[:, c], k[:, c], count, skip_self=True)[None, :]
        else:
            raise ValueError(bandwidth_type)
        K = K * _nn_continuous_factor((b - a) / h, kernel, normalised) / h
    if exclude_self:
        np.fill_diagonal(K, 0.0)
    return K


def nn_local_polynomial(
    queries,
    keys,
    values,
    widths,
    var_type,
    n_categories,
    degree,
    bandwidth_type,
    kernel="gaussian",
    exclude_self=False,
):
    """The local constant (degree 0) or local-linear (degree 1) fit per query under the
    weights of :func:`nn_kernel_matrix`: weighted least squares on the design
    (1, k_j - q_i over the continuous columns) by ``np.linalg.lstsq`` on the
    square-root-weighted rows. Asserts that every query has some weight (no fallback
    here: the tests keep their queries inside the keys' reach)."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    q, k = (q[:, None] if q.ndim == 1 else q), (k[:, None] if k.ndim == 1 else k)
    y = np.asarray(values, dtype=np.float64)
    y2 = y[:, None] if y.ndim == 1 else y
    K = nn_kernel_matrix(q, k, widths, var_type, n_categories, bandwidth_type, kernel, exclude_self)
    X = local_design(q, k, var_type, degree)
    fit = np.empty((q.shape[0], y2.shape[1]))
    for i in range(q.shape[0]):
        total = K[i].sum()
        assert total > 0.0, f"query {i} has no kernel weight"
        p = K[i] / total
        if degree == 0:
            fit[i] = p @ y2
            continue
        root = np.sqrt(p)[:, None]
        beta = np.linalg.lstsq(root * X[i], root * y2, rcond=None)[0]
        fit[i] = beta[0]
    return fit[:, 0] if y.ndim == 1 else fit


def nn_loo_mse(X, y, widths, var_type, n_categories, degree, bandwidth_type, kernel="gaussian"):
    """The leave-one-out mean squared error mean_i ||fit_-i(x_i) - y_i||^2 of
    :func:`nn_local_polynomial` (every row a query, its own pair left out; the keys'
    adaptive widths and the queries' generalised widths those of the full training set,
    a row's own value not counted)."""
    X = np.asarray(X, dtype=np.float64)
    X = X[:, None] if X.ndim == 1 else X
    y = np.asarray(y, dtype=np.float64)
    fit = nn_local_polynomial(
        X, X, y, widths, var_type, n_categories, degree, bandwidth_type, kernel, True
    )
    err = (fit - y) ** 2
    return float(np.mean(err.reshape(err.shape[0], -1).sum(axis=1)))


def nn_kde_pdf(queries, keys, widths, var_type, n_categories, bandwidth_type, kernel="gaussian"):
    """f(q) = 1/n sum_j prod_c K((q_c - k_jc) / h) / h prod_k L_k(q_k, k_jk) with the
    density kernels (:func:`_continuous_pdf`, :func:`_category_pdf`) and h the query's
    (generalised, its k-th nearest key value) or the key's (adaptive, its k-th nearest
    other key value) nearest-neighbour width (:func:`nn_kernel_matrix`)."""
    K = nn_kernel_matrix(
        queries, keys, widths, var_type, n_categories, bandwidth_type, kernel, normalised=True
    )
    return K.mean(axis=1)
