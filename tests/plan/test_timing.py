"""Stated ceilings that size CloudFormation waits, wait-ready's limit and load balancer timeouts, and the
boot phases' predicted minutes that `status` shows (neuron_serving.plan.time_to_serve)."""

import dataclasses

import pytest

from neuron_serving.plan import MODELS, ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.phases import PHASES, phase_minutes
from neuron_serving.plan.timing import (
    DOWNLOAD_BASE_MINUTES,
    DOWNLOAD_MINUTES_PER_BILLION,
    MAX_CLOUDFORMATION_MINUTES,
    PULL_MINUTES,
    boot_minutes,
    longest_generation_seconds,
    read_minutes,
    readiness_seconds,
)
from neuron_serving.plan.volume import GP3_THROUGHPUT_MIB_S, default_throughput
from neuron_serving.render.boot_options import MAX_HEARTBEAT_TIMEOUT_SECONDS

BASELINE = GP3_THROUGHPUT_MIB_S[0]


def _plan(model: str, instance: str = "inf2.48xlarge"):
    return plan_serving(ServingRequest(model, instance))


def test_an_8b_export_boot_takes_about_an_hour_and_a_half_and_a_cached_boot_under_an_hour():
    plan = _plan("llama-3-8b", "inf2.24xlarge")
    # 20 pull + 20 + 32 export + 1.5 * (2 read + 10 + 4 load), each share rounded up
    assert boot_minutes(plan, throughput=BASELINE) == 98
    assert boot_minutes(plan, throughput=BASELINE, exports=False) == 52  # 20 pull + 2 + 4 download + 25 load


def test_a_host_that_quantizes_the_weights_waits_longer_for_its_export_not_for_a_downloaded_one():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", quantization="int8"))
    # 98 minutes as above, and 0.5 a billion parameters to quantize (8.03 B: 4.01, rounded up with the rest).
    assert boot_minutes(plan, throughput=BASELINE) == 102
    assert boot_minutes(plan, throughput=BASELINE, exports=False) == 52


def test_a_host_that_speculates_waits_for_its_drafts_download_and_compile_too():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge",
                                       speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B"))
    # The draft's 1.3 B parameters (one layer, embeddings, LM head, fc) at the model's minutes per billion.
    assert boot_minutes(plan, throughput=BASELINE) == 103
    # Downloaded, its share of the export (0.65 minutes) rounds up with the rest into the same 52 minutes.
    assert boot_minutes(plan, throughput=BASELINE, exports=False) == 52


def test_each_boot_phase_estimate_is_a_prediction_that_its_ceiling_covers():
    plan = _plan("llama-3-8b", "inf2.24xlarge")
    minutes = phase_minutes(plan, BASELINE)
    assert minutes == {"install": 3, "pull": 5, "checkpoint": 3, "compile": 55, "compile-cached": 6, "export": 57,
                       "export-cached": 8, "download": 3, "load": 4}
    assert {p.estimate for p in PHASES if p.estimate} <= set(minutes)
    # The predictions, not the ceilings: each well inside the share of the boot timeout it names.
    assert minutes["load"] * 60 < readiness_seconds(plan, BASELINE)
    assert minutes["install"] + minutes["pull"] <= PULL_MINUTES
    assert sum(minutes[k] for k in ("install", "pull", "export", "load")) < boot_minutes(plan, throughput=BASELINE)
    cached = boot_minutes(plan, throughput=BASELINE, exports=False)
    assert sum(minutes[k] for k in ("install", "pull", "download", "load")) < cached


def test_a_70b_export_boot_takes_hours_but_stays_within_cloudformation_limits():
    plan = _plan("llama-3.1-70b")
    assert 300 < boot_minutes(plan, throughput=BASELINE) <= MAX_CLOUDFORMATION_MINUTES


def test_a_70b_waits_longer_for_its_replicas_than_an_8b():
    small, large = _plan("llama-3.1-8b"), _plan("llama-3.1-70b")
    assert readiness_seconds(large, BASELINE) > readiness_seconds(small, BASELINE)
    assert readiness_seconds(large, default_throughput(large)) > readiness_seconds(small, default_throughput(small))


def test_the_limit_covers_reading_the_70b_shards_at_the_volume_throughput_before_the_load():
    plan = _plan("llama-3.1-70b")
    # 131 GiB of bf16 weights at gp3's included 125 MiB/s: 18 minutes before the NeuronCores see any.
    assert 17.9 < read_minutes(plan, BASELINE) < 18
    for throughput in (BASELINE, 449, 1000):
        reading = plan.weights_bytes / (throughput * 1024**2)
        assert readiness_seconds(plan, throughput) > reading + 45 * 60  # and the 45-minute load estimate
    assert readiness_seconds(plan, BASELINE) > readiness_seconds(plan, 1000)


def test_replicas_that_cannot_share_the_page_cache_each_read_the_weights():
    plan = _plan("llama-3.1-8b")
    assert read_minutes(plan, BASELINE) == pytest.approx(plan.weights_bytes / (BASELINE * 1024**2) / 60)
    starved = dataclasses.replace(plan, instance=dataclasses.replace(plan.instance, host_ram_gib=8))
    assert read_minutes(starved, BASELINE) == pytest.approx(len(plan.replicas) * read_minutes(plan, BASELINE))


@pytest.mark.parametrize("model", list(MODELS))
def test_the_readiness_limit_fits_after_pull_and_download_in_the_boot_ceiling_and_in_a_warm_pool_heartbeat(model):
    for instance in ("inf2.48xlarge", "trn1.32xlarge"):
        try:
            plan = _plan(model, instance)
        except ServingConfigError:
            continue
        billions = plan.model.parameter_count / 1e9
        for throughput in (BASELINE, default_throughput(plan)):
            limit = readiness_seconds(plan, throughput)
            for exports in (True, False):
                assert limit <= boot_minutes(plan, throughput=throughput, exports=exports) * 60
            before = PULL_MINUTES + DOWNLOAD_BASE_MINUTES + DOWNLOAD_MINUTES_PER_BILLION * billions
            assert before * 60 + limit <= boot_minutes(plan, throughput=throughput, exports=False) * 60 + 60
            # Started from a warm pool, the host waits for its replicas with no heartbeat.
            assert limit <= MAX_HEARTBEAT_TIMEOUT_SECONDS


def test_longest_generation_is_every_token_at_the_ceiling_plus_queueing():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", sequence_length=2048))
    assert longest_generation_seconds(plan) == 205 + 60


def test_the_default_shapes_give_470_seconds():
    assert longest_generation_seconds(plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))) == 470
