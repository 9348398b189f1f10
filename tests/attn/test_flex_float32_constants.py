"""score_mod's Python float constants in float32 calls: float32, as torch's weak scalars.

torch's FlexAttention computes ``30.0 * tanh(score / 30.0)`` on a float32 tensor in
float32; numba would type 30.0 as a float64. The flex kernels therefore compile, for
float32 inputs, a copy of the user's score functions whose float constants are
``numpy.float32`` (``flex_build.float32_constants``), and the user's own functions for
float64 inputs. Checked here: a float32 call gives the bits of the same function written
with float32 constants, a float64 call those of float64 constants (in either order in
one process), the backward likewise, and the copy leaves the user's function as it was.
"""

from __future__ import annotations

import numpy as np
import pytest

import nbattn
from nbattn.kernels.flex_build import float32_constants
from tests import naive

F32, F64 = np.float32(0.1), np.float64(0.1)
CAP = 30.0  # a module global Python float


def scaled(score, b, h, q_idx, kv_idx):
    """0.1 is not a float32: float32 and float64 arithmetic give other bits."""
    return score * 0.1 + 0.3 * (kv_idx - q_idx) / 7.0


def scaled_f32(score, b, h, q_idx, kv_idx):
    return score * F32 + np.float32(0.3) * (kv_idx - q_idx) / np.float32(7.0)


def scaled_f64(score, b, h, q_idx, kv_idx):
    return score * F64 + np.float64(0.3) * (kv_idx - q_idx) / np.float64(7.0)


def qkv(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, 2, 40, 8)).astype(dtype) for _ in range(3))


def run(fn, q, k, v, grad=None):
    out, lse = nbattn.flash_attention(q, k, v, score_mod=fn, causal=True, return_lse=True)
    if grad is None:
        return out, lse
    return (out, lse, *nbattn.flash_attention_backward(q, k, v, out, lse, grad, score_mod=fn,
                                                      causal=True))  # fmt: skip


@pytest.mark.parametrize("order", ["float32 first", "float64 first"])
def test_each_dtype_computes_with_constants_of_its_own_type(order):
    dtypes = [np.float32, np.float64]
    if order == "float64 first":
        dtypes.reverse()
    for dtype in dtypes:
        q, k, v = qkv(dtype)
        got = run(scaled, q, k, v)
        same = run(scaled_f32 if dtype == np.float32 else scaled_f64, q, k, v)
        for a, b in zip(got, same):
            np.testing.assert_array_equal(a, b)


def test_float32_constants_are_not_float64_ones():
    """The premise: 0.1 in float32 and in float64 give scores of other bits here."""
    q, k, v = qkv(np.float32)
    f32 = run(scaled_f32, q, k, v)[1]
    f64 = run(scaled_f64, q, k, v)[1]
    assert not np.array_equal(f32, f64)


def test_the_backward_uses_the_same_constants():
    q, k, v = qkv(np.float32, seed=1)
    grad = np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    got = run(scaled, q, k, v, grad)
    same = run(scaled_f32, q, k, v, grad)
    for a, b in zip(got, same):
        np.testing.assert_array_equal(a, b)


def _nested(score, b, h, q_idx, kv_idx, scale=2.5, *, shift=-1.5):
    inner = lambda x: x * 0.25  # noqa: E731
    return inner(score) * scale * 0.75 + shift + 1 + True


def test_the_copy_converts_nested_constants_only_and_leaves_the_function_alone():
    before = _nested.__code__
    copy = float32_constants(_nested)
    assert _nested.__code__ is before  # the user's function is not modified
    assert copy is not _nested and copy.__qualname__ == _nested.__qualname__
    assert copy.__module__ == _nested.__module__ and copy.__globals__ is _nested.__globals__
    assert [c for c in copy.__code__.co_consts if isinstance(c, np.floating)] == [0.75]
    assert type(next(c for c in copy.__code__.co_consts if c == 0.75)) is np.float32
    ints = [c for c in copy.__code__.co_consts if type(c) in (int, bool)]
    assert ints == [c for c in before.co_consts if type(c) in (int, bool)]
    inner = next(c for c in copy.__code__.co_consts if hasattr(c, "co_consts"))
    assert np.float32(0.25) in inner.co_consts
    assert copy.__defaults__ == (2.5,) and type(copy.__defaults__[0]) is np.float32
    assert (
        copy.__kwdefaults__ == {"shift": -1.5} and type(copy.__kwdefaults__["shift"]) is np.float32
    )
    assert type(_nested.__defaults__[0]) is float  # the user's own stay
    x = np.float32(2.0)
    assert copy(x, 0, 0, 0, 0) == np.float32(0.5) * 2.5 * np.float32(0.75) - 1.5 + 2
    assert float32_constants(None) is None


