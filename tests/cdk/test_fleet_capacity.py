"""Where a fleet's hosts come from, in the template: several instance types weighed by their replicas,
Spot with an On-Demand base, Capacity Reservations, a Capacity Block; and the construct's own refusals."""

import datetime

import pytest
from aws_cdk import App, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from neuron_serving import (
    NeuronBootScript,
    NeuronServingFleet,
    NeuronServingInstance,
    NeuronServingLaunchTemplate,
    ReadinessSignal,
    ServingConfigError,
    WarmPoolHook,
    neuron_dlami,
)
from neuron_serving.cdk.fleet import CapacityBlock
from neuron_serving.plan import ServingRequest, plan_serving

from .conftest import BLOCK, BLOCK_END, CAPACITY_CONFIGS, RESERVATION_GROUP, SNAPSHOT_CONFIGS, synthesized


def _group(synth):
    (group,) = synth.resources("AWS::AutoScaling::AutoScalingGroup").values()
    return group


def test_several_types_are_overrides_weighed_by_their_replicas_and_sized_in_replicas():
    group = _group(synthesized(**SNAPSHOT_CONFIGS["fleet_capacity"]))
    properties = group["Properties"]
    policy = properties["MixedInstancesPolicy"]
    assert policy["LaunchTemplate"]["Overrides"] == [
        {"InstanceType": "inf2.24xlarge", "WeightedCapacity": "6"},
        {"InstanceType": "inf2.8xlarge", "WeightedCapacity": "1"}]
    assert "LaunchTemplate" not in properties
    # min_capacity 1 and max_capacity 3 hosts of inf2.24xlarge, in replicas.
    assert (properties["MinSize"], properties["MaxSize"]) == ("6", "18")
    # Creation waits for the fewest hosts that hold the minimum: one inf2.24xlarge.
    assert group["CreationPolicy"]["ResourceSignal"]["Count"] == 1
    assert group["UpdatePolicy"]["AutoScalingRollingUpdate"]["MinInstancesInService"] == 0


def test_spot_has_an_on_demand_base_of_min_capacity_and_capacity_optimized_priorities_with_rebalancing():
    properties = _group(synthesized(**SNAPSHOT_CONFIGS["fleet_capacity"]))["Properties"]
    assert properties["MixedInstancesPolicy"]["InstancesDistribution"] == {
        "OnDemandAllocationStrategy": "prioritized", "OnDemandBaseCapacity": 6,
        "OnDemandPercentageAboveBaseCapacity": 50, "SpotAllocationStrategy": "capacity-optimized-prioritized"}
    assert properties["CapacityRebalance"] is True


def test_capacity_reservations_by_id_and_group_with_the_preference():
    group_arn = RESERVATION_GROUP
    properties = _group(synthesized(**CAPACITY_CONFIGS["reservations_only"]))["Properties"]
    assert properties["CapacityReservationSpecification"] == {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": {"CapacityReservationIds": [BLOCK],
                                      "CapacityReservationResourceGroupArns": [group_arn]}}
    # One type, On-Demand: the group launches the launch template itself, no mixed instances policy.
    assert "MixedInstancesPolicy" not in properties and "CapacityRebalance" not in properties


def test_a_single_type_fleet_keeps_counting_hosts_from_the_launch_template():
    properties = _group(synthesized(fleet="asg", min_capacity="2", max_capacity="4"))["Properties"]
    assert (properties["MinSize"], properties["MaxSize"]) == ("2", "4")
    assert "MixedInstancesPolicy" not in properties and "CapacityReservationSpecification" not in properties


def test_a_capacity_block_launches_into_the_block_in_its_zone_and_scales_to_zero_an_hour_before_it_ends():
    synth = synthesized(**CAPACITY_CONFIGS["capacity_block"])
    data = synth.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": BLOCK}}
    subnets = {k: v["Properties"] for k, v in synth.resources("AWS::EC2::Subnet").items()}
    [zone_b] = [k for k, v in subnets.items() if v["AvailabilityZone"] == "us-east-1b" and "Private" in k]
    assert _group(synth)["Properties"]["VPCZoneIdentifier"] == [{"Ref": zone_b}]
    action = synth.only("AWS::AutoScaling::ScheduledAction")
    assert (action["MinSize"], action["MaxSize"], action["DesiredCapacity"]) == (0, 0, 0)
    assert action["StartTime"] == (BLOCK_END - datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "Recurrence" not in action
    # The new VPC is in the zones given, the block's among them.
    assert sorted({v["AvailabilityZone"] for v in subnets.values()}) == ["us-east-1a", "us-east-1b"]


def _own(types=("inf2.48xlarge", "inf2.24xlarge"), **boot_props):
    stack = Stack(App(), "Own")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    plan = plan_serving(ServingRequest("llama-3-8b", types[0]))
    boot = NeuronBootScript(stack, "Boot", plan=plan, instance_types=types,
                            signal=ReadinessSignal(stack_name="Own", logical_id="Fleet"), **boot_props)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot, machine_image=neuron_dlami("/p"))
    return stack, vpc, host


def test_the_fleet_alone_takes_its_types_from_the_boot_scripts_layouts():
    stack, vpc, host = _own()
    fleet = NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=1, max_capacity=2)
    assert fleet.weights == {"inf2.48xlarge": 12, "inf2.24xlarge": 6} and fleet.unit == 12
    properties = Template.from_stack(stack).find_resources("AWS::AutoScaling::AutoScalingGroup")
    [group] = properties.values()
    assert (group["Properties"]["MinSize"], group["Properties"]["MaxSize"]) == ("12", "24")
    with pytest.raises(ServingConfigError, match=r"target_requests_per_minute \(100\) counts requests per host, "
                       r"and hosts of this fleet's types serve different numbers of replicas "
                       r"\(inf2.48xlarge 12, inf2.24xlarge 6\)"):
        fleet.scale_on_requests(100)


