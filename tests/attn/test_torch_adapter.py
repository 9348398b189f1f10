"""nbattn.torch: flash attention on torch tensors, its gradients, torch.compile, refusals.

The forward must be nbattn's NumPy result bit for bit, and the gradients torch
autograd's on the dense formulation softmax(scale q k^T + mods) v. Each new user
function is a numba compile of the flex kernels (seconds), and so is each new pair
of score_mod and mask_mod: every programmable case here runs the score_mod of
``tests/flex_cases.py`` (shared with the other flex test files; here a softcap and
ALiBi slopes, either switched off by its ``mod_args``) under a block mask of its
mask_mod (documents; one document where a case has no mask), on tiny shapes. The file
compiles the plain kernels (float64) and that score_mod (float64, shared, and float32).
"""

from __future__ import annotations

import gc
import importlib
import math
import sys
import types

import numpy as np
import pytest

import nbattn
from tests import flex_cases as fc

torch = pytest.importorskip("torch")
nbt = pytest.importorskip("nbattn.torch")

B, H, H_KV, L, S, E, EV = 2, 4, 2, 6, 9, 4, 3
#: the query heads' ALiBi slopes, 2^-1 ... 2^-H
SLOPES = 2.0 ** -(np.arange(H) + 1.0)
#: document ids of the key positions (query i sits at position i)
DOCS = np.array([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0, 0, 1, 1, 1, 1, 3, 3, 3]])
ONE_DOCUMENT = np.zeros_like(DOCS)


def _qkv(dtype=torch.float64, kv_heads=H, seed=0, requires_grad=True):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((B, H, L, E), (B, kv_heads, S, E), (B, kv_heads, S, EV))
    return tuple(
        torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(requires_grad)
        for shape in shapes
    )


def _dense(q, k, v, *, causal=False, cap=0.0, slopes=None, docs=None, enable_gqa=False):
    """softmax(s) v with torch ops: s = cap tanh(scale q k^T / cap) + slopes[h] (j - i),
    -inf across documents and, when causal, for j > i."""
    if enable_gqa:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in s.shape), indexing="ij")
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    if slopes is not None:
        s = s + torch.from_numpy(slopes)[h] * (j - i)
    keep = torch.ones_like(s, dtype=torch.bool)
    if docs is not None:
        keep = torch.from_numpy(docs)[b, i] == torch.from_numpy(docs)[b, j]
    if causal:
        keep = keep & (j <= i)
    return torch.nan_to_num(torch.softmax(s.masked_fill(~keep, -torch.inf), -1)) @ v


def _block_mask(docs=ONE_DOCUMENT):
    """A block mask of the shared mask_mod: query i and key j of one document."""
    return nbattn.create_block_mask(
        fc.mask_fn, B, None, L, S, mod_args=fc.make_args(B, H, S, doc=docs)
    )


def _mod_args(cap=0.0, slopes=None, n_b=B, n_h=H, n=S):
    """The shared score_mod's mod_args (tensors) for a softcap cap (none for 0) and ALiBi
    slopes (tensor or array; none when absent)."""
    slopes = None if slopes is None else np.asarray(slopes, dtype=np.float64)
    return fc.to_torch(fc.make_args(n_b, n_h, n, cap=cap, slopes=slopes))


def _programmable(cap=0.0, slopes=None, docs=ONE_DOCUMENT):
    """nbattn.torch's keywords for score_fn(cap, slopes) under a block mask of ``docs``."""
    return {
        "score_mod": fc.score_fn,
        "mod_args": _mod_args(cap, slopes),
        "block_mask": _block_mask(docs),
    }


#: name -> (nbattn.torch's keywords, given the dtype, and the dense formulation's)
CASES = {
    "plain": (lambda dtype: {}, {}),
    "causal": (lambda dtype: {"causal": True}, {"causal": True}),
    "softcap": (lambda dtype: _programmable(cap=2.0), {"cap": 2.0}),
    "alibi": (
        lambda dtype: _programmable(slopes=SLOPES) | {"causal": True},
        {"slopes": SLOPES, "causal": True},
    ),
    "documents": (lambda dtype: _programmable(docs=DOCS), {"docs": DOCS}),
    "gqa": (
        lambda dtype: {"enable_gqa": True, "causal": True},
        {"enable_gqa": True, "causal": True},
    ),
}


def _case(name, dtype=torch.float64):
    ours, dense = CASES[name]
    return _qkv(dtype, kv_heads=H_KV if name == "gqa" else H), ours(dtype), dense


