"""Every tunable of nbattn in one place.

Each value can be overridden by an environment variable of the same name with
the prefix ``NBATTN_`` (for example ``NBATTN_KEY_BLOCK=512``), read once at
import time. Tests patch the module attributes directly; kernels read them
when they are compiled, so a patch must happen before the first call.
"""

from __future__ import annotations

import os


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get("NBATTN_" + name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable NBATTN_{name}={raw!r} is not an integer") from exc
    if value <= 0:
        raise ValueError(f"environment variable NBATTN_{name}={raw!r} must be positive")
    return value


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
MAX_WEIGHT_MATRIX_ELEMENTS = _env_int("MAX_WEIGHT_MATRIX_ELEMENTS", 50_000_000)

#: Below this many query x key pairs a kernel call runs on one thread: the
#: parallel launch and barrier cost more than they save on small calls (about
#: 0.5 ms of work at 1e9 pairs/s; measured on the 2-core machine, n = 1000
#: LOO gradients ran 2x faster in parallel). On an oversubscribed machine a
#: parallel call costs far more; raise it there. Used by nbattn.learning.
SERIAL_PAIRS = _env_int("SERIAL_PAIRS", 1 << 19)

#: Threads per block of the CUDA kernels (tests patch a small value so that
#: multi-block and partial-tile paths run under the simulator).
CUDA_THREADS_PER_BLOCK = _env_int("CUDA_THREADS_PER_BLOCK", 128)

#: Shared memory for the key (or query) tiles of one CUDA block, in bytes. A
#: tile holds min(CUDA_THREADS_PER_BLOCK, budget / bytes per row) rows; 32 KiB
#: stays under the 48 KiB every GPU grants without opt-in and leaves room for
#: two blocks per multiprocessor.
CUDA_SHARED_MEMORY_BYTES = _env_int("CUDA_SHARED_MEMORY_BYTES", 32768)

#: Whether compiled kernels are cached on disk (second process: no recompile).
#: The block sizes above are compiled into the kernels as constants, and numba's
#: cache only notices source changes; so a process that overrides a size with an
#: NBATTN_* variable compiles afresh instead of loading stale kernels, unless it
#: sets NBATTN_CACHE=1 explicitly.
_SIZE_OVERRIDES = any(name.startswith("NBATTN_") and name != "NBATTN_CACHE" for name in os.environ)
CACHE = os.environ.get("NBATTN_CACHE", "0" if _SIZE_OVERRIDES else "1") not in (
    "0",
    "false",
    "False",
)

#: Query rows and keys per tile of the blocked (flash) attention kernels. A
#: score tile holds FLASH_BLOCK_Q x FLASH_BLOCK_K floats per thread and should
#: stay in L2; both GEMMs per tile go to BLAS, so larger tiles amortise its
#: packing. The backward pass keeps two such tiles per thread.
FLASH_BLOCK_Q = _env_int("FLASH_BLOCK_Q", 128)
FLASH_BLOCK_K = _env_int("FLASH_BLOCK_K", 512)
FLASH_BWD_BLOCK_Q = _env_int("FLASH_BWD_BLOCK_Q", 128)
FLASH_BWD_BLOCK_K = _env_int("FLASH_BWD_BLOCK_K", 256)

#: Row groups of the full-metric LOO gradient (``kernels.loo.loo_grad_full``):
#: each group keeps its own float64 sums over the keys (groups x n_keys floats)
#: and runs in parallel. Read when the kernel is compiled.
LOO_FULL_GROUPS = _env_int("LOO_FULL_GROUPS", 16)

#: Score gap beyond which the sorted 1-D LOO kernel skips a key: it weighs less
#: than exp(-gap) of the nearest one, so n skipped keys change the result by
#: < n exp(-gap) relative (2e-22 n in float64 at 50, 2e-16 n in float32 at 36),
#: far below each dtype's rounding. Read at call time by
#: ``kernels.loo.prune_gap``.
PRUNE_GAP_FLOAT64 = _env_int("PRUNE_GAP_FLOAT64", 50)
PRUNE_GAP_FLOAT32 = _env_int("PRUNE_GAP_FLOAT32", 36)

#: Far rows of the streaming softmax (``kernels.pooling``). A query whose best
#: score m = -min_j ||z_q - z_j||^2 lies below -FAR_SCORE_<dtype> (or whose
#: scores all overflow to -inf) is recomputed in float64 relative to its nearest
#: key, s_j - s_a = (z_j - z_a) . ((z_q - z_j) + (z_q - z_a)): the direct scores
#: there carry a rounding error of about (d + 3) u |m| (u the unit roundoff),
#: which would decide the weights. At the defaults that error is below
#: (d + 3) 2^-12 (float32, u = 2^-24) and (d + 3) 2^-29 (float64) before the
#: switch. The check is one comparison per row; only far rows pay the extra
#: passes. Read when the kernels are compiled.
FAR_SCORE_FLOAT32 = _env_int("FAR_SCORE_FLOAT32", 1 << 12)
FAR_SCORE_FLOAT64 = _env_int("FAR_SCORE_FLOAT64", 1 << 24)
