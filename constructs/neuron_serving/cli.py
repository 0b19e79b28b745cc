"""``neuron-serving``: plan a layout, check an account, follow a deployment, test, measure and secure its endpoint.

``neuron-serving preflight``, ``status``, ``logs``, ``smoke`` and ``bench`` (:mod:`neuron_serving.ops`)
check an account before deploying, show each host's boot phase, read the hosts' logs, send one
request to each generation route and measure the endpoint under a synthetic LLM workload.

``neuron-serving plan --model M --instance-type T`` prints every tensor-parallel degree the
instance accepts, with the replicas it gives, whether the model fits, and the performance model's
predictions (:mod:`neuron_serving.plan.performance`); ``--objective latency|throughput|cost`` and
limits recommend a layout, and ``--output json`` prints the same as one JSON document (see
:func:`plan_document`).

``neuron-serving api-key create|rotate|revoke|list`` edits the stack's API keys secret (see
:mod:`neuron_serving.userdata.api_keys` for its format) with boto3, which only the commands
that talk to AWS import: ``plan`` and the CDK constructs never need it.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .ops import bench, logs, preflight, smoke, status
from .ops.aws import REGION_HELP, Aws, Explainer, OpsError, run_aws, stack_not_found
from .ops.stack import DEFAULT_STACK
from .plan.errors import Problems, ServingConfigError
from .plan.instances import INSTANCES
from .plan.layout import (
    GIB,
    DegreeOption,
    ServingPlan,
    ServingRequest,
    compile_memory_problem,
    degree_options,
    plan_serving,
)
from .plan.performance import (
    DEFAULT_WORKLOAD,
    OBJECTIVES,
    Constraints,
    Prediction,
    Recommendation,
    Workload,
    candidates,
    compare_instances,
    recommend,
)
from .render.boot import API_KEYS_SYNC_MINUTES as SYNC_MINUTES
from .settings import DEFAULT_INSTANCE_TYPE, DEFAULT_MODEL_ID
from .userdata.api_keys import DIGEST_PREFIX, check_name, new_key, parse_secret, stored

SECRET_OUTPUT = "ApiKeysSecretArn"
"""The output (its key, the logical id) of a stack deployed with ``-c api_keys=true``: the secret's ARN."""


