"""Programmable attention on the GPU: ``flash_attention(_backward)`` with ``score_mod``,
``mask_mod`` or ``block_mask`` and ``device="cuda"`` (or ``"auto"`` where numba sees a
GPU), on host arrays.

The arrays are checked and laid out by ``nbattn.attn.flex`` as for the CPU;
here they, ``mod_args`` and the tile classes go to the device, the kernels of
``nbattn.cuda.flex`` run (the user's functions compiled with
``cuda.jit(device=True)``, kept per process and keyed by
``nbattn.kernels.flex_build.fingerprint``), and the results come back to the
host. A block mask's table is the one it holds for the CPU kernels' tiles: the
GPU reads it at those tiles whatever its own. GPU arrays (numba device
arrays, CuPy, torch CUDA tensors) are refused with these functions, and
``flash_attention_varlen`` and ``flash_decode`` run them on the CPU only.

The user functions are checked first by the CPU's own checks
(``flex_build.check``: the type of what they return; the backward's complex
step against a finite difference of ``score_mod`` at a few scores), so the GPU
refuses what the CPU refuses, with the same messages; a function the CPU cannot
compile (one that calls a CUDA device function) is left to the GPU compiler.
"""

from __future__ import annotations

from ..dispatch.device import device_for, kernels_for
from ..dispatch.transfer import is_device_array, to_host

__all__ = ["backward", "flex_device", "forward"]


def flex_device(device, *arrays) -> str:
    """The device ("cpu" or "cuda") of a flash call with user functions: the flash rule
    (``device_for``) for host arrays; GPU arrays are refused."""
    if any(is_device_array(a) for a in arrays if a is not None):
        raise ValueError(
            "score_mod, mask_mod and block_mask take host (NumPy) arrays, on device='cpu' "
            "or 'cuda'; GPU arrays are not supported with them yet"
        )
    return device_for(device, *arrays)


def _functions(mods, backward, dtype):
    """The user functions, their fingerprints and the CUDA kernel module, after the CPU's
    checks of the functions (``flex_build.check``: the GPU refuses what the CPU refuses,
    with its messages). The fingerprints are in-process keys: an object the functions
    read that has no value to print is keyed by its identity."""
    build = kernels_for("flex", "cpu")
    build.check(mods, dtype, backward)
    gpu = kernels_for("flex", "cuda")
    gpu.adopt_tanh(build.tanh)
    grad = mods.score_grad if backward else None
    functions = (mods.score_mod, mods.mask_mod, grad)
    names = ("score_mod", "mask_mod", "score_mod_grad")
    prints = tuple(
        build.fingerprint(f, n, process=True) for f, n in zip(functions, names, strict=True)
    )
    return gpu, functions, prints


def _blocks(gpu, mods, tiles, n_q, n_k):
    """The tile classes and their cell sizes: the block mask's table at ``tiles``, or
    one cell for the whole problem."""
    if mods.block_mask is not None:
        table = mods.block_mask.table(tiles.block_q, tiles.block_k)
        return table, (tiles.block_q, tiles.block_k)
    return gpu.no_blocks(n_q, n_k, mods.mask_mod is not None)


def forward(lay, tiles, mods):
    """``(out (BH, L, Ev), lse (BH, L))`` on the host from the GPU flex forward of a
    layout of ``nbattn.attn.flex`` (q times the scale, v already scaled)."""
    gpu, functions, prints = _functions(mods, False, lay.dtype)
    n_q, n_k = lay.qf.shape[1], lay.kf.shape[1]
    blocks, cells = _blocks(gpu, mods, tiles, n_q, n_k)
    out, lse = gpu.flex_forward(
        lay.qf, lay.kf, lay.vf, lay.kv_index, lay.n_heads, lay.band, blocks, cells,
        functions, prints, mods.score_args, mods.mask_args,
    )  # fmt: skip
    return to_host(out), to_host(lse)


def backward(lay, of, lf, gf, tiles, mods):
    """``(dq, dk, dv)`` flat, on the host, from the GPU flex backward (``lf`` the
    forward's lse (BH, L) float64)."""
    gpu, functions, prints = _functions(mods, True, lay.dtype)
    n_q, n_k = lay.qf.shape[1], lay.kf.shape[1]
    blocks, cells = _blocks(gpu, mods, tiles, n_q, n_k)
    grads = gpu.flex_backward(
        lay.qf, lay.kf, lay.vf, of, lf, gf, lay.kv_index, lay.n_heads, lay.band, blocks,
        cells, functions, prints, mods.score_args, mods.mask_args, lay.scale,
    )  # fmt: skip
    return tuple(to_host(g) for g in grads)
