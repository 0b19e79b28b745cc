#!/usr/bin/env python3
"""watch-interruption: drains this host before EC2 interrupts it or its Auto Scaling group terminates it.

Installed as ``/opt/neuron-serving/bin/watch-interruption`` on hosts with interruptions on (``BootOptions.
interruptions``) and run by ``neuron-serving-interruption.service`` from the moment the router serves.
Python's standard library only: it runs under the image's ``python3``.

Every :data:`POLL_SECONDS` it asks the instance metadata service (IMDSv2: a session token, refreshed
before it expires) for

- ``meta-data/spot/instance-action``: 404 until EC2 has decided to interrupt this Spot Instance, then
  ``{"action": "terminate" | "stop" | "hibernate", "time": "<UTC, ISO 8601>"}``, about two minutes
  before the action (Amazon EC2 user guide, "Spot Instance interruption notices");
- with ``--hook-seconds`` (the group has a termination lifecycle hook, ``BootOptions.termination_hook``),
  ``meta-data/autoscaling/target-lifecycle-state``, which becomes ``Terminated`` when the group starts
  terminating this host, for whatever reason (Amazon EC2 Auto Scaling user guide, "Retrieve the target
  lifecycle state through instance metadata"); and
- ``meta-data/events/recommendations/rebalance``: 404 until EC2 says this Spot Instance is at an
  elevated risk of interruption, then ``{"noticeTime": "<UTC, ISO 8601>"}`` (Amazon EC2 user guide,
  "EC2 instance rebalance recommendations"). This one is only logged: the group's Capacity Rebalancing
  launches a replacement, waits for it to pass its health check, and then terminates this host through
  its termination lifecycle (Amazon EC2 Auto Scaling user guide, "Capacity Rebalancing"), which the
  target lifecycle state shows. Draining at the recommendation would take the host out of service before
  its replacement serves, which is what Capacity Rebalancing exists to avoid.

On the first Spot notice or termination it drains, each step logged and none stopping the next when it
fails:

1. the router's ``/health`` answers 503 from then on, so the load balancer sends it nothing new: the
   runtime API's ``add acl <DRAIN_FILE> draining`` (userdata/haproxy.cfg.j2 says why this
   mechanism); requests in flight, and those that still arrive, are served as before;
2. ``report-phase draining <why>`` tags the instance with the phase;
3. on a Spot notice, ``aws autoscaling terminate-instance-in-auto-scaling-group
   --no-should-decrement-desired-capacity`` asks its Auto Scaling group to replace it now (Amazon EC2 Auto
   Scaling API Reference, TerminateInstanceInAutoScalingGroup);
4. it waits until the router has no request in flight (its ``replicas`` backend's current sessions
   and queue, ``show stat``: management guide, section 9.1, ``scur`` and ``qcur``), or until the
   notice's time less :data:`DEADLINE_MARGIN_SECONDS` (a termination: the hook's heartbeat timeout less
   that margin, or a Spot notice's time should one follow), and logs what was still in flight when it
   gave up;
5. with a termination lifecycle hook, ``aws autoscaling complete-lifecycle-action
   --lifecycle-action-result CONTINUE``, tried again every :data:`COMPLETE_RETRY_SECONDS` while no action
   is pending yet: the group deregisters the host from the load balancer, waiting for its requests in
   flight, before it calls the hook (the same guide, "How lifecycle hooks work"), for as long again as
   the hook's heartbeat timeout.

Then it exits 0 (its unit restarts it only after a failure): a host drains once.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import NamedTuple

# Ubuntu 22.04's python3 is 3.10, which lacks datetime.UTC (3.11).
UTC = timezone.utc  # noqa: UP017

IMDS = "http://169.254.169.254/latest"
INSTANCE_ACTION = "meta-data/spot/instance-action"
REBALANCE = "meta-data/events/recommendations/rebalance"
TARGET_STATE = "meta-data/autoscaling/target-lifecycle-state"
TERMINATED = "Terminated"

POLL_SECONDS = 1.0
"""How often it asks for a notice: the router stops passing the health check within this and a
runtime API command of the notice's arrival."""

