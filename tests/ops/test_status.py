"""``neuron-serving status``: the stack, each host's boot phase against its estimate, target health, ``--watch``.

Everything comes from moto's server (``conftest.py``): the stack (created in moto with the synthesized template's
output keys), the instances and their phase tags, the Auto Scaling group, the target group and its health. Two
answers moto cannot give are stand-ins, each named where used: target health other than ``healthy`` and
``unused`` (moto 5.2.5 reports every registered running instance healthy, moto/elbv2/models.py
``FakeTargetGroup.health_for``), checked against botocore's model; and a stack that rolls back.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from typing import Any

import pytest

from neuron_serving.cli import _parser, main
from neuron_serving.ops.output import Printer
from neuron_serving.ops.status import stack_failing, status
from neuron_serving.plan.phases import (
    DETAIL_TAG,
    PHASE_TAG,
    PHASES,
    PUBLISH_RACED,
    PUBLISH_TAG,
    PUBLISHED,
    SECONDS_TAG,
    SINCE_TAG,
    find_phase,
)
from tests.harness.aws import REGION
from tests.ops.conftest import STACK, Deployment, model_checked_answer, need_moto, stamp

need_moto()

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)


def run(*argv: str, sleep: Any = None) -> tuple[int, str]:
    """``status`` with a fixed clock, a wide console (no cell folds) and ``sleep`` between looks."""
    args = _parser().parse_args(["status", "--region", REGION, *argv])
    stream = io.StringIO()
    printer = Printer(args.output, stream)
    printer.console.width = 400
    code = status(args, printer=printer, now=lambda: NOW, sleep=sleep or (lambda _: None))
    return code, stream.getvalue()


def phase_tags(phase: str, minutes_ago: float, detail: str = "") -> dict[str, str]:
    return {PHASE_TAG: phase, SINCE_TAG: stamp(NOW - dt.timedelta(minutes=minutes_ago)), DETAIL_TAG: detail}


def single(deployment: Deployment, tags: dict[str, str]) -> str:
    instance_id = deployment.instance(tags)
    deployment.stack(InstanceId=instance_id)
    return instance_id


@pytest.mark.parametrize("phase", [p.name for p in PHASES])
def test_every_phase_is_shown_with_its_title_time_and_estimate(deployment, phase):
    instance_id = single(deployment, phase_tags(phase, 4, "3 of 6 ready" if phase == "wait-ready" else ""))
    code, text = run()
    assert code == (1 if phase == "failed" else 0)  # still booting is no failure
    known = find_phase(phase)
    assert known is not None
    assert f"{phase}: {known.title}" in text and instance_id in text
    code, out = run("--output", "json")
    (host,) = json.loads(out)["hosts"]
    assert host["phase"] == phase and host["title"] == known.title
    estimate = {"checkpoint": 5, "compile": 53, "download": 9, "export": 58, "install": 5, "load": 15,
                "pull": 12}.get(known.estimate or "")
    if phase in ("ready", "failed", "warmed"):  # phases a host stays in: no clock runs
        assert host["elapsed_seconds"] is None
    else:
        assert host["elapsed_seconds"] == 240 and host["estimate_minutes"] == estimate and not host["overdue"]
        assert ("4m00s" + (f" of ~{estimate}m" if estimate else "")) in text


def test_a_phase_past_its_estimate_is_overdue(deployment):
    single(deployment, phase_tags("wait-ready", 40, "3 of 6 ready"))
    code, text = run()
    assert code == 0
    assert "40m00s of ~15m OVERDUE" in text
    assert "3 of 6 ready" in text
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert host["overdue"] is True and host["replicas_healthy"] == "3 of 6"


def test_a_failed_boot_shows_its_reason(deployment):
    instance_id = single(deployment, phase_tags("failed", 1, "export-model exited 70: neuronx-cc ran out of memory"))
    code, text = run()
    assert code == 1
    assert f"{instance_id}" in text and "failed: the boot failed" in text
    assert "export-model exited 70: neuronx-cc ran out of memory" in text


def test_the_stack_its_urls_and_a_serving_host_with_its_target_health(deployment):
    instance_id = single(deployment, phase_tags("ready", 2))
    code, text = run()
    assert code == 0
    assert f"stack {STACK}: CREATE_COMPLETE" in text
    assert "endpoint: https://llm.example.com" in text
    assert f"dashboard: https://console.aws.amazon.com/cloudwatch/home?region={REGION}#dashboards:name=d" in text
    document = json.loads(run("--output", "json")[1])
    (host,) = document["hosts"]
    # moto's answer for a registered, running instance.
    assert host["instance_id"] == instance_id and host["target_health"] == {"state": "healthy", "reason": ""}
    assert host["replicas_healthy"] == "6 of 6"
    assert document["stack"]["status"] == "CREATE_COMPLETE"
    assert document["endpoint_url"] == "https://llm.example.com"
    assert document["dashboard_url"].endswith("#dashboards:name=d")
    assert document["stack"]["outputs"]["TargetGroupArn"] == deployment.target_group


def test_a_host_that_has_reported_nothing_yet_points_to_its_boot_log(deployment):
    instance_id = deployment.instance({}, register=False)
    deployment.stack(InstanceId=instance_id)
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert host["phase"] is None
    assert host["title"] == f"booting, no phase reported yet (its boot log: neuron-serving logs --host {instance_id})"


def test_a_healthy_host_without_phase_reports_serves_and_ends_the_watch(deployment):
    # Reports refused by the host's role never stop its boot: the load balancer's health check then
    # tells that it serves (moto reports a registered running instance healthy).
    single(deployment, {})
    code, text = run("--watch")
    assert code == 0
    assert "serving by the load balancer's health check; the host reported no phase" in text


def test_a_fleet_shows_its_group_s_hosts_and_its_warm_pool(deployment, emulator):
    in_service = deployment.group("fleet", 1)
    deployment.tag(in_service[0], phase_tags("ready", 3))
    emulator.client("autoscaling").put_warm_pool(AutoScalingGroupName="fleet", MinSize=1, PoolState="Stopped")
    # moto 5.2.5's DescribeWarmPool lists no instances (moto/autoscaling/responses.py answers "Instances": []):
    # the warm instance is found by the group's tag, and known as warm by the phase it reported.
    warm = deployment.instance({"aws:autoscaling:groupName": "fleet", **phase_tags("warmed", 30)}, register=False)
    emulator.client("ec2").stop_instances(InstanceIds=[warm])
    deployment.stack("fleet", AutoScalingGroupName="fleet")
    code, text = run()
    assert code == 0
    assert f"{warm} (warm pool)" in text and "warmed: prepared in the warm pool" in text
    hosts = {h["instance_id"]: h for h in json.loads(run("--output", "json")[1])["hosts"]}
    assert set(hosts) == {in_service[0], warm}
    assert hosts[in_service[0]]["warm_pool"] is False and hosts[in_service[0]]["lifecycle_state"] == "InService"
    assert hosts[in_service[0]]["target_health"]["state"] == "healthy"
    assert hosts[warm]["warm_pool"] is True and hosts[warm]["state"] == "stopped"


def test_warm_pool_instances_listed_by_describe_warm_pool_are_shown_as_such(deployment, emulator, hooks):
    """A ``after-call`` hook adds to moto's DescribeWarmPool answer the instance AWS would list there."""
    deployment.group("fleet", 1)
    warm = deployment.instance(phase_tags("install-tools", 1), register=False)

    def listed(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Instances"] = [{"InstanceId": warm, "InstanceType": "inf2.48xlarge", "AvailabilityZone": f"{REGION}a",
                                "LifecycleState": "Warmed:Pending", "HealthStatus": "Healthy"}]

    hooks["after-call.auto-scaling.DescribeWarmPool"] = listed
    deployment.stack("fleet", AutoScalingGroupName="fleet")
    hosts = {h["instance_id"]: h for h in json.loads(run("--output", "json")[1])["hosts"]}
    assert hosts[warm]["warm_pool"] is True and hosts[warm]["lifecycle_state"] == "Warmed:Pending"


