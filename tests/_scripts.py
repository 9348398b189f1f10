"""``load_script(NAME)``: ``scripts/NAME.py``, a development script (not shipped), as a
module, for the tests that run a script or share its recipe; ``run_checked(ARGS)``: a
command in a process of its own, which must succeed."""

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name):
    """Execute scripts/NAME.py as ``python scripts/NAME.py`` imports it (its folder first on
    the path, for the helpers the scripts share), without running its ``main``."""
    spec = importlib.util.spec_from_file_location(f"nbattn_scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def run_checked(args, *, cwd=None, env=None, timeout=None):
    """Run ``args`` (str() of each) with text output captured; assert that it exits with 0,
    its stderr the message, and return the ``subprocess.CompletedProcess``."""
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result
