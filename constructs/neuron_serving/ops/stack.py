"""A deployed ``NeuronLlamaStack`` as the operator's commands see it: its status and outputs
(cloudformation:DescribeStacks), and its hosts with the boot phase each reports
(:mod:`neuron_serving.plan.phases`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..plan.phases import (
    DETAIL_TAG,
    PHASE_TAG,
    PUBLISH_TAG,
    SECONDS_TAG,
    SINCE_TAG,
    WARMED,
    Phase,
    find_phase,
    parse_seconds,
)
from .aws import REGION_HELP, Aws, OpsError, stack_not_found

DEFAULT_STACK = "NeuronLlamaStack"
"""The stack the commands look at unless ``--stack`` names another."""

OUTPUT_CONSTRUCTS = ("Monitoring",)
"""The ids of ``NeuronLlamaStack``'s constructs with outputs of their own. aws-cdk-lib names such
an output by the construct's id, the output's, then a hash of 8 uppercase hex digits
(``MonitoringDashboardUrlDB84D4CA``)."""


@dataclass(frozen=True)
class StackInfo:
    """What DescribeStacks says of the stack."""

    name: str
    status: str
    reason: str
    outputs: dict[str, str] = field(default_factory=dict)

    def output(self, name: str) -> str | None:
        """The output called ``name``: the stack's own (``EndpointUrl``) or a construct's
        (``DashboardUrl``, whose key is ``Monitoring`` + name + hash)."""
        if name in self.outputs:
            return self.outputs[name]
        pattern = re.compile(f"(?:{'|'.join(OUTPUT_CONSTRUCTS)}){re.escape(name)}[0-9A-F]{{8}}")
        return next((value for key, value in self.outputs.items() if pattern.fullmatch(key)), None)

    def require(self, name: str, why: str) -> str:
        """:meth:`output`, or an :class:`OpsError` saying the stack lacks it and what for."""
        value = self.output(name)
        if value:
            return value
        if self.status.endswith("_IN_PROGRESS"):
            raise OpsError(f"stack {self.name} is {self.status} and has no {name} output yet ({why}): "
                           "try again once it is complete")
        raise OpsError(f"stack {self.name} has no {name} output ({why}): was it deployed with this version of "
                       "cdk-neuron-serving? Deploy it again")

    @property
    def boot_phase_minutes(self) -> dict[str, int]:
        """The ``BootPhaseMinutes`` output: each phase estimate's minutes; empty without it."""
        try:
            value = json.loads(self.output("BootPhaseMinutes") or "{}")
        except ValueError:
            return {}
        return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}


def describe_stack(aws: Aws, name: str) -> StackInfo:
    """The stack called ``name``; :class:`OpsError` when it does not exist in the session's region."""
    described = aws.call("cloudformation", "describe_stacks", name, explain=stack_not_found(name, aws.region),
                         StackName=name)
    (stack,) = described["Stacks"]
    return StackInfo(
        name=name,
        status=str(stack.get("StackStatus", "")),
        reason=str(stack.get("StackStatusReason", "")),
        outputs={str(o["OutputKey"]): str(o.get("OutputValue", "")) for o in stack.get("Outputs", [])},
    )


ON_DEMAND, SPOT, CAPACITY_BLOCK = "on-demand", "spot", "capacity-block"


def capacity_kind(instance: dict[str, Any]) -> str:
    """Where an instance of ec2:DescribeInstances runs: ``InstanceLifecycle`` is ``spot`` or ``capacity-block``
    for those, absent for On-Demand (EC2 API reference, Instance), and an On-Demand instance in a Capacity
    Reservation names it (``CapacityReservationId``)."""
    lifecycle = str(instance.get("InstanceLifecycle") or "")
    if lifecycle in (SPOT, CAPACITY_BLOCK):
        return lifecycle
    reservation = instance.get("CapacityReservationId")
    return f"reservation {reservation}" if reservation else ON_DEMAND


