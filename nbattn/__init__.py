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
from .estimators import NadarayaWatsonRegressor
from .layers import MultiHeadAttention, SelfAttention
from .regression import average_pooling, nadaraya_watson

__version__ = "0.1.0"

__all__ = [
    "MultiHeadAttention",
    "NadarayaWatsonRegressor",
    "SelfAttention",
    "__version__",
    "attention",
    "average_pooling",
    "hierarchical_attention",
    "log_softmax",
    "masked_softmax",
    "multi_head_attention",
    "nadaraya_watson",
    "positional",
    "scores",
    "softmax",
]
