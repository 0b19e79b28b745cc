"""``neuron-serving``: plan a layout, check an account, follow a deployment, test, measure and secure its endpoint.

Each command lives in :mod:`neuron_serving.ops`, one module per command with a ``register()`` that
adds its parser and sets ``args.run``: ``plan`` (:mod:`.ops.plan`) prints the layouts an instance
accepts and the performance model's predictions; ``preflight``, ``status``, ``logs``, ``smoke`` and
``bench`` check an account before deploying, show each host's boot phase, read the hosts' logs, send
one request to each generation route and measure the endpoint; ``api-key`` (:mod:`.ops.api_keys`)
edits the stack's API keys secret. boto3 is imported only by the commands that talk to AWS, when
they run: ``plan`` and the CDK constructs never need it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .ops import api_keys, bench, logs, plan, preflight, smoke, status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-serving", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for module in (plan, api_keys, preflight, status, logs, smoke, bench):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