def test_unhealthy_and_initial_targets_show_their_reason(deployment, hooks):
    """moto reports only healthy or unused targets: a ``before-call`` hook answers DescribeTargetHealth with the
    documented states and reasons, checked against botocore's output shape."""
    instance_id = single(deployment, phase_tags("wait-ready", 1, "0 of 6 ready"))
    for state, reason in (("initial", "Elb.InitialHealthChecking"), ("unhealthy", "Target.ResponseCodeMismatch")):
        hooks["before-call.elastic-load-balancing-v2.DescribeTargetHealth"] = lambda s=state, r=reason, **_: (
            model_checked_answer("elbv2", "DescribeTargetHealth", {"TargetHealthDescriptions": [
                {"Target": {"Id": instance_id, "Port": 8080}, "TargetHealth": {"State": s, "Reason": r}}]}))
        code, text = run()
        assert code == 0
        assert f"{state} ({reason})" in text


def test_watch_stops_once_every_host_serves(deployment):
    instance_id = single(deployment, phase_tags("pull-image", 1))
    steps = iter([phase_tags("wait-ready", 0, "3 of 6 ready"), phase_tags("ready", 0)])
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        deployment.tag(instance_id, next(steps))

    code, text = run("--watch", "--interval", "7", sleep=sleep)
    assert code == 0
    assert slept == [7, 7]
    lines = text.splitlines()
    assert [line.split("  ")[2].split(":")[0] for line in lines if instance_id in line] == [
        "pull-image", "wait-ready", "ready"]
    assert "replicas healthy 3 of 6" in text and "replicas healthy 6 of 6" in text


