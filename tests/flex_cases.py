"""One score_mod / mask_mod pair for the CPU flex tests, shared across test files.

numba compiles the flex kernels once per (score_mod, mask_mod, score_mod_grad) and per
type signature of ``mod_args`` and dtype of q (seconds each, paid by every cold run):
the tests that exercise a case these functions express (a scaled score, a softcap,
ALiBi, relative and absolute bias tables, a diagonal bonus, documents, a prefix, a
window) all run :func:`score_fn` and :func:`mask_fn` with ``mod_args`` from
:func:`make_args`, whose entries have the same types every time, so the files share
one compiled specialisation per dtype instead of compiling their own.

``mod_args`` (see :data:`NAMES`; ``args[SCALAR]`` and so on):

* ``scalar``, ``cap``: 0-d float arrays (learnable): a score multiplier and a tanh
  softcap (none when 0);
* ``slopes`` (H,): ALiBi slopes[h] (j - i);
* ``table`` (rows, 2n + 1 or 2n - 1): a relative-position bias
  table[h % rows, j - i + centre], centre = its width // 2;
* ``table2`` (rows2, cols2): an absolute key bias table2[h % rows2, j % cols2];
* ``doc`` (B, 3, n) int64: the document of query i (doc[b, 0, i]) and of key j
  (doc[b, 1, j]), a query of document -1 seeing no key; doc[b, 2, j] != 0 marks a
  global key, seen by every query of its document whatever the window (a prefix
  of p keys: doc[b, 2, :p] = 1);
* ``left``, ``right`` (int): the window j - i in [-left, right] for other keys;
* ``diag`` (float): added on j == i;
* ``spy``: a float array no function reads, whose gradient buffer a test's
  ``score_mod_args_grad`` may use to count its calls.
"""

from __future__ import annotations

import numpy as np

import nbattn

WIDE = 10**6  # an unbounded window side

NAMES = (
    "scalar", "cap", "slopes", "table", "table2", "doc", "left", "right", "diag", "spy",
)  # fmt: skip
SCALAR, CAP, SLOPES, TABLE, TABLE2, DOC, LEFT, RIGHT, DIAG, SPY = range(len(NAMES))


def score_fn(
    score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, doc, left, right,
    diag, spy,
):  # fmt: skip
    """s = score scalar, then c tanh(s / c) for c = cap > 0, plus slopes[h] (j - i),
    table[h % rows, j - i + centre], table2[h % rows2, j % cols2] and, on j == i, diag."""
    s = score * scalar[()]
    c = cap[()]
    if c > 0:
        s = c * nbattn.flex_tanh(s / c)
    s = s + slopes[h] * (kv_idx - q_idx)
    s = s + table[h % table.shape[0], kv_idx - q_idx + table.shape[1] // 2]
    s = s + table2[h % table2.shape[0], kv_idx % table2.shape[1]]
    return s + diag * (kv_idx == q_idx)  # (NumPy operations: also tests/naive.py's form)


def mask_fn(b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, doc, left, right, diag, spy):
    """Query and key in the same document (not -1), and j - i in [-left, right] or key
    j global."""
    mine = doc[b, 0, q_idx]
    same = (mine >= 0) & (mine == doc[b, 1, kv_idx])
    inside = (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)
    return same & (inside | (doc[b, 2, kv_idx] != 0))


def score_grad_fn(
    score, b, h, q_idx, kv_idx, scalar, cap, slopes, table, table2, doc, left, right,
    diag, spy,
):  # fmt: skip
    """d score_fn / d score: scalar (1 - tanh(score scalar / c)**2) under a softcap c,
    else scalar."""
    k = scalar[()]
    c = cap[()]
    if c > 0:
        t = np.tanh(score * k / c)
        return k * (1.0 - t * t)
    return k + 0.0 * score


MODS = dict(score_mod=score_fn, mask_mod=mask_fn)


def make_args(
    n_b, n_h, n, *, scalar=1.0, cap=0.0, slopes=None, table=None, table2=None, doc=None,
    prefix=0, left=WIDE, right=WIDE, diag=0.0, spy=None,
):  # fmt: skip
    """``mod_args`` for :func:`score_fn` / :func:`mask_fn`, batch ``n_b``, ``n_h`` query
    heads and ``n`` positions (at least the queries and keys). Absent terms are float64
    zeros (a table of (1, 2n + 1), a table2 of (1, 1)), one document 0 and no window;
    ``doc`` may be (B, n), the same for queries and keys, or (B, 2, n); ``prefix`` (a
    number or (B,)) makes keys j < prefix[b] global.
    A float entry given as a NumPy array is taken as it is (its dtype kept), one given
    as numbers becomes a float64 array."""

    def floats(x, zeros):
        return x if isinstance(x, np.ndarray) else np.array(zeros if x is None else x, float)

    if doc is None:
        doc = np.zeros((n_b, n), dtype=np.int64)
    doc = np.asarray(doc, dtype=np.int64)
    if doc.ndim == 2:
        doc = np.stack([doc, doc], axis=1)
    prefix = np.broadcast_to(np.asarray(prefix, dtype=np.int64), (n_b,))
    glob = (np.arange(doc.shape[-1]) < prefix[:, None]).astype(np.int64)
    doc = np.concatenate([doc, glob[:, None]], axis=1)
    return (
        floats(scalar, 1.0),
        floats(cap, 0.0),
        floats(slopes, np.zeros(n_h)),
        floats(table, np.zeros((1, 2 * n + 1))),
        floats(table2, np.zeros((1, 1))),
        doc,
        int(left),
        int(right),
        float(diag),
        np.zeros((1, 1, 1, 1)) if spy is None else spy,
    )


def with_args(args, **entries):
    """``args`` with the named entries replaced."""
    out = list(args)
    for name, value in entries.items():
        out[NAMES.index(name)] = value
    return tuple(out)


def to_torch(args):
    """``args`` with its arrays as torch tensors (sharing memory), for nbattn.torch."""
    import torch

    return tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)
