"""The CPU flex backward at huge and large scores: P = 2**(t - lse log2 e) rebuilt from
the forward's lse stays finite (the exponent never above 0, whatever the rounding of
lse) and as accurate as the dense float64 formulation allows.

The shared score_mod and mask_mod of ``tests/flex_cases.py`` (a scalar factor from
mod_args, the same types in every call, every key admitted) serve every case: one
specialisation per dtype, shared with the other flex test files.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import nbattn
from tests.flex_cases import MODS, make_args

B, H, L, S, E, EV = 2, 2, 5, 6, 4, 3


def draw(dtype, factor, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)) * factor
    k = rng.standard_normal((B, H, S, E))
    v = rng.standard_normal((B, H, S, EV))
    grad = rng.standard_normal((B, H, L, EV))
    return tuple(a.astype(dtype) for a in (q, k, v, grad))


def run(q, k, v, grad, c=1.0):
    kw = {**MODS, "mod_args": make_args(B, H, max(L, S), scalar=c)}
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
    return nbattn.flash_attention_backward(q, k, v, out, lse, grad, **kw)


def dense_dv(q, k, v, grad, c=1.0):
    """dV = P^T dO with P the softmax of the scores c q k^T / sqrt(E), in float64 from the
    inputs as given (the max subtracted: exact one-hot rows at huge scores)."""
    q, k, grad = (np.asarray(a, dtype=np.float64) for a in (q, k, grad))
    s = (q @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[-1]) * c
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.swapaxes(p, -1, -2) @ grad


def relative(got, ref):
    return np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max()


@pytest.mark.parametrize(("dtype", "factor"), [(np.float64, 1e20), (np.float32, 1e30)])
def test_huge_scores_backward_is_finite_and_right(dtype, factor):
    """Scores ~factor: each row's weight is all on its largest score (one-hot P), so dV
    is dO gathered at the argmax keys, dQ and dK are (near) 0; the rounding of lse at
    that size is far above 1 in base 2, where an exponent above 0 overflowed before."""
    q, k, v, grad = draw(dtype, factor)
    dq, dk, dv = run(q, k, v, grad)
    for g in (dq, dk, dv):
        assert g.dtype == dtype and np.isfinite(g).all()
    assert relative(dv, dense_dv(q, k, v, grad)) <= 1e-6
    # dS = P (dP - D) is 0 on one-hot rows up to the rounding of out (D = dO . out)
    eps = float(np.finfo(dtype).eps)
    assert np.abs(dq).max() <= 64 * eps * factor * np.abs(k).max()
    assert np.abs(dk).max() <= 64 * eps * factor * np.abs(q / factor).max()


@pytest.mark.parametrize(
    ("dtype", "c", "tol"), [(np.float32, 300.0, 1e-6), (np.float64, 1e3, 1e-12)]
)
def test_large_scores_backward_is_as_accurate_as_the_dense_formulation(dtype, c, tol):
    """Scores ~1e3 (the row maximum's base-2 form has an ulp of ~1e-4 in float32): the
    backward rebuilds the forward's base-2 scores bit for bit and keeps the shift in
    float64, so dV is as close to the dense float64 value as the inputs allow."""
    q, k, v, grad = draw(dtype, 1.0, seed=1)
    _, _, dv = run(q, k, v, grad, c)
    assert relative(dv, dense_dv(q, k, v, grad, c)) <= tol


def test_the_backward_is_repeatable_on_one_and_two_threads():
    q, k, v, grad = draw(np.float64, 1e20, seed=2)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run(q, k, v, grad)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = run(q, k, v, grad)
        again = run(q, k, v, grad)
    finally:
        numba.set_num_threads(threads)
    for a, b, c in zip(one, two, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(b, c)


@pytest.mark.parametrize("missing", ["out", "lse", "grad_out"])
def test_a_missing_forward_result_is_named(missing):
    q, k, v, grad = draw(np.float64, 1.0)
    kw = {**MODS, "mod_args": make_args(B, H, max(L, S))}
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
    given = {"out": out, "lse": lse, "grad_out": grad, missing: None}
    for extra in (kw, {}):
        with pytest.raises(ValueError, match=f"^{missing} is required"):
            nbattn.flash_attention_backward(q, k, v, **given, **extra)
    assert given["out" if missing != "out" else "lse"] is not None
