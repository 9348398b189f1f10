"""nbattn's flash attention for PyTorch: CPU tensors in and out, differentiable in q, k, v
(and in the float tensors of ``mod_args``, given ``score_mod_args_grad``).

It computes::

    s_ij  = cap(scale * q_i . k_j) + mask_ij                       (softcap, mask), or
    s_ij  = score_mod(scale * q_i . k_j, b, h, i, j, *mod_args)    (score_mod),
            -inf where not mask_mod(b, h, i, j, *mod_args)          (mask_mod, block_mask)
    out_i = sum_j drop_ij softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

over the keys j that causal and window admit. :func:`flash_attention` is
:func:`nbattn.flash_attention` on torch tensors: they reach nbattn as NumPy views of
their memory (``Tensor.numpy()``, no copy; nbattn copies what it lays out and never
writes into its inputs), and the results come back as tensors over nbattn's arrays.
Gradients with respect to q, k and v come from
:func:`nbattn.flash_attention_backward` with the same keywords, from the ``out`` and
``lse`` that the forward saved. ``mask`` is a constant (one that requires grad is
refused), and ``lse`` is returned without a gradient. The float tensors of
``mod_args`` (a bias table, slopes, a softcap) get gradients when
``score_mod_args_grad`` is given (see :func:`nbattn.flash_attention_backward`) and
one of them requires grad; without it such a tensor is refused. CUDA tensors are refused:
the operators run nbattn's CPU kernels; so are sparse and nested tensors, and
``mask`` or ``mod_args`` tensors of a dtype NumPy lacks (bfloat16).

Derivatives are first-order and reverse-mode (``backward()``,
``torch.autograd.grad``, ``retain_graph`` included). Differentiating a gradient
again (``create_graph=True``, a Hessian), forward mode (``torch.func.jvp``,
``torch.autograd.forward_ad``) and the ``torch.func`` transforms (``grad``,
``vjp``, ``jacrev``, ``vmap``) raise NotImplementedError, and so do batched
gradients of the output (``torch.autograd.grad(..., is_grads_batched=True)``,
``jacobian(..., vectorize=True)``; ``jacobian``'s default loop works): torch would
refuse these with messages about the operators' registration, and would treat the
operator as a constant in forward mode (a zero tangent, silently).

Importing this module needs PyTorch (``pip install 'nbattn[torch]'``);
``import nbattn`` never imports torch.

With ``torch.compile``: the computation is two operators registered with
``torch.library``, ``torch.ops.nbattn.flash_attention`` and
``torch.ops.nbattn.flash_attention_backward`` (``custom_op`` with a fake
implementation that gives the output shapes, and ``register_autograd``), so a
compiled model sees one opaque operator in the forward graph and one in the
backward. The user's ``score_mod``, ``mask_mod``, ``score_mod_grad`` and
``block_mask`` are Python objects, which an operator cannot take as arguments:
they reach the operators as string handles into a registry of weak references,
taken when the call is traced, and the compiled graph is guarded on the identity
of each of them (a different function or block mask compiles the graph anew, as a
different ``score_mod`` does in PyTorch's FlexAttention). So:

* plain, masked, causal, windowed, grouped-query, softcapped and dropout
  attention, and ``score_mod`` / ``mask_mod`` with their arrays in ``mod_args``,
  compile with ``fullgraph=True``, forward and backward (the tests use the
  ``"eager"`` and ``"aot_eager"`` backends, which need no C++ compiler, and the
  default, inductor, where one is installed: it keeps the two operators as calls
  of their own); the
  tensors of ``mod_args`` are graph inputs, so bias tables, slopes and document ids
  may change from call to call without recompiling, while its numbers are
  constants of the graph, as Python numbers are anywhere in a compiled function (a
  new value compiles anew: pass a value that changes every call as a 0-d tensor);
* a ``block_mask`` is a constant of the compiled graph: one compile per
  block-mask object, which suits a mask made once (a sliding window, a fixed
  document layout); for a mask that changes with every batch pass ``mask_mod``
  with its arrays in ``mod_args``, or call outside the compiled region;
* define ``score_mod`` and ``mask_mod`` outside the compiled function, and keep
  them (and block masks) alive while a compiled function that uses them is in
  use (one defined inside the compiled function lives only while it is traced:
  the call is refused with a message that says so); make each once, not per
  step: every new function object (a closure made again, of the same code and
  values) compiles the graph anew, and torch.compile gives up after its
  recompile limit (8 by default; with ``fullgraph=True`` an error);
* dropout without ``random_state`` draws its seed from torch's generator inside
  the graph (``torch.manual_seed`` makes it reproducible), and the backward
  regenerates the mask from that seed. Inductor draws random numbers its own way,
  as it does for every random operation: compiled there, the seeds (so the masks)
  are not eager's, unless ``torch._inductor.config.fallback_random`` is set.
"""

