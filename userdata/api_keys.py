#!/usr/bin/env python3
"""The API keys of a neuron-serving endpoint: the secret that holds them, and on the host, the
sync that hands the router their digests.

**The secret** (Secrets Manager) is a JSON object mapping each key's name to the key's SHA-256
digest, written ``sha256:<64 hex digits>``: what ``neuron-serving api-key create`` stores, so the
key itself is printed once and kept nowhere. A value may also be a key itself (at least
:data:`MIN_KEY_LENGTH` printable characters without spaces), for keys made elsewhere; the host
hashes it. ``{}`` is a valid secret with no key: every request is refused.

**The router** (HAProxy) compares the SHA-256 of the ``Authorization: Bearer`` token with the
digests in :data:`KEYS_FILE`; neither the keys nor the secret's text are ever on the host's disk.

**On the host**, ``api-keys sync`` (run by the boot script before the router starts, then every
minute by ``neuron-serving-api-keys.timer``) reads the secret with the AWS CLI, whose output comes
through a pipe (never an argument, a file or a log line). When the digests changed, it hands them
to the running router through its runtime API (``prepare acl``, ``add acl``, ``commit acl``: one
atomic switch, no reload, no connection dropped), then writes them to the key file, which HAProxy
reads when it starts.

**When the secret cannot be used, the keys in force stay** (the router's and the key file alike)
and the sync exits 1, so that ``neuron-serving-api-keys.service`` fails and says why in its
journal (never the secret's text, nor a key: entries are named, never quoted). That is so when
the secret cannot be read, when it is not JSON, when it is JSON but not an object, when it is a
non-empty object none of whose entries is a key (an edit gone wrong looks like that far more often
than a wish to refuse everyone), and when the router refuses the switch. Only ``{}`` says "no key":
the one secret that refuses every request.

A secret with some entries that are keys and some that are not is used: its keys are put in force
(a key revoked, rotated or added alongside a broken entry takes effect, as it must), each other
entry is named on stderr, and the sync still exits 1. An entry the operator meant as a key is a
client refused with 401, and a failed unit (and its alarm) is how anyone hears of it; the unit
fails every minute until the entry is fixed or removed.

With ``--metrics FILE`` (the timer's unit, on hosts that publish metrics) each failed run also
appends one CloudWatch embedded-metric-format line to FILE: :data:`FAILURE_METRIC` = 1 with the
``Service`` and ``InstanceId`` dimensions and the reason, which the CloudWatch agent ships to the
stack's metrics log group, where CloudWatch Logs turns it into the metric the stack's
``ApiKeySync`` alarm watches. A run that succeeds writes nothing.

Standard library only: the host's python3, and the ``neuron-serving`` CLI imports it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

KEY_PREFIX = "nsk-"
"""Keys made by :func:`new_key` start with this, so secret scanners and people recognise them."""

MIN_KEY_LENGTH = 32
"""The shortest key a secret may hold as is: 32 characters of a random key are ~190 bits."""

KEYS_FILE = "/etc/haproxy/api-keys.sha256"
"""The router's key file: one lowercase hex SHA-256 digest per line."""

RUNTIME_SOCKET = "/run/haproxy/admin.sock"
"""The router's runtime API socket, root only. Debian's and Ubuntu's haproxy package creates
/run/haproxy at boot (its /usr/lib/tmpfiles.d/haproxy.conf)."""

FAILURE_METRIC = "ApiKeySyncFailures"
"""The metric of the runs that failed: 1 per failed run, none when it succeeds."""
METRICS_FILE = "/var/log/neuron-serving/api-keys.emf"
"""Where the timer's runs append :data:`FAILURE_METRIC`, for the CloudWatch agent to ship."""

DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}")


