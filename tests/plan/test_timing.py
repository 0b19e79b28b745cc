"""Stated time estimates that size load balancer timeouts."""

from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.timing import longest_generation_seconds


def test_longest_generation_is_every_token_at_the_ceiling_plus_queueing():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", sequence_length=2048))
    assert longest_generation_seconds(plan) == 205 + 60


def test_the_default_shapes_give_470_seconds():
    assert longest_generation_seconds(plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))) == 470