def _for_nbattn(kw):
    """``kw`` with its tensors (those of mod_args too) as NumPy arrays, for nbattn itself."""

    def array(x):
        return x.numpy() if isinstance(x, torch.Tensor) else x

    return {n: tuple(map(array, x)) if n == "mod_args" else array(x) for n, x in kw.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_is_nbattns_result_bit_for_bit(name):
    (q, k, v), kw, _ = _case(name)
    out, lse = nbt.flash_attention(q, k, v, return_lse=True, **kw)
    ref, ref_lse = nbattn.flash_attention(
        *(x.detach().numpy() for x in (q, k, v)), return_lse=True, **_for_nbattn(kw)
    )
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert np.array_equal(out.detach().numpy(), ref) and np.array_equal(lse.numpy(), ref_lse)
    assert out.requires_grad and not lse.requires_grad


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_autograd_on_the_dense_formulation(name):
    (q, k, v), kw, dense = _case(name)
    grad_out = torch.randn(
        B, H, L, EV, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    out = nbt.flash_attention(q, k, v, **kw)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    refs = torch.autograd.grad(_dense(q, k, v, **dense), (q, k, v), grad_out)
    for grad, ref in zip(grads, refs, strict=True):
        np.testing.assert_allclose(grad.numpy(), ref.numpy(), rtol=0, atol=1e-10)


def test_gradcheck():
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, n, 2, dtype=torch.float64, generator=gen) for n in (3, 4, 4))
    for x in (q, k, v):
        x.requires_grad_()

    mod_args = _mod_args(2.0, [0.5, -0.25], n_b=1, n_h=2, n=4)
    doc = fc.make_args(1, 2, 4, doc=np.array([[0, 0, 1, 1]]))
    documents = nbattn.create_block_mask(fc.mask_fn, 1, None, 3, 4, mod_args=doc)

    def f(q, k, v):
        kw = {"score_mod": fc.score_fn, "mod_args": mod_args, "block_mask": documents}
        return nbt.flash_attention(q, k, v, causal=True, **kw)

    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("name", ["softcap", "alibi"])
def test_float32_matches_the_float64_dense_formulation(name):
    (q, k, v), kw, dense = _case(name, torch.float32)
    out = nbt.flash_attention(q, k, v, **kw)
    assert out.dtype == torch.float32
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = _dense(q64, k64, v64, **dense)
    refs = torch.autograd.grad(ref.sum(), (q64, k64, v64))
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=0, atol=2e-5)
    for grad, ref_grad in zip(grads, refs, strict=True):
        np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=0, atol=2e-5)


def test_every_keyword_of_the_plain_path_matches_nbattn():
    """A key-padding mask, a window, bottom-right causality, softcap and dropout (with an
    int seed): forward and gradients are nbattn's forward and backward, bit for bit. (The
    masks here are boolean: a float mask is the same tensor-to-array step, and one more
    kernel to compile.)"""
    q, k, v = _qkv()
    mask = torch.rand(B, 1, 1, S, generator=torch.Generator().manual_seed(4)) > 0.3
    kw = dict(
        causal=True, causal_alignment="bottom_right", window=(3, None), softcap=5.0,
        dropout_p=0.25, random_state=7, scale=0.3,
    )  # fmt: skip
    out, lse = nbt.flash_attention(q, k, v, mask=mask, return_lse=True, **kw)
    grad_out = torch.ones_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    arrays = [x.detach().numpy() for x in (q, k, v)]
    ref, ref_lse = nbattn.flash_attention(*arrays, mask=mask.numpy(), return_lse=True, **kw)
    refs = nbattn.flash_attention_backward(
        *arrays, ref, ref_lse, grad_out.numpy(), mask=mask.numpy(), **kw
    )
    assert np.array_equal(out.detach().numpy(), ref) and np.array_equal(lse.numpy(), ref_lse)
    for grad, ref_grad in zip(grads, refs, strict=True):
        assert np.array_equal(grad.numpy(), ref_grad)


def test_dropout_seed_comes_from_torchs_generator():
    q, k, v = _qkv()
    draws = []
    for _ in range(2):
        torch.manual_seed(3)
        out = nbt.flash_attention(q, k, v, dropout_p=0.5)
        draws.append(out.detach())
        torch.autograd.grad(out.sum(), (q, k, v))  # the backward regenerates the same mask
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], nbt.flash_attention(q, k, v, dropout_p=0.5).detach())


