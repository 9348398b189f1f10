"""CPU numba kernels: arrays in, arrays out (see ``nbattn.dispatch.device.KERNELS``).

Importing the package registers the one-line notice printed when a kernel first
compiles in a process (``nbattn._core.compiling``).
"""

from .._core import compiling

compiling.install()
