"""fleet=asg: signals, rolling updates, ELB health checks, scaling, the artifact cache, and the
bad inputs a fleet can be given."""

import json

import jsii
import pytest
from aws_cdk import App, CfnParameter, Duration, IStableNumberProducer, Lazy, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from neuron_serving import (
    NeuronArtifactCache,
    NeuronBootScript,
    NeuronServingEndpoint,
    NeuronServingFleet,
    NeuronServingLaunchTemplate,
    NeuronServingMonitoring,
    ReadinessSignal,
    ServingConfigError,
    WarmPoolHook,
    neuron_dlami,
)
from neuron_serving.cdk.artifact_cache import CACHE_OBJECT_ACTIONS, COMPILE_CACHE_ACTIONS
from neuron_serving.cdk.instance import SESSION_MANAGER_ACTIONS
from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.host import resolve_host
from neuron_serving.plan.timing import boot_minutes, longest_generation_seconds
from neuron_serving.plan.volume import default_throughput
from neuron_serving.render.boot import render_boot_script

from .conftest import synthesize

FLEET = {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"}


def _group(synth):
    (group,) = synth.resources("AWS::AutoScaling::AutoScalingGroup").items()
    return group


def _own_stack() -> tuple[Stack, ec2.Vpc]:
    """A user's own stack and VPC, outside NeuronLlamaStack."""
    stack = Stack(App(), "Own")
    return stack, ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)


def _own_host(stack: Stack, vpc: ec2.Vpc, plan, **boot_props) -> NeuronServingLaunchTemplate:
    boot = NeuronBootScript(stack, "Boot", plan=plan, **boot_props)
    return NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot, machine_image=neuron_dlami("/p"))


def _fronted_fleet(stack: Stack, vpc: ec2.Vpc, plan, host, **fleet_props) -> NeuronServingFleet:
    """A fleet of ``host`` behind a new endpoint."""
    fleet = NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, **fleet_props)
    NeuronServingEndpoint(stack, "Endpoint", vpc=vpc, target_port=plan.router_port).add_target(
        fleet.auto_scaling_group, fleet)
    return fleet


def test_fleet_waits_for_a_signal_from_each_of_min_capacity_hosts(synth):
    logical_id, group = _group(synth(**FLEET))
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    minutes = boot_minutes(plan, throughput=default_throughput(plan))
    hours, rest = divmod(minutes, 60)
    assert group["CreationPolicy"] == {"ResourceSignal": {"Count": 2, "Timeout": f"PT{hours}H{rest}M"}}
    assert logical_id == "NeuronServingFleet"


def test_the_boot_script_signals_the_fleet_by_its_logical_id(synth):
    template = synth(**FLEET)
    options = template.stack.boot_script.options
    assert options.signal.logical_id == _group(template)[0]
    assert options.signal.stack_name == "NeuronLlamaStack"


def test_updates_replace_one_host_at_a_time_waiting_for_signals_and_keep_the_rest_serving(synth):
    update = _group(synth(**FLEET))[1]["UpdatePolicy"]["AutoScalingRollingUpdate"]
    assert update["MaxBatchSize"] == 1
    assert update["MinInstancesInService"] == 1
    assert update["WaitOnResourceSignals"] is True


def test_elb_health_checks_with_grace_for_pull_export_and_load(synth):
    properties = _group(synth(**FLEET))[1]["Properties"]
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    minutes = boot_minutes(plan, throughput=default_throughput(plan))
    assert properties["HealthCheckType"] == "ELB"
    assert properties["HealthCheckGracePeriod"] == minutes * 60
    assert (properties["MinSize"], properties["MaxSize"]) == ("2", "4")


def test_fleet_spans_the_private_subnets_of_both_azs(synth):
    template = synth(**FLEET)
    subnets = _group(template)[1]["Properties"]["VPCZoneIdentifier"]
    assert len(subnets) == 2
    for subnet in subnets:
        assert template.json["Resources"][subnet["Ref"]]["Properties"]["MapPublicIpOnLaunch"] is False


def test_fleet_scaling_uses_a_warmup_of_a_cached_boot(synth):
    template = synth(**FLEET)
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    warmup = _group(template)[1]["Properties"]["DefaultInstanceWarmup"]
    assert warmup == boot_minutes(plan, throughput=default_throughput(plan), exports=False) * 60


