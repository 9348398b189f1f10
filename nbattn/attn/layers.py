"""Attention layers: parameter objects over :func:`nbattn.attn.multihead.multi_head_attention`.

``MultiHeadAttention`` keeps torch's parameter layout and initialisation
(``torch.nn.MultiheadAttention``), so weights copy across in either direction
through :meth:`MultiHeadAttention.state_dict` / :meth:`load_state_dict`.
``SelfAttention`` is the text's self-attention model, Q = W_q X, K = W_k X,
V = W_v X, single- or multi-head. The layers are inference objects: the
parameters are NumPy arrays, there is no dropout and no gradient.

Grouped-query attention (``num_kv_heads`` < ``num_heads``) projects keys and
values to fewer heads, each shared by ``num_heads / num_kv_heads`` query
heads. Incremental decoding passes a :class:`nbattn.KVCache`
(:meth:`MultiHeadAttention.new_cache`) as ``cache=``: each call projects only
the new tokens, appends their keys and values to the cache and attends over
everything cached (:func:`nbattn.flash_decode`), so step-by-step decoding
gives the full causal forward of the concatenated sequence.
"""

from __future__ import annotations

import numpy as np

from .._core.validation import as_float_array, check_bool, check_dtype, check_positive_int
from .decode import KVCache
from .multihead import multi_head_attention

__all__ = ["MultiHeadAttention", "SelfAttention"]


def _xavier_uniform(rng, shape):
    fan_out, fan_in = shape
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)


def _host_value(value, key):
    """A state entry as something NumPy reads: torch tensors are detached and moved to
    the CPU, and floating tensors narrower than float32 (bfloat16, float16, float8, which
    NumPy has not got or ``.numpy()`` refuses) widened to float32 first, which is exact."""
    if not hasattr(value, "detach"):
        return value
    tensor = value.detach().cpu()
    try:
        if tensor.is_floating_point() and tensor.element_size() < 4:
            tensor = tensor.float()
        return tensor.numpy()
    except (TypeError, RuntimeError) as exc:
        raise ValueError(
            f"state[{key!r}] is a tensor of dtype {tensor.dtype}, which cannot be read as "
            f"a real float array: {exc}"
        ) from exc


