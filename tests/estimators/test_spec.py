"""The parameter spec (nbattn.estimators.spec) and what is derived from it: the estimators'
signatures and ``__init__`` bodies, the words of the scikit-learn-free checks, the
names other layers share with it."""

import inspect

import pytest

import nbattn
from nbattn._core import columns
from nbattn.estimators import base, spec
from nbattn.local import engine
from nbattn.smoothing import regression


def test_bandwidth_names_are_the_rules_and_loo():
    assert set(spec.BANDWIDTH_NAMES) == set(regression.BANDWIDTH_RULES) | {"loo", "loo_scale"}


def test_the_engine_reads_the_kernel_names_and_column_kinds_of_columns():
    assert engine.KERNELS is columns.CONTINUOUS_KERNELS
    assert engine.check_var_type is columns.check_var_type


@pytest.mark.parametrize(
    ("var_type", "n", "match"),
    [
        (None, 3, None),
        ("cuo", 3, None),
        (3, 3, "must be a string"),
        ("cxo", 3, "var_type letter 1 holds 'x'"),
        ("cu", 3, "var_type has 2 letters but X has 3 columns"),
    ],
)
def test_check_var_type(var_type, n, match):
    if match is None:
        assert columns.check_var_type(var_type, n) == (var_type or "c" * n)
    else:
        with pytest.raises(ValueError, match=match):
            columns.check_var_type(var_type, n)


@pytest.mark.parametrize("name", sorted(spec.SPECS))
def test_init_takes_and_stores_the_spec_parameters(name):
    cls = getattr(nbattn, name)
    signature = inspect.signature(cls.__init__)
    got = [(p.name, p.default) for p in list(signature.parameters.values())[1:]]
    assert got == list(spec.SPECS[name].defaults().items())
    values = {p.name: object() for p in spec.SPECS[name].params}
    assert vars(cls(**values)) == values


def test_a_class_whose_signature_is_not_its_spec_is_refused():
    with pytest.raises(TypeError, match="its spec says"):

        class NadarayaWatsonRegressor(base._PoolingEstimator):
            def __init__(self, bandwidth="silverman"):
                self._set_params_from(locals())


@pytest.mark.parametrize(
    ("estimator", "parameter", "words"),
    [
        (
            "NadarayaWatsonRegressor",
            "bandwidth",
            "'scott', 'silverman', 'loo', 'loo_scale', 'aicc', a positive number or an array",
        ),
        (
            "NadarayaWatsonRegressor",
            "kernel",
            "one of ['gaussian', 'epanechnikov', 'tricube', 'average']",
        ),
        ("NadarayaWatsonRegressor", "var_type", "a str or None"),
        ("NadarayaWatsonRegressor", "verbose", "an int >= 0 or a bool"),
        ("LearnedKernelRegressor", "n_components", "an int >= 1 or None"),
        ("LearnedKernelRegressor", "tol", "a float >= 0"),
        ("LearnedKernelRegressor", "random_state", "an int in [0, 2**32) or None"),
        ("LocalPolynomialRegressor", "degree", "an int in [0, 2]"),
    ],
)
def test_allowed_values_in_words(estimator, parameter, words):
    param = spec.SPECS[estimator].param(parameter)
    assert param.describe() == words
    with pytest.raises(ValueError) as error:
        param.check(-1.5, estimator)
    assert (
        str(error.value) == f"the {parameter!r} parameter of {estimator} must be {words}; got -1.5"
    )
