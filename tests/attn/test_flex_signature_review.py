"""Review of ``flex_build.check_signature``'s refusal of keyword-only parameters and
``**kwargs`` (numba calls score functions positionally and compiles neither).

Every public entry that takes a user function, every role (``score_mod``, ``mask_mod``,
``score_mod_grad``, ``score_mod_args_grad``) and every way of writing such a parameter:
refused with a ValueError naming the role and the parameter, before anything compiles
(numba's dispatcher is made to fail if it is asked to), with the inputs untouched.
Functions that must still be accepted (positional-only parameters, trailing positional
defaults, ``*args``, a function jitted with an explicit signature) give the dense
softmax(q k^T / sqrt(E) + bias) of NumPy. The gaps the review found are kept as tests:
the torch adapter checked ``score_mod_grad`` / ``score_mod_args_grad`` only in the
backward; the check read ``inspect.signature``, which ``functools.wraps`` and
``__signature__`` rewrite; a ``np.timedelta64`` in ``mod_args`` escaped as a bare
TypeError.
"""

from __future__ import annotations

import functools
import inspect
import math
import time

import numba
import numpy as np
import pytest
from numba.core.dispatcher import Dispatcher

import nbattn
from nbattn.kernels import flex_build

try:
    import torch

    import nbattn.torch as nbattn_torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

B, H, L, E = 1, 2, 16, 8
SLOPES = np.array([0.5, 0.25])


def _qkv(dtype=np.float64):
    rng = np.random.default_rng(11)
    return tuple(rng.standard_normal((B, H, L, E)).astype(dtype) for _ in range(3))


def _dense(q, k, v, bias=0.0, allowed=None):
    """softmax(q k^T / sqrt(E) + bias) v in float64, -inf where ``allowed`` is False."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1]) + bias
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _alibi(weight=1.0):
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    return weight * SLOPES[None, :, None, None] * (j - i)


# --------------------------------------------------------------------- refused functions
def _kw_no_default(score, b, h, q_idx, kv_idx, *, c):
    return score * c


def _kw_default(score, b, h, q_idx, kv_idx, *, c=2.0):
    return score * c


def _kw_bag(score, b, h, q_idx, kv_idx, **extra):
    return score


def _star_then_kw(score, b, h, q_idx, kv_idx, *rest, c=1.0):
    return score * c


def _slopes_then_kw(score, b, h, q_idx, kv_idx, slopes, *, c=1.0):
    return score + c * slopes[h]


def _posonly_then_kw(score, b, h, q_idx, kv_idx, /, *, c=1.0):
    return score * c


_kw_lambda = lambda score, b, h, q_idx, kv_idx, *, c=1.0: score * c  # noqa: E731
_kw_jitted = numba.njit(_kw_default)


def _closure():
    c = 3.0

    def closed(score, b, h, q_idx, kv_idx, *, d=c):
        return score * c * d

    return closed


_kw_closure = _closure()


class _Holder:
    @staticmethod
    def static(score, b, h, q_idx, kv_idx, *, c=1.0):
        return score * c

    def method(self, score, b, h, q_idx, kv_idx):
        return score

    def __call__(self, score, b, h, q_idx, kv_idx):
        return score


def _mask_kw(b, h, q_idx, kv_idx, *, keep=True):
    return keep


def _mask_bag(b, h, q_idx, kv_idx, **extra):
    return True


def _args_grad_kw(grad_score, score, b, h, q_idx, kv_idx, slopes, d_slopes, *, c=1.0):
    d_slopes[h] += grad_score * c


def _plain(score, b, h, q_idx, kv_idx):
    return score


def _plain_slopes(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * (kv_idx - q_idx)


#: name -> (function, the parameter as the message prints it, its signature's text)
SCORE_KINDS = {
    "keyword_only_without_default": (_kw_no_default, "c", "*, c)"),
    "keyword_only_with_default": (_kw_default, "c=2.0", "*, c=2.0)"),
    "var_keyword": (_kw_bag, "**extra", "**extra)"),
    "star_args_then_keyword_only": (_star_then_kw, "c=1.0", "*rest, c=1.0)"),
    "positional_only_then_keyword_only": (_posonly_then_kw, "c=1.0", "/, *, c=1.0)"),
    "lambda": (_kw_lambda, "c=1.0", "*, c=1.0)"),
    "njit_lazy": (_kw_jitted, "c=2.0", "*, c=2.0)"),
    "closure": (_kw_closure, "d=3.0", "*, d=3.0)"),
    "staticmethod": (_Holder.static, "c=1.0", "*, c=1.0)"),
}


@pytest.fixture
def no_compile(monkeypatch):
    """Any numba compile (or cache load) and any flex specialisation fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the signature was refused")

    monkeypatch.setattr(Dispatcher, "compile", refuse)
    for name in ("specialise", "specialise_args", "block_states"):
        monkeypatch.setattr(flex_build, name, refuse)


