"""The vLLM engine: what each replica is told, what its export must hold, and what it refuses."""

import dataclasses
import json

import pytest

from neuron_serving.plan import ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.engines import ENGINES, engine
from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5, VLLM


def _plan(**fields):
    return plan_serving(ServingRequest(**{"model_id": "NousResearch/Meta-Llama-3-8B-Instruct",
                                          "instance_type": "inf2.48xlarge", "tensor_parallel": 8, "batch_size": 8,
                                          "sequence_length": 4096, **fields}))


def test_engines_are_found_by_name_and_anything_else_is_refused_naming_engine():
    assert engine("tgi") is TGI and engine("vllm") is VLLM
    assert list(ENGINES) == ["tgi", "vllm", "nxdi"]
    with pytest.raises(ServingConfigError, match=r"^engine \('nonsense'\) must be one of tgi, vllm, nxdi$"):
        engine("nonsense")


def test_each_vllm_server_gets_the_export_its_shapes_and_its_process_tag_through_the_images_entry_point():
    plan = _plan()
    env = VLLM.replica_environment(plan, OPTIMUM_NEURON_VLLM_0_4_5, plan.replicas[2], "/models/x")
    assert env == {
        "SM_ON_MODEL": "/models/x",
        "SM_ON_SERVED_MODEL_NAME": "NousResearch/Meta-Llama-3-8B-Instruct",
        "SM_ON_TENSOR_PARALLEL_SIZE": "8",
        "SM_ON_BATCH_SIZE": "8",
        "SM_ON_SEQUENCE_LENGTH": "4096",
        "SM_ON_DISABLE_UVICORN_ACCESS_LOG": "",
        "SM_ON_DISABLE_FASTAPI_DOCS": "",
        "NEURON_PROCESS_TAG": "replica-2",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_HOST_IP": "127.0.0.1",
    }


def test_the_export_passes_the_degree_as_tensor_parallel_size_and_no_dtype():
    args = VLLM.export_arguments(_plan(), OPTIMUM_NEURON_VLLM_0_4_5, "/models/k.src", "/models/k.tmp")
    assert args == ("export", "neuron", "--model", "/models/k.src", "--task", "text-generation",
                    "--batch_size", "8", "--sequence_length", "4096", "--tensor_parallel_size", "8", "/models/k.tmp")


def test_an_export_must_record_what_serve_checks_before_loading():
    expect = VLLM.export_expectations(_plan(tensor_parallel=4), OPTIMUM_NEURON_VLLM_0_4_5)
    assert expect["fields"] == {"batch_size": 8, "sequence_length": 4096, "tp_degree": 4, "torch_dtype": "bfloat16",
                                "continuous_batching": True, "target": "trn1", "optimum_neuron_version": "0.4.5",
                                "neuronxcc_version": "2.21.33363.0+82129205"}
    # serve compares the whole string; the host, not knowing the label from the image itself, the release.
    assert expect["compare"] == {"neuronxcc_version": "release"}
    assert [f for f in expect["files"] if f.startswith("checkpoint/")] == [
        f"checkpoint/weights/tp{r}_sharded_checkpoint.safetensors" for r in range(4)]


def test_the_readiness_probe_is_a_one_token_completion_of_the_served_model():
    probe = VLLM.readiness(_plan())
    assert probe.path == "/v1/completions"
    assert json.loads(probe.body) == {"model": "NousResearch/Meta-Llama-3-8B-Instruct", "prompt": "ping",
                                      "max_tokens": 1}


def test_keys_name_the_engine_so_the_two_engines_never_share_an_artifact():
    plan = _plan()
    tgi, vllm = TGI.export_key(plan, TGI_3_3_5), VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    assert tgi.startswith("v4-tgi-") and vllm.startswith("v4-vllm-") and tgi[7:-16] == vllm[8:-16]


@pytest.mark.parametrize(("fields", "message"), [
    ({"batch_size": 1}, r"^batch_size \(1\) must be at least 2 with engine vllm: optimum-neuron compiles continuous "),
    ({"dtype": "fp16"}, r"^dtype \('fp16'\) must be the checkpoint's own dtype \(bfloat16\) with engine vllm: .*; "
                        r"use -c dtype=bf16$"),
    ({"model_id": "meta-llama/Llama-2-7b-chat-hf"}, r"^dtype \('bf16'\) must be the checkpoint's own dtype "
                                                     r"\(float16\) .*; use -c dtype=fp16$"),
    ({"model_id": "mistralai/Mixtral-8x7B-Instruct-v0.1", "tensor_parallel": 24},
     r"^model_id \('mistralai/Mixtral-8x7B-Instruct-v0.1'\) is a mixtral model, which optimum-neuron 0.4.5 in "
     r"ghcr.io/huggingface/optimum-neuron-vllm:0.4.5 cannot export and serve; it does granite, llama, "),
])
def test_what_optimum_neurons_vllm_cannot_serve_is_refused_naming_the_setting(fields, message):
    with pytest.raises(ServingConfigError, match=message):
        VLLM.serving_image(_plan(**fields), OPTIMUM_NEURON_VLLM_0_4_5.reference)


