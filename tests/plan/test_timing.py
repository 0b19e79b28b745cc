"""Stated time estimates that size CloudFormation waits and load balancer timeouts."""

from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.timing import MAX_CLOUDFORMATION_MINUTES, boot_minutes, longest_generation_seconds


def test_an_8b_export_boot_takes_about_an_hour_and_a_half_and_a_cached_boot_half_an_hour():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))
    assert boot_minutes(plan) == 87  # 20 pull + 10 + 4 load + 20 + 32 export
    assert boot_minutes(plan, exports=False) == 35


def test_a_70b_export_boot_takes_hours_but_stays_within_cloudformation_limits():
    plan = plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge"))
    assert 300 < boot_minutes(plan) <= MAX_CLOUDFORMATION_MINUTES


def test_longest_generation_is_every_token_at_the_ceiling_plus_queueing():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", sequence_length=2048))
    assert longest_generation_seconds(plan) == 205 + 60


def test_the_default_shapes_give_470_seconds():
    assert longest_generation_seconds(plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))) == 470