def _refused(call, role, param, sig_tail, inputs=()):
    """``call()`` raises the keyword-only ValueError naming ``role`` and ``param`` within
    a second, leaving ``inputs`` (arrays) as they were."""
    before = [np.array(x, copy=True) for x in inputs]
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        call()
    elapsed = time.perf_counter() - start
    message = str(info.value)
    # the role exactly: "score_mod has" is not "score_mod_grad has"
    assert message.startswith(f"{role} has the keyword-only parameter {param}, "), message
    assert "which numba cannot compile" in message
    assert message.endswith(sig_tail), message
    assert f"; {role}(" in message
    assert elapsed < 1.0, elapsed
    for x, x0 in zip(inputs, before):
        np.testing.assert_array_equal(np.asarray(x), x0)


@pytest.mark.parametrize("kind", SCORE_KINDS)
def test_every_way_of_writing_a_keyword_parameter_is_refused(kind, no_compile):
    fn, param, tail = SCORE_KINDS[kind]
    q, k, v = _qkv()
    _refused(lambda: nbattn.flash_attention(q, k, v, score_mod=fn), "score_mod", param, tail)


def test_keyword_only_after_a_mod_args_parameter_is_refused(no_compile):
    q, k, v = _qkv()
    slopes = SLOPES.copy()
    _refused(
        lambda: nbattn.flash_attention(q, k, v, score_mod=_slopes_then_kw, mod_args=(slopes,)),
        "score_mod",
        "c=1.0",
        "slopes, *, c=1.0)",
        (q, k, v, slopes),
    )


def _numpy_calls():
    """(id, call, role, param, signature tail, inputs) over every NumPy entry and role."""
    q, k, v = _qkv()
    out, lse, g = np.zeros_like(q), np.zeros((B, H, L)), np.ones_like(q)
    slopes = SLOPES.copy()
    packed = np.random.default_rng(3).standard_normal((L, H, E))
    cu = np.array([0, 7, L])
    p_out, p_lse, p_g = np.zeros_like(packed), np.zeros((H, L)), np.ones_like(packed)
    k_cache, v_cache = np.zeros((B, H, 20, E)), np.zeros((B, H, 20, E))
    new = np.random.default_rng(5).standard_normal((B, H, 1, E))
    lengths = np.array([3])
    qkv, bw = (q, k, v), (q, k, v, out, lse, g)
    fwd = nbattn.flash_attention
    back = nbattn.flash_attention_backward
    var = nbattn.flash_attention_varlen
    packed_back = functools.partial(
        nbattn.flash_attention_varlen_backward, packed, packed, packed, p_out, p_lse, p_g, cu, cu
    )
    return [
        ("forward-score_mod", lambda: fwd(*qkv, score_mod=_kw_default), "score_mod", qkv),
        ("forward-mask_mod", lambda: fwd(*qkv, mask_mod=_mask_kw), "mask_mod", qkv),
        (
            "forward-mask_mod-after-good-score_mod",
            lambda: fwd(*qkv, score_mod=_plain, mask_mod=_mask_bag),
            "mask_mod",
            qkv,
        ),
        ("backward-score_mod", lambda: back(*bw, score_mod=_kw_default), "score_mod", bw),
        (
            "backward-score_mod_grad",
            lambda: back(*bw, score_mod=_plain, score_mod_grad=_kw_default),
            "score_mod_grad",
            bw,
        ),
        ("backward-mask_mod", lambda: back(*bw, mask_mod=_mask_bag), "mask_mod", bw),
        (
            "backward-score_mod_args_grad",
            lambda: back(
                *bw,
                score_mod=_plain_slopes,
                mod_args=(slopes,),
                score_mod_args_grad=_args_grad_kw,
            ),
            "score_mod_args_grad",
            bw + (slopes,),
        ),
        (
            "varlen-score_mod",
            lambda: var(packed, packed, packed, cu, cu, score_mod=_kw_bag),
            "score_mod",
            (packed, cu),
        ),
        (
            "varlen-mask_mod",
            lambda: var(packed, packed, packed, cu, cu, mask_mod=_mask_kw),
            "mask_mod",
            (packed, cu),
        ),
        (
            "varlen_backward-score_mod_grad",
            lambda: packed_back(score_mod=_plain, score_mod_grad=_kw_bag),
            "score_mod_grad",
            (packed, p_out, p_lse, p_g, cu),
        ),
        (
            "varlen_backward-score_mod_args_grad",
            lambda: packed_back(
                score_mod=_plain_slopes, mod_args=(slopes,), score_mod_args_grad=_args_grad_kw
            ),
            "score_mod_args_grad",
            (packed, slopes),
        ),
        (
            "decode-score_mod",
            lambda: nbattn.flash_decode(
                q[:, :, :1], k_cache, v_cache, lengths, new, new, score_mod=_kw_default
            ),
            "score_mod",
            (k_cache, v_cache, lengths, new),
        ),
        (
            "decode-mask_mod",
            lambda: nbattn.flash_decode(
                q[:, :, :1], k_cache, v_cache, lengths, new, new, mask_mod=_mask_bag
            ),
            "mask_mod",
            (k_cache, v_cache, lengths, new),
        ),
        (
            "create_block_mask",
            lambda: nbattn.create_block_mask(_mask_kw, None, None, L, L),
            "mask_mod",
            (),
        ),
    ]


