"""Hostile review of score functions' Python floats in float32 calls.

On float32 inputs nbattn compiles a copy of score_mod, score_mod_grad and
score_mod_args_grad whose Python float constants are numpy.float32
(``flex_build.float32_constants``), so that ``30.0 * flex_tanh(score / 30.0)`` computes in
float32 as torch's FlexAttention does. Checked here, as a hostile user and as a torch user
porting FlexAttention code: parity with torch's eager ``flex_attention`` (forward and
gradients), the float32 bits of varlen, decode and the torch adapter, what is and is not
converted (closure cells, globals, defaults, tuples, ``math.pi``, out-of-range
constants), constants as indices, comparisons, branches and soft masks, the backward
(complex step, ``score_mod_grad``, ``score_mod_args_grad``) against float64 references,
the consistency of the forward's and the backward's scores, the on-disk cache across
processes and dtypes, the CUDA simulator, and the user's function left untouched.

A few user functions only (each costs a kernel compile per dtype), reused across cases.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import nbattn
from nbattn.kernels.flex_build import fingerprint, float32_constants
from tests import naive
from tests.attn.test_flex_float32_constants import generate_tanh_softcap, softcap_literal

ROOT = Path(__file__).resolve().parents[2]
F01, F13, F3 = np.float32(0.1), np.float32(1 / 3), np.float32(3.0)
CAP = 30.0


# ---------------------------------------------------------------- the user functions


def poly(score, b, h, q_idx, kv_idx):
    """Constants that float32 cannot hold exactly (0.1, 1/3): float32 and float64
    arithmetic round differently."""
    return (score * 0.1 + 1 / 3) * 3.0


def poly_f32(score, b, h, q_idx, kv_idx):
    return (score * F01 + F13) * F3


def poly_grad(score, b, h, q_idx, kv_idx):
    return 0.1 * 3.0 + 0.0 * score


# soft: the FlexAttention softcap, written with Python floats (converted in float32);
# make_softcap: attention-gym's ``generate_tanh_softcap``, the cap a closure cell, which
# the copy converts as it does the literal form's constants. The functions of
# test_flex_float32_constants.py, so that the two files share their kernels (a function
# is keyed by its module and name too).
soft = softcap_literal
make_softcap = generate_tanh_softcap
soft_closure = make_softcap(30.0)


def quirky(score, b, h, q_idx, kv_idx, table):
    """Constants as an index (int(kv * 0.5)), in a comparison (t > 0.1: float32(0.1) in
    a float32 call, as torch's), a branch returning a bare constant, a soft mask by
    -1e30 and a subnormal (1e-45: stays float64)."""
    t = table[h, int(kv_idx * 0.5)]
    if kv_idx > q_idx + 2:
        return score - 1e30
    if kv_idx == q_idx + 2:
        return 0.0
    if t > 0.1:
        return score * 0.5 + t + 1e-45 * score
    return score * 3.0 - t


def quirky_args_grad(grad_score, score, b, h, q_idx, kv_idx, table, d_table):
    """d quirky / d table[h, int(kv * 0.5)] times grad_score, added in, with quirky's
    constants (its index, its float32 comparison): +1 where the score adds t, -1 where it
    subtracts it, 0 on the soft-masked keys and the bare constant. (Reuses quirky's
    kernels: only the gradient's own module compiles.)"""
    j = int(kv_idx * 0.5)
    if kv_idx < q_idx + 2:
        if table[h, j] > 0.1:
            d_table[h, j] += grad_score * 1.0
        else:
            d_table[h, j] -= grad_score * 1.0


# ---------------------------------------------------------------- helpers


def qkv(dtype, seed, shape=(1, 2, 24, 8), scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal(shape) * scale).astype(dtype) for _ in range(3))


def weak_eval(fn, s, *args):
    """``fn``'s float32 copy evaluated per element in Python on float32 scores and int64
    indices (NumPy's scalar rules: those numba types), b = 0."""
    copy = float32_constants(fn)
    out = np.empty(s.shape, dtype=np.float64)
    for idx in np.ndindex(*s.shape):
        _, h, i, j = idx
        out[idx] = copy(
            np.float32(s[idx]), np.int64(0), np.int64(h), np.int64(i), np.int64(j), *args
        )
    return out


def torch_flex(q, k, v, score_mod, grad=None):
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import flex_attention

    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_(grad is not None) for a in (q, k, v))
    out = flex_attention(tq, tk, tv, score_mod=score_mod)
    if grad is None:
        return out.detach().numpy()
    out.backward(torch.from_numpy(grad))
    return out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()