def new_key() -> str:
    """A new random key: :data:`KEY_PREFIX` and 256 bits, URL-safe base64."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    """The lowercase hex SHA-256 of ``key``, as the router computes it from the header."""
    return hashlib.sha256(key.encode()).hexdigest()


def stored(key: str) -> str:
    """How the secret stores ``key``: its digest."""
    return DIGEST_PREFIX + digest(key)


def check_name(name: str) -> str | None:
    """Why ``name`` cannot name a key, or ``None``."""
    if not _NAME.fullmatch(name):
        return "must be 1 to 64 letters, digits and ._@+- starting with a letter or digit"
    return None


class UnusableSecret(ValueError):
    """The secret holds no set of keys: the keys in force stay. The message never quotes the secret."""


def parse_secret(text: str) -> tuple[dict[str, str], list[str]]:
    """The secret's keys as name -> digest, and a problem for each entry that is not a key.

    Raises :class:`UnusableSecret` when ``text`` is not a JSON object. Problems name the entry,
    never its value. Whether an object none of whose entries is a key is used is the caller's
    choice (:func:`sync` refuses it; ``{}`` has no problem).
    """
    try:
        entries = json.loads(text)
    except ValueError:
        # Not the decoder's message: it may quote the text.
        raise UnusableSecret("the secret is not JSON: it must be an object mapping key names to keys or their "
                             "digests") from None
    if not isinstance(entries, dict):
        raise UnusableSecret(f"the secret must be a JSON object mapping key names to keys or their digests, "
                             f"not {_JSON_TYPES.get(type(entries), 'a value')}")
    keys: dict[str, str] = {}
    problems = []
    for name, value in entries.items():
        why = check_name(name)
        if why is None and not isinstance(value, str):
            why = "must be a string"
        elif why is None:
            found = _DIGEST.fullmatch(value)
            if found:
                keys[name] = found.group(1)
                continue
            if value.startswith(DIGEST_PREFIX):
                why = "must be sha256: and 64 lowercase hex digits"
            elif len(value) < MIN_KEY_LENGTH or not value.isprintable() or any(c.isspace() for c in value):
                why = f"must be a key of at least {MIN_KEY_LENGTH} printable characters without spaces, or its digest"
            else:
                keys[name] = digest(value)
                continue
        problems.append(f"key {name[:64]!r} ignored: it {why}")
    return keys, problems


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}


def read_secret(secret_id: str, region: str) -> str:
    """The secret's text, read with the AWS CLI; raises ``RuntimeError`` with the CLI's error."""
    try:
        result = subprocess.run(
            ["aws", "secretsmanager", "get-secret-value", "--region", region, "--secret-id", secret_id,
             "--query", "SecretString", "--output", "text"],
            capture_output=True, text=True, check=False,
        )
    except FileNotFoundError:
        raise RuntimeError(f"could not read secret {secret_id}: no AWS CLI (aws) on PATH") from None
    if result.returncode != 0:
        error = result.stderr.strip().splitlines()
        raise RuntimeError(f"could not read secret {secret_id}: {error[-1] if error else f'exit {result.returncode}'}")
    return result.stdout.rstrip("\n")


def keys_file_text(digests: Sequence[str]) -> str:
    """The key file's content: one digest per line, sorted."""
    return "".join(f"{d}\n" for d in sorted(set(digests)))


