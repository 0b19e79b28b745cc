"""``neuron-serving``: inspect layouts before deploying.

``neuron-serving plan --model M --instance-type T`` prints every tensor-parallel degree the
instance accepts, with the replicas it gives and whether the model fits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .plan.errors import ServingConfigError
from .plan.instances import INSTANCES
from .plan.layout import GIB, ServingRequest, degree_options, plan_serving
from .settings import DEFAULT_INSTANCE_TYPE, DEFAULT_MODEL_ID


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-serving", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="show every valid tensor-parallel degree for a model and instance")
    plan.add_argument("--model", default=DEFAULT_MODEL_ID, help="Hugging Face model id or catalog name")
    plan.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE)
    plan.add_argument("--batch-size", type=int, default=ServingRequest.batch_size)
    plan.add_argument("--sequence-length", type=int, default=ServingRequest.sequence_length)
    plan.add_argument("--max-input-tokens", type=int, default=None)
    plan.add_argument("--dtype", default=ServingRequest.dtype)
    plan.add_argument("--model-config", default=None, help="path to config.json for a model outside the catalog")
    return parser


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


def plan_command(args: argparse.Namespace) -> str:
    request = ServingRequest(
        model_id=args.model,
        instance_type=args.instance_type,
        batch_size=args.batch_size,
        sequence_length=args.sequence_length,
        max_input_tokens=args.max_input_tokens,
        dtype=args.dtype,
        model_config=args.model_config,
    )
    options = degree_options(request)
    rows = [["degree", "replicas", "idle cores", "GiB/core", "of", "fits"]]
    for option in options:
        rows.append([
            str(option.degree),
            str(option.replicas),
            str(option.idle_cores),
            f"{option.memory.total / GIB:.1f}",
            f"{option.memory.available / GIB:.0f}",
            "yes" if option.memory.fits else "no",
        ])
    hourly = INSTANCES[request.instance_type].hourly_usd
    lines = [
        f"{request.model_id} on {request.instance_type} (about ${hourly:.2f}/h on demand): batch {request.batch_size}, "
        f"sequence {request.sequence_length}, input <= {request.effective_max_input_tokens}, {request.dtype}",
        _table(rows),
    ]
    try:
        chosen = plan_serving(request)
    except ServingConfigError as err:
        lines.append(f"no layout: {err}")
    else:
        lines.append(f"default (smallest degree that fits): {chosen.degree} -> {chosen.describe()}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        print(plan_command(args))
    except ServingConfigError as err:
        print(f"neuron-serving: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
