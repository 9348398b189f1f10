"""Which device runs a computation: "cpu", "cuda" or "auto"."""

from __future__ import annotations

_DEVICES = ("cpu", "cuda", "auto")


def cuda_available() -> bool:
    """True when numba can see a usable CUDA GPU (never raises)."""
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

    Only the CPU kernels exist so far: "cuda" raises a ValueError saying so,
    and "auto" runs on the CPU.
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
    if device == "cuda":
        raise ValueError(
            "device='cuda' is not available: nbattn's CUDA kernels are not built yet "
            "(use device='cpu' or 'auto')"
        )
    return "cpu"
