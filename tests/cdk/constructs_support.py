"""A bare stack to build one construct in, the way aws-cdk-lib tests its own constructs
(aws/aws-cdk packages/aws-cdk-lib/aws-autoscaling/test/auto-scaling-group.test.ts: a new
``Stack``, an imported ``mockVpc``, the construct with minimal props), and the inputs the
constructs take from the boot script.

The boot script is built here and nowhere else in the construct tests, so that a change of its
constructor is adapted in this one place."""

from __future__ import annotations

from functools import cache
from typing import Any

import jsii
from aws_cdk import App, IStableNumberProducer, Lazy, Stack, Token
from aws_cdk import aws_ec2 as ec2

from neuron_serving import NeuronBootScript, ReadinessSignal
from neuron_serving.plan import ServingPlan, ServingRequest, plan_serving

from .conftest import FEATURE_FLAGS

STACK_NAME = "Own"
VPC_CIDR = "10.0.0.0/16"
PRIVATE_SUBNETS = ["subnet-0b0000000000000b1", "subnet-0b0000000000000b2"]
PUBLIC_SUBNETS = ["subnet-0a0000000000000a1", "subnet-0a0000000000000a2"]
SIGNALLED_ID = "ServingHost"
"""The logical id the signalling boot script names, which the instance or fleet takes."""


def bare_stack() -> Stack:
    """A stack of its own app, with cdk.json's feature flags (what ``cdk init`` gives a user)."""
    return Stack(App(context=FEATURE_FLAGS), STACK_NAME)


def imported_vpc(stack: Stack) -> ec2.IVpc:
    """A VPC of two AZs, each with a public and a private subnet, imported rather than created
    (aws-cdk-lib's ``mockVpc``): the template holds only the construct under test, and the
    synth stays cheap. The ids have EC2's shapes, which CloudFormation's validation checks."""
    return ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id="vpc-0123456789abcdef0", vpc_cidr_block=VPC_CIDR,
        availability_zones=["us-east-1a", "us-east-1b"],
        public_subnet_ids=PUBLIC_SUBNETS, private_subnet_ids=PRIVATE_SUBNETS,
    )


@cache
def small_plan() -> ServingPlan:
    """Llama 3.2 1B on inf2.xlarge: the smallest plan, one replica."""
    return plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))


def boot_script(stack: Stack, *, signalled: bool = True, **props: Any) -> NeuronBootScript:
    """The boot script of :func:`small_plan`, signalling :data:`SIGNALLED_ID` unless told not to."""
    signal = ReadinessSignal(stack_name=stack.stack_name, logical_id=SIGNALLED_ID) if signalled else None
    return NeuronBootScript(stack, "Boot", plan=small_plan(), signal=signal, **props)


@jsii.implements(IStableNumberProducer)
class _Number:
    def __init__(self, value: float) -> None:
        self.value = value

    def produce(self) -> float:
        return self.value


def known_at_synth(value: float) -> float:
    """A number token whose value the app learns only when it synthesizes (``Lazy.number``), as
    a value computed from other constructs would be."""
    return Token.as_number(Lazy.number(_Number(value)))
