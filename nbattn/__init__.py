"""nbattn: Numba-accelerated attention pooling and kernel regression."""

from . import positional, scores
from .attention import (
    attention,
    hierarchical_attention,
    log_softmax,
    masked_softmax,
    multi_head_attention,
    softmax,
)
from .estimators import LearnedKernelRegressor, NadarayaWatsonClassifier, NadarayaWatsonRegressor
from .flash import flash_attention, flash_attention_backward
from .io import load, save
from .layers import MultiHeadAttention, SelfAttention
from .learning import loo_bandwidth, loo_loss, loo_loss_and_grad
from .regression import average_pooling, nadaraya_watson

__version__ = "0.1.0"

__all__ = [
    "LearnedKernelRegressor",
    "MultiHeadAttention",
    "NadarayaWatsonClassifier",
    "NadarayaWatsonRegressor",
    "SelfAttention",
    "__version__",
    "attention",
    "average_pooling",
    "flash_attention",
    "flash_attention_backward",
    "hierarchical_attention",
    "load",
    "log_softmax",
    "loo_bandwidth",
    "loo_loss",
    "loo_loss_and_grad",
    "masked_softmax",
    "multi_head_attention",
    "nadaraya_watson",
    "positional",
    "save",
    "scores",
    "softmax",
]