TOKEN_TTL_SECONDS = 300
TOKEN_REFRESH_SECONDS = 60
"""The IMDSv2 token's life (PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds, 1 to
21600: Amazon EC2 user guide, "Use the Instance Metadata Service to access instance metadata"), and
how long before its end a new one is taken."""

DEADLINE_MARGIN_SECONDS = 10
"""How long before a notice's time it stops waiting for the requests in flight."""

NOTICE_WAIT_SECONDS = 120
"""How long it waits for the requests in flight after a Spot notice whose time cannot be read: as long as
a notice usually gives."""

COMPLETE_RETRY_SECONDS = 5.0
"""How often it asks again to complete the lifecycle action while the group has none pending yet."""

DRAIN_FILE = "/etc/haproxy/draining.acl"
"""The router's drain pattern file: it holds no pattern on disk (a comment only); the running
router's copy gets :data:`DRAIN_PATTERN`."""
DRAIN_PATTERN = "draining"
DRAIN_FILE_TEXT = ("# Empty: watch-interruption adds \"draining\" to the running router's copy when the host drains\n"
                   "# (neuron_serving/userdata/watch_interruption.py).\n")

RUNTIME_SOCKET = "/run/haproxy/admin.sock"
"""The router's runtime API socket (the same as ``api_keys.RUNTIME_SOCKET``)."""
BACKEND = "replicas"
"""The router's backend, whose sessions and queue are the requests in flight."""

AWS_TIMEOUTS = ("--cli-connect-timeout", "10", "--cli-read-timeout", "20")
CALL_TIMEOUT_SECONDS = 60


def log(message: str) -> None:
    print(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} watch-interruption: {message}", flush=True)


class Notice(NamedTuple):
    """A Spot interruption notice or the group's termination: what it says, and when to stop waiting."""

    kind: str
    detail: str
    deadline: float
    """``time.time()`` by which the wait for requests in flight ends."""


def parse_time(text: str) -> float | None:
    """An IMDS time (``2026-05-01T12:00:00Z``) as seconds since the epoch, or None."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        return None


def instance_action(body: str, now: float) -> Notice:
    """The notice of ``spot/instance-action``'s ``body``. A body that cannot be read still drains,
    waiting as long as the notice usually gives."""
    try:
        data = json.loads(body)
        action, at = str(data.get("action")), str(data.get("time"))
    except (ValueError, AttributeError):
        action, at = "unknown", ""
    when = parse_time(at)
    deadline = (when if when is not None else now + NOTICE_WAIT_SECONDS) - DEADLINE_MARGIN_SECONDS
    return Notice("interruption", f"Spot interruption notice: {action} at {at or 'an unknown time'}", deadline)


def rebalance(body: str) -> str:
    """What the log says of a rebalance recommendation's ``body``."""
    try:
        at = str(json.loads(body).get("noticeTime"))
    except (ValueError, AttributeError):
        at = "an unknown time"
    return (f"rebalance recommendation at {at}: serving on; the group's Capacity Rebalancing launches a "
            "replacement, then terminates this host through its termination lifecycle")


def termination(hook: Hook, now: float) -> Notice:
    return Notice("termination", f"the Auto Scaling group {hook.group} terminates this host (lifecycle hook "
                  f"{hook.name})", now + hook.seconds - DEADLINE_MARGIN_SECONDS)


class Hook(NamedTuple):
    """The group's termination lifecycle hook, which the host completes once drained."""

    group: str
    name: str
    seconds: int
    """Its heartbeat timeout."""