_API_KEY_EPILOG = f"""\
The secret is found through the stack's {SECRET_OUTPUT} output (cloudformation:DescribeStacks),
or named with --secret. Every command reads it (secretsmanager:GetSecretValue); create, rotate
and revoke write a new version (secretsmanager:PutSecretValue), and a secret encrypted with a
customer managed KMS key also needs kms:Decrypt and kms:GenerateDataKey on that key. Changes
reach the endpoint within about {SYNC_MINUTES} minutes, without restarts.

Two operators editing keys at once: each change re-reads the secret just before writing and
stops, writing nothing, when another change came in since it read it; run it again then.
PutSecretValue itself has no condition on the current version, so a change landing in the
instant between that check and the write is overwritten: let one operator edit keys at a time.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-serving", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    plan = commands.add_parser("plan", help="show every valid tensor-parallel degree for a model and instance")
    plan.add_argument("--model", default=DEFAULT_MODEL_ID, help="Hugging Face model id or catalog name")
    plan.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE,
                      help=f"a Neuron instance type, or {ANY_INSTANCE!r} with --objective to compare them all")
    plan.add_argument("--batch-size", type=int, default=ServingRequest.batch_size)
    plan.add_argument("--sequence-length", type=int, default=ServingRequest.sequence_length)
    plan.add_argument("--max-input-tokens", type=int, default=None)
    plan.add_argument("--dtype", default=ServingRequest.dtype)
    plan.add_argument("--model-config", default=None, help="path to config.json for a model outside the catalog")
    plan.add_argument("--objective", choices=OBJECTIVES, default=None,
                      help="recommend the layout with the lowest inter-token latency, the most tokens per second, "
                           "or the lowest cost per token (default: the smallest degree that fits)")
    plan.add_argument("--max-itl-ms", type=float, default=None,
                      help="with --objective: highest inter-token latency at full batch, milliseconds")
    plan.add_argument("--max-ttft-ms", type=float, default=None,
                      help="with --objective: highest time to first token, milliseconds")
    plan.add_argument("--min-tokens-per-second", type=float, default=None,
                      help="with --objective: fewest output tokens per second of the instance at saturation")
    plan.add_argument("--input-tokens", type=int, default=DEFAULT_WORKLOAD.input_tokens,
                      help="prompt tokens per request of the workload the predictions are for")
    plan.add_argument("--output-tokens", type=int, default=DEFAULT_WORKLOAD.output_tokens,
                      help="generated tokens per request of the workload the predictions are for")
    plan.add_argument("--output", choices=("text", "json"), default="text",
                      help="json: one JSON document for scripts (described in neuron_serving.cli.plan_document)")

    where = argparse.ArgumentParser(add_help=False)
    source = where.add_mutually_exclusive_group()
    # No default here: argparse takes a value identical to the default for no value at all, and would
    # then accept --stack with --secret.
    source.add_argument("--stack", help=f"stack whose {SECRET_OUTPUT} output names the secret "
                                        f"(default: {DEFAULT_STACK})")
    source.add_argument("--secret", help="the secret's name or ARN, instead of finding it through the stack")
    where.add_argument("--region", help=REGION_HELP)
    keys = commands.add_parser("api-key", help="create, rotate, revoke or list the endpoint's API keys",
                               description="Manage the endpoint's API keys, kept in a Secrets Manager secret.",
                               epilog=_API_KEY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = keys.add_subparsers(dest="action", required=True)
    for action, help_text in (
        ("create", "add a key named NAME; prints the key, once, on stdout"),
        ("rotate", "replace NAME's key with a new one; prints it, once, on stdout"),
        ("revoke", "remove NAME's key"),
    ):
        command = actions.add_parser(action, parents=[where], help=help_text, description=help_text,
                                     epilog=_API_KEY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        # Revoking takes any name the secret holds, so that an entry the hosts ignore can be removed too.
        command.add_argument("name", metavar="NAME", type=str if action == "revoke" else _key_name)
    actions.add_parser("list", parents=[where], help="the keys' names (never their values)",
                       description="The keys' names and how each is stored, never their values.",
                       epilog=_API_KEY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    # The operator's commands (neuron_serving.ops): each sets the function that runs it as args.run.
    for module in (preflight, status, logs, smoke, bench):
        module.register(commands)
    return parser


def _key_name(text: str) -> str:
    why = check_name(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


ANY_INSTANCE = "any"
"""``--instance-type any``: recommend across every instance type of the catalog."""

_COLUMNS = ("degree", "replicas", "idle cores", "GiB/core", "of", "fits",
            "TTFT s", "ITL1 ms", "ITL ms", "tok/s", "$/Mtok")


def _prediction_cells(prediction: Prediction | None) -> list[str]:
    if prediction is None:
        return ["-"] * 5
    return [
        f"{prediction.ttft_s:.2f}",
        f"{prediction.itl_batch1_s * 1e3:.1f}",
        f"{prediction.itl_full_batch_s * 1e3:.1f}",
        f"{prediction.tokens_per_second_instance:.0f}",
        f"{prediction.usd_per_million_tokens:.2f}",
    ]


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def _plan_inputs(args: argparse.Namespace) -> tuple[ServingRequest, Workload, Constraints]:
    request = ServingRequest(
        model_id=args.model,
        instance_type=args.instance_type,
        batch_size=args.batch_size,
        sequence_length=args.sequence_length,
        max_input_tokens=args.max_input_tokens,
        dtype=args.dtype,
        model_config=args.model_config,
    )
    workload = Workload(args.input_tokens, args.output_tokens)
    constraints = Constraints(args.max_itl_ms, args.max_ttft_ms, args.min_tokens_per_second)
    return request, workload, constraints


def plan_command(args: argparse.Namespace) -> str:
    """The ``plan`` command's output, as text or as the JSON document of :func:`plan_document`.

    Raises :class:`ServingConfigError` for bad input, and when an objective can recommend nothing.
    """
    request, workload, constraints = _plan_inputs(args)
    document = plan_document(request, workload, args.objective, constraints)
    if args.output == "json":
        return json.dumps(document, indent=2)
    return _plan_text(request, workload, document)


def plan_document(request: ServingRequest, workload: Workload, objective: str | None,
                  constraints: Constraints) -> dict[str, Any]:
    """What ``neuron-serving plan --output json`` prints. Keys (times in seconds, memory in GiB):

    - ``request``: ``model_id``, ``instance_type`` (or ``"any"``), ``batch_size``,
      ``sequence_length``, ``max_input_tokens``, ``dtype``;
    - ``workload``: ``input_tokens``, ``output_tokens``;
    - ``objective``: ``latency``, ``throughput``, ``cost`` or null;
    - ``constraints``: ``max_itl_ms``, ``max_ttft_ms``, ``min_tokens_per_second`` (null: none);
    - ``degrees`` (one instance type): per degree the instance accepts, ``degree``, ``replicas``,
      ``idle_cores``, ``memory_gib`` (needed per core), ``available_gib``, ``fits``, and
      ``prediction`` (null when it does not fit);
    - ``instance_types`` (``any``): per instance type that can serve the model, its
      ``instance_type``, ``hourly_usd``, ``degree``, ``replicas`` and ``prediction``;
      ``ruled_out``: ``[{"instance_type", "why"}]`` for the others;
    - ``rejected``: ``[{"degree", "why"}]``, the degrees an objective ruled out;
    - ``recommendation``: ``instance_type``, ``hourly_usd``, ``degree``, ``replicas``, ``layout``,
      ``reason`` and ``prediction`` of the recommended layout (without an objective: the smallest
      degree that fits), or null when nothing fits;
    - ``no_layout``: why nothing fits, or null.

    A ``prediction`` holds :class:`~neuron_serving.plan.performance.Prediction`'s fields: ``degree``,
    ``replicas``, ``ttft_s``, ``itl_batch1_s``, ``itl_full_batch_s``, ``tokens_per_second_replica``,
    ``tokens_per_second_instance``, ``requests_per_second_instance``, ``usd_per_million_tokens``.

    Raises :class:`ServingConfigError` for bad input (limits or ``any`` without an objective among
    them), and when an objective can recommend nothing.
    """
    if objective is None:
        problems = Problems()
        for name, limit in constraints.limits():
            problems.add(name, limit, "needs --objective, which chooses among the layouts")
        if request.instance_type == ANY_INSTANCE:
            problems.add("instance_type", ANY_INSTANCE, "needs --objective, which chooses among the layouts")
        problems.raise_if_any()
    document: dict[str, Any] = {
        "request": {
            "model_id": request.model_id,
            "instance_type": request.instance_type,
            "batch_size": request.batch_size,
            "sequence_length": request.sequence_length,
            "max_input_tokens": request.effective_max_input_tokens,
            "dtype": request.dtype,
        },
        "workload": {"input_tokens": workload.input_tokens, "output_tokens": workload.output_tokens},
        "objective": objective,
        "constraints": {name: getattr(constraints, name)
                        for name in ("max_itl_ms", "max_ttft_ms", "min_tokens_per_second")},
    }
    if request.instance_type == ANY_INSTANCE and objective is not None:
        compared = compare_instances(request, objective, constraints, workload)
        document["instance_types"] = [
            {"instance_type": r.plan.instance.name, "hourly_usd": r.plan.instance.hourly_usd,
             "degree": r.plan.degree, "replicas": len(r.plan.replicas), "prediction": asdict(r.prediction)}
            for r in compared.per_instance
        ]
        document["ruled_out"] = [{"instance_type": name, "why": why} for name, why in compared.ruled_out]
        return _recommended(document, compared.best)
    options = degree_options(request)
    workload.check_fits(request)
    predicted = {plan.degree: prediction for plan, prediction in candidates(request, workload)}
    document["degrees"] = [_degree_entry(option, predicted.get(option.degree)) for option in options]
    if objective is not None:
        return _recommended(document, recommend(request, objective, constraints, workload))
    try:
        default = plan_serving(request)
    except ServingConfigError as err:
        return {**document, "rejected": [], "recommendation": None, "no_layout": str(err)}
    chosen = _layout_entry(default, predicted[default.degree], "the smallest degree that fits: the most replicas")
    return {**document, "rejected": [], "recommendation": chosen, "no_layout": None}


def _degree_entry(option: DegreeOption, prediction: Prediction | None) -> dict[str, Any]:
    return {
        "degree": option.degree,
        "replicas": option.replicas,
        "idle_cores": option.idle_cores,
        "memory_gib": round(option.memory.total / GIB, 2),
        "available_gib": round(option.memory.available / GIB, 2),
        "fits": option.memory.fits,
        "prediction": None if prediction is None else asdict(prediction),
    }


def _layout_entry(plan: ServingPlan, prediction: Prediction, reason: str) -> dict[str, Any]:
    return {
        "instance_type": plan.instance.name,
        "hourly_usd": plan.instance.hourly_usd,
        "degree": plan.degree,
        "replicas": len(plan.replicas),
        "layout": plan.describe(),
        "reason": reason,
        "prediction": asdict(prediction),
        # The host serves this layout, but compiles it only with enough memory: else a prebuilt export.
        "cannot_compile": compile_memory_problem(plan),
    }


def _recommended(document: dict[str, Any], recommendation: Recommendation) -> dict[str, Any]:
    return {
        **document,
        # Degrees whose memory does not fit are in the listing already; these are the objective's.
        "rejected": [{"degree": degree, "why": why}
                     for degree, why in recommendation.rejected if not why.startswith("does not fit")],
        "recommendation": _layout_entry(recommendation.plan, recommendation.prediction, recommendation.reason),
        "no_layout": None,
    }


def _plan_text(request: ServingRequest, workload: Workload, document: dict[str, Any]) -> str:
    where = "any instance type" if request.instance_type == ANY_INSTANCE else (
        f"{request.instance_type} (about ${INSTANCES[request.instance_type].hourly_usd:.2f}/h on demand)")
    lines = [
        f"{request.model_id} on {where}: batch {request.batch_size}, sequence {request.sequence_length}, "
        f"input <= {request.effective_max_input_tokens}, {request.dtype}",
        f"predicted for {workload.input_tokens} input and {workload.output_tokens} output tokens per request "
        "(prompts are padded to the sequence length; tok/s and $/Mtok: output tokens, at saturation)",
    ]
    if "instance_types" in document:
        rows = [["instance type", "$/h", "degree", "replicas", *_COLUMNS[6:]]]
        for entry in document["instance_types"]:
            rows.append([entry["instance_type"], f"{entry['hourly_usd']:.2f}", str(entry["degree"]),
                         str(entry["replicas"]), *_prediction_cells(Prediction(**entry["prediction"]))])
        lines.append(_table(rows))
        lines += [f"ruled out: {entry['instance_type']}: {entry['why']}" for entry in document["ruled_out"]]
    else:
        rows = [list(_COLUMNS)]
        for entry in document["degrees"]:
            prediction = entry["prediction"]
            rows.append([
                str(entry["degree"]), str(entry["replicas"]), str(entry["idle_cores"]),
                f"{entry['memory_gib']:.1f}", f"{entry['available_gib']:.0f}", "yes" if entry["fits"] else "no",
                *_prediction_cells(None if prediction is None else Prediction(**prediction)),
            ])
        lines.append(_table(rows))
    lines += [f"ruled out: degree {entry['degree']}: {entry['why']}" for entry in document["rejected"]]
    chosen = document["recommendation"]
    if chosen is None:
        lines.append(f"no layout: {document['no_layout']}")
    elif document["objective"] is None:
        lines.append(f"default (smallest degree that fits): {chosen['degree']} -> {chosen['layout']}")
    else:
        on = f"{chosen['instance_type']}, " if request.instance_type == ANY_INSTANCE else ""
        lines.append(f"recommended: {on}degree {chosen['degree']} ({_replicas(chosen['replicas'])}): "
                     f"{chosen['reason']}")
        lines.append(f"layout: {chosen['layout']}")
    if chosen is not None and chosen.get("cannot_compile"):
        lines.append(f"note: {chosen['cannot_compile']}")
    return "\n".join(lines)


class ApiKeyError(OpsError):
    """A failure of an ``api-key`` command that the user can act on. Its message never holds a key."""


@dataclass(frozen=True)
class _SecretState:
    """The secret's current version, as read."""

    arn: str
    version: str
    entries: dict[str, Any]


