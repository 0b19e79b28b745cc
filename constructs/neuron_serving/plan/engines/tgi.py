"""Hugging Face TGI's Neuron backend: the engine users asked for, in maintenance mode since
December 2025 (its README), its Neuron image frozen at 3.3.5.

TGI's Neuron backend works on static shapes. When any of its six settings is missing it guesses
from the hub cache and can pick shapes that do not match the export (TGI #3299, #3248), so every
replica gets all of them explicitly (:func:`tgi_settings`).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from types import MappingProxyType

from ..layout import Replica, ServingPlan
from .base import (
    Engine,
    EngineProbe,
    MetricSource,
    ReadinessProbe,
    ReplicaMetrics,
    ServingImage,
    SmokeRequest,
    export_files,
    openai_chat,
    optimum_neuron,
    shape_fields,
)

TGI_3_3_5 = ServingImage(
    reference="ghcr.io/huggingface/text-generation-inference:3.3.5-neuron",
    # huggingface/text-generation-inference v3.3.5 Dockerfile.neuron installs optimum-neuron
    # from its v0.3.0 source archive.
    # optimum-neuron v0.3.0 compiles NxD decoders (weights not inlined) inside neff_cache
    # (optimum/neuron/models/inference/backend/cache.py), which makes the Hub cache proxy
    # (create_hub_compile_cache_proxy) with no fallback: offline, HfApi.repo_exists raises, the
    # proxy raises ValueError and the export stops at its first graph (run in
    # tests/harness/test_compile_cache.py). v0.4.0 removed neff_cache (commit c8549c9e), and
    # hub_neuronx_cache's own fallback ("Bypassing Hub cache") then applies.
    export=optimum_neuron("0.3.0", exports_offline=False),
    # optimum-neuron v0.3.0 optimum/neuron/models/inference/auto_models.py registers text
    # generation for these model types (no mistral).
    model_types=("granite", "llama", "mixtral", "phi3", "qwen2", "qwen3"),
    neuron_sdk="2.24",
    # Dockerfile.neuron at v3.3.5: aws-neuronx-runtime-lib=2.26.42.0 (Neuron SDK 2.24).
    neuron_runtime="2.26.42",
    # Neuron release notes, runtime, Neuron 2.31.0: "Neuron Driver 2.29 requires Neuron Runtime
    # Library 2.33 or later"; older drivers stay compatible with older runtimes
    # (neuron-runtime/nrt-troubleshoot).
    driver_below="2.29",
    # Ubuntu 22.04 Neuron DLAMIs stopped with Neuron SDK 2.30 (driver 2.28 at most); the Neuron
    # DLAMI guide keeps their parameter, which names the last one. The Ubuntu 24.04 ones track
    # the newest driver, and the parameters have no pinned, versioned form.
    dlami_parameter="/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id",
    # Dockerfile.neuron at v3.3.5 pins neuronx-cc==2.19.8089.0, the compiler of Neuron SDK 2.24
    # (aws-neuron-sdk release notes, "Neuron 2.24.0" package list), installed from the Neuron pip
    # repository, whose builds carry a local label. The label is inferred, not read from the
    # image: a public log of a Neuron SDK 2.24 host compiles into its cache folder
    # neuronxcc-2.19.8089.0+8ab9f450/, and the tests' optimum-neuron 0.3.0 stubs give that
    # version (tests/harness/optimum_neuron.py, STUB_VERSIONS). Only the release before the label
    # is relied on to find the Hub cache's folder (neuron_serving.plan.hub_cache).
    neuronx_cc="2.19.8089.0+8ab9f450",
)
"""The last TGI release with Neuron backend changes. It bundles optimum-neuron 0.3.0 and
neuronx-cc 2.19, which the export must run with."""

MAX_CONCURRENT_REQUESTS = 128
"""Requests one replica accepts at once (TGI's default, set explicitly): beyond it TGI answers
429. The router sends each replica at most this many and queues the rest itself, so both
figures come from this one constant."""

def tgi_settings(plan: ServingPlan) -> dict[str, str]:
    """The six settings every replica needs, identical across replicas of one plan."""
    return {
        "HF_NUM_CORES": str(plan.degree),
        "HF_AUTO_CAST_TYPE": plan.dtype,
        "MAX_BATCH_SIZE": str(plan.batch_size),
        "MAX_TOTAL_TOKENS": str(plan.sequence_length),
        "MAX_INPUT_TOKENS": str(plan.max_input_tokens),
        "MAX_BATCH_PREFILL_TOKENS": str(plan.batch_size * plan.max_input_tokens),
    }


class Tgi(Engine):
    """TGI 3.3.5 Neuron: TGI's own API (``/``, ``/generate``, ``/generate_stream``, ``/info``) and
    its OpenAI-compatible ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``."""

    name = "tgi"
    title = "TGI"
    images = (TGI_3_3_5,)
    # The TGI Neuron image listens on port 80 (its PORT default).
    container_port = 80
    max_concurrent_requests = MAX_CONCURRENT_REQUESTS
    # text-generation-inference v3.3.5 router/src/server.rs, ``run``: the routes clients use, with
    # the method each is registered with (``.route("/generate", post(generate))``...). Its router is
    # axum 0.7 (router/Cargo.toml), whose ``get`` also answers HEAD, without the body (docs.rs axum
    # 0.7, axum::routing::method_routing::get). ``POST /`` is ``compat_generate``, where
    # huggingface_hub's InferenceClient sends text_generation (a list of one GenerateResponse, or
    # /generate_stream's events with ``"stream": true``); ``GET /v1/models`` is
    # ``openai_get_model_info``, the OpenAI SDK's ``models.list()``. Of its other routes (``GET /``,
    # /ping, /metrics, /tokenize, /chat_tokenize, /vertex, /invocations, /docs), none is served:
    # docs/router.md says why, route by route.
    api_routes = MappingProxyType({
        "/": ("POST",),
        "/generate": ("POST",),
        "/generate_stream": ("POST",),
        "/v1/chat/completions": ("POST",),
        "/v1/completions": ("POST",),
        "/v1/models": ("GET", "HEAD"),
        "/info": ("GET", "HEAD"),
    })
    # No prefix cache: optimum-neuron 0.3.0 keeps one KV cache of max_batch_size x sequence_length
    # (optimum/neuron/models/inference/backend/modules/kvcache/kv_cache_manager.py, KVCacheManager).
    unused_settings = ("prefix_cache_block_size", "prefix_cache_blocks", "tool_call_parser")
    # router/src/server.rs at v3.3.5: GET /info answers the ``Info`` of router/src/lib.rs, whose
    # model_id vLLM never serves (vLLM 0.11.0 has no /info route: vllm/entrypoints/openai/api_server.py).
    probe = EngineProbe("/info", "model_id")
    # text-generation-inference v3.3.5 router/src/server.rs, router/src/infer/mod.rs and
    # backends/v3/src/queue.rs: the metric names; a counter is created at its first increment,
    # so an absent one means zero.
    metrics = ReplicaMetrics(
        queued=(MetricSource("tgi_queue_size"),),
        running=(MetricSource("tgi_batch_current_size"),),
        counters={
            "Requests": (MetricSource("tgi_request_count"),),
            "RequestFailures": (MetricSource("tgi_request_failure"),),
            "GeneratedTokens": (MetricSource("tgi_request_generated_tokens_sum"),),
        },
        histograms={
            "RequestDuration": "tgi_request_duration",
            "QueueDuration": "tgi_request_queue_duration",
            "TimePerOutputToken": "tgi_request_mean_time_per_token_duration",
        },
    )

    def error_body(self, status: int, message: str) -> str:
        # text-generation-inference v3.3.5 router/src/lib.rs, ``ErrorResponse``: {error, error_type},
        # the type a snake_case word (router/src/infer/mod.rs, ``InferError::error_type``:
        # "validation", "overloaded"...); here the status's phrase, such as "not_found". The router
        # answers TGI's native routes in it: huggingface_hub's InferenceClient (2.4.0,
        # inference/_common.py, raise_text_generation_error) picks its exception by error_type and
        # shows error (utils/_http.py, hf_raise_for_status, reads a string "error" as the message).
        kind = HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
        return json.dumps({"error": message, "error_type": kind}, separators=(",", ":"))

    def export_arguments(self, plan: ServingPlan, image: ServingImage, source: str, output: str) -> tuple[str, ...]:
        # optimum-neuron v0.3.0 optimum/exporters/neuron/__main__.py: from a local directory the
        # task cannot be inferred. It lists both --num_cores and --tensor_parallel_size, but its
        # decoder export drops tensor_parallel_size; without --num_cores it compiles for every
        # core it can see (optimum/neuron/utils/system.py).
        return ("export", "neuron", "--model", source, "--task", "text-generation",
                "--batch_size", str(plan.batch_size), "--sequence_length", str(plan.sequence_length),
                "--num_cores", str(plan.degree), "--auto_cast_type", plan.dtype, output)

    def export_expectations(self, plan: ServingPlan, image: ServingImage) -> dict[str, object]:
        """optimum-neuron 0.3.0 (optimum/neuron/models/inference/backend/pretrained_model.py,
        ``NxDPreTrainedModel.save``) writes ``config.json``, ``neuron_config.json`` (with
        ``batch_size``, ``sequence_length``, ``tp_degree`` and ``torch_dtype``), the compiled
        ``model.pt`` and, when it exported from a local checkpoint, the weights sharded per rank
        under ``checkpoint/weights/``; without them a replica downloads the checkpoint at load.
        The export also holds the tokenizer (optimum/exporters/neuron/__main__.py saves it when
        it can load one, and only logs when it cannot), which TGI loads from the export."""
        return {
            "config": "neuron_config.json",
            "fields": shape_fields(plan),
            "files": export_files(plan),
        }

    def replica_environment(self, plan: ServingPlan, image: ServingImage, replica: Replica,
                            model_dir: str) -> dict[str, str]:
        """The export holds the weights and the tokenizer, so a replica never needs the Hub:
        ``HF_HUB_OFFLINE`` makes any attempt fail at once instead of hanging or downloading.
        With the six TGI settings given, TGI's entry point reads no Hub cache (backends/neuron
        tgi_entry_point.py at v3.3.5), and with no ``REVISION`` its router treats a local
        directory as local (router/src/server.rs)."""
        return {
            "MODEL_ID": model_dir,
            **tgi_settings(plan),
            "MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT_REQUESTS),
            "NEURON_PROCESS_TAG": replica.process_tag,
            "HF_HUB_OFFLINE": "1",
            # TGI's router posts usage statistics to huggingface.co from containers
            # (router/src/usage_stats.rs at v3.3.5), which HF_HUB_OFFLINE does not stop.
            "USAGE_STATS": "off",
        }

    def readiness(self, plan: ServingPlan) -> ReadinessProbe:
        # text-generation-inference v3.3.5 router/src/lib.rs GenerateRequest: inputs and
        # parameters.max_new_tokens.
        return ReadinessProbe("/generate", json.dumps({"inputs": "ping", "parameters": {"max_new_tokens": 1}}))

    def smoke_requests(self, prompt: str, max_tokens: int) -> tuple[SmokeRequest, ...]:
        # text-generation-inference v3.3.5 router/src/lib.rs: with parameters.details, /generate
        # answers GenerateResponse {generated_text, details: {generated_tokens, ...}}, and
        # /generate_stream sends one StreamResponse {index, token: {id, text, logprob, special},
        # generated_text, details} per token, the last with details.generated_tokens (StreamDetails).
        native = {"inputs": prompt, "parameters": {"max_new_tokens": max_tokens, "details": True}}
        return (
            SmokeRequest("native", "/generate", json.dumps(native), stream=False,
                         text=("generated_text",), tokens=("details", "generated_tokens")),
            SmokeRequest("native, streamed", "/generate_stream", json.dumps(native), stream=True,
                         text=("token", "text"), tokens=("details", "generated_tokens")),
            openai_chat(prompt, max_tokens),
        )

    def openai_model(self, probe_answer: object) -> str | None:
        # text-generation-inference v3.3.5 router/src/server.rs (completions) and lib.rs
        # (ChatRequest.try_into_generate): `adapter_id: model.filter(|m| *m != "tgi")`, so any
        # other name is handed to the backend as a LoRA adapter to load; "tgi" is the served model.
        return "tgi"


TGI = Tgi()
