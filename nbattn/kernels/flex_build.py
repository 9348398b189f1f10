"""Specialised flex kernels: the template ``nbattn.kernels.flex`` with a user's
``score_mod``, ``mask_mod`` and ``score_grad`` compiled in, cached across processes.

A kernel that takes a jitted function as an argument is specialised on it,
but numba's on-disk cache cannot hold such a kernel (the function is part of
its type, and a function type does not survive the process). So each
combination of user functions and types of ``mod_args`` gets a module of its
own: the template's source is written, once, to ``<cache dir>/nbattn_flex_<key>.py``,
imported under that name, and the user's functions are bound to its globals
``score_mod``, ``mask_mod``, ``score_grad`` (and ``value_and_grad`` to the
complex step or to the user's derivative), and the types of ``mod_args`` to
``ARGS`` (its tile functions read them from an address: the loops they run in
are compiled once, whatever the types), before anything compiles. numba's
``cache=True`` then works for that module as for any other: a second
process that asks for the same functions imports the same file and loads
its compiled kernels from disk, without compiling the user's functions at
all.

The key is a SHA-256 of the template's source and of each function's
fingerprint (:func:`fingerprint`): its module and name, bytecode, constants, names, defaults
and the values it reads from its globals and closure (numbers, strings,
modules by name, other functions recursively), including those read through a
module (``helpers.SCALE``: by value, as numba freezes it); jitted helpers of any
target (CPU, CUDA) by their code, builtins, ufuncs, library functions, classes,
numba types, dtypes and enum members by name. Any other object read is refused
(:class:`UnknownValue`: nothing of it could key a file shared between processes);
the GPU's in-process cache keys it by identity instead. numba freezes a
global, closed-over or module-attribute array into compiled code, where a
later change of the array would go unseen: such functions are refused (pass
the array in ``mod_args``). A function that is jitted already is compiled
anew from its ``py_func`` (its dispatcher may hold code compiled with older
values of its globals). The cache directory is ``$NBATTN_FLEX_DIR``, else
``$XDG_CACHE_HOME/nbattn/flex`` (``~/.cache/nbattn/flex``), else a fresh
temporary directory when neither can be written.

The gradients with respect to ``mod_args`` are a second template,
``nbattn.kernels.flex_args``, specialised the same way on (``score_mod``,
``mask_mod``, ``score_mod_args_grad``) into ``nbattn_flex_args_<key>.py``
(:func:`specialise_args`): only calls that pass ``score_mod_args_grad`` build it.
"""

from __future__ import annotations

import dis
import enum
import hashlib
import importlib.util
import inspect
import math
import os
import re
import sys
import tempfile
import threading
import types
from pathlib import Path

import numpy as np
from numba import njit, typeof
from numba import types as nb_types
from numba.core.errors import NumbaError, TypingError
from numba.core.registry import CPUDispatcher

from .. import config
from .flex_shared import tanh

__all__ = [
    "block_states",
    "call",
    "call_args",
    "check",
    "check_signature",
    "fingerprint",
    "specialise",
    "specialise_args",
    "tanh",
]

_TEMPLATE = Path(__file__).with_name("flex.py")
#: The template's source, read once.
_SOURCE = _TEMPLATE.read_text()
_SOURCE_BYTES = _SOURCE.encode()


