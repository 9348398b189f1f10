"""The bootstrap's random draws, one definition for every resampling of a fit.

* :func:`bootstrap_generator`: a user's ``random_state`` as a numpy Generator. None is a
  fixed seed (0), as everywhere in nbattn, so that two identical calls give the same
  answer to the bit; an int seeds ``numpy.random.default_rng``; a Generator is used and
  advanced as given; a legacy RandomState draws the seed of a new Generator.
* :func:`wild_multipliers`: the multipliers v of the wild bootstrap, y*_i = g(x_i) +
  e_i v_i (Wu 1986, "Jackknife, bootstrap and other resampling methods in regression
  analysis"; Mammen 1993, "Bootstrap and wild bootstrap for high dimensional linear
  models"), independent, E v = 0 and E v^2 = 1:

  - ``"mammen"``: v = -(sqrt 5 - 1)/2 with probability (sqrt 5 + 1)/(2 sqrt 5), else
    (sqrt 5 + 1)/2, so that also E v^3 = 1 (R np's ``boot.method="wild"``);
  - ``"rademacher"``: v = -1 or +1 with probability 1/2 (np's ``"wild-rademacher"``).
* :func:`pairs_counts`: how many times each row is drawn in n draws with replacement
  (the pairs bootstrap as row weights, Efron 1979).
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np

__all__ = ["WILD_KINDS", "bootstrap_generator", "pairs_counts", "wild_multipliers"]

#: the wild bootstrap's multiplier distributions, by name
WILD_KINDS = ("mammen", "rademacher")

_SQRT5 = math.sqrt(5.0)
_MAMMEN_LOW = -(_SQRT5 - 1.0) / 2.0
_MAMMEN_HIGH = (_SQRT5 + 1.0) / 2.0
_MAMMEN_P_LOW = (_SQRT5 + 1.0) / (2.0 * _SQRT5)


def bootstrap_generator(random_state, name="random_state") -> np.random.Generator:
    """``random_state`` (None, an int seed in [0, 2**32), a numpy Generator or a
    RandomState) as a Generator; None is the fixed seed 0."""
    if random_state is None:
        return np.random.default_rng(0)
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(int(random_state.randint(np.iinfo(np.int32).max)))
    if isinstance(random_state, Integral) and not isinstance(random_state, (bool, np.bool_)):
        if 0 <= random_state < 2**32:
            return np.random.default_rng(int(random_state))
    raise ValueError(
        f"{name} must be None, an int in [0, 2**32), a numpy Generator or a RandomState, "
        f"got {random_state!r}"
    )


def wild_multipliers(rng: np.random.Generator, n_rows: int, n_boot: int, kind="mammen"):
    """(n_rows, n_boot) float64 multipliers of the wild bootstrap, drawn column by column
    (replicate b is column b, so the first columns do not depend on ``n_boot``)."""
    if kind not in WILD_KINDS:
        raise ValueError(
            f"the wild bootstrap's multipliers are one of {list(WILD_KINDS)}, got {kind!r}"
        )
    u = rng.random((n_boot, n_rows)).T
    if kind == "rademacher":
        return np.where(u < 0.5, -1.0, 1.0)
    return np.where(u < _MAMMEN_P_LOW, _MAMMEN_LOW, _MAMMEN_HIGH)


def pairs_counts(rng: np.random.Generator, n_rows: int, n_boot: int) -> np.ndarray:
    """(n_boot, n_rows) float64: row i's count in replicate b of n_rows draws with
    replacement (each row sums to n_rows)."""
    return rng.multinomial(n_rows, np.full(n_rows, 1.0 / n_rows), size=n_boot).astype(np.float64)