from __future__ import annotations

import itertools
import secrets
import weakref

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised by a test that hides torch
    raise ImportError(
        "nbattn.torch needs PyTorch, which is not installed: pip install 'nbattn[torch]'"
    ) from exc

import numpy as np
from torch import Tensor
from torch.autograd import forward_ad

from ._core.validation import check_bool, check_scale
from .attn import flash
from .attn.flash_args import check_keywords
from .attn.flex import BlockMask, check_score_functions

__all__ = ["flash_attention"]


# --------------------------------------------------------------------------- handles
class _Handles:
    """User functions and block masks, which cannot be operator arguments, by a string handle.

    A handle is made once per live object (``"score_fn#3@5f0c9a2e"``) and never
    reused; the registry holds weak references, so it keeps nothing alive (a call
    keeps its own objects alive until its backward has run). An object that has been
    collected while a compiled graph still names its handle is an error, never
    another object. The part after ``@`` is drawn at random per registry, so per
    process: a graph saved by ``torch.export`` and loaded in another process names
    handles that no registry there made (an error), never ones that another function
    of the same name took there.
    """

    def __init__(self):
        self._objects = weakref.WeakValueDictionary()  # handle -> object
        self._by_id = {}  # id(object) -> handle, while the object lives
        self._count = itertools.count()
        self._token = secrets.token_hex(4)

    def handle(self, obj, name) -> str:
        """The handle of ``obj`` ("" for None)."""
        if obj is None:
            return ""
        handle = self._by_id.get(id(obj))
        if handle is not None and self._objects.get(handle) is obj:
            return handle
        try:
            weakref.finalize(obj, self._forget, id(obj))
        except TypeError:
            kind = "a function" if name != "block_mask" else "made by nbattn.create_block_mask"
            raise ValueError(f"{name} must be {kind}, got {type(obj).__name__}") from None
        label = getattr(obj, "__qualname__", type(obj).__name__)
        handle = f"{label}#{next(self._count)}@{self._token}"
        self._objects[handle] = obj
        self._by_id[id(obj)] = handle
        return handle

    def _forget(self, key):
        self._by_id.pop(key, None)

    def get(self, handle):
        """The object of ``handle`` (None for "")."""
        if not handle:
            return None
        obj = self._objects.get(handle)
        if obj is None and handle.rpartition("@")[2] != self._token:
            raise RuntimeError(
                f"the function or block mask {handle!r} that this graph calls was made in "
                "another process (a graph saved by torch.export and loaded here): user "
                "functions and block masks cannot travel with a saved graph; export it "
                "again in this process"
            )
        if obj is None:
            raise RuntimeError(
                f"the function or block mask {handle!r} that this compiled graph calls no "
                "longer exists. score_mod, mask_mod, score_mod_grad and block_mask must live "
                "as long as the compiled function that calls them: define them outside the "
                "compiled function (one defined inside it, a def or a lambda there, lives only "
                "while torch.compile traces it) and keep them alive while it is in use"
            )
        return obj


_HANDLES = _Handles()

