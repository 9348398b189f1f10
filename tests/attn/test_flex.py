"""Programmable attention: score_mod, mask_mod and block masks in the flash kernels.

Against the dense formulation of ``tests/naive.py``, PyTorch's FlexAttention
(eager) and torch autograd when torch is installed, and finite differences.
Every case runs the same two module-level functions (``score_fn``, ``mask_fn`` of
``tests/flex_cases.py``, shared with other files) with different ``mod_args``, so the
suite compiles one specialisation per dtype (each new function is a new compile of the
kernels).
"""

from __future__ import annotations

import functools
import types
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nbattn
from tests import naive
from tests.flex_cases import (
    CAP,
    DOC,
    LEFT,
    RIGHT,
    SLOPES,
    TABLE,
    WIDE,
    make_args,
    mask_fn,
    score_fn,
    score_grad_fn,
    with_args,
)

try:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask as torch_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

B, H, L, S, E = 2, 2, 37, 45, 8


def _args(cap=0.0, alibi=False, table=False, docs=None, prefix=0, left=WIDE, right=WIDE, n=L):
    """mod_args of the shared functions: a softcap, ALiBi slopes, a relative-position bias
    table, ``docs`` random documents, a prefix and a window."""
    rng = np.random.default_rng(7)
    n_pos = max(n, S)
    slopes = 2.0 ** -(np.arange(H) + 1.0) if alibi else None
    bias = rng.standard_normal((H, 2 * n_pos + 1)) if table else None
    doc = np.zeros((B, n_pos), dtype=np.int64)
    if docs is not None:
        for b in range(B):
            doc[b] = np.searchsorted(
                np.sort(rng.choice(n_pos, docs - 1, replace=False)), np.arange(n_pos), "right"
            )
    return make_args(
        B, H, n_pos, cap=cap, slopes=slopes, table=bias, doc=doc, prefix=prefix, left=left,
        right=right,
    )  # fmt: skip


CASES = {
    "softcap": _args(cap=1.5),
    "alibi": _args(alibi=True),
    "bias_table": _args(table=True),
    "causal": _args(right=0),
    "sliding_window": _args(left=6, right=0),
    "documents": _args(docs=4),
    "prefix_lm": _args(prefix=11, right=0),
    "combination": _args(cap=1.5, table=True, docs=3, right=0),
}


def _qkv(dtype, n=L, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, n, E)) * 2.0
    k = rng.standard_normal((B, H, S, E))
    v = rng.standard_normal((B, H, S, E))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _flex(q, k, v, args, **kw):
    return nbattn.flash_attention(
        q, k, v, score_mod=score_fn, mask_mod=mask_fn, mod_args=args, return_lse=True, **kw
    )


def _torch_mods(args):
    cap, left, right = float(args[CAP]), args[LEFT], args[RIGHT]
    slopes, table, doc = (torch.from_numpy(args[i]) for i in (SLOPES, TABLE, DOC))
    rows, centre = table.shape[0], table.shape[1] // 2

    def sm(score, b, h, q_idx, kv_idx):
        s = cap * torch.tanh(score / cap) if cap > 0 else score
        return s + slopes[h] * (kv_idx - q_idx) + table[h % rows, kv_idx - q_idx + centre]

    def mm(b, h, q_idx, kv_idx):
        same = doc[b, 0, q_idx] == doc[b, 1, kv_idx]
        inside = (kv_idx >= q_idx - left) & (kv_idx <= q_idx + right)
        return same & (inside | (doc[b, 2, kv_idx] != 0))

    return sm, mm


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_the_dense_formulation(case):
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, CASES[case])
    ref, ref_lse = naive.flex_attention(q, k, v, score_fn, mask_fn, mod_args=CASES[case])
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


@needs_torch
@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_forward_matches_torch_flex_attention(case, dtype, tol):
    q, k, v = _qkv(dtype)
    out, lse = _flex(q, k, v, CASES[case])
    sm, mm = _torch_mods(CASES[case])
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    block_mask = torch_block_mask(mm, B, H, L, S, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # return_lse's deprecation in newer torch
        ref, ref_lse = torch_flex(tq, tk, tv, score_mod=sm, block_mask=block_mask, return_lse=True)
    np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=tol)
    np.testing.assert_allclose(lse, ref_lse.numpy(), rtol=0, atol=tol * 10)


