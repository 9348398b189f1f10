"""Review of ``kd_order`` splitting a feature-major copy of the keys (b4af3d7): the same
order as the plain-Python split (``naive.kd_order``) on edge inputs, the input left as it
was, every layout and dtype giving the float64 answer, and the split's structure."""

import numpy as np
import pytest

from nbattn.kernels import kd_order
from tests import naive


def _cases(n, k, seed):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, k))
    constant = base.copy()
    constant[:, -1] = 7.0
    return {
        "normal": base,
        "all_equal": np.full((n, k), 3.25),
        "constant_column": constant,
        "rounded": np.round(base),
        "few_values": np.round(base * 0.3),
        "sorted": np.sort(base, axis=0),
        "reverse_sorted": np.sort(base, axis=0)[::-1],
        "near_max": base * 1e300,
        "subnormal": base * 1e-310,
        "signed_zeros": np.where(rng.random((n, k)) < 0.5, 0.0, -0.0),
        "nan": np.where(rng.random((n, k)) < 0.2, np.nan, base),
        "all_nan": np.full((n, k), np.nan),
    }


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 64])
def test_same_order_as_naive_on_edge_inputs(n, k):
    for name, z in _cases(n, k, seed=n * 10 + k).items():
        z = np.ascontiguousarray(z, dtype=np.float64)
        for leaf_keys in sorted({1, 2, 3, n, n + 1}):
            order, starts = kd_order.kd_order(z, leaf_keys)
            ref_order, ref_starts = naive.kd_order(z, leaf_keys)
            np.testing.assert_array_equal(order, ref_order, err_msg=f"{name} {leaf_keys}")
            np.testing.assert_array_equal(starts, ref_starts, err_msg=f"{name} {leaf_keys}")


def test_no_keys():
    order, starts = kd_order.kd_order(np.empty((0, 3)), 4)
    assert order.shape == (0,)
    assert starts[0] == 0 and starts[-1] == 0


@pytest.mark.parametrize("name", ["sorted", "reverse_sorted", "rounded", "nan", "signed_zeros"])
def test_larger_inputs_match_naive(name):
    z = np.ascontiguousarray(_cases(3000, 3, seed=7)[name])
    for leaf_keys in (1, 32):
        order, starts = kd_order.kd_order(z, leaf_keys)
        ref_order, ref_starts = naive.kd_order(z, leaf_keys)
        np.testing.assert_array_equal(order, ref_order)
        np.testing.assert_array_equal(starts, ref_starts)


def test_input_is_left_as_it_was():
    rng = np.random.default_rng(3)
    z = rng.normal(size=(500, 4))
    z[rng.random(z.shape) < 0.1] = np.nan
    z[rng.random(z.shape) < 0.1] = -0.0
    before = z.copy()
    kd_order.kd_order(z, 1)
    np.testing.assert_array_equal(z, before)
    np.testing.assert_array_equal(np.signbit(z), np.signbit(before))


def test_layouts_and_dtypes_give_the_float64_answer():
    rng = np.random.default_rng(4)
    base = np.round(rng.normal(size=(400, 3)) * 10)  # ties, exact in every dtype below
    expected = kd_order.kd_order(np.ascontiguousarray(base), 4)
    wide = np.zeros((800, 6))
    wide[::2, ::2] = base
    readonly = base.copy()
    readonly.setflags(write=False)
    variants = {
        "fortran": np.asfortranarray(base),
        "strided": wide[::2, ::2],
        "float32": base.astype(np.float32),
        "int64": base.astype(np.int64),
        "int32": base.astype(np.int32),
        "readonly": readonly,
    }
    for name, z in variants.items():
        order, starts = kd_order.kd_order(z, 4)
        np.testing.assert_array_equal(order, expected[0], err_msg=name)
        np.testing.assert_array_equal(starts, expected[1], err_msg=name)


@pytest.mark.parametrize("leaf_keys", [1, 7, 64])
@pytest.mark.parametrize("data", ["normal", "rounded", "reverse_sorted"])
def test_every_split_separates_its_halves(data, leaf_keys):
    """Deep trees (one key a leaf): a permutation, leaves as kd_nodes expects, and at
    each node the left half no larger than the right along the node's widest axis."""
    n = 5000
    z = np.ascontiguousarray(_cases(n, 3, seed=11)[data])
    order, starts = kd_order.kd_order(z, leaf_keys)
    naive.assert_valid_kd_split(z, leaf_keys, order, starts)


def test_naive_twin_with_infinite_extent():
    """A column of +inf has a NaN extent (inf - inf), which never counts as the widest
    (the naive twin once took np.argmax, which picks a NaN)."""
    z = np.array([[0.0, np.inf], [1.0, np.inf], [2.0, np.inf]])
    order, starts = kd_order.kd_order(z, 1)
    with np.errstate(invalid="ignore"):
        ref_order, ref_starts = naive.kd_order(z, 1)
    np.testing.assert_array_equal(order, ref_order)
    np.testing.assert_array_equal(starts, ref_starts)