def test_the_fleet_alone_refuses_what_auto_scaling_cannot_do():
    stack, vpc, host = _own(warm_pool_hook=WarmPoolHook(hook_name="h", group_name="g"))
    with pytest.raises(ServingConfigError) as caught:
        NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, max_capacity=3, spot_percent=120,
                           on_demand_base_capacity=5, capacity_reservations=["cr-1"],
                           capacity_reservation_preference="first")
    text = str(caught.value)
    assert "launch_template (True) cannot be combined with several instance_types: Auto Scaling keeps no warm " \
           "pool" in text
    assert "spot_percent (120) must be 0 to 100 percent" in text
    assert "on_demand_base_capacity (5) must be 0 to max_capacity (3)" in text
    assert "capacity_reservations ('cr-1') must be a Capacity Reservation id" in text
    assert "capacity_reservation_preference ('first') must be one of capacity-reservations-first" in text


def test_a_capacity_block_with_several_types_or_spot_is_refused_by_the_fleet_alone():
    stack, vpc, host = _own()
    with pytest.raises(ServingConfigError, match=r"instance_types \('several'\) must be one type with "
                       r"capacity_block cr-0123456789abcdef0"):
        NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host,
                           capacity_block=CapacityBlock(BLOCK, "us-east-1a", BLOCK_END))


def test_a_single_instance_refuses_a_boot_script_of_several_types():
    stack, vpc, host = _own()
    with pytest.raises(ServingConfigError, match=r"has a boot script for several instance types \(inf2.48xlarge, "
                       r"inf2.24xlarge\): a single instance is of one type"):
        NeuronServingInstance(stack, "Instance", vpc=vpc, launch_template=host)


def _alarm(synth, name):
    [alarm] = [a["Properties"] for k, a in synth.resources("AWS::CloudWatch::Alarm").items() if name in k]
    return alarm


def test_an_alarm_fires_when_the_group_wants_capacity_it_neither_has_nor_is_launching():
    synth = synthesized(**SNAPSHOT_CONFIGS["fleet_capacity"])
    alarm = _alarm(synth, "CannotLaunch")
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"], alarm["Threshold"]) == (10, 8, 1)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"
    queries = {q["Id"]: q for q in alarm["Metrics"]}
    [expression] = [q["Expression"] for q in queries.values() if "Expression" in q]
    assert expression == "MAX([0, FILL(desired, 0) - FILL(serving, 0) - FILL(pending, 0)])"
    names = {q["Id"]: (q["MetricStat"]["Metric"]["MetricName"], q["MetricStat"]["Stat"])
             for q in queries.values() if "MetricStat" in q}
    assert names == {"desired": ("GroupDesiredCapacity", "Minimum"), "serving": ("GroupInServiceCapacity", "Maximum"),
                     "pending": ("GroupPendingCapacity", "Maximum")}
    assert all(q["MetricStat"]["Metric"]["Dimensions"] == [
        {"Name": "AutoScalingGroupName", "Value": {"Ref": "NeuronServingFleet"}}]
        for q in queries.values() if "MetricStat" in q)
    assert "EC2_INSTANCE_LAUNCH_ERROR" in alarm["AlarmDescription"]
    # A single instance has no group to watch.
    assert not [k for k in synthesized().resources("AWS::CloudWatch::Alarm") if "CannotLaunch" in k]


def test_the_dashboard_shows_the_hosts_by_type_zone_and_capacity_and_the_capacity_not_launched():
    synth = synthesized(**SNAPSHOT_CONFIGS["fleet_capacity"])
    [dashboard] = synth.resources("AWS::CloudWatch::Dashboard").values()
    body = "".join(part if isinstance(part, str) else "{}" for part in
                   dashboard["Properties"]["DashboardBody"]["Fn::Join"][1])
    for dimension in ("InstanceType", "AvailabilityZone", "Capacity"):
        assert (f"SEARCH('{{NeuronServing,Service,{dimension}}} MetricName=\\\"Hosts\\\" "
                "Service=\\\"NeuronLlamaStack\\\"', 'Sum', 60)") in body
    assert "Hosts by instance type" in body and "Capacity not launched" in body


def test_the_dashboard_counts_the_instances_in_each_reservation_and_block_from_ec2s_own_metric():
    def widget(synth):
        [dashboard] = synth.resources("AWS::CloudWatch::Dashboard").values()
        body = "".join(part if isinstance(part, str) else "{}" for part in
                       dashboard["Properties"]["DashboardBody"]["Fn::Join"][1])
        return body
    reserved = widget(synthesized(**SNAPSHOT_CONFIGS["fleet_capacity"]))
    assert ('["AWS/EC2CapacityReservations","UsedInstanceCount","CapacityReservationId","cr-0123456789abcdef0",'
            '{"label":"cr-0123456789abcdef0","stat":"Maximum"}]') in reserved
    assert "Instances in the capacity reservations" in widget(synthesized(**CAPACITY_CONFIGS["capacity_block"]))
    # A resource group's reservations are known at launch only: every reservation of the account.
    assert ("SEARCH('{AWS/EC2CapacityReservations,CapacityReservationId} MetricName=\\\"UsedInstanceCount\\\"', "
            "'Maximum', 300)") in widget(synthesized(**CAPACITY_CONFIGS["reservations_only"]))
    assert "Instances in the capacity reservations" not in widget(synthesized(fleet="asg", min_capacity="2",
                                                                              max_capacity="4"))