@pytest.mark.parametrize("c", [1e39, -3.5e38, 1e-39, -1e-300, 5e-324])
def test_constants_float32_cannot_hold_stay_float64(c):
    def fn(score, b, h, q_idx, kv_idx):
        return score + 0.5

    code = fn.__code__.replace(co_consts=tuple(c if x == 0.5 else x for x in fn.__code__.co_consts))
    copy = float32_constants(type(fn)(code, fn.__globals__))
    assert any(type(x) is float and x == c for x in copy.__code__.co_consts)


@pytest.mark.parametrize("c", [0.0, -0.0, float("inf"), float("-inf"), 1.1754944e-38, 3.4e38])
def test_zero_infinities_and_float32_normals_become_float32(c):
    def fn(score, b, h, q_idx, kv_idx):
        return score + 0.5

    code = fn.__code__.replace(co_consts=tuple(c if x == 0.5 else x for x in fn.__code__.co_consts))
    copy = float32_constants(type(fn)(code, fn.__globals__))
    converted = [x for x in copy.__code__.co_consts if type(x) is np.float32]
    assert len(converted) == 1 and (converted[0] == c or np.isnan(c))


def test_a_score_beyond_float32_from_a_constant_is_refused_as_before():
    """``score + 1e39`` in a float32 call: float64 arithmetic (the constant stays a float64),
    so the kernels refuse the score by size instead of taking it as +inf (a NaN row)."""

    def huge(score, b, h, q_idx, kv_idx):
        return score + 1e39

    q, k, v = qkv(np.float32)
    with pytest.raises(ValueError, match="beyond the float32 range"):
        nbattn.flash_attention(q, k, v, score_mod=huge)


def test_a_closure_and_a_jitted_function_keep_their_cells_and_code():
    import numba

    width = 4.0

    def closure(score, b, h, q_idx, kv_idx):
        return score / width + 0.5

    copy = float32_constants(closure)
    assert type(copy.__closure__[0].cell_contents) is np.float32
    assert closure.__closure__[0].cell_contents == 4.0  # the user's cell untouched
    assert type(closure.__closure__[0].cell_contents) is float
    assert copy(np.float32(2.0), 0, 0, 0, 0) == np.float32(1.0)
    jitted = numba.njit(scaled)
    copy = float32_constants(jitted)
    assert copy.__code__.co_code == scaled.__code__.co_code
    assert np.float32(0.1) in copy.__code__.co_consts


# The softcap in its three usual forms. softcap_literal and generate_tanh_softcap are
# also test_flex_float32_constants_review.py's soft and make_softcap (imported there:
# one kernel per form and dtype for both files; a copy would be keyed, and compiled,
# apart by its module and name).


def softcap_literal(score, b, h, q_idx, kv_idx):
    return 30.0 * nbattn.flex_tanh(score / 30.0)


def softcap_global(score, b, h, q_idx, kv_idx):
    """The cap a module global, read in a nested function (nested code: the key and the
    float32 copy see its globals too; test_a_score_mod_with_a_nested_function_runs)."""
    capped = lambda x: CAP * nbattn.flex_tanh(x / CAP)  # noqa: E731
    return capped(score)


def generate_tanh_softcap(cap):
    """attention-gym's softcap: a closure over a Python float."""

    def softcap(score, b, h, q_idx, kv_idx):
        return cap * nbattn.flex_tanh(score / cap)

    return softcap


def test_closure_and_global_floats_compute_in_float32_as_the_literal():
    """The usual FlexAttention ports: the cap in a closure cell or a module global (read
    in a nested function) gives the literal's float32 bits (it computed in float64
    before), and float64 calls the float64 bits of each."""
    closure = generate_tanh_softcap(30.0)
    for dtype in (np.float32, np.float64):
        q, k, v = qkv(dtype, seed=3)
        q *= 8  # scores of tens: the softcap bends them
        literal = run(softcap_literal, q, k, v)
        for fn in (closure, softcap_global):
            for a, b in zip(run(fn, q, k, v), literal):
                np.testing.assert_array_equal(a, b)
    assert type(closure.__closure__[0].cell_contents) is float and type(CAP) is float


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_score_mod_with_a_nested_function_runs(dtype):
    """A lambda inside score_mod (nested code: softcap_global's, whose kernels the test
    above compiles): its globals were collected as a list and added to a set, a TypeError
    in the key before any kernel ran."""
    q, k, v = qkv(dtype, seed=4)
    got = nbattn.flash_attention(q, k, v, score_mod=softcap_global)
    ref, _ = naive.flex_attention(q, k, v, lambda s, b, h, i, j: 30.0 * np.tanh(s / 30.0))
    np.testing.assert_allclose(got, ref, rtol=0, atol=64 * np.finfo(dtype).eps)
