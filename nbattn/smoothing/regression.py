"""Functional kernel regression: Nadaraya-Watson attention pooling.

    f(q) = sum_j softmax_j( -1/2 sum_d ((q_d - k_jd) / h_d)^2 ) v_j

(the attention-pooling walk-through, section 1.3.2), computed by the streaming kernel in
``nbattn.kernels.pooling`` (or, for many features, on the BLAS tiles of
``nbattn.kernels.pooling_gemm``): exact, stable, and without the queries x keys
matrix. This layer validates inputs, resolves bandwidth rules, lays the
arrays out for the kernel and dispatches to the device. Beside the prediction: the
attention-weighted spread about it (:func:`nadaraya_watson_spread`, a second
streaming pass of ``nbattn.kernels.loo``) and the weight matrix for diagnostics
(:func:`gaussian_attention_weights`).
"""

from __future__ import annotations

import numpy as np

from .. import config
from .._core.numeric import median, power_of_two_scale
from .._core.threads import serial_below
from .._core.validation import (
    as_float_array,
    check_bandwidth,
    check_bool,
    check_choice,
    check_pooling_inputs,
    check_rtol,
    check_same_features,
    resolve_dtype,
    scaled_columns,
)
from ..dispatch.device import device_for, kernels_for
from ..dispatch.transfer import as_device_array, is_device_array, like_input, to_device, to_host
from .pruned import pool_within_rtol, worth_a_tree

__all__ = [
    "BANDWIDTH_RULES",
    "average_pooling",
    "bandwidth_rule",
    "effective_size",
    "feature_spread",
    "rule_bandwidth",
    "gaussian_attention_weights",
    "nadaraya_watson",
    "nadaraya_watson_spread",
    "resolve_bandwidth",
    "gaussian_pool",
    "gaussian_pool_spread",
    "scaled_layout",
    "uses_gemm_tiles",
    "weighted_spread",
]


def _scott(n: int, d: int) -> float:
    return n ** (-1.0 / (d + 4))


def _silverman(n: int, d: int) -> float:
    return (n * (d + 2) / 4.0) ** (-1.0 / (d + 4))


#: Bandwidth rules by name: factor(n, d) multiplied by each feature's spread.
BANDWIDTH_RULES = {"scott": _scott, "silverman": _silverman}


def feature_spread(X: np.ndarray, ddof: int = 1, name: str = "X", columns=None) -> np.ndarray:
    """Standard deviation (``ddof=1``: the sample's) per column of a 2-D float64 array,
    at any magnitude.

    Each column is divided by a power of two near its largest magnitude
    (exact) before the mean and the squares, and the result multiplied back,
    so neither the squares of data near 1e160 overflow nor those of data near
    1e-170 underflow. Zeros for fewer than ``ddof + 1`` rows. A column whose spread
    itself lies beyond the float64 range (values from -1.7e308 to 1.7e308) raises a
    ValueError naming ``name`` and the column (its number in ``columns``, when given).
    """
    n, d = X.shape
    if n <= ddof:
        return np.zeros(d)
    scale = power_of_two_scale(np.abs(X).max(axis=0))
    unit = (X / scale).std(axis=0, ddof=ddof)
    with np.errstate(over="ignore"):
        spread = unit * scale
    wide = np.flatnonzero(np.isinf(spread))
    if wide.size:
        c = int(wide[0])
        shown_column = c if columns is None else columns[c]
        raise ValueError(
            f"{name} column {shown_column} spreads beyond the float64 range (standard deviation "
            f"{unit[c]:.3g} x 2**{int(np.log2(scale[c]))}); rescale the column (divide it by "
            "a power of ten)"
        )
    return spread


def effective_size(w) -> float:
    """Kish's effective number of rows ``n_eff = (sum s)^2 / sum s^2`` of weights ``s``
    (n for equal weights, 1 for one positive weight, 0 for none), computed on the weights
    divided by their largest, so the same for ``c s`` at any c > 0 (exactly when c is a
    power of two) and free of overflow."""
    w = np.asarray(w, dtype=np.float64)
    top = float(w.max()) if w.size else 0.0
    if top <= 0.0:
        return 0.0
    u = w / top
    total = float(u.sum())
    return total * total / float(u @ u)


