"""CPU numba kernels: arrays in, arrays out (see ``nbattn.dispatch.device.KERNELS``).

Importing the package registers the one-line notice printed when a kernel first
compiles in a process (``nbattn._core.compiling``), and links each kernel's callees
privately into it, so that its results do not depend on what else the process has
compiled or loaded (``nbattn._core.linkage``).
"""

from .._core import compiling, linkage

compiling.install()
linkage.install()
