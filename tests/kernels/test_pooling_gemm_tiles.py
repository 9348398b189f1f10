"""The wide tiles of ``kernels.pooling_gemm`` (from ``config.GEMM_WIDE_FEATURES`` features
on) against the naive references: partial tiles, the excluded own key on and off the
tile diagonal, several outputs (the P V GEMM) and one (the fused weighted sum).

The narrow tiles and the row checks (far queries, offsets, keys far from the centre)
are tested in ``test_pooling_paths.py``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config
from nbattn._core.threads import blas_one_thread
from nbattn.kernels import pooling_gemm
from nbattn.smoothing import regression

from .. import naive
from ..strategies import pooling_shapes, seeds

WIDE = config.GEMM_WIDE_FEATURES


def _rel_err(got, ref):
    return np.max(np.abs(got - ref)) / max(np.max(np.abs(ref)), 1e-300)


def _tol(dtype, d):
    """float32: ~1e-5 of the output scale plus the scores' rounding, (d + 3) u |s|
    (the same allowance as the random-shape test of both paths)."""
    return 1e-12 if dtype == "float64" else 2e-5 * max(1.0, d / 8)


def _wide_data(rng, n_queries, n_keys, d, n_outputs):
    """Normal keys; a bandwidth 4x the rule's keeps |s| ~ 10, where float32 keeps
    four or five digits of the weights."""
    keys = rng.normal(size=(n_keys, d))
    queries = rng.normal(size=(n_queries, d))
    shape = n_keys if n_outputs is None else (n_keys, n_outputs)
    values = rng.normal(size=shape)
    return queries, keys, values, 4.0 * regression.bandwidth_rule(keys)


def _force_gemm(monkeypatch):
    for name in ("GEMM_MIN_FEATURES_FLOAT32", "GEMM_MIN_FEATURES_FLOAT64"):
        monkeypatch.setattr(config, name, 1)


def test_wide_inputs_take_the_wide_tiles():
    assert pooling_gemm.tile_shape(WIDE) == (config.GEMM_WIDE_BLOCK_Q, config.GEMM_WIDE_BLOCK_K)
    assert pooling_gemm.tile_shape(WIDE - 1) == (config.GEMM_BLOCK_Q, config.GEMM_BLOCK_K)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n_outputs", [None, 3])
@pytest.mark.parametrize("exclude_self", [False, True])
def test_wide_tiles_across_tile_edges(dtype, n_outputs, exclude_self, monkeypatch):
    """More keys than GEMM_WIDE_BLOCK_K and queries than GEMM_WIDE_BLOCK_Q."""
    _force_gemm(monkeypatch)
    rng = np.random.default_rng(11)
    n = max(config.GEMM_WIDE_BLOCK_Q, config.GEMM_WIDE_BLOCK_K) + 37
    _, x, v, h = _wide_data(rng, 0, n, WIDE, n_outputs)
    got, lse = nbattn.nadaraya_watson(
        x, x, v, h, exclude_self=exclude_self, dtype=dtype, return_lse=True
    )
    ref = naive.nadaraya_watson(x, x, v, h, exclude_self=exclude_self)
    assert _rel_err(got, ref) <= _tol(dtype, WIDE)
    ref_lse = naive.nadaraya_watson_lse(x, x, h, exclude_self=exclude_self)
    tol = _tol(dtype, WIDE)
    np.testing.assert_allclose(lse, ref_lse, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_wide_tiles_skip_the_own_key_at_an_offset(dtype):
    """A chunk of rows pooled against all keys with ``self_offset``: each row's own key
    lies in a different key tile from its query tile's diagonal, and is skipped."""
    rng = np.random.default_rng(12)
    n, offset, rows = config.GEMM_WIDE_BLOCK_K + 90, config.GEMM_WIDE_BLOCK_K - 40, 100
    _, x, v, h = _wide_data(rng, 0, n, WIDE, 2)
    q, k_t, v_t, k = regression._layout(
        x[offset : offset + rows], x, v, h, np.dtype(dtype), keys_row_major=True
    )
    before = [a.copy() for a in (q, k, k_t, v_t)]
    with blas_one_thread():
        out, lse = pooling_gemm.gaussian_pool_gemm(q, k, k_t, v_t, True, offset)
    for a, b in zip((q, k, k_t, v_t), before):
        np.testing.assert_array_equal(a, b)
    ref = naive.nadaraya_watson(x, x, v, h, exclude_self=True)[offset : offset + rows]
    assert _rel_err(out, ref) <= _tol(dtype, WIDE)
    ref_lse = naive.nadaraya_watson_lse(x, x, h, exclude_self=True)[offset : offset + rows]
    np.testing.assert_allclose(lse, ref_lse, rtol=_tol(dtype, WIDE), atol=_tol(dtype, WIDE))


@settings(max_examples=12)
@given(
    shape=pooling_shapes(queries=600, keys=700, features=(WIDE, WIDE + 40), outputs=3),
    f32=st.booleans(),
    log_scale=st.floats(0.0, 0.5),
    seed=seeds,
)
def test_random_wide_shapes(shape, f32, log_scale, seed):
    rng = np.random.default_rng(seed)
    q, k, v, h = _wide_data(rng, *shape)
    h = h * 10.0**-log_scale  # from |s| ~ 10 to ~ 100: a few keys dominate each row
    dtype = "float32" if f32 else "float64"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _force_gemm(monkeypatch)
        got = nbattn.nadaraya_watson(q, k, v, h, dtype=dtype)
    ref = naive.nadaraya_watson(q, k, v, h)
    assert np.all(np.isfinite(got))
    # the scores carry (d + 3) u |s| of rounding on either path; |s| grows as h**-2
    tol = _tol(dtype, shape.d) * 100.0**log_scale
    assert _rel_err(got, ref) <= tol


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rows_redone_without_the_transposed_keys(dtype):
    """Callers may pass an empty ``keys_t``: the rows the tiles do not keep (queries
    far from every key, near queries among keys far from the centre) are redone on
    keys the kernel transposes itself, with the same results as with ``keys_t``."""
    rng = np.random.default_rng(13)
    a, b = rng.normal(size=(300, WIDE)), rng.normal(size=(3, WIDE)) + 40.0
    keys = np.vstack([a, b])
    far = 1e30 if dtype == "float32" else 1e160
    queries = np.vstack(
        [rng.normal(size=(20, WIDE)), b + rng.normal(scale=0.05, size=b.shape), a[7] * far]
    )
    values = rng.normal(size=(keys.shape[0], 2))
    h = np.full(WIDE, 4.0)  # the layout takes a resolved bandwidth, one per feature
    q, k_t, v_t, k = regression._layout(
        queries, keys, values, h, np.dtype(dtype), keys_row_major=True
    )
    with blas_one_thread():
        out, lse = pooling_gemm.gaussian_pool_gemm(q, k, k_t, v_t, False, 0)
        out_e, lse_e = pooling_gemm.gaussian_pool_gemm(
            q, k, np.empty((0, 0), q.dtype), v_t, False, 0
        )
    np.testing.assert_array_equal(out_e, out)
    np.testing.assert_array_equal(lse_e, lse)
    ref = naive.nadaraya_watson(queries[:-1], keys, values, h)
    assert _rel_err(out[:-1], ref) <= _tol(dtype, WIDE) * 10
    np.testing.assert_allclose(out[-1], values[np.argmax(keys @ a[7])], rtol=_tol(dtype, WIDE))