def test_inputs_are_neither_written_nor_required_contiguous():
    q, k, v = _qkv()
    slopes = torch.from_numpy(SLOPES.copy())
    mask = torch.rand(L, S) > 0.3
    # transposed views: (B, L, H, E) memory seen as (B, H, L, E)
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qt.is_contiguous()
    before = [x.detach().clone() for x in (q, k, v, qt, slopes, mask)]
    mod_args = fc.with_args(_mod_args(), slopes=slopes)
    programmable = {"score_mod": fc.score_fn, "mod_args": mod_args, "block_mask": _block_mask()}
    for kw in ({"mask": mask}, programmable):
        out, lse = nbt.flash_attention(q, k, v, return_lse=True, **kw)
        out_t = nbt.flash_attention(qt, kt, vt, **kw)
        assert torch.equal(out.detach(), out_t)
        kept = out.detach().clone(), lse.clone()
        torch.autograd.grad(out.sum(), (q, k, v))
        assert torch.equal(out.detach(), kept[0]) and torch.equal(lse, kept[1])
    for x, y in zip((q, k, v, qt, slopes, mask), before, strict=True):
        assert torch.equal(x.detach(), y)


def test_handles_are_never_reused_and_hold_nothing_alive():
    def make():
        def score_mod(score, b, h, q_idx, kv_idx):
            return score

        return score_mod

    fn = make()
    handle = nbt._HANDLES.handle(fn, "score_mod")
    assert nbt._HANDLES.handle(fn, "score_mod") == handle and nbt._HANDLES.get(handle) is fn
    del fn
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exists"):
        nbt._HANDLES.get(handle)
    assert nbt._HANDLES.handle(make(), "score_mod") != handle


def test_a_call_keeps_its_functions_alive_until_its_backward():
    q, k, v = _qkv()
    kw = _programmable(slopes=SLOPES)
    # a copy of score_fn that nothing else holds (the same code: no new compile)
    kw["score_mod"] = types.FunctionType(fc.score_fn.__code__, fc.score_fn.__globals__)
    out = nbt.flash_attention(q, k, v, **kw)
    del kw
    gc.collect()
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    refs = torch.autograd.grad(_dense(q, k, v, slopes=SLOPES).sum(), (q, k, v))
    for grad, ref in zip(grads, refs, strict=True):
        np.testing.assert_allclose(grad.numpy(), ref.numpy(), rtol=0, atol=1e-10)


def test_opcheck():
    """torch.library's checks of the operators: schema (no input written, no output
    aliasing an input), fake shapes against the real ones, autograd registration."""
    q, k, v = _qkv()
    documents = _block_mask(DOCS)
    handles = nbt._mod_handles(fc.score_fn, None, documents, None)
    tensors = [a for a in _mod_args(slopes=SLOPES) if isinstance(a, torch.Tensor)]
    ints, floats, kinds = [fc.WIDE, fc.WIDE], [0.0], "ttttttiift"  # left, right; diag
    args = (q, k, v, None, None, tensors, ints, floats, kinds, True, None, False)
    args += (None, None, "top_left", None, 0.0, *handles.values())
    torch.library.opcheck(torch.ops.nbattn.flash_attention.default, args)
    gqa = _qkv(kv_heads=H_KV)
    mask = torch.rand(B, 1, L, S) > 0.3
    args = (*gqa, mask, None, [], [], [], "", False, None, True) + (None, None, "top_left")
    args += (None, 0.0, "", "", "", "", "")
    torch.library.opcheck(torch.ops.nbattn.flash_attention.default, args)


# ----------------------------------------------------------------------------- torch.compile


def _compiled_matches_eager(fn, *args):
    """Each call of ``fn`` compiled (aot_eager, fullgraph) gives eager's loss and gradients
    (both after the same torch.manual_seed); returns the number of graphs compiled."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    for inputs in args:
        torch.manual_seed(0)
        eager = fn(*inputs)
        grads = torch.autograd.grad(eager, inputs[:3])
        torch.manual_seed(0)
        got = compiled(*inputs)
        assert torch.equal(got, eager)
        for grad, ref in zip(torch.autograd.grad(got, inputs[:3]), grads, strict=True):
            assert torch.equal(grad, ref)
    return counter.frame_count


def test_compiles_in_one_graph_forward_and_backward():
    """Every keyword of the plain path, dropout's seed drawn inside the graph."""

    def loss(q, k, v, mask):
        out, lse = nbt.flash_attention(
            q, k, v, mask=mask, enable_gqa=True, causal=True, causal_alignment="bottom_right",
            window=(3, None), softcap=5.0, dropout_p=0.25, scale=0.3, return_lse=True,
        )  # fmt: skip
        return out.square().sum() + lse.nan_to_num(neginf=0.0).sum()

    q, k, v = _qkv(kv_heads=H_KV)
    assert _compiled_matches_eager(loss, (q, k, v, torch.rand(B, 1, 1, S) > 0.2)) == 1


