"""nbattn.torch under hostile and new-user use: odd tensors, transforms, threads, training.

Companion of ``test_torch_adapter.py``. Every programmable case here runs the
score_mod / mask_mod pair of ``tests/flex_cases.py`` (shared with the other flex test
files) with a softcap, ALiBi slopes and documents (:func:`_mod_args`): each new function
is a numba compile of the flex kernels (seconds).
"""

from __future__ import annotations

import gc
import math
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.flex_cases import MODS, SLOPES, make_args, to_torch, with_args

torch = pytest.importorskip("torch")
nbt = pytest.importorskip("nbattn.torch")

import torch.nn.functional as F  # noqa: E402  (after the importorskip)

F64, F32 = torch.float64, torch.float32


def _mod_args(cap, slopes, doc):
    """mod_args of the shared functions for a tanh softcap (none for cap = 0), then ALiBi
    slopes[h] (j - i), query i attending to key j of its own document doc[b]."""
    n_b, n = doc.shape
    slopes = slopes.detach().double().numpy()
    return to_torch(make_args(n_b, len(slopes), n, cap=cap, slopes=slopes, doc=doc.numpy()))


def _dense(q, k, v, cap, slopes, doc, causal, gqa, scale):
    """softmax(s) v with torch ops, the s of the shared functions under :func:`_mod_args`."""
    if gqa:
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    b, h, i, j = torch.meshgrid(*(torch.arange(n) for n in s.shape), indexing="ij")
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    s = s + slopes.to(s.dtype)[h] * (j - i)
    keep = doc[b, i] == doc[b, j]
    if causal:
        keep = keep & (j <= i)
    return torch.nan_to_num(torch.softmax(s.masked_fill(~keep, -torch.inf), -1)) @ v


def _qkv(shapes=((1, 2, 5, 4), (1, 2, 7, 4), (1, 2, 7, 3)), dtype=F64, seed=0, grad=True):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_(grad) for s in shapes]


def _grads(out, inputs, grad_out=None):
    return torch.autograd.grad(out, inputs, torch.ones_like(out) if grad_out is None else grad_out)