#: The user's objects that reach the operators as handles, in the operators' order.
_MOD_NAMES = ("score_mod", "mask_mod", "block_mask", "score_mod_grad", "score_mod_args_grad")


@torch.compiler.assume_constant_result
def _register(*objects) -> tuple:
    # Run for real when torch.compile traces the call (its result is a constant of the
    # graph); the caller's id() of each object makes the graph guard their identity.
    return tuple(_HANDLES.handle(obj, name) for obj, name in zip(objects, _MOD_NAMES))


@torch.compiler.assume_constant_result
def _check_score_functions(score_mod, score_mod_grad, args_grad, n_args) -> bool:
    # The forward operator does not take the backward's functions: they are checked at
    # the call, so that a bad one is refused before the forward compiles, with or without
    # a backward to follow (run for real when torch.compile traces the call, like
    # _register: the check reads the functions' code, which dynamo does not trace).
    check_score_functions(score_mod, score_mod_grad, args_grad, n_args)
    return True


def _mod_handles(score_mod, mask_mod, block_mask, score_mod_grad, args_grad=None) -> dict:
    """The handles by argument name, with torch.compile guarding on the objects' identity."""
    objects = (score_mod, mask_mod, block_mask, score_mod_grad, args_grad)
    for obj in objects:
        id(obj)  # traced: a guard on the object itself (not only on a function's code)
    return dict(zip(_MOD_NAMES, _register(*objects)))


# --------------------------------------------------------------------------- arguments
#: The dtypes of tensors that NumPy can view (``Tensor.numpy()``): not bfloat16, the
#: float8 and quantized types, nor the sub-byte ints.
_NUMPY_DTYPES = frozenset(
    getattr(torch, name)
    for name in "bool float16 float32 float64 complex64 complex128".split()
    + [f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)]
    if hasattr(torch, name)  # uint16 ... uint64 are torch 2.3's
)


def _check_tensor(x, name, allow_grad=True, check_dtype=True):
    """``x`` is a dense CPU tensor that NumPy can view (its dtype too, unless
    ``check_dtype`` is False: q, k and v have a stricter rule of their own) and, unless
    ``allow_grad``, requires no grad; a ValueError naming ``name`` otherwise."""
    if not isinstance(x, Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor, got {type(x).__name__} "
            "(nbattn.flash_attention takes NumPy arrays)"
        )
    if x.device.type != "cpu":
        raise ValueError(
            f"{name} is on the {x.device.type} device: nbattn.torch runs nbattn's CPU kernels "
            "and takes CPU tensors only (CUDA tensors are not supported)"
        )
    if x.is_nested:
        raise ValueError(
            f"{name} is a nested tensor: nbattn.torch takes dense tensors (pad the sequences "
            "to one length and pass a mask that leaves the padding out)"
        )
    if x.layout != torch.strided:
        raise ValueError(
            f"{name} is a {x.layout} tensor: nbattn.torch takes dense tensors, pass "
            f"{name}.to_dense()"
        )
    if check_dtype and x.dtype not in _NUMPY_DTYPES:
        raise ValueError(
            f"{name} has dtype {x.dtype}, which NumPy has no type for: pass {name}.float()"
        )
    if not allow_grad and x.requires_grad:
        if name.startswith("mod_args"):
            raise ValueError(
                f"{name} requires grad, but without score_mod_args_grad its gradient is not "
                "built: pass score_mod_args_grad (the chain rule of score_mod with respect to "
                "its mod_args, see nbattn.flash_attention_backward) to learn it, or "
                f"{name}.detach() to use it as a constant"
            )
        raise ValueError(
            f"{name} requires grad, but nbattn.torch builds no gradient for it (gradients with "
            f"respect to masks and bias tables are not built): pass {name}.detach() to use "
            "it as a constant"
        )


def _check_int64(value, name, hint=""):
    """``value`` (an int) as an int that fits in int64, the operators' int; a ValueError
    naming ``name`` (and ending in ``hint``) otherwise."""
    if not -(2**63) <= int(value) < 2**63:
        raise ValueError(f"{name} must fit in int64, got {value}{hint}")
    return int(value)


