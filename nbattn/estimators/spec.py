"""The parameters of every nbattn estimator, written once, without scikit-learn.

Each estimator is an :class:`EstimatorSpec`: its class name, whether it is a
classifier, and its parameters in ``__init__`` order. A :class:`Param` is a
name, a default, the values allowed, whether None is allowed, and whether
model files save it. The allowed values are written in a small vocabulary:

=====================  ==================================  ===============================
rule                   allows                              scikit-learn constraint
=====================  ==================================  ===============================
``Options(a, b)``      one of these strings                ``StrOptions({a, b})``
``IntRange(lo, hi)``   an int in [lo, hi] (hi None: no     ``Interval(Integral, lo, hi)``
                       upper end); not a bool
``RealRange(lo, ..)``  a number >= lo (``inclusive``) or   ``Interval(Real, lo, below)``
                       > lo, and < below where given; not
                       NaN, not a bool
``ArrayLike()``        a list, tuple or ndarray            ``"array-like"``
``Text()``             any string                          ``str``
``Verbose()``          an int >= 0 or a bool               ``"verbose"``
``RandomState()``      None, a seed in [0, 2**32), or a    ``"random_state"``,
                       numpy Generator / RandomState       ``np.random.Generator``
=====================  ==================================  ===============================

Everything else derives from :data:`SPECS`:

* the estimators' ``_parameter_constraints`` (scikit-learn's objects, built by
  :func:`nbattn.estimators.base.parameter_constraints`) and their ``__init__``
  bodies (:meth:`nbattn.estimators.base._PoolingEstimator._set_params_from`; each
  class's explicit signature, kept for help() and IDEs, is checked against the
  spec when the class is created);
* the model-file tables of :mod:`nbattn.estimators.fitted_state` (``ESTIMATORS``,
  ``DEFAULTS``, ``CLASSIFIERS``) and the checks that the scikit-learn-free
  :class:`nbattn.persistence.predictor.Predictor` runs on a file's parameters
  (:meth:`Param.check`);
* the choices of the ``nbattn fit`` options (:mod:`nbattn.app.cli`).

A model file holds a parameter's value when the value is JSON (a generator
given as ``random_state`` is held as null: it only seeds a fit). A file read
back checks each value with the rule's :meth:`accepts`, which for
``RandomState`` is a seed or None, what a file can hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np

from .._core.columns import CONTINUOUS_KERNELS
from .._core.numeric import MIN_SUBSAMPLE_ROWS
from ..local.neighbours import BANDWIDTH_TYPES

__all__ = [
    "BANDWIDTH_NAMES",
    "DENSITY_BANDWIDTH_NAMES",
    "REGRESSOR_BANDWIDTH_NAMES",
    "DENSITY_SPECS",
    "POOLING_SPECS",
    "SPECS",
    "ArrayLike",
    "EstimatorSpec",
    "IntRange",
    "Options",
    "Param",
    "RandomState",
    "RealRange",
    "Text",
    "Verbose",
    "is_int",
    "is_real",
]

#: the width rules by name (:data:`nbattn.smoothing.regression.BANDWIDTH_RULES`) and the
#: leave-one-out searches: "loo" (every width on its own) and "loo_scale" (one factor of
#: Scott's widths); ``tests/estimators`` checks the rules agree
BANDWIDTH_NAMES = ("scott", "silverman", "loo", "loo_scale")
#: the regressors' names: those, and "aicc", the improved Akaike criterion of Hurvich,
#: Simonoff and Tsai (1998) (:mod:`nbattn.local.aicc`), which a classifier does not take
REGRESSOR_BANDWIDTH_NAMES = (*BANDWIDTH_NAMES, "aicc")
#: the densities' width rules and criteria (:data:`nbattn.distribution.density.DENSITY_RULES`,
#: ``"cv_ml"``, the leave-one-out likelihood, and ``"cv_ls"``, least-squares
#: cross-validation), statsmodels' names
DENSITY_BANDWIDTH_NAMES = ("normal_reference", "silverman", "cv_ml", "cv_ls")


def is_int(value) -> bool:
    """An integer, and not a bool (JSON's true is no count)."""
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """A real number, and not a bool."""
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


# ----------------------------------------------------------------------------- the vocabulary


@dataclass(frozen=True, init=False)
class Options:
    """One of the strings ``values`` (in the order error messages list them)."""

    values: tuple

    def __init__(self, *values: str):
        object.__setattr__(self, "values", tuple(values))

    def accepts(self, value) -> bool:
        return isinstance(value, str) and value in self.values

    def phrases(self, alone: bool) -> list[str]:
        return [f"one of {list(self.values)}"] if alone else [repr(v) for v in self.values]


@dataclass(frozen=True)
class IntRange:
    """An integer (not a bool) in ``[low, high]``; ``high`` None: no upper end."""

    low: int
    high: int | None = None

    def accepts(self, value) -> bool:
        return is_int(value) and self.low <= value and (self.high is None or value <= self.high)

    def phrases(self, alone: bool) -> list[str]:
        if self.high is None:
            return [f"an int >= {self.low}"]
        return [f"an int in [{self.low}, {self.high}]"]


@dataclass(frozen=True)
class RealRange:
    """A number (not a bool, not NaN) ``>= low`` when ``inclusive``, else ``> low``, and
    ``< below`` where given."""

    low: float
    inclusive: bool = True
    #: an upper end, excluded (None: none)
    below: float | None = None

    def accepts(self, value) -> bool:
        if not is_real(value) or math.isnan(value):
            return False
        if self.below is not None and not value < self.below:
            return False
        return value >= self.low if self.inclusive else value > self.low

    def phrases(self, alone: bool) -> list[str]:
        if self.below is not None:
            opening = "[" if self.inclusive else "("
            return [f"a float in {opening}{self.low}, {self.below})"]
        if self.inclusive:
            return [f"a float >= {self.low}"]
        return ["a positive number" if self.low == 0 else f"a float > {self.low}"]


@dataclass(frozen=True)
class ArrayLike:
    """A list, tuple or ndarray (its values are checked where they are used)."""

    def accepts(self, value) -> bool:
        return isinstance(value, (list, tuple, np.ndarray))

    def phrases(self, alone: bool) -> list[str]:
        return ["an array"]


@dataclass(frozen=True)
class Text:
    """Any string (its content is checked where it is used)."""

    def accepts(self, value) -> bool:
        return isinstance(value, str)

    def phrases(self, alone: bool) -> list[str]:
        return ["a str"]


@dataclass(frozen=True)
class Verbose:
    """An int >= 0 or a bool (scikit-learn's ``"verbose"``)."""

    def accepts(self, value) -> bool:
        return isinstance(value, (bool, np.bool_)) or (is_int(value) and value >= 0)

    def phrases(self, alone: bool) -> list[str]:
        return ["an int >= 0 or a bool"]


@dataclass(frozen=True)
class RandomState:
    """None, a seed in [0, 2**32), or a numpy Generator or RandomState (scikit-learn's
    ``"random_state"`` and ``np.random.Generator``). :meth:`accepts` is what a model
    file can hold: a seed or None."""

    def accepts(self, value) -> bool:
        return value is None or (is_int(value) and 0 <= value < 2**32)

    def phrases(self, alone: bool) -> list[str]:
        return ["an int in [0, 2**32) or None"]


# ----------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class Param:
    """One estimator parameter.

    Attributes
    ----------
    name : str
    default : the ``__init__`` default (also what a model file without it means)
    allowed : tuple of vocabulary rules; a value is allowed when one rule accepts it
    none : whether None is allowed too
    saved : whether model files save it (a parameter a file lacks takes its default)
    """

    name: str
    default: object
    allowed: tuple
    none: bool = False
    saved: bool = True

    def accepts(self, value) -> bool:
        """Whether ``value`` is allowed (for ``RandomState``: as a model file holds it)."""
        return (self.none and value is None) or any(rule.accepts(value) for rule in self.allowed)

    def describe(self) -> str:
        """The allowed values in words, e.g. ``"an int >= 1 or None"``."""
        alone = len(self.allowed) == 1
        words = [w for rule in self.allowed for w in rule.phrases(alone)]
        words += ["None"] if self.none else []
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]

    def check(self, value, estimator: str):
        """``value``, or a ValueError naming the parameter, ``estimator`` and the allowed values."""
        if not self.accepts(value):
            raise ValueError(
                f"the {self.name!r} parameter of {estimator} must be {self.describe()}; "
                f"got {value!r}"
            )
        return value


