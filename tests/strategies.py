"""The hypothesis draws that the property tests share, so that each test states only what
is particular to it: a seed for numpy's generator, a float dtype, and the shapes of the
problems the package solves (queries pooled over keys, a training set whose rows are
both, batched attention).

A size is given as its largest value (drawn from 1 up) or as an inclusive pair
(smallest, largest). The suite's settings (no deadline: an example's first call may
compile kernels) are registered once, in ``tests/conftest.py``.
"""

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

#: A seed for ``np.random.default_rng`` (any value in its range is as good as another).
seeds = st.integers(0, 2**32 - 1)

#: The two float dtypes that every kernel is compiled for.
float_dtypes = st.sampled_from([np.float64, np.float32])


def sizes(size):
    """Integers from 1 to ``size``, or from ``size[0]`` to ``size[1]`` for a pair."""
    low, high = (1, size) if isinstance(size, int) else size
    return st.integers(low, high)


class PoolingShape(NamedTuple):
    """n_queries pooled over n_keys, each a row of d features, with n_outputs values a key."""

    n_queries: int
    n_keys: int
    d: int
    n_outputs: int


def pooling_shapes(queries, keys, features, outputs):
    """PoolingShape draws; each argument is a size (see the module's docstring)."""
    return st.builds(PoolingShape, sizes(queries), sizes(keys), sizes(features), sizes(outputs))


class SampleShape(NamedTuple):
    """A training set of n rows, d features and p targets (leave-one-out: each row is a
    query pooled over the other rows)."""

    n: int
    d: int
    p: int


def sample_shapes(rows, features, outputs):
    """SampleShape draws; each argument is a size (see the module's docstring)."""
    return st.builds(SampleShape, sizes(rows), sizes(features), sizes(outputs))


def batch_shapes(dims, size):
    """Leading batch dimensions: a tuple of up to ``dims`` sizes, each 1 to ``size``."""
    return st.lists(st.integers(1, size), max_size=dims).map(tuple)


class AttentionShape(NamedTuple):
    """Queries (*batch, L, E) attending to keys (*batch, S, E)."""

    batch: tuple
    L: int
    S: int
    E: int


def attention_shapes(batch, queries, keys, features):
    """AttentionShape draws: ``batch`` = (dims, size) as in :func:`batch_shapes`, the others
    sizes (see the module's docstring)."""
    return st.builds(
        AttentionShape, batch_shapes(*batch), sizes(queries), sizes(keys), sizes(features)
    )


def magnitude_cases(exponents, length):
    """The draws of an attention test at extreme magnitudes, as keywords for ``given``: an
    ``exponent`` (one of ``exponents``), L queries and S keys (sizes up to ``length``),
    ``causal``, ``dtype`` and ``seed``."""
    return dict(
        exponent=st.sampled_from(exponents),
        L=sizes(length),
        S=sizes(length),
        causal=st.booleans(),
        dtype=float_dtypes,
        seed=seeds,
    )


def huge_values(rng, shape, exponent):
    """A float64 mask or bias of ``shape`` at magnitude 10**exponent: uniform in
    (-10**exponent, 10**exponent), each entry -inf with probability 0.2."""
    values = rng.uniform(-1, 1, size=shape) * 10.0**exponent
    values[rng.random(shape) < 0.2] = -np.inf
    return values
