# Sourced by scripts/demo and scripts/test: create .venv if absent and install
# nbattn into it (editable) with the extras named in $NBATTN_EXTRAS.
set -euo pipefail
# Python's default: imported modules keep their compiled bytecode (__pycache__, in .venv
# and beside nbattn's sources, both ignored by git). Some images set
# PYTHONDONTWRITEBYTECODE=1, and then every process compiles numba, scipy and pandas from
# source again: about 2 s of each command's start, and the test suite starts hundreds.
unset PYTHONDONTWRITEBYTECODE
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
VENV_PY="$ROOT/.venv/bin/python"

# venv_install ARGS...: `pip install ARGS` into .venv, through uv where it can.
# uv resolves the same versions as pip in a tenth of the time (a fresh set-up took
# 70 s with pip, 7 s with uv); it is itself a small wheel pip installs into .venv.
# uv reads no pip.conf: a local wheelhouse named by PIP_FIND_LINKS is passed on,
# and whatever uv cannot do (another index, no uv wheel, NBATTN_INSTALLER=pip)
# goes to pip as before. Output goes to .venv/pip-install.log.
venv_install() {
    if [ "${NBATTN_INSTALLER:-uv}" != pip ]; then
        if [ ! -x .venv/bin/uv ]; then
            "$VENV_PY" -m pip install --disable-pip-version-check --quiet uv \
                >>.venv/pip-install.log 2>&1 || true
        fi
        if [ -x .venv/bin/uv ] && UV_FIND_LINKS="${UV_FIND_LINKS:-${PIP_FIND_LINKS:-}}" \
            .venv/bin/uv pip install --python "$VENV_PY" "$@" >>.venv/pip-install.log 2>&1; then
            return 0
        fi
        echo "uv could not install $* (see .venv/pip-install.log): trying pip" >&2
    fi
    "$VENV_PY" -m pip install --disable-pip-version-check "$@" >>.venv/pip-install.log 2>&1
}

spec="."
if [ -n "${NBATTN_EXTRAS:-}" ]; then
    spec=".[${NBATTN_EXTRAS}]"
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=".venv/.nbattn-installed-${NBATTN_EXTRAS:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing nbattn${NBATTN_EXTRAS:+[$NBATTN_EXTRAS]} into .venv (log: .venv/pip-install.log)" >&2
    : >.venv/pip-install.log
    # A new venv's own pip is enough from 22.3 on (tests/test_packaging uses
    # ``pip --python``); upgrading it anyway costs a download on every fresh clone.
    if ! "$VENV_PY" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' \
        2>/dev/null; then
        "$VENV_PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    fi
    if ! venv_install -e "$spec"; then
        cat .venv/pip-install.log >&2
        exit 1
    fi
    touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