def weighted_spread(X, w) -> np.ndarray:
    """Weighted standard deviation per column, scale-free in the weights.

    ``sigma^2 = sum s (x - m)^2 / sum s * n_eff / (n_eff - 1)`` with the weighted mean m
    and Kish's n_eff (:func:`effective_size`): the sample spread (n - 1) for equal
    weights, the same for ``c s`` at any c > 0. Zeros when fewer than two rows have
    weight. The weights are divided by their largest and the columns by a power of two
    near their largest magnitude first; the denominator
    ``sum s - sum s^2 / sum s = sum_i s_i (sum_{j != i} s_j) / sum s`` is summed term by
    term, so it keeps its digits when all the weight but a sliver sits on one row.
    """
    X = np.asarray(X, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if X.shape[0] == 0 or np.count_nonzero(w) < 2:
        return np.zeros(X.shape[1])
    big = int(np.argmax(w))
    u = w / w[big]
    total = float(u.sum())
    rest = float(np.delete(u, big).sum())  # sum s_j over j != big, without cancellation
    others = total - u  # sum over j != i, accurate where u_i <= 1 <= the rest of total
    others[big] = rest
    denominator = float(u @ others) / total
    if not denominator > 0.0:
        return np.zeros(X.shape[1])
    peak = np.abs(X).max(axis=0)
    scale = np.ldexp(1.0, np.frexp(np.where(peak > 0, peak, 1.0))[1])
    Z = X / scale
    mean = (u @ Z) / total
    return np.sqrt((u @ ((Z - mean) ** 2)) / denominator) * scale


def bandwidth_rule(X, rule: str = "scott") -> np.ndarray:
    """Per-feature rule-of-thumb bandwidths, as in ``scipy.stats.gaussian_kde``.

    ``h_d = factor(n, d) * sigma_d`` with ``sigma_d`` the sample standard
    deviation (ddof=1) of feature d, and

    * Scott:     factor = n ** (-1 / (d + 4))
    * Silverman: factor = (n (d + 2) / 4) ** (-1 / (d + 4))

    The spread is computed on each column divided by a power of two near its
    largest magnitude, so the widths scale with the data from 1e-300 to 1e300
    (units do not matter). A constant feature (sigma_d = 0, or a single
    sample) has no spread to scale by; it gets sigma_d = 1, so its width is
    measured in the feature's own units rather than dividing by zero.

    Raises
    ------
    ValueError
        ``rule`` unknown, or a feature whose width would be a subnormal number
        (spread below ~1e-308), whose scaled distances cannot be represented.
    """
    X = as_float_array(X, "X", ndim=(1, 2), dtype="float64")
    if X.ndim == 1:
        X = X[:, None]
    return rule_bandwidth(feature_spread(X), X.shape[0], rule)


def rule_bandwidth(sigma, n: int, rule: str = "scott") -> np.ndarray:
    """A rule's widths ``factor(n, d) * sigma_d`` from per-feature spreads ``sigma`` (d,).

    The one place that turns spreads into widths: :func:`bandwidth_rule` and
    every other caller that measures the spread elsewhere (on a GPU, over
    dask shards) end here. A zero spread (constant feature, or n < 2) becomes
    1, the feature's own unit.

    Raises
    ------
    ValueError
        ``rule`` unknown, or a width below the smallest normal float64.
    """
    check_choice(rule, "bandwidth rule", sorted(BANDWIDTH_RULES))
    sigma = np.asarray(sigma, dtype=np.float64).reshape(-1)
    sigma = np.where(sigma > 0, sigma, 1.0)
    h = BANDWIDTH_RULES[rule](n, sigma.size) * sigma
    tiny = np.flatnonzero(h < np.finfo(np.float64).tiny)
    if tiny.size:
        raise ValueError(
            f"X column {tiny[0]} has a spread of {sigma[tiny[0]]:.3g}: its {rule} width "
            f"{h[tiny[0]]:.3g} is below the smallest normal float64; rescale that column"
        )
    return h


def resolve_bandwidth(bandwidth, keys: np.ndarray, name: str = "keys") -> np.ndarray:
    """A rule name, a float or a per-feature array → per-feature array (d,), for checked
    float64 keys (n, d) (a rule's widths are :func:`bandwidth_rule`'s)."""
    if isinstance(bandwidth, str):
        return rule_bandwidth(feature_spread(keys, name=name), keys.shape[0], bandwidth)
    return check_bandwidth(bandwidth, keys.shape[1])


def scaled_layout(points, scale, dtype, *, name="X", widths=None, width_name="width"):
    """points * scale / sqrt(2) as (rows, transposed) in ``dtype``: the kernels' layout,
    without the centring of the pooling's layout (the leave-one-out criteria centre
    their data once, beforehand).

    ``scale`` is 1 / widths (``widths`` themselves, when given, word the error):
    a point that overflows once scaled gets
    :func:`~nbattn._core.validation.scaled_columns`'s error naming ``name``.
    """
    scale = np.asarray(scale, dtype=np.float64)
    if widths is None:
        with np.errstate(divide="ignore", over="ignore"):
            widths = 1.0 / scale
    z = scaled_columns(
        points, name, widths, scale=scale / np.sqrt(2.0), dtype=dtype, width_name=width_name
    )
    z = np.ascontiguousarray(z)
    return z, np.ascontiguousarray(z.T)


def _score_scale(h):
    """1 / (h sqrt 2) per width, also for widths near the float64 limit (where h sqrt 2
    would overflow and the scale come out 0: every point at one spot)."""
    h = np.asarray(h, dtype=np.float64)
    with np.errstate(over="ignore"):
        return np.where(h < _HALF_MAX, 1.0 / (h * np.sqrt(2.0)), (1.0 / h) / np.sqrt(2.0))


_HALF_MAX = float(np.finfo(np.float64).max) / 2

#: Rows of the keys whose per-feature median centres the data (evenly spaced).
_CENTRE_SAMPLE = 512


def _layout(queries, keys, values, h, dtype, keys_row_major=False, keys_feature_major=True):
    """Centre on the keys' median, scale by 1/(h sqrt 2) and lay out for the kernels
    (see pooling): ``(q, k_t, v_t, k)``, ``k`` the row-major keys or None, ``k_t``
    the feature-major keys or, without ``keys_feature_major``, an empty (0, 0) array.

    The centring is done in float64 and cancels in every score; it keeps data
    far from the origin exact in float32 (keys at 1e8 + [0, 1, 2] would round
    to one value) and the norms of the GEMM path small. The median is taken
    over at most ``_CENTRE_SAMPLE`` evenly spaced keys: any centre among the
    keys serves, and a full median of a wide array costs more than the pool.
    """
    scale = _score_scale(h)
    step = max(1, keys.shape[0] // _CENTRE_SAMPLE)
    centre = median(keys[::step])
    dtype = np.dtype(dtype)
    n_keys, d = keys.shape
    q = _centred_scaled(queries, centre, h, scale, dtype, "queries")
    k_t = np.empty((d, n_keys) if keys_feature_major else (0, 0), dtype=dtype)
    k = np.empty((n_keys, d), dtype=dtype) if keys_row_major else np.empty((0, d), dtype=dtype)
    _centred_scaled(keys, centre, h, scale, dtype, "keys", k, k_t)
    v_t = None
    if values is not None:
        v_t = np.ascontiguousarray(as_float_array(values, "values", dtype=dtype).T)
    return q, k_t, v_t, (k if keys_row_major else None)


def _centred_scaled(x, centre, h, scale, dtype, name, out=None, out_t=None):
    """(x - centre) * scale in ``dtype`` through the one-pass layout kernel; with
    ``out``/``out_t`` given, written there (row-major / feature-major), else a new
    row-major array is returned. Where a value overflows float64 or ``dtype``, the
    array is laid out again by ``scaled_columns``, which computes what it can in a
    safer order and words the error for the rest (naming ``name``, the row, the
    column and the width ``h``)."""
    if out is None:
        out = np.empty(x.shape, dtype=dtype)
        out_t = np.empty((0, 0), dtype=dtype)
    kernel = kernels_for("pooling", "cpu").centred_scaled
    centre = np.ascontiguousarray(centre, dtype=np.float64)
    scale = np.ascontiguousarray(scale, dtype=np.float64)
    # writable: a read-only x (a memory-mapped X_fit_) would compile the kernel again
    largest = kernel(np.require(x, requirements=("C", "W")), centre, scale, out, out_t)
    if not largest <= float(np.finfo(dtype).max):  # overflow: the safe, checked path
        z = scaled_columns(x, name, h, scale=scale, centre=centre, dtype=dtype)
        if out.shape[0] == x.shape[0]:
            out[...] = z
        if out_t.shape == (x.shape[1], x.shape[0]):
            out_t[...] = z.T
    return out


def _check_exclude_self(exclude_self, queries, keys):
    if exclude_self and queries.shape[0] != keys.shape[0]:
        raise ValueError(
            "exclude_self=True pairs query i with key i, so queries and keys must have the "
            f"same number of rows; got {queries.shape[0]} and {keys.shape[0]}"
        )


def nadaraya_watson(
    queries,
    keys,
    values,
    bandwidth="scott",
    exclude_self=False,
    *,
    dtype=None,
    return_lse=False,
    device="cpu",
    rtol=0.0,
):
    """Nadaraya-Watson regression with a Gaussian kernel (attention pooling).

    .. math::

        f(q_i) = \\sum_j \\operatorname{softmax}_j\\Big(-\\tfrac12 \\sum_d
                 \\big(\\tfrac{q_{id} - k_{jd}}{h_d}\\big)^2\\Big)\\, v_j

    Parameters
    ----------
    queries : array-like (n_queries, d) or (n_queries,) when d = 1
    keys : array-like (n_keys, d) or (n_keys,)
    values : array-like (n_keys,) or (n_keys, n_outputs)
    bandwidth : "scott", "silverman", float or array (d,)
        Per-feature widths h_d; rule names are computed from ``keys``.
    exclude_self : bool
        Skip the pair (i, i): the leave-one-out prediction when ``queries``
        are the ``keys``.
    dtype : "float64" (default, or the inputs' float32) or "float32"
        The precision of the computation; running sums are float64 always.
    return_lse : bool
        Also return ``lse_i = log sum_j exp(s_ij)`` (float64), the log
        normaliser, which merges partial results over key shards exactly.
    device : "cpu", "cuda" or "auto"
        "auto" runs on a CUDA GPU when numba sees one, else on the CPU.
    rtol : float in [0, 1), default 0
        A relative tolerance on the kernel sums. 0 computes every pair (the exact
        streaming path). With ``rtol > 0`` each query's normaliser
        S = sum_j exp(s_ij) may leave out keys of total weight E <= rtol * S, so
        that the computed normaliser lies in [(1 - rtol) S, S], each weighted sum
        within ``rtol * S * max_j |v_j|`` of its exact value, lse within
        -log(1 - rtol) of it, and each prediction obeys

        .. math::

            |\\hat f_i - f_i| \\le \\frac{\\mathrm{rtol}}{1 - \\mathrm{rtol}}
            \\max_j |v_j - f_i|

        (per output column; :math:`f_i` the exact prediction, :math:`\\hat f_i`
        the returned one), on top of the rounding
        that the exact path carries too. The keys left out are certified small by
        a k-d tree over the scaled keys (``nbattn.kernels.tree_pool`` states the
        rule and proves the bound); a cost model runs the exact path instead
        where the tree would not pay (few keys, many features, little to prune),
        so ``rtol > 0`` may return the exact result. At wide widths with at most
        three features the tree may also sum a node of keys by its Taylor series
        (the improved fast Gauss transform), within a certified error paid for out
        of ``rtol``: the normaliser then lies in [(1 - rtol) S, (1 + rtol) S] (lse
        within log(1 + rtol) above), the other bounds as stated
        (``nbattn.kernels.tree_pool``, "Series"). In float64 from
        ``rtol = 1.6e-7`` on, the kept weights come from an exponential within
        1e-8 relative, paid for out of ``rtol``: the normaliser may then also
        exceed S by 1e-8 S (lse its exact value by 1e-8); the other bounds stay
        as stated. CPU only: ``rtol > 0`` with the GPU raises NotImplementedError.

    Returns
    -------
    out : ndarray (n_queries,) if ``values`` is 1-D, else (n_queries, n_outputs)
    lse : ndarray (n_queries,), only with ``return_lse=True``

    Raises
    ------
    NotImplementedError
        ``rtol > 0`` on the GPU (``device="cuda"``, or "auto" where a GPU is).

    GPU arrays (numba device arrays, CuPy, torch CUDA tensors) are used where
    they are, without a round trip through the host, and the results come
    back as the same kind of GPU array as ``queries``.

    Notes
    -----
    Computed with an online softmax over key blocks, never holding the
    n_queries x n_keys matrix; a query far from every key gets its nearest
    key's value (where the textbook formula gives 0/0). A query with no
    admissible key (one key, excluded) gets 0 and lse = -inf. On the CPU, rows
    whose weights cannot underflow take one fused pass without a running
    maximum (``nbattn.kernels.pooling``, "One pass"), and inputs with at least
    ``config.GEMM_MIN_FEATURES_<dtype>`` features compute their scores on BLAS tiles
    as 2 q.k - ||k||^2 - ||q||^2 (``nbattn.kernels.pooling_gemm``), with the
    same results to rounding.
    """
    dtype = resolve_dtype(dtype, queries, keys, values)
    exclude_self = check_bool(exclude_self, "exclude_self")
    return_lse = check_bool(return_lse, "return_lse")
    rtol = check_rtol(rtol)
    device = device_for(device, queries, keys, values)
    if device == "cuda" and rtol > 0.0:
        raise NotImplementedError(
            f"rtol={rtol!r} (the pruned k-d tree path) runs on the CPU only: pass "
            "device='cpu' and host arrays, or rtol=0 for the exact GPU path"
        )
    if device == "cuda" and any(is_device_array(a) for a in (queries, keys, values)):
        return _nadaraya_watson_on_device(
            queries, keys, values, bandwidth, exclude_self, dtype, return_lse
        )
    queries, keys, values_2d, values_1d = check_pooling_inputs(queries, keys, values)
    _check_exclude_self(exclude_self, queries, keys)
    h = resolve_bandwidth(bandwidth, keys)
    out, lse = gaussian_pool(queries, keys, values_2d, h, dtype, device, exclude_self, rtol)
    if values_1d:
        out = out[:, 0]
    return (out, lse) if return_lse else out


def gaussian_pool(queries, keys, values, h, dtype, device, exclude_self=False, rtol=0.0):
    """``(out (n_queries, p), lse)`` of :func:`nadaraya_watson` on checked host arrays:
    float64 queries (n_queries, d) and keys (n_keys, d), values (n_keys, p), widths h
    (d,), a resolved dtype and device ("cpu" or "cuda"), a checked ``rtol`` (> 0: the
    k-d tree path of :mod:`nbattn.smoothing.pruned` on the CPU where its cost model
    expects it to pay)."""
    gemm = device == "cpu" and uses_gemm_tiles(keys.shape[1], dtype)
    n_keys, n_features = keys.shape
    if rtol > 0.0 and device == "cpu" and not gemm:
        if worth_a_tree(queries.shape[0], n_keys, n_features):
            q, k_t, v_t, _ = _layout(queries, keys, values, h, dtype)
            result = pool_within_rtol(q, k_t, v_t, exclude_self, rtol)
            if result is None:  # the cost model chose the exact path
                result = kernels_for("pooling", "cpu").gaussian_pool(q, k_t, v_t, exclude_self, 0)
            return result
    # the GEMM tiles read the row-major keys (and transpose them only for far rows)
    q, k_t, v_t, k = _layout(
        queries, keys, values, h, dtype, keys_row_major=gemm, keys_feature_major=not gemm
    )
    if gemm:
        out, lse = _gaussian_pool_gemm(q, k, k_t, v_t, exclude_self)
    else:
        out, lse = kernels_for("pooling", device).gaussian_pool(q, k_t, v_t, exclude_self, 0)
    if device == "cuda":
        out, lse = to_host(out, lse)
        _far_rows_on_the_cpu(out, lse, q, k_t, v_t, exclude_self)
    return out, lse


def uses_gemm_tiles(n_features: int, dtype) -> bool:
    """Whether the CPU pools ``n_features`` features of ``dtype`` on BLAS tiles
    (``config.GEMM_MIN_FEATURES_FLOAT32`` / ``_FLOAT64``, read at call time).

    Below the crossover the direct differences (d passes over a key block) are
    cheaper than a GEMM and its packing, and more accurate; above it the GEMM
    (``nbattn.kernels.pooling_gemm``) wins.
    """
    if np.dtype(dtype) == np.float32:
        return n_features >= config.GEMM_MIN_FEATURES_FLOAT32
    return n_features >= config.GEMM_MIN_FEATURES_FLOAT64


def _gaussian_pool_gemm(q, keys, k_t, v_t, exclude_self):
    """The GEMM-tile pool of the laid-out arrays (keys row-major; feature-major or an
    empty ``k_t``), BLAS on one thread. Tiles of enough work (milliseconds each) are
    handed to numba's threads one at a time, so a thread the OS holds back does not
    keep the other waiting for its share."""
    from .._core.threads import blas_one_thread, dynamic_below

    block_q, _ = kernels_for("pooling_gemm", "cpu").tile_shape(keys.shape[1])
    item_work = block_q * keys.shape[0] * keys.shape[1]  # multiply-adds per row tile
    with blas_one_thread(), dynamic_below(item_work, config.FLASH_DYNAMIC_ITEM_WORK):
        return kernels_for("pooling_gemm", "cpu").gaussian_pool_gemm(
            q, keys, k_t, v_t, exclude_self, 0
        )


def _far_rows(lse, dtype, n_keys, exclude_self):
    """Rows a CUDA pool may have got wrong: its kernels have no far-row path.

    A row whose best score m is below ``-config.FAR_SCORE_<dtype>`` has
    lse <= m + log(n_keys); a row whose every score overflowed has lse = -inf
    (or NaN) although it has an admissible key. The CPU kernels recompute such rows
    relative to the nearest key (:mod:`nbattn.kernels.pooling`).
    """
    if n_keys <= (1 if exclude_self else 0):  # no admissible key: lse = -inf is right
        return np.empty(0, dtype=np.int64)
    limit = config.FAR_SCORE_FLOAT32 if np.dtype(dtype) == np.float32 else config.FAR_SCORE_FLOAT64
    return np.flatnonzero(~(lse >= -limit + np.log(n_keys)))  # NaN from inf - inf too


def _far_rows_on_the_cpu(out, lse, q, k_t, v_t, exclude_self):
    """Recompute, in place and on the CPU, the rows :func:`_far_rows` picks (host arrays)."""
    cpu = kernels_for("pooling", "cpu")
    for i in _far_rows(lse, q.dtype, k_t.shape[1], exclude_self):
        row_out, row_lse = cpu.gaussian_pool(q[i : i + 1], k_t, v_t, exclude_self, i)
        out[i], lse[i] = row_out[0], row_lse[0]


def _device_2d(x, name):
    """A checked GPU array (1-D or 2-D) as a 2-D numba view."""
    arr = as_device_array(x, name, ndim=(1, 2))
    return arr.reshape(arr.shape[0], 1) if arr.ndim == 1 else arr


def _nadaraya_watson_on_device(queries, keys, values, bandwidth, exclude_self, dtype, return_lse):
    """nadaraya_watson for inputs on the GPU: checks and layout run on the device."""
    layout = kernels_for("layout", "cuda")
    q, k, v = _device_2d(queries, "queries"), _device_2d(keys, "keys"), _device_2d(values, "values")
    check_same_features(q, k, "queries", "keys")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"values has {v.shape[0]} rows but keys has {k.shape[0]}")
    _check_exclude_self(exclude_self, q, k)
    if isinstance(bandwidth, str):
        _, sigma = layout.column_moments(k)
        h = rule_bandwidth(sigma, k.shape[0], bandwidth)
    else:
        h = check_bandwidth(bandwidth, k.shape[1])
    scale = _score_scale(h)
    device_q = layout.scaled_copy(q, scale, dtype)
    device_k_t = layout.scaled_transpose(k, scale, dtype)
    device_v_t = layout.scaled_transpose(v, np.ones(v.shape[1]), dtype)
    out, lse = kernels_for("pooling", "cuda").gaussian_pool(
        device_q, device_k_t, device_v_t, exclude_self
    )
    host_lse = to_host(lse)
    if _far_rows(host_lse, device_q.dtype, device_k_t.shape[1], exclude_self).size:
        host_out = to_host(out)
        _far_rows_on_the_cpu(
            host_out,
            host_lse,
            *to_host(device_q, device_k_t, device_v_t),
            exclude_self,
        )
        out, lse = to_device(host_out, host_lse)
    if getattr(values, "ndim", 2) == 1:
        out = out.reshape(out.shape[0])
    out, lse = like_input(out, queries), like_input(lse, queries)
    return (out, lse) if return_lse else out


def nadaraya_watson_spread(queries, keys, values, bandwidth="scott", *, dtype=None, device="cpu"):
    """Pooled mean, attention-weighted standard deviation and effective number of neighbours.

    .. math::

        f_i = \\sum_j w_{ij} v_j, \\qquad
        \\sigma_{ic} = \\sqrt{\\sum_j w_{ij} (v_{jc} - f_{ic})^2}, \\qquad
        n^{\\mathrm{eff}}_i = 1 / \\sum_j w_{ij}^2

    with ``w_ij = softmax_j(-1/2 sum_d ((q_id - k_jd)/h_d)^2)``. Two streaming
    passes: the pool gives f and lse, the second pass sums the squared
    deviations about f (no cancellation, unlike E[v^2] - E[v]^2) and the
    squared weights. n_eff runs from 1 (one key holds all the weight) to
    n_keys (uniform weights). The deviations are divided by a power of two
    near ``max |v|`` before squaring, so values near 1e200 or 1e-200 keep their
    spread; a query far from every key gets its nearest key's value, std 0
    (or the spread of tied nearest keys) and n_eff 1. ``device`` ("cpu",
    "cuda" or "auto") picks the kernels of both passes; the results are NumPy
    arrays either way.

    Returns
    -------
    mean, std : ndarray (n_queries,) or (n_queries, n_outputs) like ``values``
    n_eff : ndarray (n_queries,)
    """
    dtype = resolve_dtype(dtype, queries, keys, values)
    queries, keys, v2, values_1d = check_pooling_inputs(queries, keys, values)
    h = resolve_bandwidth(bandwidth, keys)
    mean, std, n_eff = gaussian_pool_spread(queries, keys, v2, h, dtype, device)
    if values_1d:
        return mean[:, 0], std[:, 0], n_eff
    return mean, std, n_eff


def gaussian_pool_spread(queries, keys, v2, h, dtype, device):
    """``(mean, std, n_eff)`` of :func:`nadaraya_watson_spread` on checked host arrays
    (values v2 (n_keys, p)), means and spreads (n_queries, p)."""
    q, k_t, v_t, _ = _layout(queries, keys, v2, h, dtype)
    with serial_below(q.shape[0] * k_t.shape[1], config.SERIAL_PAIRS):
        mean, lse = kernels_for("pooling", device).gaussian_pool(q, k_t, v_t, False, 0)
        std, sum_w2 = kernels_for("loo", device).gaussian_spread(q, k_t, v_t, mean, lse, False)
    if not isinstance(mean, np.ndarray):  # the CUDA pool returns device arrays
        mean = to_host(mean)
    n_eff = 1.0 / sum_w2
    return mean.astype(np.float64), std, n_eff


def gaussian_attention_weights(
    queries, keys, bandwidth="scott", exclude_self=False, *, dtype=None, device="cpu"
):
    """The attention-weight matrix ``W[i, j] = softmax_j(s_ij)`` (n_queries, n_keys).

    Same score as :func:`nadaraya_watson`; ``W @ values`` is its prediction.
    Memory is n_queries x n_keys: meant for plots and diagnostics.
    ``device`` ("cpu", "cuda" or "auto") picks the kernel; the matrix is
    returned as a NumPy array either way.
    """
    dtype = resolve_dtype(dtype, queries, keys)
    queries, keys, _, _ = check_pooling_inputs(queries, keys)
    exclude_self = check_bool(exclude_self, "exclude_self")
    _check_exclude_self(exclude_self, queries, keys)
    h = resolve_bandwidth(bandwidth, keys)
    q, k_t, _, _ = _layout(queries, keys, None, h, dtype)
    return kernels_for("pooling", device).gaussian_weights(q, k_t, exclude_self)


def average_pooling(queries, values):
    """Average pooling (the attention-pooling walk-through, section 1.3.1): f(q) = mean_j v_j.

    Attention pooling with a constant score: every key gets weight 1/n.
    """
    queries = as_float_array(queries, "queries", ndim=(1, 2))
    values = as_float_array(values, "values", ndim=(1, 2), dtype=np.float64)
    mean = values.mean(axis=0)
    return np.broadcast_to(mean, (queries.shape[0],) + mean.shape).copy()
