"""Context keys: strings from -c and JSON values from cdk.json, all validated at once."""

import pytest

from neuron_serving import ServingConfigError, StackSettings
from neuron_serving.settings import DEFAULT_INSTANCE_TYPE, DEFAULT_MODEL_ID

CERTIFICATE = "arn:aws:acm:us-east-1:111122223333:certificate/3f2a6c1e-8d4b-4e7a-9c2f-1b5d7e9a0c3d"


def _settings(**context):
    return StackSettings.from_context(context.get)


def test_defaults_need_no_context():
    settings = _settings()
    assert settings.request.model_id == DEFAULT_MODEL_ID
    assert settings.request.instance_type == DEFAULT_INSTANCE_TYPE
    assert settings.request.tensor_parallel is None
    assert settings.internet_facing is False
    assert settings.allowed_cidrs == ()
    assert settings.engine == "tgi" and settings.image is None and settings.dlami_parameter is None


def test_command_line_strings_become_typed_values():
    settings = _settings(tensor_parallel="4", batch_size="8", sequence_length="8192", max_input_tokens="6000",
                         internet_facing="true", allowed_cidrs="203.0.113.0/24, 198.51.100.7/32",
                         certificate_arn=CERTIFICATE)
    assert settings.request.tensor_parallel == 4
    assert (settings.request.batch_size, settings.request.sequence_length) == (8, 8192)
    assert settings.request.max_input_tokens == 6000
    assert settings.internet_facing is True
    assert settings.api_keys is True
    assert settings.allowed_cidrs == ("203.0.113.0/24", "198.51.100.7/32")


def test_cdk_json_values_keep_their_json_types():
    settings = _settings(tensor_parallel=8, internet_facing=False, allowed_cidrs=["10.1.0.0/16"])
    assert settings.request.tensor_parallel == 8
    assert settings.allowed_cidrs == ("10.1.0.0/16",)


def test_auto_degree_means_the_planner_chooses():
    assert _settings(tensor_parallel="auto").request.tensor_parallel is None


def test_allowed_cidrs_may_be_a_json_list_on_the_command_line():
    assert _settings(allowed_cidrs='["10.0.0.0/8"]').allowed_cidrs == ("10.0.0.0/8",)


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"tensor_parallel": "four"}, "tensor_parallel ('four') must be a whole number"),
        ({"batch_size": "8.5"}, "batch_size ('8.5') must be a whole number"),
        ({"internet_facing": "yes"}, "internet_facing ('yes') must be true or false"),
        ({"allowed_cidrs": "10.0.0.1/8"}, "allowed_cidrs ('10.0.0.1/8') is not a valid CIDR"),
        ({"allowed_cidrs": "[not json"}, "allowed_cidrs ('[not json') must be a list of strings"),
        ({"model_id": 7}, "model_id (7) must be a string"),
    ],
)
def test_bad_context_values_name_the_key(context, expected):
    with pytest.raises(ServingConfigError, match=None) as err:
        _settings(**context)
    assert expected in str(err.value)


def test_all_bad_context_values_are_reported_together():
    with pytest.raises(ServingConfigError) as err:
        _settings(batch_size="x", internet_facing="maybe")
    assert len(err.value.problems) == 2


def test_the_engine_is_chosen_by_name_and_anything_else_is_refused_naming_engine():
    assert _settings(engine="vllm").engine == "vllm"
    with pytest.raises(ServingConfigError, match=r"^engine \('nonsense'\) must be one of tgi, vllm, nxdi$"):
        _settings(engine="nonsense")


def test_a_setting_the_engine_has_no_use_for_is_refused_naming_it_and_the_engine():
    with pytest.raises(ServingConfigError, match=r"^max_input_tokens \(3000\) does not apply to engine vllm; "
                                                 r"it applies to engine tgi$"):
        _settings(engine="vllm", max_input_tokens="3000")
    assert _settings(engine="tgi", max_input_tokens="3000").request.max_input_tokens == 3000


DIGEST = "sha256:" + "0123456789abcdef" * 4
"""A well-formed digest (not the image's real one: the tests pull nothing)."""


def test_an_image_pinned_to_a_digest_is_kept_as_given():
    image = f"ghcr.io/huggingface/optimum-neuron-vllm:0.4.5@{DIGEST}"
    assert _settings(engine="vllm", image=f" {image} ").image == image


