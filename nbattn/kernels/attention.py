"""Streaming scaled-dot-product attention on the CPU (scores -> softmax -> weighted sum).

For every batch entry b and query row i

    s_ij  = scale * q_i . k_j + bias_ij      (j <= i only when causal)
    out_i = sum_j softmax_j(s_ij) v_j,       lse_i = log sum_j exp(s_ij)

computed with the online softmax: keys are visited in blocks of
``config.KEY_BLOCK``; a running maximum ``m``, running sum ``l`` and running
weighted sum ``acc`` are rescaled by ``exp(m_old - m_new)`` whenever a block
raises the maximum. The (L, S) score matrix is never held. The parallel loop
runs over (batch, block of ``config.QUERY_BLOCK`` query rows).

Layout (the caller, ``nbattn.attention``, validates and lays out):

* ``q`` (B, L, E), ``k_t`` (B, E, S) feature-major keys, ``v`` (B, S, Ev);
  C-contiguous, one dtype (float32 or float64);
* ``bias`` (Bb, Lb, Sb), Bb in {1, B}, Lb in {1, L}, Sb in {1, S}, the additive
  mask (0 / -inf for boolean masks), read only when ``has_bias``;
* ``causal`` admits key j for query i only when j <= i (torch's top-left
  alignment of ``is_causal``); the loop stops at key i.

Scores, weights and per-block sums are in the input dtype; ``l`` and ``acc``
are float64. A row with no admissible key gets zeros and lse = -inf.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import config
from .fastmath import fast_exp, like

_KEY_BLOCK = config.KEY_BLOCK
_QUERY_BLOCK = config.QUERY_BLOCK


@njit(parallel=True, fastmath=config.FASTMATH, cache=config.CACHE)
def soft_attention(q, k_t, v, scale, bias, has_bias, causal):
    """Streaming softmax attention; returns ``(out (B, L, Ev), lse (B, L) float64)``."""
    n_batch, n_rows, n_feat = q.shape
    n_keys = k_t.shape[2]
    n_out = v.shape[2]
    out = np.zeros((n_batch, n_rows, n_out), dtype=q.dtype)
    lse = np.empty((n_batch, n_rows), dtype=np.float64)
    n_chunks = (n_rows + _QUERY_BLOCK - 1) // _QUERY_BLOCK
    for t in prange(n_batch * n_chunks):
        b = t // n_chunks
        chunk = t - b * n_chunks
        scores = np.empty(_KEY_BLOCK, dtype=q.dtype)
        blk = np.empty(n_out, dtype=q.dtype)
        acc = np.empty(n_out, dtype=np.float64)
        sc = like(scale, scores)
        bb = b if bias.shape[0] > 1 else 0
        for i in range(chunk * _QUERY_BLOCK, min(n_rows, (chunk + 1) * _QUERY_BLOCK)):
            n_adm = min(n_keys, i + 1) if causal else n_keys
            bi = i if bias.shape[1] > 1 else 0
            running_max = -np.inf
            running_sum = 0.0
            acc[:] = 0.0
            for j0 in range(0, n_adm, _KEY_BLOCK):
                nb = min(_KEY_BLOCK, n_adm - j0)
                for j in range(nb):
                    scores[j] = 0.0
                for e in range(n_feat):
                    qe = q[b, i, e]
                    for j in range(nb):
                        scores[j] += qe * k_t[b, e, j0 + j]
                for j in range(nb):
                    scores[j] *= sc
                if has_bias:
                    if bias.shape[2] > 1:
                        for j in range(nb):
                            scores[j] += bias[bb, bi, j0 + j]
                    else:
                        for j in range(nb):
                            scores[j] += bias[bb, bi, 0]
                block_max = like(-np.inf, scores)
                for j in range(nb):
                    block_max = max(block_max, scores[j])
                if block_max == -np.inf:
                    continue
                if block_max > running_max:
                    rescale = np.exp(running_max - block_max)
                    running_sum *= rescale
                    for c in range(n_out):
                        acc[c] *= rescale
                    running_max = block_max
                shift = like(running_max, scores)
                block_sum = like(0.0, scores)
                for j in range(nb):
                    w = fast_exp(scores[j] - shift)
                    scores[j] = w
                    block_sum += w
                running_sum += block_sum
                blk[:] = 0.0
                for j in range(nb):
                    p = scores[j]
                    for c in range(n_out):
                        blk[c] += p * v[b, j0 + j, c]
                for c in range(n_out):
                    acc[c] += blk[c]
            if running_sum > 0.0:
                inv = 1.0 / running_sum
                for c in range(n_out):
                    out[b, i, c] = acc[c] * inv
                lse[b, i] = running_max + np.log(running_sum)
            else:
                lse[b, i] = -np.inf
    return out, lse