class _Aws:
    """The AWS calls of the ``api-key`` commands, each turned into an :class:`OpsError` when it fails."""

    def __init__(self, aws: Aws, stack: str, secret: str | None) -> None:
        self._aws = aws
        self.stack = stack
        self.named_secret = secret
        self.secret_id = secret

    def _call(self, service: str, operation: str, resource: str, **params: Any) -> Any:
        return self._aws.call(service, operation, resource, explain=self._explainer(service, resource), **params)

    def _explainer(self, service: str, resource: str) -> Explainer:
        region = self._aws.region

        def explain(code: str, message: str) -> str | None:
            if service == "cloudformation":
                said = stack_not_found(self.stack, region)(code, message)
                return said and f"{said}, or the secret itself with --secret"
            if code == "ResourceNotFoundException" and service == "secretsmanager":
                if "staging label" in message or "secret value" in message:
                    return (f"secret {resource} has no value yet: give it an empty set of keys with "
                            f"`aws secretsmanager put-secret-value --secret-id {resource} --secret-string '{{}}'`")
                return (f"secret {resource} not found in {region}" + (
                    f" (named by stack {self.stack}'s {SECRET_OUTPUT} output: was it deleted?)"
                    if self.named_secret is None else ": check --secret and --region"))
            return None

        return explain

    def find_secret(self) -> str:
        """The secret's name or ARN: ``--secret``, else the stack's :data:`SECRET_OUTPUT` output."""
        if self.secret_id is not None:
            return self.secret_id
        described = self._call("cloudformation", "describe_stacks", self.stack, StackName=self.stack)
        (stack,) = described["Stacks"]
        outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
        if outputs.get(SECRET_OUTPUT):
            self.secret_id = str(outputs[SECRET_OUTPUT])
            return self.secret_id
        status = stack.get("StackStatus", "")
        if status.endswith("_IN_PROGRESS"):
            raise ApiKeyError(f"stack {self.stack} is {status} and has no {SECRET_OUTPUT} output yet: "
                              "try again once it is complete")
        raise ApiKeyError(f"stack {self.stack} has no {SECRET_OUTPUT} output: it was deployed without API keys. "
                          f"Deploy it with -c api_keys=true (its endpoint then requires a key), or name a secret "
                          "with --secret")

    def read(self) -> _SecretState:
        """The secret's current version; refuses one that is not a JSON object."""
        secret_id = self.find_secret()
        value = self._call("secretsmanager", "get_secret_value", secret_id, SecretId=secret_id)
        arn = str(value["ARN"])
        try:
            entries = json.loads(value["SecretString"]) if "SecretString" in value else None
        except ValueError:
            entries = None
        if not isinstance(entries, dict):
            # Says nothing of the value: it may hold keys.
            raise ApiKeyError(f"secret {arn} is not a JSON object mapping key names to keys or their digests, "
                              "so the hosts ignore it and keep the keys they had, and nothing was changed: fix it, "
                              "or replace it with {} (no key at all: every request is refused)")
        return _SecretState(arn, str(value["VersionId"]), entries)

    def write(self, read: _SecretState, entries: dict[str, Any]) -> None:
        """Store ``entries`` as the secret's new current version, unless it changed since ``read``."""
        current = self._call("secretsmanager", "get_secret_value", read.arn, SecretId=read.arn)
        if current["VersionId"] != read.version:
            raise ApiKeyError(f"secret {read.arn} changed while this command ran (another operator?): nothing was "
                              "written; run the command again")
        # One token per change: botocore's retries of this call then cannot store it twice, and a retry
        # after a lost answer finds the version already there instead of failing.
        self._call("secretsmanager", "put_secret_value", read.arn, SecretId=read.arn,
                   SecretString=json.dumps(entries), ClientRequestToken=str(uuid.uuid4()))


