"""The typed groups that the LOO tile bodies pass each other (numba namedtuples of arrays).

A tile body of ``nbattn.kernels.loo_tiles`` (GEMM scores) or
``nbattn.kernels.loo_fused`` (direct scores) takes a block of query rows,
``queries.rows[i0:i0 + nb]``, against the keys the block sees, and adds its
sums into the thread's outputs. Each argument group below is one of those;
all arrays are float64 unless said otherwise, p outputs, d gradient
coordinates, k score dimensions, n keys.

The per-thread scratch of each algorithm is a group of its own, next to the
code that uses it: ``loo_tiles.GemmWork`` and ``loo_fused.PairWork``.
"""

from __future__ import annotations

from collections import namedtuple

#: The query rows of a tile kernel, the same for every block: ``z_t`` (k, n) every key
#: in score space (query r is key ``rows[r]``, its point ``z_t[:, rows[r]]``), ``points``
#: (n, d) every key in the coordinates of the gradient, ``targets`` (n_rows, p) the
#: query rows' y and ``rows`` (n_rows,) int64, ascending.
TileQueries = namedtuple("TileQueries", ("z_t", "points", "targets", "rows"))

#: The keys one block of rows sees (all keys, or those of the kept leaves gathered):
#: ``z`` (k, >= width) in score space, ``v`` (p, >= width) their y, ``x`` (>= width, d)
#: and ``x_t`` (d, >= width) their gradient coordinates, ``width`` how many, and
#: ``own_at`` (>= nb,) int64 the position of each block row's own key among them, or -1.
TileKeys = namedtuple("TileKeys", ("z", "v", "x", "x_t", "width", "own_at"))

#: What a tile body adds to: ``key_sums`` (>= width,) c_j = sum_r g_rj by position among
#: the block's keys, ``acc`` (d, d) the row part of M, ``far`` (n_rows,) bool the rows
#: left to the caller (indexed like ``TileQueries.rows``).
TileSums = namedtuple("TileSums", ("key_sums", "acc", "far"))
