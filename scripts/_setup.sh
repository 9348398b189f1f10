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
    "$VENV_PY" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    "$VENV_PY" -m pip install --quiet --disable-pip-version-check -e "$spec"
    touch "$stamp"
fi
export PATH="$ROOT/.venv/bin:$PATH"