def _random_case(seed, dtype):
    """Random shapes and keywords for the shared functions (softcap, ALiBi
    slopes, documents: the parameters of :func:`_mod_args`), with GQA and causality."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    b, h_kv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    h = h_kv * int(rng.integers(1, 3))
    n_q, n_k = int(rng.integers(1, 12)), int(rng.integers(1, 12))
    e, ev = int(rng.integers(1, 6)), int(rng.integers(1, 5))
    gqa = h != h_kv or seed % 4 == 0
    q = torch.randn(b, h, n_q, e, generator=gen, dtype=dtype)
    k = torch.randn(b, h_kv if gqa else h, n_k, e, generator=gen, dtype=dtype)
    v = torch.randn(b, h_kv if gqa else h, n_k, ev, generator=gen, dtype=dtype)
    slopes = torch.randn(h, generator=gen, dtype=dtype) / 2
    doc = torch.from_numpy(np.sort(rng.integers(0, 3, (b, max(n_q, n_k))), axis=1))
    cap = float(rng.choice([0.0, 1.5, 5.0]))
    scale = None if seed % 5 else float(rng.uniform(-1, 2))
    grad_out = torch.randn(b, h, n_q, ev, generator=gen, dtype=dtype)
    kw = dict(causal=bool(seed % 2), enable_gqa=gqa, scale=scale)
    return [x.requires_grad_() for x in (q, k, v)], grad_out, kw, (cap, slopes, doc)


# ----------------------------------------------------------------------------- correctness


@pytest.mark.parametrize("dtype, atol", [(F64, 1e-12), (F32, 5e-5)])
def test_score_mod_mask_mod_gqa_causal_match_the_dense_formulation_over_many_draws(dtype, atol):
    for seed in range(20):
        (q, k, v), grad_out, kw, params = _random_case(seed, dtype)
        out = nbt.flash_attention(q, k, v, mod_args=_mod_args(*params), **MODS, **kw)
        assert out.dtype == dtype
        grads = _grads(out, (q, k, v), grad_out)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = _dense(q64, k64, v64, *params, kw["causal"], kw["enable_gqa"], kw["scale"])
        refs = _grads(ref, (q64, k64, v64), grad_out.double())
        for got, want in zip((out.detach(), *grads), (ref.detach(), *refs), strict=True):
            np.testing.assert_allclose(got.double(), want, rtol=0, atol=atol, err_msg=str(seed))


@pytest.mark.parametrize("dtype, atol", [(F64, 1e-12), (F32, 2e-5)])
def test_masks_gqa_and_scales_match_torch_sdpa_over_many_draws(dtype, atol):
    """Boolean and float masks of several broadcast shapes, GQA, causal, odd scales
    (0 and negative included) against scaled_dot_product_attention in float64."""
    for seed in range(30):
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        b, h_kv = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        h = h_kv * int(rng.integers(1, 3))
        n_q, n_k, e = (int(n) for n in rng.integers(1, 16, 3))
        q, k, v = _qkv(((b, h, n_q, e), (b, h_kv, n_k, e), (b, h_kv, n_k, 3)), dtype, seed)
        causal = seed % 2 == 1
        mask = None
        if not causal and seed % 3:
            shape = [(n_q, n_k), (b, 1, n_q, n_k), (1, h, 1, n_k), (n_k,)][seed % 4]
            mask = torch.rand(shape, generator=gen) > 0.3
            if seed % 3 == 2:
                mask = torch.randn(shape, generator=gen, dtype=dtype) * 3
        scale = [None, 0.0, -0.7, 1.9][seed % 4]
        kw = dict(causal=causal, enable_gqa=h != h_kv, scale=scale)
        out = nbt.flash_attention(q, k, v, mask=mask, **kw)
        grad_out = torch.randn(out.shape, generator=gen, dtype=dtype)
        grads = _grads(out, (q, k, v), grad_out)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        mask64 = mask.double() if mask is not None and mask.is_floating_point() else mask
        if mask64 is not None:
            mask64 = mask64.expand(*mask.shape[:-2], n_q, n_k)  # torch takes no 1-d mask
        torch_kw = dict(is_causal=causal, enable_gqa=h != h_kv, scale=scale)
        ref = torch.nan_to_num(F.scaled_dot_product_attention(q64, k64, v64, mask64, **torch_kw))
        refs = _grads(ref, (q64, k64, v64), grad_out.double())
        for got, want in zip((out.detach(), *grads), (ref.detach(), *refs), strict=True):
            np.testing.assert_allclose(got.double(), want, rtol=0, atol=atol, err_msg=str(seed))


def test_odd_layouts_and_aliases_give_the_contiguous_result():
    """q is k is v, stride-0 (expanded) inputs, transposed masks, a neg-bit view: the
    same bytes as contiguous copies, and gradients summed over the aliases."""
    (x,) = _qkv(((2, 2, 6, 4),))
    out = nbt.flash_attention(x, x, x, causal=True)
    (grad,) = _grads(out, (x,))
    y = x.detach().clone().requires_grad_()
    ref = F.scaled_dot_product_attention(y, y, y, is_causal=True)
    np.testing.assert_allclose(out.detach(), ref.detach(), rtol=0, atol=1e-14)
    np.testing.assert_allclose(grad, _grads(ref, (y,))[0], rtol=0, atol=1e-14)

    base = _qkv(((1, 2, 1, 4), (1, 2, 7, 4), (1, 2, 7, 3)))
    expanded = [base[0].expand(3, 2, 5, 4), base[1].expand(3, 2, 7, 4), base[2]]
    copies = [t.detach().contiguous().requires_grad_() for t in expanded]
    mask = torch.rand(7, 5) > 0.2
    got = nbt.flash_attention(*expanded, mask=mask.T)
    want = nbt.flash_attention(*copies, mask=mask.T.contiguous())
    assert torch.equal(got, want)
    grads, copy_grads = _grads(got, base), _grads(want, copies)
    np.testing.assert_allclose(grads[0], copy_grads[0].sum((0, 2), True), rtol=0, atol=1e-14)
    np.testing.assert_allclose(grads[1], copy_grads[1].sum(0, True), rtol=0, atol=1e-14)
    assert torch.equal(grads[2], copy_grads[2])

    q, k, v = _qkv(grad=False)
    float_mask = torch.randn(5, 7, dtype=F64)
    assert torch.equal(
        nbt.flash_attention(torch._neg_view(q), k, v, mask=torch._neg_view(float_mask)),
        nbt.flash_attention(-q, k, v, mask=-float_mask),
    )


def test_gradients_only_for_the_inputs_that_require_them_and_none_under_no_grad():
    q, k, v = _qkv()
    q_const = q.detach()
    out = nbt.flash_attention(q_const, k, v)
    dk, dv = _grads(out, (k, v))
    ref_dk, ref_dv = _grads(nbt.flash_attention(q, k, v), (k, v))
    assert torch.equal(dk, ref_dk) and torch.equal(dv, ref_dv)
    with torch.no_grad():
        assert not nbt.flash_attention(q, k, v).requires_grad
    with torch.inference_mode():
        assert nbt.flash_attention(q, k, v).is_inference()


def test_two_identical_calls_give_identical_bytes_with_deterministic_algorithms():
    q, k, v = _qkv(((2, 3, 17, 8), (2, 3, 33, 8), (2, 3, 33, 5)))
    results = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            out = nbt.flash_attention(q, k, v, causal=True, dropout_p=0.3, random_state=5)
            results.append([t.numpy().tobytes() for t in (out.detach(), *_grads(out, (q, k, v)))])
    finally:
        torch.use_deterministic_algorithms(False)
    assert results[0] == results[1]


def test_backward_twice_with_retain_graph_adds_the_same_gradients():
    q, k, v = _qkv()
    out = nbt.flash_attention(q, k, v, mod_args=_small_mod_args(), **MODS)
    out.sum().backward(retain_graph=True)
    first = q.grad.clone()
    out.sum().backward()
    assert torch.equal(q.grad, 2 * first)


def _small_mod_args(cap=0.0):
    """mod_args for the (1, 2, 5 / 7, .) inputs of :func:`_qkv`."""
    return _mod_args(
        cap, torch.tensor([0.5, -0.25], dtype=F64), torch.zeros(1, 7, dtype=torch.int64)
    )


# ----------------------------------------------------------------------------- handles


def test_forward_only_calls_leave_the_handle_registry_as_it_was():
    q, k, v = _qkv()
    kw = dict(mod_args=_small_mod_args(), **MODS)
    nbt.flash_attention(q, k, v, **kw)
    before = (len(nbt._HANDLES._objects), len(nbt._HANDLES._by_id))
    for grad in (False, True):
        for _ in range(500):
            nbt.flash_attention(q.requires_grad_(grad), k, v, **kw)
    gc.collect()
    assert (len(nbt._HANDLES._objects), len(nbt._HANDLES._by_id)) == before


def test_many_threads_at_once_get_the_single_threaded_bytes():
    q, k, v = _qkv(((2, 2, 17, 8), (2, 2, 33, 8), (2, 2, 33, 5)))
    mod_args = _mod_args(
        1.5, torch.tensor([0.5, 0.25], dtype=F64), torch.zeros(2, 33, dtype=torch.int64)
    )
    kw = dict(mod_args=mod_args, causal=True, **MODS)
    ref = nbt.flash_attention(q, k, v, **kw)
    ref_grads = _grads(ref, (q, k, v))
    failures = []

    def work():
        try:
            for _ in range(10):
                out = nbt.flash_attention(q, k, v, **kw)
                grads = _grads(out, (q, k, v))
                same = torch.equal(out, ref) and all(map(torch.equal, grads, ref_grads))
                failures.extend([] if same else ["different bytes"])
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


# ----------------------------------------------------------------------------- torch.compile


def test_compiled_closures_of_one_code_give_their_own_results():
    """Two closures of the same code with other captured factors: each compiled result
    is its own eager result (the graph is not reused across function identities)."""
    import torch._dynamo.testing

    def scaled(factor):
        def score_mod(score, b, h, q_idx, kv_idx, cap, slopes, doc):
            return score * factor + slopes[h] * 0.0

        return score_mod

    q, k, v = _qkv()
    mod_args = (0.0, torch.tensor([0.5, -0.25], dtype=F64), torch.zeros(1, 7, dtype=torch.int64))

    def loss(q, k, v, score_mod):
        return nbt.flash_attention(q, k, v, score_mod=score_mod, mod_args=mod_args).sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss, backend=counter, fullgraph=True)
    halves, doubles = scaled(0.5), scaled(2.0)
    got = [compiled(q, k, v, fn) for fn in (halves, doubles, halves)]
    want = [loss(q, k, v, fn) for fn in (halves, doubles, halves)]
    assert [g.item() for g in got] == [w.item() for w in want]
    assert got[0].item() != got[1].item() and counter.frame_count == 2


def test_compile_with_dynamic_shapes_compiles_once_for_new_lengths():
    import torch._dynamo.testing

    def loss(q, k, v, mask):
        return nbt.flash_attention(q, k, v, mask=mask, enable_gqa=True).sum()

    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(loss, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for n_q, n_k in ((5, 7), (6, 9), (8, 11)):  # no length equal to another size (duck sizing)
        shapes = ((1, 4, n_q, 12), (1, 2, n_k, 12), (1, 2, n_k, 13))
        q, k, v = _qkv(shapes)
        mask = torch.rand(n_q, n_k) > 0.2
        got, want = compiled(q, k, v, mask), loss(q, k, v, mask)
        assert torch.equal(got, want)
        assert all(map(torch.equal, _grads(got, (q, k, v)), _grads(want, (q, k, v))))
        frames.append(counter.frame_count)
    assert frames[0] == frames[-1]  # (the first compile may restart its analysis once)


# ----------------------------------------------------------------------------- a new user


def test_a_small_model_on_digits_trains_as_with_torch_sdpa():
    """Rows of 8x8 digit images as sequences of 8 tokens, one attention layer: the loss
    curve through nbattn.torch is torch SDPA's, step by step (same seed)."""
    datasets = pytest.importorskip("sklearn.datasets")
    x_all, y_all = datasets.load_digits(return_X_y=True)
    x_all = torch.tensor(x_all / 16.0, dtype=F32).reshape(-1, 8, 8)
    y_all = torch.tensor(y_all)

    class Net(torch.nn.Module):
        def __init__(self, attention, width=16, heads=2):
            super().__init__()
            self.attention, self.heads = attention, heads
            self.embed = torch.nn.Linear(8, width)
            self.position = torch.nn.Parameter(torch.randn(8, width) / 10)
            self.qkv = torch.nn.Linear(width, 3 * width)
            self.mix = torch.nn.Linear(width, width)
            self.classify = torch.nn.Linear(width, 10)

        def forward(self, x):
            z = self.embed(x) + self.position
            n, length, width = z.shape
            q, k, v = self.qkv(z).reshape(n, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            mixed = self.attention(q, k, v).transpose(1, 2).reshape(n, length, width)
            return self.classify((z + self.mix(mixed)).mean(1))

    def curve(attention):
        torch.manual_seed(0)
        model = Net(attention)
        optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
        batches = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(40):
            rows = torch.randint(0, len(x_all), (64,), generator=batches)
            loss = F.cross_entropy(model(x_all[rows]), y_all[rows])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            losses.append(loss.item())
        return np.array(losses)

    ours = curve(lambda q, k, v: nbt.flash_attention(q, k, v, causal=True))
    torchs = curve(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    np.testing.assert_allclose(ours, torchs, rtol=0, atol=1e-5)
    assert ours[-1] < 0.6 * ours[0]


# ----------------------------------------------------------------------------- refusals


def test_forward_mode_derivatives_are_refused_not_returned_as_zero():
    """A tangent through nbattn.torch would be dropped (torch treats a custom operator
    without a forward-mode formula as constant): refused instead."""
    import torch.autograd.forward_ad as fwAD

    q, k, v = _qkv(grad=False)
    with pytest.raises(NotImplementedError, match="forward-mode"):
        torch.func.jvp(lambda q: nbt.flash_attention(q, k, v), (q,), (torch.ones_like(q),))
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode"):
        nbt.flash_attention(q, k, fwAD.make_dual(v, torch.ones_like(v)))
    mask = torch.zeros(5, 7, dtype=F64)
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="forward-mode"):
        nbt.flash_attention(q, k, v, mask=fwAD.make_dual(mask, torch.ones_like(mask)))


@pytest.mark.parametrize("transform", ["grad", "vmap", "jacrev"])
def test_torch_func_transforms_are_refused_with_what_to_use_instead(transform):
    q, k, v = _qkv(grad=False)

    def loss(q):
        return nbt.flash_attention(q, k, v).sum()

    with pytest.raises(NotImplementedError, match=r"torch\.func.*torch\.autograd"):
        getattr(torch.func, transform)(loss)(q)


def test_second_derivatives_are_refused_clearly():
    q, k, v = _qkv()
    out = nbt.flash_attention(q, k, v, causal=True)
    (dq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    (ref,) = _grads(out.square().sum(), (q,))
    assert torch.equal(dq.detach(), ref)  # the first derivative itself is there
    with pytest.raises(NotImplementedError, match="second derivatives"):
        torch.autograd.grad(dq.sum(), (q, k, v))


def test_ints_beyond_int64_are_refused_naming_the_argument():
    q, k, v = _qkv()
    mod_args = with_args(_small_mod_args(), left=2**70)
    with pytest.raises(ValueError, match=r"mod_args\[6\].*int64"):
        nbt.flash_attention(q, k, v, mod_args=mod_args, **MODS)
    for window in ((2**70, None), (0, -(2**70))):
        with pytest.raises(ValueError, match="window"):
            nbt.flash_attention(q, k, v, window=window)


def test_tensors_numpy_cannot_view_are_refused_naming_the_argument():
    q, k, v = _qkv()
    mod_args = _small_mod_args()
    cases = [
        ({"mask": torch.zeros(5, 7, dtype=torch.bfloat16)}, r"mask.*bfloat16.*mask\.float\(\)"),
        ({"mask": torch.ones(5, 7).to_sparse()}, r"mask.*sparse.*to_dense\(\)"),
        (
            {"q": torch.nested.nested_tensor([torch.zeros(5, 4, dtype=F64)], layout=torch.jagged)},
            r"\bq\b.*nested",
        ),
        (
            {**MODS, "mod_args": with_args(mod_args, slopes=mod_args[SLOPES].bfloat16())},
            r"mod_args\[2\].*bfloat16",
        ),
    ]
    for kw, message in cases:
        args = {"q": q, "k": k, "v": v} | kw
        with pytest.raises(ValueError, match=message):
            nbt.flash_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_a_non_function_is_refused_in_its_own_words():
    q, k, v = _qkv()
    for name in ("score_mod", "mask_mod", "score_mod_grad"):
        with pytest.raises(ValueError, match=f"^{name} must be a function, got str$"):
            nbt.flash_attention(q, k, v, **{name: "alibi"})


def test_a_score_mod_written_inside_the_compiled_function_is_refused_with_the_fix():
    """A def or lambda inside the compiled function is a new object each trace, which
    nothing keeps: the message says where to define it."""
    q, k, v = _qkv()

    def loss(q, k, v):
        def inner(score, b, h, q_idx, kv_idx):
            return score * 0.5

        return nbt.flash_attention(q, k, v, score_mod=inner).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match="outside the compiled function"):
        compiled(q, k, v)


def test_the_overflow_message_of_float64_inputs_does_not_advise_float64():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="float64") as info:
        nbt.flash_attention(q * 1e300, k * 1e300, v)
    assert "use float64" not in str(info.value)