_PARAM = {
    _kw_default: ("c=2.0", "*, c=2.0)"),
    _kw_bag: ("**extra", "**extra)"),
    _mask_kw: ("keep=True", "*, keep=True)"),
    _mask_bag: ("**extra", "**extra)"),
    _args_grad_kw: ("c=1.0", "*, c=1.0)"),
}
_BAD_OF_ROLE = {
    "forward-score_mod": _kw_default,
    "forward-mask_mod": _mask_kw,
    "forward-mask_mod-after-good-score_mod": _mask_bag,
    "backward-score_mod": _kw_default,
    "backward-score_mod_grad": _kw_default,
    "backward-mask_mod": _mask_bag,
    "backward-score_mod_args_grad": _args_grad_kw,
    "varlen-score_mod": _kw_bag,
    "varlen-mask_mod": _mask_kw,
    "varlen_backward-score_mod_grad": _kw_bag,
    "varlen_backward-score_mod_args_grad": _args_grad_kw,
    "decode-score_mod": _kw_default,
    "decode-mask_mod": _mask_bag,
    "create_block_mask": _mask_kw,
}


@pytest.mark.parametrize("case", [c[0] for c in _numpy_calls()])
def test_every_entry_and_role_names_the_role_and_parameter(case, no_compile):
    (_, call, role, inputs) = next(c for c in _numpy_calls() if c[0] == case)
    param, tail = _PARAM[_BAD_OF_ROLE[case]]
    _refused(call, role, param, tail, inputs)


@needs_torch
@pytest.mark.parametrize("role", ["score_mod", "mask_mod"])
def test_the_torch_adapter_refuses_in_the_forward(role, no_compile):
    q, k, v = (torch.from_numpy(x) for x in _qkv())
    fn = _kw_default if role == "score_mod" else _mask_kw
    param, tail = _PARAM[fn]
    _refused(
        lambda: nbattn_torch.flash_attention(q, k, v, **{role: fn}),
        role,
        param,
        tail,
        (q.numpy(), k.numpy(), v.numpy()),
    )


@pytest.mark.parametrize(
    "fn", [functools.partial(_plain), _Holder(), _Holder().method, math.exp, max]
)
def test_what_is_not_a_plain_function_is_refused_by_type(fn, no_compile):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^score_mod must be a plain function"):
        nbattn.flash_attention(q, k, v, score_mod=fn)


# --------------------------------------------------------------------- still accepted
def _alibi_posonly(score, b, h, q_idx, kv_idx, /, slopes, weight=1.0):
    return score + weight * slopes[h] * (kv_idx - q_idx)


def _star_score(score, b, h, q_idx, kv_idx, *rest):
    return score + rest[0][h] * (kv_idx - q_idx)


@numba.njit
def _star_causal(b, h, q_idx, kv_idx, *rest):
    return kv_idx <= q_idx


@numba.njit("float64(float64, int64, int64, int64, int64)")
def _typed(score, b, h, q_idx, kv_idx):
    return score + 0.125 * (kv_idx - q_idx)


def test_positional_defaults_take_a_range_of_mod_args_counts():
    """(score, b, h, q_idx, kv_idx, /, slopes, weight=1.0) takes one or two mod_args."""
    sig = "score, b, h, q_idx, kv_idx"
    for n_args in (1, 2):
        flex_build.check_signature(_alibi_posonly, "score_mod", 5, n_args, sig)
    for n_args in (0, 3):
        with pytest.raises(ValueError, match=rf"score_mod must take .*\({n_args} given\)"):
            flex_build.check_signature(_alibi_posonly, "score_mod", 5, n_args, sig)
    q, k, v = _qkv()
    out = nbattn.flash_attention(q, k, v, score_mod=_alibi_posonly, mod_args=(SLOPES,))
    np.testing.assert_allclose(out, _dense(q, k, v, _alibi()), rtol=1e-12, atol=1e-12)