def test_a_config_without_a_dtype_is_refused_naming_model_config(tmp_path):
    config = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
              "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256,
              "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = _plan(model_id="org/tiny", model_config=str(tmp_path / "config.json"), instance_type="inf2.xlarge",
                 tensor_parallel=2)
    with pytest.raises(ServingConfigError, match=r"^model_config \('org/tiny'\) has no torch_dtype"):
        VLLM.serving_image(plan, OPTIMUM_NEURON_VLLM_0_4_5.reference)
    (tmp_path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    plan = _plan(model_id="org/tiny", model_config=str(tmp_path / "config.json"), instance_type="inf2.xlarge",
                 tensor_parallel=2)
    assert VLLM.serving_image(plan, OPTIMUM_NEURON_VLLM_0_4_5.reference) is OPTIMUM_NEURON_VLLM_0_4_5


def test_the_tgi_image_is_not_a_vllm_image():
    with pytest.raises(ServingConfigError, match=r"^image \('ghcr.io/huggingface/text-generation-inference:3.3.5-"
                                                 r"neuron'\) is not a vLLM serving image .*; known: ghcr.io/"
                                                 r"huggingface/optimum-neuron-vllm:0.4.5 \(each may be pinned by "
                                                 r"digest: <image>@sha256:<64 lowercase hex digits>\)$"):
        VLLM.serving_image(_plan(), TGI_3_3_5.reference)


DIGEST = "sha256:" + "0123456789abcdef" * 4
"""A well-formed digest (not the image's real one: the tests pull nothing)."""


def test_the_vllm_image_pinned_to_a_digest_is_served_by_the_pinned_reference_with_the_tags_facts():
    pinned = VLLM.serving_image(_plan(), f"{OPTIMUM_NEURON_VLLM_0_4_5.reference}@{DIGEST}")
    assert pinned.reference == f"ghcr.io/huggingface/optimum-neuron-vllm:0.4.5@{DIGEST}"
    assert dataclasses.replace(pinned, reference=OPTIMUM_NEURON_VLLM_0_4_5.reference) == OPTIMUM_NEURON_VLLM_0_4_5
    assert VLLM.export_key(_plan(), pinned) != VLLM.export_key(_plan(), OPTIMUM_NEURON_VLLM_0_4_5)


def test_the_tgi_image_pinned_to_a_digest_is_not_a_vllm_image_either():
    with pytest.raises(ServingConfigError, match=r"^image \('ghcr.io/huggingface/text-generation-inference:3.3.5-"
                                                 r"neuron@sha256:[0-9a-f]{64}'\) is not a vLLM serving image .*; "
                                                 r"known: ghcr.io/huggingface/optimum-neuron-vllm:0.4.5 \(each may be "
                                                 r"pinned"):
        VLLM.serving_image(_plan(), f"{TGI_3_3_5.reference}@{DIGEST}")


def test_a_vllm_digest_without_the_tag_is_refused_asking_for_the_vllm_tag():
    with pytest.raises(ServingConfigError, match=r"^image \('ghcr.io/huggingface/optimum-neuron-vllm@sha256:[0-9a-f]"
                                                 r"{64}'\) pins a digest without a tag, .*; include the tag: "
                                                 r"ghcr.io/huggingface/optimum-neuron-vllm:0.4.5@sha256:[0-9a-f]{64}$"):
        VLLM.image(f"ghcr.io/huggingface/optimum-neuron-vllm@{DIGEST}")


def test_each_engine_has_a_source_for_every_replica_metric_of_the_catalog():
    from neuron_serving.plan.metrics import METRICS
    replica = {m.name for m in METRICS if m.source == "replica"}
    for e in ENGINES.values():
        assert set(e.metrics.published) == replica, e.name


def test_openai_requests_name_the_model_vllm_lists_and_tgi_is_named_tgi():
    models = {"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model"}]}

    assert VLLM.openai_model(models) == "meta-llama/Llama-3.1-8B-Instruct"
    assert VLLM.openai_model({"object": "list", "data": []}) is None
    assert VLLM.openai_model(None) is None
    # Any other name TGI hands its backend as a LoRA adapter to load.
    assert TGI.openai_model({"model_id": "/var/lib/neuron-serving/exports/k"}) == "tgi"
