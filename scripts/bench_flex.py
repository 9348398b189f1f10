"""Programmable attention (score_mod / mask_mod / block masks) against torch, one run.

    NUMBA_NUM_THREADS=2 python scripts/bench_flex.py [--n 2048] [--heads 8]

At B1 H8 N D64 float32, on the threads numba is given (torch gets as many):

* forward, causal + tanh softcap: nbattn (score_mod with ``nbattn.flex_tanh`` +
  block mask: float32 arithmetic, as torch's; also with an ``np.float64`` constant
  (float64 arithmetic), ``np.tanh`` and the ``softcap=`` keyword) vs torch's
  compiled ``flex_attention`` (``torch.compile``; skipped if that fails) and
  ``scaled_dot_product_attention`` (causal, no softcap);
* forward, score_mods without a transcendental function (ALiBi, a relative
  position bias table), no mask, vs torch's compiled ``flex_attention``;
* document mask (8 documents): nbattn with a block mask vs nbattn's own dense
  boolean mask (``flash_attention(mask=...)``);
* forward + backward with an ALiBi score_mod (complex-step derivative) vs SDPA
  forward + backward with the equivalent dense float mask;
* packed sequences (4 of N/4, causal + the flex_tanh softcap score_mod):
  ``flash_attention_varlen`` vs ``flash_attention`` on the padded batch, same
  functions; and one decoding step (1 query over N cached keys) with the
  softcap as a score_mod vs the ``softcap=`` keyword of ``flash_decode``;
* compile time of a new score_mod specialisation (forward; forward + backward),
  each in a fresh process with an empty flex cache directory.

Each time is the best of 10 calls. Ratios are measured in the same run; absolute times
drift on a shared machine (torch's compiled flex_attention varied from 86 to 170 ms per
call between runs here).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

import nbattn


def softcap(score, b, h, q_idx, kv_idx):
    return 30.0 * nbattn.flex_tanh(score / 30.0)


#: The same softcap with a float64 constant: float64 arithmetic, rounded to float32 (a
#: Python float's constant is float32 in a float32 call, as in torch)
CAP64 = np.float64(30.0)


def softcap64(score, b, h, q_idx, kv_idx):
    return CAP64 * nbattn.flex_tanh(score / CAP64)


def softcap_libm(score, b, h, q_idx, kv_idx):
    return 30.0 * np.tanh(score / 30.0)


def relative_bias(score, b, h, q_idx, kv_idx, table):
    return score + table[h, kv_idx - q_idx + table.shape[1] // 2]


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def same_document(b, h, q_idx, kv_idx, doc):
    return doc[q_idx] == doc[kv_idx]


def alibi(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * (kv_idx - q_idx)


def best(fn, repeat=10):
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def packed_and_decode(q, k, v):
    """The varlen and decoding paths with the softcap score_mod, against their peers in
    nbattn (q, k, v of shape (1, H, N, D))."""
    _, h, n, d = q.shape
    n_seq = 4
    length = n // n_seq
    cu = np.arange(n_seq + 1) * length
    packed = [a[0, :, : n_seq * length] for a in (q, k, v)]
    padded = [np.ascontiguousarray(a.reshape(h, n_seq, length, d).swapaxes(0, 1)) for a in packed]
    varlen = best(
        lambda: nbattn.flash_attention_varlen(*packed, cu, cu, causal=True, score_mod=softcap)
    )
    pad = best(lambda: nbattn.flash_attention(*padded, causal=True, score_mod=softcap))
    print(
        f"packed sequences ({n_seq} of {length}), causal + softcap score_mod: "
        f"flash_attention_varlen {varlen * 1e3:.1f} ms, padded flash_attention "
        f"{pad * 1e3:.1f} ms: varlen {pad / varlen:.2f}x"
    )
    k_cache, v_cache = np.ascontiguousarray(k), np.ascontiguousarray(v)
    lengths = np.array([n])
    step = (q[:, :, -1:], k_cache, v_cache, lengths)
    mod = best(lambda: nbattn.flash_decode(*step, score_mod=softcap))
    keyword = best(lambda: nbattn.flash_decode(*step, softcap=30.0))
    print(
        f"decoding step (1 query, {n} cached keys, H{h}), softcap: score_mod "
        f"{mod * 1e3:.2f} ms, softcap= keyword {keyword * 1e3:.2f} ms: score_mod "
        f"{keyword / mod:.2f}x"
    )


_COMPILE = textwrap.dedent(
    """
    import time, numpy as np, nbattn
    def score(score, b, h, q_idx, kv_idx, slopes):
        return score + slopes[h] * (kv_idx - q_idx) + {salt}
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 256, 64)).astype(np.float32) for _ in range(3))
    slopes = np.array([0.5, 0.25])
    t = time.perf_counter()
    out, lse = nbattn.flash_attention(q, k, v, score_mod=score, mod_args=(slopes,), return_lse=True)
    fwd = time.perf_counter() - t
    if {backward}:
        nbattn.flash_attention_backward(q, k, v, out, lse, out, score_mod=score, mod_args=(slopes,))
    print(fwd, time.perf_counter() - t)
    """
)


def compile_seconds(backward, cache_dir=None):
    """(forward, total) seconds of a first call in a fresh process."""
    env = dict(os.environ)
    env["NBATTN_FLEX_DIR"] = cache_dir or tempfile.mkdtemp(prefix="bench_flex_")
    env["NBATTN_QUIET"] = "1"
    code = _COMPILE.format(salt=0.0, backward=backward)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    fwd, total = map(float, result.stdout.split()[-2:])
    return fwd, total, env["NBATTN_FLEX_DIR"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--skip-compile", action="store_true")
    ns = parser.parse_args()
    import numba
    import torch
    import torch.nn.functional as F

    threads = numba.get_num_threads()
    torch.set_num_threads(threads)
    n, h, d = ns.n, ns.heads, 64
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, h, n, d)).astype(np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    print(f"B1 H{h} N{n} D{d} float32, {threads} threads (numba and torch)")

    # ---------------------------------------------------------------- causal + softcap
    bm = nbattn.create_block_mask(causal, None, None, n, n)
    nb_fwd = best(lambda: nbattn.flash_attention(q, k, v, score_mod=softcap, block_mask=bm))
    nb_64 = best(lambda: nbattn.flash_attention(q, k, v, score_mod=softcap64, block_mask=bm))
    nb_libm = best(lambda: nbattn.flash_attention(q, k, v, score_mod=softcap_libm, block_mask=bm))
    nb_kw = best(lambda: nbattn.flash_attention(q, k, v, causal=True, softcap=30.0))
    sdpa = best(lambda: F.scaled_dot_product_attention(tq, tk, tv, is_causal=True))
    print(
        f"forward causal+softcap: nbattn {nb_fwd * 1e3:.1f} ms (flex_tanh; float64 constant "
        f"{nb_64 * 1e3:.1f} ms; np.tanh "
        f"{nb_libm * 1e3:.1f} ms; softcap= keyword {nb_kw * 1e3:.1f} ms); torch SDPA causal "
        f"(no softcap) {sdpa * 1e3:.1f} ms ({sdpa / nb_fwd:.2f}x)"
    )
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        def t_softcap(score, b, hh, qi, ki):
            return 30.0 * torch.tanh(score / 30.0)

        def t_causal(b, hh, qi, ki):
            return qi >= ki

        tbm = create_block_mask(t_causal, None, None, n, n, device="cpu")
        compiled = torch.compile(flex_attention)
        t = time.perf_counter()
        compiled(tq, tk, tv, score_mod=t_softcap, block_mask=tbm)
        first = time.perf_counter() - t
        flex = best(lambda: compiled(tq, tk, tv, score_mod=t_softcap, block_mask=tbm))
        print(
            f"  torch compiled flex_attention {flex * 1e3:.1f} ms (first call {first:.0f} s): "
            f"nbattn {flex / nb_fwd:.2f}x (target >= 2)"
        )
        # score_mods without a transcendental function: ALiBi, a relative-position table
        # the same float32 arrays for both
        slopes = (2.0 ** -np.arange(1, h + 1)).astype(np.float32)
        table = rng.standard_normal((h, 2 * n + 1)).astype(np.float32)
        t_slopes, t_table = torch.from_numpy(slopes), torch.from_numpy(table)

        def t_alibi(score, b, hh, qi, ki):
            return score + t_slopes[hh] * (ki - qi)

        def t_bias(score, b, hh, qi, ki):
            return score + t_table[hh, ki - qi + n]

        for name, fn, args, t_fn in (
            ("ALiBi", alibi, (slopes,), t_alibi),
            ("relative bias table", relative_bias, (table,), t_bias),
        ):
            mine = best(
                lambda fn=fn, args=args: nbattn.flash_attention(
                    q, k, v, score_mod=fn, mod_args=args
                )
            )
            compiled(tq, tk, tv, score_mod=t_fn)
            theirs = best(lambda t_fn=t_fn: compiled(tq, tk, tv, score_mod=t_fn))
            print(
                f"forward {name} (no mask): nbattn {mine * 1e3:.1f} ms, torch compiled "
                f"flex_attention {theirs * 1e3:.1f} ms: nbattn {theirs / mine:.2f}x"
            )
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        print(f"  torch compiled flex_attention failed: {type(exc).__name__}: {exc}"[:300])

    # ---------------------------------------------------------------- document mask
    doc = np.repeat(np.arange(8), -(-n // 8))[:n].astype(np.int64)
    dense = doc[:, None] == doc[None, :]
    doc_bm = nbattn.create_block_mask(same_document, None, None, n, n, mod_args=(doc,))
    blocked = best(lambda: nbattn.flash_attention(q, k, v, block_mask=doc_bm))
    dense_t = best(lambda: nbattn.flash_attention(q, k, v, mask=dense))
    t = time.perf_counter()
    nbattn.create_block_mask(same_document, None, None, n, n, mod_args=(doc,))
    make = time.perf_counter() - t
    print(
        f"document mask (8 docs): block mask {blocked * 1e3:.1f} ms, dense bool mask "
        f"{dense_t * 1e3:.1f} ms: {dense_t / blocked:.2f}x (target >= 4); "
        f"create_block_mask {make * 1e3:.1f} ms"
    )

    # ---------------------------------------------------------------- forward + backward
    slopes = 2.0 ** -np.arange(1, h + 1)
    g = rng.standard_normal(q.shape).astype(np.float32)

    def nb_step():
        out, lse = nbattn.flash_attention(
            q, k, v, score_mod=alibi, mod_args=(slopes,), return_lse=True
        )
        nbattn.flash_attention_backward(q, k, v, out, lse, g, score_mod=alibi, mod_args=(slopes,))

    pos = np.arange(n)
    bias = torch.from_numpy(
        (slopes[:, None, None] * (pos[None, :] - pos[:, None])).astype(np.float32)
    )
    tg = torch.from_numpy(g)

    def torch_step():
        a, b_, c = (x.clone().requires_grad_() for x in (tq, tk, tv))
        F.scaled_dot_product_attention(a, b_, c, attn_mask=bias).backward(tg)

    nb_fb = best(nb_step, 3)
    t_fb = best(torch_step, 3)
    print(
        f"forward+backward ALiBi score_mod: nbattn {nb_fb * 1e3:.0f} ms, SDPA with the dense "
        f"float mask {t_fb * 1e3:.0f} ms: {t_fb / nb_fb:.2f}x (target >= 1)"
    )

    # ---------------------------------------------------------------- varlen and decoding
    packed_and_decode(q, k, v)

    # ---------------------------------------------------------------- compile time
    if not ns.skip_compile:
        fwd, _, _ = compile_seconds(False)
        fwd_b, total, cache_dir = compile_seconds(True)
        _, again, _ = compile_seconds(True, cache_dir)
        print(
            f"new score_mod, fresh process, empty flex cache: forward {fwd:.1f} s "
            f"(target <= 5), forward+backward {total:.1f} s (target <= 15); a second "
            f"process with the cache: {again:.2f} s"
        )


if __name__ == "__main__":
    main()