def _autocast(x):
    """Under ``torch.autocast("cpu")``, a float16 or bfloat16 tensor as float32 (as autocast
    runs its float32 operations: nbattn's kernels run float32 and float64); anything
    else as it is."""
    if (
        isinstance(x, Tensor)
        and x.dtype in (torch.float16, torch.bfloat16)
        and torch.is_autocast_enabled("cpu")
    ):
        return x.float()
    return x


def _check_qkv(q, k, v):
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_tensor(x, name, check_dtype=False)
    dtypes = {q.dtype, k.dtype, v.dtype}
    if len(dtypes) > 1 or q.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"q, k and v must share one dtype, float32 or float64; got {q.dtype}, {k.dtype}, "
            f"{v.dtype}"
        )


def _split_mod_args(mod_args, learn=False):
    """``mod_args`` as (tensors, ints, floats, kinds) for the operators: the tensors, the
    bools and ints, the floats, and per entry its kind ("t" tensor, "b" bool, "i" int,
    "f" float), from which the operators put the tuple back together. A tensor that
    requires grad is refused unless ``learn`` (``score_mod_args_grad`` given)."""
    if mod_args is None:
        mod_args = ()
    if not isinstance(mod_args, tuple):
        raise ValueError(
            f"mod_args must be a tuple of tensors and numbers, got {type(mod_args).__name__}"
        )
    tensors, ints, floats, kinds = [], [], [], ""
    for n, arg in enumerate(mod_args):
        name = f"mod_args[{n}]"
        if isinstance(arg, Tensor):
            _check_tensor(arg, name, allow_grad=learn)
            tensors.append(arg)
            kinds += "t"
        elif isinstance(arg, (bool, np.bool_)):
            ints.append(int(arg))
            kinds += "b"
        elif isinstance(arg, (int, np.integer)):
            ints.append(_check_int64(arg, name))
            kinds += "i"
        elif isinstance(arg, (float, np.floating)):
            floats.append(float(arg))
            kinds += "f"
        else:
            raise ValueError(f"{name} must be a torch.Tensor or a number, got {type(arg).__name__}")
    return tensors, ints, floats, kinds


def _numpy(x):
    """A CPU tensor's memory as a NumPy array (no copy; nbattn copies what it keeps)."""
    return x.detach().numpy()


def _join_mod_args(tensors, ints, floats, kinds):
    """The ``mod_args`` tuple that nbattn takes (arrays and numbers), back from the parts."""
    tensors, ints, floats = iter(tensors), iter(ints), iter(floats)
    joined = []
    for kind in kinds:
        if kind == "t":
            joined.append(_numpy(next(tensors)))
        elif kind == "b":
            joined.append(bool(next(ints)))
        elif kind == "i":
            joined.append(int(next(ints)))
        else:
            joined.append(float(next(floats)))
    return tuple(joined)


def _dropout_seed(dropout_p, random_state):
    """The dropout seed as a 0-d int64 tensor (None without dropout): ``random_state``,
    or one draw from torch's generator when it is None."""
    if dropout_p == 0.0:
        return None
    if random_state is None:
        return torch.randint(0, 2**63 - 1, (), dtype=torch.int64)
    if isinstance(random_state, (bool, np.bool_)) or not isinstance(
        random_state, (int, np.integer)
    ):
        raise ValueError(
            "random_state must be None or an int (the backward regenerates the dropout mask "
            f"from it), got {type(random_state).__name__}"
        )
    return torch.tensor(_check_int64(random_state, "random_state"), dtype=torch.int64)


