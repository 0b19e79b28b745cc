"""A deployed ``NeuronLlamaStack`` as the operator's commands see it: its status and outputs
(cloudformation:DescribeStacks), and its hosts with the boot phase each reports
(:mod:`neuron_serving.plan.phases`)."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ..plan.phases import DETAIL_TAG, PHASE_TAG, SINCE_TAG, Phase, find_phase
from .aws import Aws, OpsError, stack_not_found

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


@dataclass(frozen=True)
class Host:
    """One serving instance, with the phase its boot last reported in its tags.

    :param phase: the :data:`PHASE_TAG` value, or None when the host has reported nothing yet.
    :param since: when it entered the phase, or None.
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
        )

    @property
    def known_phase(self) -> Phase | None:
        return find_phase(self.phase) if self.phase else None


def _timestamp(text: str | None) -> dt.datetime | None:
    """A :data:`SINCE_TAG` value (``2026-11-23T10:00:00Z``) as an aware datetime, or None."""
    if not text:
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
