"""Hierarchical (structured) attention: items pooled into segments, segments into a
document, each level by :func:`nbattn.attn.attention.attention` with a query of its own
(the attention chapter; Yang et al. 2016's hierarchical attention network).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .._core.validation import as_float_array, resolve_dtype
from .attention import attention

__all__ = ["HierarchicalResult", "hierarchical_attention"]

HierarchicalResult = namedtuple(
    "HierarchicalResult",
    ["output", "segments", "item_weights", "segment_weights", "segment_labels"],
)
HierarchicalResult.__doc__ = """Result of :func:`hierarchical_attention`.

output : (Ev,) the document vector; segments : (G, Ev) the segment vectors;
item_weights : (N,) alpha of each item within its segment (each segment's
weights sum to 1); segment_weights : (G,) beta over segments;
segment_labels : (G,) the distinct segment ids, in sorted order (row g of
``segments`` belongs to ``segment_labels[g]``).
"""


def hierarchical_attention(
    x,
    segment_ids,
    item_query,
    segment_query,
    score="scaled_dot",
    values=None,
    *,
    item_score_params=None,
    segment_score_params=None,
    dtype=None,
):
    """Two-level (structured) attention: items -> segments -> document (the attention chapter).

    Items (words) x_n with segment ids g(n) (sentences) are pooled within each
    segment by an item-level query, and the segment vectors are pooled by a
    segment-level query (Yang et al. 2016's hierarchical attention network,
    without its projections):

    .. math::

        \\alpha_n = \\operatorname{softmax}_{n : g(n) = g}\\, s(u_w, x_n), \\qquad
        c_g = \\sum_{n : g(n) = g} \\alpha_n\\, v_n

        \\beta_g = \\operatorname{softmax}_g\\, s(u_s, c_g), \\qquad
        \\text{output} = \\sum_g \\beta_g\\, c_g

    Parameters
    ----------
    x : array (N, D)
        The items (keys of level 1).
    segment_ids : int array (N,)
        The segment of each item; any integers, need not be sorted or
        contiguous. Segments are ordered by id.
    item_query : array (D,)
        u_w, the item-level query.
    segment_query : array (Dv,)
        u_s, the segment-level query (Dv = D unless ``values`` is given).
    score : str or callable
        The score of both levels (see :func:`attention`).
    values : array (N, Dv), optional
        Values to pool instead of x (level 1 is key-value attention; the
        segment vectors c_g are then both keys and values of level 2).
    item_score_params, segment_score_params : dict, optional
        Extra score parameters of each level (e.g. W, U, v for "additive").

    Returns
    -------
    HierarchicalResult(output, segments, item_weights, segment_weights, segment_labels)
    """
    dt = resolve_dtype(dtype, x, item_query, segment_query, values)
    x = as_float_array(x, "x", min_ndim=2, dtype=dt, allow_bool=False)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D (N items, D), got shape {x.shape}")
    N = x.shape[0]
    ids = np.asarray(segment_ids)
    if ids.dtype.kind not in "iu" or ids.shape != (N,):
        raise ValueError(
            f"segment_ids must be an integer array of shape ({N},), got dtype {ids.dtype} "
            f"and shape {ids.shape}"
        )
    vals = x if values is None else as_float_array(values, "values", min_ndim=2, dtype=dt)
    if vals.ndim != 2 or vals.shape[0] != N:
        raise ValueError(f"values must have shape ({N}, Dv), got {vals.shape}")
    uq = as_float_array(item_query, "item_query", min_ndim=1, dtype=dt)
    if uq.ndim != 1:
        raise ValueError(f"item_query must be 1-D, got shape {uq.shape}")
    us = as_float_array(segment_query, "segment_query", min_ndim=1, dtype=dt)
    if us.ndim != 1:
        raise ValueError(f"segment_query must be 1-D, got shape {us.shape}")
    labels, inverse = np.unique(ids, return_inverse=True)
    G = labels.shape[0]
    member = inverse[None, :] == np.arange(G)[:, None]  # (G, N)
    segs, w1 = attention(
        np.broadcast_to(uq, (G, uq.shape[0])),
        x,
        vals,
        score,
        mask=member,
        return_weights=True,
        score_params=item_score_params,
        dtype=dt,
    )
    item_weights = w1[inverse, np.arange(N)]
    doc, w2 = attention(
        us[None, :],
        segs,
        segs,
        score,
        return_weights=True,
        score_params=segment_score_params,
        dtype=dt,
    )
    return HierarchicalResult(doc[0], segs, item_weights, w2[0], labels)
