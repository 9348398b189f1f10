"""A tour of the attention chapter, in the text's order, on small examples.

Usage: python scripts/attention_tour.py OUTDIR

Each step prints what it computes and saves its attention maps to OUTDIR:

1. scoring functions (additive, dot, scaled dot, bilinear, low-rank bilinear,
   Gaussian) on the same queries and keys          -> 01_scoring_functions.png
2. soft attention and the two forms of hard attention
   (arg-max key, a key sampled from alpha)          -> 02_soft_hard_sample.png
3. key-value attention; K = V is plain soft attention (printed check)
4. multi-head attention, one map per head           -> 03_multi_head.png
5. structured (hierarchical) attention: words -> sentences -> document
                                                     -> 04_hierarchical.png
6. self-attention, plain and causal                 -> 05_self_attention.png
7. self-attention ignores positions; absolute (sinusoidal) and relative (RoPE,
   ALiBi, clipped relative bias) encodings restore them
                                                     -> 06_positional_encodings.png,
                                                        07_positions_in_self_attention.png
8. causal self-attention as a (toy) language model: greedy decoding with a
   key/value cache, one token per step, checked against the full forward
   (printed check)
9. a torch model trained end to end through nbattn.torch.flash_attention with
   ALiBi written as a score_mod: the loss going down (printed; skipped without
   torch)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import nbattn
from nbattn.app.plotting import pyplot, show_heatmaps
from nbattn.attn import positional


def step(title):
    print(f"\n== {title}")


def main(outdir):
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    saved = []

    # 1. scoring functions --------------------------------------------------------------
    step("1. scoring functions s(x, q) and the attention distribution alpha = softmax(s)")
    L, S, D, hidden = 6, 10, 4, 8
    q = rng.normal(size=(L, D))
    k = rng.normal(size=(S, D))
    W, U, a = rng.normal(size=(hidden, D)), rng.normal(size=(hidden, D)), rng.normal(size=hidden)
    Wb = rng.normal(size=(D, D))
    Ul, Vl = rng.normal(size=(2, D)), rng.normal(size=(2, D))
    score_maps = {
        "additive": nbattn.scores.additive(q, k, W, U, a),
        "dot": nbattn.scores.dot(q, k),
        "scaled dot": nbattn.scores.scaled_dot(q, k),
        "bilinear": nbattn.scores.bilinear(q, k, Wb),
        "low-rank (Ux)ᵀ(Vq)": nbattn.scores.bilinear(q, k, U=Ul, V=Vl),
        "gaussian h=1": nbattn.scores.gaussian(q, k, 1.0),
    }
    alphas = np.stack([nbattn.softmax(s) for s in score_maps.values()])
    for name, s in score_maps.items():
        print(f"   {name:20s} scores in [{s.min():7.2f}, {s.max():7.2f}]")
    saved.append(
        show_heatmaps(
            alphas[None], "keys", "queries", list(score_maps), path=out / "01_scoring_functions.png"
        )
    )

    # 2. soft and hard attention ------------------------------------------------------------
    step("2. soft attention (weighted average) and hard attention (arg-max / sampled key)")
    v = rng.normal(size=(S, 3))
    maps, outs = [], {}
    for mode in ("soft", "hard", "sample"):
        o, w = nbattn.attention(q, k, v, mode=mode, random_state=1, return_weights=True)
        maps.append(w)
        outs[mode] = o
    print("   query 0 output:", {m: np.round(o[0], 3).tolist() for m, o in outs.items()})
    saved.append(
        show_heatmaps(
            np.stack(maps)[None],
            "keys",
            "queries",
            ["soft α", "hard: arg-max", "hard: sampled"],
            path=out / "02_soft_hard_sample.png",
        )
    )

    # 3. key-value attention ------------------------------------------------------------
    step("3. key-value attention; with K = V it is plain soft attention over the inputs")
    x = rng.normal(size=(S, D))
    kv = nbattn.attention(q, x, x)
    direct = nbattn.softmax(nbattn.scores.scaled_dot(q, x)) @ x
    print(f"   max |att((X, X), q) - softmax(s(X, q)) X| = {np.abs(kv - direct).max():.2e}")

    # 4. multi-head ------------------------------------------------------------------------
    step("4. multi-head attention: 4 heads pick different parts of the input")
    mha = nbattn.MultiHeadAttention(16, 4, random_state=2)
    seq = rng.normal(size=(8, 16))
    o, w = mha(seq, seq, seq, average_attn_weights=False)
    print(f"   output {o.shape}, per-head weights {w.shape}")
    saved.append(
        show_heatmaps(
            w[None],
            "keys",
            "queries",
            [f"head {h}" for h in range(4)],
            path=out / "03_multi_head.png",
        )
    )

    # 5. structured attention ------------------------------------------------------------
    step("5. structured attention: words -> sentences -> document")
    sentence_of_word = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    words = rng.normal(size=(len(sentence_of_word), D))
    res = nbattn.hierarchical_attention(
        words, sentence_of_word, rng.normal(size=D), rng.normal(size=D)
    )
    print("   word weights within sentences:", np.round(res.item_weights, 3).tolist())
    print("   sentence weights:", np.round(res.segment_weights, 3).tolist())
    grid = np.zeros((len(res.segment_labels), len(sentence_of_word)))
    grid[np.searchsorted(res.segment_labels, sentence_of_word), np.arange(len(words))] = (
        res.item_weights
    )
    both = np.zeros((1, 2) + grid.shape)
    both[0, 0] = grid
    both[0, 1] = grid * res.segment_weights[:, None]
    saved.append(
        show_heatmaps(
            both,
            "words",
            "sentences",
            ["α (words in sentence)", "β·α (words in document)"],
            figsize=(3.5, 2.0),
            path=out / "04_hierarchical.png",
        )
    )

    # 6. self-attention --------------------------------------------------------------------
    step("6. self-attention: Q = W_q X, K = W_k X, V = W_v X")
    X = rng.normal(size=(8, 16))
    sa = nbattn.SelfAttention(16, random_state=3)
    h, w_plain = sa(X)
    _, w_causal = sa(X, causal=True)
    print(
        f"   H {h.shape}; causal weights are lower-triangular: {np.all(np.triu(w_causal, 1) == 0)}"
    )
    saved.append(
        show_heatmaps(
            np.stack([w_plain, w_causal])[None],
            "keys",
            "queries",
            ["self-attention", "causal"],
            path=out / "05_self_attention.png",
        )
    )

    # 7. positional encodings ------------------------------------------------------------
    step("7. positional encodings")
    N, E, H = 12, 16, 4
    table = positional.sinusoidal(N, E)
    unit = np.ones((N, E)) / np.sqrt(E)  # the same vector at every position
    rope_scores = nbattn.scores.dot(positional.rope(unit), positional.rope(unit))
    alibi = positional.alibi_bias(H, N)
    rel = positional.relative_position_bias(np.linspace(-1, 1, 7), N)
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    panels = [
        (table, "sinusoidal table P (position x dim)", "RdBu"),
        (rope_scores, "RoPE: rope(x)·rope(x), same x everywhere", "RdBu"),
        (alibi[0], f"ALiBi bias, head 0 (slope {positional.alibi_slopes(H)[0]:.3g})", "Reds_r"),
        (rel, "clipped relative bias, K = 3", "RdBu"),
    ]
    for ax, (m, title, cmap) in zip(axes, panels):
        image = ax.imshow(m, cmap=cmap, aspect="auto")
        ax.set_title(title, fontsize=8)
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "06_positional_encodings.png", dpi=100)
    plt.close(fig)
    print(f"   ALiBi slopes for {H} heads: {positional.alibi_slopes(H).tolist()}")

    # self-attention over identical tokens: uniform without positions, structured with them
    token = rng.normal(size=E)
    same = np.tile(token, (N, 1))
    layer = nbattn.MultiHeadAttention(E, H, random_state=4)
    rope_layer = nbattn.MultiHeadAttention(E, H, random_state=4, rotary_base=10.0)
    _, w_none = layer(same, same, same)
    _, w_sin = layer(same + table, same + table, same + table)
    _, w_rope = rope_layer(same, same, same)
    _, w_alibi = layer(same, same, same, mask=alibi)
    print(f"   identical tokens, no positions: weights uniform = {np.allclose(w_none, 1 / N)}")
    saved.append(
        show_heatmaps(
            np.stack([w_none, w_sin, w_rope, w_alibi])[None],
            "keys",
            "queries",
            ["no positions", "+ sinusoidal", "RoPE", "ALiBi"],
            path=out / "07_positions_in_self_attention.png",
        )
    )
    greedy_decoding(rng)
    training_with_a_score_mod()
    files = sorted(p.name for p in out.glob("*.png"))
    print(f"\nsaved {len(files)} figures to {out}: {', '.join(files)}")


def greedy_decoding(rng):
    """Step 8: generate tokens one at a time with a KV cache; the full forward agrees."""
    step("8. greedy decoding with a key/value cache (causal self-attention as a language model)")
    vocab = "the cat dog sat ran on a mat log . and slept".split()
    E, H, H_kv = 16, 4, 2
    embed = rng.normal(size=(len(vocab), E))  # tied input/output embeddings
    layer = nbattn.SelfAttention(
        E, num_heads=H, num_kv_heads=H_kv, causal=True, rotary_base=100.0, random_state=8
    )

    def next_token(hidden):  # logits = h . embedding, greedy choice
        return int(np.argmax(hidden @ embed.T))

    prompt = [vocab.index(w) for w in "the cat sat".split()]
    tokens = list(prompt)
    cache = layer.new_cache(batch_size=1, capacity=4)  # grows as the text does
    x = embed[tokens][None]  # (1, 3, E): the prompt in one step (prefill)
    steps = []
    for _ in range(6):
        out, _ = layer(x, cache=cache)
        steps.append(out[0])
        tokens.append(next_token(out[0, -1]))
        x = embed[tokens[-1:]][None]  # only the new token goes in
    print(
        f"   prompt {' '.join(vocab[t] for t in prompt)!r} -> "
        f"{' '.join(vocab[t] for t in tokens)!r}"
    )
    print(f"   cache holds {cache.lengths[0]} positions (capacity now {cache.capacity})")
    # the same text through the full causal forward, all positions at once
    seen = embed[tokens[:-1]][None]
    full, _ = layer(seen)
    incremental = np.concatenate(steps)
    greedy = [next_token(h) for h in full[0, len(prompt) - 1 :]]
    print(
        f"   max |cached step - full forward| = {np.abs(incremental - full[0]).max():.1e}; "
        f"same greedy tokens: {greedy == tokens[len(prompt) :]}"
    )
    if not np.allclose(incremental, full[0], rtol=1e-10, atol=1e-10):
        raise SystemExit("decoding with the cache disagrees with the full forward")


def alibi_score(score, b, h, q_idx, kv_idx, slopes):
    """ALiBi as a score_mod: head h's scores fall by slopes[h] per position back."""
    return score + slopes[h] * (kv_idx - q_idx)


def training_with_a_score_mod(steps=40):
    """Step 9: a one-layer causal attention model in torch, trained through nbattn.torch."""
    step("9. training a torch model through nbattn.torch.flash_attention with an ALiBi score_mod")
    try:
        import torch

        import nbattn.torch as nbattn_torch
    except ImportError:
        print("   torch is not installed: skipped (pip install 'nbattn[torch]')")
        return
    torch.manual_seed(0)
    batch, n, features, heads, head_dim = 32, 16, 4, 2, 8
    slopes = torch.tensor([0.7, 0.1], dtype=torch.float64)  # per head, fixed (not learned)
    # the task: each position's target is an average of the first feature over the
    # positions so far, weighted e^-0.7 per step back (what head 0's ALiBi alone gives)
    decay = slopes[0] * (torch.arange(n)[None, :] - torch.arange(n)[:, None])
    weights = torch.softmax(decay.masked_fill(decay > 0, -torch.inf), -1).float()

    class OneLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(features, 3 * heads * head_dim)
            self.head = torch.nn.Linear(heads * head_dim, 1)

        def forward(self, x):
            q, k, v = self.qkv(x).view(batch, n, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            out = nbattn_torch.flash_attention(
                q, k, v, causal=True, score_mod=alibi_score, mod_args=(slopes,)
            )  # (batch, heads, n, head_dim); q, k, v non-contiguous views are fine
            return self.head(out.transpose(1, 2).reshape(batch, n, heads * head_dim))[..., 0]

    model = OneLayer()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for i in range(steps):
        x = torch.randn(batch, n, features)
        loss = torch.nn.functional.mse_loss(model(x), x[..., 0] @ weights.T)
        optimizer.zero_grad()
        loss.backward()  # through nbattn's flash backward, the score_mod's by the complex step
        optimizer.step()
        losses.append(loss.item())
        if i % 10 == 0 or i == steps - 1:
            print(f"   step {i:3d}  loss {loss.item():.4f}")
    if not losses[-1] < 0.5 * losses[0]:
        raise SystemExit("the loss did not go down through nbattn.torch.flash_attention")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
