"""``neuron-serving logs``: the hosts' boot logs and their replicas' output from CloudWatch Logs,
interleaved by time, each line prefixed by its stream (``i-0abc/boot``, ``i-0abc/replica-0``).

The log groups are the stack's ``BootLogGroup`` and ``ReplicasLogGroup`` outputs (its Monitoring
construct). The boot group has one stream per boot log and host (``{instance_id}/boot``, ``/export``,
``/ready``: render/monitoring.py), the replicas group one per replica (``{instance_id}/replica-{i}``,
docker's awslogs driver in userdata/run-replica.sh.j2).

AWS calls (and the IAM actions they need): cloudformation:DescribeStacks; logs:FilterLogEvents; with
``--host``, logs:DescribeLogStreams.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .aws import Aws, OpsError, run_aws
from .output import Clock, Printer, Sleep
from .stack import StackInfo, describe_stack, stack_options

GROUPS = ("BootLogGroup", "ReplicasLogGroup")
"""The outputs naming the log groups shown, in this order when two events share a millisecond."""

DEFAULT_SINCE = "1h"
FOLLOW_SECONDS = 5.0
"""Seconds between two polls of ``--follow``."""

STREAM_NAMES_PER_CALL = 100
"""FilterLogEvents takes at most 100 stream names (CloudWatch Logs API reference, FilterLogEvents:
https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_FilterLogEvents.html)."""

_SINCE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def since(text: str) -> dt.timedelta:
    """``90s``, ``30m``, ``1h``, ``2d`` as a duration."""
    found = _SINCE.fullmatch(text.strip())
    if not found or int(found[1]) == 0:
        raise argparse.ArgumentTypeError(f"--since {text!r}: give a number and a unit, s, m, h or d (30m, 1h, 2d)")
    return dt.timedelta(**{_UNITS[found[2]]: int(found[1])})


@dataclass(frozen=True, order=True)
class Event:
    """One log event; events sort by time, then by group and stream."""

    timestamp: int
    group_order: int
    stream: str
    event_id: str
    message: str

    def line(self) -> str:
        at = dt.datetime.fromtimestamp(self.timestamp / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{at} {self.stream} | {self.message.rstrip()}"


class LogReader:
    """Reads the stack's log groups, remembering which events it has already returned."""

    def __init__(self, aws: Aws, info: StackInfo, host: str | None) -> None:
        self.aws = aws
        self.host = host
        self.groups = [(name, info.output(name)) for name in GROUPS]
        if not any(group for _, group in self.groups):
            raise OpsError(f"stack {info.name} has no log groups (no BootLogGroup or ReplicasLogGroup output): it "
                           "was deployed without monitoring. Deploy it with monitoring, or read "
                           "/var/log/neuron-serving/*.log and `docker logs replica-N` on the host (Session Manager)")
        self.seen: set[str] = set()

    def read(self, start: dt.datetime) -> list[Event]:
        """Every event since ``start`` not returned before, sorted by time."""
        start_ms = int(start.timestamp() * 1000)
        events = []
        for order, (output, group) in enumerate(self.groups):
            if not group:
                continue
            for raw in self._filter(output, group, start_ms):
                event_id = str(raw.get("eventId", ""))
                key = f"{group}/{raw.get('logStreamName')}/{event_id}"
                if key in self.seen:
                    continue
                self.seen.add(key)
                events.append(Event(int(raw.get("timestamp", 0)), order, str(raw.get("logStreamName", "")),
                                    event_id, str(raw.get("message", ""))))
        return sorted(events)

    def _filter(self, output: str, group: str, start_ms: int) -> Iterable[dict[str, Any]]:
        explain = _group_not_found(group, output)
        if self.host is None:
            return self.aws.pages("logs", "filter_log_events", group, "events", explain=explain,
                                  logGroupName=group, startTime=start_ms)
        # The host's streams by name: a stream name prefix would serve as well, but moto 5.2.5 ignores
        # FilterLogEvents' logStreamNamePrefix (moto/logs/models.py, LogGroup.filter_log_events).
        streams = [str(s["logStreamName"]) for s in self.aws.pages(
            "logs", "describe_log_streams", group, "logStreams", explain=explain,
            logGroupName=group, logStreamNamePrefix=f"{self.host}/")]
        found: list[dict[str, Any]] = []
        for first in range(0, len(streams), STREAM_NAMES_PER_CALL):
            found += self.aws.pages("logs", "filter_log_events", group, "events", explain=explain,
                                    logGroupName=group, startTime=start_ms,
                                    logStreamNames=streams[first:first + STREAM_NAMES_PER_CALL])
        return found


def _group_not_found(group: str, output: str) -> Callable[[str, str], str | None]:
    def explain(code: str, message: str) -> str | None:
        if code == "ResourceNotFoundException":
            return f"log group {group} (the stack's {output} output) not found: was it deleted? ({message})"
        return None

    return explain


def logs(args: argparse.Namespace, *, aws: Aws | None = None, printer: Printer | None = None,
         now: Clock | None = None, sleep: Sleep = time.sleep) -> int:
    """Run ``logs`` as ``args`` say; ``now`` and ``sleep`` are the clock and ``--follow``'s wait."""
    clock = now or (lambda: dt.datetime.now(dt.UTC))
    out = printer or Printer()

    def command() -> int:
        session = aws or Aws.connect(args.region)
        reader = LogReader(session, describe_stack(session, args.stack), args.host)
        start = clock() - args.since
        try:
            while True:
                events = reader.read(start)
                for event in events:
                    # Plain lines, never wrapped: for grep and for a terminal's own wrapping.
                    print(event.line(), file=out.stream, flush=True)
                if not args.follow:
                    if not reader.seen:
                        out.print(f"no log events since {start.strftime('%Y-%m-%dT%H:%M:%SZ')}"
                                  + (f" from {args.host}" if args.host else "") + ": try a longer --since")
                    return 0
                # Events can arrive late and out of order (the agent batches them): look a little
                # back each time; the events already shown are skipped by id.
                if events:
                    start = max(start, dt.datetime.fromtimestamp(events[-1].timestamp / 1000, dt.UTC)
                                - dt.timedelta(minutes=5))
                sleep(args.interval)
        except KeyboardInterrupt:
            return 0

    return run_aws(command)


def register(commands: Any) -> None:
    """Add ``logs`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    parser = commands.add_parser(
        "logs", parents=[stack_options()], help="the hosts' boot logs and replicas' output from CloudWatch Logs",
        description="The hosts' boot logs (streams INSTANCE/boot, /export, /ready) and each replica's output "
                    "(INSTANCE/replica-N), interleaved by time. Needs cloudformation:DescribeStacks, "
                    "logs:FilterLogEvents and, with --host, logs:DescribeLogStreams.")
    parser.add_argument("--host", metavar="INSTANCE_ID", help="only this instance's logs")
    parser.add_argument("--since", type=since, default=since(DEFAULT_SINCE),
                        help=f"how far back: 90s, 30m, 1h, 2d (default: {DEFAULT_SINCE})")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events until Ctrl-C")
    parser.add_argument("--interval", type=float, default=FOLLOW_SECONDS, help=argparse.SUPPRESS)
    parser.set_defaults(run=logs)
