"""The scikit-learn estimators, built on the functional layers (they never write numba).

``spec`` (every estimator's parameters, written once), ``base`` (input checks,
the shared base and fit path, ``check_fitted_state``), ``widths`` (the widths
resolved at fit), ``regressors``, ``classifier``, ``density`` (KernelDensity);
``fitted_state`` (the checks of a fitted model's content) and ``prediction`` (the one prediction
computation) are scikit-learn-free: ``nbattn predict`` uses them. The names
below are loaded on first use, so importing this package loads nothing.
"""

from __future__ import annotations

import importlib

#: public name -> the module of this package that defines it
_HOMES = {
    "ConditionalKernelDensity": "conditional",
    "KernelDensity": "density",
    "KernelQuantileRegressor": "conditional",
    "LearnedKernelRegressor": "regressors",
    "LocalPolynomialRegressor": "regressors",
    "NadarayaWatsonClassifier": "classifier",
    "NadarayaWatsonRegressor": "regressors",
    "PartiallyLinearRegressor": "partially_linear",
    "check_fitted_state": "base",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is not None:
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