def _torch_dense_grads(q, k, v, g, args):
    """dq, dk, dv by torch autograd through the dense formulation."""
    sm, mm = _torch_mods(args)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    i = torch.arange(q.shape[2])[None, None, :, None]
    j = torch.arange(S)[None, None, None, :]
    s = sm(tq @ tk.transpose(-1, -2) / np.sqrt(E), b, h, i, j)
    s = s.masked_fill(~mm(b, h, i, j).expand(s.shape), -torch.inf)
    out = torch.nan_to_num(torch.softmax(s, -1)) @ tv
    out.backward(torch.from_numpy(g))
    return tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


@needs_torch
@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_matches_torch_autograd(case):
    q, k, v = _qkv(np.float64)
    args = CASES[case]
    out, lse = _flex(q, k, v, args)
    g = np.random.default_rng(3).standard_normal(out.shape)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, score_mod=score_fn, mask_mod=mask_fn, mod_args=args
    )
    for grad, ref in zip(grads, _torch_dense_grads(q, k, v, g, args)):
        np.testing.assert_allclose(grad, ref, rtol=0, atol=1e-10)


@pytest.mark.usefixtures("small_flash_tiles")
def test_backward_matches_finite_differences():
    """<grad, d> against (f(x + e d) - f(x - e d)) / 2e for f = <out, g>, on q, k and v."""
    args = CASES["combination"]
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, args)
    rng = np.random.default_rng(5)
    g = rng.standard_normal(out.shape)
    grads = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, score_mod=score_fn, mask_mod=mask_fn, mod_args=args
    )
    eps = 1e-5
    for n, grad in enumerate(grads):
        d = rng.standard_normal(grad.shape)
        plus, minus = [list((q, k, v)) for _ in range(2)]
        plus[n] = plus[n] + eps * d
        minus[n] = minus[n] - eps * d
        f_plus = np.sum(_flex(*plus, args)[0] * g)
        f_minus = np.sum(_flex(*minus, args)[0] * g)
        np.testing.assert_allclose(np.sum(grad * d), (f_plus - f_minus) / (2 * eps), rtol=1e-7)


@pytest.mark.usefixtures("small_flash_tiles")
def test_score_mod_grad_replaces_the_complex_step():
    args = CASES["combination"]
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, args)
    g = np.random.default_rng(3).standard_normal(out.shape)
    kw = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    by_step = nbattn.flash_attention_backward(q, k, v, out, lse, g, **kw)
    given_ = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, score_mod_grad=score_grad_fn, **kw
    )
    for a, b in zip(by_step, given_):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.usefixtures("small_flash_tiles")
@pytest.mark.parametrize("case", ["documents", "combination", "sliding_window"])
def test_block_mask_is_bit_identical_to_the_per_element_mask(case):
    args = CASES[case]
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, args)
    block_mask = nbattn.create_block_mask(mask_fn, B, H, L, S, mod_args=args)
    assert block_mask.sparsity(8, 16) > 0.1
    out_b, lse_b = nbattn.flash_attention(
        q, k, v, score_mod=score_fn, block_mask=block_mask, mod_args=args, return_lse=True
    )
    np.testing.assert_array_equal(out_b, out)
    np.testing.assert_array_equal(lse_b, lse)
    g = np.random.default_rng(3).standard_normal(out.shape)
    kw = dict(score_mod=score_fn, mod_args=args)
    dense = nbattn.flash_attention_backward(q, k, v, out, lse, g, mask_mod=mask_fn, **kw)
    blocked = nbattn.flash_attention_backward(q, k, v, out, lse, g, block_mask=block_mask, **kw)
    for a, b in zip(dense, blocked):
        np.testing.assert_array_equal(a, b)


