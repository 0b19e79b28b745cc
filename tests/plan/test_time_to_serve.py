"""Predicted time to serve: each phase from sourced rates and sizes, the default stack against the
README's targets, and the ceilings (timeouts) kept above the predictions."""

import dataclasses
import re
from pathlib import Path

import pytest

from neuron_serving.plan import MODELS, ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan import time_to_serve as tts
from neuron_serving.plan.layout import GIB
from neuron_serving.plan.phases import PHASES, phase_minutes
from neuron_serving.plan.time_to_serve import (
    CACHE_HIT,
    FIRST_DEPLOY,
    FIRST_DEPLOY_COMPILING,
    SCENARIOS,
    WARM_POOL,
    time_to_serve,
    time_to_serve_document,
)
from neuron_serving.plan.timing import boot_minutes, readiness_seconds
from neuron_serving.plan.volume import MIB, volume_performance
from neuron_serving.settings import StackSettings

ROOT = Path(__file__).resolve().parents[2]

TARGET_FIRST_DEPLOY = 25
TARGET_CACHE_HIT = 12
TARGET_WARM_POOL = 5
"""The README's targets, minutes (issue 26)."""

CEILING_MARGIN = 1.5
COMPILE_CEILING_MARGIN = 1.1
"""How far above the predictions the timeouts stay: half again for a boot that finds its export and
for the load, a tenth for a boot that compiles (its ceiling pads the pull and the load but not the
checkpoint's download nor the compile itself: 1.16 times the prediction for Llama 3 70B on
inf2.24xlarge at 125 MiB/s)."""


def _default_stack():
    settings = StackSettings()
    plan = settings.plan()
    return plan, volume_performance(plan, settings.root_volume_throughput, settings.root_volume_iops,
                                    settings.boot_disk_minutes).throughput


def _plan(model, instance="inf2.48xlarge"):
    return plan_serving(ServingRequest(model, instance))


# -- the default stack against the targets ---------------------------------------------------------

def test_the_default_stack_is_an_8b_llama_on_inf2_24xlarge():
    plan, _ = _default_stack()
    assert plan.model.model_type == "llama" and 7.5e9 < plan.model.parameter_count < 8.5e9
    assert plan.instance.name == "inf2.24xlarge"


def test_a_first_deploy_of_the_default_stack_that_the_public_cache_holds_is_predicted_within_25_minutes():
    plan, throughput = _default_stack()
    assert time_to_serve(plan, throughput).total(FIRST_DEPLOY) <= TARGET_FIRST_DEPLOY


def test_a_cache_hit_scale_out_of_the_default_8b_is_predicted_within_12_minutes():
    plan, throughput = _default_stack()
    assert time_to_serve(plan, throughput).total(CACHE_HIT) <= TARGET_CACHE_HIT


def test_a_warm_pool_start_of_the_default_stack_is_predicted_within_5_minutes():
    plan, throughput = _default_stack()
    assert time_to_serve(plan, throughput).total(WARM_POOL) <= TARGET_WARM_POOL


def test_at_gp3s_included_125_mib_s_the_cache_hit_and_warm_pool_targets_would_be_missed():
    # Why boot_disk_minutes sizes the root volume: the image unpacked and the weights written and read
    # at 125 MiB/s take most of the scale-out.
    plan, throughput = _default_stack()
    assert throughput == 341
    slow = time_to_serve(plan, 125)
    assert slow.total(CACHE_HIT) > TARGET_CACHE_HIT and slow.total(WARM_POOL) > TARGET_WARM_POOL


# -- each phase, from its figures ------------------------------------------------------------------

def test_the_8b_checkpoint_comes_from_four_files_at_40_mb_s_each_unless_the_volume_is_slower():
    plan = _plan("llama-3.1-8b")
    assert tts.hub_bytes_per_second(plan) == 4 * 40e6  # 16 GB of bf16 in 5 GB files
    fast = time_to_serve(plan, 2000).phases["checkpoint"]
    assert fast == pytest.approx(plan.weights_bytes / 160e6 / 60)
    slow = time_to_serve(plan, 125).phases["checkpoint"]
    assert slow == pytest.approx(plan.weights_bytes / (125 * MIB) / 60)


