"""The root volume's throughput and IOPS: sized from the model, checked against gp3's limits."""

import pytest

from neuron_serving.plan import ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.volume import (
    READ_TARGET_MINUTES,
    VolumePerformance,
    default_iops,
    default_throughput,
    volume_performance,
)


def test_an_8b_model_reads_in_minutes_at_the_included_125_mib_s_and_3000_iops():
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    assert volume_performance(plan) == VolumePerformance(125, 3000)
    assert volume_performance(plan).monthly_usd == 0


def test_a_70b_model_gets_the_throughput_that_reads_its_131_gib_in_five_minutes_and_iops_to_carry_it():
    plan = plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge"))
    volume = volume_performance(plan)
    assert volume == VolumePerformance(449, 3592)
    assert plan.weights_bytes / (volume.throughput * 1024**2) <= READ_TARGET_MINUTES * 60
    assert volume.iops >= 4 * volume.throughput  # 128 KiB reads: 8 per MiB
    assert volume.monthly_usd == pytest.approx(0.04 * 324 + 0.005 * 592)


def test_given_values_win_and_iops_follow_a_given_throughput():
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    assert volume_performance(plan, 1000) == VolumePerformance(1000, 8000)
    assert volume_performance(plan, 250, 4000) == VolumePerformance(250, 4000)
    assert default_iops(2000) == 16000 and default_throughput(plan) == 125


@pytest.mark.parametrize(("throughput", "iops", "message"), [
    (124, 3000, "root_volume_throughput (124) must be a whole number of MiB/s from 125 to 2000"),
    (2001, 9000, "root_volume_throughput (2001) must be a whole number of MiB/s from 125 to 2000"),
    (125, 2999, "root_volume_iops (2999) must be a whole number from 3000 to 80000"),
    (125, 80001, "root_volume_iops (80001) must be a whole number from 3000 to 80000"),
    (1000, 3000, "root_volume_iops (3000) must be at least 4000 for a root_volume_throughput of 1000 MiB/s: gp3 "
     "gives at most 0.25 MiB/s per IOPS"),
    (True, 3000, "root_volume_throughput (True) must be a whole number"),
])
def test_values_outside_gp3s_limits_name_the_setting_the_value_and_what_is_allowed(throughput, iops, message):
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    with pytest.raises(ServingConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        volume_performance(plan, throughput, iops)


def test_iops_above_500_per_gib_of_the_volume_are_refused_naming_the_size():
    volume = VolumePerformance(125, 80000)
    assert volume.size_problem(160) is None
    assert volume.size_problem(150) == ("root_volume_iops (80000) must be at most 75000 on a root volume of 150 GiB: "
                                        "gp3 gives at most 500 IOPS per GiB")