def test_scale_on_requests_tracks_alb_requests_per_host_sized_by_the_plan():
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    stack, vpc = _own_stack()
    fleet = _fronted_fleet(stack, vpc, plan, _own_host(stack, vpc, plan, signal=ReadinessSignal("Own", "Fleet")))
    fleet.scale_on_requests()
    assert fleet.target_requests_per_minute == 6 * 4 * 3  # replicas x batch slots x requests of ~20 s a minute


def test_target_requests_per_minute_switches_scaling_to_alb_requests(synth):
    (policy,) = synth(**FLEET, target_requests_per_minute="30").resources("AWS::AutoScaling::ScalingPolicy").values()
    tracking = policy["Properties"]["TargetTrackingConfiguration"]
    assert tracking["PredefinedMetricSpecification"]["PredefinedMetricType"] == "ALBRequestCountPerTarget"
    assert tracking["TargetValue"] == 30


def test_fleet_registers_with_the_target_group_and_only_the_alb_reaches_it(synth):
    template = synth(**FLEET)
    group_id = _group(template)[0]
    assert _group(template)[1]["Properties"]["TargetGroupARNs"] == [
        {"Ref": next(iter(template.resources("AWS::ElasticLoadBalancingV2::TargetGroup")))}]
    assert "AWS::EC2::Instance" not in {r["Type"] for r in template.json["Resources"].values()}
    assert template.json["Outputs"]["AutoScalingGroupName"]["Value"] == {"Ref": group_id}


def test_scale_in_drains_for_the_longest_generation(synth):
    group = synth(**FLEET).only("AWS::ElasticLoadBalancingV2::TargetGroup")
    attributes = {a["Key"]: a["Value"] for a in group["TargetGroupAttributes"]}
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    assert int(attributes["deregistration_delay.timeout_seconds"]) == longest_generation_seconds(plan) >= 300


def test_scaling_events_go_to_an_encrypted_ssl_only_topic(synth):
    template = synth(**FLEET)
    notifications = _group(template)[1]["Properties"]["NotificationConfigurations"]
    assert {"autoscaling:EC2_INSTANCE_LAUNCH_ERROR", "autoscaling:EC2_INSTANCE_TERMINATE"} <= set(
        notifications[0]["NotificationTypes"])
    (topic,) = [t["Properties"] for k, t in template.resources("AWS::SNS::Topic").items() if k.startswith("Fleet")]
    key = topic["KmsMasterKeyId"]["Fn::GetAtt"][0]
    assert template.json["Resources"][key]["Properties"]["EnableKeyRotation"] is True


def test_warm_pool_keeps_stopped_hosts_and_a_launch_hook_the_boot_script_completes(synth):
    template = synth(fleet="asg", min_capacity="1", max_capacity="3", warm_pool="true")
    assert template.only("AWS::AutoScaling::WarmPool")["PoolState"] == "Stopped"
    hook = template.only("AWS::AutoScaling::LifecycleHook")
    options = template.stack.boot_script.options
    assert hook["LifecycleHookName"] == options.warm_pool_hook.hook_name
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert _group(template)[1]["Properties"]["AutoScalingGroupName"] == options.warm_pool_hook.group_name
    statements = template.host_statements()
    lifecycle = ["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"]
    (complete,) = [s for s in statements if s["Action"] == lifecycle]
    assert options.warm_pool_hook.group_name in json.dumps(complete["Resource"])


def test_the_launch_hook_lasts_as_long_as_the_boot_scripts_heartbeats_renew_it(synth):
    # Defect 7 of issue 8: the hook's timeout was min(7200, boot timeout) with no heartbeat, so a
    # boot longer than two hours (a 70B export) lost its lifecycle action.
    template = synth(fleet="asg", min_capacity="1", max_capacity="3", warm_pool="true",
                     model_id="meta-llama/Llama-3.1-70B-Instruct", instance_type="inf2.48xlarge")
    hook = template.only("AWS::AutoScaling::LifecycleHook")
    options = template.stack.boot_script.options
    assert template.stack.boot_script.boot_timeout.to_seconds() > 7200
    assert hook["HeartbeatTimeout"] == options.warm_pool_hook.heartbeat_timeout_seconds == 7200
    assert options.warm_pool_hook.heartbeat_interval_seconds == 1800


