"""Kernel smoothing on the streaming engine: Nadaraya-Watson pooling and its width
rules (``regression``), the leave-one-out criteria and their gradients (``loo``, with
``loo_rows``, ``tiled_loo`` and ``loo_1d``), the width search (``width_search`` over
``search``) and learned metrics (``learned_metric``)."""