@pytest.mark.parametrize(("context", "expected"), [
    ({"image": "ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@sha256:ABC"},
     "image ('ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@sha256:ABC') has a malformed digest "
     "('sha256:ABC'): a pinned image is a known image followed by @sha256:<64 lowercase hex digits>"),
    ({"image": f"ghcr.io/huggingface/text-generation-inference@{DIGEST}"},
     f"image ('ghcr.io/huggingface/text-generation-inference@{DIGEST}') pins a digest without a tag"),
    ({"image": f"ghcr.io/huggingface/text-generation-inference:3.3.4-neuron@{DIGEST}"},
     f"image ('ghcr.io/huggingface/text-generation-inference:3.3.4-neuron@{DIGEST}') is not a TGI serving image"),
    ({"engine": "vllm", "image": f"ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@{DIGEST}"},
     f"image ('ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@{DIGEST}') is not a vLLM serving image"),
])
def test_a_bad_image_is_refused_naming_image_with_the_other_problems(context, expected):
    with pytest.raises(ServingConfigError) as err:
        _settings(batch_size="x", **context)
    assert len(err.value.problems) == 2
    assert err.value.problems[1].startswith(expected)


# --- the degree chosen by an objective ---------------------------------------------------------------

LLAMA_31_48XL = {"model_id": "meta-llama/Meta-Llama-3.1-8B-Instruct", "instance_type": "inf2.48xlarge",
                 "tensor_parallel": "auto"}


def test_objective_and_constraints_are_read_as_numbers():
    settings = _settings(**LLAMA_31_48XL, objective="latency", max_itl_ms="40", max_ttft_ms="2000",
                         min_tokens_per_second="100", workload_input_tokens="2000", workload_output_tokens="300")
    assert settings.objective == "latency"
    assert (settings.constraints.max_itl_ms, settings.constraints.max_ttft_ms) == (40.0, 2000.0)
    assert settings.constraints.min_tokens_per_second == 100.0
    assert (settings.workload.input_tokens, settings.workload.output_tokens) == (2000, 300)


def test_without_an_objective_the_smallest_fitting_degree_is_kept():
    plan, why = _settings(**LLAMA_31_48XL).layout()
    assert plan.degree == 2
    assert "smallest degree that fits" in why


def test_latency_and_cost_objectives_choose_different_degrees():
    latency, why = _settings(**LLAMA_31_48XL, objective="latency").layout()
    cost, _ = _settings(**LLAMA_31_48XL, objective="cost").layout()
    assert latency.degree > cost.degree
    assert why


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"objective": "speed"}, "objective ('speed') must be one of latency, throughput, cost, goodput"),
        ({"objective": "goodput"}, "rate (None) is required with objective=goodput"),
        ({"objective": "cost", "rate": "2"}, "rate (2.0) applies only with -c objective=goodput"),
        ({"p99_ttft_ms": "300"}, "p99_ttft_ms (300.0) applies only with -c objective=goodput"),
        ({"objective": "goodput", "rate": "-1"}, "rate (-1.0) must be a positive number"),
        ({"objective": "goodput", "rate": "2", "p99_ttft_ms": "10"}, "rate (2.0) cannot be served as asked"),
        ({"objective": "goodput", "rate": "30"}, "fleet ('instance') is one instance, but objective=goodput needs"),
        ({"objective": "latency", "tensor_parallel": "8"},
         "objective ('latency') applies only with tensor_parallel=auto: tensor_parallel 8 leaves no degree"),
        ({"max_itl_ms": "30"}, "max_itl_ms (30.0) is a constraint on the layout the objective chooses"),
        ({"objective": "cost", "min_tokens_per_second": "0"}, "min_tokens_per_second (0.0) must be a positive number"),
        ({"workload_input_tokens": "5000"}, "workload_input_tokens (5000) must be at most max_input_tokens (3072)"),
        ({"workload_output_tokens": "0"}, "workload_output_tokens (0) must be an integer of at least 1"),
        ({"objective": "cost", "max_ttft_ms": "fast"}, "max_ttft_ms ('fast') must be a number"),
    ],
)
def test_bad_objective_settings_name_the_key(context, expected):
    with pytest.raises(ServingConfigError) as err:
        _settings(**{**LLAMA_31_48XL, **context})
    assert expected in str(err.value)


def test_an_objective_chooses_the_batch_and_sequence_unless_they_are_given():
    chosen, why = _settings(**LLAMA_31_48XL, objective="cost").layout()
    assert (chosen.batch_size, chosen.sequence_length) == (48, 1024)
    assert why.startswith("the lowest price per million output tokens")
    given, _ = _settings(**LLAMA_31_48XL, objective="cost", batch_size="8").layout()
    assert given.batch_size == 8 and given.sequence_length == 1024
    default, _ = _settings(**LLAMA_31_48XL).layout()
    assert (default.batch_size, default.sequence_length) == (4, 4096)


def test_goodput_sizes_the_fleet_to_the_instances_the_rate_needs():
    settings = _settings(**LLAMA_31_48XL, objective="goodput", rate="30", p99_ttft_ms="2000", fleet="asg")
    load = settings.load
    assert load is not None and load.instances > 1 and load.ttft_p99_s <= 2.0
    assert settings.capacity() == (load.instances, load.instances, None)
    bigger = _settings(**LLAMA_31_48XL, objective="goodput", rate="30", p99_ttft_ms="2000", fleet="asg",
                       min_capacity="1", max_capacity="40")
    assert bigger.capacity() == (load.instances, 40, None)
    assert _settings(**LLAMA_31_48XL).capacity() == (1, 2, None)