def torch_soft(score, b, h, q_idx, kv_idx):
    import torch

    return 30.0 * torch.tanh(score / 30.0)


def torch_poly(score, b, h, q_idx, kv_idx):
    return (score * 0.1 + 1 / 3) * 3.0


# ---------------------------------------------------------------- torch parity


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_softcap_matches_torch_eager_and_the_float64_closure_no_better(seed):
    """Scores near the cap (q, k times 4: raw scores ~ +-30), where float32 and float64
    softcaps differ by a float32 ulp of the score."""
    q, k, v = qkv(np.float32, seed, scale=4.0)
    ref = torch_flex(q, k, v, torch_soft)
    out = nbattn.flash_attention(q, k, v, score_mod=soft)
    out64 = nbattn.flash_attention(q, k, v, score_mod=soft_closure)
    exact = naive.flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: 30.0 * np.tanh(s / 30.0))[
        0
    ]
    # float32: each a few ulps of |out| <= max |v| from the exact value, and from torch
    bound = 64 * np.finfo(np.float32).eps * np.abs(v).max()
    assert np.abs(out - ref).max() <= bound
    assert np.abs(out - exact).max() <= bound
    assert np.abs(out64 - exact).max() <= bound
    assert out.dtype == np.float32


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float32_poly_scores_are_torchs_bits_but_outputs_only_within_rounding(seed):
    """(s 0.1 + 1/3) 3 on float32 scores: the copy's arithmetic gives torch's score bits
    exactly (float64 arithmetic does not). At the output the score rounding is lost in
    the float32 softmax and matmul rounding: nbattn's float32 output is not nearer
    torch's than the exact output rounded (measured: mean |diff| 3.5e-7 vs 2.5e-7 at
    seed 0), so only the bound is asserted there."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    s = (rng.standard_normal((1, 2, 16, 16)) * 5).astype(np.float32)
    want = torch_poly(torch.from_numpy(s), 0, 0, 0, 0).numpy()
    np.testing.assert_array_equal(weak_eval(poly, s).astype(np.float32), want)
    assert not np.array_equal(poly(s.astype(np.float64), 0, 0, 0, 0).astype(np.float32), want)
    q, k, v = qkv(np.float32, seed, scale=3.0)
    ref = torch_flex(q, k, v, torch_poly).astype(np.float64)
    out = nbattn.flash_attention(q, k, v, score_mod=poly).astype(np.float64)
    assert np.abs(out - ref).max() <= 64 * np.finfo(np.float32).eps * np.abs(v).max()


@pytest.mark.parametrize("seed", [3, 4])
def test_float32_softcap_gradients_against_float64(seed):
    """torch's FlexAttention has no CPU backward (NotImplementedError in eager mode): the
    float32 gradients of soft against the float64 softmax backward."""
    q, k, v = qkv(np.float32, seed, scale=3.0)
    g = np.random.default_rng(seed + 10).standard_normal(q.shape).astype(np.float32)
    ref = naive.flex_attention_grads(
        q, k, v, g, score_mod=lambda s, b, h, i, j: 30.0 * np.tanh(s / 30.0),
        score_grad=lambda s, b, h, i, j: 1.0 - np.tanh(s / 30.0) ** 2,
    )  # fmt: skip
    out, lse = nbattn.flash_attention(q, k, v, score_mod=soft, return_lse=True)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, score_mod=soft)
    for got, want in zip((out, lse, *grads), ref):
        assert got.dtype == (np.float64 if got is lse else np.float32)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


# ---------------------------------------------------------------- bits of each entry point


@pytest.mark.parametrize("seed", [0, 5])
def test_varlen_and_decode_give_the_float32_constant_bits(seed):
    rng = np.random.default_rng(seed)
    lens = np.array([5, 0, 17, 9])
    cu = np.concatenate([[0], np.cumsum(lens)])
    q, k, v = (rng.standard_normal((2, cu[-1], 8)).astype(np.float32) for _ in range(3))
    a = nbattn.flash_attention_varlen(q, k, v, cu, cu, causal=True, return_lse=True, score_mod=poly)
    b = nbattn.flash_attention_varlen(
        q, k, v, cu, cu, causal=True, return_lse=True, score_mod=poly_f32
    )
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    kc, vc = (rng.standard_normal((3, 2, 20, 8)).astype(np.float32) for _ in range(2))
    qd = rng.standard_normal((3, 2, 1, 8)).astype(np.float32)
    lengths = np.array([0, 7, 20])
    a = nbattn.flash_decode(qd, kc, vc, lengths, return_lse=True, score_mod=poly)
    b = nbattn.flash_decode(qd, kc, vc, lengths, return_lse=True, score_mod=poly_f32)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_torch_adapter_matches_torch_eager_in_value_and_float64_in_gradient():
    torch = pytest.importorskip("torch")
    import nbattn.torch as nt

    q, k, v = qkv(np.float32, 7, scale=3.0)
    g = np.random.default_rng(8).standard_normal(q.shape).astype(np.float32)
    ref = (torch_flex(q, k, v, torch_soft),) + naive.flex_attention_grads(
        q, k, v, g, score_mod=lambda s, b, h, i, j: 30.0 * np.tanh(s / 30.0),
        score_grad=lambda s, b, h, i, j: 1.0 - np.tanh(s / 30.0) ** 2,
    )[2:]  # fmt: skip
    tq, tk, tv = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (q, k, v))
    out = nt.flash_attention(tq, tk, tv, score_mod=soft)
    out.backward(torch.from_numpy(g))
    assert out.dtype == torch.float32
    got = (out.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())
    for x, want in zip(got, ref):
        np.testing.assert_allclose(x, want, rtol=0, atol=1e-4 * np.abs(want).max())
    # and exactly the numpy entry point's float32 bits
    direct = nbattn.flash_attention(q, k, v, score_mod=soft)
    np.testing.assert_array_equal(got[0], direct)


# ---------------------------------------------------------------- what is converted


def test_closure_global_default_and_tuple_floats_are_converted_module_attributes_not():
    """The Python floats the function reads become float32: literal constants, a closure
    cell (attention-gym's softcap pattern), a module global, a default, a tuple constant;
    a module's attribute (math.pi, like np.pi) stays float64."""

    def with_default(score, b, h, q_idx, kv_idx, c=30.0):
        return score / c

    def with_global(score, b, h, q_idx, kv_idx):
        return score / CAP

    def with_tuple(score, b, h, q_idx, kv_idx):
        return score * (0.5, 2.0)[h]

    def with_pi(score, b, h, q_idx, kv_idx):
        return score * math.pi

    def with_literal(score, b, h, q_idx, kv_idx):
        return score / 30.0

    import numba
    from numba import types as nt

    def returns(fn):
        jitted = numba.njit(float32_constants(fn))
        jitted(np.float32(7.0), 0, 0, 0, 0)
        return jitted.nopython_signatures[0].return_type

    for fn in (soft_closure, with_default, with_global, with_tuple, with_literal, soft):
        assert returns(fn) == nt.float32, fn.__name__
    assert returns(with_pi) == nt.float64
    # (a keyword-only default: numba cannot call it, "not enough arguments: expected 6")
    assert type(float32_constants(soft_closure)(np.float32(7.0), 0, 0, 0, 0)) is np.float32


@pytest.mark.parametrize("seed", [0, 1])
def test_closure_softcap_on_float32_gives_the_literal_forms_bits(seed):
    """The canonical torch port (a closure over the cap) computes in float32 as the
    literal form does: the same bits (it computed in float64 before)."""
    q, k, v = qkv(np.float32, seed, scale=4.0)
    a = nbattn.flash_attention(q, k, v, score_mod=soft_closure)
    b = nbattn.flash_attention(q, k, v, score_mod=soft)
    np.testing.assert_array_equal(a, b)


def test_constants_in_comparisons_indices_branches_and_soft_masks():
    """quirky against its float32 copy evaluated per element in Python (float64 reference
    softmax on those scores); soft-masked keys get no weight; the backward (complex step)
    against float64 gradients of the same scores."""
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        q, k, v = qkv(np.float32, seed, shape=(1, 2, 12, 8))
        table = rng.standard_normal((2, 6)).astype(np.float32)
        table[:, ::2] = np.float32(0.1)  # t > 0.1 False in float32 (True in float64)
        raw = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / np.sqrt(8)
        s = weak_eval(quirky, raw.astype(np.float32), table)
        p = naive.softmax_rows(s)
        want = p @ v.astype(np.float64)
        out, lse = nbattn.flash_attention(
            q, k, v, score_mod=quirky, mod_args=(table,), return_lse=True
        )
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(v).max())
        np.testing.assert_allclose(lse, naive.logsumexp_rows(s), rtol=1e-5, atol=1e-5)
        # soft-masked keys (kv > q + 2): with the values of those keys changed, same output
        v2 = v.copy()
        v2[:, :, 3:] += 100.0
        out2 = nbattn.flash_attention(q, k, v2, score_mod=quirky, mod_args=(table,))
        np.testing.assert_array_equal(out2[:, :, :1], out[:, :, :1])
        g = rng.standard_normal(q.shape).astype(np.float32)
        dq, dk, dv = nbattn.flash_attention_backward(
            q, k, v, out, lse, g, score_mod=quirky, mod_args=(table,)
        )
        assert all(np.isfinite(d).all() for d in (dq, dk, dv))
        np.testing.assert_allclose(dv, np.swapaxes(p, -1, -2) @ g, rtol=0, atol=1e-4)