def write_keys_file(path: str, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by root only (HAProxy reads it as root,
    before dropping its privileges)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(f"{path}.new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as new:
        new.write(text)
    os.replace(f"{path}.new", path)


def _runtime(sock_path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(sock_path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def update_router(sock_path: str, keys_file: str, digests: Sequence[str]) -> None:
    """Switch the running router's copy of ``keys_file`` to ``digests`` in one step.

    The runtime API's ``prepare acl`` opens a new, empty version of the file's entries, ``add
    acl @<version>`` fills it and ``commit acl`` makes it the one in force (HAProxy 2.4+,
    management guide, section 9.3).
    """
    answer = _runtime(sock_path, f"prepare acl {keys_file}")
    found = re.search(r"New version created: (\d+)", answer)
    if not found:
        raise RuntimeError(f"the router refused prepare acl: {answer.strip()}")
    version = found.group(1)
    for d in sorted(set(digests)):
        answer = _runtime(sock_path, f"add acl @{version} {keys_file} {d}")
        if answer.strip():
            raise RuntimeError(f"the router refused add acl: {answer.strip()}")
    answer = _runtime(sock_path, f"commit acl @{version} {keys_file}")
    if answer.strip():
        raise RuntimeError(f"the router refused commit acl: {answer.strip()}")


class SyncFailed(Exception):
    """Why a run failed, for stderr and the failure metric: never the secret's text nor a key."""


class Metrics(NamedTuple):
    """Where a failed run is counted: the EMF file and the metric's namespace and dimension values."""

    path: str
    namespace: str
    service: str
    instance_id: str

    def record_failure(self, reason: str) -> None:
        """Append one EMF line: :data:`FAILURE_METRIC` = 1 per ``Service`` and per ``InstanceId``
        (the catalog's dimension sets, ``neuron_serving.plan.metrics``), with the reason as a
        property (Amazon CloudWatch User Guide, "Specification: Embedded metric format")."""
        event = {
            "_aws": {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [{
                "Namespace": self.namespace, "Dimensions": [["Service"], ["Service", "InstanceId"]],
                "Metrics": [{"Name": FAILURE_METRIC, "Unit": "Count"}],
            }]},
            "Service": self.service, "InstanceId": self.instance_id, FAILURE_METRIC: 1, "Reason": reason,
        }
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        # One write of one line in append mode: a whole line however the agent reads the file.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)


def sync(secret_id: str, region: str, keys_file: str = KEYS_FILE, sock_path: str = RUNTIME_SOCKET,
         metrics: Metrics | None = None, *, router: bool = True) -> int:
    """Bring the key file and, with ``router``, the running router in line with the secret; the exit
    status. A failure is a line on stderr and, with ``metrics``, a failure counted there. Without
    ``router`` only the file is written: the boot does so before the router has its configuration,
    when whatever HAProxy answers the socket is not the endpoint's router."""
    try:
        _sync(secret_id, region, keys_file, sock_path, router)
    except SyncFailed as err:
        print(f"api-keys: {err}", file=sys.stderr)
        if metrics is not None:
            metrics.record_failure(str(err))
        return 1
    except Exception as err:
        # Unforeseen (a key file that cannot be written...): counted too, then the traceback.
        if metrics is not None:
            metrics.record_failure(f"unexpected {type(err).__name__}, see the unit's journal")
        raise
    return 0


def _sync(secret_id: str, region: str, keys_file: str, sock_path: str, router: bool) -> None:
    try:
        keys, problems = parse_secret(read_secret(secret_id, region))
    except (RuntimeError, UnusableSecret) as err:
        raise SyncFailed(f"{err}; the keys in force are unchanged") from None
    for line in problems:
        print(f"api-keys: {line}", file=sys.stderr)
    if problems and not keys:
        raise SyncFailed(f"no entry of the secret is a key ({len(problems)} ignored, above); the keys in force are "
                         "unchanged (the secret {} is the one that refuses every request)")
    text = keys_file_text(list(keys.values()))
    try:
        with open(keys_file) as current:
            unchanged = current.read() == text
    except FileNotFoundError:
        unchanged = False
    if not unchanged:
        # The router first: the file changes only once the router has the new keys, so a failed
        # update is retried on the next run.
        if router and os.path.exists(sock_path):
            try:
                update_router(sock_path, keys_file, list(keys.values()))
            except (OSError, RuntimeError) as err:
                raise SyncFailed(f"{err}; the router keeps its keys") from None
        write_keys_file(keys_file, text)
        names = ", ".join(sorted(keys)) or "none, so every request is refused"
        print(f"api-keys: {len(keys)} key(s) in force: {names}")
    if problems:
        raise SyncFailed(f"{len(problems)} of the secret's {len(problems) + len(keys)} entries ignored (above), "
                         f"its {len(keys)} key(s) in force: fix or remove the ignored entries")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="api-keys", description="Hand the secret's API keys to the router.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("sync", help="update the router's keys from the secret")
    run.add_argument("--secret", default=os.environ.get("API_KEYS_SECRET"), help="secret name or ARN")
    run.add_argument("--region", default=os.environ.get("REGION"))
    run.add_argument("--keys-file", default=KEYS_FILE)
    run.add_argument("--socket", default=RUNTIME_SOCKET)
    run.add_argument("--file-only", action="store_true",
                     help="write the key file only, for a router that reads it when it starts")
    run.add_argument("--metrics", metavar="FILE",
                     help=f"count a failed run in FILE (such as {METRICS_FILE}) as an EMF line, with the namespace "
                          "METRICS_NAMESPACE and the dimension values SERVICE and INSTANCE_ID of the environment")
    args = parser.parse_args(argv)
    if not args.secret or not args.region:
        parser.error("--secret and --region (or API_KEYS_SECRET and REGION) are required")
    root = os.environ.get("NEURON_SERVING_ROOT", "")
    metrics = None
    if args.metrics:
        names = ("METRICS_NAMESPACE", "SERVICE", "INSTANCE_ID")
        values = [os.environ.get(name, "") for name in names]
        missing = [name for name, value in zip(names, values, strict=True) if not value]
        if missing:
            parser.error(f"--metrics needs {', '.join(missing)} in the environment")
        metrics = Metrics(root + args.metrics, *values)
    return sync(args.secret, args.region, root + args.keys_file, root + args.socket, metrics,
                router=not args.file_only)


if __name__ == "__main__":
    sys.exit(main())