def test_constraints_no_degree_meets_fail_naming_the_constraint():
    with pytest.raises(ServingConfigError, match=r"max_itl_ms \(0.5\) cannot be met on inf2.48xlarge"):
        _settings(**LLAMA_31_48XL, objective="latency", max_itl_ms="0.5")


def test_alarm_thresholds_out_of_range_are_refused_by_the_settings_all_at_once():
    with pytest.raises(ServingConfigError) as err:
        StackSettings(alarm_5xx_percent=500, alarm_disk_percent=-3, alarm_p99_latency_seconds=0)
    assert err.value.problems == (
        "alarm_5xx_percent (500) must be a number above 0 and at most 100",
        "alarm_p99_latency_seconds (0) must be a number above 0 and at most 3600",
        "alarm_disk_percent (-3) must be a number above 0 and at most 100",
    )


def test_fleet_sizes_warm_pool_and_scaling_targets_are_refused_by_the_settings_all_at_once():
    with pytest.raises(ServingConfigError) as err:
        StackSettings(fleet="asg", min_capacity=3, max_capacity=1, desired_capacity=9, warm_pool=True,
                      target_requests_per_minute=0)
    assert err.value.problems == (
        "min_capacity (3) must be <= max_capacity (1)",
        "desired_capacity (9) must lie between min_capacity (3) and max_capacity (1)",
        "warm_pool (True) needs max_capacity of at least 2 (got 1): a single instance has nothing to warm",
        "target_requests_per_minute (0) must be at least 1",
    )


def test_internet_facing_without_certificate_nor_cidrs_reports_both():
    with pytest.raises(ServingConfigError) as err:
        StackSettings(internet_facing=True)
    assert [p.split(" (")[0] for p in err.value.problems] == ["certificate_arn", "allowed_cidrs"]
    assert "allowed_cidrs ([]) must list who may connect when internet_facing is true" in str(err.value)


def test_internet_facing_into_an_existing_vpc_without_cidrs_names_allowed_cidrs_once():
    with pytest.raises(ServingConfigError) as err:
        StackSettings(internet_facing=True, certificate_arn=CERTIFICATE, vpc_id="vpc-0123456789abcdef0",
                      availability_zones=("us-east-1a",), private_subnet_ids=("subnet-0123456789abcdef0",),
                      public_subnet_ids=("subnet-0123456789abcdef1",))
    assert [p.split(" (")[0] for p in err.value.problems] == ["allowed_cidrs"]


def test_the_boot_timeout_range_is_worded_once_for_the_setting():
    with pytest.raises(ServingConfigError, match=r"^boot_timeout_minutes \(900\) must be 1 to 720 minutes "
                                                 r"\(CloudFormation waits at most 12 hours for signals\)$"):
        StackSettings(boot_timeout_minutes=900)


def test_an_objective_chooses_only_batch_sizes_the_engine_serves():
    # optimum-neuron's vLLM serves batches of 2 and more; the latency objective would take 1 otherwise.
    assert _settings(**LLAMA_31_48XL, objective="latency").plan().batch_size == 1
    assert _settings(**LLAMA_31_48XL, objective="latency", engine="vllm").plan().batch_size == 2


def test_nxdi_keeps_a_prefix_cache_by_default_and_the_other_engines_none():
    assert (_settings(engine="nxdi").request.prefix_cache_block_size,
            _settings(engine="nxdi").request.prefix_cache_blocks) == (32, None)
    given = _settings(engine="nxdi", prefix_cache_block_size="16", prefix_cache_blocks="4096").request
    assert (given.prefix_cache_block_size, given.prefix_cache_blocks) == (16, 4096)
    assert _settings(engine="nxdi", prefix_caching="false").request.prefix_cache_block_size is None
    assert _settings(engine="tgi").request.prefix_cache_block_size is None
    assert _settings(engine="vllm", prefix_caching="false").request.prefix_cache_block_size is None


def test_a_prefix_cache_where_it_cannot_be_is_refused_naming_the_setting():
    with pytest.raises(ServingConfigError, match=r"^prefix_caching \(True\) is not served by engine tgi; engine nxdi "
                                                 r"serves it$"):
        _settings(engine="tgi", prefix_caching="true")
    with pytest.raises(ServingConfigError, match=r"^prefix_cache_block_size \(16\) does not apply to engine vllm; "
                                                 r"it applies to engine nxdi$"):
        _settings(engine="vllm", prefix_cache_block_size="16")
    with pytest.raises(ServingConfigError, match=r"^prefix_cache_blocks \(900\) applies only with prefix_caching, "
                                                 r"which is false$"):
        _settings(engine="nxdi", prefix_caching="false", prefix_cache_blocks="900")


