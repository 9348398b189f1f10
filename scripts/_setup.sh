# Sourced by scripts/demo and scripts/test: create .venv if absent and install
# nbattn into it (editable) with the extras named in $NBATTN_EXTRAS.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
VENV_PY="$ROOT/.venv/bin/python"
spec="."
if [ -n "${NBATTN_EXTRAS:-}" ]; then
    spec=".[${NBATTN_EXTRAS}]"
fi
# Reinstall only when pyproject.toml changed since the last install.
stamp=".venv/.nbattn-installed-${NBATTN_EXTRAS:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "installing nbattn${NBATTN_EXTRAS:+[$NBATTN_EXTRAS]} into .venv (log: .venv/pip-install.log)" >&2
    # A new venv's own pip is enough from 22.3 on (tests/test_packaging uses
    # ``pip --python``); upgrading it anyway costs a download on every fresh clone.
    if ! "$VENV_PY" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 3))' \
        2>/dev/null; then
        "$VENV_PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    fi
    if ! "$VENV_PY" -m pip install --disable-pip-version-check -e "$spec" \
        >.venv/pip-install.log 2>&1; then
        cat .venv/pip-install.log >&2
        exit 1
    fi
    touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
