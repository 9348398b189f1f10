"""The scikit-learn estimators, built on the functional layers (they never write numba).

The names are loaded on first use, so ``nbattn.estimators.spec`` and
``nbattn.estimators.prediction`` (scikit-learn-free; ``nbattn predict`` uses
them) import without scikit-learn.
"""

from __future__ import annotations

import importlib

__all__ = [
    "LearnedKernelRegressor",
    "LocalPolynomialRegressor",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "check_fitted_state",
]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module(f"{__name__}.estimators"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
