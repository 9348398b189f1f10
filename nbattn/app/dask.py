"""Dask integration: prediction on dask collections, and attention pooling over
keys sharded across partitions (optional extra ``[dask]``).

Everything here builds dask graphs from the functional layer; it runs
unchanged on the local scheduler or on a ``dask.distributed`` cluster
(``Client(address)``). Workers import nbattn and load its compiled kernels
from numba's on-disk cache, so a worker does not recompile after the first
process on its machine has compiled them.

Training on sharded rows. The leave-one-out loss and its gradient are sums
over query rows, each row against all keys:

    L = 1/(n p) sum_r sum_{i in R_r} ||f_-i(x_i) - y_i||^2,   grad L = sum_r (...)

``sharded_training`` runs every such sum of the smoothing layer (the
bandwidth search of ``bandwidth="loo_scale"``, the L-BFGS-B fits of
``LearnedKernelRegressor``) as one task per row range on the cluster and adds
the partial sums, so the result equals the in-memory one up to the order of
additions. The local-polynomial engine's (the width searches of
``LocalPolynomialRegressor`` and of Nadaraya-Watson on mixed columns,
``nbattn.local.rows``: ranges of k-d chunks with rtol > 0) return their rows
instead, which the calling process sums in the in-memory order: the same bits.
(A table whose rows tie pools them in the calling process, ``nbattn.local.ties``:
its distinct rows' pass is the cheaper one.) An evaluation that loses a worker
runs again. ``fit(estimator, X, y)`` does this for dask collections.

Sharded keys. Nadaraya-Watson over keys split into shards K_1, ..., K_m is
exact: each shard returns, per query, its normalised output ``o_r`` and log
normaliser ``lse_r = log sum_{j in K_r} exp(s_ij)``, and two partial states
merge as

    L = logaddexp(lse_a, lse_b),   o = exp(lse_a - L) o_a + exp(lse_b - L) o_b

(a shard with no admissible key has lse = -inf and weight 0). The merge is
associative, so the shards are combined in a tree. With ``rtol > 0`` each shard
prunes its own k-d tree (``nbattn.smoothing.pruned``) within ``rtol`` of its own
sums, and the tolerance carries over to the merge: a shard's sums err by
E_r <= rtol S_r (keys left out, or a node's series), so the merged sums err by
E = sum_r E_r <= rtol sum_r S_r = rtol S, the single-machine contract.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from functools import partial

import numpy as np

from .. import config
from .._core.numeric import power_of_two_scale
from .._core.progress import FitProgress, check_verbose
from .._core.validation import check_rtol, plural
from ..smoothing import loo_rows, regression

__all__ = [
    "ClusterChunkRunner",
    "compute_with_progress",
    "fit",
    "merge_partial",
    "nadaraya_watson_sharded",
    "predict",
    "sharded_training",
]


def _require_dask():
    try:
        import dask  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError("nbattn.dask needs dask: pip install 'nbattn[dask]'") from exc


def predict(estimator, data, *, method="predict", quantiles=None, progress=False):
    """``estimator.predict`` (or another prediction ``method``) over a dask DataFrame or
    dask Array, partition by partition.

    Parameters
    ----------
    estimator : fitted nbattn (or any scikit-learn) regressor, classifier or density
    data : dask.dataframe.DataFrame or dask.array.Array of shape (n, n_features)
        Array chunks must span all features (one chunk along axis 1).
    method : {"predict", "predict_quantile", "score_samples"}
        What each partition computes: ``predict``; ``predict_quantile(part, quantiles)`` (a
        conditional model's quantiles at the levels ``quantiles``, one output ``q<level>``
        each); ``score_samples`` (a KernelDensity's log density, output ``log_density``).
    quantiles : list of float in (0, 1)
        The levels of ``method="predict_quantile"``.
    progress : bool or int, default False
        Compute the predictions now and report the partitions done on stderr
        (levels as ``verbose=`` of the fits: True or 1 a bar on a terminal, lines
        otherwise; 2 lines always), on the running ``distributed`` client if
        there is one, else on dask's local scheduler. The result is then in
        memory: a pandas Series or DataFrame, or a NumPy array.

    Returns
    -------
    For a DataFrame: a dask Series (one output) or DataFrame (several), with
    the input's index and divisions kept. For an Array: a dask Array chunked
    like the rows of ``data``. Either declares the dtype the partitions hold:
    a classifier's labels (the dtype of ``classes_``), float64 otherwise.
    With ``progress``: that collection computed.
    """
    _require_dask()
    level = check_verbose(progress)
    result = _lazy_predict(estimator, data, method, quantiles)
    if level == 0:
        return result
    return compute_with_progress(result, verbose=level, desc=f"dask.{method}")[0]


def _quantiles_of(estimator, levels, part):
    return estimator.predict_quantile(part, levels)


def _prediction_call(estimator, method, quantiles):
    """(function of a partition, its output names, whether it returns one column)."""
    if method != "predict_quantile" and quantiles is not None:
        raise ValueError("quantiles are the levels of method='predict_quantile'")
    if method == "predict":
        n_outputs = getattr(estimator, "n_outputs_", 1)
        single = n_outputs == 1 and not getattr(estimator, "outputs_2d_", False)
        names = ["prediction"] if single else [f"prediction_{c}" for c in range(n_outputs)]
        return estimator.predict, names, single
    if method == "predict_quantile":
        from ..distribution.conditional import check_levels
        from .arguments import quantile_column

        if not hasattr(estimator, "predict_quantile"):
            raise ValueError(f"{type(estimator).__name__} has no predict_quantile")
        levels = list(check_levels(quantiles, "quantiles")[0])
        names = list(map(quantile_column, levels))
        twice = [name for k, name in enumerate(names) if name in names[:k]]
        if twice:  # two columns of one name: the command line refuses them too
            raise ValueError(f"quantiles: the level {twice[0][1:]} is given twice")
        return partial(_quantiles_of, estimator, levels), names, False
    if method == "score_samples":
        if type(estimator).__name__ != "KernelDensity" or not hasattr(estimator, "score_samples"):
            raise ValueError(
                "method='score_samples' is a KernelDensity's log density of the rows (a "
                f"conditional density needs y too); got {type(estimator).__name__}"
            )
        return estimator.score_samples, ["log_density"], True
    raise ValueError(
        f"method must be 'predict', 'predict_quantile' or 'score_samples'; got {method!r}"
    )


def _lazy_predict(estimator, data, method="predict", quantiles=None):
    """:func:`predict`'s dask collection."""
    import dask.array as da
    import dask.dataframe as dd
    import pandas as pd

    method_call, names, single = _prediction_call(estimator, method, quantiles)
    # an empty array of what the call returns: a classifier's labels' dtype, or float64
    labels = getattr(estimator, "classes_", None) if method == "predict" else None
    empty = np.asarray(labels if labels is not None else np.empty(0))[:0]

    def call(part):
        """The method on a partition; an empty partition (a filter can leave one) gives
        empty output, where the estimators refuse queries of no rows."""
        if len(part) == 0:
            return empty if single else np.empty((0, len(names)), dtype=empty.dtype)
        return method_call(part)

    if isinstance(data, dd.DataFrame):

        def predict_partition(part):
            pred = call(part)
            if single:
                return pd.Series(pred, index=part.index, name=names[0])
            return pd.DataFrame(pred, index=part.index, columns=names)

        if single:
            meta = pd.Series(empty, name=names[0])
        else:
            meta = pd.DataFrame({name: pd.Series(empty) for name in names})
        return data.map_partitions(predict_partition, meta=meta)
    if isinstance(data, da.Array):
        if data.ndim != 2:
            raise ValueError(f"data must be 2-D, got a dask array of shape {data.shape}")
        if data.numblocks[1] != 1:
            data = data.rechunk({1: -1})
        if single:
            return data.map_blocks(call, drop_axis=1, dtype=empty.dtype)
        return data.map_blocks(call, chunks=(data.chunks[0], (len(names),)), dtype=empty.dtype)
    raise ValueError(
        f"data must be a dask DataFrame or dask Array, got {type(data).__name__}; "
        f"call estimator.{method} for in-memory data"
    )


def compute_with_progress(*collections, verbose=1, desc="dask"):
    """``dask.compute(*collections)``, reporting the partitions done on stderr.

    The partitions are the output chunks of the collections. On the running
    ``distributed`` client they are persisted and counted as their futures
    complete (``distributed.as_completed``); without one, dask's local
    scheduler counts them through a scheduler callback
    (``dask.callbacks.Callback``). The lines or the bar are those of
    :class:`nbattn._core.progress.FitProgress` (``verbose`` as there; 0 computes
    silently): ``<desc>: 3/8 partitions done [1.2 s]``. Off a terminal at most
    about 50 lines are written, the last at the end.

    Returns the computed results, a tuple as ``dask.compute`` returns.
    """
    _require_dask()
    import dask
    from dask.core import flatten

    level = check_verbose(verbose)
    if level == 0:
        return dask.compute(*collections)
    keys = {
        key for c in collections if dask.is_dask_collection(c) for key in flatten(c.__dask_keys__())
    }
    with FitProgress(level, desc, total=len(keys), unit="partition") as log:
        counter = _PartitionCounter(log, len(keys))
        client = _current_client()
        if client is not None:
            from distributed import as_completed, futures_of

            persisted = client.persist(list(collections))
            for _ in as_completed(futures_of(persisted)):
                counter.done()
            results = dask.compute(*persisted)
        else:
            with _local_partitions(keys, counter):
                results = dask.compute(*collections)
        counter.finish()  # (a graph optimised into other keys counts at the end)
    return results


class _PartitionCounter:
    """Partitions done -> progress: each on a bar, about 50 lines at most otherwise."""

    def __init__(self, log, total):
        self.log, self.total, self.n = log, total, 0
        self.shown = 0  # partitions already on the bar
        self.every = 1 if log.mode == "bar" else max(1, total // 50)

    def done(self):
        self.n += 1
        if self.n % self.every == 0 or self.n == self.total:
            self.log.step(f"{self.n}/{self.total} partitions done", n=self.n - self.shown)
            self.shown = self.n

    def finish(self):
        while self.n < self.total:
            self.done()


def _local_partitions(keys, counter):
    """A ``dask.callbacks.Callback`` that counts the tasks of ``keys`` as they finish."""
    from dask.callbacks import Callback

    class LocalPartitions(Callback):
        def _posttask(self, key, result, dsk, state, worker_id):
            if key in keys:
                counter.done()

    return LocalPartitions()


def merge_partial(a, b):
    """Merge two partial pooling states ``(out, lse)`` over disjoint key sets (exact).

    ``out`` (n_queries, n_outputs) normalised within its shard, ``lse``
    (n_queries,) its log normaliser; -inf marks a shard with no admissible key.
    The one log-sum-exp merge of the package,
    :func:`nbattn.attn.softmax.merge_attention_states`.
    """
    from ..attn.softmax import merge_attention_states

    return merge_attention_states(a[0], a[1], b[0], b[1])


def _partial(queries, keys, values, bandwidth, dtype, rtol):
    values = values if values.ndim == 2 else values[:, None]
    out, lse = regression.nadaraya_watson(
        queries, keys, values, bandwidth, dtype=dtype, return_lse=True, rtol=rtol
    )
    return np.asarray(out, dtype=np.float64), lse


#: The merge weighs shard r by exp(lse_r - L). A far row's lse_r carries the rounding
#: of its direct score, about (d + 3) u |lse_r| (``nbattn.kernels.pooling``, "Far
#: rows"): beyond this much, shards whose lse lie within that error of each other
#: cannot be ranked.
_LSE_ERROR_LIMIT = 1e-6


def _ranked_shards(merged, lses, first_row, n_features):
    """``merged`` (the merged state's output), or a ValueError naming the first query
    row for which the shards cannot be weighed: every shard's lse -inf (a query beyond
    the float64 range of squared distances from every key), or a best lse whose
    rounding, (d + 3) u |lse|, exceeds ``_LSE_ERROR_LIMIT`` with a second shard within
    twice that rounding plus 50 (so its weight, e^-50 or more, could be anything)."""
    lses = np.stack(lses)
    order = np.sort(lses, axis=0)
    top, second = order[-1], order[-2]
    error = (n_features + 3) * np.finfo(np.float64).eps / 2 * np.abs(top)
    lost = ~np.isfinite(top) | ((error > _LSE_ERROR_LIMIT) & (second >= top - 2 * error - 50))
    if lost.any():
        row = int(np.flatnonzero(lost)[0])
        size = f"{top[row]:.3g}" if np.isfinite(top[row]) else "-inf (overflowed)"
        raise ValueError(
            f"queries row {first_row + row} lies too far from every key for sharded keys: "
            f"its shards' log normalisers ({size}) agree to within their rounding, so the "
            "shards cannot be weighed against each other; pool such queries with the keys "
            "in memory (nbattn.nadaraya_watson ranks the nearest keys exactly)"
        )
    return merged


def _merged_block(queries, key_blocks, value_blocks, bandwidth, dtype, rtol, first_row, n_features):
    import dask

    states = [
        dask.delayed(_partial, pure=True)(queries, k, v, bandwidth, dtype, rtol)
        for k, v in zip(key_blocks, value_blocks)
    ]
    shard_states = states
    while len(states) > 1:
        states = [
            dask.delayed(merge_partial, pure=True)(states[i], states[i + 1])
            if i + 1 < len(states)
            else states[i]
            for i in range(0, len(states), 2)
        ]
    if len(shard_states) == 1:
        return states[0][0]
    return dask.delayed(_ranked_shards, pure=True)(
        states[0][0], [state[1] for state in shard_states], first_row, n_features
    )


def _sharded_bandwidth(bandwidth, keys):
    """Resolve a rule name over all shards (n and per-feature std from dask)."""
    import dask.array as da

    if not isinstance(bandwidth, str):
        return bandwidth
    n, d = keys.shape
    if n < 2:
        return regression.rule_bandwidth(np.zeros(d), n, bandwidth)
    # divide by a power of two near each column's largest magnitude (exact), so
    # the squares of data near 1e160 or 1e-170 neither overflow nor underflow
    scale = power_of_two_scale(da.nanmax(abs(keys), axis=0).compute())
    sigma = da.nanstd(keys / scale, axis=0, ddof=1).compute() * scale
    return regression.rule_bandwidth(sigma, n, bandwidth)


def nadaraya_watson_sharded(
    queries, keys, values, bandwidth="scott", *, dtype=None, rtol=0.0, progress=False
):
    """Nadaraya-Watson with keys and values sharded across dask chunks; exact, or
    within ``rtol``.

    Parameters
    ----------
    queries : array-like or dask Array (n_queries, d)
    keys : dask Array (n_keys, d), chunked along rows (one chunk along features)
    values : dask Array (n_keys,) or (n_keys, n_outputs), chunked like ``keys``
    bandwidth, dtype : as for :func:`nbattn.nadaraya_watson`; a rule name is
        computed over all keys.
    rtol : float in [0, 1), default 0
        :func:`nbattn.nadaraya_watson`'s tolerance, applied by each shard to its
        own kernel sums (its own k-d tree, built where the shard lies): every
        shard's normaliser S_r comes out in [(1 - rtol) S_r, (1 + rtol) S_r], so
        the merged one in [(1 - rtol) S, (1 + rtol) S], and each prediction obeys
        the same bound as on one machine,
        ``|f_hat_i - f_i| <= rtol / (1 - rtol) max_j |v_j - f_i|``.
        0 computes every pair.
    progress : bool or int, default False
        Compute the result now and report the query blocks done on stderr, as
        :func:`predict` does; the result is then a NumPy array.

    Returns
    -------
    dask Array (n_queries,) or (n_queries, n_outputs), chunked like the
    queries' rows; with ``rtol=0`` equal to the in-memory result up to rounding of
    the merge.
    With ``progress``: that array computed.

    Raises
    ------
    ValueError
        At once: keys, values or queries with chunks of unknown size (compute them
        first), no key at all. When computed: a query so far from every key (about
        1e16 widths or more) that its shards' log normalisers agree to within their
        rounding, naming its row: the merge could not weigh the shards' nearest
        keys, which the in-memory :func:`nbattn.nadaraya_watson` ranks exactly.
        Chunks of no rows are skipped.
    """
    _require_dask()
    import dask.array as da

    rtol = check_rtol(rtol)
    keys = da.asarray(keys)
    values = da.asarray(values)
    queries = da.asarray(queries)
    for name, array in (("queries", queries), ("keys", keys), ("values", values)):
        if any(math.isnan(size) for size in array.chunks[0]):
            raise ValueError(
                f"{name} has chunks of unknown size (after boolean indexing, or a dask "
                f"DataFrame's to_dask_array()): call {name}.compute_chunk_sizes() first, or "
                "to_dask_array(lengths=True)"
            )
    if keys.ndim == 1:
        keys = keys[:, None]
    if keys.shape[0] != values.shape[0]:
        raise ValueError(
            f"values has {plural(values.shape[0], 'row')} but keys has {keys.shape[0]}"
        )
    squeeze = values.ndim == 1
    keys = keys.rechunk({1: -1})
    values = values.rechunk({0: keys.chunks[0]} if values.ndim == 1 else {0: keys.chunks[0], 1: -1})
    if queries.ndim == 1:
        queries = queries[:, None]
    queries = queries.rechunk({1: -1})
    if queries.shape[1] != keys.shape[1]:
        raise ValueError(
            f"queries has {plural(queries.shape[1], 'feature')} but keys has {keys.shape[1]}"
        )
    h = _sharded_bandwidth(bandwidth, keys)
    # a shard of no rows adds nothing (dask allows chunks of 0 rows)
    filled = [rows > 0 for rows in keys.chunks[0]]
    if not any(filled):
        raise ValueError(f"keys is empty (shape {keys.shape})")
    key_blocks = [b for b, f in zip(keys.to_delayed().ravel().tolist(), filled) if f]
    value_blocks = [b for b, f in zip(values.to_delayed().ravel().tolist(), filled) if f]
    n_outputs = 1 if squeeze else values.shape[1]
    pieces = []
    first_row = 0
    for rows, q_block in zip(queries.chunks[0], queries.to_delayed().ravel().tolist()):
        out = _merged_block(
            q_block, key_blocks, value_blocks, h, dtype, rtol, first_row, keys.shape[1]
        )
        first_row += rows
        pieces.append(da.from_delayed(out, shape=(rows, n_outputs), dtype=np.float64))
    result = da.concatenate(pieces, axis=0)
    result = result[:, 0] if squeeze else result
    level = check_verbose(progress)
    if level == 0:
        return result
    return compute_with_progress(result, verbose=level, desc="dask.nadaraya_watson_sharded")[0]


def _add_partials(parts):
    """Elementwise sum of task results: floats, arrays, or tuples of them."""
    total = parts[0]
    for part in parts[1:]:
        if isinstance(total, tuple):
            total = tuple(a + b for a, b in zip(total, part))
        else:
            total = total + part
    return total


@contextmanager
def sharded_training(client=None, n_partitions=None, verbose=0):
    """Run the leave-one-out sums (``nbattn.smoothing.loo_rows``) over row ranges on a cluster.

    Inside the ``with`` block every LOO loss (and gradient) evaluation is split
    into ``n_partitions`` row ranges (default: twice the number of workers);
    each range is a task that scores its rows against all keys, and the
    partial sums come back to be added. Arrays go to the workers with
    ``client.scatter`` once per evaluation (to one worker each, from which the
    tasks on the others fetch them), under fresh keys (``hash=False``):
    content-hashed keys would let the release of one evaluation's copy drop
    the identical array that the next evaluation has just scattered.

    Without a ``distributed`` client (none given and none running) the sums
    run in this process on numba's threads, as they do outside the block:
    dask's local threaded scheduler would only run the same kernels
    concurrently from several threads, which numba's parallel kernels must
    not be (and cannot use more cores than they already do).

    Parameters
    ----------
    client : distributed.Client, optional (default: the current client, if any)
    n_partitions : int, optional
    verbose : bool or int, default 0
        Report each evaluation on the cluster on stderr (levels as ``verbose=``
        of the fits): its row ranges done while it runs (on a terminal's bar),
        a line per evaluation otherwise, each with the elapsed time.
    """
    _require_dask()
    level = check_verbose(verbose)
    if client is None:
        client = _current_client()
    if n_partitions is None and client is not None:
        n_partitions = 2 * max(1, len(client.scheduler_info()["workers"]))
    if n_partitions is None:
        n_partitions = 1
    if int(n_partitions) < 1:
        raise ValueError(f"n_partitions must be >= 1, got {n_partitions!r}")

    def bounds_of(n_rows):
        bounds = np.linspace(0, n_rows, min(int(n_partitions), n_rows) + 1).astype(np.int64)
        return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    evaluations = []  # row ranges of each evaluation run so far

    lost_worker_errors = _lost_worker_errors() if client is not None else ()

    def evaluate(task, n_rows, args):
        # arrays and the engine's layouts (dataclasses of arrays) are scattered once, and
        # the tasks fetch them from the worker that holds them. Not broadcast: replicating
        # to a worker that had just died, still listed by the scheduler, hung past the
        # scatter's own timeout (about one evaluation in three after a worker was killed).
        # A scatter that reaches a dead worker fails within the timeout and is retried.
        timeout = config.DASK_CONNECT_TIMEOUT
        remote = [
            client.scatter(a, hash=False, timeout=timeout) if _shipped_once(a) else a for a in args
        ]
        futures = [client.submit(task, a, b, *remote, pure=False) for a, b in bounds_of(n_rows)]
        if log.enabled:
            _report_evaluation(log, futures, len(evaluations) + 1)
        evaluations.append(len(futures))
        return _add_partials(client.gather(futures))

    def cluster_runner(task, n_rows, args):
        """One evaluation, run again (arguments scattered afresh) where a worker was lost
        during it: the tasks are pure functions of their arguments, so a repeat gives the
        same sums."""
        for attempt in range(_EVALUATION_ATTEMPTS):
            try:
                return evaluate(task, n_rows, args)
            except lost_worker_errors as exc:
                if attempt + 1 == _EVALUATION_ATTEMPTS:
                    raise RuntimeError(
                        f"a leave-one-out evaluation on the cluster failed {_EVALUATION_ATTEMPTS} "
                        f"times as workers were lost (last: {exc!r})"
                    ) from exc
                client.wait_for_workers(1, timeout=config.DASK_CONNECT_TIMEOUT)
        raise AssertionError("unreachable")

    if client is None:  # no cluster: the sums run here, on numba's threads
        yield None
        return
    with (
        FitProgress(level, "dask.sharded_training", unit="evaluation") as log,
        loo_rows.row_runner(cluster_runner),
    ):
        yield client
        if log.enabled:
            log.note(
                f"{plural(len(evaluations), 'evaluation')}, "
                f"{plural(sum(evaluations), 'task')} on the cluster"
            )


#: Tries of one leave-one-out evaluation on the cluster when workers are lost during it.
_EVALUATION_ATTEMPTS = 3


def _lost_worker_errors():
    """The errors of an evaluation that lost a worker: a closed connection, a scatter or
    replication that timed out, a task whose workers kept dying, a cancelled future."""
    from concurrent.futures import CancelledError

    from distributed.scheduler import KilledWorker

    return (OSError, TimeoutError, KilledWorker, CancelledError)


def _shipped_once(arg) -> bool:
    """Whether a row task's argument is scattered to the workers once per evaluation (an
    array, or a dataclass of them such as the engine's ``TreeLayout``) rather than
    pickled into every task."""
    return isinstance(arg, np.ndarray) or (
        dataclasses.is_dataclass(arg) and not isinstance(arg, type)
    )


def _report_evaluation(log, futures, k):
    """The row ranges of evaluation ``k`` as they complete, then its line."""
    from distributed import as_completed

    for done, _ in enumerate(as_completed(futures), start=1):
        log.status(f"LOO evaluation {k}: {done}/{len(futures)} row ranges done")
    log.step(f"LOO evaluation {k}: {len(futures)}/{len(futures)} row ranges done")


def fit(estimator, X, y, client=None, n_partitions=None, *, verbose=None):
    """Fit an nbattn estimator on dask collections, its LOO sums run on the cluster.

    The training rows are gathered once (every row is a key of every other,
    so each task needs all of them); the n^2 work of the leave-one-out loss
    and gradient is split over query-row ranges, one task each (default: the
    number of partitions of ``X``). Estimators whose fit has no LOO sums
    (fixed or rule-of-thumb bandwidths) just fit on the gathered data.

    ``client``: a ``distributed.Client`` (default: the running one). Without
    any, ``X`` and ``y`` are computed with dask's local scheduler and the fit
    runs in this process, its LOO sums on numba's threads.

    ``verbose`` (default: the estimator's own ``verbose``, else 0; levels as
    there) reports the partitions of ``X`` and ``y`` gathered
    (:func:`compute_with_progress`) and each LOO evaluation on the cluster
    (:func:`sharded_training`); the estimator's ``verbose`` reports its search
    or iterations, as it does without Dask.

    Returns the fitted estimator.
    """
    _require_dask()
    if verbose is None:
        verbose = getattr(estimator, "verbose", 0)
    level = check_verbose(verbose)
    if n_partitions is None:
        n_partitions = getattr(X, "npartitions", None)
        if n_partitions is None and hasattr(X, "numblocks"):
            n_partitions = X.numblocks[0]
    X_local, y_local = compute_with_progress(X, y, verbose=level, desc="dask.fit")
    with sharded_training(client, n_partitions, verbose=level):
        return estimator.fit(X_local, y_local)


def _current_client():
    """The running ``distributed`` client, or None (no distributed, or no client)."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # "No clients found"
        return None


# ----------------------------------------------------------------------------- batch prediction


class ClusterChunkRunner:
    """Run ``function(model, X, *args)`` on chunks on a ``dask.distributed`` cluster,
    results handed back in order.

    The model is sent to every worker once; at most ``2 x workers`` chunks are
    in flight, and ``write(result, ids)`` receives the results in input
    order, so memory stays bounded and the output equals a local run
    (``nbattn predict --scheduler`` passes :func:`nbattn.app.batch.predict_columns`).

    ``with ClusterChunkRunner(address, model, write, function, *args) as run:
    run.submit(X, ids) ...; run.finish()``
    """

    def __init__(self, address, model, write, function, *args):
        self.address, self.model, self.write = address, model, write
        self.function, self.args = function, args
        self.client = None
        self.pending = []

    def __enter__(self):
        try:
            from distributed import Client
        except ImportError as exc:
            raise ValueError("--scheduler needs dask: pip install 'nbattn[dask]'") from exc
        try:
            self.client = Client(self.address, timeout=config.DASK_CONNECT_TIMEOUT)
        except OSError as exc:
            raise ValueError(f"cannot reach the dask scheduler {self.address}: {exc}") from exc
        self.remote_model = self.client.scatter(self.model, broadcast=True, hash=False)
        self.window = 2 * max(1, len(self.client.scheduler_info()["workers"]))
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            for future, _ in self.pending:
                future.cancel()
            self.client.close()
        return False

    def submit(self, X, ids, **kwargs) -> None:
        """Run ``function(model, X, *args, **kwargs)`` on the cluster; ``ids`` go to ``write``
        with its result."""
        future = self.client.submit(
            self.function, self.remote_model, X, *self.args, **kwargs, pure=False
        )
        self.pending.append((future, ids))
        while len(self.pending) > self.window:
            self._drain_one()

    def _drain_one(self) -> None:
        future, ids = self.pending.pop(0)
        self.write(future.result(), ids)

    def finish(self) -> None:
        while self.pending:
            self._drain_one()