def test_block_mask_tiles_are_square(monkeypatch):
    """Under a block mask the forward's query tiles are no taller than its key tiles: with
    long-sequence tiles of 32 x 16, documents of 16 keys fill whole 16 x 16 tiles (none
    partial), and the result is the dense formulation's."""
    from nbattn import config

    sizes = dict(FLASH_LONG_KEYS=32, FLASH_LONG_FWD_BLOCK_Q=32, FLASH_LONG_FWD_BLOCK_K=16)
    for name, value in {"FLASH_SERIAL_WORK": 0, **sizes}.items():
        monkeypatch.setattr(config, name, value)
    n = 64
    args = _args(n=n)
    args[DOC][:, :2] = np.arange(args[DOC].shape[-1]) // 16
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((B, H, n, E)) for _ in range(3))
    block_mask = nbattn.create_block_mask(mask_fn, B, H, n, n, mod_args=args)
    table = block_mask.table(16, 16)
    assert list(block_mask._tables) == [(16, 16)]
    assert set(np.unique(table)) == {0, 2}
    out, lse = nbattn.flash_attention(
        q, k, v, score_mod=score_fn, block_mask=block_mask, mod_args=args, return_lse=True
    )
    ref, ref_lse = naive.flex_attention(q, k, v, score_fn, mask_fn, mod_args=args)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


@pytest.mark.usefixtures("small_flash_tiles")
def test_rows_without_a_key_give_zeros_and_minus_inf():
    """Queries i >= S, in documents of their own, see no key (the flash convention)."""
    n = S + 9
    args = _args(docs=3, n=n)
    args[DOC][:, :2, S:] = 99
    q, _, _ = _qkv(np.float64, n=n)
    _, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, args)
    ref, ref_lse = naive.flex_attention(q, k, v, score_fn, mask_fn, mod_args=args)
    assert np.all(out[:, :, S:] == 0.0) and np.all(lse[:, :, S:] == -np.inf)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(ref_lse))
    g = np.ones_like(out)
    dq, _, _ = nbattn.flash_attention_backward(
        q, k, v, out, lse, g, score_mod=score_fn, mask_mod=mask_fn, mod_args=args
    )
    assert np.all(dq[:, :, S:] == 0.0)


@pytest.mark.usefixtures("small_flash_tiles")
def test_nan_and_inf_scores_propagate_and_overflow_is_refused():
    """NaN or +inf from score_mod on an admissible entry makes the row NaN (torch's
    answer), on a masked entry nothing; -inf masks; a finite score whose base-2 form
    overflows is a ValueError (not a silently empty row). Through the bias table of
    the suite's own functions (no new compile)."""
    q, k, v = _qkv(np.float64)
    table = CASES["causal"][TABLE]
    centre = table.shape[1] // 2
    clean, clean_lse = _flex(q, k, v, CASES["causal"])
    for odd in (np.nan, np.inf, -np.inf):
        masked = table.copy()
        masked[:, centre + 1 :] = odd  # keys after the query: masked by the causal mask
        out, lse = _flex(q, k, v, with_args(CASES["causal"], table=masked))
        np.testing.assert_array_equal(out, clean)
        np.testing.assert_array_equal(lse, clean_lse)
    for odd in (np.nan, np.inf):
        admitted = table.copy()
        admitted[:, centre - 1] = odd  # key i - 1: admissible for every row but the first
        out, lse = _flex(q, k, v, with_args(CASES["causal"], table=admitted))
        assert np.all(np.isnan(out[:, :, 1:])) and np.all(np.isnan(lse[:, :, 1:]))
        np.testing.assert_array_equal(out[:, :, 0], clean[:, :, 0])
    admitted = table.copy()
    admitted[:, centre - 1] = -np.inf  # as if masked
    out, lse = _flex(q, k, v, with_args(CASES["causal"], table=admitted))
    ref, ref_lse = naive.flex_attention(
        q, k, v, score_fn, mask_fn, mod_args=with_args(CASES["causal"], table=admitted)
    )
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    huge = table.copy()
    huge[:, centre - 1] = 1.5e308
    with pytest.raises(ValueError, match=r"score_mod returned a score of magnitude 1\.5e\+308"):
        _flex(q, k, v, with_args(CASES["causal"], table=huge))