class MultiHeadAttention:
    """Multi-head attention with torch's parameters (batch first).

    .. math::

        \\text{head}_h = \\operatorname{softmax}\\Big(\\frac{(Q W_q^{(h)})(K W_k^{(h)})^T}
                         {\\sqrt{d}}\\Big) V W_v^{(h)}, \\qquad
        \\text{out} = (\\text{head}_1 \\oplus \\cdots \\oplus \\text{head}_H) W_o^T + b_o

    Parameters
    ----------
    embed_dim : int
        E, the query width and the output width.
    num_heads : int
        H, dividing E; each head has width d = E / H.
    bias : bool
        Input and output projection biases (initialised to zero, as in torch).
    kdim, vdim : int, optional
        Key and value widths (default E). When both equal E the projections are
        one stacked ``in_proj_weight`` (3E, E); otherwise separate
        ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight``
        (E, vdim) — torch's layout.
    random_state : None, int or numpy Generator
        Initialisation as torch: Xavier-uniform projections,
        U(-1/sqrt(E), 1/sqrt(E)) output weights, zero biases.
    rotary_base : float, optional
        Apply RoPE (half-split pairing) to each head's queries and keys.
    dtype : "float64" (default) or "float32"
    num_kv_heads : int, optional
        H_kv, dividing H (default H). With H_kv < H (grouped-query attention,
        multi-query at H_kv = 1) the projections are separate, with
        ``k_proj_weight`` (H_kv d, kdim) and ``v_proj_weight`` (H_kv d, vdim),
        and ``in_proj_bias`` is (E + 2 H_kv d,); query head h uses kv head
        h // (H / H_kv), as torch's ``enable_gqa``.

    Attributes
    ----------
    in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight, in_proj_bias,
    out_proj_weight, out_proj_bias : arrays (None where absent)
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        bias=True,
        kdim=None,
        vdim=None,
        random_state=None,
        rotary_base=None,
        dtype="float64",
        num_kv_heads=None,
    ):
        embed_dim = check_positive_int(embed_dim, "embed_dim")
        num_heads = check_positive_int(num_heads, "num_heads")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}"
            )
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        kdim = check_positive_int(kdim, "kdim")
        vdim = check_positive_int(vdim, "vdim")
        bias = check_bool(bias, "bias")
        dt = np.dtype(check_dtype(dtype))
        self.embed_dim = int(embed_dim)
        self.num_heads = int(num_heads)
        self.head_dim = self.embed_dim // self.num_heads
        self.num_kv_heads = int(num_kv_heads)
        self.kdim = int(kdim)
        self.vdim = int(vdim)
        self.rotary_base = rotary_base
        self.dtype = dt.type
        E = self.embed_dim
        E_kv = self.num_kv_heads * self.head_dim
        rng = np.random.default_rng(random_state)
        self.in_proj_weight = self.q_proj_weight = self.k_proj_weight = None
        self.v_proj_weight = None
        if self.kdim == E and self.vdim == E and E_kv == E:
            self.in_proj_weight = _xavier_uniform(rng, (3 * E, E)).astype(dt)
        else:
            self.q_proj_weight = _xavier_uniform(rng, (E, E)).astype(dt)
            self.k_proj_weight = _xavier_uniform(rng, (E_kv, self.kdim)).astype(dt)
            self.v_proj_weight = _xavier_uniform(rng, (E_kv, self.vdim)).astype(dt)
        bound = 1.0 / np.sqrt(E)
        self.out_proj_weight = rng.uniform(-bound, bound, size=(E, E)).astype(dt)
        self.in_proj_bias = np.zeros(E + 2 * E_kv, dtype=dt) if bias else None
        self.out_proj_bias = np.zeros(E, dtype=dt) if bias else None

    _TORCH_NAMES = {
        "in_proj_weight": "in_proj_weight",
        "q_proj_weight": "q_proj_weight",
        "k_proj_weight": "k_proj_weight",
        "v_proj_weight": "v_proj_weight",
        "in_proj_bias": "in_proj_bias",
        "out_proj.weight": "out_proj_weight",
        "out_proj.bias": "out_proj_bias",
    }

    def state_dict(self):
        """The parameters under torch's names (``out_proj.weight`` ...), as NumPy arrays."""
        return {
            tname: getattr(self, attr).copy()
            for tname, attr in self._TORCH_NAMES.items()
            if getattr(self, attr) is not None
        }

    def load_state_dict(self, state):
        """Copy parameters in from a dict with torch's names (arrays or tensors).

        All or nothing: every parameter this layer has must be present, real,
        finite and of its shape, and no other key may be there; only when all
        of them pass is any parameter replaced. A ValueError names the key.
        Half-precision checkpoints (torch bfloat16 / float16 tensors, NumPy
        float16 arrays) convert exactly to the layer's dtype (every half
        value is a float32 value); a dtype NumPy cannot hold is a ValueError
        naming the key and the dtype.
        """
        if not hasattr(state, "keys"):
            raise ValueError(f"state must be a dict of arrays, got {type(state).__name__}")
        expected = {
            tname: attr
            for tname, attr in self._TORCH_NAMES.items()
            if getattr(self, attr) is not None
        }
        unknown = sorted(str(key) for key in state.keys() if key not in expected)
        if unknown:
            raise ValueError(
                f"state has keys this layer does not have: {unknown}; expected {sorted(expected)}"
            )
        checked = {}
        for tname, attr in expected.items():
            if tname not in state:
                raise ValueError(f"state is missing {tname!r}")
            value = _host_value(state[tname], tname)
            arr = as_float_array(value, f"state[{tname!r}]", dtype=self.dtype, allow_bool=False)
            current = getattr(self, attr)
            if arr.shape != current.shape:
                raise ValueError(
                    f"state[{tname!r}] has shape {arr.shape}, expected {current.shape}"
                )
            checked[attr] = arr
        for attr, arr in checked.items():
            setattr(self, attr, arr)
        return self

    def _projections(self):
        """(W_q, W_k, W_v, b_q, b_k, b_v): W_k, W_v with H_kv d rows (b_* None without bias)."""
        E, E_kv = self.embed_dim, self.num_kv_heads * self.head_dim
        if self.in_proj_weight is not None:
            wq, wk, wv = np.split(self.in_proj_weight, 3)
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self.in_proj_bias is None:
            return wq, wk, wv, None, None, None
        b = self.in_proj_bias
        return wq, wk, wv, b[:E], b[E : E + E_kv], b[E + E_kv :]

    def forward(
        self,
        query,
        key,
        value,
        mask=None,
        *,
        key_mask=None,
        causal=False,
        need_weights=True,
        average_attn_weights=True,
        cache=None,
    ):
        """Attend: query (..., L, E), key (..., S, kdim), value (..., S, vdim) -> (out, weights).

        ``mask`` broadcasts to (..., H, L, S) and follows nbattn's (torch SDPA's)
        convention: boolean True = may attend, float = added to the scores. This
        is the opposite of ``torch.nn.MultiheadAttention``'s boolean
        ``attn_mask`` (True = blocked); pass ``~mask`` there. ``key_mask``
        (..., S) is True for keys that take part (torch's ``key_padding_mask``
        inverted).

        With ``cache`` (a :class:`nbattn.KVCache` from :meth:`new_cache`),
        query (B, L, E), key (B, L, kdim) and value (B, L, vdim) are the new
        tokens only: their keys and values are projected and appended to the
        cache, and the queries attend over every cached token and the new
        ones (``causal=True``: each new token sees the past and itself, the
        positions aligned at the bottom right; RoPE positions continue from
        each row's cache length). Masks are not taken there, and the weights
        are not formed (None).

        Returns
        -------
        out : (..., L, E)
        weights : (..., L, S) averaged over heads (torch's default), or
            (..., H, L, S) with ``average_attn_weights=False``; None when
            ``need_weights=False`` or with ``cache``. Fully masked rows have
            zero weights and the output bias as output, never NaN.
        """
        if cache is not None:
            if mask is not None or key_mask is not None:
                raise ValueError("mask and key_mask are not supported with cache=")
            return self._decode_step(query, key, value, cache, check_bool(causal, "causal")), None
        return multi_head_attention(
            query,
            key,
            value,
            self.num_heads,
            self.in_proj_weight,
            self.in_proj_bias,
            self.out_proj_weight,
            self.out_proj_bias,
            q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight,
            v_proj_weight=self.v_proj_weight,
            mask=mask,
            key_mask=key_mask,
            causal=causal,
            need_weights=need_weights,
            average_attn_weights=average_attn_weights,
            rotary_base=self.rotary_base,
            num_kv_heads=self.num_kv_heads,
            dtype=self.dtype,
        )

    def new_cache(self, batch_size, capacity=256, grow=True):
        """An empty :class:`nbattn.KVCache` shaped for this layer's keys and values."""
        return KVCache(
            batch_size,
            self.num_kv_heads,
            self.head_dim,
            capacity=capacity,
            dtype=self.dtype,
            grow=grow,
        )

    def _check_cache(self, cache):
        if not isinstance(cache, KVCache):
            raise ValueError(f"cache must be a KVCache (see new_cache), got {type(cache).__name__}")
        want = (self.num_kv_heads, self.head_dim, self.head_dim, np.dtype(self.dtype))
        have = (cache.num_kv_heads, cache.head_dim, cache.value_dim, np.dtype(cache.dtype))
        if want != have:
            raise ValueError(
                f"cache holds (num_kv_heads, head_dim, value_dim, dtype) = {have}, this layer "
                f"needs {want}; create it with new_cache"
            )

    def _decode_step(self, query, key, value, cache, causal):
        """Project the new tokens, append keys/values to ``cache``, attend over it: (B, L, E)."""
        self._check_cache(cache)
        dt = self.dtype
        query = as_float_array(query, "query", ndim=(3,), dtype=dt, allow_bool=False)
        key = as_float_array(key, "key", ndim=(3,), dtype=dt, allow_bool=False)
        value = as_float_array(value, "value", ndim=(3,), dtype=dt, allow_bool=False)
        n_b, n_q, E = query.shape
        for name, arr, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if arr.shape[0] != cache.batch_size or arr.shape[2] != width:
                raise ValueError(
                    f"{name} must have shape (B, n, {width}) with B = {cache.batch_size} "
                    f"(the cache's batch size), got {arr.shape}"
                )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"key and value must have the same length; got {key.shape[1]} and {value.shape[1]}"
            )
        wq, wk, wv, bq, bk, bv = self._projections()
        d = self.head_dim

        def heads(x, weight, bias, n_heads):  # (B, n, in) -> (B, n_heads, n, d)
            y = x @ weight.T
            if bias is not None:
                y = y + bias
            return np.ascontiguousarray(np.swapaxes(y.reshape(n_b, -1, n_heads, d), 1, 2))

        qh = heads(query, wq, bq, self.num_heads)
        kh = heads(key, wk, bk, self.num_kv_heads)
        vh = heads(value, wv, bv, self.num_kv_heads)
        if self.rotary_base is not None:
            from .positional import rope

            n_new = kh.shape[2]
            for b in range(n_b):
                past = int(cache.lengths[b])
                # queries sit at the last n_q of the past + n_new positions
                q_pos = np.arange(past + n_new - n_q, past + n_new)
                qh[b] = rope(qh[b], positions=q_pos, base=self.rotary_base)
                kh[b] = rope(kh[b], positions=np.arange(past, past + n_new), base=self.rotary_base)
        out_h = cache.attend(qh, kh, vh, causal=causal)
        concat = np.swapaxes(out_h, 1, 2).reshape(n_b, n_q, E)
        out = concat @ self.out_proj_weight.T
        if self.out_proj_bias is not None:
            out = out + self.out_proj_bias
        return out

    __call__ = forward

    def __repr__(self):
        return (
            f"MultiHeadAttention(embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, kdim={self.kdim}, vdim={self.vdim})"
        )