def test_a_comparison_with_a_constant_takes_torchs_branch():
    """t = float32(0.1) in the table: torch's ``t > 0.1`` compares in float32 (False);
    float64 0.1 is below float32(0.1) (True). The float32 call takes torch's branch."""
    torch = pytest.importorskip("torch")
    assert not bool(torch.tensor(np.float32(0.1)) > 0.1)
    assert np.float64(np.float32(0.1)) > 0.1
    q, k, v = qkv(np.float32, 4, shape=(1, 2, 12, 8))
    table = np.full((2, 6), np.float32(0.1))
    raw = ((q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / np.sqrt(8)).astype(np.float32)
    weak = naive.softmax_rows(weak_eval(quirky, raw, table)) @ v.astype(np.float64)
    strong = np.empty(raw.shape)
    for idx in np.ndindex(*raw.shape):
        strong[idx] = quirky(float(raw[idx]), 0, idx[1], idx[2], idx[3], table.astype(float))
    strong = naive.softmax_rows(strong) @ v.astype(np.float64)
    out = nbattn.flash_attention(q, k, v, score_mod=quirky, mod_args=(table,))
    assert np.abs(out - weak).max() <= 1e-5 < np.abs(out - strong).max()


# ---------------------------------------------------------------- the backward


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backward_complex_step_and_score_mod_grad_against_float64(seed):
    q, k, v = qkv(np.float32, seed, scale=2.0)
    g = np.random.default_rng(seed + 20).standard_normal(q.shape).astype(np.float32)
    out, lse = nbattn.flash_attention(q, k, v, score_mod=poly, causal=True, return_lse=True)
    ref = naive.flex_attention_grads(q, k, v, g, score_mod=poly, score_grad=poly_grad, causal=True)
    np.testing.assert_allclose(out, ref[0], rtol=0, atol=1e-5)
    for grad in (None, poly_grad):
        got = nbattn.flash_attention_backward(
            q, k, v, out, lse, g, score_mod=poly, score_mod_grad=grad, causal=True
        )
        for x, want in zip(got, ref[2:]):
            assert x.dtype == np.float32
            # float32 rounding of scores ~ |s| eps32 ~ 1e-6, times sums of ~24 terms
            np.testing.assert_allclose(x, want, rtol=0, atol=2e-4 * max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_rows_of_p_sum_to_one_by_either_derivative(dtype):
    """dO = 1 on column 0: dV[j, 0] = sum_i P_ij, so sum_j dV[j, 0] = L when the backward's
    P is the forward's. The complex step evaluates the float32 copy in complex128 (float64
    arithmetic) where the forward computed in float32, score_mod_grad's path in float32:
    both within a few float32 ulps of the largest score (measured: 2.3e-4 and 1.7e-4 of
    L at scores ~1e4, 1.6e-2 and 1.5e-2 at ~1e6), the complex step not worse by more."""
    eps = np.finfo(dtype).eps
    for scale in (1.0, 100.0, 1e4):
        for seed in (0, 1):
            q, k, v = qkv(dtype, seed, scale=np.sqrt(scale))
            out, lse = nbattn.flash_attention(q, k, v, score_mod=poly, return_lse=True)
            g = np.zeros(q.shape, dtype)
            g[..., 0] = 1.0
            devs = []
            for grad in (None, poly_grad):
                dv = nbattn.flash_attention_backward(
                    q, k, v, out, lse, g, score_mod=poly, score_mod_grad=grad
                )[2]
                devs.append(np.abs(dv[..., 0].astype(float).sum(-1) / q.shape[2] - 1).max())
            top = 0.3 * np.abs(q.astype(float) @ np.swapaxes(k, -1, -2)).max() / np.sqrt(8)
            assert max(devs) <= 8 * eps * max(1.0, top), (scale, seed, devs)
            assert devs[0] <= 3 * devs[1] + 16 * eps, (scale, seed, devs)


@pytest.mark.parametrize("scale", [30.0, 3e4])
def test_backward_gradients_finite_at_large_scores(scale):
    """Scores ~ 1e3 and ~ 1e5 (poly of raw scores ~ 1e4 and ~ 1e6... in float32): P never
    above 1, every gradient finite, dV a convex combination of the rows of dO per key."""
    for seed in (0, 1):
        q, k, v = qkv(np.float32, seed, scale=np.sqrt(scale))
        g = np.random.default_rng(seed).standard_normal(q.shape).astype(np.float32)
        out, lse = nbattn.flash_attention(q, k, v, score_mod=poly, return_lse=True)
        assert np.isfinite(out).all() and np.isfinite(lse).all()
        for grad in (None, poly_grad):
            dq, dk, dv = nbattn.flash_attention_backward(
                q, k, v, out, lse, g, score_mod=poly, score_mod_grad=grad
            )
            assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
            # column sums of P are at most L: |dV| <= L max|dO|
            assert np.abs(dv).max() <= q.shape[2] * np.abs(g).max() * (1 + 1e-5)


def test_score_mod_args_grad_with_float_constants():
    """quirky's table learned through quirky_args_grad (float constants in both, as an
    index and in a comparison), against central differences of the float64 reference."""
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        q, k, v = qkv(np.float32, seed, shape=(1, 2, 12, 8), scale=2.0)
        table = rng.standard_normal((2, 6)).astype(np.float32)
        g = rng.standard_normal(q.shape).astype(np.float32)
        kw = dict(score_mod=quirky, mod_args=(table,))
        out, lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
        dq, dk, dv, (dt,) = nbattn.flash_attention_backward(
            q, k, v, out, lse, g, score_mod_args_grad=quirky_args_grad, **kw
        )
        assert dt.dtype == np.float32 and dt.shape == table.shape

        # by a central difference in float64 of each entry (none within the step of 0.1),
        # quirky evaluated per element (it branches: not vectorised)
        raw = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / np.sqrt(8)

        def loss(t, raw=raw, v=v, g=g):
            s = np.empty(raw.shape)
            for idx in np.ndindex(*raw.shape):
                s[idx] = quirky(raw[idx], 0, idx[1], idx[2], idx[3], t)
            return ((naive.softmax_rows(s) @ v.astype(np.float64)) * g).sum()

        assert np.abs(table.astype(float) - 0.1).min() > 1e-3
        steps = np.eye(table.size).reshape((table.size,) + table.shape) * 1e-4
        fd = np.array([(loss(table + e) - loss(table - e)) / 2e-4 for e in steps])
        assert np.abs(fd).max() > 0.1  # gradients of both signs, not all 0
        np.testing.assert_allclose(dt.ravel(), fd, rtol=0, atol=1e-3 * max(1.0, np.abs(fd).max()))


# ---------------------------------------------------------------- caching and the function


def test_float32_then_float64_then_float32_each_own_bits_in_one_process():
    q32, k32, v32 = qkv(np.float32, 9)
    q64, k64, v64 = qkv(np.float64, 9)
    first = nbattn.flash_attention(q32, k32, v32, score_mod=poly)
    b64 = nbattn.flash_attention(q64, k64, v64, score_mod=poly)
    again = nbattn.flash_attention(q32, k32, v32, score_mod=poly)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, nbattn.flash_attention(q32, k32, v32, score_mod=poly_f32))
    ref = naive.flex_attention(q64, k64, v64, score_mod=poly)[0]
    np.testing.assert_allclose(b64, ref, rtol=0, atol=1e-13)
    # the two copies are keyed apart
    assert fingerprint(poly, "s") != fingerprint(float32_constants(poly), "s")
    assert fingerprint(float32_constants(poly), "s") == fingerprint(float32_constants(poly), "s")


def test_the_users_functions_are_untouched():
    fns = (poly, soft, soft_closure, quirky, quirky_args_grad, poly_grad)
    before = [(f.__code__, f.__defaults__, f.__kwdefaults__, f.__closure__) for f in fns]
    consts = [f.__code__.co_consts for f in fns]
    q, k, v = qkv(np.float32, 11, shape=(1, 2, 12, 8))
    nbattn.flash_attention(q, k, v, score_mod=poly)
    nbattn.flash_attention(q, k, v, score_mod=soft_closure)
    t = np.ones((2, 6), dtype=np.float32)
    out, lse = nbattn.flash_attention(q, k, v, score_mod=quirky, mod_args=(t,), return_lse=True)
    nbattn.flash_attention_backward(
        q, k, v, out, lse, q, score_mod=quirky, mod_args=(t,), score_mod_args_grad=quirky_args_grad
    )
    after = [(f.__code__, f.__defaults__, f.__kwdefaults__, f.__closure__) for f in fns]
    assert all(a is b or a == b for x, y in zip(before, after) for a, b in zip(x, y))
    assert consts == [f.__code__.co_consts for f in fns]
    assert all(type(c) is not np.float32 for c in poly.__code__.co_consts)


_CHILD = """
import sys, numpy as np
sys.path.insert(0, {root!r})
import nbattn
from tests.attn.test_flex_float32_constants_review import poly, qkv
out = {{}}
for dt in {order}:
    q, k, v = qkv(dt, 9)
    out[np.dtype(dt).name] = nbattn.flash_attention(q, k, v, score_mod=poly)
np.savez({path!r}, **out)
"""


@pytest.mark.parametrize("order", ["(np.float64, np.float32)", "(np.float32, np.float64)"])
def test_fresh_process_sharing_the_cache_gives_each_dtype_its_bits(tmp_path, order):
    path = str(tmp_path / "out.npz")
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    env.setdefault("NBATTN_FLEX_DIR", os.environ.get("NBATTN_FLEX_DIR", str(tmp_path / "flex")))
    code = _CHILD.format(root=str(ROOT), order=order, path=path)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.load(path)
    q, k, v = qkv(np.float32, 9)
    want = nbattn.flash_attention(q, k, v, score_mod=poly_f32)
    np.testing.assert_array_equal(got["float32"], want)
    # float64: not bit-for-bit. A float64 flex kernel loaded from numba's disk cache gives
    # other bits (1-2 ulps) than the same kernel compiled in the process (measured with
    # five processes on two cache folders: compiled == compiled, loaded != compiled)
    q, k, v = qkv(np.float64, 9)
    want = nbattn.flash_attention(q, k, v, score_mod=poly)
    np.testing.assert_allclose(got["float64"], want, rtol=0, atol=1e-14)


_GLOBAL_CHILD = """
import sys, numpy as np
sys.path.insert(0, {root!r})
import nbattn
SHIFT = 0.1

def shifted(score, b, h, q_idx, kv_idx):
    return score * SHIFT + 0.1 * kv_idx

rng = np.random.default_rng(0)
res = {{}}
for dt in (np.float32,):  # float64 calls run the user's function: test_flex.py's keys
    q, k, v = (rng.standard_normal((1, 1, 8, 4)).astype(dt) for _ in range(3))
    a = nbattn.flash_attention(q, k, v, score_mod=shifted)
    SHIFT = 2.5
    b = nbattn.flash_attention(q, k, v, score_mod=shifted)
    SHIFT = 0.1
    want = (q.astype(float) @ k.astype(float).swapaxes(-1, -2)) / 2.0 * 2.5 + 0.1 * np.arange(8)
    p = np.exp(want - want.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    assert not np.array_equal(a, b), dt
    assert np.abs(b - p @ v.astype(float)).max() < 1e-5, dt
print("ok")
"""


def test_editing_a_global_between_calls_recompiles_the_float32_copy(tmp_path):
    env = dict(os.environ, NUMBA_NUM_THREADS="1", NBATTN_FLEX_DIR=str(tmp_path / "flex"))
    code = textwrap.dedent(_GLOBAL_CHILD.format(root=str(ROOT)))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout


_CUDASIM_CHILD = """
import sys, numpy as np
sys.path.insert(0, {root!r})
import nbattn
from tests.attn.test_flex_float32_constants_review import poly
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 1, 6, 4)).astype(np.float32) for _ in range(3))
gpu = nbattn.flash_attention(q, k, v, score_mod=poly, device="cuda")
cpu = nbattn.flash_attention(q, k, v, score_mod=poly)
assert gpu.dtype == np.float32, gpu.dtype
d = np.abs(np.asarray(gpu, dtype=float) - cpu).max()
assert d <= 1e-6, d
print("ok", d)
"""


def test_cuda_simulator_float32_matches_cpu(tmp_path):
    env = dict(
        os.environ,
        NUMBA_ENABLE_CUDASIM="1",
        NUMBA_NUM_THREADS="1",
        NBATTN_FLEX_DIR=str(tmp_path / "flex"),
    )
    code = _CUDASIM_CHILD.format(root=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400
    )
    if "CUDA" in done.stderr and "not available" in done.stderr:
        pytest.skip(done.stderr[-300:])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout
