"""Every invalid configuration fails before deployment, naming the setting, the value and what is
allowed."""

import json

import pytest

from neuron_serving.plan import ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.layout import compile_memory_problem


def _error(**fields) -> str:
    request = {"model_id": "llama-3-8b", "instance_type": "inf2.24xlarge", **fields}
    with pytest.raises(ServingConfigError) as err:
        plan_serving(ServingRequest(**request))
    assert isinstance(err.value, ValueError)
    return str(err.value)


@pytest.mark.parametrize("instance_type", ["inf2.2xlarge", "p4d.24xlarge", "m5.large", "trn2.48xlarge", ""])
def test_unknown_or_non_neuron_instance_type_lists_the_catalog(instance_type):
    message = _error(instance_type=instance_type)
    assert f"instance_type ({instance_type!r}) is not a supported Neuron instance type" in message
    assert "inf2.xlarge, inf2.8xlarge, inf2.24xlarge, inf2.48xlarge, trn1.2xlarge" in message


def test_odd_degree_names_tensor_parallel_and_the_allowed_degrees():
    message = _error(tensor_parallel=5)
    assert message == (
        "tensor_parallel (5) must be one of 2, 4, 6, 8, 10, 12 on inf2.24xlarge "
        "(12 NeuronCores; whole devices of 2 NeuronCores)"
    )


def test_degree_above_the_instance_cores_is_refused():
    assert "tensor_parallel (4) must be one of 2 on inf2.8xlarge" in _error(instance_type="inf2.8xlarge",
                                                                            tensor_parallel=4)


def test_trn1_accepts_only_its_runtime_topologies():
    message = _error(instance_type="trn1.32xlarge", tensor_parallel=4)
    assert "tensor_parallel (4) must be one of 2, 8, 16, 32 on trn1.32xlarge" in message
    assert "trn1 runtime topologies" in message


@pytest.mark.parametrize("degree", [0, -2, 1])
def test_degree_below_two_is_refused(degree):
    assert f"tensor_parallel ({degree}) must be one of" in _error(tensor_parallel=degree)


def test_model_that_fits_at_no_degree_says_so():
    message = _error(instance_type="inf2.8xlarge", batch_size=64, sequence_length=8192)
    assert message.startswith("model_id ('llama-3-8b') fits at no tensor_parallel degree on inf2.8xlarge")
    assert "lower batch_size or sequence_length" in message


@pytest.mark.parametrize("field", ["batch_size", "sequence_length"])
@pytest.mark.parametrize("value", [0, -1])
def test_shapes_below_one_are_refused(field, value):
    assert f"{field} ({value}) must be an integer of at least 1" in _error(**{field: value})


def test_max_input_tokens_must_leave_room_for_output():
    message = _error(sequence_length=4096, max_input_tokens=4096)
    assert "max_input_tokens (4096) must be below sequence_length (4096)" in message


def test_max_input_tokens_below_one_is_refused():
    assert "max_input_tokens (0) must be an integer of at least 1" in _error(max_input_tokens=0)


def test_unknown_dtype_lists_the_supported_ones():
    assert "dtype ('fp8') must be one of bf16, fp16" in _error(dtype="fp8")


def test_unknown_model_without_config_points_at_model_config():
    message = _error(model_id="acme/secret-model-9b")
    assert "model_id ('acme/secret-model-9b') is not in the model catalog; give model_config" in message


def test_sequence_longer_than_the_model_positions_is_refused():
    assert "sequence_length (8192) exceeds the 4096 positions llama-2-7b supports" in _error(
        model_id="meta-llama/Llama-2-7b-hf", sequence_length=8192
    )


def test_a_host_too_small_to_export_an_8b_model_still_serves_it_and_says_it_cannot_compile_it():
    plan = plan_serving(ServingRequest("llama-3-8b", "inf2.xlarge"))
    assert len(plan.replicas) == 1
    message = compile_memory_problem(plan)
    assert message is not None
    assert message.startswith("instance_type ('inf2.xlarge') has 16 GiB of host memory; exporting llama-3-8b")
    assert message.endswith("let a builder instance compile it (builder_instance_type; NeuronExportBuilder), "
                            "or serve an export built elsewhere (prebuilt_export); this host then never compiles")
    trn1 = compile_memory_problem(plan_serving(ServingRequest("llama-3-8b", "trn1.2xlarge")))
    assert trn1 is not None and "32 GiB of host memory" in trn1
    assert compile_memory_problem(plan_serving(ServingRequest("llama-3-8b", "inf2.8xlarge"))) is None


def test_router_port_among_replica_ports_is_refused():
    assert "router_port (8083) must not fall among the replica ports" in _error(router_port=8083)


def test_port_out_of_range_is_refused():
    assert "first_replica_port (70000) must be a TCP port from 1 to 65535" in _error(first_replica_port=70000)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ServingConfigError) as err:
        plan_serving(ServingRequest("llama-3-8b", "inf2.24xlarge", batch_size=0, dtype="int4", tensor_parallel=3))
    assert len(err.value.problems) == 3
    assert str(err.value).startswith("invalid serving configuration:\n  - batch_size (0)")


def test_model_config_that_cannot_be_read_is_named(tmp_path):
    missing = tmp_path / "config.json"
    assert f"model_config ({str(missing)!r}) cannot be read" in _error(model_id="acme/x", model_config=str(missing))


def test_model_config_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    assert "is not valid JSON" in _error(model_id="acme/x", model_config=str(path))


def test_model_config_without_architecture_keys_lists_them(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    message = _error(model_id="acme/x", model_config=str(path))
    assert "model_config ('acme/x') lacks required keys: num_hidden_layers" in message


def test_model_config_of_an_unsupported_architecture_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "hidden_size": 768, "num_hidden_layers": 12,
                                "num_attention_heads": 12, "intermediate_size": 3072,
                                "vocab_size": 50257, "max_position_embeddings": 1024}))
    supported = "granite, llama, mistral, mixtral, phi3, qwen2, qwen3"
    assert f"model_type ('gpt2') is not supported; supported: {supported}" in _error(
        model_id="acme/x", model_config=str(path)
    )