class SelfAttention:
    """Self-attention (the attention chapter): Q = W_q X, K = W_k X, V = W_v X, then attention.

    .. math::

        h_n = \\sum_j \\operatorname{softmax}_j\\big(s(k_j, q_n)\\big) v_j, \\quad
        s(k, q) = k^T q / \\sqrt{d}

    per head, heads concatenated and projected (``num_heads=1`` is the text's
    single-head model followed by the output projection). A
    :class:`MultiHeadAttention` with query = key = value = X underneath
    (``self.attn``); the parameters are its.

    Parameters
    ----------
    embed_dim : int
    num_heads : int, default 1
    bias : bool
    causal : bool
        Default causal flag of :meth:`forward` (each position sees itself and
        the positions before it).
    random_state, rotary_base, dtype, num_kv_heads : as for :class:`MultiHeadAttention`
    """

    def __init__(
        self,
        embed_dim,
        num_heads=1,
        bias=True,
        causal=False,
        random_state=None,
        rotary_base=None,
        dtype="float64",
        num_kv_heads=None,
    ):
        self.attn = MultiHeadAttention(
            embed_dim,
            num_heads,
            bias=bias,
            random_state=random_state,
            rotary_base=rotary_base,
            dtype=dtype,
            num_kv_heads=num_kv_heads,
        )
        self.causal = check_bool(causal, "causal")

    def forward(
        self,
        x,
        mask=None,
        *,
        key_mask=None,
        causal=None,
        need_weights=True,
        average_attn_weights=True,
        cache=None,
    ):
        """x (..., N, E) -> (H (..., N, E), weights); see :meth:`MultiHeadAttention.forward`.

        With ``cache`` (from :meth:`new_cache`) x (B, n, E) holds the new tokens
        only (incremental decoding).
        """
        return self.attn.forward(
            x,
            x,
            x,
            mask,
            key_mask=key_mask,
            causal=self.causal if causal is None else causal,
            need_weights=need_weights,
            average_attn_weights=average_attn_weights,
            cache=cache,
        )

    def new_cache(self, batch_size, capacity=256, grow=True):
        """An empty :class:`nbattn.KVCache` for incremental decoding with this layer."""
        return self.attn.new_cache(batch_size, capacity=capacity, grow=grow)

    __call__ = forward

    def state_dict(self):
        return self.attn.state_dict()

    def load_state_dict(self, state):
        self.attn.load_state_dict(state)
        return self

    def __repr__(self):
        return f"SelfAttention(embed_dim={self.attn.embed_dim}, num_heads={self.attn.num_heads})"
