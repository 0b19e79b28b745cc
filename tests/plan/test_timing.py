"""Stated time estimates that size CloudFormation waits and load balancer timeouts."""

from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.phases import PHASES, phase_minutes
from neuron_serving.plan.timing import MAX_CLOUDFORMATION_MINUTES, boot_minutes, longest_generation_seconds


def test_an_8b_export_boot_takes_about_an_hour_and_a_half_and_a_cached_boot_forty_minutes():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))
    assert boot_minutes(plan) == 87  # 20 pull + 10 + 4 load + 20 + 32 export
    assert boot_minutes(plan, exports=False) == 41  # 20 pull + 2 + 4 download + 10 + 4 load


def test_each_boot_phase_estimate_is_the_share_of_the_boot_ceiling_it_names():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))
    minutes = phase_minutes(plan)
    assert minutes == {"pull": 20, "export": 53, "download": 7, "load": 15}
    # Every phase with an estimate names one of them, and the two boots add up to their ceilings
    # (each rounded up on its own).
    assert {p.estimate for p in PHASES if p.estimate} == set(minutes)
    assert minutes["pull"] + minutes["export"] + minutes["load"] - boot_minutes(plan) in (0, 1)
    assert minutes["pull"] + minutes["download"] + minutes["load"] - boot_minutes(plan, exports=False) in (0, 1)


def test_a_70b_export_boot_takes_hours_but_stays_within_cloudformation_limits():
    plan = plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge"))
    assert 300 < boot_minutes(plan) <= MAX_CLOUDFORMATION_MINUTES


def test_longest_generation_is_every_token_at_the_ceiling_plus_queueing():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", sequence_length=2048))
    assert longest_generation_seconds(plan) == 205 + 60


def test_the_default_shapes_give_470_seconds():
    assert longest_generation_seconds(plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))) == 470