def test_the_tool_call_parser_reaches_the_request_and_only_nxdi_takes_one():
    assert _settings(engine="nxdi", tool_call_parser="hermes").request.tool_call_parser == "hermes"
    with pytest.raises(ServingConfigError, match=r"^tool_call_parser \('hermes'\) does not apply to engine tgi; "
                                                 r"it applies to engine nxdi$"):
        _settings(engine="tgi", tool_call_parser="hermes")


def test_int8_weights_reach_the_request_with_nxdi_and_are_refused_naming_the_engine_that_makes_them():
    assert _settings(engine="nxdi", quantization="int8").request.quantization == "int8"
    assert _settings(engine="nxdi").request.quantization is None
    with pytest.raises(ServingConfigError) as err:
        _settings(engine="tgi", quantization="int8")
    assert [str(p) for p in err.value.problems] == [
        "quantization ('int8') is not made by engine tgi; engine nxdi makes it"]
    with pytest.raises(ServingConfigError, match=r"^quantization \('fp8'\) must be one of none, int8$"):
        _settings(engine="nxdi", quantization="fp8")


def test_nxdi_whose_compiles_have_no_hub_cache_refuses_its_settings():
    with pytest.raises(ServingConfigError, match=r"^hub_compile_cache_repo \('me/cache'\) does not apply to engine "
                                                 r"nxdi; it applies to engine tgi, vllm$"):
        _settings(engine="nxdi", hub_compile_cache_repo="me/cache")
    with pytest.raises(ServingConfigError, match=r"^hub_compile_cache \(False\) does not apply to engine nxdi"):
        _settings(engine="nxdi", hub_compile_cache="false")


def test_an_objective_with_nxdis_prefix_cache_chooses_among_the_sequences_and_batches_it_compiles():
    # A short workload would let the objective choose 256 tokens, below a prefix cache's first bucket.
    settings = _settings(engine="nxdi", objective="latency", workload_input_tokens="100", workload_output_tokens="50")
    assert settings.space.min_sequence_length == 512
    assert settings.request.prefix_cache_block_size == 32
    assert _settings(engine="tgi", objective="latency").space.min_sequence_length == 1
    assert _settings(engine="nxdi", prefix_caching="false", objective="latency").space.min_sequence_length == 1


def test_an_eagle_draft_reaches_the_request_with_nxdi_and_is_refused_elsewhere_or_without_its_model():
    request = _settings(engine="nxdi", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B",
                        speculative_tokens=3, prefix_caching=False).request
    assert (request.speculative_model, request.speculative_tokens) == ("yuhuili/EAGLE-LLaMA3-Instruct-8B", 3)
    assert _settings(engine="nxdi").request.speculative_model is None
    with pytest.raises(ServingConfigError) as err:
        _settings(engine="tgi", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B")
    assert "speculative_model ('yuhuili/EAGLE-LLaMA3-Instruct-8B') is not served by engine tgi; engine nxdi serves it" \
        in [str(p) for p in err.value.problems]
    with pytest.raises(ServingConfigError, match=r"^speculative_tokens \(3\) applies only with speculative_model$"):
        _settings(engine="nxdi", speculative_tokens=3)


def test_a_workloads_cached_prefix_and_draft_acceptance_reach_its_predictions_and_are_checked():
    assert _settings(engine="nxdi", workload_input_tokens=1024, workload_prefix_tokens=900).workload.prefix_tokens \
        == 900
    settings = _settings(engine="nxdi", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B", workload_acceptance=0.6,
                         prefix_caching=False)
    assert settings.workload.acceptance == 0.6
    with pytest.raises(ServingConfigError) as err:
        _settings(engine="nxdi", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B")
    assert [str(p) for p in err.value.problems] == [
        "speculative_model ('yuhuili/EAGLE-LLaMA3-Instruct-8B') cannot be served with a prefix cache: the vllm-neuron "
        "plugin writes a step's speculated tokens to the slots after the last one's, past the end of its block into "
        "another's; set prefix_caching=false"]
    with pytest.raises(ServingConfigError, match=r"^workload_prefix_tokens \(100\) applies only with "
                                                 r"prefix_caching, which engine tgi does not serve$"):
        _settings(workload_prefix_tokens=100)
    with pytest.raises(ServingConfigError) as err:
        _settings(engine="nxdi", workload_acceptance=0.6, workload_prefix_tokens=600)
    assert [str(p) for p in err.value.problems] == [
        "workload_prefix_tokens (600) must be at most input_tokens (512): the prefix is part of the prompt",
        "workload_acceptance (0.6) applies only with speculative_model"]
