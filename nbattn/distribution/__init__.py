"""Distributions on the one engine: kernel densities and joint distribution functions of
mixed data (``density``), their widths by leave-one-out likelihood (``density_widths``).

A density is the normaliser of attention pooling: the softmax's denominator over the
training rows, divided by the kernel's constants. It runs on the mixed-type engine of
:mod:`nbattn.local` (every column kind, sample weights, ``rtol``, the GPU).
"""
