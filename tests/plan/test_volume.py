"""The root volume's throughput and IOPS: sized from the model, checked against gp3's limits."""

import pytest

from neuron_serving.plan import ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.volume import (
    DEFAULT_DISK_MINUTES,
    VolumePerformance,
    boot_disk_bytes,
    default_iops,
    default_throughput,
    volume_performance,
)


def test_an_8b_boot_moves_its_60_gib_in_three_minutes_within_the_included_iops():
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    # The image unpacked (30 GiB), the weights written and read (2 x 15 GiB).
    assert boot_disk_bytes(plan) == 30 * 1024**3 + 2 * plan.weights_bytes
    assert volume_performance(plan) == VolumePerformance(341, 3000)
    assert boot_disk_bytes(plan) / (341 * 1024**2) <= DEFAULT_DISK_MINUTES * 60
    assert volume_performance(plan).monthly_usd == pytest.approx(0.04 * 216)
    # One setting sizes it: at 8 minutes, gp3's included 125 MiB/s.
    assert volume_performance(plan, disk_minutes=8) == VolumePerformance(128, 3000)
    assert volume_performance(plan, disk_minutes=10) == VolumePerformance(125, 3000)


@pytest.mark.parametrize("minutes", [0, -1, 1441, "3", True])
def test_boot_disk_minutes_must_be_a_positive_number_of_minutes(minutes):
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    with pytest.raises(ServingConfigError, match=r"boot_disk_minutes \(.*\) must be a number of minutes above 0"):
        volume_performance(plan, disk_minutes=minutes)


def test_a_70b_model_gets_the_throughput_that_moves_its_boot_in_three_minutes_and_iops_to_carry_it():
    plan = plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge"))
    volume = volume_performance(plan)
    assert volume == VolumePerformance(1666, 13328)
    assert boot_disk_bytes(plan) / (volume.throughput * 1024**2) <= DEFAULT_DISK_MINUTES * 60
    assert volume.iops >= 4 * volume.throughput  # 128 KiB reads: 8 per MiB
    assert volume.monthly_usd == pytest.approx(0.04 * 1541 + 0.005 * 10328)


def test_given_values_win_and_iops_follow_a_given_throughput():
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge"))
    assert volume_performance(plan, 1000) == VolumePerformance(1000, 8000)
    assert volume_performance(plan, 250, 4000) == VolumePerformance(250, 4000)
    assert default_iops(2000) == 16000 and default_throughput(plan) == 341


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