@dataclass(frozen=True)
class EstimatorSpec:
    """An estimator's class name, whether it predicts class labels, and its parameters
    in ``__init__`` order."""

    name: str
    params: tuple
    classifier: bool = False

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def defaults(self) -> dict:
        """{name: default} in ``__init__`` order."""
        return {p.name: p.default for p in self.params}


def _bandwidth(default: str, names=BANDWIDTH_NAMES) -> Param:
    return Param(
        "bandwidth",
        default,
        (Options(*names), RealRange(0, inclusive=False), ArrayLike()),
    )


def _kernel(*more: str) -> Param:
    return Param("kernel", "gaussian", (Options(*CONTINUOUS_KERNELS, *more),))


#: fixed widths, or R np's nearest-neighbour counts k (:mod:`nbattn.local.neighbours`)
_BANDWIDTH_TYPE = Param("bandwidth_type", "fixed", (Options(*BANDWIDTH_TYPES),))

#: the relative error allowed on every kernel sum (0: exact; the pruned CPU paths)
_RTOL = Param("rtol", 0.0, (RealRange(0.0, below=1.0),))


#: how the columns of X are read (:mod:`nbattn._core.columns`)
_VAR_TYPE = Param("var_type", None, (Text(),), none=True)
_MISSING = Param("missing", "error", (Options("error", "marginalize"),))
_TABLE = (
    _VAR_TYPE,
    _MISSING,
    Param("handle_unknown", "error", (Options("error", "ignore"),)),
)
#: where and how precisely each call runs, and how much it says
_DEVICE = Param("device", "cpu", (Options("cpu", "cuda", "auto"),))
_VERBOSE = Param("verbose", 0, (Verbose(),))
_RUN = (_DEVICE, Param("dtype", "float64", (Options("float64", "float32"),)), _VERBOSE)

