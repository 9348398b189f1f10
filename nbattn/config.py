"""Every tunable of nbattn in one place, by domain.

The sections below (engine, pooling, tree, loo, search, learned, local, flash,
decode, cuda, app) are listed in :data:`SECTIONS`; :data:`DEFAULTS` is the one
table of their values at import and :func:`reset` puts them back. Each value
can be overridden by an environment variable of the same name with the prefix
``NBATTN_`` (for example ``NBATTN_KEY_BLOCK=512``), read once at import time.
Tests patch the module attributes directly; the kernel modules read them when
they are imported (some copy them then, the others compile them in at the first
call), so a patch must happen before that import. A patched compiled tunable
turns numba's on-disk cache off, as an override does (:data:`CACHE`; a CUDA launch
tunable only the CUDA kernels', ``CUDA_CACHE``).
"""

from __future__ import annotations

import os

#: The tunables that may be compiled into kernels (see CACHE, the last block).
_COMPILED_TUNABLES = set()


#: The largest integer an NBATTN_* variable may set: the kernels size scratch and index
#: with 32-bit-safe arithmetic (a block of 2**40 keys wrapped around and pooled wrongly).
_ENV_INT_MAX = 2**31 - 1


def _env_int(name: str, default: int, *, compiled: bool = True, maximum=_ENV_INT_MAX) -> int:
    """``NBATTN_<name>`` as an int in [1, maximum], or ``default``; ``compiled``: it may be
    baked into compiled kernels (an override then turns the on-disk cache off: the CPU
    and CUDA kernels' for most, only the CUDA kernels' for a CUDA launch tunable)."""
    if compiled:
        _COMPILED_TUNABLES.add(name)
    raw = os.environ.get("NBATTN_" + name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable NBATTN_{name}={raw!r} is not an integer") from exc
    if not 0 < value <= maximum:
        raise ValueError(f"environment variable NBATTN_{name}={raw!r} must lie in 1 .. {maximum}")
    return value


def _env_switch(name: str):
    """``NBATTN_<name>`` as a switch: True for 1/true/yes/on, False for 0/false/no/off
    (any case, spaces around ignored), None when unset or empty; anything else is refused."""
    raw = os.environ.get("NBATTN_" + name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"environment variable NBATTN_{name}={raw!r} must be 1 or 0")


def _env_flag(name: str) -> bool:
    """``NBATTN_<name>`` as a flag: 1/true/yes/on or 0/false/no/off (unset: False)."""
    return bool(_env_switch(name))


# --- engine: the streaming engine (every CPU kernel) ------------------------------------------

#: LLVM fast-math flags for every CPU kernel. Deliberately without ``nnan`` and
#: ``ninf``: with those, LLVM may assume no NaN/inf exists, so ``np.isnan`` folds
#: to False and ``-inf`` sentinels (empty rows, masked keys) break.
FASTMATH = {"reassoc", "contract", "arcp", "nsz", "afn"}

#: Keys per block of the streaming softmax. Each thread keeps one block of
#: scores (KEY_BLOCK floats) in a scratch buffer that must stay in L1.
KEY_BLOCK = _env_int("KEY_BLOCK", 1024)

#: Queries handed to a thread at once by the parallel loops.
QUERY_BLOCK = _env_int("QUERY_BLOCK", 16)

#: Below this many query x key pairs the full weight matrix may be returned.
MAX_WEIGHT_MATRIX_ELEMENTS = _env_int("MAX_WEIGHT_MATRIX_ELEMENTS", 50_000_000, maximum=2**62)

#: Below this many query x key pairs a kernel call runs on one thread: the
#: parallel launch and barrier cost more than they save on small calls (about
#: 0.5 ms of work at 1e9 pairs/s; measured on the 2-core machine, n = 1000
#: LOO gradients ran 2x faster in parallel). On an oversubscribed machine a
#: parallel call costs far more; raise it there. Used by the LOO passes of nbattn.smoothing.
SERIAL_PAIRS = _env_int("SERIAL_PAIRS", 1 << 19, maximum=2**62)

#: Far rows of the streaming softmax (``kernels.pooling``, "Far rows"). The
#: direct score -||z_q - z_j||^2 carries a rounding error of about (d + 3) u |m|
#: (u the unit roundoff, m the row's best score). A float32 row with
#: m < -FAR_SCORE_FLOAT32 is recomputed with float64 scores (the differences of
#: float32 numbers are exact there); a row with m < -FAR_SCORE_FLOAT64, or whose
#: scores all overflow, relative to its nearest key a in float64,
#: s_j - s_a = (z_j - z_a) . (2 z_q - z_j - z_a). Before each switch the error
#: stays below (d + 3) 2^-12 (float32) and (d + 3) 2^-29 (float64). The check
#: is one comparison per row; only far rows pay the extra passes. Read when the
#: kernels are compiled.
FAR_SCORE_FLOAT32 = _env_int("FAR_SCORE_FLOAT32", 1 << 12)
FAR_SCORE_FLOAT64 = _env_int("FAR_SCORE_FLOAT64", 1 << 24)


# --- pooling: Gaussian pooling on GEMM tiles (nbattn.kernels.pooling_gemm) --------------------

#: Features from which ``nbattn.nadaraya_watson`` computes the scores as
#: 2 q.k - ||k||^2 - ||q||^2 on BLAS tiles instead of the direct differences,
#: per dtype. Read at call time. Measured on the idle 2-core AVX-512 machine,
#: 4096 x 4096 (``scripts/bench_regression.py --crossover``, time direct / time
#: GEMM): float32 0.88 at d = 24, 0.97 at 32, 1.07 at 48, 1.34 at 64; float64
#: 0.91 at 16, 1.22 at 24, 1.57 at 64. Below the crossover the direct
#: differences are also the more accurate.
GEMM_MIN_FEATURES_FLOAT32 = _env_int("GEMM_MIN_FEATURES_FLOAT32", 40, compiled=False)
GEMM_MIN_FEATURES_FLOAT64 = _env_int("GEMM_MIN_FEATURES_FLOAT64", 24, compiled=False)

#: Query rows and keys per tile of the GEMM pooling kernel below
#: GEMM_WIDE_FEATURES features: the score tile (GEMM_BLOCK_Q x GEMM_BLOCK_K
#: floats per thread, 256 KiB in float32) should stay in L2, and BLAS packs the
#: key tile once per GEMM_BLOCK_Q rows. Measured at d = 256 float32 (8k x 8k,
#: the score GEMMs alone): 64 x 512 ran at 0.6x the speed of 256 x 256. At
#: d = 48 and 64 no shape of 256 x 256 to 512 x 512 was measurably faster
#: (a loaded machine: differences below ~10 % were noise).
GEMM_BLOCK_Q = _env_int("GEMM_BLOCK_Q", 256)
GEMM_BLOCK_K = _env_int("GEMM_BLOCK_K", 256)

#: From GEMM_WIDE_FEATURES features on, the tiles are GEMM_WIDE_BLOCK_Q x
#: GEMM_WIDE_BLOCK_K: the GEMM is nine tenths of the kernel there and one BLAS
#: call per taller tile runs nearer its peak. Measured at d = 256 float32 (one
#: thread, 1024 x 8192, best of 7, OpenBLAS on an AVX-512 core whose large
#: sgemm runs at ~100 GFLOP/s): the score GEMMs ran at 91-93 GFLOP/s on
#: 256 x 256 tiles, 97 on 512 x 256, 99 on 512 x 512, 100-101 on 1024 x 256
#: (too few tiles to share among threads); the whole kernel was 6 % faster on
#: 512 x 512 than on 256 x 256.
GEMM_WIDE_FEATURES = _env_int("GEMM_WIDE_FEATURES", 128)
GEMM_WIDE_BLOCK_Q = _env_int("GEMM_WIDE_BLOCK_Q", 512)
GEMM_WIDE_BLOCK_K = _env_int("GEMM_WIDE_BLOCK_K", 512)

#: Row check of the GEMM kernel (``kernels.pooling_gemm``): a row keeps its
#: expanded scores only where ||q||^2 + max ||k||^2 <= GEMM_NORM_RATIO *
#: max(-log l, GEMM_NORM_FLOOR), i.e. where their rounding error is at most
#: about GEMM_NORM_RATIO times that of the direct differences (or bounded by
#: the floor for a row with a near key); other rows take the direct path.
GEMM_NORM_RATIO = _env_int("GEMM_NORM_RATIO", 8)
GEMM_NORM_FLOOR = _env_int("GEMM_NORM_FLOOR", 64)


# --- tree: Nadaraya-Watson within a relative tolerance (nbattn.kernels.tree_pool) -------------

#: Keys per leaf of the k-d tree that ``nbattn.nadaraya_watson(..., rtol > 0)`` walks. Each
#: node looked at costs a box distance and a bound per row, so larger leaves than the LOO
#: tiles' pay. Clustered 3-D keys (scripts/bench_scale.py's data), tiles of 16, two
#: threads, idle machine, seconds of the tree path with its build at 256 / 512 / 1024 keys:
#: 1e6 keys x 1e5 queries at Scott's widths 7.3 / 5.7 / 5.2, at a quarter of them
#: 1.16 / 1.20 / 1.18; 1e5 keys x 2e4 queries at Scott's widths 0.33 / 0.27 / 0.29, at a
#: quarter 0.072 / 0.069 / 0.079, at a sixteenth 0.042 / 0.042 / 0.048. Read at call time.
TREE_LEAF_KEYS = _env_int("TREE_LEAF_KEYS", 512, compiled=False)

#: Queries (neighbours in k-d order) that walk the tree together: a node is dropped for
#: the tile only when the rule drops it for each of its rows, and each leaf is read
#: once for all the rows that keep it. Measured as TREE_LEAF_KEYS: at Scott's widths tiles
#: of 16 took half the time of one row at a time with leaves of 64 keys and 0.7 of it with
#: 128; at a quarter of the widths they were even. Read at call time.
TREE_TILE_ROWS = _env_int("TREE_TILE_ROWS", 16, compiled=False)

#: The cost model of ``rtol > 0`` (``nbattn.smoothing.pruned``): below TREE_MIN_KEYS keys, or
#: from TREE_MAX_FEATURES features on (a k-d tree prunes little there), the exact streaming
#: path runs. Otherwise the tree is built and TREE_SAMPLE_QUERIES evenly spaced queries
#: walk it; the tree path runs when their estimated cost, in key visits of the streaming
#: kernel (TREE_KEY_COST per key summed in a leaf, TREE_NODE_COST per node looked at, plus
#: TREE_BUILD_COST (n log2 n + m log2 m) for the layout of n keys and the order of m
#: queries), is at most TREE_MAX_COST_SHARE percent of the streaming kernel's n_queries x
#: n_keys. What trying costs when the sample then chooses the exact path, the layout, the
#: queries' order and the sample walk at worst (its queries visiting every key,
#: TREE_SAMPLE_KEY_COST each), is at most TREE_MAX_OVERHEAD_SHARE percent of the streaming
#: kernel's, or the tree is not tried: so ``rtol > 0`` is never slower than exact streaming
#: by more than about that share. The costs are in hundredths of one streamed key, fitted
#: at 1e5 keys (Scott's widths and a quarter of them, leaves of 512, against exact
#: streaming's 0.52 ns a pair on two threads): a summed key about 1.14 streamed keys, a
#: node about 18, a sample row's key visit about 2.2 (64 rows on 2e4 keys: 1.45 ms). The
#: layout, its k-d split on the threads, measured against exact streaming in as many
#: features (clustered keys, 1 to 8 features, 5e3 to 1e6 keys, two threads, the least of
#: several runs), costs 3.7 to 10.6 n log2 n streamed keys whatever the features (most at
#: 1e5 keys, least at 1e6 where streaming itself slows down), the queries' order 1.8 to
#: 4.6 m log2 m: TREE_BUILD_COST is about the most of the layout's, for both. The share
#: leaves 3 points for what the model does not count (the exact pass after the tree's steps
#: runs about 0.5 ms slower at 2e4 keys, its caches cold, and the calls between them): at
#: 10, calls just past the threshold ran 1.09-1.13 times exact streaming's time (1-3
#: features, 5e3-2e4 keys, 16 times Scott's widths, where the sample then picks exact
#: streaming), at 7 at most 1.10. Read at call time.
TREE_MIN_KEYS = _env_int("TREE_MIN_KEYS", 2048, compiled=False)
TREE_MAX_FEATURES = _env_int("TREE_MAX_FEATURES", 16, compiled=False)
TREE_SAMPLE_QUERIES = _env_int("TREE_SAMPLE_QUERIES", 64, compiled=False)
TREE_KEY_COST = _env_int("TREE_KEY_COST", 115, compiled=False)
TREE_NODE_COST = _env_int("TREE_NODE_COST", 1800, compiled=False)
TREE_BUILD_COST = _env_int("TREE_BUILD_COST", 1000, compiled=False)
TREE_SAMPLE_KEY_COST = _env_int("TREE_SAMPLE_KEY_COST", 220, compiled=False)
TREE_MAX_COST_SHARE = _env_int("TREE_MAX_COST_SHARE", 80, compiled=False)
TREE_MAX_OVERHEAD_SHARE = _env_int("TREE_MAX_OVERHEAD_SHARE", 7, compiled=False)

#: Taylor series per node of that tree (``nbattn.kernels.tree_series``, the improved fast
#: Gauss transform), for wide widths where the walk can drop little. TREE_SERIES (False,
#: or NBATTN_TREE_SERIES=0: off) lets the cost model consider them for inputs of at most
#: TREE_SERIES_MAX_FEATURES features whose sample walk without series sums at least
#: TREE_SERIES_MIN_SHARE percent of the keys, when building the coefficients costs at most
#: TREE_SERIES_MAX_BUILD_SHARE percent of exact streaming and less than that walk, and
#: when the build and a second sample walk keep what trying costs within
#: TREE_MAX_OVERHEAD_SHARE; they are then built and the sample walked again with them, and
#: kept when that is cheaper.
#: A node of c keys gets the terms of total degree below p, p at most
#: TREE_SERIES_MAX_DEGREE and with at most TREE_SERIES_MAX_TERMS terms (d = 1, 2, 3:
#: 16, 15, 8), the largest whose terms are at most c / TREE_SERIES_KEYS_PER_TERM. A row
#: takes a node's series where its error bound fits and its terms cost no more than its
#: keys. Costs, in hundredths of one streamed key as TREE_KEY_COST: TREE_SERIES_TERM_COST
#: per term and channel (the weight and each output) evaluated, TREE_SERIES_NODE_COST
#: more per node looked at (the series' test), TREE_SERIES_BUILD_COST per key, term and
#: channel of each node's coefficients. Fitted on one thread to clustered keys (50,000
#: keys x 4,000 queries, d = 1, 2, 3 at 1/4 to 16 times Scott's widths, leaves of 512):
#: a term about 1.6 ns a channel, the test about 30 ns a node, against about 1 ns a
#: streamed key; the build, on two threads, about 0.1 ns a key, term and channel against
#: 0.65 ns a streamed key (2e4 2-D keys at 16 times Scott's widths: 4.7 ms for 5e7 of
#: them). Read at call time.
TREE_SERIES = _env_switch("TREE_SERIES") is not False
TREE_SERIES_MAX_FEATURES = _env_int("TREE_SERIES_MAX_FEATURES", 3, compiled=False)
TREE_SERIES_MIN_SHARE = _env_int("TREE_SERIES_MIN_SHARE", 5, compiled=False)
TREE_SERIES_MAX_DEGREE = _env_int("TREE_SERIES_MAX_DEGREE", 16, compiled=False)
TREE_SERIES_MAX_TERMS = _env_int("TREE_SERIES_MAX_TERMS", 128, compiled=False)
TREE_SERIES_KEYS_PER_TERM = _env_int("TREE_SERIES_KEYS_PER_TERM", 2, compiled=False)
TREE_SERIES_MAX_BUILD_SHARE = _env_int("TREE_SERIES_MAX_BUILD_SHARE", 5, compiled=False)
TREE_SERIES_TERM_COST = _env_int("TREE_SERIES_TERM_COST", 180, compiled=False)
TREE_SERIES_NODE_COST = _env_int("TREE_SERIES_NODE_COST", 3300, compiled=False)
TREE_SERIES_BUILD_COST = _env_int("TREE_SERIES_BUILD_COST", 15, compiled=False)


# --- loo: leave-one-out kernels (nbattn.kernels.loo) ------------------------------------------

#: Row groups of the full-metric LOO gradient (``kernels.loo.loo_grad_full``):
#: each group keeps its own float64 sums over the keys (groups x n_keys floats)
#: and runs in parallel. Read when the kernel is compiled.
LOO_FULL_GROUPS = _env_int("LOO_FULL_GROUPS", 16)

#: Score gap beyond which the sorted 1-D LOO kernel skips a key: it weighs less
#: than exp(-gap) of the nearest one, so n skipped keys change the result by
#: < n exp(-gap) relative (2e-22 n in float64 at 50, 2e-16 n in float32 at 36),
#: far below each dtype's rounding. Read at call time by
#: ``kernels.loo_1d.prune_gap_for``.
PRUNE_GAP_FLOAT64 = _env_int("PRUNE_GAP_FLOAT64", 50)
PRUNE_GAP_FLOAT32 = _env_int("PRUNE_GAP_FLOAT32", 36)


# --- search: the leave-one-out width search (nbattn.smoothing) --------------------------------

#: Factors of the base (Scott) widths that the coarse stage of
#: ``nbattn.smoothing.width_search.loo_bandwidth`` evaluates: six per decade from 0.01 to
#: 100, with 1 (the rule itself) among them. Read at call time. Leave-one-out
#: curves of small or tied data have dips narrower than a quarter decade; on
#: 300 random data sets (10-700 rows, 1-8 features, ties, duplicated rows)
#: this grid put every search within 1e-4 of a 20-per-decade brute force,
#: a quarter-decade grid one of them only within 5e-3.
LOO_GRID = tuple(10.0 ** (k / 6.0) for k in range(-12, 13))

#: How far ``loo_bandwidth`` extends its grid, in decades beyond each end, while
#: the criterion is still falling there (a minimum at the edge of LOO_GRID).
#: Past that it returns the end and warns.
LOO_EXTEND_DECADES = 3.0

#: Relative tolerance under which two values of the leave-one-out criterion
#: count as equal in ``loo_bandwidth``: a flat stretch is a plateau, not a rise
#: or a fall, and the float32 and float64 searches make the same choices. The
#: float32 criterion carries a relative error of about 1e-6 (sums of float32
#: products over one key block, added in float64); 1e-5 stays clear of it and
#: is far below the criterion's own sampling noise (about 1/sqrt(n)).
LOO_RTOL = 1e-5

#: In 1-D, ``loo_bandwidth``'s subsampled grid stage (n > grid_queries) leaves
#: out at most this many rows: the windowed 1-D kernel costs (rows) x n per
#: factor at the wide end of the grid, and the refinement walks the grid on
#: exact values from wherever the estimate points. Measured at n = 20,000:
#: 1024 rows did 1.7e9 pair evaluations in all, 4096 rows 2.3e9.
LOO_GRID_QUERIES_1D = 1024

#: ``nbattn.smoothing.width_search.loo_bandwidth`` first evaluates every LOO_GRID_STRIDE-th
#: factor of LOO_GRID (counted from 1, the base rule, with both ends), then
#: every factor of LOO_GRID in a coarse interval that touches a factor within
#: LOO_FILL_MARGIN (relative) of the best value so far, until none is added; the
#: extension also moves by LOO_GRID_STRIDE steps. A dip of the criterion lying
#: wholly inside a coarse interval whose two ends are both more than
#: LOO_FILL_MARGIN above the best value is not sought. 1 evaluates the whole
#: grid. Read at call time.
LOO_GRID_STRIDE = _env_int("LOO_GRID_STRIDE", 3, compiled=False)
LOO_FILL_MARGIN = 0.1

#: Largest squared span (max - min of the scaled 1-D points, s_ij = -(z_i - z_j)^2)
#: at which ``loo_bandwidth`` evaluates the LOO criterion by the Taylor series of
#: ``kernels.loo_1d.loo_squared_error_taylor_1d`` (O(n) instead of O(n^2) per width):
#: the series' terms cancel by at most e^span^2 (55 at 4), so the criterion keeps
#: about 13 digits in float64. Read at call time.
LOO_TAYLOR_MAX_SPAN_SQ = 4.0

#: ``loo_bandwidth`` evaluates a 1-D width by the boxed Hermite series
#: (``kernels.loo_1d.loo_squared_error_boxed_1d``, a one-dimensional fast Gauss
#: transform) instead of the windowed direct kernel once the direct window holds
#: at least this many keys per row on average; the series' cost does not grow
#: with the width, the window's does.
LOO_BOXED_MIN_WINDOW = _env_int("LOO_BOXED_MIN_WINDOW", 48, compiled=False)
#: Half-width of the boxes, in scaled units (the weight is exp(-(z_i - z_j)^2)).
#: Wider boxes need more terms, narrower ones more boxes per key; 0.5 measured best.
LOO_BOXED_HALF_WIDTH = 0.5
#: Each expanded row's weight sum is within this relative error of the exact one
#: and its prediction within twice this times max |y|; rows the bound cannot
#: vouch for are computed directly.
LOO_BOXED_TOL = 2.0**-40
#: Keys farther than sqrt(LOO_BOXED_REACH_GAP) from a box (scaled units) are left
#: out of its series: each weighs below exp(-LOO_BOXED_REACH_GAP) (counted in the bound).
LOO_BOXED_REACH_GAP = 40.0


# --- learned: learned metrics and their leave-one-out tiles (nbattn.kernels.loo_tiles) ---

#: Bounds of the widths learned by ``smoothing.learned_metric.fit_learned_kernel``
#: (scalar and diagonal metrics), as factors of the initial (Scott) widths: an
#: irrelevant feature's width grows to the upper bound instead of overflowing.
WIDTH_BOUNDS = (1e-3, 1e4)

#: Learned metrics on many rows (``learned_metric.fit_learned_kernel``): with n >= 2 m
#: rows, L-BFGS-B first minimises the LOO criterion of a random subsample of
#: m = LEARN_SUBSAMPLE_ROWS query rows (against all n keys), then of
#: LEARN_SUBSAMPLE_GROWTH times more while that is at most half the rows, and
#: finishes on the full criterion from there. 0 (set in code) turns the ladder off.
#: Read at call time.
LEARN_SUBSAMPLE_ROWS = _env_int("LEARN_SUBSAMPLE_ROWS", 2048, compiled=False)
LEARN_SUBSAMPLE_GROWTH = _env_int("LEARN_SUBSAMPLE_GROWTH", 4, compiled=False)

#: The first subsample of that ladder has at least this many query rows per learned
#: parameter (a few rows would let a full metric overfit them). Read at call time.
LEARN_ROWS_PER_PARAMETER = _env_int("LEARN_ROWS_PER_PARAMETER", 50, compiled=False)

#: Restarts of L-BFGS-B on the ladder's last stage (the full criterion): each
#: starts from where the previous one stopped, with fresh curvature pairs, and
#: the next runs only while one gains more than ``tol``. Read at call time.
LEARN_FINAL_RESTARTS = _env_int("LEARN_FINAL_RESTARTS", 3, compiled=False)

#: Rows per tile of the one-pass LOO gradient (``kernels.loo_tiles``), and the
#: most bytes one tile of scores may take (rows x n_keys float64 per thread): with
#: many keys a tile holds fewer rows. Read at call time.
LOO_TILE_ROWS = _env_int("LOO_TILE_ROWS", 64, compiled=False)
LOO_TILE_BYTES = _env_int("LOO_TILE_BYTES", 8 << 20, compiled=False)

#: Score dimensions from which a tile's scores are a GEMM instead of direct
#: differences, and the largest squared radius (in score units) of a block of
#: rows about its mean for which the GEMM scores are used: their rounding error
#: relative to the row's largest weight stays below (k + 3) u (3 R^2 + 2), about
#: 5e-12 at k = 20, R^2 = 64. Read at call time.
LOO_TILE_GEMM_MIN_DIMS = _env_int("LOO_TILE_GEMM_MIN_DIMS", 8, compiled=False)
LOO_TILE_GEMM_MAX_RADIUS2 = _env_int("LOO_TILE_GEMM_MAX_RADIUS2", 64, compiled=False)

#: Rows per tile of the plain LOO tiles on direct scores (``kernels.loo_tiles.loo_tiles``
#: with every key in every tile and fewer than LOO_TILE_GEMM_MIN_DIMS score dimensions)
#: are also capped so that rows x n_keys float64 fit in about this many bytes, with at
#: least 8 rows. Those tiles now hold two rows of weights at a time (the fused direct
#: passes of ``kernels.loo_fused``), so this only sets how many rows a block hands to a
#: thread; 16 and 64 rows measured the same. Read at call time.
LOO_TILE_CACHE_BYTES = _env_int("LOO_TILE_CACHE_BYTES", 512 << 10, compiled=False)

#: A block of the plain LOO tiles (every key; the boxed tiles keep keys near their rows,
#: where refining cost 5 % more than it saved) wider than LOO_TILE_GEMM_MAX_RADIUS2 takes the
#: GEMM scores up to this squared radius, with each row's keys within e^-36 of its
#: best scored again by differences (``kernels.loo_tiles``, section "refined GEMM
#: scores": the float64 contract holds for any radius up to it). 0 turns it off.
#: Read at call time.
LOO_TILE_GEMM_REFINE_MAX_RADIUS2 = _env_int(
    "LOO_TILE_GEMM_REFINE_MAX_RADIUS2", 1 << 20, compiled=False
)

#: Keys from which the one-pass LOO gradient may take the boxed tiles
#: (``kernels.loo_tiles.loo_tiles_boxed``: keys in k-d order, each tile given only the
#: leaves within reach, the bound of PRUNE_GAP_FLOAT64; see LOO_BOXED_MAX_SHARE); below
#: it every tile takes every key (``loo_tiles``). Read at call time.
LOO_PRUNE_MIN_ROWS = _env_int("LOO_PRUNE_MIN_ROWS", 2048, compiled=False)

#: Keys per leaf of the k-d order of ``kernels.loo_tiles.loo_tiles_boxed`` (the fit's
#: LOO tiles on many rows): a tile keeps a leaf when the leaf's bounding box comes
#: within reach of one of its rows. Smaller leaves prune closer and cost more box
#: tests per tile. Read at call time.
LOO_TILE_LEAF_KEYS = _env_int("LOO_TILE_LEAF_KEYS", 32, compiled=False)

#: The boxed LOO tiles run only when an estimate of the share of keys they keep
#: per row is at most this (``tiled_loo.boxed_share``); above it (a kernel wide
#: against the data) the plain one-pass tiles run, since gathering the kept
#: leaves then costs more than it saves (on random 4000 x 20 data with unit
#: widths the boxed tiles took 87 ms, the plain ones 70 ms; on the 40k-row price
#: table at its fitted widths the boxes keep about 5 % and run 3.5x faster).
LOO_BOXED_MAX_SHARE = 0.5


# --- local: local-polynomial regression (nbattn.local, nbattn.kernels.local) ------------------

#: Relative ridge of the local solve, (M + ridge diag(0, M_11, ..)) beta = V, when the
#: caller passes ridge=None. It changes a well-conditioned fit by about ridge times the
#: design's condition number (the statsmodels comparisons hold to 1e-10 at 1e-12).
LOCAL_RIDGE = 1e-12

#: A term of the local design whose Cholesky pivot falls below this share of its
#: diagonal entry (its column lies within that relative distance of the span of the
#: earlier columns: a constant column, fewer distinct neighbours than terms, a query
#: far from all keys) is dropped (coefficient 0), like a truncated pseudo-inverse;
#: the fit then shrinks towards the local constant instead of amplifying rounding.
#: Pivot and diagonal are the ridged system's (M/l + R): a column exactly in the span
#: of earlier ones that are themselves nearly dependent keeps a pivot of about
#: ridge / (their relative pivot), so it may be kept, the ridge then deciding its
#: coefficient. Read when the kernels are compiled.
LOCAL_PIVOT_TOL = 1e-8

#: Keys per leaf of the k-d order that the local passes prune with ``rtol > 0``
#: (``nbattn.kernels.local_leaves``): each query bounds every leaf (a few flops per column),
#: so smaller leaves prune closer at more bound work per query. Read at call time.
LOCAL_LEAF_KEYS = _env_int("LOCAL_LEAF_KEYS", 64, compiled=False)

#: Below this many keys the local passes ignore ``rtol`` and run exactly (the leaves'
#: bounds cost more than they save on small problems). Read at call time.
LOCAL_TREE_MIN_KEYS = _env_int("LOCAL_TREE_MIN_KEYS", 2048, compiled=False)

#: The local passes' cost model with ``rtol > 0`` (``nbattn.local.leaves``): up to
#: LOCAL_TREE_SAMPLE_CHUNKS evenly spaced chunks of queries bound the leaves, and the pruned
#: passes run only when those chunks visit at most LOCAL_TREE_MAX_SHARE percent of the keys
#: (otherwise the exact passes, in the caller's order). At 10,000 rows of two public tables
#: at their LOO widths, 1e-6: visiting all keys in k-d order with the bounds cost about 10 %
#: more than the exact pass; visiting 57 % saved about 20 %. Read at call time.
LOCAL_TREE_SAMPLE_CHUNKS = _env_int("LOCAL_TREE_SAMPLE_CHUNKS", 32, compiled=False)
LOCAL_TREE_MAX_SHARE = _env_int("LOCAL_TREE_MAX_SHARE", 80, compiled=False, maximum=100)


#: The LOO width search of the local fits that starts on a subsample (``subsample`` of
#: ``nbattn.local.widths.local_loo_widths``, ``loo_subsample`` of the estimator): after
#: the whole search on the subsample, short searches on LOCAL_LOO_STAGE_GROWTH times
#: more rows at a time up to all of them. Read at call time.
LOCAL_LOO_STAGE_GROWTH = _env_int("LOCAL_LOO_STAGE_GROWTH", 4, compiled=False)

#: The leave-one-out criterion of the local fits pools tied training rows (rows equal in
#: every column: ``nbattn.local.ties``) when the distinct rows are at most this percentage
#: of all rows: its pairs fall as the square of that share (CPS1988's 10,000-row sample
#: has 3,792 distinct rows: 14 % of the pairs). Read at call time.
LOCAL_TIE_MAX_SHARE = _env_int("LOCAL_TIE_MAX_SHARE", 70, compiled=False, maximum=100)

#: The search for nearest-neighbour counts k (``nbattn.local.neighbour_search``): every k
#: is evaluated where [1, n - 1] holds at most NN_EXHAUSTIVE_COUNTS of them, else grids of
#: that many counts (log-spaced) narrow the range until one does; a categorical column's l
#: is searched on two grids of NN_LAMBDA_GRID points; coordinate descent over the columns
#: stops after NN_MAX_SWEEPS sweeps. Read at call time.
NN_EXHAUSTIVE_COUNTS = _env_int("NN_EXHAUSTIVE_COUNTS", 64, compiled=False)
NN_LAMBDA_GRID = _env_int("NN_LAMBDA_GRID", 11, compiled=False)
NN_MAX_SWEEPS = _env_int("NN_MAX_SWEEPS", 4, compiled=False)

# --- flash: flash attention tiles and scheduling (nbattn.attn, nbattn.kernels.flash) ----------

#: Query rows and keys per tile of the blocked (flash) attention kernels. A
#: score tile holds FLASH_BLOCK_Q x FLASH_BLOCK_K floats per thread and should
#: stay in L2; both GEMMs per tile go to BLAS, so larger tiles amortise its
#: packing. The backward pass keeps two such tiles per thread. Read at every call (the
#: kernels take the sizes as arguments), so a patch leaves numba's cache on.
FLASH_BLOCK_Q = _env_int("FLASH_BLOCK_Q", 128, compiled=False)
FLASH_BLOCK_K = _env_int("FLASH_BLOCK_K", 512, compiled=False)
FLASH_BWD_BLOCK_Q = _env_int("FLASH_BWD_BLOCK_Q", 128, compiled=False)
FLASH_BWD_BLOCK_K = _env_int("FLASH_BWD_BLOCK_K", 256, compiled=False)

#: Below this many multiply-adds (queries x keys x features, all heads) a flash
#: call runs on one numba thread: waking the others costs more (measured 68 us
#: on one thread against 5.7 ms on two for a 2 x 16 x 8 input on a busy
#: machine). Read at every call.
FLASH_SERIAL_WORK = _env_int("FLASH_SERIAL_WORK", 1 << 22, compiled=False)

#: Memory allowed for the per-group dQ buffers of the flash backward pass, in
#: bytes (extra key-tile groups that keep every thread busy when there are
#: fewer heads than threads). Read at every call.
FLASH_MAX_DQ_BUFFER_BYTES = _env_int("FLASH_MAX_DQ_BUFFER_BYTES", 256 * 2**20)

#: Keys from which a flash call is "long" and takes the tiles below.
FLASH_LONG_KEYS = _env_int("FLASH_LONG_KEYS", 1024, compiled=False)

#: Tiles of the flash kernels for calls with at least FLASH_LONG_KEYS keys (these
#: replace the FLASH_(BWD_)BLOCK_* sizes there). Measured
#: one thread, CPU time, H = 1, D = 64, float32, 5 interleaved rounds on the
#: shared 2-core machine (scripts/bench_attention.py --profile shows the split):
#: forward 512 x 256 ran 4-5 % faster than 256 x 512 at N = 2048 and 4096 (the
#: score GEMM Q K^T with 256 keys per call keeps its output in L2; 512 x 512 was
#: 19 % slower at N = 2048); the backward 256 x 256 ran 2.5-3.5 % faster than
#: 128 x 256 at N = 4096 (its transposed-operand GEMMs P^T dO and dS^T Q get
#: 256-long inner dimensions). Read at every call.
FLASH_LONG_FWD_BLOCK_Q = _env_int("FLASH_LONG_FWD_BLOCK_Q", 512, compiled=False)
FLASH_LONG_FWD_BLOCK_K = _env_int("FLASH_LONG_FWD_BLOCK_K", 256, compiled=False)
FLASH_LONG_BWD_BLOCK_Q = _env_int("FLASH_LONG_BWD_BLOCK_Q", 256, compiled=False)
FLASH_LONG_BWD_BLOCK_K = _env_int("FLASH_LONG_BWD_BLOCK_K", 256, compiled=False)

#: Multiply-adds per work item (one query tile of one head) from which the flash
#: forward hands its items to the threads one at a time as they finish (numba's
#: parallel_chunksize(1)) instead of in equal static shares: a thread that the
#: OS holds back on a busy machine then leaves its items to the other. Below it
#: the per-item scheduling would cost more than it saves. (The backward keeps
#: static shares: see nbattn.flash._backward.) Read at every call.
FLASH_DYNAMIC_ITEM_WORK = _env_int("FLASH_DYNAMIC_ITEM_WORK", 1 << 22, compiled=False)

#: Whether the tile kernels' products ``A B`` and ``A^T B`` (the flash kernels'
#: acc += P V, dQ += dS K, dV += P^T dO, dK += dS^T Q) run on the OpenBLAS that
#: NumPy's wheels carry, when it is found (``nbattn.kernels.blas``): measured
#: 95-97 GFLOP/s there against 84 through SciPy's (numba's) for A^T B, 99 against
#: 97 for A B, on 256 x 256 x 64 tiles, one thread. NBATTN_GEMM_ON_NUMPY_BLAS=0
#: keeps every product on numba's BLAS. Read once, when ``nbattn.kernels.blas`` is
#: imported (the kernels name a symbol bound then, so the cache stays valid).
GEMM_ON_NUMPY_BLAS = os.environ.get("NBATTN_GEMM_ON_NUMPY_BLAS", "1") not in ("0", "false", "False")


# --- decode: decoding over a key/value cache (nbattn.attn.decode, nbattn.kernels.decode) ------

#: Keys per block of the split-KV decode kernel's online softmax: one score
#: block per query row, in L1. Read at every call.
DECODE_BLOCK_K = _env_int("DECODE_BLOCK_K", 256, compiled=False)

#: Fewest keys a split-KV chunk gets: below it the per-chunk state and the
#: merge cost more than the parallelism saves. Read at every call.
DECODE_MIN_SPLIT_KEYS = _env_int("DECODE_MIN_SPLIT_KEYS", 512, compiled=False)

#: Work items (batch row x kv head x chunk) per numba thread that the decode
#: split aims at, so that threads finishing early find more work. Read at
#: every call.
DECODE_ITEMS_PER_THREAD = _env_int("DECODE_ITEMS_PER_THREAD", 4, compiled=False)


# --- cuda: CUDA kernels (nbattn.cuda) -----------------------------------------------------
# The host wrappers read these at each call; a kernel is compiled (and cached) per value.

#: Threads per block of the CUDA kernels (tests patch a small value so that
#: multi-block and partial-tile paths run under the simulator).
CUDA_THREADS_PER_BLOCK = _env_int("CUDA_THREADS_PER_BLOCK", 128)

#: Shared memory for the key (or query) tiles of one CUDA block, in bytes. A
#: tile holds min(CUDA_THREADS_PER_BLOCK, budget / bytes per row) rows; 32 KiB
#: stays under the 48 KiB every GPU grants without opt-in and leaves room for
#: two blocks per multiprocessor.
CUDA_SHARED_MEMORY_BYTES = _env_int("CUDA_SHARED_MEMORY_BYTES", 32768)

#: Outputs (columns of values) accumulated per thread and launch by the CUDA
#: Nadaraya-Watson and LOO-loss kernels; more outputs run in further launches.
#: Each output is a float64 and an input-dtype accumulator in registers.
CUDA_MAX_OUTPUTS = _env_int("CUDA_MAX_OUTPUTS", 8)

#: Gradient entries (features, or lower-triangle pairs of a metric) that one
#: thread of the CUDA LOO gradient kernels accumulates per launch, in float64
#: registers; more entries run in further launches over ranges of entries.
CUDA_MAX_GRAD_ENTRIES = _env_int("CUDA_MAX_GRAD_ENTRIES", 64)

#: Largest head dimension (E and Ev) the CUDA flash kernels compile for: a
#: thread holds a query row and an accumulator of that size in registers, and
#: a tile row of K and V must fit CUDA_SHARED_MEMORY_BYTES. Larger heads are
#: refused with a clear error (use device="cpu").
CUDA_MAX_HEAD_DIM = _env_int("CUDA_MAX_HEAD_DIM", 128)


# --- app: the command line and Dask (nbattn.app) ----------------------------------------------

#: Seconds the command line waits for a dask scheduler (``--scheduler``) to
#: answer before it gives up with an error, and a sharded leave-one-out evaluation
#: (``nbattn.dask.sharded_training``) for a scatter to the workers or for a worker
#: after one was lost. Read when connecting and at each evaluation.
DASK_CONNECT_TIMEOUT = _env_int("DASK_CONNECT_TIMEOUT", 30, compiled=False)

#: ``NBATTN_QUIET=1``: no "compiling kernels for first use" line on stderr when a
#: kernel compiles (``nbattn._core.compiling``). Read each time the line would print.
QUIET = _env_flag("QUIET")


# --- the one defaults table, and a reset -------------------------------------------------

#: The tunables by domain, in the order above (``nbattn.config.SECTIONS["flash"]``).
SECTIONS = {
    "engine": (
        "FASTMATH",
        "KEY_BLOCK",
        "QUERY_BLOCK",
        "MAX_WEIGHT_MATRIX_ELEMENTS",
        "SERIAL_PAIRS",
        "FAR_SCORE_FLOAT32",
        "FAR_SCORE_FLOAT64",
    ),
    "pooling": (
        "GEMM_MIN_FEATURES_FLOAT32",
        "GEMM_MIN_FEATURES_FLOAT64",
        "GEMM_BLOCK_Q",
        "GEMM_BLOCK_K",
        "GEMM_WIDE_FEATURES",
        "GEMM_WIDE_BLOCK_Q",
        "GEMM_WIDE_BLOCK_K",
        "GEMM_NORM_RATIO",
        "GEMM_NORM_FLOOR",
    ),
    "tree": (
        "TREE_LEAF_KEYS",
        "TREE_TILE_ROWS",
        "TREE_MIN_KEYS",
        "TREE_MAX_FEATURES",
        "TREE_SAMPLE_QUERIES",
        "TREE_KEY_COST",
        "TREE_NODE_COST",
        "TREE_BUILD_COST",
        "TREE_SAMPLE_KEY_COST",
        "TREE_MAX_COST_SHARE",
        "TREE_MAX_OVERHEAD_SHARE",
        "TREE_SERIES",
        "TREE_SERIES_MAX_FEATURES",
        "TREE_SERIES_MIN_SHARE",
        "TREE_SERIES_MAX_DEGREE",
        "TREE_SERIES_MAX_TERMS",
        "TREE_SERIES_KEYS_PER_TERM",
        "TREE_SERIES_MAX_BUILD_SHARE",
        "TREE_SERIES_TERM_COST",
        "TREE_SERIES_NODE_COST",
        "TREE_SERIES_BUILD_COST",
    ),
    "loo": (
        "LOO_FULL_GROUPS",
        "PRUNE_GAP_FLOAT64",
        "PRUNE_GAP_FLOAT32",
    ),
    "search": (
        "LOO_GRID",
        "LOO_EXTEND_DECADES",
        "LOO_RTOL",
        "LOO_GRID_QUERIES_1D",
        "LOO_GRID_STRIDE",
        "LOO_FILL_MARGIN",
        "LOO_TAYLOR_MAX_SPAN_SQ",
        "LOO_BOXED_MIN_WINDOW",
        "LOO_BOXED_HALF_WIDTH",
        "LOO_BOXED_TOL",
        "LOO_BOXED_REACH_GAP",
    ),
    "learned": (
        "WIDTH_BOUNDS",
        "LEARN_SUBSAMPLE_ROWS",
        "LEARN_SUBSAMPLE_GROWTH",
        "LEARN_ROWS_PER_PARAMETER",
        "LEARN_FINAL_RESTARTS",
        "LOO_TILE_ROWS",
        "LOO_TILE_BYTES",
        "LOO_TILE_GEMM_MIN_DIMS",
        "LOO_TILE_GEMM_MAX_RADIUS2",
        "LOO_TILE_CACHE_BYTES",
        "LOO_TILE_GEMM_REFINE_MAX_RADIUS2",
        "LOO_PRUNE_MIN_ROWS",
        "LOO_TILE_LEAF_KEYS",
        "LOO_BOXED_MAX_SHARE",
    ),
    "local": (
        "LOCAL_RIDGE",
        "LOCAL_PIVOT_TOL",
        "LOCAL_LEAF_KEYS",
        "LOCAL_TREE_MIN_KEYS",
        "LOCAL_TREE_SAMPLE_CHUNKS",
        "LOCAL_TREE_MAX_SHARE",
        "LOCAL_LOO_STAGE_GROWTH",
        "LOCAL_TIE_MAX_SHARE",
        "NN_EXHAUSTIVE_COUNTS",
        "NN_LAMBDA_GRID",
        "NN_MAX_SWEEPS",
    ),
    "flash": (
        "FLASH_BLOCK_Q",
        "FLASH_BLOCK_K",
        "FLASH_BWD_BLOCK_Q",
        "FLASH_BWD_BLOCK_K",
        "FLASH_SERIAL_WORK",
        "FLASH_MAX_DQ_BUFFER_BYTES",
        "FLASH_LONG_KEYS",
        "FLASH_LONG_FWD_BLOCK_Q",
        "FLASH_LONG_FWD_BLOCK_K",
        "FLASH_LONG_BWD_BLOCK_Q",
        "FLASH_LONG_BWD_BLOCK_K",
        "FLASH_DYNAMIC_ITEM_WORK",
        "GEMM_ON_NUMPY_BLAS",
    ),
    "decode": (
        "DECODE_BLOCK_K",
        "DECODE_MIN_SPLIT_KEYS",
        "DECODE_ITEMS_PER_THREAD",
    ),
    "cuda": (
        "CUDA_THREADS_PER_BLOCK",
        "CUDA_SHARED_MEMORY_BYTES",
        "CUDA_MAX_OUTPUTS",
        "CUDA_MAX_GRAD_ENTRIES",
        "CUDA_MAX_HEAD_DIM",
    ),
    "app": ("DASK_CONNECT_TIMEOUT", "QUIET"),
}

#: Every tunable's value at import (after its NBATTN_* override): what :func:`reset` restores.
DEFAULTS = {
    name: (frozenset(value) if isinstance(value, set) else value)
    for names in SECTIONS.values()
    for name in names
    for value in [globals()[name]]
}


def reset(*names: str) -> None:
    """Put the named tunables (all when none is named) back to :data:`DEFAULTS`.

    A kernel compiled while a tunable held another value keeps it (see the module
    docstring): reset before the first call that should see the default.
    """
    for name in names or DEFAULTS:
        if name not in DEFAULTS:
            raise ValueError(f"unknown tunable {name!r}; known: {sorted(DEFAULTS)}")
        value = DEFAULTS[name]
        globals()[name] = set(value) if isinstance(value, frozenset) else value


# --------------------------------------------------------------------------- the on-disk cache
# Keep this block LAST: it looks at every compiled tunable defined above it.

#: Whether compiled kernels are cached on disk (second process: no recompile).
#: Block sizes and thresholds are compiled into the kernels as constants, and
#: numba's cache only notices source changes; so a process that overrides one of
#: them with an NBATTN_* variable compiles afresh instead of loading stale
#: kernels, unless it sets NBATTN_CACHE=1 explicitly. Other NBATTN_* variables
#: (the test script's NBATTN_TEST_TORCH, NBATTN_DASK_CONNECT_TIMEOUT) leave the
#: cache on. Kernel modules read this when they are imported.
#: A tunable patched in this module (``config.KEY_BLOCK = ...``) before the kernel modules
#: are imported turns the cache off for them in the same way: ``CACHE`` is computed each
#: time it is read (:func:`__getattr__`), so a kernel compiled with a patched constant is
#: never written to, nor read from, the cache that other processes share.
#: Two switches: ``CACHE`` for the CPU kernels (``nbattn.kernels``) and ``CUDA_CACHE`` for
#: the CUDA ones. No CPU kernel reads the CUDA launch tunables (:data:`CUDA_ONLY_TUNABLES`,
#: checked by ``tests/test_config.py``), so patching one of those (as the CUDA simulator's
#: tests patch the threads per block) leaves the CPU kernels' cache on.
_OVERRIDDEN = sorted(name for name in _COMPILED_TUNABLES if "NBATTN_" + name in os.environ)
_CACHE_ENV = _env_switch("CACHE")

#: The compiled tunables that only the CUDA kernels read.
CUDA_ONLY_TUNABLES = frozenset(SECTIONS["cuda"])


def _cache_on(ignored=frozenset()) -> bool:
    """The on-disk cache switch for kernels that read no tunable in ``ignored``."""
    if _CACHE_ENV is None:
        asked = not [name for name in _OVERRIDDEN if name not in ignored]
    else:
        asked = _CACHE_ENV
    return asked and not [name for name in patched_tunables() if name not in ignored]


#: The tunables compiled into kernels that no NBATTN_* variable sets (the others are
#: registered by ``_env_int``); ``tests/test_config.py`` checks that every tunable the
#: kernel sources read is one or the other.
_COMPILED_CONSTANTS = {
    "FASTMATH",
    "GEMM_ON_NUMPY_BLAS",
    "LOCAL_PIVOT_TOL",
    "LOO_BOXED_HALF_WIDTH",
    "LOO_BOXED_REACH_GAP",
    "LOO_BOXED_TOL",
    "LOO_TAYLOR_MAX_SPAN_SQ",
}


def compiled_tunables() -> set:
    """The tunables that kernels compile in as constants."""
    return _COMPILED_TUNABLES | _COMPILED_CONSTANTS


def patched_tunables() -> list:
    """The compiled tunables whose value is not their :data:`DEFAULTS`."""
    return [name for name in sorted(compiled_tunables()) if globals()[name] != DEFAULTS[name]]


def __getattr__(name):
    if name == "CACHE":
        return _cache_on(CUDA_ONLY_TUNABLES)
    if name == "CUDA_CACHE":
        return _cache_on()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