def test_compiled_score_mod_takes_new_tables_without_recompiling():
    documents = _block_mask(DOCS)

    def loss(q, k, v, slopes):
        mod_args = fc.with_args(_mod_args(), slopes=slopes)
        kw = {"score_mod": fc.score_fn, "mod_args": mod_args, "block_mask": documents}
        return nbt.flash_attention(q, k, v, **kw).sum()

    q, k, v = _qkv()
    calls = [(q, k, v, torch.from_numpy(SLOPES * scale)) for scale in (1.0, -3.0)]
    assert _compiled_matches_eager(loss, *calls) == 1


def test_compiled_graphs_are_guarded_on_each_functions_identity():
    """Closures of one code with other captured values are other functions: the handle a
    compiled call passes on is the one of the function it was given (a guard on the
    code alone would run the first closure for both)."""

    def scaled(factor):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * factor

        return score_mod

    def handle_of(x, score_mod):
        return x + 1, nbt._mod_handles(score_mod, None, None, None)["score_mod"]

    compiled = torch.compile(handle_of, backend="eager", fullgraph=True)
    x = torch.zeros(1)
    for fn in (scaled(1.0), scaled(2.0)):
        assert compiled(x, fn)[1] == handle_of(x, fn)[1] == nbt._HANDLES.handle(fn, "score_mod")
    assert nbt._HANDLES.get(compiled(x, fn)[1]) is fn


def test_compiled_graphs_are_specialised_on_the_block_mask():
    """Two block masks of one mask_mod (other document ids): each gets its own graph
    (the compiled call never reuses another object's handle)."""

    slopes = torch.from_numpy(SLOPES)

    def loss(q, k, v, block_mask):
        mod_args = fc.with_args(_mod_args(), slopes=slopes)
        kw = {"score_mod": fc.score_fn, "mod_args": mod_args, "block_mask": block_mask}
        return nbt.flash_attention(q, k, v, **kw).sum()

    q, k, v = _qkv()
    calls = [(q, k, v, _block_mask(DOCS)), (q, k, v, _block_mask(DOCS[::-1].copy()))]
    assert _compiled_matches_eager(loss, *calls) == 2


# ----------------------------------------------------------------------------- refusals


def test_refuses_what_it_cannot_compute():
    q, k, v = _qkv()
    wanted = torch.ones(H, requires_grad=True)
    cases = [
        ({"q": q.detach().to("meta")}, "q is on the meta device.*CPU tensors only"),
        ({"v": v.detach().float()}, "one dtype, float32 or float64"),
        ({"q": q.half(), "k": k.half(), "v": v.half()}, "float32 or float64"),
        ({"k": k.detach().numpy()}, "k must be a torch.Tensor"),
        ({"mask": torch.zeros(L, S, requires_grad=True)}, "mask requires grad.*bias tables"),
        (
            {"score_mod": fc.score_fn, "mod_args": fc.with_args(_mod_args(), slopes=wanted)},
            r"mod_args\[2\] requires grad.*not built",
        ),
        ({"score_mod": fc.score_fn, "mod_args": list(_mod_args())}, "mod_args must be a tuple"),
        ({"score_mod": fc.score_fn, "mod_args": ("cap",)}, r"mod_args\[0\] must be a torch.Tensor"),
        ({"dropout_p": 0.1, "random_state": np.random.default_rng()}, "random_state must be"),
        ({"block_mask": object()}, "block_mask must come from nbattn.create_block_mask"),
        ({"window": 3}, "window must be a pair"),
        ({"return_lse": "yes"}, "return_lse must be True or False"),
        (
            {"mask": torch.ones(L, S), "block_mask": _block_mask()},
            "cannot be combined",
        ),
    ]
    for kw, message in cases:
        args = {"q": q, "k": k, "v": v} | kw
        with pytest.raises(ValueError, match=message):
            nbt.flash_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_without_torch_the_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "nbattn.torch")
    with pytest.raises(ImportError, match=r"pip install 'nbattn\[torch\]'"):
        importlib.import_module("nbattn.torch")