def test_watch_stops_with_the_reason_when_a_host_fails(deployment, capsys):
    instance_id = single(deployment, phase_tags("export-model", 1))

    def sleep(_: float) -> None:
        deployment.tag(instance_id, phase_tags("failed", 0, "export-model exited 70"))

    code, text = run("--watch", sleep=sleep)
    assert code == 1
    assert f"host {instance_id} failed: export-model exited 70" in capsys.readouterr().err
    assert "failed: the boot failed" in text


def test_watch_stops_when_the_stack_rolls_back(deployment, hooks, capsys):
    """An ``after-call`` hook plays a stack that rolls back (moto creates a stack at once or not at all)."""
    single(deployment, phase_tags("wait-ready", 1))

    def rolled_back(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Stacks"][0].update(StackStatus="ROLLBACK_IN_PROGRESS",
                                   StackStatusReason="The following resource(s) failed to create: [Host]")

    hooks["after-call.cloudformation.DescribeStacks"] = rolled_back
    code, text = run("--watch")
    assert code == 1
    assert f"stack {STACK} is ROLLBACK_IN_PROGRESS: The following resource(s) failed to create: [Host]" in (
        capsys.readouterr().err)
    assert "ROLLBACK_IN_PROGRESS (The following resource(s) failed to create: [Host])" in text


def test_watch_with_json_prints_one_document_at_the_end(deployment):
    instance_id = single(deployment, phase_tags("router", 1))
    code, out = run("--watch", "--output", "json", sleep=lambda _: deployment.tag(instance_id, phase_tags("ready", 0)))
    assert code == 0
    assert json.loads(out)["hosts"][0]["phase"] == "ready"