def _kernel_sources_hash() -> str:
    """A hash of every module of ``nbattn.kernels`` and ``nbattn._core``: a generated module
    is keyed by it, so one that an older nbattn wrote (whose numba cache holds that
    nbattn's helpers, compiled and linked its way) is never loaded by a newer one."""
    digest = hashlib.sha256()
    for package in (_TEMPLATE.parent, _TEMPLATE.parent.parent / "_core"):
        for path in sorted(package.glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


#: The sources' hash (read once; a module is keyed by it).
_SOURCE_HASH = _kernel_sources_hash()
_ARGS_BYTES = _TEMPLATE.with_name("flex_args.py").read_bytes()
_MODULES: dict = {}
#: Held while a module is loaded and its functions bound: a second thread asking for the
#: same functions meanwhile would get the half-executed module (no kernels yet, or the
#: template's defaults where the user's functions belong, which numba could compile,
#: and cache on disk, in their place).
_LOCK = threading.RLock()
#: The scores at which the backward's check compares the complex step with a finite
#: difference of ``score_mod``.
_PROBES = np.array([-3.1, -0.7, 0.4, 2.9])
_DIR: list = []


def _cache_dir() -> Path:
    """The directory of the generated modules (made on first use)."""
    if _DIR:
        return _DIR[0]
    base = os.environ.get("NBATTN_FLEX_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "nbattn", "flex")
    path = Path(base)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, delete=True)
        probe.close()
    except OSError:
        path = Path(tempfile.mkdtemp(prefix="nbattn_flex_"))
    _DIR.append(path)
    return path


def _py_func(fn):
    return fn.py_func if isinstance(fn, CPUDispatcher) else fn


class UnknownValue(ValueError):
    """A user function reads an object whose effect on the compiled code nbattn cannot
    describe by value (the on-disk key refuses it)."""


#: The objects printed by identity into in-process keys (:func:`fingerprint` with
#: ``process=True``), held so that no other object takes their id while the process runs.
_HELD: dict = {}


def _is_jitted(value):
    """A numba dispatcher of any target (CPU, CUDA, the CUDA simulator): it has the plain
    function it compiles as ``py_func``."""
    return isinstance(getattr(value, "py_func", None), types.FunctionType)


def _importable(value):
    """Whether ``value`` is what its own ``__module__`` and ``__qualname__`` name (a class,
    a library function such as ``np.clip``): then those names say what it is."""
    module = sys.modules.get(getattr(value, "__module__", None) or "")
    qualname = getattr(value, "__qualname__", None)
    if module is None or not isinstance(qualname, str):
        return False
    found = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found is value


def _value_print(value, name, where, depth, seen, process=False):
    """A stable description of a value a user function reads, for the key: by value
    (numbers, strings, tuples), by code (functions and jitted functions, recursively)
    or by a name that fixes what it is (modules, builtins, ufuncs, classes, numba
    types, dtypes, enum members). Anything else is refused (:class:`UnknownValue`)
    unless ``process``, where it is printed by its identity (an in-process key)."""
    if isinstance(value, np.ndarray):
        kind = "closure" if where.startswith("closure") else "globals"
        if "." in where:
            kind = "module " + where.rsplit(".", 1)[0]
        raise ValueError(
            f"{name} reads the array {where!r} from its {kind}: numba would freeze "
            "it into the compiled kernel (later changes unseen); pass it in mod_args and take "
            "it as a trailing argument"
        )
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, enum.Enum):
        kind = type(value)
        return ("enum", kind.__module__, kind.__qualname__, value.name, repr(value.value))
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), np.number, np.bool_)):
        return (type(value).__name__, repr(value))
    if isinstance(value, (tuple, list)):
        items = tuple(_value_print(v, name, where, depth, seen, process) for v in value)
        return (type(value).__module__, type(value).__qualname__, items)
    if isinstance(value, types.FunctionType) or _is_jitted(value):
        return _function_print(value, name, depth + 1, seen, process)
    if isinstance(value, (types.BuiltinFunctionType, np.ufunc)) or _importable(value):
        module = getattr(value, "__module__", None) or type(value).__module__
        label = getattr(value, "__qualname__", None) or value.__name__
        return ("named", type(value).__module__, type(value).__qualname__, module, label)
    if isinstance(value, (nb_types.Type, np.dtype)):
        return (type(value).__module__, type(value).__qualname__, repr(value))
    if process:
        _HELD[id(value)] = value
        return ("object", type(value).__module__, type(value).__qualname__, id(value))
    kind = "closure" if where.startswith("closure") else "globals"
    raise UnknownValue(
        f"{name} reads {where!r} from its {kind}, a {type(value).__qualname__}: nbattn cannot "
        "tell from its value what numba compiles of it; pass it in mod_args or use numbers, "
        "tuples, functions or modules"
    )