def _nbattn_call(arguments: dict) -> tuple[list, dict]:
    """The arrays and keywords of nbattn's flash_attention (or, given ``grad_out``, its
    backward) from an operator's arguments by name."""
    arrays = [_numpy(arguments[name]) for name in _ARRAYS if name in arguments]
    left, right = arguments["window_left"], arguments["window_right"]
    mask, seed = arguments["mask"], arguments["seed"]
    keywords = dict(
        causal=arguments["causal"],
        scale=arguments["scale"],
        mask=None if mask is None else _numpy(mask),
        enable_gqa=arguments["enable_gqa"],
        window=None if left is None and right is None else (left, right),
        causal_alignment=arguments["causal_alignment"],
        softcap=arguments["softcap"],
        dropout_p=arguments["dropout_p"],
        random_state=None if seed is None else int(seed),
        mod_args=_join_mod_args(*(arguments[name] for name in _MOD_PARTS)),
        **{name: _HANDLES.get(arguments[name]) for name in _MOD_NAMES},
    )
    if "grad_out" not in arguments:
        del keywords["score_mod_grad"]  # the backward's alone
        del keywords["score_mod_args_grad"]
    return arrays, keywords


_ARRAYS = ("q", "k", "v", "out", "lse", "grad_out")
_MOD_PARTS = ("mod_tensors", "mod_ints", "mod_floats", "mod_kinds")


def _output_lead(q, k, v, mask, enable_gqa):
    """The leading dimensions of ``out``: those of q, k and v (k and v with q's heads
    under ``enable_gqa``) and the mask's, broadcast (``nbattn.attn.flash_args.kv_layout``
    in torch's terms, for symbolic shapes)."""
    q_lead = tuple(q.shape[:-2])
    kv_lead = tuple(torch.broadcast_shapes(k.shape[:-2], v.shape[:-2]))
    if enable_gqa and q_lead and kv_lead:
        kv_lead = kv_lead[:-1] + (q_lead[-1],)  # H_kv heads serve H query heads
    leads = [q_lead, kv_lead]
    if mask is not None and mask.dim() > 2:
        leads.append(tuple(mask.shape[:-2]))
    return tuple(torch.broadcast_shapes(*leads))


# --------------------------------------------------------------------------- operators
@torch.library.custom_op("nbattn::flash_attention", mutates_args=())
def _forward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    seed: Tensor | None,
    mod_tensors: list[Tensor],
    mod_ints: list[int],
    mod_floats: list[float],
    mod_kinds: str,
    causal: bool,
    scale: float | None,
    enable_gqa: bool,
    window_left: int | None,
    window_right: int | None,
    causal_alignment: str,
    softcap: float | None,
    dropout_p: float,
    score_mod: str,
    mask_mod: str,
    block_mask: str,
    score_mod_grad: str,
    score_mod_args_grad: str,
) -> tuple[Tensor, Tensor]:
    """(out, lse) of :func:`nbattn.flash_attention`; ``score_mod_grad`` and
    ``score_mod_args_grad`` are for the backward."""
    arrays, keywords = _nbattn_call(locals())  # the arguments above, by name
    out, lse = flash.flash_attention(*arrays, return_lse=True, **keywords)
    return _tensor(out), _tensor(lse)


def _tensor(array):
    """A result as a contiguous tensor over its memory (a copy only where nbattn's array
    is not C-contiguous), the layout the fake implementations give: inductor checks
    the real strides against the fake ones."""
    return torch.from_numpy(np.ascontiguousarray(array))


@_forward_op.register_fake
def _forward_shapes(
    q, k, v, mask, seed, mod_tensors, ints, floats, kinds, causal, scale, enable_gqa, *rest
):
    lead = _output_lead(q, k, v, mask, enable_gqa)
    n_q, d_v = q.shape[-2], v.shape[-1]
    return q.new_empty(lead + (n_q, d_v)), q.new_empty(lead + (n_q,), dtype=torch.float64)