def _show_key(key: str, lines: Sequence[str]) -> None:
    """The key alone on stdout (``KEY=$(neuron-serving api-key create ci)``); words for people on stderr."""
    print(key, flush=True)
    for line in (*lines,
                 "The key (on stdout) is shown this once: only its SHA-256 digest is stored. Keep it now.",
                 "Clients send it in the header  Authorization: Bearer <key>",
                 f"It takes effect within about {SYNC_MINUTES} minutes (each host reads the secret every minute)."):
        print(line, file=sys.stderr)


def _create(aws: _Aws, name: str) -> None:
    secret = aws.read()
    if name in secret.entries:
        raise ApiKeyError(f"a key named {name!r} already exists in {secret.arn}: replace it with "
                          f"`neuron-serving api-key rotate {name}`")
    key = new_key()
    aws.write(secret, {**secret.entries, name: stored(key)})
    _show_key(key, [f"neuron-serving: created API key {name!r} in {secret.arn}."])


def _rotate(aws: _Aws, name: str) -> None:
    secret = aws.read()
    if name not in secret.entries:
        raise ApiKeyError(f"no key named {name!r} in {secret.arn}: create it with "
                          f"`neuron-serving api-key create {name}`")
    key = new_key()
    aws.write(secret, {**secret.entries, name: stored(key)})
    _show_key(key, [f"neuron-serving: rotated API key {name!r} in {secret.arn}; the old key stops working "
                    f"within about {SYNC_MINUTES} minutes."])