def test_fake_outputs_have_the_real_outputs_strides_for_transposed_inputs():
    """q, k, v in the (B, L, H, E) memory of a projection, seen as (B, H, L, E): the
    gradients come back contiguous, and the fake implementations must say so (inductor
    checks the real strides against the fake ones)."""
    q, k, v = (
        x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_()
        for x in _qkv(((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 3)))
    )
    settings = ([], [], [], "", True, None, False, None, None, "top_left", None, 0.0)
    settings += ("", "", "", "", "")
    forward = (q, k, v, None, None, *settings)
    torch.library.opcheck(torch.ops.nbattn.flash_attention.default, forward)
    out, lse = torch.ops.nbattn.flash_attention(*forward)
    backward = (q, k, v, out.detach(), lse, torch.ones_like(out), None, None, *settings)
    checks = ("test_schema", "test_faketensor")  # no autograd: no second derivatives
    torch.library.opcheck(
        torch.ops.nbattn.flash_attention_backward.default, backward, test_utils=checks
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("c++") is None, reason="inductor compiles C++")
def test_inductor_compiles_a_projection_layout_forward_and_backward():
    """torch.compile's default backend on q, k, v transposed out of a projection (the
    layout of every multi-head layer), with the caches off (they key on the graph, not
    on the operators' fake implementations)."""
    import torch._functorch.config
    import torch._inductor.config

    projection = torch.nn.Linear(8, 24, dtype=F64)

    def loss(x):
        n, length, _ = x.shape
        q, k, v = projection(x).reshape(n, length, 3, 2, 4).unbind(2)  # (B, L, H, E)
        out = nbt.flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True)
        return (out.transpose(1, 2).reshape(n, length, 8) * torch.arange(8.0)).sum()

    x = torch.randn(3, 6, 8, dtype=F64, generator=torch.Generator().manual_seed(0))
    want = loss(x)
    (want_grad,) = _grads(want, (projection.weight,))
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        got = torch.compile(loss, fullgraph=True)(x)
        (grad,) = _grads(got, (projection.weight,))
    np.testing.assert_allclose(got.detach(), want.detach(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(grad, want_grad, rtol=0, atol=1e-13)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_under_cpu_autocast_half_precision_inputs_run_in_float32(low):
    """torch.autocast("cpu") makes linear layers give bfloat16 (or float16): the call
    runs them in float32, as autocast runs its float32 operations (softmax, norms), and
    the gradients reach the layer; outside autocast they are refused."""
    projection = torch.nn.Linear(4, 12)
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.randn(5, 5, dtype=low)
    with torch.autocast("cpu", dtype=low):
        q, k, v = projection(x).unflatten(-1, (3, 2, 2)).permute(2, 0, 3, 1, 4)
        assert q.dtype == low
        out = nbt.flash_attention(q, k, v, mask=mask, causal=True)
    assert out.dtype == F32
    want = nbt.flash_attention(q.float(), k.float(), v.float(), mask=mask.float(), causal=True)
    assert torch.equal(out, want)
    (grad,) = _grads(out, (projection.weight,))
    assert grad.dtype == F32 and grad.abs().sum() > 0
    with pytest.raises(ValueError, match="float32 or float64"):
        nbt.flash_attention(q, k, v)


def test_empty_tensors_are_refused_naming_them():
    """A zero-length axis (batch, heads, queries, keys, features) is refused, as by
    nbattn.flash_attention (torch's SDPA returns empty or zero outputs there)."""
    for shapes, name in [
        (((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 3)), "q"),
        (((1, 2, 0, 4), (1, 2, 5, 4), (1, 2, 5, 3)), "q"),
        (((1, 2, 3, 4), (1, 2, 0, 4), (1, 2, 0, 3)), "k"),
        (((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 3)), "q"),
    ]:
        with pytest.raises(ValueError, match=rf"^{name} is empty \(shape"):
            nbt.flash_attention(*_qkv(shapes))


def test_importing_nbattn_and_using_it_imports_no_torch():
    code = (
        "import sys, numpy as np, nbattn, nbattn.attn, nbattn.estimators, nbattn.smoothing\n"
        "x = np.ones((1, 2, 3, 4))\n"
        "nbattn.flash_attention(x, x, x, causal=True)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    assert result.stdout.strip() == "[]"


def test_handles_of_two_processes_never_coincide():
    """A graph exported with torch.export holds its functions' handles as strings: loaded
    in another process, where a different function of the same name took the same
    handle, it ran that function, silently. Each registry (one per process) now makes
    handles of its own, so a foreign handle is an error."""

    def make(factor):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score * factor

        return score_mod

    here, elsewhere = nbt._Handles(), nbt._Handles()
    first, second = make(0.5), make(2.0)
    handle = elsewhere.handle(first, "score_mod")
    assert here.handle(second, "score_mod") != handle
    with pytest.raises(RuntimeError, match="no longer exists|another process"):
        here.get(handle)


def test_batched_grad_outputs_are_refused_clearly_and_jacobians_loop():
    """autograd.grad(is_grads_batched=True), as jacobian(vectorize=True) calls it, runs
    the backward under autograd's own vmap, which cannot loop over these operators:
    refused in words, while jacobian's default (a loop) gives torch's dense one."""
    q, k, v = _qkv(((1, 2, 3, 2), (1, 2, 4, 2), (1, 2, 4, 2)))
    out = nbt.flash_attention(q, k, v, causal=True)
    grad_outs = torch.ones((3, *out.shape), dtype=F64)
    with pytest.raises(NotImplementedError, match="is_grads_batched"):
        torch.autograd.grad(out, (q, k, v), grad_outs, is_grads_batched=True)

    def ours(v):
        return nbt.flash_attention(q.detach(), k.detach(), v, causal=True)

    def dense(v):
        return F.scaled_dot_product_attention(q.detach(), k.detach(), v, is_causal=True)

    jacobian = torch.autograd.functional.jacobian(ours, v)
    want = torch.autograd.functional.jacobian(dense, v)
    np.testing.assert_allclose(jacobian, want, rtol=0, atol=1e-14)
    with pytest.raises(NotImplementedError, match="vectorize=False"):
        torch.autograd.functional.jacobian(ours, v, vectorize=True)
