"""Which device runs a computation: "cpu", "cuda" or "auto"."""

from __future__ import annotations

_DEVICES = ("cpu", "cuda", "auto")


def cuda_available() -> bool:
    """True when numba can see a usable CUDA GPU, or runs the CUDA simulator (never raises)."""
    try:
        from numba import cuda
    except Exception:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def resolve_device(device: str) -> str:
    """Map a requested device to the one that runs: "auto" picks CUDA when a GPU is there.

    "cuda" without a usable GPU raises a ValueError that says what is missing.
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
    if device == "cpu":
        return "cpu"
    if cuda_available():
        return "cuda"
    if device == "auto":
        return "cpu"
    raise ValueError(
        "device='cuda' needs a CUDA GPU with its driver and numba-cuda "
        "(pip install 'nbattn[cuda]'); numba found no usable GPU here. "
        "Use device='cpu' or device='auto'."
    )


def pooling_kernels(device: str):
    """The module holding ``gaussian_pool`` for a resolved device."""
    if device == "cuda":
        from .cuda import pooling

        return pooling
    from .kernels import pooling

    return pooling
