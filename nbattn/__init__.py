"""nbattn: Numba-accelerated attention pooling and kernel regression."""

from .estimators import NadarayaWatsonRegressor
from .io import load, save
from .regression import average_pooling, nadaraya_watson

__version__ = "0.1.0"

__all__ = [
    "NadarayaWatsonRegressor",
    "__version__",
    "average_pooling",
    "load",
    "nadaraya_watson",
    "save",
]