@pytest.mark.usefixtures("small_flash_tiles")
def test_two_calls_are_bit_identical():
    args = CASES["combination"]
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, args)
    again, lse_again = _flex(q, k, v, args)
    np.testing.assert_array_equal(out, again)
    np.testing.assert_array_equal(lse, lse_again)
    g = np.ones_like(out)
    kw = dict(score_mod=score_fn, mask_mod=mask_fn, mod_args=args)
    first = nbattn.flash_attention_backward(q, k, v, out, lse, g, **kw)
    second = nbattn.flash_attention_backward(q, k, v, out, lse, g, **kw)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("small_flash_tiles")
@settings(max_examples=8)
@given(
    n_q=st.integers(1, 40),
    n_k=st.integers(1, 40),
    gqa=st.booleans(),
    left=st.integers(0, 50),
    right=st.integers(0, 50),
    cap=st.sampled_from([0.0, 2.0]),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_match_the_dense_formulation(n_q, n_k, gqa, left, right, cap, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, n_q, E))
    n_kv_heads = 1 if gqa else H
    k = rng.standard_normal((B, n_kv_heads, n_k, E))
    v = rng.standard_normal((B, n_kv_heads, n_k, 3))
    n_pos = max(n_q, n_k)
    slopes = rng.standard_normal(H) * 0.1
    table = rng.standard_normal((H, 2 * n_pos + 1))
    doc = rng.integers(0, 2, (B, n_pos))
    args = make_args(
        B, H, n_pos, cap=cap, slopes=slopes, table=table, doc=doc,
        prefix=rng.integers(0, 5, B), left=left, right=right,
    )  # fmt: skip
    out, lse = nbattn.flash_attention(
        q,
        k,
        v,
        score_mod=score_fn,
        mask_mod=mask_fn,
        mod_args=args,
        return_lse=True,
        enable_gqa=gqa,
    )
    kr, vr = (np.repeat(a, H // n_kv_heads, axis=1) for a in (k, v))
    ref, ref_lse = naive.flex_attention(q, kr, vr, score_fn, mask_fn, mod_args=args)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)


def test_flex_tanh_is_accurate_and_differentiable_by_complex_step():
    """Compiled: within 2 units in the last place of 1 of tanh (the softcap path's promise),
    float32 and float64; on a complex argument exact, so the complex step gives
    1 - tanh**2 = cosh**-2. From Python: np.tanh."""
    from numba import njit

    flex_tanh = nbattn.flex_tanh

    @njit
    def apply(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = flex_tanh(x[i])
        return out

    @njit
    def derivative(x):
        return flex_tanh(complex(x, 2.0**-64)).imag * 2.0**64

    x = np.concatenate([np.linspace(-25.0, 25.0, 20001), [0.0, -0.0, 1e-300, 400.0, -400.0]])
    for dtype in (np.float64, np.float32):
        xd = x.astype(dtype)
        got = apply(xd)
        assert got.dtype == dtype
        ref = np.tanh(xd.astype(np.float64))
        assert np.max(np.abs(got - ref)) <= 2 * np.finfo(dtype).eps
    for point in (-3.0, -0.4, 0.0, 0.7, 5.0):
        assert derivative(point) == pytest.approx(np.cosh(point) ** -2, rel=1e-14)
    np.testing.assert_array_equal(flex_tanh(x), np.tanh(x))


# ------------------------------------------------------------------ errors


def _bad_arity(score, b, h):
    return score


def _returns_bool(score, b, h, q_idx, kv_idx, *rest):
    return score > 0


def _not_analytic(score, b, h, q_idx, kv_idx, *rest):
    return abs(score)


def _leaky(score, b, h, q_idx, kv_idx):
    return score - 0.5 * abs(score)


_TABLE = np.zeros(3)


def _reads_a_global_array(score, b, h, q_idx, kv_idx):
    return score + _TABLE[0]


def _keyword_only(score, b, h, q_idx, kv_idx, *, scale=2.0):
    return score * scale


def _keyword_bag(score, b, h, q_idx, kv_idx, **extra):
    return score


def _mask_keyword_only(b, h, q_idx, kv_idx, *, keep=True):
    return keep


def test_keyword_only_parameters_are_refused_by_name():
    """numba calls score functions positionally and compiles neither keyword-only
    parameters nor ``**kwargs``: refused before any compile, naming the parameter."""
    q, k, v = _qkv(np.float64)
    with pytest.raises(ValueError, match=r"score_mod has the keyword-only parameter scale=2\.0"):
        nbattn.flash_attention(q, k, v, score_mod=_keyword_only)
    with pytest.raises(ValueError, match=r"score_mod has the keyword-only parameter \*\*extra"):
        nbattn.flash_attention(q, k, v, score_mod=_keyword_bag)
    with pytest.raises(ValueError, match="mask_mod has the keyword-only parameter keep"):
        nbattn.flash_attention(q, k, v, mask_mod=_mask_keyword_only)
    with pytest.raises(ValueError, match="mask_mod has the keyword-only parameter keep"):
        nbattn.create_block_mask(_mask_keyword_only, None, None, 8, 8)


def test_errors_name_the_argument():
    q, k, v = _qkv(np.float64)
    args = CASES["causal"]
    with pytest.raises(ValueError, match="score_mod must take"):
        nbattn.flash_attention(q, k, v, score_mod=_bad_arity)
    with pytest.raises(ValueError, match=r"score_mod must take .* \(8 given\)"):
        nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=args[:6] + (1, 2))
    with pytest.raises(ValueError, match="mask_mod must take"):
        nbattn.flash_attention(q, k, v, mask_mod=mask_fn, mod_args=args[:2])
    with pytest.raises(ValueError, match="mod_args must be a tuple"):
        nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=list(args))
    with pytest.raises(ValueError, match=r"mod_args\[0\] must be a NumPy array or a number"):
        nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=("x",) + args[1:])
    with pytest.raises(ValueError, match="score_mod reads the array '_TABLE'"):
        nbattn.flash_attention(q, k, v, score_mod=_reads_a_global_array)
    with pytest.raises(ValueError, match="softcap cannot be combined"):
        nbattn.flash_attention(q, k, v, score_mod=score_fn, mod_args=args, softcap=2.0)
    with pytest.raises(ValueError, match="mod_args are the trailing arguments"):
        nbattn.flash_attention(q, k, v, mod_args=args)
    with pytest.raises(TypeError, match="score_mod must be a plain function.*mod_args"):
        nbattn.flash_attention(q, k, v, score_mod=functools.partial(_bad_arity, h=0))
    with pytest.raises(ValueError, match="block_mask must come from"):
        nbattn.flash_attention(q, k, v, block_mask=np.ones((L, S), bool))


