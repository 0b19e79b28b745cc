"""``neuron-serving logs``: the boot and replica streams from CloudWatch Logs (moto's server), interleaved by time."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from neuron_serving.cli import _parser, main
from neuron_serving.ops.logs import logs
from neuron_serving.ops.output import Printer
from tests.harness.aws import REGION
from tests.ops.conftest import Deployment, need_moto

need_moto()

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
HOST_A = "i-0aaaaaaaaaaaaaaaa"
HOST_B = "i-0bbbbbbbbbbbbbbbb"


def ms(minutes_ago: float) -> int:
    return int((NOW - dt.timedelta(minutes=minutes_ago)).timestamp() * 1000)


def put(emulator: Any, group: str, stream: str, *events: tuple[float, str]) -> None:
    client = emulator.client("logs")
    if stream not in {s["logStreamName"] for s in client.describe_log_streams(logGroupName=group)["logStreams"]}:
        client.create_log_stream(logGroupName=group, logStreamName=stream)
    client.put_log_events(logGroupName=group, logStreamName=stream,
                          logEvents=[{"timestamp": ms(ago), "message": message} for ago, message in events])


@pytest.fixture
def logged(deployment: Deployment, emulator: Any) -> Deployment:
    """A stack with both hosts' boot logs and host A's two replicas."""
    for group in ("boot-logs", "replica-logs"):
        emulator.client("logs").create_log_group(logGroupName=group)
    deployment.stack(InstanceId=HOST_A)
    put(emulator, "boot-logs", f"{HOST_A}/boot", (30, "metadata: inf2.48xlarge"), (20, "pull-image: done"))
    put(emulator, "boot-logs", f"{HOST_A}/ready", (5, "3 of 6 ready"))
    put(emulator, "boot-logs", f"{HOST_B}/boot", (25, "metadata: inf2.48xlarge on B"))
    put(emulator, "replica-logs", f"{HOST_A}/replica-0", (10, "Loading model"), (4, "Connected"))
    put(emulator, "replica-logs", f"{HOST_A}/replica-1", (9, "Loading model"))
    put(emulator, "boot-logs", f"{HOST_A}/boot", (200, "an old boot, before --since"))
    return deployment


def run(*argv: str, sleep: Any = None) -> tuple[int, list[str]]:
    args = _parser().parse_args(["logs", "--region", REGION, *argv])
    stream = io.StringIO()
    code = logs(args, printer=Printer(stream=stream), now=lambda: NOW, sleep=sleep or (lambda _: None))
    return code, stream.getvalue().splitlines()


def stamp(minutes_ago: float) -> str:
    return (NOW - dt.timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_boot_and_replica_streams_are_interleaved_by_time_with_their_stream(logged):
    code, lines = run()
    assert code == 0
    assert lines == [
        f"{stamp(30)} {HOST_A}/boot | metadata: inf2.48xlarge",
        f"{stamp(25)} {HOST_B}/boot | metadata: inf2.48xlarge on B",
        f"{stamp(20)} {HOST_A}/boot | pull-image: done",
        f"{stamp(10)} {HOST_A}/replica-0 | Loading model",
        f"{stamp(9)} {HOST_A}/replica-1 | Loading model",
        f"{stamp(5)} {HOST_A}/ready | 3 of 6 ready",
        f"{stamp(4)} {HOST_A}/replica-0 | Connected",
    ]


def test_since_reaches_further_back(logged):
    code, lines = run("--since", "4h")
    assert code == 0 and lines[0] == f"{stamp(200)} {HOST_A}/boot | an old boot, before --since"


def test_host_restricts_to_one_instance(logged):
    code, lines = run("--host", HOST_B)
    assert code == 0
    assert lines == [f"{stamp(25)} {HOST_B}/boot | metadata: inf2.48xlarge on B"]


def test_follow_prints_new_events_until_interrupted(logged, emulator):
    polls = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            put(emulator, "replica-logs", f"{HOST_A}/replica-1", (0, "Connected"))
            return
        raise KeyboardInterrupt  # Ctrl-C

    code, lines = run("--follow", "--host", HOST_A, sleep=sleep)
    assert code == 0
    assert len(polls) == 2
    assert lines[-1] == f"{stamp(0)} {HOST_A}/replica-1 | Connected"
    assert len(lines) == len(set(lines)) == 7  # nothing shown twice


def test_a_stack_without_monitoring_says_so(deployment, capsys):
    deployment.stack(monitoring=False, InstanceId=HOST_A)
    assert main(["logs", "--region", REGION]) == 1
    err = capsys.readouterr().err
    assert "has no log groups (no BootLogGroup or ReplicasLogGroup output): it was deployed without monitoring" in err


def test_a_deleted_log_group_is_named(deployment, capsys):
    deployment.stack(InstanceId=HOST_A)
    assert main(["logs", "--region", REGION]) == 1
    assert "log group boot-logs (the stack's BootLogGroup output) not found" in capsys.readouterr().err


def test_nothing_logged_says_so(logged):
    code, lines = run("--host", "i-0cccccccccccccccc")
    assert code == 0
    assert lines == [f"no log events since {stamp(60)} from i-0cccccccccccccccc: try a longer --since"]


@pytest.mark.parametrize("since", ["1", "h", "0m", "1w"])
def test_a_bad_since_is_refused(since, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["logs", "--since", since])
    assert "give a number and a unit, s, m, h or d" in capsys.readouterr().err


def test_access_denied_names_the_missing_permission(logged, hooks, capsys):
    """A ``before-call`` hook answers as CloudWatch Logs does (AccessDeniedException): moto 5.2.5's IAM enforcement
    answers denied JSON-protocol calls with an XML body botocore reads as the code "403"."""
    hooks["before-call.cloudwatch-logs.FilterLogEvents"] = lambda **_: (
        AWSResponse("https://stub.invalid", 400, {}, None),
        {"Error": {"Code": "AccessDeniedException", "Message": "User: arn:aws:iam::123456789012:user/operator is not "
                   "authorized to perform: logs:FilterLogEvents"}, "ResponseMetadata": {"HTTPStatusCode": 400}})
    assert main(["logs", "--region", REGION]) == 1
    assert capsys.readouterr().err.startswith(
        "neuron-serving: access denied: your AWS identity needs logs:FilterLogEvents on boot-logs")
