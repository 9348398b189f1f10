"""``python -m nbattn ARGS``: the `nbattn` command."""

import sys

if __name__ == "__main__":
    try:  # Ctrl-C while the modules import: nothing is written yet; say so, no traceback
        from .app.cli import main
    except KeyboardInterrupt:
        print("nbattn: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(main())
