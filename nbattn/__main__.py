"""``python -m nbattn ARGS``: the `nbattn` command."""

import sys

from .app.cli import main

if __name__ == "__main__":
    sys.exit(main())
