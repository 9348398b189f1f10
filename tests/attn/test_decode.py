"""flash_decode and KVCache against dense attention over the concatenated cache."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from nbattn import config

from .. import naive
from ..strategies import seeds

TOL = {np.float64: 1e-10, np.float32: 2e-5}


def _caches(rng, B, H_kv, S_max, E, Ev, lengths, dtype=np.float64):
    """Caches filled with noise past the valid rows too (they must never be read)."""
    k = rng.normal(size=(B, H_kv, S_max, E)).astype(dtype)
    v = rng.normal(size=(B, H_kv, S_max, Ev)).astype(dtype)
    return k, v, np.asarray(lengths, dtype=np.int64)


def _reference(q, k_cache, v_cache, totals, **kw):
    outs, lses = [], []
    for b, total in enumerate(totals):
        out, lse = naive.attention_bottom_right(
            q[b], k_cache[b, :, :total], v_cache[b, :, :total], **kw
        )
        outs.append(out)
        lses.append(lse)
    return np.stack(outs), np.stack(lses)


def _assert_matches(out, lse, ref_out, ref_lse, dtype):
    tol = TOL[dtype]
    scale = max(1.0, float(np.abs(ref_out).max()))
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=tol * scale)
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    "causal, window, softcap",
    [
        (True, None, None),
        (False, None, None),
        (True, (4, None), None),
        (True, None, 2.0),
        (False, (3, 2), None),
    ],
)
def test_step_by_step_matches_dense_attention(rng, dtype, causal, window, softcap):
    """B = 3 rows of lengths 0, 5, 17, GQA (4 query heads on 2 kv heads), several steps."""
    B, H, H_kv, E, Ev, S_max = 3, 4, 2, 8, 6, 40
    k_cache, v_cache, lengths = _caches(rng, B, H_kv, S_max, E, Ev, [0, 5, 17], dtype)
    for n_new, n_q in ((3, 3), (1, 1), (2, 1), (1, 2)):
        q = rng.normal(size=(B, H, n_q, E)).astype(dtype)
        k_new = rng.normal(size=(B, H_kv, n_new, E)).astype(dtype)
        v_new = rng.normal(size=(B, H_kv, n_new, Ev)).astype(dtype)
        before_k, before_v = k_cache.copy(), v_cache.copy()
        args = (q.copy(), k_new.copy(), v_new.copy(), lengths.copy())
        out, lse = nbattn.flash_decode(
            q,
            k_cache,
            v_cache,
            lengths,
            k_new,
            v_new,
            causal=causal,
            window=window,
            softcap=softcap,
            enable_gqa=True,
            return_lse=True,
        )
        for given_arr, kept in zip((q, k_new, v_new, lengths), args):
            assert np.array_equal(given_arr, kept)  # inputs other than the caches untouched
        for b in range(B):
            n = lengths[b]
            before_k[b, :, n : n + n_new] = k_new[b]
            before_v[b, :, n : n + n_new] = v_new[b]
        # exactly the new rows were written, nothing else
        assert np.array_equal(k_cache, before_k) and np.array_equal(v_cache, before_v)
        totals = lengths + n_new
        ref_out, ref_lse = _reference(
            q, k_cache, v_cache, totals, causal=causal, window=window, softcap=softcap
        )
        assert out.dtype == dtype and out.shape == (B, H, n_q, Ev) and lse.dtype == np.float64
        _assert_matches(out, lse, ref_out, ref_lse, dtype)
        lengths = totals


def test_attend_the_cache_without_new_tokens(rng):
    k_cache, v_cache, lengths = _caches(rng, 3, 2, 20, 4, 4, [0, 1, 20])
    q = rng.normal(size=(3, 2, 1, 4))
    saved = k_cache.copy()
    out, lse = nbattn.flash_decode(q, k_cache, v_cache, lengths, return_lse=True)
    assert np.array_equal(k_cache, saved)
    ref_out, ref_lse = _reference(q, k_cache, v_cache, lengths, causal=True)
    _assert_matches(out, lse, ref_out, ref_lse, np.float64)
    assert np.all(out[0] == 0.0) and np.all(lse[0] == -np.inf)  # the empty row


@pytest.mark.parametrize("items_per_thread, min_keys", [(3, 16), (7, 8), (1, 1)])
def test_split_count_does_not_change_the_result(rng, monkeypatch, items_per_thread, min_keys):
    """Odd and even numbers of chunks, chunks of one key: the merged result is the same."""
    monkeypatch.setattr(config, "DECODE_ITEMS_PER_THREAD", items_per_thread)
    monkeypatch.setattr(config, "DECODE_MIN_SPLIT_KEYS", min_keys)
    monkeypatch.setattr(config, "DECODE_BLOCK_K", 8)
    monkeypatch.setattr(config, "FLASH_SERIAL_WORK", 1)
    k_cache, v_cache, lengths = _caches(rng, 2, 1, 300, 8, 8, [299, 37])
    q = rng.normal(size=(2, 3, 1, 8)) * 3.0  # peaked softmax: rescaling matters
    k_new, v_new = rng.normal(size=(2, 1, 1, 8)), rng.normal(size=(2, 1, 1, 8))
    out, lse = nbattn.flash_decode(
        q, k_cache, v_cache, lengths, k_new, v_new, enable_gqa=True, return_lse=True
    )
    ref_out, ref_lse = _reference(q, k_cache, v_cache, lengths + 1, causal=True)
    _assert_matches(out, lse, ref_out, ref_lse, np.float64)


def test_windowed_decode_reads_only_the_window(rng):
    """Keys outside the window do not count, however large their scores; NaN there is
    still refused (every live cache row must be finite)."""
    k_cache, v_cache, lengths = _caches(rng, 1, 2, 64, 4, 4, [63])
    q = rng.normal(size=(1, 2, 1, 4))
    k_cache[0, :, :50] = 30.0 * q[0]  # would take all the weight if admitted
    v_cache[0, :, :50] = 1e6
    saved_k, saved_v = k_cache.copy(), v_cache.copy()
    k_new, v_new = rng.normal(size=(1, 2, 1, 4)), rng.normal(size=(1, 2, 1, 4))
    out = nbattn.flash_decode(q, k_cache, v_cache, lengths, k_new, v_new, window=(13, 0))
    saved_k[0, :, 63:], saved_v[0, :, 63:] = k_new[0], v_new[0]
    ref, _ = _reference(q, saved_k, saved_v, [64], causal=True, window=(13, 0))
    np.testing.assert_allclose(out, ref, atol=1e-12)
    k_cache[0, 1, 7] = np.nan
    with pytest.raises(ValueError, match="batch row 0, head 1, position 7"):
        nbattn.flash_decode(q, k_cache, v_cache, lengths + 1, window=(13, 0))


def test_matches_torch_sdpa_with_gqa(rng):
    torch = pytest.importorskip("torch")
    B, H, H_kv, S, E = 2, 8, 2, 300, 16
    k_cache = rng.normal(size=(B, H_kv, S, E)).astype(np.float32)
    v_cache = rng.normal(size=(B, H_kv, S, E)).astype(np.float32)
    q = rng.normal(size=(B, H, 1, E)).astype(np.float32)
    out = nbattn.flash_decode(q, k_cache, v_cache, np.array([S, S]), enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k_cache, v_cache)), enable_gqa=True
    )
    np.testing.assert_allclose(out, ref.numpy(), atol=2e-5)


@settings(max_examples=25)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    n_new=st.integers(0, 3),
    n_q=st.integers(1, 3),
    group=st.sampled_from([(2, 2), (4, 2), (3, 1)]),
    causal=st.booleans(),
    window=st.sampled_from([None, (0, 0), (1, None), (None, 1), (5, 3)]),
    seed=seeds,
)
def test_property_against_dense(lengths, n_new, n_q, group, causal, window, seed):
    rng = np.random.default_rng(seed)
    H, H_kv = group
    B, E = len(lengths), 4
    k_cache, v_cache, lens = _caches(rng, B, H_kv, 45, E, 3, lengths)
    q = rng.normal(size=(B, H, n_q, E))
    k_new = v_new = None
    if n_new:
        k_new = rng.normal(size=(B, H_kv, n_new, E))
        v_new = rng.normal(size=(B, H_kv, n_new, 3))
    out, lse = nbattn.flash_decode(
        q,
        k_cache,
        v_cache,
        lens,
        k_new,
        v_new,
        causal=causal,
        window=window,
        enable_gqa=H != H_kv,
        return_lse=True,
    )
    ref_out, ref_lse = _reference(q, k_cache, v_cache, lens + n_new, causal=causal, window=window)
    _assert_matches(out, lse, ref_out, ref_lse, np.float64)


# --------------------------------------------------------------------------- errors
def _args(rng, dtype=np.float64):
    k_cache, v_cache, lengths = _caches(rng, 2, 2, 8, 4, 4, [3, 8], dtype)
    q = rng.normal(size=(2, 2, 1, 4)).astype(dtype)
    return q, k_cache, v_cache, lengths


def test_overflow_names_the_batch_row_and_writes_nothing(rng):
    q, k_cache, v_cache, lengths = _args(rng)
    saved = k_cache.copy()
    k_new = rng.normal(size=(2, 2, 1, 4))
    with pytest.raises(ValueError, match="batch row 1"):
        nbattn.flash_decode(q, k_cache, v_cache, lengths, k_new, k_new)
    assert np.array_equal(k_cache, saved)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda a: a.update(k_cache=a["k_cache"].astype(np.float32)), "k_cache has dtype"),
        (lambda a: a.update(v_cache=np.asfortranarray(a["v_cache"])), "v_cache must be C-cont"),
        (lambda a: a["k_cache"].setflags(write=False), "k_cache must be writable"),
        (lambda a: a.update(k_cache=a["k_cache"].tolist()), "k_cache must be a NumPy array"),
        (lambda a: a.update(cache_seqlens=np.array([1, 2, 3])), "cache_seqlens must have 2"),
        (lambda a: a.update(cache_seqlens=np.array([1.0, 2.0])), "cache_seqlens must be an ar"),
        (lambda a: a.update(cache_seqlens=np.array([1, -2])), r"cache_seqlens\[1\] = -2"),
        (lambda a: a.update(k_new=np.zeros((2, 2, 1, 4))), "give both k_new and v_new"),
        (lambda a: a.update(q=np.zeros((2, 3, 1, 4))), "enable_gqa"),
        (lambda a: a.update(q=np.zeros((2, 3, 1, 4)), enable_gqa=True), "must divide"),
        (lambda a: a.update(q=np.zeros((2, 2, 1, 5))), "k_cache must have shape"),
        (lambda a: a.update(window=(-1, 0)), "window left"),
        (lambda a: a.update(window=3), "window must be"),
        (lambda a: a.update(softcap=0.0), "softcap"),
        (lambda a: a.update(causal="yes"), "causal"),
        (lambda a: a.update(q=np.full((2, 2, 1, 4), np.nan)), "q contains NaN"),
        (
            lambda a: a.update(k_new=np.zeros((2, 2, 1, 3)), v_new=np.zeros((2, 2, 1, 4))),
            "k_new must have shape",
        ),
    ],
)
def test_bad_input_names_the_argument(rng, change, match):
    q, k_cache, v_cache, lengths = _args(rng)
    kwargs = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=np.array([3, 5]))
    change(kwargs)
    with pytest.raises(ValueError, match=match):
        nbattn.flash_decode(**kwargs)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_non_finite_cache_contents_are_refused_naming_row_head_and_position(rng, dtype):
    """Any NaN or inf among the live rows (of either cache, any row, head, position and
    feature) is refused before anything is written; one beyond the live rows is not read."""
    bad_values = [np.nan, np.inf, -np.inf]
    for trial in range(40):
        B, H_kv, group = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
        S_max = int(rng.integers(2, 40))
        lengths = rng.integers(1, S_max, size=B)
        k_cache, v_cache, lengths = _caches(rng, B, H_kv, S_max, 3, 2, lengths, dtype)
        q = rng.normal(size=(B, H_kv * group, 1, 3)).astype(dtype)
        k_new = rng.normal(size=(B, H_kv, 1, 3)).astype(dtype)
        name = ("k_cache", "v_cache")[trial % 2]
        cache = k_cache if name == "k_cache" else v_cache
        b, h = int(rng.integers(B)), int(rng.integers(H_kv))
        j, c = int(rng.integers(lengths[b])), int(rng.integers(cache.shape[3]))
        cache[b, h, j, c] = bad_values[trial % 3]
        saved = (k_cache.copy(), v_cache.copy())
        match = rf"{name} holds NaN or inf in batch row {b}, head {h}, position {j}\b"
        with pytest.raises(ValueError, match=match):
            nbattn.flash_decode(
                q, k_cache, v_cache, lengths, k_new, k_new[..., :2], enable_gqa=group > 1
            )
        assert np.array_equal(k_cache, saved[0], equal_nan=True)
        assert np.array_equal(v_cache, saved[1], equal_nan=True)
        # the same entry just past the live rows is never read
        cache[b, h, j, c] = 0.0
        if lengths[b] < S_max - 1:
            cache[b, h, lengths[b] + 1, c] = bad_values[trial % 3]
            out = nbattn.flash_decode(q, k_cache, v_cache, lengths, enable_gqa=group > 1)
            assert np.isfinite(out).all()


@pytest.mark.parametrize("which", ["k_new", "v_new"])
def test_non_finite_new_tokens_are_refused_and_nothing_is_written(rng, which):
    q, k_cache, v_cache, lengths = _args(rng)
    lengths = np.array([3, 5])
    new = {"k_new": rng.normal(size=(2, 2, 2, 4)), "v_new": rng.normal(size=(2, 2, 2, 4))}
    new[which][1, 1, 0, 2] = np.nan
    saved = (k_cache.copy(), v_cache.copy())
    with pytest.raises(ValueError, match=rf"{which} contains NaN or inf.*\(1, 1, 0, 2\)"):
        nbattn.flash_decode(q, k_cache, v_cache, lengths, **new)
    assert np.array_equal(k_cache, saved[0]) and np.array_equal(v_cache, saved[1])


def test_kv_cache_refuses_a_non_finite_entry_and_keeps_its_lengths(rng):
    cache = nbattn.KVCache(2, 2, 4, capacity=8)
    cache.append(rng.normal(size=(2, 2, 3, 4)), rng.normal(size=(2, 2, 3, 4)))
    cache.v[1, 0, 2, 3] = np.inf  # e.g. a buffer written by hand
    with pytest.raises(ValueError, match="v_cache holds NaN or inf in batch row 1, head 0"):
        cache.attend(
            rng.normal(size=(2, 2, 1, 4)),
            rng.normal(size=(2, 2, 1, 4)),
            rng.normal(size=(2, 2, 1, 4)),
        )
    assert cache.lengths.tolist() == [3, 3]


def test_cuda_without_gpu_is_a_clear_error(rng):
    q, k_cache, v_cache, lengths = _args(rng)
    if nbattn.dispatch.device.cuda_available():
        pytest.skip("a GPU (or the simulator) is present")
    with pytest.raises(ValueError, match="cuda"):
        nbattn.flash_decode(q, k_cache, v_cache, lengths, device="cuda")


# --------------------------------------------------------------------------- KVCache
def test_kv_cache_grows_and_attends_like_flash_decode(rng):
    cache = nbattn.KVCache(2, 1, 4, capacity=2)
    k_all = rng.normal(size=(2, 1, 7, 4))
    v_all = rng.normal(size=(2, 1, 7, 4))
    for t in range(7):
        q = rng.normal(size=(2, 3, 1, 4))
        out, lse = cache.attend(q, k_all[:, :, t : t + 1], v_all[:, :, t : t + 1], return_lse=True)
        ref_out, ref_lse = _reference(q, k_all, v_all, [t + 1, t + 1], causal=True)
        _assert_matches(out, lse, ref_out, ref_lse, np.float64)
    assert cache.capacity >= 7 and cache.lengths.tolist() == [7, 7]
    np.testing.assert_array_equal(cache.k[:, :, :7], k_all)


def test_kv_cache_full_without_growth_names_the_row(rng):
    cache = nbattn.KVCache(2, 1, 4, capacity=3, grow=False)
    cache.append(rng.normal(size=(2, 1, 2, 4)), rng.normal(size=(2, 1, 2, 4)))
    cache.reset(rows=[0])
    assert cache.lengths.tolist() == [0, 2]
    with pytest.raises(ValueError, match="batch row 1 holds 2 of 3"):
        cache.append(rng.normal(size=(2, 1, 2, 4)), rng.normal(size=(2, 1, 2, 4)))
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]
    with pytest.raises(ValueError, match="rows must index"):
        cache.reset(rows=[5])


def test_kv_cache_float32_and_reset_rows_start_over(rng):
    cache = nbattn.KVCache(2, 2, 4, capacity=8, dtype="float32")
    k1, v1 = rng.normal(size=(2, 2, 3, 4)), rng.normal(size=(2, 2, 3, 4))
    cache.append(k1, v1)
    cache.reset(rows=np.array([True, False]))
    q = rng.normal(size=(2, 2, 1, 4)).astype(np.float32)
    k2, v2 = rng.normal(size=(2, 2, 1, 4)), rng.normal(size=(2, 2, 1, 4))
    out = cache.attend(q, k2, v2)
    assert out.dtype == np.float32
    ref0, _ = naive.attention_bottom_right(q[0], k2[0], v2[0], causal=True)
    keys1 = np.concatenate([k1[1], k2[1]], axis=1)
    vals1 = np.concatenate([v1[1], v2[1]], axis=1)
    ref1, _ = naive.attention_bottom_right(q[1], keys1, vals1, causal=True)
    np.testing.assert_allclose(out[0], ref0, atol=2e-5)
    np.testing.assert_allclose(out[1], ref1, atol=2e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_live_magnitudes_equal_numpy_on_strided_caches_of_any_magnitude(rng, dtype):
    """The cache check's bit maximum read as a float is max |v| over the live rows, and
    it reaches the bits of inf exactly where a live entry is NaN or inf, whatever the
    magnitudes (subnormals, -0, the largest finite) and strides (a (B, S, H, E) buffer
    seen as (B, H, S, E), the layout of many model caches)."""
    from nbattn.kernels.decode import live_magnitudes

    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, info.smallest_subnormal, -info.max, info.max, 1.0], dtype)
    bits = np.dtype(f"u{np.dtype(dtype).itemsize}")
    inf_bits = np.array(np.inf, dtype).view(bits)
    for trial in range(60):
        B, H, S, E = (int(n) for n in rng.integers(1, 5, size=4))
        lengths = rng.integers(0, S + 1, size=B).astype(np.int64)
        caches = []
        for _ in range(2):
            buffer = (rng.normal(size=(B, S, H, E)) * 10.0 ** rng.integers(-30, 30)).astype(dtype)
            picks = rng.random(buffer.shape) < 0.2
            buffer[picks] = rng.choice(special, size=int(picks.sum()))
            caches.append(buffer.transpose(0, 2, 1, 3))
        k, v = caches
        if trial % 3 == 0:  # a non-finite entry somewhere, live or not
            target = (k, v)[trial % 2]
            target[tuple(int(rng.integers(n)) for n in target.shape)] = (np.nan, np.inf)[trial % 2]
        k_top, v_top = live_magnitudes(k.view(bits), v.view(bits), lengths)
        for b in range(B):
            for h in range(H):
                live_k, live_v = k[b, h, : lengths[b]], v[b, h, : lengths[b]]
                finite = np.isfinite(live_k).all() and np.isfinite(live_v).all()
                assert ((k_top[b, h] < inf_bits) and (v_top[b, h] < inf_bits)) == finite
                if finite:
                    expected = np.abs(live_v).max(initial=0.0)
                    assert v_top[b, h].view(dtype) == expected