def _code_print(code):
    consts = tuple(
        _code_print(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts
    )
    return (code.co_code, consts, code.co_names, code.co_varnames, code.co_argcount, code.co_flags)


def _function_print(fn, name, depth, seen, process=False):
    if depth > 8:
        return ("deep",)
    options = ()
    if _is_jitted(fn):
        target = getattr(fn, "targetoptions", None) or {}
        options = (type(fn).__qualname__, tuple(sorted((k, repr(v)) for k, v in target.items())))
        fn = fn.py_func
    if id(fn) in seen:
        return ("recursive", fn.__qualname__)
    seen = seen | {id(fn)}
    code = fn.__code__

    def value(v, where):
        return _value_print(v, name, where, depth, seen, process)

    reads = []
    for g in _global_names(code):
        if g in fn.__globals__:
            reads.append((g, value(fn.__globals__[g], g)))
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    for var, cell in cells.items():
        reads.append((var, value(cell.cell_contents, f"closure {var}")))
    for where, v in _module_reads(code, fn.__globals__, cells):
        reads.append((where, value(v, where)))
    defaults = tuple(value(d, "default") for d in fn.__defaults__ or ())
    # its module and name too: numba's cache refers to the function by them, and a kernel
    # cached for the same code under another module name fails to load
    where = (fn.__module__, fn.__qualname__)
    return (where, _code_print(code), tuple(reads), defaults, options)


def _module_reads(code, globals_, cells):
    """``(dotted name, value)`` of every attribute read through a module (``helpers.SCALE``,
    ``np.linalg.norm``) in ``code`` and its nested code: numba freezes those values into
    the compiled code as it does plain globals, so the key must hold them too."""
    reads = []
    value = None
    dotted = ""
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            value, dotted = globals_.get(ins.argval), ins.argval
        elif ins.opname == "LOAD_DEREF" and ins.argval in cells:
            try:
                value, dotted = cells[ins.argval].cell_contents, ins.argval
            except ValueError:  # an empty cell
                value = None
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(value, types.ModuleType):
            dotted = f"{dotted}.{ins.argval}"
            value = getattr(value, ins.argval, None)
            if not isinstance(value, types.ModuleType):
                reads.append((dotted, value))
        else:
            value = None
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            reads.extend(_module_reads(c, globals_, cells))
    return reads


def _global_names(code):
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(_global_names(c))
    return sorted(names)


def fingerprint(fn, name, process=False) -> str:
    """SHA-256 of what determines ``fn``'s compiled code (None for no function).

    An object read by ``fn`` that is neither a value, a function nor a named thing
    (module, builtin, ufunc, class, numba type, dtype, enum member) is refused with
    :class:`UnknownValue` (naming ``name``): the key of the on-disk cache must not
    depend on the process. With ``process=True`` (keys of an in-process cache: the GPU
    kernels) such an object is printed by its identity instead, and held for the
    life of the process, so that two objects never share a key."""
    if fn is None:
        return "none"
    text = repr(_function_print(fn, name, 0, frozenset(), process))
    return hashlib.sha256(text.encode()).hexdigest()


def _as_compiled(py):
    """``py`` as numba compiles it: a new function of its code, defaults and closure, so
    that its signature is the code's, not a ``__signature__`` or a ``functools.wraps``
    ``__wrapped__`` that numba would not follow when it reads the arguments."""
    plain = types.FunctionType(
        py.__code__, py.__globals__, py.__name__, py.__defaults__, py.__closure__
    )
    plain.__kwdefaults__ = py.__kwdefaults__
    return plain


def check_signature(fn, name, n_fixed, n_args, fixed_names):
    """A ValueError naming ``name`` unless ``fn`` is callable with ``n_fixed`` + ``n_args``
    positional arguments (``fixed_names`` first, then one per ``mod_args`` entry) and
    takes no keyword-only parameter and no ``**kwargs``."""
    if not callable(fn):
        raise ValueError(f"{name} must be a function, got {type(fn).__name__}")
    if not isinstance(_py_func(fn), types.FunctionType):
        raise TypeError(
            f"{name} must be a plain function (def or lambda, optionally numba.njit), got "
            f"{type(fn).__name__}: pass a plain function; put parameters in mod_args"
        )
    try:
        sig = inspect.signature(_as_compiled(_py_func(fn)))
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    by_keyword = [p for p in params if p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD)]
    if by_keyword:
        # numba calls the function positionally and compiles neither kind
        raise ValueError(
            f"{name} has the keyword-only parameter {by_keyword[0]}, which numba cannot "
            f"compile: make it positional, or pass its value in mod_args; {name}{sig}"
        )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = n_fixed + n_args
    required = [p for p in positional if p.default is p.empty]
    # *args takes any number beyond the named parameters, never fewer than the required
    most = math.inf if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional)
    if len(required) <= needed <= most:
        return
    if most == len(required):
        takes = str(most)
    elif most == math.inf:
        takes = f"{len(required)} or more"
    else:
        takes = f"{len(required)} to {most}"
    raise ValueError(
        f"{name} must take ({fixed_names}) and one more argument per mod_args entry "
        f"({n_args} given): {needed} in all; it takes {takes}: {sig}"
    )


