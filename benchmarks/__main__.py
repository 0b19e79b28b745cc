"""``python -m benchmarks [--tiny] [--output DIR]``: every scenario, then the figures (JSON), the
plots (PNG) and each target with PASS or MISS. See :mod:`benchmarks`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .report import summary
from .run import DEFAULT_OUTPUT, run
from .scenarios import FULL, TINY


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where figures.json and the plots go (default: {DEFAULT_OUTPUT})")
    parser.add_argument("--tiny", action="store_true",
                        help="a few requests per scenario, to check that they run; the figures mean nothing")
    args = parser.parse_args(argv)
    figures = run(TINY if args.tiny else FULL, args.output)
    print(summary(figures))
    print(f"{args.output}/figures.json and plots written in {figures['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
