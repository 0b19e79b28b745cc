"""``python -m benchmarks [--tiny] [--output DIR] [--mixed-requests N] [--seeds S,S...]``: every
scenario, then the figures (JSON), the plots (PNG) and each target with PASS or MISS. See
:mod:`benchmarks`."""

from __future__ import annotations

import argparse
import dataclasses
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
    parser.add_argument("--mixed-requests", type=_positive, metavar="N",
                        help=f"requests of each mixed trace (default: {FULL.mixed_requests})")
    parser.add_argument("--seeds", type=_seeds, metavar="S,S...",
                        help="the mixed traces' seeds, replayed one after the other and pooled "
                             f"(default: {','.join(map(str, FULL.mixed_seeds))})")
    args = parser.parse_args(argv)
    scale = TINY if args.tiny else FULL
    if args.mixed_requests is not None:
        scale = dataclasses.replace(scale, mixed_requests=args.mixed_requests)
    if args.seeds is not None:
        scale = dataclasses.replace(scale, mixed_seeds=args.seeds)
    figures = run(scale, args.output)
    print(summary(figures))
    print(f"{args.output}/figures.json and plots written in {figures['seconds']} s")
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _seeds(text: str) -> tuple[int, ...]:
    words = text.split(",")
    seeds = tuple(int(word) for word in words if word.strip().isdigit())
    if len(seeds) != len(words) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of different whole numbers")
    return seeds


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