def test_a_score_mod_of_the_wrong_type_is_refused():
    q, k, v = _qkv(np.float64)
    with pytest.raises(ValueError, match="score_mod must return a real number"):
        nbattn.flash_attention(q, k, v, score_mod=_returns_bool)


def test_a_score_mod_without_complex_step_needs_its_derivative():
    """Refused before the backward kernel compiles (by its small check_backward)."""
    q, k, v = _qkv(np.float64)
    out, lse = _flex(q, k, v, CASES["causal"])
    with pytest.raises(ValueError, match="not differentiable by complex step.*score_mod_grad"):
        nbattn.flash_attention_backward(q, k, v, out, lse, out, score_mod=_not_analytic)
    # abs inside an expression that stays complex: the complex step is 1, not 1.5, at
    # s < 0 (found by the check's finite difference, before the kernel compiles)
    with pytest.raises(
        ValueError, match=r"complex step gives 1, a finite difference 1\.5.*score_mod_grad"
    ):
        nbattn.flash_attention_backward(q, k, v, out, lse, out, score_mod=_leaky)


def test_generated_modules_go_to_the_configured_folder(tmp_path, monkeypatch):
    """$NBATTN_FLEX_DIR, else $XDG_CACHE_HOME/nbattn/flex."""
    from nbattn.kernels import flex_build

    monkeypatch.setattr(flex_build, "_DIR", [])
    monkeypatch.setenv("NBATTN_FLEX_DIR", str(tmp_path / "flex"))
    assert flex_build._cache_dir() == tmp_path / "flex"
    monkeypatch.setattr(flex_build, "_DIR", [])
    monkeypatch.delenv("NBATTN_FLEX_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert flex_build._cache_dir() == tmp_path / "xdg" / "nbattn" / "flex"
    assert (tmp_path / "xdg" / "nbattn" / "flex").is_dir()


_HELPERS = types.ModuleType("_flex_test_helpers")
_HELPERS.SCALE = 1.0
_HELPERS.TABLE = np.zeros(3)
_HELPERS.inner = types.ModuleType("_flex_test_helpers.inner")
_HELPERS.inner.SHIFT = 0.5


def _reads_module_values(score, b, h, q_idx, kv_idx):
    return score * _HELPERS.SCALE + _HELPERS.inner.SHIFT


def _reads_a_module_array(score, b, h, q_idx, kv_idx):
    return score + _HELPERS.TABLE[kv_idx]


def test_the_key_holds_values_read_through_modules(monkeypatch):
    """numba freezes ``helpers.SCALE`` as it does a plain global: a change is a new key
    (no kernel compiles here: only the fingerprints)."""
    from nbattn.kernels import flex_build

    first = flex_build.fingerprint(_reads_module_values, "score_mod")
    monkeypatch.setattr(_HELPERS, "SCALE", 2.0)
    second = flex_build.fingerprint(_reads_module_values, "score_mod")
    monkeypatch.setattr(_HELPERS.inner, "SHIFT", 1.5)
    third = flex_build.fingerprint(_reads_module_values, "score_mod")
    assert len({first, second, third}) == 3
    with pytest.raises(ValueError, match=r"reads the array '_HELPERS.TABLE'.*mod_args"):
        flex_build.fingerprint(_reads_a_module_array, "score_mod")


def test_the_key_holds_the_function_module():
    """numba's cached kernel finds the user's function by module name: the same code in a
    module loaded under another name (a script run as ``__main__``, then imported) must
    not share the key, or the second process fails to load it (no kernel compiles here)."""
    import types as pytypes

    from nbattn.kernels import flex_build

    source = "def score(score, b, h, q_idx, kv_idx):\n    return score * 0.5\n"
    prints = set()
    for name in ("__main__", "tour", "alias_tour"):
        module = pytypes.ModuleType(name)
        exec(compile(source, "tour.py", "exec"), module.__dict__)
        prints.add(flex_build.fingerprint(module.score, "score_mod"))
    assert len(prints) == 3


def test_a_jitted_score_mod_is_compiled_anew():
    """The user's dispatcher may hold code frozen with older globals: never reused."""
    from numba import njit

    from nbattn.kernels import flex_build

    jitted = njit(_reads_module_values)
    fresh = flex_build._jitted(jitted)
    assert fresh is not jitted and fresh.py_func is jitted.py_func


def test_a_damaged_generated_module_is_written_anew(tmp_path, monkeypatch):
    """A truncated file is rewritten before it is imported, a failed import leaves no
    half module in sys.modules, a removed folder is made again (no kernel compiles)."""
    import shutil
    import sys

    from nbattn.kernels import flex_build

    folder = tmp_path / "flex"
    monkeypatch.setattr(flex_build, "_DIR", [folder])
    key = "test_damaged_0"
    name = f"nbattn_flex_{key}"
    path = folder / f"{name}.py"
    folder.mkdir()
    path.write_bytes(flex_build._SOURCE_BYTES[:100])
    monkeypatch.setattr(flex_build, "_SOURCE_BYTES", b"raise RuntimeError('broken')\n")
    with pytest.raises(RuntimeError, match="broken"):
        flex_build._load(key)
    assert name not in sys.modules
    monkeypatch.undo()
    monkeypatch.setattr(flex_build, "_DIR", [folder])
    try:
        module = flex_build._load(key)
        assert path.read_bytes() == flex_build._SOURCE_BYTES and callable(module.flex_forward)
    finally:
        sys.modules.pop(name, None)
    shutil.rmtree(folder)  # the folder removed mid-session
    try:
        flex_build._load("test_damaged_1")
        assert (folder / "nbattn_flex_test_damaged_1.py").is_file()
    finally:
        sys.modules.pop("nbattn_flex_test_damaged_1", None)