@dataclass(frozen=True)
class Host:
    """One serving instance, with the phase its boot last reported in its tags.

    :param phase: the :data:`PHASE_TAG` value, or None when the host has reported nothing yet.
    :param since: when it entered the phase, or None.
    :param seconds: each phase it has finished and its seconds (:data:`SECONDS_TAG`), in the
        order it entered them; empty before the first ends, or from a host of an older version.
    :param publish: what became of its publish of the export it compiled to the artifact cache
        (:data:`PUBLISH_TAG`); empty for a host that published nothing (yet).
    """

    instance_id: str
    state: str
    availability_zone: str
    launched: dt.datetime | None
    phase: str | None
    since: dt.datetime | None
    detail: str
    private_ip: str | None = None
    lifecycle_state: str | None = None
    seconds: tuple[tuple[str, int], ...] = ()
    instance_type: str = ""
    capacity: str = ON_DEMAND
    """Where its capacity comes from: :data:`ON_DEMAND`, :data:`SPOT`, :data:`CAPACITY_BLOCK`, or
    ``reservation cr-...`` (an On-Demand Capacity Reservation)."""
    publish: str = ""

    @classmethod
    def from_instance(cls, instance: dict[str, Any], lifecycle_state: str | None = None) -> Host:
        """From an instance of ec2:DescribeInstances."""
        tags = {str(t["Key"]): str(t.get("Value", "")) for t in instance.get("Tags", [])}
        launched = instance.get("LaunchTime")
        return cls(
            instance_id=str(instance["InstanceId"]),
            state=str(instance.get("State", {}).get("Name", "")),
            availability_zone=str(instance.get("Placement", {}).get("AvailabilityZone", "")),
            launched=launched if isinstance(launched, dt.datetime) else None,
            phase=tags.get(PHASE_TAG) or None,
            since=_timestamp(tags.get(SINCE_TAG)),
            detail=tags.get(DETAIL_TAG, ""),
            private_ip=instance.get("PrivateIpAddress"),
            lifecycle_state=lifecycle_state,
            seconds=tuple(parse_seconds(tags.get(SECONDS_TAG, "")).items()),
            instance_type=str(instance.get("InstanceType", "")),
            capacity=capacity_kind(instance),
            publish=tags.get(PUBLISH_TAG, ""),
        )

    @property
    def known_phase(self) -> Phase | None:
        return find_phase(self.phase) if self.phase else None

    @property
    def warm(self) -> bool:
        """Whether the host is in the group's warm pool: its lifecycle state says so (``Warmed:*``), or, for
        an instance neither the group nor its warm pool lists, the phase it last reported. A host the group
        has just taken from the warm pool still reports ``warmed`` until it boots again: its lifecycle state
        decides."""
        if self.lifecycle_state:
            return self.lifecycle_state.startswith("Warmed:")
        return self.phase == WARMED


def _timestamp(text: str | None) -> dt.datetime | None:
    """A :data:`SINCE_TAG` value (``2026-11-23T10:00:00Z``) as an aware datetime, or None."""
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


RESOURCE_OUTPUTS = {
    "AWS::EC2::Instance": "InstanceId",
    "AWS::AutoScaling::AutoScalingGroup": "AutoScalingGroupName",
    "AWS::ElasticLoadBalancingV2::TargetGroup": "TargetGroupArn",
}
"""Outputs whose value is a resource's physical id (CloudFormation's Ref of these types: the instance id,
the group's name, the target group's ARN), by the resource's type."""

LITERAL_OUTPUTS = ("BootPhaseMinutes", "ReplicaCount", "ReplicasByInstanceType")
"""Outputs whose value the template states literally."""


def while_in_progress(aws: Aws, info: StackInfo) -> StackInfo:
    """``info`` with the outputs the commands need read from the stack's resources
    (cloudformation:ListStackResources) and template (cloudformation:GetTemplate): CloudFormation shows
    a stack's outputs only once it is complete ("Outputs" in the CloudFormation user guide:
    https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/outputs-section-structure.html)."""
    outputs = dict(info.outputs)
    explain = stack_not_found(info.name, aws.region)
    for resource in aws.pages("cloudformation", "list_stack_resources", info.name, "StackResourceSummaries",
                              explain=explain, StackName=info.name):
        name = RESOURCE_OUTPUTS.get(str(resource.get("ResourceType")))
        if name and resource.get("PhysicalResourceId") and name not in outputs:
            outputs[name] = str(resource["PhysicalResourceId"])
    body = aws.call("cloudformation", "get_template", info.name, explain=explain,
                    StackName=info.name).get("TemplateBody", {})
    try:
        template = json.loads(body) if isinstance(body, str) else body
    except ValueError:  # a YAML template: not ours
        template = {}
    for name in LITERAL_OUTPUTS:
        value = template.get("Outputs", {}).get(name, {}).get("Value") if isinstance(template, dict) else None
        if isinstance(value, str) and name not in outputs:
            outputs[name] = value
    return StackInfo(info.name, info.status, info.reason, outputs)


