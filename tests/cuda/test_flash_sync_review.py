"""Every thread of a block reaches the flash kernels' barriers alike (simulator).

On hardware a ``syncthreads``/``syncthreads_or`` reached by only some threads of a
block (or a different number of times, or one thread at ``syncthreads`` while
another is at ``syncthreads_or``) is undefined and usually hangs. The simulator
hides it: it releases a barrier once every *running* thread waits at *some*
barrier. Here each thread's sequence of barriers is recorded and compared within
each block, at the launch geometry of the H200 bench's first ``features`` check
(boolean key padding + GQA: 32 threads per block, a partial last row block and a
partial last key tile; its tiles of 64 keys shortened to 16), with key tiles closed
for the whole block and, per row, rows without any key. Putting one of the forward's
barriers under ``if active:`` fails it.
"""

import threading

import numpy as np
import pytest
from numba.cuda.simulator import kernel as sim_kernel

import nbattn
from nbattn import config
from nbattn.cuda import common
from nbattn.cuda import flash as cuda_flash


@pytest.fixture
def barriers(monkeypatch):
    """{(kernel, block): {thread: [barrier kinds in order]}} of the launches in the test."""
    seen = {}
    current = {"kernel": None}
    lock = threading.Lock()
    plain = sim_kernel.BlockThread.syncthreads
    reduce_or = sim_kernel.BlockThread.syncthreads_or

    def record(thread, kind):
        key = (current["kernel"], tuple(thread.blockIdx))
        with lock:
            seen.setdefault(key, {}).setdefault(tuple(thread.threadIdx), []).append(kind)

    def syncthreads(self):
        if not getattr(self, "_in_or", False):
            record(self, "sync")
        return plain(self)

    def syncthreads_or(self, value):
        record(self, "or")
        self._in_or = True  # its two inner barriers are part of it
        try:
            return reduce_or(self, value)
        finally:
            self._in_or = False

    monkeypatch.setattr(sim_kernel.BlockThread, "syncthreads", syncthreads)
    monkeypatch.setattr(sim_kernel.BlockThread, "syncthreads_or", syncthreads_or)
    launch = cuda_flash.launch

    def labelled(kernel, *args, **kwargs):
        name = getattr(kernel, "__name__", None) or repr(kernel)
        current["kernel"] = f"launch {len({key[0] for key in seen})} {name}"
        return launch(kernel, *args, **kwargs)

    monkeypatch.setattr(cuda_flash, "launch", labelled)
    return seen


@pytest.fixture
def h200_geometry(monkeypatch):
    """threads_for as on an H200 (132 SMs, 128 threads per block) for the bench's
    shapes: 32 threads per block. Key tiles of 16 rows at D = 4 (the bench's were 64
    rows at D = 64): what the barriers depend on is the tiles' count, a partial last
    one and tiles closed for a whole block, not their length, and the simulator runs
    every thread in Python."""
    monkeypatch.setattr(config, "CUDA_THREADS_PER_BLOCK", 128)
    monkeypatch.setattr(config, "CUDA_SHARED_MEMORY_BYTES", 16 * 8 * 4)  # 16 rows of K, V
    monkeypatch.setattr(common, "multiprocessors", lambda: 132)


def _assert_uniform(barriers):
    assert barriers, "no barrier was recorded"
    for (kernel, block), threads in barriers.items():
        sequences = {tuple(kinds) for kinds in threads.values()}
        assert len(sequences) == 1, f"{kernel} block {block}: threads reach different barriers"


@pytest.mark.parametrize("per_row", [False, True])
def test_masked_gqa_barriers_are_block_uniform(rng, barriers, h200_geometry, per_row):
    heads, kv_heads, n_q, n_k, dim = 2, 1, 40, 40, 4
    assert common.threads_for(n_q, heads) == 32
    assert common.tile_rows(2 * dim, 4) == 16  # tiles of 16, 16 and 8 keys
    q = rng.normal(size=(heads, n_q, dim)).astype(np.float32)
    k = rng.normal(size=(kv_heads, n_k, dim)).astype(np.float32)
    v = rng.normal(size=(kv_heads, n_k, dim)).astype(np.float32)
    g = rng.normal(size=(heads, n_q, dim)).astype(np.float32)
    if per_row:  # rows differ: some rows without keys, tiles open for some rows only
        mask = rng.random((n_q, n_k)) > 0.2
        mask[:, 16:32] &= (np.arange(n_q) % 3 == 0)[:, None]
        mask[5] = False
        mask[33] = False
    else:  # the bench's key padding, with the middle key tile closed for every row
        mask = (rng.random(n_k) > 0.2)[None, :]
        mask[:, 16:32] = False
    kw = dict(mask=mask, enable_gqa=True)
    out, lse = nbattn.flash_attention(q, k, v, return_lse=True, device="cuda", **kw)
    ref_out, ref_lse = nbattn.flash_attention(q, k, v, return_lse=True, **kw)
    np.testing.assert_allclose(out, ref_out, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)
    grads = nbattn.flash_attention_backward(q, k, v, out, lse, g, device="cuda", **kw)
    refs = nbattn.flash_attention_backward(q, k, v, ref_out, ref_lse, g, **kw)
    for got, ref in zip(grads, refs, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    kernels = {kernel for kernel, _ in barriers}
    assert len(kernels) == 4, kernels  # forward, dq, dv, dk
    _assert_uniform(barriers)
