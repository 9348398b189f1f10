"""Kernel smoothing on the streaming engine: Nadaraya-Watson pooling and its width
rules, the leave-one-out criteria and their gradients, the width search, learned metrics."""