def float32_constants(fn):
    """``fn`` (a plain or jitted function; None stays None) with the Python floats it
    reads made ``numpy.float32``: the constants of its code (nested code and tuples
    included), its closure cells, the module globals it names and its defaults; a new
    plain function, ``fn`` itself untouched. A module's attributes (``math.pi``,
    ``np.pi``) stay as they are.

    What torch's FlexAttention computes for a float32 call: there a Python float is a
    "weak" scalar that takes the tensor's dtype, so ``30.0 * tanh(score / 30.0)`` (or
    ``cap * tanh(score / cap)`` with ``cap`` a closure's float) computes in float32;
    numba types a Python float as a float64, so the same function would compute in
    float64 and round at the end (1.4-1.5x slower for a tanh softcap). Floats written
    ``np.float64(c)``, float64 ``mod_args``, the floats of other functions it calls and
    int64 indices (numba's int64 with a float32 is a float64) stay float64, and so does
    a float that float32 cannot hold (finite beyond its range, or below its smallest
    normal number but not 0), which torch would turn into inf or 0 silently: its
    arithmetic then stays float64, and a score beyond float32 is refused as before."""
    if fn is None:
        return None
    py = _py_func(fn)
    small, large = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)

    def weak(c):
        if type(c) is float and (c == 0.0 or not math.isfinite(c) or small <= abs(c) <= large):
            return np.float32(c)
        if isinstance(c, types.CodeType):
            return convert(c)
        if type(c) is tuple:
            return tuple(weak(x) for x in c)
        return c

    def convert(code):
        return code.replace(co_consts=tuple(weak(c) for c in code.co_consts))

    def cell(old):
        try:
            return types.CellType(weak(old.cell_contents))
        except ValueError:  # an empty cell
            return old

    globals_ = py.__globals__
    floats = {
        name: weak(globals_[name])
        for name in _global_names(py.__code__)
        if type(globals_.get(name)) is float
    }
    if floats:  # a copy of the module's namespace with those names float32
        globals_ = {**globals_, **floats}
    closure = None if py.__closure__ is None else tuple(cell(c) for c in py.__closure__)
    defaults = None if py.__defaults__ is None else tuple(weak(d) for d in py.__defaults__)
    out = types.FunctionType(convert(py.__code__), globals_, py.__name__, defaults, closure)
    if py.__kwdefaults__ is not None:
        out.__kwdefaults__ = {k: weak(d) for k, d in py.__kwdefaults__.items()}
    out.__qualname__ = py.__qualname__
    out.__module__ = py.__module__
    return out