def test_a_stack_being_created_shows_its_hosts_from_its_resources(emulator, hooks):
    """CloudFormation gives no outputs until a stack completes, which ours does only once its hosts serve.
    An ``after-call`` hook plays that stack: moto creates one at once. Its instance is a resource of the
    stack, and the estimates come from its template."""
    template = {"Resources": {"Host": {"Type": "AWS::EC2::Instance",
                                       "Properties": {"ImageId": "ami-12c6146b", "InstanceType": "inf2.48xlarge"}}},
                "Outputs": {"BootPhaseMinutes": {"Value": json.dumps({"compile": 53, "load": 15})},
                            "InstanceId": {"Value": {"Ref": "Host"}}}}
    emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))

    def in_progress(parsed: dict[str, Any], **_: Any) -> None:
        parsed["Stacks"][0]["StackStatus"] = "CREATE_IN_PROGRESS"
        parsed["Stacks"][0].pop("Outputs", None)

    hooks["after-call.cloudformation.DescribeStacks"] = in_progress
    resources = emulator.client("cloudformation").list_stack_resources(StackName=STACK)["StackResourceSummaries"]
    (instance_id,) = [r["PhysicalResourceId"] for r in resources if r["ResourceType"] == "AWS::EC2::Instance"]
    emulator.client("ec2").create_tags(Resources=[instance_id], Tags=[
        {"Key": k, "Value": v} for k, v in phase_tags("export-model", 60).items()])
    code, text = run()
    assert code == 0
    assert f"stack {STACK}: CREATE_IN_PROGRESS" in text
    assert "1h00m of ~53m OVERDUE" in text


def test_a_stack_that_does_not_exist_is_named(emulator, capsys):
    assert main(["status", "--stack", "Elsewhere", "--region", REGION]) == 1
    assert capsys.readouterr().err == (f"neuron-serving: stack Elsewhere not found in {REGION}: name it with --stack, "
                                       "its region with --region\n")


def test_access_denied_names_the_missing_permission(deployment, emulator, monkeypatch, capsys):
    """moto's own IAM enforcement: a user allowed everything the command needs but ec2:DescribeInstances."""
    instance_id = single(deployment, phase_tags("ready", 1))
    iam = emulator.client("iam")
    iam.create_user(UserName="operator")
    iam.put_user_policy(UserName="operator", PolicyName="no-ec2", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["cloudformation:*", "elasticloadbalancing:*",
                                                     "autoscaling:*"], "Resource": "*"}]}))
    access_key = iam.create_access_key(UserName="operator")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", access_key["SecretAccessKey"])
    with emulator.moto.iam_enforced():
        assert main(["status", "--region", REGION]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"neuron-serving: access denied: your AWS identity needs ec2:DescribeInstances on "
                          f"{instance_id}"), err


def test_no_credentials_says_how_to_configure_them(emulator, monkeypatch, capsys):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert main(["status", "--region", REGION]) == 1
    assert capsys.readouterr().err.startswith("neuron-serving: no AWS credentials found: configure them")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watch_on_a_terminal_redraws_one_table_in_place(deployment):
    instance_id = single(deployment, phase_tags("pull-image", 1))
    args = _parser().parse_args(["status", "--region", REGION, "--watch"])
    stream = Terminal()
    printer = Printer(args.output, stream)
    printer.console.width = 400
    code = status(args, printer=printer, now=lambda: NOW,
                  sleep=lambda _: deployment.tag(instance_id, phase_tags("ready", 0)))
    assert code == 0
    text = stream.getvalue()
    assert "\x1b[" in text  # rich's cursor movement: the table is drawn again where it was
    assert "pull-image: pulling the serving image" in text and "ready: serving" in text


@pytest.mark.parametrize(("stack_status", "failing"), [
    ("CREATE_COMPLETE", False), ("CREATE_IN_PROGRESS", False), ("UPDATE_COMPLETE", False),
    ("UPDATE_ROLLBACK_COMPLETE", False), ("CREATE_FAILED", True), ("ROLLBACK_IN_PROGRESS", True),
    ("ROLLBACK_COMPLETE", True), ("UPDATE_ROLLBACK_IN_PROGRESS", True), ("UPDATE_ROLLBACK_FAILED", True),
    ("DELETE_FAILED", True),
])
def test_which_stack_statuses_stop_the_watch(stack_status, failing):
    assert stack_failing(stack_status) is failing


def test_ctrl_c_stops_the_watch_quietly_with_130(deployment, capsys):
    single(deployment, phase_tags("pull-image", 1))

    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    code, text = run("--watch", sleep=interrupt)
    assert code == 130
    assert "pull-image" in text and capsys.readouterr().err == ""


