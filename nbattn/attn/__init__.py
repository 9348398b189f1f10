"""Attention mechanisms as functions: scores, softmax, positional encodings, flash
attention (packed and decoding), and the layers. Knows nothing of the estimators."""
