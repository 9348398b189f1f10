"""Outputs that appear under their name only when complete.

:func:`atomic_output` writes to a temporary file beside the output and renames
it at the end, so a failed or interrupted run leaves no partial file and an
older output untouched; :func:`check_not_input` refuses an output that is one
of the inputs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_output", "check_not_input"]

_NAME_ATTEMPTS = 100


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path):
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    The temporary file lives in the same folder (so ``os.replace`` is an
    atomic rename) and is removed if the block raises, including on an
    interruption: a failed run leaves neither a partial output nor a stray
    file, and an existing ``path`` is untouched until the new one is complete.

    An existing output keeps its permission bits (a new one gets the umask's).
    An output that is a symbolic link is written through: the file it points
    to is replaced and the link stays.
    """
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"output folder {str(folder)!r} does not exist")
    if path.is_dir():
        raise ValueError(f"output {str(path)!r} is a folder")
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    tmp = None
    try:  # the name is known before the file exists: an interruption at any point removes it
        for _ in range(_NAME_ATTEMPTS):
            tmp = folder / f".{path.name}.{secrets.token_hex(4)}.part"
            try:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no free temporary name beside {str(path)!r}")
        yield tmp
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def check_not_input(inputs, output) -> None:
    """ValueError when ``output`` is (the same file as) one of ``inputs``."""
    for path in inputs:
        if os.path.exists(output) and os.path.exists(path) and os.path.samefile(path, output):
            raise ValueError(f"the output {str(output)!r} is an input file; choose another name")
