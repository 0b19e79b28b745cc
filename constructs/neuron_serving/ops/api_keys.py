"""``neuron-serving api-key create|rotate|revoke|list``: edit the stack's API keys secret (see
:mod:`neuron_serving.userdata.api_keys` for its format) with boto3, imported only when a command
talks to AWS (:mod:`.aws`).

``--output json`` prints one document per command and never a key, except the one-time key of
``create`` and ``rotate``; the words for people stay on stderr in both modes.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..render.boot import API_KEYS_SYNC_MINUTES as SYNC_MINUTES
from ..userdata.api_keys import DIGEST_PREFIX, check_name, new_key, parse_secret, stored
from .aws import REGION_HELP, Aws, Explainer, OpsError, run_aws, stack_not_found
from .output import Printer, output_option
from .stack import DEFAULT_STACK

SECRET_OUTPUT = "ApiKeysSecretArn"
"""The output (its key, the logical id) of a stack deployed with ``-c api_keys=true``: the secret's ARN."""


_EPILOG = f"""\
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


def register(commands: Any) -> None:
    """Add ``api-key`` and its actions to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    where = argparse.ArgumentParser(add_help=False, parents=[output_option()])
    source = where.add_mutually_exclusive_group()
    # No default here: argparse takes a value identical to the default for no value at all, and would
    # then accept --stack with --secret.
    source.add_argument("--stack", help=f"stack whose {SECRET_OUTPUT} output names the secret "
                                        f"(default: {DEFAULT_STACK})")
    source.add_argument("--secret", help="the secret's name or ARN, instead of finding it through the stack")
    where.add_argument("--region", help=REGION_HELP)
    keys = commands.add_parser("api-key", help="create, rotate, revoke or list the endpoint's API keys",
                               description="Manage the endpoint's API keys, kept in a Secrets Manager secret.",
                               epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    keys.set_defaults(run=command)
    actions = keys.add_subparsers(dest="action", required=True)
    for action, help_text in (
        ("create", "add a key named NAME; prints the key, once, on stdout"),
        ("rotate", "replace NAME's key with a new one; prints it, once, on stdout"),
        ("revoke", "remove NAME's key"),
    ):
        parser = actions.add_parser(action, parents=[where], help=help_text, description=help_text,
                                    epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        # Revoking takes any name the secret holds, so that an entry the hosts ignore can be removed too.
        parser.add_argument("name", metavar="NAME", type=str if action == "revoke" else _key_name)
    actions.add_parser("list", parents=[where], help="the keys' names (never their values)",
                       description="The keys' names and how each is stored, never their values.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)


def _key_name(text: str) -> str:
    why = check_name(text)
    if why is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {why}")
    return text


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


def _show_key(printer: Printer, key: str, document: dict[str, str], lines: Sequence[str]) -> None:
    """The key alone on stdout (``KEY=$(neuron-serving api-key create ci)``), or in ``document`` with
    ``--output json``; words for people on stderr."""
    if printer.json:
        printer.document({**document, "key": key})
    else:
        printer.plain(key)
    for line in (*lines,
                 "The key (on stdout) is shown this once: only its SHA-256 digest is stored. Keep it now.",
                 "Clients send it in the header  Authorization: Bearer <key>",
                 f"It takes effect within about {SYNC_MINUTES} minutes (each host reads the secret every minute)."):
        print(line, file=sys.stderr)


def _create(aws: _Aws, name: str, printer: Printer) -> None:
    secret = aws.read()
    if name in secret.entries:
        raise ApiKeyError(f"a key named {name!r} already exists in {secret.arn}: replace it with "
                          f"`neuron-serving api-key rotate {name}`")
    key = new_key()
    aws.write(secret, {**secret.entries, name: stored(key)})
    _show_key(printer, key, {"action": "create", "name": name, "secret": secret.arn},
              [f"neuron-serving: created API key {name!r} in {secret.arn}."])


def _rotate(aws: _Aws, name: str, printer: Printer) -> None:
    secret = aws.read()
    if name not in secret.entries:
        raise ApiKeyError(f"no key named {name!r} in {secret.arn}: create it with "
                          f"`neuron-serving api-key create {name}`")
    key = new_key()
    aws.write(secret, {**secret.entries, name: stored(key)})
    _show_key(printer, key, {"action": "rotate", "name": name, "secret": secret.arn},
              [f"neuron-serving: rotated API key {name!r} in {secret.arn}; the old key stops working "
               f"within about {SYNC_MINUTES} minutes."])


def _revoke(aws: _Aws, name: str, printer: Printer) -> None:
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
    if printer.json:
        printer.document({"action": "revoke", "name": name, "secret": secret.arn})
    print(f"neuron-serving: revoked API key {name!r} in {secret.arn}; it stops working within about "
          f"{SYNC_MINUTES} minutes.", file=sys.stderr)
    if not entries:
        print("neuron-serving: no usable key remains: the endpoint will refuse every request.", file=sys.stderr)


def _list(aws: _Aws, _name: None, printer: Printer) -> None:
    secret = aws.read()
    keys, problems = parse_secret(json.dumps(secret.entries))
    print(f"neuron-serving: {len(keys)} key(s) in {secret.arn}" + (
        "" if keys else ": the hosts ignore it and keep the keys they had" if problems
        else ": the endpoint refuses every request"), file=sys.stderr)
    # Whether each key is stored as its digest or as the key itself; never the value.
    stored_as = {name: "digest" if str(secret.entries[name]).startswith(DIGEST_PREFIX) else "key" for name in keys}
    if printer.json:
        printer.document({"secret": secret.arn, "ignored": problems,
                          "keys": [{"name": name, "stored": how} for name, how in stored_as.items()]})
        return
    width = max((len(name) for name in keys), default=0)
    printer.plain(*(f"{name:<{width}}  " + (
        "digest" if how == "digest" else "key (hashed on the hosts; rotate it to store only its digest)")
        for name, how in stored_as.items()))
    printer.plain(*(f"ignored by the hosts: {problem}" for problem in problems))


_ACTIONS: dict[str, Callable[[_Aws, Any, Printer], None]] = {
    "create": _create, "rotate": _rotate, "revoke": _revoke, "list": _list,
}


def command(args: argparse.Namespace) -> int:
    """Run one ``api-key`` action; every failure is a line on stderr and exit status 1, never a traceback."""
    printer = Printer(args.output)

    def run() -> int:
        aws = _Aws(Aws.connect(args.region), args.stack or DEFAULT_STACK, args.secret)
        _ACTIONS[args.action](aws, getattr(args, "name", None), printer)
        return 0

    return run_aws(run)
