"""The keys of the generated flex kernels (``flex_build.fingerprint``): what a user
function reads decides its key, by value, by code or by a name that fixes it, and
nothing of unknown effect shares a key. Nothing here compiles."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from nbattn.kernels import flex_build


def calling(helper):
    def score_mod(score, b, h, q_idx, kv_idx):
        return helper(score)

    return score_mod


def helper_times(c):
    @numba.njit
    def helper(x):
        return x * c

    return helper


def key(fn, process=False):
    return flex_build.fingerprint(fn, "score_mod", process=process)


def test_jitted_helpers_of_one_name_are_keyed_by_their_code_and_values():
    two, minus_three = calling(helper_times(2.0)), calling(helper_times(-3.0))
    assert key(two) != key(minus_three)
    assert key(two) == key(calling(helper_times(2.0)))


def test_a_cuda_device_helper_is_keyed_by_its_code():
    cuda = pytest.importorskip("numba.cuda")

    def device_helper(c):
        @cuda.jit(device=True)
        def helper(x):
            return x * c

        return helper

    assert key(calling(device_helper(2.0))) != key(calling(device_helper(-3.0)))
    assert key(calling(device_helper(2.0))) == key(calling(device_helper(2.0)))


@pytest.mark.parametrize(
    ("first", "second"),
    [(np.exp, np.log), (math.exp, math.log), (np.clip, np.where), (np.float32, np.float64),
     (numba.float32, numba.float64), (np.dtype("f4"), np.dtype("f8"))],
)  # fmt: skip
def test_named_things_are_keyed_by_their_names(first, second):
    assert key(calling(first)) != key(calling(second))
    assert key(calling(first)) == key(calling(first))


class Opaque:
    """An object whose effect on compiled code nbattn cannot describe."""


def test_an_unknown_object_is_refused_for_the_disk_key_and_keyed_by_identity_in_process():
    one, other = Opaque(), Opaque()
    with pytest.raises(flex_build.UnknownValue, match="score_mod reads 'closure helper'.*Opaque"):
        key(calling(one))
    assert key(calling(one), process=True) == key(calling(one), process=True)
    assert key(calling(one), process=True) != key(calling(other), process=True)
