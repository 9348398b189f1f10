"""nbattn: Numba-accelerated attention pooling and kernel regression."""

from .estimators import LearnedKernelRegressor, NadarayaWatsonClassifier, NadarayaWatsonRegressor
from .flash import flash_attention, flash_attention_backward
from .io import load, save
from .learning import loo_bandwidth, loo_loss, loo_loss_and_grad
from .regression import average_pooling, nadaraya_watson

__version__ = "0.1.0"

__all__ = [
    "LearnedKernelRegressor",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "__version__",
    "average_pooling",
    "flash_attention",
    "flash_attention_backward",
    "load",
    "loo_bandwidth",
    "loo_loss",
    "loo_loss_and_grad",
    "nadaraya_watson",
    "save",
]
