"""The model catalog and Hugging Face config.json reading."""

import json

import pytest

from neuron_serving.plan import MODELS, ServingRequest, plan_serving, resolve_model
from neuron_serving.plan.models import ModelSpec

# Parameter counts as published on each model card, in billions.
PUBLISHED = {
    "llama-2-7b": 6.74, "llama-2-13b": 13.02, "llama-2-70b": 68.98, "llama-3-8b": 8.03,
    "llama-3-70b": 70.55, "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.55, "llama-3.2-1b": 1.24,
    "llama-3.2-3b": 3.21, "mistral-7b": 7.24, "mistral-7b-v0.3": 7.25,
}

LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_matches_the_published_figure(name):
    assert MODELS[name].parameter_count / 1e9 == pytest.approx(PUBLISHED[name], abs=0.01)


def test_the_catalog_covers_the_popular_architectures():
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "llama-3-70b",
            "llama-3.1-8b", "llama-3.1-70b", "mistral-7b"} <= set(MODELS)


def test_models_resolve_by_hub_id_case_insensitively_and_by_catalog_name():
    assert resolve_model("meta-llama/llama-3.1-8b-instruct") is MODELS["llama-3.1-8b"]
    assert resolve_model("llama-3.1-8b") is MODELS["llama-3.1-8b"]


def test_a_local_config_json_describes_a_model_outside_the_catalog(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    spec = resolve_model("acme/my-llama-finetune", str(path))
    assert spec == MODELS["llama-3-8b"].__class__(**{**MODELS["llama-3-8b"].__dict__, "name": spec.name})
    assert spec.parameter_count == MODELS["llama-3-8b"].parameter_count


def test_a_model_from_config_json_is_planned_like_a_catalog_model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    custom = plan_serving(ServingRequest("acme/my-llama", "inf2.48xlarge", model_config=str(path)))
    catalog = plan_serving(ServingRequest("llama-3-8b", "inf2.48xlarge"))
    assert (custom.degree, len(custom.replicas), custom.memory) == (catalog.degree, len(catalog.replicas),
                                                                    catalog.memory)


def test_missing_num_key_value_heads_means_multi_head_attention():
    config = {**LLAMA3_8B_CONFIG}
    del config["num_key_value_heads"]
    assert ModelSpec.from_hf_config(config, "mha").num_kv_heads == 32


def test_kv_heads_stay_at_least_one_per_core_beyond_the_kv_head_count():
    spec = MODELS["llama-3-8b"]
    assert spec.kv_cache_bytes_per_token(2, 8) == spec.kv_cache_bytes_per_token(2, 24)
    assert spec.kv_cache_bytes_per_token(2, 2) == 4 * spec.kv_cache_bytes_per_token(2, 8)


def test_kv_heads_must_divide_attention_heads():
    with pytest.raises(ValueError, match=r"num_key_value_heads \(7\) must divide num_attention_heads \(32\)"):
        ModelSpec.from_hf_config({**LLAMA3_8B_CONFIG, "num_key_value_heads": 7}, "odd")