@torch.library.custom_op("nbattn::flash_attention_backward", mutates_args=())
def _backward_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    mask: Tensor | None,
    seed: Tensor | None,
    mod_tensors: list[Tensor],
    mod_ints: list[int],
    mod_floats: list[float],
    mod_kinds: str,
    causal: bool,
    scale: float | None,
    enable_gqa: bool,
    window_left: int | None,
    window_right: int | None,
    causal_alignment: str,
    softcap: float | None,
    dropout_p: float,
    score_mod: str,
    mask_mod: str,
    block_mask: str,
    score_mod_grad: str,
    score_mod_args_grad: str,
) -> tuple[Tensor, Tensor, Tensor, list[Tensor]]:
    """(dq, dk, dv, the gradients of the float tensors of ``mod_tensors``) of
    :func:`nbattn.flash_attention_backward` (the list empty without
    ``score_mod_args_grad``)."""
    arrays, keywords = _nbattn_call(locals())  # the arguments above, by name
    grads = flash.flash_attention_backward(*arrays, **keywords)
    d_args = [] if len(grads) == 3 else [g for g in grads[3] if g is not None]
    learned = [t for t in mod_tensors if t.is_floating_point()]
    d_args = [_tensor(g).reshape(t.shape).to(t.dtype) for g, t in zip(d_args, learned)]
    return (*(_tensor(g) for g in grads[:3]), d_args)


@_backward_op.register_fake
def _backward_shapes(q, k, v, out, lse, grad_out, mask, seed, mod_tensors, *rest):
    # contiguous, as _tensor makes them (empty_like would keep a transposed q's strides)
    learned = [t.new_empty(t.shape) for t in mod_tensors if t.is_floating_point()]
    d_args = learned if rest[-1] else []
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), d_args


def _save_for_backward(ctx, inputs, output):
    q, k, v, mask, seed, mod_tensors, *settings = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse, mask, seed, *mod_tensors)
    ctx.settings = settings  # mod_ints ... score_mod_args_grad, as the backward operator takes them
    # the user's objects stay alive until the backward has run (the registry holds
    # them weakly): a score_mod written inline as a lambda is still there
    ctx.objects = [_HANDLES.get(handle) for handle in settings[-len(_MOD_NAMES) :]]


def _gradients(ctx, grad_out, grad_lse):
    if _is_legacy_batched(grad_out):
        raise NotImplementedError(
            "nbattn.torch's backward takes one gradient of the output at a time: "
            "torch.autograd.grad(..., is_grads_batched=True) and "
            "torch.autograd.functional.jacobian(..., vectorize=True) are not supported "
            "(jacobian with vectorize=False is)"
        )
    q, k, v, out, lse, mask, seed, *mod_tensors = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, d_args = _backward_op(
        q, k, v, out, lse, grad_out, mask, seed, mod_tensors, *ctx.settings
    )
    d_mod = _no_gradient(mod_tensors)
    if ctx.settings[-1]:  # score_mod_args_grad: the float tensors' gradients, in order
        learned = iter(d_args)
        d_mod = [next(learned) if t.is_floating_point() else None for t in mod_tensors]
    others = (_no_gradient(arg) for arg in ctx.settings)
    return (dq, dk, dv, None, None, d_mod, *others)


def _is_legacy_batched(x):
    """``x`` is batched by autograd's own vmap (``is_grads_batched``), which cannot loop
    over an operator with a list of tensors among its arguments."""
    test = getattr(torch._C._functorch, "is_legacy_batchedtensor", None)
    return x is not None and test is not None and test(x)


def _no_gradient(arg):
    """No gradient for one input, in its structure: a list of Nones for a list of
    tensors (an empty list included), None for anything else (a list of numbers too)."""
    if isinstance(arg, list) and all(isinstance(a, Tensor) for a in arg):
        return [None] * len(arg)
    return None


_forward_op.register_autograd(_gradients, setup_context=_save_for_backward)


def _no_second_derivatives(ctx, *grads):
    raise NotImplementedError(
        "nbattn.torch computes first derivatives only: no second derivatives (a gradient "
        "taken with create_graph=True and differentiated again, a Hessian, a gradient "
        "penalty through the attention)"
    )


# Without it, differentiating the backward's results would fail with a message about
# registering an autograd formula.
_backward_op.register_autograd(_no_second_derivatives)


