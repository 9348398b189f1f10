"""MultiHeadAttention / SelfAttention vs a per-head naive loop and torch.nn.MultiheadAttention."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn

from .. import naive
from ..strategies import batch_shapes, seeds
from .test_softmax import assert_close


def _weights(layer):
    E = layer.embed_dim
    if layer.in_proj_weight is not None:
        wq, wk, wv = np.split(layer.in_proj_weight, 3)
    else:
        wq, wk, wv = layer.q_proj_weight, layer.k_proj_weight, layer.v_proj_weight
    b = layer.in_proj_bias if layer.in_proj_bias is not None else np.zeros(3 * E)
    bo = layer.out_proj_bias if layer.out_proj_bias is not None else np.zeros(E)
    return wq, wk, wv, b[:E], b[E : 2 * E], b[2 * E :], layer.out_proj_weight, bo


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kdim, vdim", [(None, None), (3, 5)])
def test_mha_matches_naive(rng, dtype, kdim, vdim):
    layer = nbattn.MultiHeadAttention(8, 2, kdim=kdim, vdim=vdim, random_state=1, dtype=dtype)
    layer.in_proj_bias[:] = rng.normal(size=24)  # non-zero biases exercise the bias path
    layer.out_proj_bias[:] = rng.normal(size=8)
    x = rng.normal(size=(2, 5, 8)).astype(dtype)
    key = rng.normal(size=(2, 6, kdim or 8)).astype(dtype)
    value = rng.normal(size=(2, 6, vdim or 8)).astype(dtype)
    mask = rng.random((2, 1, 5, 6)) > 0.3
    out, w = layer(x, key, value, mask=mask, average_attn_weights=False)
    ref, ref_w = naive.multi_head_attention(x, key, value, 2, *_weights(layer), mask=mask)
    assert out.dtype == np.dtype(dtype) and out.shape == (2, 5, 8) and w.shape == (2, 2, 5, 6)
    assert_close(out, ref, np.dtype(dtype).type)
    assert_close(w, ref_w, np.dtype(dtype).type)
    out2, w2 = layer(x, key, value, mask=mask)
    assert_close(out2, ref, np.dtype(dtype).type)
    assert_close(w2, ref_w.mean(axis=1), np.dtype(dtype).type)


def _torch_mha(torch, layer, **kw):
    t = torch.nn.MultiheadAttention(
        layer.embed_dim,
        layer.num_heads,
        bias=layer.in_proj_bias is not None,
        kdim=layer.kdim,
        vdim=layer.vdim,
        batch_first=True,
        dtype=torch.float64,
        **kw,
    )
    t.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    return t.eval()


@pytest.mark.parametrize(
    "kdim, vdim, bias", [(None, None, True), (4, 6, True), (None, None, False)]
)
def test_mha_matches_torch(rng, kdim, vdim, bias):
    torch = pytest.importorskip("torch")
    layer = nbattn.MultiHeadAttention(12, 3, bias=bias, kdim=kdim, vdim=vdim, random_state=0)
    t = _torch_mha(torch, layer)
    q = rng.normal(size=(2, 5, 12))
    k = rng.normal(size=(2, 7, kdim or 12))
    v = rng.normal(size=(2, 7, vdim or 12))
    mask = rng.random((5, 7)) > 0.3
    mask[:, 0] = True  # every row keeps a key (torch gives NaN rows otherwise, see below)
    key_mask = np.ones((2, 7), bool)
    key_mask[1, 5:] = False
    T = [torch.tensor(a) for a in (q, k, v)]
    with torch.no_grad():
        for avg in (True, False):
            ref, ref_w = t(
                *T,
                attn_mask=torch.tensor(~mask),  # torch: True = blocked
                key_padding_mask=torch.tensor(~key_mask),
                average_attn_weights=avg,
            )
            out, w = layer(q, k, v, mask=mask, key_mask=key_mask, average_attn_weights=avg)
            np.testing.assert_allclose(out, ref.numpy(), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-12, atol=1e-12)
        # causal, as an explicit torch mask
        causal = torch.ones(5, 7, dtype=torch.bool).triu(1)
        ref, ref_w = t(*T, attn_mask=causal)
        out, w = layer(q, k, v, causal=True)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-12, atol=1e-12)
        # float (additive) mask
        fmask = rng.normal(size=(5, 7))
        ref, _ = t(*T, attn_mask=torch.tensor(fmask))
        out, _ = layer(q, k, v, mask=fmask, need_weights=False)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-12, atol=1e-12)


def test_weights_copy_from_torch_and_back(rng):
    torch = pytest.importorskip("torch")
    t = torch.nn.MultiheadAttention(8, 4, batch_first=True, dtype=torch.float64)
    layer = nbattn.MultiHeadAttention(8, 4).load_state_dict(t.state_dict())
    x = rng.normal(size=(3, 4, 8))
    with torch.no_grad():
        ref, ref_w = t(*(torch.tensor(x),) * 3)
    out, w = layer(x, x, x)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w, ref_w.numpy(), rtol=1e-12, atol=1e-12)
    sd = layer.state_dict()
    assert set(sd) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}


def test_float32_layer_matches_torch(rng):
    torch = pytest.importorskip("torch")
    layer = nbattn.MultiHeadAttention(16, 4, random_state=2, dtype="float32")
    t = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    t.load_state_dict({k: torch.tensor(v) for k, v in layer.state_dict().items()})
    x = rng.normal(size=(2, 9, 16)).astype(np.float32)
    with torch.no_grad():
        ref, _ = t(*(torch.tensor(x),) * 3)
    out, _ = layer(x, x, x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=1e-5 * np.abs(ref.numpy()).max())


@pytest.mark.parametrize("layer_dtype", ["float64", "float32"])
@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_half_precision_torch_checkpoints_load_exactly(rng, layer_dtype, half):
    torch = pytest.importorskip("torch")
    for seed in range(5):
        torch.manual_seed(seed)
        t = torch.nn.MultiheadAttention(8, 2, batch_first=True, kdim=5, vdim=3)
        t = t.to(getattr(torch, half))
        state = t.state_dict()
        layer = nbattn.MultiHeadAttention(8, 2, kdim=5, vdim=3, dtype=layer_dtype)
        layer.load_state_dict(state)
        for key, value in layer.state_dict().items():
            assert value.dtype == np.dtype(layer_dtype)
            want = state[key].float().numpy().astype(layer_dtype)
            assert np.array_equal(value, want), key
        x = rng.normal(size=(2, 3, 8)).astype(layer_dtype)
        layer(x, rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 4, 3)))  # it runs


@pytest.mark.parametrize("layer_dtype", ["float64", "float32"])
def test_numpy_float16_state_loads_exactly(rng, layer_dtype):
    layer = nbattn.MultiHeadAttention(8, 2, random_state=3, dtype=layer_dtype)
    state = {
        k: (rng.normal(size=v.shape) * 4).astype(np.float16) for k, v in layer.state_dict().items()
    }
    layer.load_state_dict(state)
    for key, value in layer.state_dict().items():
        assert value.dtype == np.dtype(layer_dtype)
        assert np.array_equal(value, state[key].astype(layer_dtype)), key


def test_unreadable_tensor_dtype_names_the_key():
    torch = pytest.importorskip("torch")
    layer = nbattn.MultiHeadAttention(4, 2)
    state = {k: torch.tensor(v) for k, v in layer.state_dict().items()}
    state["out_proj.bias"] = torch.zeros(4, dtype=torch.complex64)
    with pytest.raises(ValueError, match=r"state\['out_proj.bias'\]"):
        layer.load_state_dict(state)
    state["out_proj.bias"] = torch.zeros(4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"state\['out_proj.bias'\]"):
        layer.load_state_dict(state)


def test_initialisation_like_torch():
    layer = nbattn.MultiHeadAttention(8, 2, random_state=0)
    xavier = np.sqrt(6.0 / (8 + 24))
    assert layer.in_proj_weight.shape == (24, 8)
    assert np.abs(layer.in_proj_weight).max() <= xavier
    assert np.abs(layer.in_proj_weight).max() > 0.8 * xavier  # spread over the full range
    assert np.abs(layer.out_proj_weight).max() <= 1 / np.sqrt(8)
    assert np.all(layer.in_proj_bias == 0) and np.all(layer.out_proj_bias == 0)
    again = nbattn.MultiHeadAttention(8, 2, random_state=0)
    assert np.array_equal(layer.in_proj_weight, again.in_proj_weight)
    separate = nbattn.MultiHeadAttention(8, 2, kdim=3, vdim=5, bias=False)
    assert separate.in_proj_weight is None and separate.k_proj_weight.shape == (8, 3)
    assert separate.in_proj_bias is None and separate.out_proj_bias is None


def test_self_attention_is_the_text_formula(rng):
    # single head: H = softmax(Q K^T / sqrt d) V, Q = X W_q^T, ..., then the output projection
    sa = nbattn.SelfAttention(6, random_state=3)
    x = rng.normal(size=(5, 6))
    wq, wk, wv = np.split(sa.attn.in_proj_weight, 3)
    Q, K, V = x @ wq.T, x @ wk.T, x @ wv.T
    alpha = naive.softmax_rows(Q @ K.T / np.sqrt(6))
    h = alpha @ V
    out, w = sa(x)
    assert_close(w, alpha)
    assert_close(out, h @ sa.attn.out_proj_weight.T)
    causal = nbattn.SelfAttention(6, num_heads=2, causal=True, random_state=3)
    out, w = causal(x)
    assert np.all(np.triu(w, 1) == 0)
    ref, _ = causal.attn(x, x, x, causal=True)
    assert_close(out, ref)


def test_rotary_layer_composes_rope_per_head(rng):
    layer = nbattn.MultiHeadAttention(8, 2, random_state=4, rotary_base=100.0)
    x = rng.normal(size=(2, 6, 8))
    out, w = layer(x, x, x, average_attn_weights=False)
    wq, wk, wv = np.split(layer.in_proj_weight, 3)

    def heads(a):
        return np.swapaxes(a.reshape(2, 6, 2, 4), 1, 2)

    qh = naive.rope(heads(x @ wq.T), base=100.0)
    kh = naive.rope(heads(x @ wk.T), base=100.0)
    o, ref_w = naive.attention(qh, kh, heads(x @ wv.T))
    ref = np.swapaxes(o, 1, 2).reshape(2, 6, 8) @ layer.out_proj_weight.T
    assert_close(w, ref_w)
    assert_close(out, ref)


def test_fully_masked_row_gives_output_bias(rng):
    layer = nbattn.MultiHeadAttention(4, 2, random_state=0)
    layer.out_proj_bias[:] = [1.0, 2.0, 3.0, 4.0]
    x = rng.normal(size=(3, 4))
    mask = np.ones((3, 3), bool)
    mask[0] = False
    out, w = layer(x, x, x, mask=mask)
    assert not np.isnan(out).any()
    assert_close(out[0], layer.out_proj_bias)
    assert np.all(w[0] == 0)


def test_validation(rng):
    with pytest.raises(ValueError, match="divisible"):
        nbattn.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="embed_dim"):
        nbattn.MultiHeadAttention(0, 1)
    layer = nbattn.MultiHeadAttention(4, 2)
    x = rng.normal(size=(3, 4))
    with pytest.raises(ValueError, match="mask has shape"):
        layer(x, x, x, mask=np.ones((3, 2), bool))
    with pytest.raises(ValueError, match="key_mask"):
        layer(x, x, x, key_mask=np.ones(2, bool))
    with pytest.raises(ValueError, match="in_proj_weight"):
        layer(x, rng.normal(size=(3, 5)), x)
    with pytest.raises(ValueError, match="key and value"):
        layer(x, x, x[:2])
    with pytest.raises(ValueError, match="query contains NaN"):
        layer(np.full((3, 4), np.nan), x, x)
    with pytest.raises(ValueError, match="out_proj.weight"):
        layer.load_state_dict({"in_proj_weight": np.zeros((12, 4)), "in_proj_bias": np.zeros(12)})
    with pytest.raises(ValueError, match="shape"):
        layer.load_state_dict({**layer.state_dict(), "in_proj_weight": np.zeros((3, 4))})


@settings(max_examples=20)
@given(
    batch=batch_shapes(dims=1, size=2),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 3),
    L=st.integers(1, 5),
    S=st.integers(1, 5),
    with_mask=st.booleans(),
    seed=seeds,
)
def test_mha_property(batch, heads, head_dim, L, S, with_mask, seed):
    rng = np.random.default_rng(seed)
    E = heads * head_dim
    layer = nbattn.MultiHeadAttention(E, heads, kdim=E + 1, vdim=2, random_state=seed)
    layer.in_proj_bias[:] = rng.normal(size=3 * E)
    x = rng.normal(size=batch + (L, E))
    key = rng.normal(size=batch + (S, E + 1))
    value = rng.normal(size=batch + (S, 2))
    mask = rng.random((L, S)) > 0.3 if with_mask else None
    out, w = layer(x, key, value, mask=mask, average_attn_weights=False)
    ref, ref_w = naive.multi_head_attention(x, key, value, heads, *_weights(layer), mask=mask)
    assert_close(out, ref)
    assert_close(w, ref_w)


def test_fully_masked_row_torch_nan_nbattn_bias(rng):
    torch = pytest.importorskip("torch")
    layer = nbattn.MultiHeadAttention(4, 2, random_state=0)
    layer.out_proj_bias[:] = [1.0, -1.0, 0.5, 2.0]
    t = _torch_mha(torch, layer)
    x = rng.normal(size=(1, 3, 4))
    mask = np.ones((3, 3), bool)
    mask[0] = False
    with torch.no_grad():
        ref, _ = t(*(torch.tensor(x),) * 3, attn_mask=torch.tensor(~mask))
    out, _ = layer(x, x, x, mask=mask)
    assert np.isnan(ref.numpy()[0, 0]).all() or np.allclose(ref.numpy()[0, 0], layer.out_proj_bias)
    assert_close(out[0, 0], layer.out_proj_bias)
    np.testing.assert_allclose(out[0, 1:], ref.numpy()[0, 1:], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- grouped-query heads
def _gqa_reference(layer, query, key, value, causal=False):
    """Per-head NumPy attention with kv head h // (H / H_kv), then the output projection."""
    H, H_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    E, E_kv = layer.embed_dim, H_kv * d
    b = layer.in_proj_bias if layer.in_proj_bias is not None else np.zeros(E + 2 * E_kv)
    bo = layer.out_proj_bias if layer.out_proj_bias is not None else np.zeros(E)

    def heads(x, w, bias, n):
        y = x @ w.T + bias
        return np.swapaxes(y.reshape(y.shape[:-1] + (n, d)), -2, -3)

    qh = heads(query, layer.q_proj_weight, b[:E], H)
    kh = heads(key, layer.k_proj_weight, b[E : E + E_kv], H_kv)
    vh = heads(value, layer.v_proj_weight, b[E + E_kv :], H_kv)
    outs = [
        naive.attention_bottom_right(qh[i], kh[i], vh[i], causal=causal, bottom_right=False)[0]
        for i in range(query.shape[0])
    ]
    concat = np.swapaxes(np.stack(outs), 1, 2).reshape(query.shape[:-1] + (E,))
    return concat @ layer.out_proj_weight.T + bo


