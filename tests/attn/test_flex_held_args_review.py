"""A hostile review of ``mod_args`` held at an address (``nbattn.kernels.flex_shared.held_args``).

The flex loops (``nbattn.kernels.flex_loops``) take ``mod_args`` as the address of their
native values, written by ``held_args`` (which takes a reference to their arrays for the
duration of the call) and read back by the tile function of the generated module. These
tests check the lifetimes (no reference gained or lost by the arrays across calls, an
error of the kernel, or a block left by an exception), 8 Python threads at once with
``mod_args`` of different types (the same bits as one call after the other, no new loop
compiled), 22 ``mod_args`` of mixed widths against the dense formulation, and three
defects the review found below the public API, fixed since:

- ``held_args`` released with the type of the value at the block's end, not the one it
  wrote: a value changed in place during the block (here an array's dtype) made the
  release raise and its reference leak; it now releases the type it wrote;
- ``flex_loops.flex_forward`` given a tile function and ``mod_args`` of other types read
  them at the wrong layout (a segmentation fault; run in a subprocess); ``held_args``
  now refuses a value of other types than the tile function reads (a TypeError);
- ``flex_build.specialise`` keyed its modules on ``str(numba.typeof(args))``, which does
  not tell two namedtuple classes of one name and field types apart; it now takes plain
  tuples only (``attn.flex`` makes them) and refuses named ones.
"""

from __future__ import annotations

import collections
import gc
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import nbattn
from tests import naive

B, H, L, S, E = 1, 2, 40, 50, 8


def table_score(score, b, h, q_idx, kv_idx, table, c):
    """score + table[h, kv_idx] times c."""
    return score + table[h, kv_idx] * c


def table_mask(b, h, q_idx, kv_idx, table, c):
    """A mask read from the same table (closed, partial and open tiles)."""
    return table[h, kv_idx] > -1.0


def many_score(
    score, b, h, q_idx, kv_idx,
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18,
    a19, a20, a21,
):  # fmt: skip
    """22 mod_args of mixed widths, each read (one read at the wrong offset shows)."""
    return (
        score + a0 + a1 * a2 - a3 + a4[h, kv_idx] + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12
        + a13 + a14 + a15 + a16 + a17 + a18 + a19 + a20[kv_idx % 3] + a21 * 2.0**-63
    )  # fmt: skip


def many_grad(
    score, b, h, q_idx, kv_idx,
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18,
    a19, a20, a21,
):  # fmt: skip
    """d many_score / d score (for the dense formulation)."""
    return 1.0 + 0.0 * score


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((B, H, n, E)) for n in (L, S, S, L))
    return q, k, v, g


def _table(seed=1):
    return np.random.default_rng(seed).standard_normal((H, S))


def _both(q, k, v, g, args, score_mod=table_score, mask_mod=table_mask):
    kw = dict(score_mod=score_mod, mask_mod=mask_mod, mod_args=args)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
    return [out, lse] + list(nbattn.flash_attention_backward(q, k, v, out, lse, g, **kw))


def test_mod_args_arrays_keep_their_reference_counts():
    """Forward and backward, an overflow error of the kernel (raised after the loops),
    and held_args left by an exception: no reference of the arrays gained or lost."""
    from nbattn.kernels.flex_shared import held_args

    q, k, v, g = _inputs()
    table = _table()
    small = (table * 10).astype(np.int32)
    base = sys.getrefcount(table), sys.getrefcount(small)
    for _ in range(3):
        _both(q, k, v, g, (table, 1.5))
        _both(q, k, v, g, (small, np.int32(2)))
    with pytest.raises(ValueError, match="beyond"):
        nbattn.flash_attention(q, k, v, score_mod=table_score, mod_args=(table, 1e308))
    with pytest.raises(RuntimeError):
        with held_args(((table, 1.0), (small,))):
            raise RuntimeError
    gc.collect()
    assert (sys.getrefcount(table), sys.getrefcount(small)) == base