def test_star_args_functions_are_accepted():
    q, k, v = _qkv()
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    out = nbattn.flash_attention(
        q, k, v, score_mod=_star_score, mask_mod=_star_causal, mod_args=(SLOPES,)
    )
    np.testing.assert_allclose(out, _dense(q, k, v, _alibi(), j <= i), rtol=1e-12, atol=1e-12)


def test_a_function_jitted_with_an_explicit_signature_is_accepted():
    q, k, v = _qkv()
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    out = nbattn.flash_attention(q, k, v, score_mod=_typed)
    np.testing.assert_allclose(out, _dense(q, k, v, 0.125 * (j - i)), rtol=1e-12, atol=1e-12)


def test_star_args_with_too_many_required_parameters_is_refused_by_name(no_compile):
    """``*rest`` takes any number of arguments beyond the named ones, never fewer than
    the required ones: refused before compiling (it once reached numba's own mismatch)."""

    def needs_two(score, b, h, q_idx, kv_idx, x, y, *rest):
        return score

    def takes_one_more(score, b, h, q_idx, kv_idx, x, y=1.0):
        return score

    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^score_mod must take .* it takes 7 or more"):
        nbattn.flash_attention(q, k, v, score_mod=needs_two)
    with pytest.raises(ValueError, match=r"^score_mod must take .* it takes 6 to 7"):
        nbattn.flash_attention(q, k, v, score_mod=takes_one_more)
    with pytest.raises(ValueError, match=r"^score_mod must take .* \(3 given\).* it takes 6 to 7"):
        nbattn.flash_attention(q, k, v, score_mod=takes_one_more, mod_args=(1.0, 2.0, 3.0))


def test_mod_args_of_the_wrong_kind_are_named(no_compile):
    q, k, v = _qkv()
    cases = [
        ([SLOPES], "mod_args must be a tuple"),
        (SLOPES, "mod_args must be a tuple"),
        ((None,), r"mod_args\[0\] must be a NumPy array or a number, got NoneType"),
        ((1j,), r"mod_args\[0\] must be a NumPy array or a number, got complex"),
        (((1.0,),), r"mod_args\[0\] must be a NumPy array or a number, got tuple"),
        ((np.array(["a"]),), r"mod_args\[0\] must be a bool, int or float array"),
        ((2**64,), r"mod_args\[0\] = 18446744073709551616 is beyond"),
        ((SLOPES, 1.0, 2.0), r"score_mod must take .*\(3 given\)"),
        ((), r"score_mod must take .*\(0 given\)"),
    ]
    for mod_args, match in cases:
        with pytest.raises(ValueError, match=match):
            nbattn.flash_attention(q, k, v, score_mod=_alibi_posonly, mod_args=mod_args)


# ------------------------------------------- gaps the review found (fixed since)
def _grad_kw(score, b, h, q_idx, kv_idx, slopes, *, c=1.0):
    return 1.0


@needs_torch
@pytest.mark.parametrize("role", ["score_mod_grad", "score_mod_args_grad"])
def test_torch_refuses_backward_functions_at_the_call(role):
    q, k, v = (torch.from_numpy(x) for x in _qkv())
    bad = _grad_kw if role == "score_mod_grad" else _args_grad_kw
    with pytest.raises(ValueError, match=f"^{role} has the keyword-only parameter c=1.0"):
        nbattn_torch.flash_attention(
            q, k, v, score_mod=_alibi_posonly, mod_args=(torch.from_numpy(SLOPES),), **{role: bad}
        )


@numba.njit
def _positional_core(score, b, h, q_idx, kv_idx):
    return 0.5 * score


@functools.wraps(_positional_core.py_func)
def _wrapped_with_kwargs(*args, **kwargs):
    return _positional_core(*args)


def test_a_wraps_decorated_kwargs_wrapper_is_refused_by_name():
    assert "**kwargs" not in str(inspect.signature(_wrapped_with_kwargs))
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"^score_mod has the keyword-only parameter \*\*kwargs"):
        nbattn.flash_attention(q, k, v, score_mod=_wrapped_with_kwargs)


def _hidden_bag(score, b, h, q_idx, kv_idx, **extra):
    return score


_hidden_bag.__signature__ = inspect.signature(_plain)


def test_a_signature_attribute_does_not_end_in_an_assertion_error():
    q, k, v = _qkv(np.float32)
    try:
        out = nbattn.flash_attention(q, k, v, score_mod=_hidden_bag)
    except ValueError as error:  # refused up front: fine, if named
        assert str(error).startswith("score_mod "), error
    else:
        np.testing.assert_allclose(out, _dense(q, k, v), rtol=1e-5, atol=1e-5)


def test_a_timedelta_in_mod_args_is_refused_by_name(no_compile):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"mod_args\[0\]"):
        nbattn.flash_attention(
            q, k, v, score_mod=_alibi_posonly, mod_args=(np.timedelta64(3, "s"),)
        )