GROUP_TAG = "aws:autoscaling:groupName"
"""The tag EC2 Auto Scaling puts on the instances it launches (EC2 Auto Scaling user guide, "Tag Auto Scaling
groups and instances": https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-tagging.html)."""

GONE_STATES = ("shutting-down", "terminated")
"""EC2 instance states of hosts that are no longer part of the stack."""


def stack_options() -> argparse.ArgumentParser:
    """A parent parser with ``--stack`` and ``--region``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--stack", default=DEFAULT_STACK, help=f"the stack's name (default: {DEFAULT_STACK})")
    parent.add_argument("--region", help=REGION_HELP)
    return parent


def find_hosts(aws: Aws, info: StackInfo) -> list[Host]:
    """The stack's hosts: its ``InstanceId`` output's instance, or its Auto Scaling group's instances,
    in service and in the warm pool, sorted by id. Instances shutting down or terminated are left out."""
    instance_id = info.output("InstanceId")
    if instance_id:
        return _describe(aws, {instance_id: None}, [])
    group = info.require("AutoScalingGroupName", "the hosts: a single instance's InstanceId or a fleet's group")
    groups = aws.call("autoscaling", "describe_auto_scaling_groups", group, AutoScalingGroupNames=[group])
    if not groups.get("AutoScalingGroups"):
        raise OpsError(f"Auto Scaling group {group} (stack {info.name}'s AutoScalingGroupName output) not found "
                       f"in {aws.region}: was it deleted?")
    lifecycle: dict[str, str | None] = {
        str(i["InstanceId"]): str(i.get("LifecycleState", "")) for i in groups["AutoScalingGroups"][0]["Instances"]}
    # DescribeWarmPool lists the warm pool's instances with LifecycleState Warmed:* (EC2 Auto Scaling API
    # reference, DescribeWarmPool and Instance: https://docs.aws.amazon.com/autoscaling/ec2/APIReference/
    # API_DescribeWarmPool.html). The group's own list holds only the instances in the group itself.
    for instance in aws.pages("autoscaling", "describe_warm_pool", group, "Instances", AutoScalingGroupName=group):
        lifecycle[str(instance["InstanceId"])] = str(instance.get("LifecycleState", ""))
    # Instances the group launched that neither list holds (yet, or any more): found by the group's tag.
    return _describe(aws, lifecycle, [{"Name": f"tag:{GROUP_TAG}", "Values": [group]}])


def _describe(aws: Aws, lifecycle: dict[str, str | None], filters: list[dict[str, Any]]) -> list[Host]:
    """ec2:DescribeInstances of the instances in ``lifecycle`` and of those ``filters`` match, as hosts."""
    found: dict[str, dict[str, Any]] = {}
    for params in ([{"InstanceIds": sorted(lifecycle)}] if lifecycle else []) + (
            [{"Filters": filters}] if filters else []):
        resource = ", ".join(sorted(lifecycle)) if "InstanceIds" in params else "the group's instances"
        for reservation in aws.pages("ec2", "describe_instances", resource, "Reservations",
                                     explain=_instance_not_found, **params):
            for instance in reservation.get("Instances", []):
                found[str(instance["InstanceId"])] = instance
    hosts = [Host.from_instance(instance, lifecycle.get(iid)) for iid, instance in sorted(found.items())]
    return [host for host in hosts if host.state not in GONE_STATES]


def _instance_not_found(code: str, message: str) -> str | None:
    if code == "InvalidInstanceID.NotFound":
        return f"the stack's instance is gone ({message}): was it terminated outside CloudFormation?"
    return None