def test_schedules_scale_to_zero_and_back(synth):
    template = synth(fleet="asg", min_capacity="2", max_capacity="4", scale_down_schedule="0 20 * * 1-5",
                     scale_up_schedule="0 7 * * 1-5")
    actions = sorted((a["Properties"]["Recurrence"], a["Properties"]["MinSize"], a["Properties"]["DesiredCapacity"])
                     for a in template.resources("AWS::AutoScaling::ScheduledAction").values())
    assert actions == [("0 20 * * 1-5", 0, 0), ("0 7 * * 1-5", 2, 2)]


# --- artifact cache and IAM -----------------------------------------------------------------------

def test_artifact_cache_bucket_is_encrypted_private_and_ssl_only(synth):
    template = synth(**FLEET)
    (bucket_id, bucket), = [(k, r) for k, r in template.resources("AWS::S3::Bucket").items() if "ArtifactCache" in k]
    properties = bucket["Properties"]
    assert properties["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    assert all(properties["PublicAccessBlockConfiguration"].values())
    assert bucket["DeletionPolicy"] == "Retain"
    (policy,) = [p["Properties"] for p in template.resources("AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": bucket_id}]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in policy["PolicyDocument"]["Statement"])


def test_host_may_use_only_the_cache_prefix_and_signal_its_own_stack(synth):
    template = synth(**FLEET)
    # What it is allowed; the cache's explicit denies are tests/cdk/test_artifact_cache.py's.
    statements = [s for s in template.host_statements() if s["Effect"] == "Allow"]
    by_action = {json.dumps(s["Action"]): s for s in statements}
    objects = by_action[json.dumps(sorted(CACHE_OBJECT_ACTIONS))]
    assert not any("*" in action for action in objects["Action"])
    assert objects["Resource"]["Fn::Join"][1][1] == "/exports/*"
    # The compile cache: graphs read and added below its own prefix, never deleted.
    graphs = by_action[json.dumps(sorted(COMPILE_CACHE_ACTIONS))]
    assert graphs["Resource"]["Fn::Join"][1][1] == "/compile-cache/*"
    # Listing: the whole cache bucket, unconditioned, so that a missing graph or marker is a 404
    # (tests/cdk/test_compile_cache.py).
    listings = [s.get("Condition") for s in statements if s["Action"] == "s3:ListBucket"]
    assert listings and set(map(json.dumps, listings)) == {"null"}
    # Its stack only: reading the stack's values from its launch template's metadata, and signalling.
    # aws-cdk-lib's AutoScalingGroup grants the signal once more, for its signals (aws-cdk-lib 2.275.0,
    # aws-autoscaling/lib/auto-scaling-group.js: props.signals && !props.init && addToRolePolicy(...)).
    stack_actions = [json.dumps(["cloudformation:DescribeStackResource", "cloudformation:SignalResource"]),
                     json.dumps("cloudformation:SignalResource")]
    assert [by_action[a]["Resource"] for a in stack_actions] == [{"Ref": "AWS::StackId"}] * 2
    # Beyond the cache and its stack: shipping logs, fetching the boot bundle, Session Manager,
    # tagging itself with its boot phase (tests/cdk/test_security.py).
    assert set(by_action) - {json.dumps(sorted(CACHE_OBJECT_ACTIONS)), json.dumps("s3:ListBucket"),
                             json.dumps(sorted(COMPILE_CACHE_ACTIONS)), *stack_actions} == {
        json.dumps(["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"]),
        json.dumps("s3:GetObject"), json.dumps("ssm:UpdateInstanceInformation"),
        json.dumps(list(SESSION_MANAGER_ACTIONS)), json.dumps("ec2:CreateTags"),
        # The boot's phase times, in the monitoring's namespace only (tests/cdk/test_monitoring.py).
        json.dumps("cloudwatch:PutMetricData")}


