"""Regenerate the figures of the attention-pooling walk-through, section 1.3, into OUTDIR.

Usage: python scripts/reproduce_seed.py OUTDIR
"""

import sys

from nbattn.app.seed import run_seed

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(run_seed(outdir=sys.argv[1]).to_string())