def _check_differentiation(tensors):
    """Refuse what torch would get wrong or refuse obscurely: forward-mode derivatives
    (torch.func.jvp, torch.autograd.forward_ad), which would come back as zeros (torch
    sees an operator without a forward-mode formula as a constant), and the torch.func
    transforms grad, vjp, jacrev and vmap, which custom operators like these do not
    support. Eager calls only: under torch.compile the transforms are traced apart."""
    if torch.compiler.is_compiling():
        return
    stack = torch._C._functorch.get_interpreter_stack() or ()
    transforms = {interpreter.key() for interpreter in stack}
    transforms.discard(torch._C._functorch.TransformType.Functionalize)
    if torch._C._functorch.TransformType.Jvp in transforms or any(
        isinstance(x, Tensor) and forward_ad.unpack_dual(x).tangent is not None for x in tensors
    ):
        raise NotImplementedError(
            "nbattn.torch computes no forward-mode derivatives (torch.func.jvp, "
            "torch.autograd.forward_ad): the tangent would be lost; use reverse mode "
            "(backward(), torch.autograd.grad)"
        )
    if transforms:
        raise NotImplementedError(
            "nbattn.torch does not run under torch.func transforms (grad, vjp, jacrev, "
            "vmap): take gradients with torch.autograd (backward(), torch.autograd.grad) "
            "and batch through the leading dimensions, which broadcast"
        )


