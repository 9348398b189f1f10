"""Each compiled nbattn kernel runs its own copy of the functions it calls.

numba compiles every ``@njit`` function into a library of its own. A caller links
its callees' optimised modules into its own module, with the callees' functions
marked ``linkonce_odr`` ("any one copy will do"), and optimises the whole again.
In the object code those copies are *weak* symbols, and when numba's JIT loads
an object, a weak symbol binds to the first definition of that name the process
has loaded. So a kernel may run its own copy of a helper, or the copy that
another library brought in earlier: the helper compiled on its own (in the
process that compiled the kernel, it was compiled first), or the copy inside
another kernel.

The copies are not the same code. The second optimisation of a caller's module
is free, under ``reassoc``, to reorder a helper's additions: measured on
``nbattn.kernels.flash.exp2_shift_sum``, the standalone copy ends its vector
sum as ``(z23 + z24) + z0`` where the copy inside the flash forward adds
``z0 + (z23 + z24)``. A flash forward in float64 then differed by an ulp
between the process that compiled it and one that loaded it from numba's
on-disk cache, and between processes that had called other kernels first.

Here, once a caller's module is optimised, its callees' ``linkonce_odr``
definitions (and the ``weak_odr`` wrappers of the parallel loops numba links
into ``parallel=True`` kernels) become ``internal``: private to the caller's
object, so its calls bind to the code compiled with it, whatever else the
process has loaded. A kernel's result is then a function of its object code
alone, the same in every process and every call order. The optimisation itself
runs as before (the linkage changes after it), and the module later callers link
is taken before the change, with numba's linkage, so their compiles see what they
saw without this module: the compile time and the kernels' code are unchanged but
for how a call binds. Only libraries whose own (external) functions are nbattn's
(an nbattn module, or a generated ``nbattn_flex_*`` module) are changed; other
numba code in the process, a user's function that calls an nbattn kernel
included, links as numba made it.

Caches written before this module existed hold the weak copies still. numba
keeps a kernel's cached object while its source file is unchanged, which an
upgrade by pip does change; a git checkout keeps them (ARCHITECTURE, "numba's
on-disk cache"). The generated flex modules are keyed by the sources of every
kernel module and of this one, so an nbattn that links differently writes new
ones.

The hook wraps ``CPUCodeLibrary._optimize_final_module``, which numba's
``finalize`` calls after linking and before the module is compiled to machine
code; if a numba release renames it, :func:`install` leaves numba alone and
:func:`installed` says so (a test checks it on the pinned numba).
"""

from __future__ import annotations

import re
import threading

__all__ = ["install", "installed"]

#: A mangled name of a function defined in nbattn or a generated ``nbattn_flex_*`` module
#: (its native body, its CPython wrapper or its C wrapper).
_NBATTN_NAME = re.compile(r"^(?:cfunc\.)?_ZN(?:7cpython)?\d+nbattn")

_state = {"installed": False}
_lock = threading.Lock()


def installed() -> bool:
    """Whether the callees of nbattn's kernels are linked privately in this process."""
    return _state["installed"]


def _defines_nbattn_function(module) -> bool:
    """Whether one of the library's own functions (external: not a linked copy) is
    nbattn's."""
    from llvmlite import binding as ll

    return any(
        not fn.is_declaration and fn.linkage == ll.Linkage.external and _NBATTN_NAME.match(fn.name)
        for fn in module.functions
    )


def privatise_linked_copies(module) -> int:
    """Make the linked copies of ``module`` (its ``linkonce_odr`` and ``weak_odr`` function
    definitions) internal; their count."""
    from llvmlite import binding as ll

    shared = (ll.Linkage.linkonce_odr, ll.Linkage.weak_odr)
    count = 0
    for fn in module.functions:
        if not fn.is_declaration and fn.linkage in shared:
            fn.linkage = ll.Linkage.internal
            count += 1
    return count


def module_for_linking(module):
    """What numba's ``CPUCodeLibrary._get_module_for_linking`` makes of ``module``: a copy
    whose defined external functions are ``linkonce_odr``."""
    from llvmlite import binding as ll

    shared = module.clone()
    for fn in shared.functions:
        if not fn.is_declaration and fn.linkage == ll.Linkage.external:
            fn.linkage = ll.Linkage.linkonce_odr
    return shared


def install() -> None:
    """Wrap numba's final-module optimisation (once per process; the kernel packages call
    it when they are imported)."""
    if _state["installed"]:
        return
    with _lock:
        if _state["installed"]:
            return
        from numba.core.codegen import CPUCodeLibrary

        optimise = getattr(CPUCodeLibrary, "_optimize_final_module", None)
        if optimise is None:
            return

        def _optimize_final_module(self):
            optimise(self)
            module = self._final_module
            if _defines_nbattn_function(module):
                # later callers link the copy numba would have given them
                self._shared_module = module_for_linking(module)
                privatise_linked_copies(module)

        _optimize_final_module.__wrapped__ = optimise
        CPUCodeLibrary._optimize_final_module = _optimize_final_module
        _state["installed"] = True
