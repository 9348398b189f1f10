"""Dask integration: prediction on dask collections, and attention pooling over
keys sharded across partitions (optional extra ``[dask]``).

Everything here builds dask graphs from the functional layer; it runs
unchanged on the local scheduler or on a ``dask.distributed`` cluster
(``Client(address)``). Workers import nbattn and load its compiled kernels
from numba's on-disk cache, so a worker does not recompile after the first
process on its machine has compiled them.

Sharded keys. Nadaraya-Watson over keys split into shards K_1, ..., K_m is
exact: each shard returns, per query, its normalised output ``o_r`` and log
normaliser ``lse_r = log sum_{j in K_r} exp(s_ij)``, and two partial states
merge as

    L = logaddexp(lse_a, lse_b),   o = exp(lse_a - L) o_a + exp(lse_b - L) o_b

(a shard with no admissible key has lse = -inf and weight 0). The merge is
associative, so the shards are combined in a tree.
"""

from __future__ import annotations

import numpy as np

from . import regression

__all__ = ["merge_partial", "nadaraya_watson_sharded", "predict"]


def _require_dask():
    try:
        import dask  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("nbattn.dask needs dask: pip install 'nbattn[dask]'") from exc


def predict(estimator, data):
    """``estimator.predict`` over a dask DataFrame or dask Array, partition by partition.

    Parameters
    ----------
    estimator : fitted nbattn (or any scikit-learn) regressor or classifier
    data : dask.dataframe.DataFrame or dask.array.Array of shape (n, n_features)
        Array chunks must span all features (one chunk along axis 1).

    Returns
    -------
    For a DataFrame: a dask Series (one output) or DataFrame (several), with
    the input's index and divisions kept. For an Array: a dask Array chunked
    like the rows of ``data``.
    """
    _require_dask()
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    n_outputs = getattr(estimator, "n_outputs_", 1)
    single = n_outputs == 1 and getattr(estimator, "_y_ndim", 1) == 1
    if isinstance(data, dd.DataFrame):

        def predict_partition(part):
            pred = estimator.predict(part)
            if single:
                return pd.Series(pred, index=part.index, name="prediction")
            cols = [f"prediction_{c}" for c in range(pred.shape[1])]
            return pd.DataFrame(pred, index=part.index, columns=cols)

        if single:
            meta = pd.Series([], dtype="float64", name="prediction")
        else:
            meta = pd.DataFrame(
                {f"prediction_{c}": pd.Series([], dtype="float64") for c in range(n_outputs)}
            )
        return data.map_partitions(predict_partition, meta=meta)
    if isinstance(data, da.Array):
        if data.ndim != 2:
            raise ValueError(f"data must be 2-D, got a dask array of shape {data.shape}")
        if data.numblocks[1] != 1:
            data = data.rechunk({1: -1})
        if single:
            return data.map_blocks(estimator.predict, drop_axis=1, dtype=np.float64)
        return data.map_blocks(
            estimator.predict, chunks=(data.chunks[0], (n_outputs,)), dtype=np.float64
        )
    raise ValueError(
        f"data must be a dask DataFrame or dask Array, got {type(data).__name__}; "
        "call estimator.predict for in-memory data"
    )


def merge_partial(a, b):
    """Merge two partial pooling states ``(out, lse)`` over disjoint key sets (exact).

    ``out`` (n_queries, n_outputs) normalised within its shard, ``lse``
    (n_queries,) its log normaliser; -inf marks a shard with no admissible key.
    """
    out_a, lse_a = a
    out_b, lse_b = b
    lse = np.logaddexp(lse_a, lse_b)
    finite = np.isfinite(lse)
    safe = np.where(finite, lse, 0.0)
    with np.errstate(invalid="ignore"):
        w_a = np.where(finite, np.exp(lse_a - safe), 0.0)
        w_b = np.where(finite, np.exp(lse_b - safe), 0.0)
    return w_a[:, None] * out_a + w_b[:, None] * out_b, lse


def _partial(queries, keys, values, bandwidth, dtype):
    values = values if values.ndim == 2 else values[:, None]
    out, lse = regression.nadaraya_watson(
        queries, keys, values, bandwidth, dtype=dtype, return_lse=True
    )
    return np.asarray(out, dtype=np.float64), lse


def _merged_block(queries, key_blocks, value_blocks, bandwidth, dtype):
    import dask

    states = [
        dask.delayed(_partial, pure=True)(queries, k, v, bandwidth, dtype)
        for k, v in zip(key_blocks, value_blocks)
    ]
    while len(states) > 1:
        states = [
            dask.delayed(merge_partial, pure=True)(states[i], states[i + 1])
            if i + 1 < len(states)
            else states[i]
            for i in range(0, len(states), 2)
        ]
    return states[0]


def _sharded_bandwidth(bandwidth, keys):
    """Resolve a rule name over all shards (n and per-feature std from dask)."""
    import dask.array as da

    if not isinstance(bandwidth, str):
        return bandwidth
    if bandwidth not in regression.BANDWIDTH_RULES:
        raise ValueError(
            f"bandwidth rule must be one of {sorted(regression.BANDWIDTH_RULES)}, got {bandwidth!r}"
        )
    n, d = keys.shape
    sigma = da.nanstd(keys, axis=0, ddof=1).compute() if n > 1 else np.zeros(d)
    sigma = np.where(sigma > 0, sigma, 1.0)
    return regression.BANDWIDTH_RULES[bandwidth](n, d) * sigma


def nadaraya_watson_sharded(queries, keys, values, bandwidth="scott", *, dtype=None):
    """Nadaraya-Watson with keys and values sharded across dask chunks; exact.

    Parameters
    ----------
    queries : array-like or dask Array (n_queries, d)
    keys : dask Array (n_keys, d), chunked along rows (one chunk along features)
    values : dask Array (n_keys,) or (n_keys, n_outputs), chunked like ``keys``
    bandwidth, dtype : as for :func:`nbattn.nadaraya_watson`; a rule name is
        computed over all keys.

    Returns
    -------
    dask Array (n_queries,) or (n_queries, n_outputs), chunked like the
    queries' rows; equal to the in-memory result up to rounding of the merge.
    """
    _require_dask()
    import dask.array as da

    keys = da.asarray(keys)
    values = da.asarray(values)
    if keys.ndim == 1:
        keys = keys[:, None]
    if keys.shape[0] != values.shape[0]:
        raise ValueError(f"values has {values.shape[0]} rows but keys has {keys.shape[0]}")
    squeeze = values.ndim == 1
    keys = keys.rechunk({1: -1})
    values = values.rechunk({0: keys.chunks[0]} if values.ndim == 1 else {0: keys.chunks[0], 1: -1})
    queries = da.asarray(queries)
    if queries.ndim == 1:
        queries = queries[:, None]
    queries = queries.rechunk({1: -1})
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(f"queries has {queries.shape[1]} features but keys has {keys.shape[1]}")
    h = _sharded_bandwidth(bandwidth, keys)
    key_blocks = keys.to_delayed().ravel().tolist()
    value_blocks = values.to_delayed().ravel().tolist()
    n_outputs = 1 if squeeze else values.shape[1]
    pieces = []
    for rows, q_block in zip(queries.chunks[0], queries.to_delayed().ravel().tolist()):
        state = _merged_block(q_block, key_blocks, value_blocks, h, dtype)
        out = state[0]
        pieces.append(da.from_delayed(out, shape=(rows, n_outputs), dtype=np.float64))
    result = da.concatenate(pieces, axis=0)
    return result[:, 0] if squeeze else result