# --------------------------------------------------------------------------- public
def flash_attention(
    q,
    k,
    v,
    *,
    causal=False,
    scale=None,
    mask=None,
    enable_gqa=False,
    window=None,
    causal_alignment="top_left",
    softcap=None,
    dropout_p=0.0,
    random_state=None,
    score_mod=None,
    mask_mod=None,
    block_mask=None,
    mod_args=(),
    score_mod_grad=None,
    score_mod_args_grad=None,
    return_lse=False,
):
    """:func:`nbattn.flash_attention` on CPU torch tensors, differentiable in q, k and v::

        s_ij  = cap(scale * q_i . k_j) + mask_ij                       (softcap, mask), or
        s_ij  = score_mod(scale * q_i . k_j, b, h, i, j, *mod_args)    (score_mod),
                -inf where not mask_mod(b, h, i, j, *mod_args)          (mask_mod, block_mask)
        out_i = sum_j drop_ij softmax_j(s_ij) v_j,   lse_i = log sum_j exp(s_ij)

    over the keys j that ``causal`` and ``window`` admit (``mask``, ``softcap`` and
    ``dropout_p`` are not combined with ``score_mod``, ``mask_mod`` or
    ``block_mask``, as in :func:`nbattn.flash_attention`). The backward is
    :func:`nbattn.flash_attention_backward` with the same keywords, from the saved
    ``out`` and ``lse``. Composes with ``torch.compile`` (see the module docstring).

    Parameters
    ----------
    q, k, v : torch.Tensor (..., L, E), (..., S, E), (..., S, Ev)
        CPU tensors of one dtype, float32 or float64, any strides (under
        ``torch.autocast("cpu")``, float16 and bfloat16 ones, and such a float
        mask, run in float32, as autocast's float32 operations do). Leading
        dimensions broadcast as in :func:`nbattn.flash_attention`; with
        ``score_mod``, ``mask_mod`` or ``block_mask``, q is (B, H, L, E), (H, L, E)
        or (L, E).
    causal, scale, enable_gqa, window, causal_alignment, softcap, dropout_p
        As in :func:`nbattn.flash_attention`.
    mask : torch.Tensor, optional
        Boolean (True = may attend) or float (added to the scores), broadcastable
        to (..., L, S). A constant: a mask that requires grad is refused
        (gradients with respect to masks and bias tables are not built).
    random_state : int, optional
        The dropout seed; None draws one from torch's generator (so
        ``torch.manual_seed`` fixes it). The backward reuses it.
    score_mod, mask_mod, block_mask, score_mod_grad, score_mod_args_grad
        Python (or numba-jitted) functions with FlexAttention's signatures,
        compiled into nbattn's kernels with numba, and a block mask from
        :func:`nbattn.create_block_mask` (whose ``mod_args`` are NumPy arrays, for
        example ``doc.numpy()``), as in :func:`nbattn.flash_attention` and
        :func:`nbattn.flash_attention_backward`.
    mod_args : tuple of torch.Tensor and numbers
        The trailing arguments of ``score_mod`` and ``mask_mod``; the functions see
        the tensors as NumPy arrays over the same memory. A float tensor that
        requires grad gets its gradient from ``score_mod_args_grad`` (in its dtype;
        none for the other entries); without that function it is refused.
    return_lse : bool
        Also return ``lse`` (..., L), float64, without a gradient.

    Returns
    -------
    out : torch.Tensor (..., L, Ev) in q's dtype, or ``(out, lse)``.
        A row with no admissible key gives zeros and lse = -inf.

    Raises
    ------
    ValueError
        Naming the argument: a tensor that is not on the CPU, a sparse or nested
        tensor, q, k and v not of one float32 / float64 dtype, a mask (or a
        ``mod_args`` tensor without ``score_mod_args_grad``) that requires grad, a
        ``mod_args`` tensor whose dtype NumPy lacks
        (bfloat16), a ``mod_args`` entry that is not a tensor or a number, an int
        (in ``mod_args``, ``window``, ``random_state``) beyond int64, and everything
        :func:`nbattn.flash_attention` refuses, an empty tensor among them (a
        zero-length batch, head, query, key or feature axis, where torch's
        ``scaled_dot_product_attention`` returns an empty or zero output).
    NotImplementedError
        Under forward-mode differentiation (``torch.func.jvp``,
        ``torch.autograd.forward_ad``) or a ``torch.func`` transform (``grad``,
        ``vjp``, ``jacrev``, ``vmap``); and in the backward, when a gradient is
        differentiated again (second derivatives) or the gradients of the output
        come batched (``is_grads_batched=True``).
    """
    q, k, v, mask = (_autocast(x) for x in (q, k, v, mask))
    _check_qkv(q, k, v)
    _check_differentiation((q, k, v, mask, *(mod_args if isinstance(mod_args, tuple) else ())))
    return_lse = check_bool(return_lse, "return_lse")
    if scale is not None:
        scale = check_scale(scale, q.shape[-1])
    if mask is not None:
        _check_tensor(mask, "mask", allow_grad=False)
    if block_mask is not None and not isinstance(block_mask, BlockMask):
        raise ValueError(
            f"block_mask must come from nbattn.create_block_mask, got {type(block_mask).__name__}"
        )
    kw = check_keywords(causal, enable_gqa, window, causal_alignment, softcap, dropout_p)
    window_left, window_right = [
        None if side is None else _check_int64(side, f"window {which} side", " (None: unbounded)")
        for side, which in zip(kw.window or (None, None), ("left", "right"))
    ]
    tensors, ints, floats, kinds = _split_mod_args(mod_args, score_mod_args_grad is not None)
    _check_score_functions(score_mod, score_mod_grad, score_mod_args_grad, len(mod_args or ()))
    if not any(t.requires_grad and t.is_floating_point() for t in tensors):
        score_mod_args_grad = None  # nothing to learn: the backward builds no such gradient
    out, lse = _forward_op(
        q,
        k,
        v,
        mask,
        _dropout_seed(kw.dropout_p, random_state),
        tensors,
        mod_ints=ints,
        mod_floats=floats,
        mod_kinds=kinds,
        causal=kw.causal,
        scale=scale,
        enable_gqa=kw.enable_gqa,
        window_left=window_left,
        window_right=window_right,
        causal_alignment=kw.causal_alignment,
        softcap=kw.softcap,
        dropout_p=kw.dropout_p,
        **_mod_handles(score_mod, mask_mod, block_mask, score_mod_grad, score_mod_args_grad),
    )
    return (out, lse) if return_lse else out