def test_a_host_taken_from_the_warm_pool_is_in_service_before_it_reports_again(deployment):
    """The group lists it InService (moto's answer), while its tags still say ``warmed``."""
    (instance_id,) = deployment.group("fleet", 1)
    deployment.tag(instance_id, phase_tags("warmed", 30))
    deployment.stack("fleet", AutoScalingGroupName="fleet")
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert host["warm_pool"] is False and host["lifecycle_state"] == "InService"


def test_a_stack_being_created_before_its_hosts_exist_says_so(emulator, hooks):
    """The same stand-in for a stack still being created, before CloudFormation has made its instance."""
    template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}}}
    emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))
    hooks["after-call.cloudformation.DescribeStacks"] = lambda parsed, **_: parsed["Stacks"][0].update(
        StackStatus="CREATE_IN_PROGRESS")
    code, text = run()
    assert code == 0
    assert text.splitlines() == [f"stack {STACK}: CREATE_IN_PROGRESS",
                                 "no hosts yet (the stack is still being created)"]


def test_a_misspelt_region_is_refused_before_any_call(deployment, capsys):
    args = _parser().parse_args(["status", "--region", "eu-wst-1"])
    code = status(args, printer=Printer(args.output, io.StringIO()))
    assert code == 1
    assert "region 'eu-wst-1' is not one boto3 knows" in capsys.readouterr().err


def test_each_finished_phase_shows_how_long_it_took_beside_its_estimate(deployment):
    instance_id = single(deployment, {**phase_tags("wait-ready", 2, "0 of 6 ready"), SECONDS_TAG: (
        "metadata=1 install-tools=41 pull-image=212 export-model=3 download-export=720 start-replicas=2")})
    code, text = run()
    assert code == 0
    # The estimates are the stack's (BootPhaseMinutes): install 5, pull 12, compile 53, download 9; a phase without
    # one, its time alone.
    for phase, took in (("install-tools", "0m41s of ~5m"), ("pull-image", "3m32s of ~12m"),
                        ("export-model", "0m03s of ~53m"), ("download-export", "12m00s of ~9m OVER"),
                        ("start-replicas", "0m02s")):
        assert any(phase in line and line.rstrip().endswith(took) and instance_id in line
                   for line in text.splitlines()), (phase, took, text)
    # The running phase still counts against its own estimate.
    assert "2m00s of ~15m" in text
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert host["phase_times"][3:5] == [
        {"phase": "export-model", "seconds": 3, "estimate_minutes": 53, "over_estimate": False},
        {"phase": "download-export", "seconds": 720, "estimate_minutes": 9, "over_estimate": True}]
    assert [t["phase"] for t in host["phase_times"]] == ["metadata", "install-tools", "pull-image", "export-model",
                                                          "download-export", "start-replicas"]


def test_the_watch_says_how_long_the_last_finished_phase_took(deployment):
    single(deployment, {**phase_tags("ready", 1, "6 of 6 ready"), SECONDS_TAG: "pull-image=212 wait-ready=1200"})
    code, text = run("--watch")
    assert code == 0
    assert "wait-ready took 20m00s of ~15m OVER" in text


def test_a_host_without_phase_times_shows_none(deployment):
    single(deployment, phase_tags("pull-image", 1))
    code, text = run()
    assert code == 0 and "finished phase" not in text
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert host["phase_times"] == []