def test_a_70b_checkpoint_downloads_sixteen_files_at_once_up_to_the_nat_gateway():
    plan = _plan("llama-3.1-70b")
    assert tts.hub_bytes_per_second(plan) == min(16 * 40e6, 5e9 / 8)


def test_small_instances_reach_outside_the_vpc_at_5_gbps_large_ones_at_half_their_bandwidth_capped_by_the_nat():
    small = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    assert tts.internet_bytes_per_second(small) == 5e9 / 8
    large = _plan("llama-3.1-8b")
    assert tts.internet_bytes_per_second(large) == 5e9 / 8  # half of 100 Gbps, but the NAT gateway's 5 first
    # S3 goes through the VPC's gateway endpoint: the instance's own bandwidth, not the NAT gateway's.
    assert tts.s3_bytes_per_second(large) == pytest.approx(0.6 * 100e9 / 8)


def test_the_pull_is_the_slowest_of_inflating_unpacking_and_fetching():
    plan = _plan("llama-3.1-8b")
    slow_volume = time_to_serve(plan, 125).phases["pull"]
    assert slow_volume == pytest.approx(30 * GIB / (125 * MIB) / 60)  # unpacking 30 GiB at 125 MiB/s
    fast_volume = time_to_serve(plan, 2000).phases["pull"]
    assert fast_volume == pytest.approx(10e9 / tts.GZIP_INFLATE_BYTES_PER_S / 60)  # one core inflating 10 GB


def test_a_full_compile_takes_longer_than_a_public_cache_hit_by_the_compilers_own_time():
    plan = _plan("llama-3.1-8b")
    phases = time_to_serve(plan, 125).phases
    assert phases["compile"] - phases["compile-cached"] > 45
    predicted = time_to_serve(plan, 125)
    assert predicted.total(FIRST_DEPLOY_COMPILING) - predicted.total(FIRST_DEPLOY) == pytest.approx(
        phases["compile"] - phases["compile-cached"])


def test_the_load_is_a_fixed_start_plus_the_weights_at_the_slower_of_the_process_and_the_devices():
    # 70B at degree 12 on inf2.48xlarge: 6 devices take 6.6 GB/s, more than one process reads (5.1).
    big = _plan("llama-3.1-70b")
    assert len(big.replicas[0].devices) == 6
    assert time_to_serve(big, 449).phases["load"] == pytest.approx(1.5 * (10 + big.weights_bytes / 5.1e9) / 60)
    # 8B at degree 2 on inf2.48xlarge: one device, 1.1 GB/s; 12 replicas load at once, as one does.
    small = _plan("llama-3.1-8b")
    assert (len(small.replicas), len(small.replicas[0].devices)) == (12, 1)
    assert time_to_serve(small, 449).phases["load"] == pytest.approx(1.5 * (10 + small.weights_bytes / 1.1e9) / 60)
    one = dataclasses.replace(small, replicas=small.replicas[:1])
    assert time_to_serve(one, 449).phases["load"] == time_to_serve(small, 449).phases["load"]
    # Under a minute for 70B, where the old figure (a shard-on-load of 7B, scaled) said 13.4 minutes.
    assert time_to_serve(big, 449).phases["load"] < 1


def test_weights_just_downloaded_are_read_from_memory_but_after_a_stop_from_the_volume():
    plan = _plan("llama-3.1-70b")
    predicted = time_to_serve(plan, 449)
    assert predicted.minutes(CACHE_HIT, "read") == 0
    assert predicted.minutes(WARM_POOL, "read") == pytest.approx(plan.weights_bytes / (449 * MIB) / 60)
    small_memory = dataclasses.replace(plan, instance=dataclasses.replace(plan.instance, host_ram_gib=128))
    assert time_to_serve(small_memory, 449).minutes(CACHE_HIT, "read") > 0


