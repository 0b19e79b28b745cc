"""The hosts' gp3 root volume: throughput and IOPS sized from the model or set, on every launch template
(the instance's, the fleet's, the builder's), and wait-ready's limit within the stack's timeouts."""

import re

import pytest
from aws_cdk import App, Duration, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template

from neuron_serving import (
    NeuronBootScript,
    NeuronServingLaunchTemplate,
    ReadinessSignal,
    ServingConfigError,
    neuron_dlami,
)
from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.timing import readiness_seconds

from .conftest import synthesize

LARGE = {"instance_type": "inf2.48xlarge", "model_id": "meta-llama/Llama-3.1-70B-Instruct"}


def _volume(throughput: int, iops: int) -> dict[str, object]:
    return {"LaunchTemplateData": Match.object_like({"BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
        "DeleteOnTermination": True, "Encrypted": True, "VolumeType": "gp3", "VolumeSize": Match.any_value(),
        "Throughput": throughput, "Iops": iops}}]})}


def _minutes(iso: str) -> int:
    hours, minutes = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?", iso).groups()  # type: ignore[union-attr]
    return int(hours or 0) * 60 + int(minutes or 0)


def _wait_ready_limit(boot_script: NeuronBootScript) -> int:
    wait_ready = boot_script.boot.files["/opt/neuron-serving/bin/wait-ready"]
    found = re.search(r"NEURON_SERVING_READY_SECONDS:-(\d+)\}", wait_ready)
    assert found is not None
    return int(found.group(1))


def test_an_8b_host_gets_the_throughput_that_moves_its_boot_in_three_minutes_within_the_included_iops(synth):
    synth().template.has_resource_properties("AWS::EC2::LaunchTemplate", _volume(341, 3000))


def test_a_70b_host_moves_its_boot_in_three_minutes_at_1666_mib_s_with_the_iops_to_carry_it(synth):
    synth(**LARGE).template.has_resource_properties("AWS::EC2::LaunchTemplate", _volume(1666, 13328))


def test_boot_disk_minutes_sizes_the_volume(synth):
    template = synth(compile_cache="false", boot_disk_minutes="10").template  # test_compile_cache.py too
    template.has_resource_properties("AWS::EC2::LaunchTemplate", _volume(125, 3000))


def test_the_settings_set_the_fleets_volume(synth):
    template = synth(fleet="asg", root_volume_throughput="1000").template
    template.has_resource_properties("AWS::EC2::LaunchTemplate", _volume(1000, 8000))
    template.resource_count_is("AWS::EC2::LaunchTemplate", 1)


def test_the_settings_set_the_builders_volume_as_well_as_the_hosts(synth):
    template = synth(instance_type="inf2.xlarge", root_volume_throughput="500", root_volume_iops="6000").template
    template.resource_count_is("AWS::EC2::LaunchTemplate", 2)
    found = template.find_resources("AWS::EC2::LaunchTemplate", {"Properties": _volume(500, 6000)})
    assert len(found) == 2


def test_wait_ready_waits_the_plans_limit_and_within_the_instances_creation_policy(synth):
    template = synth(**LARGE)
    boot_script = template.stack.boot_script
    plan = template.stack.plan
    assert _wait_ready_limit(boot_script) == readiness_seconds(plan, 1666) == 70 * 60
    (instance,) = template.resources("AWS::EC2::Instance").values()
    timeout = _minutes(instance["CreationPolicy"]["ResourceSignal"]["Timeout"])
    assert _wait_ready_limit(boot_script) <= timeout * 60


def test_wait_ready_waits_within_the_fleets_signal_pause_and_warm_pool_heartbeat(synth):
    template = synth(**LARGE, fleet="asg", max_capacity="3", warm_pool="true")
    limit = _wait_ready_limit(template.stack.boot_script)
    (group,) = template.resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert limit <= _minutes(group["CreationPolicy"]["ResourceSignal"]["Timeout"]) * 60
    assert limit <= _minutes(group["UpdatePolicy"]["AutoScalingRollingUpdate"]["PauseTime"]) * 60
    assert limit <= group["Properties"]["HealthCheckGracePeriod"]
    (hook,) = template.resources("AWS::AutoScaling::LifecycleHook").values()
    assert limit <= hook["Properties"]["HeartbeatTimeout"]


def test_a_short_boot_timeout_shortens_wait_ready_to_it(synth):
    assert _wait_ready_limit(synth(boot_timeout_minutes="10").stack.boot_script) == 600


@pytest.mark.parametrize(("context", "message"), [
    ({"root_volume_throughput": "100"}, r"root_volume_throughput \(100\) must be 125 to 2000 MiB/s"),
    ({"root_volume_throughput": "2500"}, r"root_volume_throughput \(2500\) must be 125 to 2000 MiB/s"),
    ({"root_volume_iops": "90000"}, r"root_volume_iops \(90000\) must be 3000 to 80000"),
    ({"boot_disk_minutes": "0"}, r"boot_disk_minutes \(0.0\) must be a number of minutes above 0"),
    ({"root_volume_throughput": "1000", "root_volume_iops": "3000"},
     r"root_volume_iops \(3000\) must be at least 4000 for a root_volume_throughput of 1000 MiB/s"),
    ({"root_volume_iops": "80000"}, r"root_volume_iops \(80000\) must be at most 75000 on a root volume of 150 GiB"),
])
def test_bad_volume_settings_fail_synthesis_naming_the_setting_the_value_and_what_is_allowed(context, message):
    with pytest.raises(ServingConfigError, match=message):
        synthesize(context)


def test_the_launch_template_refuses_iops_its_volume_size_cannot_carry():
    stack = Stack(App(), "Own")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.2-1B-Instruct", "inf2.xlarge"))
    boot = NeuronBootScript(stack, "Boot", plan=plan, root_volume_iops=16000, signal=ReadinessSignal("Own", "Host"),
                            boot_timeout=Duration.minutes(60))
    with pytest.raises(ServingConfigError, match=r"^root_volume_iops \(16000\) must be at most 15000 on a root "
                       r"volume of 30 GiB: gp3 gives at most 500 IOPS per GiB"):
        NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot, machine_image=neuron_dlami("/p"),
                                    root_volume_gib=30)
    template = NeuronServingLaunchTemplate(stack, "Host2", vpc=vpc, boot_script=boot,
                                           machine_image=neuron_dlami("/p"), root_volume_gib=32)
    Template.from_stack(stack).has_resource_properties("AWS::EC2::LaunchTemplate", _volume(197, 16000))
    assert template.root_volume_gib == 32