def _revoke(aws: _Aws, name: str) -> None:
    secret = aws.read()
    if name not in secret.entries:
        raise ApiKeyError(f"no key named {name!r} in {secret.arn} (`neuron-serving api-key list` shows the names)")
    entries = {n: v for n, v in secret.entries.items() if n != name}
    if entries and not parse_secret(json.dumps(entries))[0]:
        # The hosts keep the keys in force when no entry is a key (userdata/api_keys.py): this
        # key would keep working.
        raise ApiKeyError(f"revoking {name!r} would leave {secret.arn} with only entries the hosts ignore "
                          f"({', '.join(map(repr, entries))}), and the hosts then keep the keys they have, this one "
                          "included: nothing was changed. Revoke or fix those entries first "
                          "(`neuron-serving api-key list` says why each is ignored)")
    aws.write(secret, entries)
    print(f"neuron-serving: revoked API key {name!r} in {secret.arn}; it stops working within about "
          f"{SYNC_MINUTES} minutes.", file=sys.stderr)
    if not entries:
        print("neuron-serving: no usable key remains: the endpoint will refuse every request.", file=sys.stderr)


def _list(aws: _Aws, _name: None) -> None:
    secret = aws.read()
    keys, problems = parse_secret(json.dumps(secret.entries))
    print(f"neuron-serving: {len(keys)} key(s) in {secret.arn}" + (
        "" if keys else ": the hosts ignore it and keep the keys they had" if problems
        else ": the endpoint refuses every request"), file=sys.stderr)
    width = max((len(name) for name in keys), default=0)
    for name in keys:
        how = ("digest" if str(secret.entries[name]).startswith(DIGEST_PREFIX)
               else "key (hashed on the hosts; rotate it to store only its digest)")
        print(f"{name:<{width}}  {how}")
    for problem in problems:
        print(f"ignored by the hosts: {problem}")


_ACTIONS: dict[str, Callable[[_Aws, Any], None]] = {
    "create": _create, "rotate": _rotate, "revoke": _revoke, "list": _list,
}


def api_key_command(args: argparse.Namespace) -> int:
    """Run one ``api-key`` action; every failure is a line on stderr and exit status 1, never a traceback."""

    def command() -> int:
        aws = _Aws(Aws.connect(args.region), args.stack or DEFAULT_STACK, args.secret)
        _ACTIONS[args.action](aws, getattr(args, "name", None))
        return 0

    return run_aws(command)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "api-key":
        return api_key_command(args)
    if hasattr(args, "run"):
        return int(args.run(args))
    try:
        print(plan_command(args))
    except ServingConfigError as err:
        print(f"neuron-serving: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