def test_a_mixed_fleet_shows_each_hosts_type_zone_and_capacity_and_counts_them(deployment, emulator, hooks):
    """moto 5.2.5 marks a Spot launch's InstanceLifecycle but never places an instance in a Capacity
    Reservation: a ``after-call`` hook adds the CapacityReservationId AWS would return (EC2 API reference,
    Instance) to one On-Demand instance."""
    group = {"aws:autoscaling:groupName": "fleet"}
    large = deployment.instance({**group, **phase_tags("ready", 3)})
    spot = deployment.instance({**group, **phase_tags("ready", 2)}, instance_type="inf2.24xlarge", spot=True)
    reserved = deployment.instance({**group, **phase_tags("ready", 1)}, instance_type="inf2.24xlarge")

    def in_reservation(parsed: dict[str, Any], **_: Any) -> None:
        for reservation in parsed.get("Reservations", []):
            for instance in reservation["Instances"]:
                if instance["InstanceId"] == reserved:
                    instance["CapacityReservationId"] = "cr-0123456789abcdef0"

    hooks["after-call.ec2.DescribeInstances"] = in_reservation
    # The group lists none of them yet: they are found by its tag.
    assert deployment.group("fleet", 0) == []
    deployment.stack("fleet_capacity", AutoScalingGroupName="fleet",
                     ReplicasByInstanceType=json.dumps({"inf2.48xlarge": 12, "inf2.24xlarge": 6}))
    code, text = run()
    assert code == 0, text
    zone = f"{REGION}a"
    hosts = {h["instance_id"]: h for h in json.loads(run("--output", "json")[1])["hosts"]}
    assert {i: (h["instance_type"], h["availability_zone"], h["capacity"]) for i, h in hosts.items()} == {
        large: ("inf2.48xlarge", zone, "on-demand"), spot: ("inf2.24xlarge", zone, "spot"),
        reserved: ("inf2.24xlarge", zone, "reservation cr-0123456789abcdef0")}
    # Each ready host serves its own type's replicas.
    assert {i: h["replicas_healthy"] for i, h in hosts.items()} == {large: "12 of 12", spot: "6 of 6",
                                                                    reserved: "6 of 6"}
    assert (f"hosts: 1 inf2.24xlarge in {zone} (reservation cr-0123456789abcdef0), 1 inf2.24xlarge in {zone} "
            f"(spot), 1 inf2.48xlarge in {zone} (on-demand)") in text


# --- The export's publish to the artifact cache ----------------------------------------------------------------


FAILED_PUBLISH = "failed: An error occurred AccessDenied when calling the PutObject operation: Access Denied"
"""The tag of a host whose publish S3 refused, as report-publish writes it (tests/boot/test_boot_publish.py)."""


def test_a_serving_host_whose_publish_failed_is_named_with_the_reason_and_the_status_still_succeeds(deployment):
    instance_id = single(deployment, {**phase_tags("ready", 2, "6 of 6 ready"), PUBLISH_TAG: FAILED_PUBLISH})
    code, text = run()
    assert code == 0  # it serves: a failed publish is no failed boot
    assert (f"host {instance_id} could not publish its export to the artifact cache: An error occurred AccessDenied "
            "when calling the PutObject operation: Access Denied. It serves its own export; every host after it "
            "compiles again") in " ".join(text.split())


def test_a_failed_publish_is_in_the_json_document(deployment):
    single(deployment, {**phase_tags("ready", 2, "6 of 6 ready"), PUBLISH_TAG: FAILED_PUBLISH})
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert (host["export_publish"], host["export_publish_failed"]) == (FAILED_PUBLISH, True)


def test_the_watch_says_that_a_hosts_publish_failed(deployment):
    single(deployment, {**phase_tags("ready", 1, "6 of 6 ready"), PUBLISH_TAG: FAILED_PUBLISH})
    code, text = run("--watch")
    assert code == 0
    assert ("export not published: An error occurred AccessDenied when calling the PutObject operation: Access "
            "Denied") in text


@pytest.mark.parametrize("outcome", [PUBLISHED, PUBLISH_RACED])
def test_a_host_that_published_or_lost_the_race_shows_no_failed_publish(deployment, outcome):
    single(deployment, {**phase_tags("ready", 2, "6 of 6 ready"), PUBLISH_TAG: outcome})
    code, text = run()
    assert code == 0 and "could not publish" not in text
    (host,) = json.loads(run("--output", "json")[1])["hosts"]
    assert (host["export_publish"], host["export_publish_failed"]) == (outcome, False)