def test_a_warm_pool_start_skips_the_pull_the_export_and_the_download():
    predicted = time_to_serve(_plan("llama-3.1-8b"), 125)
    for phase in ("launch", "install", "pull", "checkpoint", "compile", "compile-cached", "download"):
        assert predicted.minutes(WARM_POOL, phase) is None
    assert predicted.total(WARM_POOL) == pytest.approx(sum(
        predicted.minutes(WARM_POOL, phase) or 0 for phase in ("start", "services", "read", "load", "warm-up")))


def test_a_faster_volume_never_makes_a_scenario_slower():
    plan = _plan("llama-3.1-70b")
    for scenario in SCENARIOS:
        totals = [time_to_serve(plan, throughput).total(scenario) for throughput in (125, 449, 1000, 2000)]
        assert totals == sorted(totals, reverse=True)


def test_the_70b_on_inf2_48xlarge_takes_longer_than_the_8b_in_every_scenario():
    small, large = time_to_serve(_plan("llama-3.1-8b"), 125), time_to_serve(_plan("llama-3.1-70b"), 449)
    for scenario in SCENARIOS:
        assert large.total(scenario) > small.total(scenario)


def test_the_document_lists_every_scenario_with_its_phases_and_total():
    plan = _plan("llama-3.1-8b")
    document = time_to_serve_document(plan, 125)
    assert set(document["scenarios"]) == set(SCENARIOS)
    for scenario, phases in SCENARIOS.items():
        entry = document["scenarios"][scenario]
        assert list(entry["phases"]) == list(phases)
        assert entry["total"] == pytest.approx(sum(entry["phases"].values()), abs=0.5)
    assert document["sources"] == "docs/time-to-serve.md"


# -- status reads the predictions; the timeouts stay above them ------------------------------------

def test_status_estimates_are_the_predictions_rounded_up():
    plan = _plan("llama-3.1-8b")
    predicted = time_to_serve(plan, 125)
    minutes = phase_minutes(plan, 125)
    assert {p.estimate for p in PHASES if p.estimate} <= set(minutes)
    assert minutes["pull"] == 5 and minutes["download"] == 3  # 4.1 and 2.04 minutes
    assert minutes["export"] == -(-(predicted.phases["checkpoint"] + predicted.phases["compile"]) // 1)
    assert minutes["load"] == -(-(predicted.warm_read + predicted.phases["load"] + predicted.phases["warm-up"]) // 1)


@pytest.mark.parametrize("model", list(MODELS))
def test_the_timeouts_stay_above_the_predictions(model):
    for instance in ("inf2.xlarge", "inf2.24xlarge", "inf2.48xlarge", "trn1.2xlarge", "trn1.32xlarge"):
        try:
            plan = _plan(model, instance)
        except ServingConfigError:
            continue
        for throughput in (125, volume_performance(plan).throughput, 2000):
            predicted = time_to_serve(plan, throughput)
            boot = predicted.total(FIRST_DEPLOY_COMPILING)
            assert boot_minutes(plan, throughput=throughput) >= COMPILE_CEILING_MARGIN * boot
            cached = predicted.total(CACHE_HIT)
            assert boot_minutes(plan, throughput=throughput, exports=False) >= CEILING_MARGIN * cached
            ready = predicted.warm_read + predicted.phases["load"] + predicted.phases["warm-up"]
            assert readiness_seconds(plan, throughput) >= CEILING_MARGIN * ready * 60


# -- every figure is listed with its source ----------------------------------------------------------

def test_the_time_to_serve_page_lists_every_figure_of_the_predictions():
    page = (ROOT / "docs" / "time-to-serve.md").read_text()
    figures = [name for name in vars(tts) if re.fullmatch(r"[A-Z][A-Z0-9_]+", name)
               and isinstance(getattr(tts, name), int | float | dict) and name not in ("GB", "GBPS", "GIB", "MIB")
               and not name.startswith(("PHASE_", "SCENARIO"))]
    assert len(figures) > 15
    assert [name for name in figures if not re.search(rf"[`.]{name}`", page)] == []
