"""``neuron-serving status``: the stack, and each host's boot phase, how long it has been in it against
the plan's estimate, how long each phase it finished took against its estimate, whether the load
balancer finds it healthy, and whether it could not publish the export it compiled to the artifact
cache; ``--watch`` until every host serves or one fails.

AWS calls (and the IAM actions they need): cloudformation:DescribeStacks; ec2:DescribeInstances;
for a fleet autoscaling:DescribeAutoScalingGroups and autoscaling:DescribeWarmPool;
elasticloadbalancing:DescribeTargetHealth.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.live import Live

from ..plan.phases import FAILED, PUBLISH_FAILED, READY, WARMED, find_phase
from .aws import EXIT_FAILURE, Aws, OpsError, run_aws
from .output import Clock, Printer, Sleep, output_option, positive_seconds
from .stack import Host, StackInfo, describe_stack, find_hosts, stack_options, while_in_progress

DEFAULT_INTERVAL = 15
"""Seconds between two looks of ``--watch``: a host tags a new phase at most every few seconds, and
the load balancer checks each target every 15 seconds (the target group's HealthCheckIntervalSeconds)."""

INTERRUPTED = 130
"""``--watch``'s exit status when stopped with Ctrl-C before the hosts were done (128 + SIGINT, as shells say)."""


_REPLICAS = re.compile(r"\b(\d+) of (\d+)\b")
"""The count in a ``wait-ready`` detail: ``3 of 6 ready``."""


def stack_failing(status: str) -> bool:
    """Whether a CloudFormation stack status is a failure or a rollback (CloudFormation user guide,
    "Stack status codes": https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/
    view-stack-events.html#cfn-console-view-stack-data-resources-status-codes). Not
    UPDATE_ROLLBACK_COMPLETE: the stack is back, working, at its previous version, and its hosts may
    still be booting (a scale-out, a replaced instance)."""
    return status.endswith("_FAILED") or ("ROLLBACK" in status and status != "UPDATE_ROLLBACK_COMPLETE")


@dataclass(frozen=True)
class PhaseTime:
    """A phase a host finished: how long it took, as the host measured it, and its estimate."""

    phase: str
    seconds: int
    estimate_minutes: int | None

    @property
    def over(self) -> bool:
        return self.estimate_minutes is not None and self.seconds > self.estimate_minutes * 60

    def document(self) -> dict[str, Any]:
        return {"phase": self.phase, "seconds": self.seconds, "estimate_minutes": self.estimate_minutes,
                "over_estimate": self.over}


@dataclass(frozen=True)
class HostStatus:
    """One host as ``status`` shows it."""

    host: Host
    elapsed: dt.timedelta | None
    estimate_minutes: int | None
    target_state: str
    target_reason: str
    replicas_healthy: str
    finished: tuple[PhaseTime, ...] = ()

    @property
    def overdue(self) -> bool:
        return (self.elapsed is not None and self.estimate_minutes is not None
                and self.elapsed > dt.timedelta(minutes=self.estimate_minutes))

    @property
    def serving_unreported(self) -> bool:
        """Healthy behind the load balancer without a phase: a host whose reports its role refused
        (they never stop a boot), or one booted by an older version."""
        return self.host.phase is None and self.target_state == "healthy"

    @property
    def publish_failure(self) -> str | None:
        """Why the host could not publish the export it compiled to the artifact cache, or None when it
        did, lost the race to another host, or published nothing."""
        outcome, _, reason = self.host.publish.partition(":")
        if outcome != PUBLISH_FAILED:
            return None
        return reason.strip() or "no reason given"

    @property
    def phase_name(self) -> str:
        return self.host.phase or "starting"

    @property
    def title(self) -> str:
        known = self.host.known_phase
        if known is not None:
            return known.title
        if self.host.phase is None:
            if self.host.state == "stopped":
                return "stopped"
            if self.serving_unreported:
                return "serving by the load balancer's health check; the host reported no phase"
            return (f"booting, no phase reported yet (its boot log: neuron-serving logs --host "
                    f"{self.host.instance_id})")
        return "a phase this version of neuron-serving does not know"

    def document(self) -> dict[str, Any]:
        host = self.host
        return {
            "instance_id": host.instance_id, "instance_type": host.instance_type, "capacity": host.capacity,
            "state": host.state, "availability_zone": host.availability_zone,
            "lifecycle_state": host.lifecycle_state, "warm_pool": host.warm, "phase": host.phase,
            "title": self.title, "since": host.since.isoformat() if host.since else None,
            "elapsed_seconds": int(self.elapsed.total_seconds()) if self.elapsed is not None else None,
            "estimate_minutes": self.estimate_minutes, "overdue": self.overdue, "detail": host.detail,
            "target_health": {"state": self.target_state, "reason": self.target_reason},
            "replicas_healthy": self.replicas_healthy or None,
            "phase_times": [t.document() for t in self.finished],
            "export_publish": host.publish or None,
            "export_publish_failed": self.publish_failure is not None,
        }


@dataclass(frozen=True)
class Snapshot:
    """The stack and its hosts at one moment."""

    stack: StackInfo
    hosts: tuple[HostStatus, ...]
    at: dt.datetime

    @property
    def failed(self) -> list[HostStatus]:
        return [h for h in self.hosts if h.host.phase == FAILED]

    @property
    def done(self) -> bool:
        """Every host in service serves and every warm-pool host is prepared; at least one serves."""
        serving = [h for h in self.hosts if not h.host.warm]
        return bool(serving) and all(h.host.phase == READY or h.serving_unreported for h in serving) and all(
            h.host.phase == WARMED for h in self.hosts if h.host.warm)

    def document(self) -> dict[str, Any]:
        return {
            "stack": {"name": self.stack.name, "status": self.stack.status, "reason": self.stack.reason or None,
                      "outputs": self.stack.outputs},
            "endpoint_url": self.stack.output("EndpointUrl"), "dashboard_url": self.stack.output("DashboardUrl"),
            "hosts": [h.document() for h in self.hosts], "at": self.at.isoformat(),
        }


def look(aws: Aws, stack: str, now: dt.datetime) -> Snapshot:
    """The stack and its hosts now."""
    info = describe_stack(aws, stack)
    if not (info.output("InstanceId") or info.output("AutoScalingGroupName")):
        if not info.status.endswith("_IN_PROGRESS"):
            raise OpsError(f"stack {info.name} ({info.status}) has neither an InstanceId nor an "
                           "AutoScalingGroupName output: was it deployed with this version of "
                           "cdk-neuron-serving? Deploy it again")
        # A stack being created has no outputs until it completes, and it completes only once its
        # hosts have booted: read what the boot needs from its resources and template instead.
        info = while_in_progress(aws, info)
        if not (info.output("InstanceId") or info.output("AutoScalingGroupName")):
            return Snapshot(info, (), now)
    hosts = find_hosts(aws, info)
    health = _target_health(aws, info)
    minutes = info.boot_phase_minutes
    by_type = _replicas_by_type(info.output("ReplicasByInstanceType"))
    statuses = []
    for host in hosts:
        replicas = str(by_type.get(host.instance_type) or info.output("ReplicaCount") or "")
        estimate = _estimate(minutes, host.phase) if host.phase else None
        since = host.since or (host.launched if host.phase is None else None)
        elapsed = max(now - since, dt.timedelta(0)) if since is not None and host.phase not in (
            READY, FAILED, WARMED) else None
        state, reason = health.get(host.instance_id, ("not registered" if not host.warm else "-", ""))
        counted = _REPLICAS.search(host.detail) if host.phase == "wait-ready" else None
        healthy = (f"{counted[1]} of {counted[2]}" if counted else
                   f"{replicas} of {replicas}" if host.phase == READY and replicas else "")
        statuses.append(HostStatus(host, elapsed, estimate, state, reason, healthy,
                                   tuple(PhaseTime(name, seconds, _estimate(minutes, name))
                                         for name, seconds in host.seconds)))
    return Snapshot(info, tuple(statuses), now)


def _replicas_by_type(text: str | None) -> dict[str, int]:
    """The ``ReplicasByInstanceType`` output of a fleet of several types (a JSON object), else empty."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int)} if isinstance(value, dict) else {}


def _estimate(minutes: dict[str, int], name: str) -> int | None:
    known = find_phase(name)
    return minutes.get(known.estimate) if known is not None and known.estimate else None


def _target_health(aws: Aws, info: StackInfo) -> dict[str, tuple[str, str]]:
    """Each registered target's state and reason code (Elastic Load Balancing API reference,
    TargetHealth: https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/API_TargetHealth.html)."""
    arn = info.output("TargetGroupArn")
    if not arn:
        return {}
    described = aws.call("elbv2", "describe_target_health", arn, TargetGroupArn=arn)
    return {str(d["Target"]["Id"]): (str(d.get("TargetHealth", {}).get("State", "")),
                                     str(d.get("TargetHealth", {}).get("Reason", "")))
            for d in described.get("TargetHealthDescriptions", [])}


def _duration(delta: dt.timedelta | None) -> str:
    if delta is None:
        return ""
    seconds = int(delta.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _host_label(status: HostStatus) -> str:
    host = status.host
    return f"{host.instance_id} (warm pool)" if host.warm else host.instance_id


def _phase_cell(status: HostStatus) -> str:
    return f"{status.phase_name}: {status.title}"


def _timing_cell(status: HostStatus) -> str:
    if status.elapsed is None:
        return ""
    text = _duration(status.elapsed)
    if status.estimate_minutes is not None:
        text += f" of ~{status.estimate_minutes}m" + (" OVERDUE" if status.overdue else "")
    return text


def _took(time: PhaseTime) -> str:
    """``3m32s``, with ``of ~20m`` when the phase has an estimate, and ``OVER`` beyond it."""
    text = _duration(dt.timedelta(seconds=time.seconds))
    if time.estimate_minutes is not None:
        text += f" of ~{time.estimate_minutes}m" + (" OVER" if time.over else "")
    return text


def _health_cell(status: HostStatus) -> str:
    return f"{status.target_state} ({status.target_reason})" if status.target_reason else status.target_state


def _stack_line(snapshot: Snapshot) -> str:
    stack = snapshot.stack
    line = f"stack {stack.name}: {stack.status}"
    return line + (f" ({stack.reason})" if stack.reason and stack_failing(stack.status) else "")


def render(printer: Printer, snapshot: Snapshot) -> Group:
    """The whole status as one renderable: the stack, its URLs, a table of hosts."""
    stack = snapshot.stack
    lines = [_stack_line(snapshot)]
    for label, name in (("endpoint", "EndpointUrl"), ("dashboard", "DashboardUrl")):
        value = stack.output(name)
        if value:
            lines.append(f"{label}: {value}")
    rows = [(_host_label(s), s.host.instance_type, s.host.availability_zone, s.host.capacity, _phase_cell(s),
             _timing_cell(s), s.host.detail, s.replicas_healthy, _health_cell(s)) for s in snapshot.hosts]
    if len(snapshot.hosts) > 1:
        lines.append("hosts: " + mix(snapshot))
    parts: list[Any] = [*lines]
    if rows:
        parts.append(printer.table(("host", "type", "zone", "capacity", "phase", "in phase", "detail",
                                    "replicas healthy", "target"), rows, outcome_column=8))
    else:
        parts.append("no hosts yet" + (" (the stack is still being created)"
                                       if stack.status.endswith("_IN_PROGRESS") else ""))
    # A failed publish does not stop a host, which serves its own export; but each host after it compiles
    # again, which nothing else here would show.
    parts += [_publish_line(s) for s in snapshot.hosts if s.publish_failure is not None]
    # Each host's finished phases, as it measured them, beside the plan's estimates.
    times = [(_host_label(s), t.phase, _took(t)) for s in snapshot.hosts for t in s.finished]
    if times:
        parts.append(printer.table(("host", "finished phase", "took"), times,
                                   title="boot phases finished, as each host measured them, against the plan's "
                                   "estimate"))
    return Group(*parts)


def _publish_line(status: HostStatus) -> str:
    return (f"host {_host_label(status)} could not publish its export to the artifact cache: "
            f"{status.publish_failure}. It serves its own export; every host after it compiles again until one "
            "publishes (docs/operations.md, \"A failed publish\")")


def mix(snapshot: Snapshot) -> str:
    """The hosts counted by instance type, zone and capacity, most first: ``2 inf2.24xlarge in us-east-1a
    (spot), 1 inf2.8xlarge in us-east-1b (on-demand)``."""
    counts = Counter((s.host.instance_type, s.host.availability_zone, s.host.capacity) for s in snapshot.hosts)
    return ", ".join(f"{n} {kind} in {zone} ({capacity})"
                     for (kind, zone, capacity), n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _line(snapshot: Snapshot, status: HostStatus) -> str:
    """One appended line about a host (``--watch`` on no terminal)."""
    parts = [snapshot.at.strftime("%H:%M:%S"), _host_label(status), _phase_cell(status)]
    last = f"{status.finished[-1].phase} took {_took(status.finished[-1])}" if status.finished else ""
    for extra in (_timing_cell(status), status.host.detail, last,
                  f"replicas healthy {status.replicas_healthy}" if status.replicas_healthy else "",
                  f"target {_health_cell(status)}",
                  f"export not published: {status.publish_failure}" if status.publish_failure is not None else ""):
        if extra:
            parts.append(extra)
    return "  ".join(parts)


def _outcome(snapshot: Snapshot) -> int | None:
    """The exit status once ``--watch`` may stop (printing why on stderr when it fails), else None."""
    stack = snapshot.stack
    if stack_failing(stack.status):
        print(f"neuron-serving: stack {stack.name} is {stack.status}"
              + (f": {stack.reason}" if stack.reason else ""), file=sys.stderr)
        return EXIT_FAILURE
    if snapshot.failed:
        for status in snapshot.failed:
            print(f"neuron-serving: host {status.host.instance_id} failed: "
                  f"{status.host.detail or 'no reason given'} (`neuron-serving logs --host "
                  f"{status.host.instance_id}` shows its boot log)", file=sys.stderr)
        return EXIT_FAILURE
    if snapshot.done:
        return 0
    return None


def status(args: argparse.Namespace, *, aws: Aws | None = None, printer: Printer | None = None,
           now: Clock | None = None, sleep: Sleep = time.sleep) -> int:
    """Run ``status`` as ``args`` say; ``now`` and ``sleep`` are the clock and the wait between looks."""
    clock = now or (lambda: dt.datetime.now(dt.UTC))
    out = printer or Printer(args.output)

    def command() -> int:
        session = aws or Aws.connect(args.region)
        if not args.watch:
            snapshot = look(session, args.stack, clock())
            if out.json:
                out.document(snapshot.document())
            else:
                out.print(render(out, snapshot))
            # Still booting is no failure: only a failed host or stack is.
            return _outcome(snapshot) or 0
        return _watch(session, args, out, clock, sleep)

    return run_aws(command)


def _watch(aws: Aws, args: argparse.Namespace, out: Printer, clock: Clock, sleep: Sleep) -> int:
    live = None if out.json or not out.stream.isatty() else Live(console=out.console, auto_refresh=False)
    shown: dict[str, str] = {}
    try:
        if live is not None:
            live.start()
        while True:
            snapshot = look(aws, args.stack, clock())
            outcome = _outcome(snapshot)
            if out.json:
                if outcome is not None:
                    out.document(snapshot.document())
            elif live is not None:
                live.update(render(out, snapshot), refresh=True)
            else:
                _append(out, snapshot, shown)
            if outcome is not None:
                return outcome
            sleep(args.interval)
    except KeyboardInterrupt:
        return INTERRUPTED
    finally:
        if live is not None:
            live.stop()


def _append(out: Printer, snapshot: Snapshot, shown: dict[str, str]) -> None:
    """Print what changed since the last look: the stack's status, and each host whose phase, detail,
    replicas or target health changed or that became overdue."""
    stack_line = _stack_line(snapshot)
    if shown.get("") != stack_line:
        shown[""] = stack_line
        out.print(f"{snapshot.at.strftime('%H:%M:%S')}  {stack_line}")
    for status in snapshot.hosts:
        key = "|".join((status.phase_name, status.host.detail, status.replicas_healthy, _health_cell(status),
                        str(status.overdue), str(status.host.warm), status.host.publish))
        if shown.get(status.host.instance_id) != key:
            shown[status.host.instance_id] = key
            out.print(_line(snapshot, status))


def register(commands: Any) -> None:
    """Add ``status`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    parser = commands.add_parser(
        "status", parents=[stack_options(), output_option()],
        help="the stack, each host's boot phase and health, the endpoint and dashboard",
        description="The stack's status and outputs; each host's boot phase (reported by the host in its "
                    "tags), the time in it against the plan's estimate, how long each phase it finished took "
                    "against its estimate, its replicas and the load balancer's "
                    "health check, and each host that could not publish the export it compiled to the artifact "
                    "cache (it serves, but every host after it compiles again). Exit status 1 when a host's boot "
                    "failed or the stack failed or rolls back, "
                    "else 0. Needs cloudformation:DescribeStacks (and, while the stack is being created and has "
                    "no outputs yet, cloudformation:ListStackResources and cloudformation:GetTemplate), "
                    "ec2:DescribeInstances, autoscaling:DescribeAutoScalingGroups and "
                    "autoscaling:DescribeWarmPool (fleets), elasticloadbalancing:DescribeTargetHealth.")
    parser.add_argument("--watch", action="store_true",
                        help="look again every --interval seconds until every host serves (exit 0) or one "
                             "fails or the stack rolls back (exit 1)")
    parser.add_argument("--interval", type=positive_seconds, default=DEFAULT_INTERVAL,
                        help=f"seconds between looks with --watch (default: {DEFAULT_INTERVAL})")
    parser.set_defaults(run=status)