@pytest.mark.parametrize("num_kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_layer_matches_numpy(rng, num_kv_heads, causal):
    layer = nbattn.MultiHeadAttention(12, 4, num_kv_heads=num_kv_heads, random_state=5)
    d = 3
    assert layer.in_proj_weight is None
    assert layer.k_proj_weight.shape == (num_kv_heads * d, 12)
    assert layer.in_proj_bias.shape == (12 + 2 * num_kv_heads * d,)
    layer.in_proj_bias[:] = rng.normal(size=layer.in_proj_bias.shape)
    layer.out_proj_bias[:] = rng.normal(size=12)
    x = rng.normal(size=(2, 5, 12))
    kv = rng.normal(size=(2, 7, 12))
    out, w = layer(x, kv, kv, causal=causal)
    assert_close(out, _gqa_reference(layer, x, kv, kv, causal=causal))
    assert w.shape == (2, 5, 7)


def test_grouped_query_layer_matches_torch_enable_gqa(rng):
    torch = pytest.importorskip("torch")
    layer = nbattn.MultiHeadAttention(16, 8, num_kv_heads=2, kdim=5, vdim=6, random_state=1)
    layer.in_proj_bias[:] = rng.normal(size=layer.in_proj_bias.shape)
    x, key, value = (
        rng.normal(size=(2, 4, 16)),
        rng.normal(size=(2, 9, 5)),
        rng.normal(size=(2, 9, 6)),
    )
    b = layer.in_proj_bias
    T = torch.tensor

    def heads(a, w, bias, n):
        y = T(a) @ T(w).T + T(bias)
        return y.reshape(2, -1, n, 2).transpose(1, 2)

    qh = heads(x, layer.q_proj_weight, b[:16], 8)
    kh = heads(key, layer.k_proj_weight, b[16:20], 2)
    vh = heads(value, layer.v_proj_weight, b[20:], 2)
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
    ref = o.transpose(1, 2).reshape(2, 4, 16) @ T(layer.out_proj_weight).T
    out, _ = layer(x, key, value, need_weights=False)
    np.testing.assert_allclose(out, ref.numpy() + layer.out_proj_bias, rtol=1e-12, atol=1e-12)


def test_grouped_query_state_dict_round_trip(rng):
    layer = nbattn.MultiHeadAttention(8, 4, num_kv_heads=2, random_state=0)
    layer.in_proj_bias[:] = rng.normal(size=layer.in_proj_bias.shape)
    state = layer.state_dict()
    assert set(state) == {
        "q_proj_weight",
        "k_proj_weight",
        "v_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    }
    other = nbattn.MultiHeadAttention(8, 4, num_kv_heads=2, random_state=1).load_state_dict(state)
    x = rng.normal(size=(2, 3, 8))
    assert np.array_equal(other(x, x, x)[0], layer(x, x, x)[0])
    with pytest.raises(ValueError, match=r"state\['k_proj_weight'\] has shape"):
        nbattn.MultiHeadAttention(8, 4, random_state=1, kdim=3).load_state_dict(
            {
                **nbattn.MultiHeadAttention(8, 4, kdim=3).state_dict(),
                "k_proj_weight": state["k_proj_weight"],
            }
        )
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3"):
        nbattn.MultiHeadAttention(8, 4, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        nbattn.MultiHeadAttention(8, 4, num_kv_heads=0)


# --------------------------------------------------------------------------- incremental decoding
@pytest.mark.parametrize(
    "num_kv_heads, rotary_base, bias",
    [(4, None, True), (2, None, True), (1, 100.0, True), (4, 50.0, False)],
)
def test_step_by_step_decoding_equals_the_full_causal_forward(rng, num_kv_heads, rotary_base, bias):
    layer = nbattn.MultiHeadAttention(
        8, 4, num_kv_heads=num_kv_heads, rotary_base=rotary_base, bias=bias, random_state=3
    )
    if bias:
        layer.in_proj_bias[:] = rng.normal(size=layer.in_proj_bias.shape)
        layer.out_proj_bias[:] = rng.normal(size=8)
    x = rng.normal(size=(2, 10, 8))
    full, _ = layer(x, x, x, causal=True)
    cache = layer.new_cache(2, capacity=3)  # grows on the way
    pieces = []
    for a, b in ((0, 4), (4, 5), (5, 6), (6, 8), (8, 9), (9, 10)):  # a prefill, then steps
        step = x[:, a:b]
        out, weights = layer(step, step, step, causal=True, cache=cache)
        assert weights is None and out.shape == (2, b - a, 8)
        pieces.append(out)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full, rtol=1e-10, atol=1e-10)
    assert cache.lengths.tolist() == [10, 10]


def test_self_attention_decoding_float32(rng):
    sa = nbattn.SelfAttention(8, num_heads=2, num_kv_heads=1, causal=True, dtype="float32")
    x = rng.normal(size=(1, 6, 8)).astype(np.float32)
    full, _ = sa(x)
    cache = sa.new_cache(1)
    steps = [sa(x[:, t : t + 1], cache=cache)[0] for t in range(6)]
    got = np.concatenate(steps, axis=1)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, full, rtol=0, atol=2e-5 * np.abs(full).max())


def test_decoding_validation(rng):
    layer = nbattn.MultiHeadAttention(8, 4, num_kv_heads=2)
    x = rng.normal(size=(2, 1, 8))
    with pytest.raises(ValueError, match="cache holds"):
        layer(x, x, x, cache=nbattn.KVCache(2, 4, 2))
    with pytest.raises(ValueError, match="cache must be a KVCache"):
        layer(x, x, x, cache={})
    cache = layer.new_cache(2)
    with pytest.raises(ValueError, match="not supported with cache"):
        layer(x, x, x, cache=cache, mask=np.ones((1, 1), bool))
    with pytest.raises(ValueError, match="B = 2"):
        layer(x[:1], x[:1], x[:1], cache=cache)
    with pytest.raises(ValueError, match="query must be 3-D"):
        layer(x[0], x[0], x[0], cache=cache)
    assert cache.lengths.tolist() == [0, 0]  # nothing appended by the refused calls
