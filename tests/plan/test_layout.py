"""The planner: published layouts, the automatic degree, device groups and memory estimates."""

import json

import pytest

from neuron_serving.plan import (
    MODELS,
    ServingConfigError,
    ServingRequest,
    layout_document,
    plan_serving,
    request_from_layout,
)
from neuron_serving.plan.layout import GIB, OVERHEAD_FRACTION


def test_llama31_8b_batch8_seq16512_tp8_on_inf2_48xlarge_is_3_replicas_of_4_devices():
    plan = plan_serving(
        ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "inf2.48xlarge", batch_size=8,
                       sequence_length=16512, max_input_tokens=16000, tensor_parallel=8)
    )
    assert [r.devices for r in plan.replicas] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]


def test_llama31_8b_batch32_seq4096_tp8_on_trn1_32xlarge_is_4_replicas():
    plan = plan_serving(
        ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "trn1.32xlarge", batch_size=32,
                       sequence_length=4096, tensor_parallel=8)
    )
    assert len(plan.replicas) == 4
    assert plan.replicas[-1].devices == (12, 13, 14, 15)


def test_70b_does_not_fit_at_degree_8_on_inf2_48xlarge():
    with pytest.raises(ValueError, match=r"tensor_parallel \(8\) is too small for llama-3.1-70b"):
        plan_serving(ServingRequest("meta-llama/Llama-3.1-70B-Instruct", "inf2.48xlarge", tensor_parallel=8))


def test_70b_fits_at_degree_24_on_inf2_48xlarge():
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-70B-Instruct", "inf2.48xlarge", tensor_parallel=24))
    assert plan.memory.fits
    assert [r.devices for r in plan.replicas] == [tuple(range(12))]


def test_without_a_degree_the_smallest_fitting_one_is_chosen_for_the_most_replicas():
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    assert plan.degree == 2
    assert len(plan.replicas) == 6


def test_automatic_degree_skips_degrees_that_do_not_fit():
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-70B-Instruct", "inf2.48xlarge"))
    assert plan.degree == 12
    assert len(plan.replicas) == 2


def test_inf2_24xlarge_at_degree_4_has_3_replicas_of_2_devices():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", tensor_parallel=4))
    assert [r.devices for r in plan.replicas] == [(0, 1), (2, 3), (4, 5)]


def test_each_replica_owns_device_n_cores_2n_and_2n_plus_1():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.48xlarge", tensor_parallel=8))
    assert plan.replicas[1].cores == tuple(range(8, 16))
    assert plan.replicas[1].device_paths == ("/dev/neuron4", "/dev/neuron5", "/dev/neuron6", "/dev/neuron7")


def test_replica_device_groups_are_contiguous_and_disjoint_for_every_degree():
    for degree in (2, 4, 6, 8, 10, 12, 24):
        plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.48xlarge", tensor_parallel=degree))
        seen = [d for r in plan.replicas for d in r.devices]
        assert len(seen) == len(set(seen))
        for replica in plan.replicas:
            assert list(replica.devices) == list(range(replica.devices[0], replica.devices[0] + degree // 2))


def test_a_degree_that_does_not_divide_the_devices_leaves_the_rest_idle():
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.48xlarge", tensor_parallel=10))
    assert len(plan.replicas) == 2
    assert plan.idle_devices == (10, 11)
    assert plan.describe().endswith("idle: neuron10-11")


def test_replicas_get_consecutive_ports_after_the_router():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.48xlarge", tensor_parallel=8))
    assert plan.router_port == 8080
    assert [r.port for r in plan.replicas] == [8081, 8082, 8083]
    assert [r.process_tag for r in plan.replicas] == ["replica-0", "replica-1", "replica-2"]


def test_memory_estimate_is_weights_plus_kv_cache_plus_stated_overhead():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.48xlarge", batch_size=8, sequence_length=4096,
                                       tensor_parallel=8))
    model = MODELS["llama-3-8b"]
    weights = model.parameter_count * 2 // 8
    kv = 2 * 32 * 1 * 128 * 2 * 8 * 4096  # K and V, layers, 1 of 8 KV heads per core, head dim, bf16
    assert plan.memory.weights == weights
    assert plan.memory.kv_cache == kv
    assert plan.memory.overhead == int((weights + kv) * OVERHEAD_FRACTION)
    assert plan.memory.available == 16 * GIB


def test_serving_layout_names_devices_cores_and_ports():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", tensor_parallel=4))
    assert plan.describe() == (
        "replica-0: neuron0-1 (cores 0-3) on port 8081; "
        "replica-1: neuron2-3 (cores 4-7) on port 8082; "
        "replica-2: neuron4-5 (cores 8-11) on port 8083"
    )


def test_root_volume_holds_image_weights_and_export_and_is_512_gib_on_trainium():
    inf2 = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge"))
    trn1 = plan_serving(ServingRequest("llama-3-8b", "trn1.32xlarge", tensor_parallel=8))
    big = plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge"))
    assert inf2.root_volume_gib == 150
    assert trn1.root_volume_gib == 512
    assert big.root_volume_gib == 100 + 3 * 132 + 4  # 132 GiB of bf16 weights, rounded up to 10


def test_default_max_input_tokens_is_three_quarters_of_the_sequence():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", sequence_length=4096))
    assert plan.max_input_tokens == 3072


def test_a_layout_document_reads_back_as_the_same_plan():
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "inf2.48xlarge", batch_size=8,
                                       sequence_length=16512, tensor_parallel=8))
    again = plan_serving(request_from_layout(json.loads(json.dumps(layout_document(plan)))))
    assert (again.degree, again.replicas, again.max_input_tokens) == (8, plan.replicas, plan.max_input_tokens)


def test_a_layout_document_missing_keys_names_them():
    with pytest.raises(ServingConfigError, match=r"ServingPlan .* lacks tensor_parallel, dtype"):
        request_from_layout({"model_id": "llama-3-8b", "instance_type": "inf2.xlarge", "batch_size": 4,
                             "sequence_length": 4096, "max_input_tokens": 3072})