#: the estimators that pool targets (regressors, the classifier), class name -> its spec
POOLING_SPECS = {
    spec.name: spec
    for spec in (
        EstimatorSpec(
            "NadarayaWatsonRegressor",
            (
                _bandwidth("scott", REGRESSOR_BANDWIDTH_NAMES),
                _BANDWIDTH_TYPE,
                _kernel("average"),
                _RTOL,
                *_TABLE,
                *_RUN,
            ),
        ),
        EstimatorSpec(
            "LearnedKernelRegressor",
            (
                Param("metric", "diagonal", (Options("scalar", "diagonal", "full"),)),
                Param("n_components", None, (IntRange(1),), none=True),
                Param("init", "scott", (Options("scott", "random"),)),
                Param("max_iter", 200, (IntRange(1),)),
                Param("tol", 1e-6, (RealRange(0),)),
                Param("random_state", None, (RandomState(),)),
                _RTOL,
                *_TABLE,
                *_RUN,
            ),
        ),
        EstimatorSpec(
            "LocalPolynomialRegressor",
            (
                Param("degree", 1, (IntRange(0, 2),)),
                _bandwidth("loo", REGRESSOR_BANDWIDTH_NAMES),
                _BANDWIDTH_TYPE,
                _kernel(),
                _RTOL,
                Param("loo_subsample", None, (IntRange(MIN_SUBSAMPLE_ROWS),), none=True),
                *_TABLE,
                *_RUN,
            ),
        ),
        EstimatorSpec(
            "PartiallyLinearRegressor",
            (
                # the columns of X that enter linearly, by position or name (None: refused
                # at fit; scikit-learn's defaults must be immutable)
                Param("linear_columns", None, (ArrayLike(),), none=True),
                Param("degree", 1, (IntRange(0, 2),)),
                _bandwidth("loo", REGRESSOR_BANDWIDTH_NAMES),
                _kernel(),
                _RTOL,
                Param("loo_subsample", None, (IntRange(MIN_SUBSAMPLE_ROWS),), none=True),
                *_TABLE,
                *_RUN,
            ),
        ),
        EstimatorSpec(
            "NadarayaWatsonClassifier",
            (_bandwidth("scott"), _kernel(), _RTOL, *_TABLE, *_RUN),
            classifier=True,
        ),
    )
}


def _density_bandwidth(default: str) -> Param:
    return Param(
        "bandwidth",
        default,
        (Options(*DENSITY_BANDWIDTH_NAMES), RealRange(0, inclusive=False), ArrayLike()),
    )


#: y's width of a conditional model (None: by the rule or criterion of X's; "cv_cdf": by
#: cross-validation of the conditional CDF, X's widths held)
def _y_bandwidth(default) -> Param:
    return Param("y_bandwidth", default, (Options("cv_cdf"), RealRange(0)), none=True)


_Y_BANDWIDTH = _y_bandwidth(None)
#: what every density estimator takes after its widths
_DENSITY_REST = (_kernel(), _RTOL, _VAR_TYPE, _MISSING, _DEVICE, _VERBOSE)

#: the density estimators (densities, conditional densities, quantiles), class name -> its spec
DENSITY_SPECS = {
    spec.name: spec
    for spec in (
        EstimatorSpec(
            "KernelDensity",
            (_density_bandwidth("normal_reference"), _BANDWIDTH_TYPE, *_DENSITY_REST),
        ),
        EstimatorSpec(
            "ConditionalKernelDensity",
            (
                _density_bandwidth("normal_reference"),
                _Y_BANDWIDTH,
                _BANDWIDTH_TYPE,
                *_DENSITY_REST,
            ),
        ),
        EstimatorSpec(
            "KernelQuantileRegressor",
            (
                Param("quantile", 0.5, (RealRange(0.0, inclusive=False, below=1.0),)),
                _density_bandwidth("cv_ml"),
                _y_bandwidth("cv_cdf"),
                *_DENSITY_REST,
            ),
        ),
    )
}

#: every estimator, class name -> its spec: the one registry that the model files, the
#: Predictor and the command line read
SPECS = {**POOLING_SPECS, **DENSITY_SPECS}
