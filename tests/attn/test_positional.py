"""Positional encodings vs tests/naive.py, their defining properties and their composition."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn.attn import positional

from .. import naive
from ..strategies import seeds
from .test_softmax import assert_close


@pytest.mark.parametrize("n, d", [(1, 2), (7, 8), (10, 5), (50, 32)])
def test_sinusoidal_matches_naive(n, d):
    assert_close(positional.sinusoidal(n, d), naive.sinusoidal(n, d))
    p32 = positional.sinusoidal(n, d, base=100.0, dtype="float32")
    assert p32.dtype == np.float32
    assert_close(p32, naive.sinusoidal(n, d, base=100.0), np.float32)


def test_learned_table_and_add_positions(rng):
    t = positional.learned(64, 16, random_state=0, std=0.1)
    assert t.shape == (64, 16)
    assert np.array_equal(t, positional.learned(64, 16, random_state=0, std=0.1))
    assert 0.08 < t.std() < 0.12
    x = rng.normal(size=(2, 5, 16))
    assert_close(positional.add_positions(x, t), x + t[:5])
    assert_close(positional.add_positions(x, t, offset=3), x + t[3:8])
    with pytest.raises(ValueError, match="table has 64 positions"):
        positional.add_positions(x, t, offset=60)
    with pytest.raises(ValueError, match="table must have shape"):
        positional.add_positions(x, t[:, :4])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rope_matches_naive(rng, interleaved, dtype):
    x = rng.normal(size=(2, 3, 6, 8)).astype(dtype)
    out = positional.rope(x, base=50.0, interleaved=interleaved)
    assert out.dtype == dtype
    assert_close(out, naive.rope(x, base=50.0, interleaved=interleaved), dtype)
    pos = rng.uniform(0, 100, size=6)
    assert_close(
        positional.rope(x, pos, interleaved=interleaved),
        naive.rope(x, pos, interleaved=interleaved),
        dtype,
    )


def test_rope_conventions_differ_by_a_feature_permutation(rng):
    x = rng.normal(size=(5, 8))
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])  # interleaved -> half
    a = positional.rope(x, interleaved=True)[:, perm]
    b = positional.rope(x[:, perm], interleaved=False)
    assert_close(a, b)


@settings(max_examples=20)
@given(
    L=st.integers(1, 6),
    half=st.integers(1, 4),
    shift=st.floats(-50, 50),
    seed=seeds,
    interleaved=st.booleans(),
)
def test_rope_scores_depend_on_offsets_only(L, half, shift, seed, interleaved):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(L, 2 * half))
    k = rng.normal(size=(L, 2 * half))
    pos = np.arange(L, dtype=float)
    s0 = (
        positional.rope(q, pos, interleaved=interleaved)
        @ positional.rope(k, pos, interleaved=interleaved).T
    )
    s1 = (
        positional.rope(q, pos + shift, interleaved=interleaved)
        @ positional.rope(k, pos + shift, interleaved=interleaved).T
    )
    np.testing.assert_allclose(s1, s0, rtol=1e-9, atol=1e-9)
    norms = np.linalg.norm(positional.rope(q, pos, interleaved=interleaved), axis=-1)
    np.testing.assert_allclose(norms, np.linalg.norm(q, axis=-1), rtol=1e-12)


@pytest.mark.parametrize("n", list(range(1, 17)) + [24, 48])
def test_alibi_slopes_match_reference(n):
    assert_close(positional.alibi_slopes(n), naive.alibi_slopes(n))


def test_alibi_slopes_of_eight_heads_are_the_papers():
    # Press et al.: for 8 heads, 1/2, 1/4, ..., 1/256
    assert_close(positional.alibi_slopes(8), 0.5 ** np.arange(1, 9))


def test_alibi_bias_and_attention(rng):
    H, L, S = 3, 5, 7
    bias = positional.alibi_bias(H, L, S)
    assert_close(bias, naive.alibi_bias(H, L, S))
    assert_close(positional.alibi_bias(H, 4), naive.alibi_bias(H, 4, 4))
    q = rng.normal(size=(2, H, L, 4))
    k = rng.normal(size=(2, H, S, 4))
    v = rng.normal(size=(2, H, S, 2))
    out = nbattn.attention(q, k, v, mask=bias, causal=True)
    ref, _ = naive.attention(q, k, v, mask=naive.alibi_bias(H, L, S), causal=True)
    assert_close(out, ref)


def test_relative_position_bias(rng):
    table = rng.normal(size=5)  # K = 2
    assert_close(
        positional.relative_position_bias(table, 4, 6), naive.relative_position_bias(table, 4, 6)
    )
    table_h = rng.normal(size=(7, 2))  # K = 3, two heads
    b = positional.relative_position_bias(table_h, 5)
    assert b.shape == (2, 5, 5)
    assert_close(b, naive.relative_position_bias(table_h, 5, 5))
    idx = positional.relative_position_index(3, 4, max_distance=1)
    assert np.array_equal(idx, [[1, 2, 2, 2], [0, 1, 2, 2], [0, 0, 1, 2]])


def test_relative_bias_composes_with_the_layer(rng):
    layer = nbattn.MultiHeadAttention(8, 2, random_state=0)
    x = rng.normal(size=(3, 6, 8))
    table = rng.normal(size=(5, 2))
    bias = positional.relative_position_bias(table, 6)  # (H, L, S)
    out, w = layer(x, x, x, mask=bias, average_attn_weights=False)
    wq, wk, wv = np.split(layer.in_proj_weight, 3)
    ref, ref_w = naive.multi_head_attention(
        x, x, x, 2, wq, wk, wv, 0, 0, 0, layer.out_proj_weight, 0, mask=bias
    )
    assert_close(out, ref)
    assert_close(w, ref_w)


def test_sinusoidal_composes_with_self_attention(rng):
    sa = nbattn.SelfAttention(8, num_heads=2, random_state=0)
    x = rng.normal(size=(6, 8))
    xp = positional.add_positions(x, positional.sinusoidal(6, 8))
    out, _ = sa(xp)
    ref, _ = sa(x + naive.sinusoidal(6, 8))
    assert_close(out, ref)


def test_validation():
    with pytest.raises(ValueError, match="num_positions"):
        positional.sinusoidal(0, 4)
    with pytest.raises(ValueError, match="dim"):
        positional.sinusoidal(3, 2.5)
    with pytest.raises(ValueError, match="even"):
        positional.rope(np.ones((3, 5)))
    with pytest.raises(ValueError, match="positions must have shape"):
        positional.rope(np.ones((3, 4)), positions=np.arange(4))
    with pytest.raises(ValueError, match="x contains NaN"):
        positional.rope(np.full((3, 4), np.nan))
    with pytest.raises(ValueError, match="num_heads"):
        positional.alibi_slopes(0)
    with pytest.raises(ValueError, match="table must have shape"):
        positional.relative_position_bias(np.ones(4), 3)
    with pytest.raises(ValueError, match="base"):
        positional.rope(np.ones((3, 4)), base=-1.0)