class Metadata:
    """IMDSv2, its session token taken again before it expires or when refused. Never through a proxy."""

    def __init__(self, base: str = IMDS) -> None:
        self.base = base
        self.token = ""
        self.expires = 0.0
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _token(self) -> str:
        if time.monotonic() > self.expires - TOKEN_REFRESH_SECONDS:
            request = urllib.request.Request(f"{self.base}/api/token", method="PUT",
                                             headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_SECONDS)})
            with self.opener.open(request, timeout=2) as response:
                self.token = response.read().decode()
            self.expires = time.monotonic() + TOKEN_TTL_SECONDS
        return self.token

    def get(self, path: str) -> str | None:
        """The item at ``path``, or None when there is none (404). Raises OSError otherwise."""
        for attempt in (1, 2):
            request = urllib.request.Request(f"{self.base}/{path}", headers={"X-aws-ec2-metadata-token": self._token()})
            try:
                with self.opener.open(request, timeout=2) as response:
                    return str(response.read().decode())
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                if error.code == 401 and attempt == 1:
                    self.expires = 0.0
                    continue
                raise
        raise OSError("unreachable")


def runtime(sock_path: str, command: str) -> str:
    """One command on the router's runtime API, its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(sock_path)
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def drain_router(sock_path: str = RUNTIME_SOCKET, drain_file: str = DRAIN_FILE) -> None:
    """From now on the router's ``/health`` answers 503; nothing else changes. Raises OSError or
    RuntimeError when the router did not take it."""
    answer = runtime(sock_path, f"add acl {drain_file} {DRAIN_PATTERN}").strip()
    if answer:
        raise RuntimeError(f"the router refused add acl: {answer}")


def in_flight(sock_path: str = RUNTIME_SOCKET) -> tuple[int, int]:
    """The router's requests at a replica and those in its queue (``show stat``'s ``scur`` and
    ``qcur`` of the backend, management guide section 9.1)."""
    text = runtime(sock_path, "show stat").lstrip("# ")
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") == BACKEND and row.get("svname") == "BACKEND":
            return int(row.get("scur") or 0), int(row.get("qcur") or 0)
    raise RuntimeError(f"no backend {BACKEND} in the router's statistics")


def run(argv: Sequence[str]) -> bool:
    """``argv``, its output to the log; whether it succeeded. A failure is logged, never raised."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        log(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} failed: {error}")
        return False
    for line in (done.stdout + done.stderr).splitlines():
        log(f"  {line}")
    if done.returncode:
        log(f"{' '.join(argv[:3])} failed (exit {done.returncode})")
    return done.returncode == 0


def wait_for_notice(metadata: Metadata, hook: Hook | None,
                    sleep: Callable[[float], None] = time.sleep) -> Notice:
    failing = ""
    recommended = False
    while True:
        try:
            body = metadata.get(INSTANCE_ACTION)
            if body is not None:
                return instance_action(body, time.time())
            if hook is not None and (metadata.get(TARGET_STATE) or "").strip() == TERMINATED:
                return termination(hook, time.time())
            if not recommended and (body := metadata.get(REBALANCE)) is not None:
                log(rebalance(body))
                recommended = True
            if failing:
                log("the instance metadata answers again")
            failing = ""
        except (OSError, ValueError) as error:
            # Logged once per kind of failure: it asks every second.
            if str(error) != failing:
                log(f"cannot read the instance metadata: {error}")
            failing = str(error)
        sleep(POLL_SECONDS)


def complete_lifecycle(hook: Hook, *, region: str, instance_id: str, until: float,
                       sleep: Callable[[float], None] = time.sleep) -> None:
    """CONTINUE the group's termination lifecycle action, asked again while none is pending yet (the
    group calls the hook once the load balancer has deregistered the host), until ``until``."""
    while True:
        if run(["aws", "autoscaling", "complete-lifecycle-action", *AWS_TIMEOUTS, "--region", region,
                "--instance-id", instance_id, "--auto-scaling-group-name", hook.group,
                "--lifecycle-hook-name", hook.name, "--lifecycle-action-result", "CONTINUE"]):
            log("completed the termination lifecycle action: the group terminates the host")
            return
        if time.time() >= until:
            log(f"gave up completing the lifecycle action: the group continues after its heartbeat timeout "
                f"({hook.seconds} s)")
            return
        sleep(COMPLETE_RETRY_SECONDS)


