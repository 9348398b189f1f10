"""A kernel's result depends on its object code alone (``nbattn._core.linkage``).

numba links a callee's functions into each caller as weak symbols, and its JIT binds a
weak symbol to the first definition the process loaded; the copies are optimised
differently, so before the private linkage a float64 flash forward differed by an ulp
between a process that compiled it and one that loaded it, or one that had called the
helper first. These tests read the cached objects' symbol tables and compare results
across processes that load kernels in different orders.
"""

import os
import pickle
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

from nbattn._core import linkage

_NBATTN = re.compile(r"^_ZN\d+nbattn")
_STB_WEAK = 2


def _defined_symbols(elf: bytes):
    """``(name, binding)`` of the symbols an ELF64 little-endian object defines."""
    section_offset = struct.unpack_from("<Q", elf, 0x28)[0]
    entry_size, n_sections = struct.unpack_from("<HH", elf, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", elf, section_offset + i * entry_size)
        for i in range(n_sections)
    ]
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        names = sections[link][4]
        for j in range(size // symbol_size):
            name_at, info, _, index = struct.unpack_from("<IBBH", elf, offset + j * symbol_size)
            if index == 0:  # undefined here
                continue
            end = elf.index(b"\0", names + name_at)
            yield elf[names + name_at : end].decode(), info >> 4


def _weak_nbattn_definitions(cache_dir):
    """{cache file: weak nbattn function definitions} over the objects numba cached."""
    found = {}
    for root, _, files in os.walk(cache_dir):
        for file in files:
            if not file.endswith(".nbc"):
                continue
            with open(os.path.join(root, file), "rb") as handle:
                kind, data = pickle.load(handle)[0][1:3]
            if kind != "object":
                continue
            weak = [
                name
                for name, binding in _defined_symbols(data[0])
                if binding == _STB_WEAK and _NBATTN.match(name)
            ]
            if weak:
                found[file] = weak
    return found


def _run(code, env=None):
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_installed_on_the_pinned_numba():
    import nbattn.kernels  # noqa: F401  (installs the hook)

    assert linkage.installed()


_COMPILE_GEMM = """
import numpy as np
from nbattn.kernels.blas import gemm
a = np.ones((3, 2))
gemm(a, a, np.empty((3, 3)), False, True, 0.0)
"""


def test_cached_kernels_define_no_weak_nbattn_functions(tmp_path):
    """Compiled into an empty cache, a kernel carries its callees (here ``gemm``'s BLAS
    call, which numba does not inline) as private copies: nothing in its object can
    bind elsewhere."""
    cache = tmp_path / "numba-cache"
    _run(_COMPILE_GEMM, {"NUMBA_CACHE_DIR": str(cache)})
    objects = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".nbc")]
    assert any(f.startswith("blas.gemm") for f in objects), objects
    assert _weak_nbattn_definitions(cache) == {}


def test_privatise_makes_only_linked_copies_internal():
    from llvmlite import binding as ll

    module = ll.parse_assembly(
        """
        define linkonce_odr double @copy(double %x) { ret double %x }
        define weak_odr double @loop_wrapper(double %x) { ret double %x }
        define double @own(double %x) {
          %y = call double @copy(double %x)
          %z = call double @loop_wrapper(double %y)
          ret double %z
        }
        declare double @elsewhere(double)
        """
    )
    assert linkage.privatise_linked_copies(module) == 2
    linkages = {fn.name: fn.linkage for fn in module.functions}
    assert linkages == {
        "copy": ll.Linkage.internal,
        "loop_wrapper": ll.Linkage.internal,
        "own": ll.Linkage.external,
        "elsewhere": ll.Linkage.external,
    }


def test_later_callers_link_numbas_linkage():
    """The module a later caller links is numba's: the library's own functions
    linkonce_odr, its callees' copies as they were before being made private."""
    from llvmlite import binding as ll

    module = ll.parse_assembly(
        """
        define linkonce_odr double @copy(double %x) { ret double %x }
        define double @own(double %x) {
          %y = call double @copy(double %x)
          ret double %y
        }
        """
    )
    shared = linkage.module_for_linking(module)
    linkage.privatise_linked_copies(module)
    assert {fn.name: fn.linkage for fn in shared.functions} == {
        "copy": ll.Linkage.linkonce_odr,
        "own": ll.Linkage.linkonce_odr,
    }
    assert module.get_function("own").linkage == ll.Linkage.external


_FLASH_AFTER = """
import sys
import numpy as np
import nbattn
from nbattn.kernels import flash
if {helper_first}:
    flash.exp2_shift_sum(np.ones(5), 0.0)
rng = np.random.default_rng(7)
q, k, v = (rng.standard_normal((1, 2, 40, 8)) for _ in range(3))
out = nbattn.flash_attention(q, k, v, causal={causal})
sys.stdout.write(np.asarray(out).tobytes().hex())
"""


@pytest.mark.parametrize("causal", [False, True])
def test_flash_forward_bits_do_not_depend_on_what_the_process_loaded_first(causal):
    """One process loads the float64 flash forward alone, another loads its exponential
    helper first (as the process that compiled the forward had): the same bits. Before
    the private linkage they differed in 76 of 640 outputs (non-causal)."""
    alone = _run(_FLASH_AFTER.format(helper_first=False, causal=causal))
    helper_first = _run(_FLASH_AFTER.format(helper_first=True, causal=causal))
    a, b = (np.frombuffer(bytes.fromhex(x), dtype=np.float64) for x in (alone, helper_first))
    assert a.size == 640
    np.testing.assert_array_equal(a, b)