def _jitted(fn):
    """A fresh dispatcher of ``fn`` (of its ``py_func`` when jitted already): a user's
    dispatcher may hold an overload compiled with the values its globals had then, which
    numba would link into the new kernel however the key has changed."""
    if fn is None:
        return None
    return njit(fastmath=config.FASTMATH)(_py_func(fn))


def _write(path: Path, source: bytes):
    """``source`` written to ``path`` atomically (a temporary file replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)  # the folder may have been removed
    tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(source)
    os.replace(tmp, path)


def _load(key: str, prefix="nbattn_flex", source=None):
    """The generated module ``<prefix>_<key>`` (of the template ``source``, by default
    ``flex.py``'s): written once, imported once per process.

    A file that is not the template's source (truncated, edited, from another
    version) is written anew before it is imported; a module whose import fails
    is dropped from ``sys.modules``, so the next call starts over.
    """
    source = _SOURCE_BYTES if source is None else source
    name = f"{prefix}_{key}"
    if name in sys.modules:
        return sys.modules[name]
    path = _cache_dir() / f"{name}.py"
    try:
        intact = path.read_bytes() == source
    except OSError:
        intact = False
    if not intact:
        # rewritten only when damaged (numba's cache keys on the file's mtime)
        _write(path, source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _named(kind):
    """Whether the numba type ``kind`` is or holds a named tuple (a record's class)."""
    if isinstance(kind, nb_types.BaseNamedTuple):
        return True
    return isinstance(kind, nb_types.BaseTuple) and any(_named(t) for t in kind.types)


def specialise(score_mod=None, mask_mod=None, score_grad=None, args=((), ())):
    """The kernels of ``nbattn.kernels.flex`` with these functions bound (None = the
    template's default: no modification, no mask, the complex step), for ``args`` =
    ``(score_args, mask_args)`` of these types: a copy per functions and types, whose
    tile functions read the arguments of its types (its ``ARGS``) from the address the
    compiled-once loops of ``nbattn.kernels.flex_loops`` pass them."""
    kind = typeof(args)
    if _named(kind):
        # a named tuple's name is all of its class that numba's name of the type shows:
        # two classes of one name would share a key, not a layout
        raise TypeError(f"mod_args must be plain tuples of arrays and numbers, got {kind}")
    prints = (
        _SOURCE_HASH,
        fingerprint(score_mod, "score_mod"),
        fingerprint(mask_mod, "mask_mod"),
        fingerprint(score_grad, "score_grad"),
        str(kind),  # numba's name of a type of plain tuples is its identity
    )
    key = hashlib.sha256(repr(prints).encode()).hexdigest()[:24]
    module = _MODULES.get(key)
    if module is not None:
        return module
    with _LOCK:
        if key in _MODULES:
            return _MODULES[key]
        module = _load(key)
        module.ARGS = kind
        if score_mod is not None:
            module.score_mod = _jitted(score_mod)
        if mask_mod is not None:
            module.mask_mod = _jitted(mask_mod)
        if score_grad is not None:
            module.score_grad = _jitted(score_grad)
            module.value_and_grad = module._user_grad
        _MODULES[key] = module  # published bound, never before
    return module


def specialise_args(score_mod=None, mask_mod=None, args_grad=None):
    """The kernels of ``nbattn.kernels.flex_args`` (gradients with respect to ``mod_args``)
    with ``score_mod``, ``mask_mod`` and ``score_mod_args_grad`` bound: a module of its own,
    keyed as :func:`specialise`'s (the sources' hash covers both templates: it imports
    helpers of ``flex``), built only for calls that ask for these gradients."""
    prints = (
        _SOURCE_HASH,
        fingerprint(score_mod, "score_mod"),
        fingerprint(mask_mod, "mask_mod"),
        fingerprint(args_grad, "score_mod_args_grad"),
    )
    key = "args_" + hashlib.sha256(repr(prints).encode()).hexdigest()[:24]
    module = _MODULES.get(key)
    if module is not None:
        return module
    with _LOCK:
        if key in _MODULES:
            return _MODULES[key]
        module = _load(key[5:], "nbattn_flex_args", _ARGS_BYTES)
        for name, fn in (
            ("score_mod", score_mod),
            ("mask_mod", mask_mod),
            ("score_mod_args_grad", args_grad),
        ):
            if fn is not None:
                setattr(module, name, _jitted(fn))
        _MODULES[key] = module  # published bound, never before
    return module


def call_args(module, mods, dtype, grads, *args):
    """``module.flex_args_backward(*args, grads)``, with a ValueError naming
    ``score_mod_args_grad`` when it does not compile for these arguments (checked
    first, alone, by the module's ``check_args_grad``)."""
    score_t = typeof(dtype(0))
    try:
        module.check_args_grad.compile(
            (nb_types.float64, score_t, typeof(mods.score_args), typeof(grads))
        )
    except (TypingError, NotImplementedError) as exc:
        raise ValueError(
            "score_mod_args_grad(grad_score, score, b, h, q_idx, kv_idx, *mod_args, "
            f"*mod_args_grads) could not be compiled for grad_score float64, score {score_t}, "
            f"mod_args {tuple(typeof(a) for a in mods.score_args)} and the float64 gradient "
            f"arrays {tuple(typeof(g) for g in grads)} (one per mod_args entry, each of "
            f"its entry's shape; a placeholder for an entry without gradient): "
            f"{_first_line(exc)}"
        ) from None
    try:
        return module.flex_args_backward(*args, grads)
    except (TypingError, NotImplementedError) as exc:
        raise ValueError(_diagnose(exc, mods, dtype, False)) from None


def block_states(mask_mod, n_b, n_h, n_q, n_k, block_q, block_k, mask_args):
    """``block_states`` of the module specialised on ``mask_mod`` (see ``flex``)."""
    mods = types.SimpleNamespace(
        score_mod=None, mask_mod=mask_mod, score_grad=None, score_args=(), mask_args=mask_args
    )
    module = specialise(mask_mod=mask_mod, args=((), mask_args))
    return call(
        module, "block_states", mods, np.float64, n_b, n_h, n_q, n_k, block_q, block_k, mask_args
    )


_BOILERPLATE = ("Failed in ", "During: ", "File ", "- Resolution failure")


def _first_line(exc):
    """The reason in numba's error (``Untyped global name 'helper': ...``), without its
    pipeline and traceback lines."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # numba's highlighting
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(_BOILERPLATE)]
    if useful:
        first = useful[0]
        # "No implementation of function ... found for signature:" and the signature
        return f"{first} {useful[1]}" if first.endswith(":") and len(useful) > 1 else first
    return lines[0] if lines else type(exc).__name__


def _refusal(exc):
    """The message of a user function refused for the type of what it returns (by
    ``real_score``, ``complex_score``, ``real_grad`` or ``keep_entry``), else None."""
    text = str(exc)
    phrases = ("score_mod_grad must return", "score_mod must return", "mask_mod must return")
    for phrase in phrases + ("not differentiable",):
        if phrase in text:
            line = next(line for line in text.splitlines() if phrase in line)
            line = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
            line = line[line.index(phrase) if phrase != "not differentiable" else 0 :]
            line = line.removeprefix("TypingError: ")
            if phrase == "not differentiable":
                line += (
                    "; pass score_mod_grad(score, b, h, q_idx, kv_idx, *mod_args), its derivative"
                )
            return line
    return None


def _diagnose(exc, mods, dtype, backward):
    """The clear message for a kernel that did not compile: which user function, why."""
    refused = _refusal(exc)
    if refused is not None:
        return refused
    index = (nb_types.int64,) * 4
    score_t = nb_types.complex128 if backward and mods.score_grad is None else typeof(dtype(0))
    checks = (
        ("score_mod", mods.score_mod, (score_t,) + index, mods.score_args),
        ("score_mod_grad", mods.score_grad, (typeof(dtype(0)),) + index, mods.score_args),
        ("mask_mod", mods.mask_mod, index, mods.mask_args),
    )
    for name, fn, fixed, args in checks:
        if fn is None:
            continue
        sig = fixed + tuple(typeof(a) for a in args)
        try:
            _jitted(fn).compile(sig)
        except Exception as inner:  # noqa: BLE001 - any compile failure is reported
            how = (
                " (the complex step of the backward)"
                if score_t == nb_types.complex128 and (name == "score_mod")
                else ""
            )
            hint = "; or pass score_mod_grad" if how else ""
            return (
                f"{name} could not be compiled for arguments {sig}{how}: {_first_line(inner)}{hint}"
            )
    return f"the flex kernels could not be compiled for these functions: {_first_line(exc)}"


def _check(module, mods, dtype, backward):
    """Compile (or load) the small ``check_forward`` / ``check_backward`` of ``module`` for
    this call's types: a user function that cannot work in the kernel is refused here,
    before the kernel's own, much longer, compile."""
    sig = (typeof(dtype(0)), typeof(mods.score_args), typeof(mods.mask_args))
    if not backward:
        module.check_forward.compile(sig)
        return
    rows = module.check_backward(dtype(0), mods.score_args, mods.mask_args, _PROBES)
    if mods.score_grad is not None or mods.score_mod is None:
        return
    for s, (grad, diff, size) in zip(_PROBES, rows):
        if not (np.isfinite(grad) and np.isfinite(diff) and np.isfinite(size)):
            continue
        step = 1e-5 * max(1.0, abs(s))
        tol = 1e-4 * (abs(grad) + abs(diff)) + 1e-6 + 64 * np.finfo(np.float64).eps * size / step
        if abs(grad - diff) > tol:
            raise ValueError(
                f"score_mod is not differentiable by complex step: at score = {s} (b = h = "
                f"q_idx = kv_idx = 0) its complex step gives {grad:.6g}, a finite difference "
                f"{diff:.6g} (abs, max, min, comparisons or a real part inside an expression "
                "that stays complex drop the imaginary part); pass "
                "score_mod_grad(score, b, h, q_idx, kv_idx, *mod_args), its derivative"
            )


def check(mods, dtype, backward):
    """The CPU kernels' checks of the user functions in ``mods`` for ``dtype``, for the
    kernels of another device (``nbattn.attn.flex_cuda``): a ValueError with the CPU's
    message where the CPU refuses them for what they return (a bool or complex score,
    a mask that is not a bool, a complex step that is not complex or not the
    derivative). A function the CPU cannot compile at all (one that calls a CUDA
    device function) or cannot key on disk is left to that device's compiler."""
    grad = mods.score_grad if backward else None
    try:
        module = specialise(mods.score_mod, mods.mask_mod, grad, (mods.score_args, mods.mask_args))
    except UnknownValue:
        return
    try:
        _check(module, mods, dtype, backward)
    except (NumbaError, NotImplementedError) as exc:
        refused = _refusal(exc)
        if refused is not None:
            raise ValueError(refused) from None


def call(module, name, mods, dtype, *args, backward=False):
    """``module.<name>(*args)``, with a ValueError naming the user function that does not
    compile (checked first by the module's ``check_forward`` or ``check_backward``)."""
    try:
        _check(module, mods, dtype, backward)
        return getattr(module, name)(*args)
    except (TypingError, NotImplementedError) as exc:
        raise ValueError(_diagnose(exc, mods, dtype, backward)) from None