def test_eight_threads_with_mod_args_of_different_types():
    """8 Python threads at once, each its own mod_args (4 types), 2 calls each: the same
    bits as the calls one after the other, and the loops compiled once per direction."""
    from nbattn.kernels import flex_loops

    q, k, v, g = _inputs()
    t = _table()
    argsets = [
        (t * (i + 1), 1.5 + i)
        if i % 4 == 0
        else ((t * 10).astype(np.int32), np.int32(i))
        if i % 4 == 1
        else (t > 0.1 * i, np.float32(i * 0.25))
        if i % 4 == 2
        else ((np.abs(t) * 10).astype(np.uint16), 2**63 + i)
        for i in range(8)
    ]
    _both(q, k, v, g, argsets[0])
    before = (len(flex_loops._forward_items.overloads), len(flex_loops._backward_items.overloads))
    results: list = [None] * 8
    errors: list = []

    def work(i):
        try:
            for _ in range(2):
                got = _both(q, k, v, g, argsets[i])
                if results[i] is not None:
                    assert all(np.array_equal(a, b) for a, b in zip(got, results[i]))
                results[i] = got
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for i, args in enumerate(argsets):
        serial = _both(q, k, v, g, args)
        assert all(np.array_equal(a, b) for a, b in zip(results[i], serial)), i
    after = (len(flex_loops._forward_items.overloads), len(flex_loops._backward_items.overloads))
    assert after == before


def test_twenty_two_mod_args_of_mixed_widths_match_dense():
    """22 entries (float64/32/16, int8..int64, uint8..uint64 with one above 2**63, bools,
    Python ints and floats, two arrays): the dense result, forward and backward."""
    q, k, v, g = _inputs()
    t = _table()
    args = (
        0.1, np.float32(0.2), np.int8(3), np.int16(-4), t, np.int32(5), np.int64(-6),
        np.uint8(7), np.uint16(8), np.uint32(9), np.uint64(10), True, np.bool_(False), 1.25,
        2, np.float16(0.5), np.int8(-1), -3, 0.0, 1e-3, np.arange(3.0), np.uint64(2**63 + 11),
    )  # fmt: skip
    got = _both(q, k, v, g, args, score_mod=many_score, mask_mod=None)
    dense_args = tuple(np.float32(a) if isinstance(a, np.float16) else a for a in args)
    want = naive.flex_attention_grads(
        q, k, v, g, many_score, None, mod_args=dense_args, score_grad=many_grad
    )
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_held_args_releases_what_it_wrote_whatever_the_value_became():
    from nbattn.kernels.flex_shared import held_args

    a = np.arange(4.0)
    base = sys.getrefcount(a)
    raised = None
    try:
        with held_args(((a, 1.0), ())):
            a.dtype = np.dtype("V8")  # another thread, during the call
    except Exception as exc:  # noqa: BLE001 - asserted below
        raised = exc
    finally:
        a.dtype = np.float64
    gc.collect()
    assert raised is None and sys.getrefcount(a) == base


_MISMATCH = textwrap.dedent(
    """
    import numpy as np
    import nbattn
    from nbattn.kernels import flex_loops as loops
    from tests.attn.test_flex_held_args_review import _inputs, _table, table_score

    seen = []
    real = loops.flex_forward
    loops.flex_forward = lambda *a: (seen.append(a), real(*a))[1]
    q, k, v, _ = _inputs()
    nbattn.flash_attention(q, k, v, score_mod=table_score, mod_args=(_table(), 1.5))
    loops.flex_forward = real
    mod_tile, *rest = seen[0]
    rest[6] = (1.5,)  # score_args of other types than the tile function reads
    try:
        real(mod_tile, *rest)
    except Exception as exc:
        print("refused:", type(exc).__name__)
    """
)


def test_loops_given_mod_args_of_other_types_refuse_them():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", _MISMATCH], cwd=root, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and "refused: TypeError" in done.stdout, (
        done.returncode,
        done.stderr[-500:],
    )


def one_field(score, b, h, q_idx, kv_idx, p):
    """score plus the first field of a namedtuple (by index: either class works)."""
    return score + p[0]


def test_specialise_refuses_named_tuples_whose_name_is_no_type_identity():
    from numba import typeof

    from nbattn.kernels import flex_build

    first = collections.namedtuple("P", "a b")
    second = collections.namedtuple("P", "x y")
    for args in (((first(1.0, 2.0),), ()), ((), ((second(1.0, 2.0),),))):
        with pytest.raises(TypeError, match="plain tuples"):
            flex_build.specialise(one_field, None, None, args)
    plain = ((1.0, 2.0),), ()
    assert flex_build.specialise(one_field, None, None, plain).ARGS == typeof(plain)