def test_boot_script_gets_the_cache_uri(synth):
    template = synth(**FLEET)
    assert template.stack.boot_script.options.artifact_cache == template.stack.artifact_cache.uri
    assert template.stack.artifact_cache.uri.startswith("s3://") and template.stack.artifact_cache.uri.endswith(
        "/exports")


def test_a_prebuilt_s3_export_is_read_only_and_replaces_the_cache(synth):
    template = synth(prebuilt_export="s3://team-exports/llama3-8b/tp2")
    assert template.stack.artifact_cache is None
    statements = template.host_statements()
    # One statement reads the export's objects and the metrics publisher (CDK merges them).
    (read,) = [s for s in statements if s["Action"] == "s3:GetObject"]
    assert {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::team-exports/llama3-8b/tp2/*"]]} in read[
        "Resource"]
    assert len(read["Resource"]) == 2
    assert not any("PutObject" in json.dumps(s["Action"]) for s in statements)


def test_single_instance_signals_too_with_a_creation_policy(synth):
    template = synth()
    (instance_id, instance), = template.resources("AWS::EC2::Instance").items()
    assert instance_id == "NeuronServingInstance"
    assert instance["CreationPolicy"]["ResourceSignal"]["Count"] == 1


def test_a_pinned_model_revision_reaches_the_boot_script_and_keys_the_cache(synth):
    revision = "5f0b02c75b57c5855da9ae460ce51323ea669d8a"
    pinned = synth(**FLEET, model_revision=revision).stack.boot_script
    unpinned = synth(**FLEET).stack.boot_script
    assert pinned.spec.model_revision == revision and unpinned.spec.model_revision is None
    assert pinned.boot == render_boot_script(pinned.plan, pinned.spec, pinned.options) != unpinned.boot
    assert pinned.script != unpinned.script


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("context", "message"),
    [
        ({"min_capacity": "5", "max_capacity": "4"}, "min_capacity (5) must be <= max_capacity (4)"),
        ({"desired_capacity": "9"}, "desired_capacity (9) must lie between min_capacity (2) and max_capacity (4)"),
        ({"max_capacity": "0", "min_capacity": "0"}, "max_capacity (0) must be at least 1"),
        ({"warm_pool": "true", "min_capacity": "1", "max_capacity": "1"},
         "warm_pool (True) needs max_capacity of at least 2"),
        ({"scale_down_schedule": "0 20 * * 1-5"}, "scale_up_schedule (None) is required with the other schedule"),
        ({"scale_down_schedule": "every evening", "scale_up_schedule": "0 7 * * *"},
         "scale_down_schedule ('every evening') must be a cron expression of 5 fields"),
        ({"target_requests_per_minute": "0"}, "target_requests_per_minute (0) must be at least 1"),
        ({"boot_timeout_minutes": "900"}, "boot_timeout_minutes (900) must be 1 to 720"),
        ({"boot_timeout_minutes": "0"}, "boot_timeout_minutes (0) must be 1 to 720"),
        ({"boot_timeout_minutes": "-5"}, "boot_timeout_minutes (-5) must be 1 to 720"),
        ({"model_revision": "main branch"}, "model_revision ('main branch') must be a Hub commit, branch or tag"),
        ({"model_revision": "v1", "prebuilt_export": "s3://team/export"},
         "model_revision ('v1') does not apply to a prebuilt_export"),
    ],
)
def test_bad_fleet_settings_fail_synthesis_naming_the_setting(context, message):
    with pytest.raises(ServingConfigError) as err:
        synthesize({**FLEET, **context})
    assert message in str(err.value)


@pytest.mark.parametrize("key", ["min_capacity", "warm_pool", "scale_down_schedule"])
def test_fleet_settings_without_fleet_asg_are_refused(key):
    with pytest.raises(ServingConfigError, match=rf"{key} \(.*\) applies to fleet=asg only"):
        synthesize({key: "2" if key == "min_capacity" else "true" if key == "warm_pool" else "0 1 * * *"})


def test_unknown_fleet_kind_is_refused():
    with pytest.raises(ServingConfigError, match=r"fleet \('spot'\) must be one of instance, asg"):
        synthesize({"fleet": "spot"})


@pytest.mark.parametrize("uri", ["team-exports/llama", "https://x/y", "s3://", "hf://"])
def test_prebuilt_export_must_be_an_s3_or_hf_uri(uri):
    with pytest.raises(ValueError, match=r"prebuilt_export"):
        synthesize({"prebuilt_export": uri})


def test_the_fleet_composes_in_a_users_own_stack_as_the_readme_shows():
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    stack, vpc = _own_stack()
    cache = NeuronArtifactCache(stack, "Cache")
    host = _own_host(stack, vpc, plan, artifact_cache=cache, spec=resolve_host(plan, model_revision="v1"),
                     signal=ReadinessSignal(stack_name=stack.stack_name, logical_id="ServingFleet"))
    fleet = _fronted_fleet(stack, vpc, plan, host, min_capacity=2, max_capacity=4)
    fleet.scale_on_requests()
    resources = Template.from_stack(stack).to_json()["Resources"]
    group = resources["ServingFleet"]
    assert group["Type"] == "AWS::AutoScaling::AutoScalingGroup"
    assert group["CreationPolicy"]["ResourceSignal"]["Count"] == 2
    assert group["Properties"]["TargetGroupARNs"]
    assert any(r["Type"] == "AWS::AutoScaling::ScalingPolicy" for r in resources.values())
    statements = json.dumps([r["Properties"]["PolicyDocument"] for r in resources.values()
                             if r["Type"] == "AWS::IAM::Policy"])
    assert "s3:PutObject" in statements and "cloudformation:SignalResource" in statements


def test_a_fleet_refuses_a_boot_script_that_never_signals():
    stack, vpc = _own_stack()
    host = _own_host(stack, vpc, plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge")))
    with pytest.raises(ServingConfigError, match=r"^launch_template \('Own/Host'\) must carry a boot script"):
        NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host)


@jsii.implements(IStableNumberProducer)
class Producer:
    """A number known only when the app synthesizes (``Lazy.number``)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def produce(self) -> float:
        return self.value


# --- the construct alone names its own props --------------------------------------------------------

def _signalling_host(stack, vpc, **boot_props):
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    return plan, _own_host(stack, vpc, plan, signal=ReadinessSignal(stack_name=stack.stack_name,
                                                                    logical_id="ServingFleet"), **boot_props)


def test_a_fleet_alone_reports_every_size_problem_at_once():
    stack, vpc = _own_stack()
    _, host = _signalling_host(stack, vpc)
    with pytest.raises(ServingConfigError) as err:
        NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=3, max_capacity=1,
                           desired_capacity=9)
    assert err.value.problems == ("min_capacity (3) must be <= max_capacity (1)",
                                  "desired_capacity (9) must lie between min_capacity (3) and max_capacity (1)")


def test_a_fleet_alone_names_its_launch_template_when_its_warm_pool_hook_has_no_room():
    stack, vpc = _own_stack()
    _, host = _signalling_host(stack, vpc, warm_pool_hook=WarmPoolHook(hook_name="Warm", group_name="Own-Fleet"))
    with pytest.raises(ServingConfigError, match=r"^launch_template \('Own/Host'\) has a boot script with a "
                                                 r"warm_pool_hook, which needs max_capacity of at least 2 \(got 1\)"):
        NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=1, max_capacity=1)


def test_scaling_on_in_flight_requests_names_target_per_replica():
    stack, vpc = _own_stack()
    plan, host = _signalling_host(stack, vpc)
    fleet = _fronted_fleet(stack, vpc, plan, host)
    with pytest.raises(ServingConfigError, match=r"^target_per_replica \(0\) must be above 0$"):
        fleet.scale_on_in_flight_requests(NeuronServingMonitoring(stack, "Monitoring"), target_per_replica=0)


def test_a_schedule_is_named_by_the_methods_own_argument():
    stack, vpc = _own_stack()
    plan, host = _signalling_host(stack, vpc)
    with pytest.raises(ServingConfigError, match=r"^scale_up \('daily'\) must be a cron expression"):
        _fronted_fleet(stack, vpc, plan, host).scale_on_schedule(scale_down="0 20 * * *", scale_up="daily")


def test_token_capacities_are_checked_when_the_app_synthesizes():
    stack, vpc = _own_stack()
    _, host = _signalling_host(stack, vpc)
    # A token's value is unknown when the fleet is built; a Lazy one is known at synth.
    NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=3,
                       max_capacity=Token.as_number(Lazy.number(Producer(1))))
    with pytest.raises(Exception, match=r"min_capacity \(3\) must be <= max_capacity \(1\)"):
        Template.from_stack(stack)


def test_a_capacity_cloudformation_resolves_at_deploy_is_left_to_cloudformation():
    stack, vpc = _own_stack()
    _, host = _signalling_host(stack, vpc)
    size = CfnParameter(stack, "Size", type="Number", default=2).value_as_number
    fleet = NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, max_capacity=size)
    assert fleet.node.validate() == []


def test_a_boot_script_alone_names_boot_timeout_with_the_settings_range():
    stack, _ = _own_stack()
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    with pytest.raises(ServingConfigError, match=r"^boot_timeout \('900 minutes'\) must be 1 to 720 minutes "
                                                 r"\(CloudFormation waits at most 12 hours for signals\)$"):
        NeuronBootScript(stack, "Boot", plan=plan, boot_timeout=Duration.minutes(900))


def test_a_spot_fleet_drains_its_hosts_which_may_ask_only_their_own_named_group_to_replace_them(synth):
    template = synth(fleet="asg", min_capacity="1", max_capacity="3", spot_percent="50")
    boot_script = template.stack.boot_script
    assert boot_script.options.interruptions is True
    name = _group(template)[1]["Properties"]["AutoScalingGroupName"]
    assert name == boot_script.group_name
    (leave,) = [s for s in template.host_statements()
                if "autoscaling:TerminateInstanceInAutoScalingGroup" in json.dumps(s["Action"])]
    assert f"autoScalingGroupName/{name}" in json.dumps(leave["Resource"])
    assert "/opt/neuron-serving/bin/watch-interruption" in boot_script.boot.files


def test_a_spot_fleet_has_a_termination_hook_lasting_the_longest_generation_which_its_hosts_complete(synth):
    # Defect 5 of issue 37: Capacity Rebalancing terminates the host at risk through the group's termination
    # lifecycle once its replacement serves; the hosts drain then, and must be able to complete the action.
    template = synth(fleet="asg", min_capacity="1", max_capacity="3", spot_percent="50")
    hook = template.only("AWS::AutoScaling::LifecycleHook")
    assert hook["LifecycleTransition"] == "autoscaling:EC2_INSTANCE_TERMINATING"
    assert hook["DefaultResult"] == "CONTINUE"
    assert hook["HeartbeatTimeout"] == longest_generation_seconds(template.stack.plan) + 60
    name = _group(template)[1]["Properties"]["AutoScalingGroupName"]
    assert hook["LifecycleHookName"] == template.stack.boot_script.options.termination_hook.hook_name
    assert hook["AutoScalingGroupName"] == {"Ref": _group(template)[0]}
    (complete,) = [s for s in template.host_statements()
                   if "autoscaling:CompleteLifecycleAction" in json.dumps(s["Action"])]
    resources = complete["Resource"] if isinstance(complete["Resource"], list) else [complete["Resource"]]
    assert len(resources) == 1 and f"autoScalingGroupName/{name}" in json.dumps(resources[0])


def test_an_on_demand_fleet_has_no_termination_hook(synth):
    template = synth(fleet="asg", min_capacity="1", max_capacity="3")
    assert template.resources("AWS::AutoScaling::LifecycleHook") == {}
    assert template.stack.boot_script.termination_hook is None


def test_an_on_demand_fleet_has_no_interruption_watcher_nor_the_right_to_leave_its_group(synth):
    template = synth(fleet="asg", min_capacity="1", max_capacity="3")
    assert template.stack.boot_script.options.interruptions is False
    assert "AutoScalingGroupName" not in _group(template)[1]["Properties"]
    assert not [s for s in template.host_statements()
                if "autoscaling:TerminateInstanceInAutoScalingGroup" in json.dumps(s["Action"])]


def test_interruptions_need_the_groups_name() -> None:
    stack = Stack(App(), "Spot")
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.2-1B-Instruct", "inf2.xlarge"))
    with pytest.raises(ServingConfigError, match="group_name"):
        NeuronBootScript(stack, "Boot", plan=plan, interruptions=True)
