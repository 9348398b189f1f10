"""nbattn: Numba-accelerated attention pooling and kernel regression."""

from .estimators import NadarayaWatsonRegressor
from .flash import flash_attention, flash_attention_backward
from .regression import average_pooling, nadaraya_watson

__version__ = "0.1.0"

__all__ = [
    "NadarayaWatsonRegressor",
    "__version__",
    "average_pooling",
    "flash_attention",
    "flash_attention_backward",
    "nadaraya_watson",
]
