"""The ``nbattn`` command."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
    from .seed import run_seed

    table = run_seed(outdir=args.outdir)
    print("Seed 002, section 1.3: y = 2 sin x + x^0.8 + N(0, 0.5), 50 training points")
    print("metrics on the test grid against the true function:\n")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    print(f"\nfigures written to {args.outdir}/")
    return 0


def _cmd_info(args) -> int:
    import numba
    import numpy as np

    from . import __version__, config
    from .device import cuda_available

    print(f"nbattn {__version__}")
    print(f"numpy {np.__version__}, numba {numba.__version__}")
    layer, threads = numba.config.THREADING_LAYER, numba.config.NUMBA_NUM_THREADS
    print(f"threading layer: {layer}, threads: {threads}")
    print(f"key block: {config.KEY_BLOCK}, query block: {config.QUERY_BLOCK}")
    print(f"CUDA usable: {cuda_available()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbattn", description="Attention pooling and kernel regression with numba."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="fit the seed's data, print metrics, write its figures")
    demo.add_argument(
        "--outdir", default="figures", help="folder for the figures (default: figures)"
    )
    demo.set_defaults(func=_cmd_demo)
    info = sub.add_parser("info", help="versions, threading and CUDA availability")
    info.set_defaults(func=_cmd_info)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as exc:
        print(f"nbattn: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
