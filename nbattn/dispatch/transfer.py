"""Every move of data between the host and the GPU, and the checks of arrays already there.

The one place above ``nbattn.cuda`` that touches ``numba.cuda``: the
functional layers call these helpers and never import numba-cuda themselves,
so ``import nbattn`` needs no GPU and no numba-cuda.
"""

from __future__ import annotations

import numpy as np


def to_host(*arrays):
    """Each array on the host: GPU twins return device arrays, the CPU kernels ndarrays.

    One array in, one out; several in, a tuple out.
    """
    out = tuple(a.copy_to_host() if hasattr(a, "copy_to_host") else a for a in arrays)
    return out[0] if len(out) == 1 else out


def to_device(*arrays):
    """Each host array copied to the GPU (numba device arrays); one in, one out."""
    from numba import cuda

    out = tuple(cuda.to_device(a) for a in arrays)
    return out[0] if len(out) == 1 else out


def multiprocessors() -> int:
    """The GPU's number of streaming multiprocessors (what split-KV work is dealt to)."""
    from ..cuda.common import multiprocessors as count

    return count()


def is_device_array(x) -> bool:
    """True for GPU arrays: ``__cuda_array_interface__`` (numba, CuPy, torch CUDA
    tensors) or the CUDA simulator's device arrays."""
    if x is None or type(x).__module__.startswith("numpy"):
        return False
    try:
        if hasattr(x, "__cuda_array_interface__"):
            return True
    except RuntimeError:  # torch raises for a CUDA tensor that requires grad
        return True
    return type(x).__name__ in ("DeviceNDArray", "FakeCUDAArray")


def as_numba_device_array(x):
    """A numba device view of a GPU array (no copy); host arrays are copied to the GPU."""
    from numba import cuda

    if not is_device_array(x):
        import numpy as np

        return cuda.to_device(np.ascontiguousarray(x))
    if hasattr(x, "__cuda_array_interface__") and type(x).__name__ != "DeviceNDArray":
        return cuda.as_cuda_array(x)
    return x


def like_input(result, template):
    """``result`` (a numba device array) as the kind of GPU array ``template`` is:
    a torch tensor for torch input, a CuPy array for CuPy input, else numba's."""
    module = type(template).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.as_tensor(result, device=template.device)
    if module == "cupy":
        import cupy

        return cupy.asarray(result)
    return result


def as_device_array(
    x,
    name: str,
    ndim: tuple[int, ...] | None = None,
    *,
    min_ndim: int = 0,
    allow_neg_inf: bool = False,
    contiguous: bool = False,
):
    """A numba view of a GPU array (host arrays are copied to the GPU), checked on the device.

    The twin of :func:`as_float_array` for ``__cuda_array_interface__`` arrays
    (numba device arrays, CuPy, torch CUDA tensors): float32 or float64, the
    allowed dimensions, non-empty, C-contiguous when asked, and free of NaN
    and inf (found by a device kernel; only a count comes back). The same
    error wording, without the index of the first bad entry.
    """
    from ..cuda import layout
    from ..dispatch.transfer import as_numba_device_array

    arr = as_numba_device_array(x)
    shape = tuple(arr.shape)
    if ndim is not None and len(shape) not in ndim:
        want = " or ".join(f"{n}-D" for n in ndim)
        raise ValueError(f"{name} must be {want}, got an array of shape {shape}")
    if len(shape) < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions, got an array of shape {shape}"
        )
    if arr.size == 0:
        raise ValueError(f"{name} is empty (shape {shape})")
    if np.dtype(arr.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"{name} must be float32 or float64 on the GPU, got dtype {arr.dtype}")
    if contiguous and not arr.is_c_contiguous():
        raise ValueError(f"{name} must be C-contiguous on the GPU")
    if layout.count_nonfinite(arr.reshape(arr.size, 1), allow_neg_inf):
        raise ValueError(f"{name} contains {'NaN or +inf' if allow_neg_inf else 'NaN or inf'}")
    return arr