def drain(notice: Notice, *, sock_path: str, drain_file: str, report_phase: str, phase: str,
          region: str, instance_id: str, hook: Hook | None = None, metadata: Metadata | None = None,
          sleep: Callable[[float], None] = time.sleep) -> None:
    log(f"{notice.detail}: draining")
    try:
        drain_router(sock_path, drain_file)
        log("the router's /health answers 503 from now on; requests are still served")
    except (OSError, RuntimeError) as error:
        log(f"could not drain the router: {error}")
    run([report_phase, phase, notice.detail])
    if notice.kind == "interruption":
        # The group replaces the host now rather than at its health check's failure: it launches another,
        # deregisters this one from the target group, waits the deregistration delay and terminates it
        # (Amazon EC2 Auto Scaling API Reference, TerminateInstanceInAutoScalingGroup,
        # ShouldDecrementDesiredCapacity false).
        run(["aws", "autoscaling", "terminate-instance-in-auto-scaling-group", *AWS_TIMEOUTS, "--region", region,
             "--instance-id", instance_id, "--no-should-decrement-desired-capacity"])
    deadline = notice.deadline
    last = (-1, -1)
    while True:
        try:
            last = in_flight(sock_path)
        except (OSError, RuntimeError, ValueError) as error:
            log(f"cannot count the requests in flight: {error}")
        if last == (0, 0):
            log("no request in flight: drained")
            break
        if metadata is not None and notice.kind == "termination":
            # A Spot notice may come while the group terminates the host, with its own deadline.
            try:
                body = metadata.get(INSTANCE_ACTION)
            except (OSError, ValueError):
                body = None
            if body is not None:
                notice = instance_action(body, time.time())
                deadline = min(deadline, notice.deadline)
                log(f"{notice.detail}: waiting for the requests in flight until then")
        if time.time() >= deadline:
            active, queued = last
            what = "unknown" if active < 0 else f"{active} at a replica and {queued} queued"
            log(f"gave up waiting at the deadline: requests still in flight: {what}")
            break
        sleep(POLL_SECONDS)
    if hook is not None:
        until = notice.deadline if notice.kind == "interruption" else time.time() + hook.seconds
        complete_lifecycle(hook, region=region, instance_id=instance_id, until=until, sleep=sleep)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="watch-interruption", description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help=f"the router's runtime API (default: {RUNTIME_SOCKET} under the root)")
    parser.add_argument("--drain-file", help=f"the drain's pattern file as the router names it (default: {DRAIN_FILE} "
                        "under the root)")
    parser.add_argument("--report-phase", required=True, help="the report-phase program")
    parser.add_argument("--phase", required=True, help="the phase it reports while draining")
    parser.add_argument("--hook-seconds", type=int, help="the heartbeat timeout of the group's termination "
                        "lifecycle hook, named by $GROUP_NAME and $TERMINATION_HOOK_NAME (default: no hook)")
    parser.add_argument("--imds", default=IMDS)
    args = parser.parse_args(argv)
    root = os.environ.get("NEURON_SERVING_ROOT", "")
    region, instance_id = os.environ.get("REGION", ""), os.environ.get("INSTANCE_ID", "")
    group, hook_name = os.environ.get("GROUP_NAME", ""), os.environ.get("TERMINATION_HOOK_NAME", "")
    hook = Hook(group, hook_name, args.hook_seconds) if args.hook_seconds and group and hook_name else None
    if args.hook_seconds and hook is None:
        log("no GROUP_NAME or TERMINATION_HOOK_NAME in the environment: the group's termination is not watched")
    metadata = Metadata(args.imds)
    watched = [INSTANCE_ACTION, *([TARGET_STATE] if hook else []), REBALANCE]
    log(f"watching {', '.join(watched)} every {POLL_SECONDS:g} s")
    notice = wait_for_notice(metadata, hook)
    drain(notice, sock_path=args.socket or root + RUNTIME_SOCKET, drain_file=args.drain_file or root + DRAIN_FILE,
          report_phase=root + args.report_phase, phase=args.phase, region=region, instance_id=instance_id,
          hook=hook, metadata=metadata)
    return 0


if __name__ == "__main__":
    sys.exit(main())
