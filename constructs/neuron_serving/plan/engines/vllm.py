"""vLLM on Neuron through optimum-neuron: the living serving path for inf2 and trn1, with the
OpenAI-compatible API.

optimum-neuron's image runs ``optimum-cli neuron serve``, which checks the export against the
host and hands vLLM 0.11.0 its arguments; vLLM loads the model through optimum-neuron's platform
plugin (``optimum/neuron/vllm/``). One server runs per replica on its own devices, behind our
router, rather than optimum-neuron's data-parallel round-robin proxy. Every fact below is read at
optimum-neuron tag v0.4.5 (its PyPI wheel is the tag's ``optimum/`` tree) or in vLLM 0.11.0's
PyPI wheel, and cited where it is used.
"""

from __future__ import annotations

import json
from types import MappingProxyType

from ..errors import ServingConfigError, problem
from ..layout import Replica, ServingPlan
from .base import (
    SAME_RELEASE,
    TORCH_DTYPES,
    Engine,
    EngineProbe,
    MetricSource,
    ReadinessProbe,
    ReplicaMetrics,
    ServingImage,
    SmokeRequest,
    export_files,
    openai_chat,
    openai_error_body,
    optimum_neuron,
    shape_fields,
)

NEURONXCC_VERSION = "2.21.33363.0+82129205"
"""The compiler in the image as ``neuronxcc.__version__`` names it, which an export records
(optimum-neuron v0.4.5 optimum/neuron/configuration_utils.py ``NeuronConfig.to_dict``, through
utils/version_utils.py ``get_neuronxcc_version``). The release is the pin of v0.4.5's pyproject.toml
(extra ``neuronx``: neuronx-cc==2.21.33363.0), which docker/vllm/Dockerfile installs with uv from
the Neuron pip repository (pyproject.toml ``[[tool.uv.index]]`` pip.repos.neuron.amazonaws.com),
whose builds carry a local label. The label is the one optimum-neuron's own tests give that pin
(tests/decoder/test_cache_cleanup.py ``COMPILER_VERSION``, on main at 213224e6, which pins the
same compiler), as does a DLAMI's compile cache (``neuronxcc-2.21.33363.0+82129205/``); it was not
read from the image itself, so check-export does not rely on it (``export_expectations``)."""

OPTIMUM_NEURON_VLLM_0_4_5 = ServingImage(
    # optimum-neuron v0.4.5 .github/workflows/build-vllm-image.yml pushes
    # ghcr.io/huggingface/optimum-neuron-vllm:<version> from docker/vllm/Dockerfile at each tag.
    reference="ghcr.io/huggingface/optimum-neuron-vllm:0.4.5",
    export=optimum_neuron("0.4.5"),
    # optimum-neuron v0.4.5 optimum/neuron/models/inference/auto_models.py registers text
    # generation for these model types and mixtral; its vLLM plugin supports only exports with
    # continuous batching (optimum/neuron/vllm/AGENTS.md), which mixtral's never has
    # (models/inference/mixtral/modeling_mixtral.py, _get_neuron_config).
    model_types=("granite", "llama", "llama4_text", "phi3", "qwen2", "qwen3", "qwen3_moe", "smollm3"),
    # docker/vllm/Dockerfile at v0.4.5 pins the packages of Neuron SDK 2.26.1 (aws-neuron-sdk
    # src/helperscripts/n2-manifest.json): aws-neuronx-runtime-lib=2.28.23.0, and pyproject.toml
    # neuronx-cc==2.21.33363.0.
    neuron_sdk="2.26.1",
    neuron_runtime="2.28.23",
    # As for TGI's image: "Neuron Driver 2.29 requires Neuron Runtime Library 2.33 or later"
    # (aws-neuron-sdk release-notes/components/runtime.rst, Neuron 2.31.0), and older drivers
    # keep running older runtimes (neuron-runtime/nrt-troubleshoot.rst). The Ubuntu 22.04 base
    # DLAMI's last release has driver 2.28 at most, and above the image's 2.24.7.0.
    driver_below="2.29",
    dlami_parameter="/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id",
    neuronx_cc=NEURONXCC_VERSION,
)
"""optimum-neuron 0.4.5's vLLM image (the newest optimum-neuron on PyPI), with vLLM 0.11.0."""

NEURON_TARGET = "trn1"
"""What an export for inf2 or trn1 records as ``target``: optimum-neuron v0.4.5
optimum/neuron/utils/instance.py, ``current_instance_type``, maps inf2, trn1 and trn1n to trn1,
and ``serve`` refuses an export whose target differs (optimum/commands/neuron/serve.py)."""

CONTAINER_PORT = 8080
"""The image's entry point starts ``optimum-cli neuron serve --port 8080`` (docker/vllm/Dockerfile
at v0.4.5, for SageMaker)."""

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
"""vLLM 0.11.0's OpenAI-compatible generation routes (vllm/entrypoints/openai/api_server.py)."""

MIN_BATCH_SIZE = 2
"""optimum-neuron v0.4.5 compiles with continuous batching only when the batch size is above 1
(models/inference/llama/modeling_llama.py, ``_get_neuron_config``, and the model types built on
it), and its vLLM plugin serves nothing else (optimum/neuron/vllm/AGENTS.md)."""

MAX_CONCURRENT_REQUESTS = 128
"""The most requests the router may send one vLLM server at once. vLLM never refuses for load:
requests beyond its batch wait in its own queue (``vllm:num_requests_waiting``). By default the
router sends the batch size and holds the rest, so that each waiting request goes to the first
server with a free batch slot."""


class VllmServer(Engine):
    """What every engine that serves with vLLM's OpenAI-compatible server shares: its routes, its
    errors, its metrics, its readiness probe and smoke requests. Read in vLLM 0.11.0's PyPI wheel and
    again in 0.13.0's, where each cited line is the same (0.13.0 moved ``/health`` to
    vllm/entrypoints/serve/instrumentator/health.py and the metrics mount to
    serve/instrumentator/metrics.py)."""

    container_port = CONTAINER_PORT
    max_concurrent_requests = MAX_CONCURRENT_REQUESTS
    # The inherited health_path, /health: vllm/entrypoints/openai/api_server.py (0.11.0) answers
    # GET /health with 200 and an empty body while the engine runs and 503 once it died; the
    # port opens only after the model loaded.
    # api_server.py (0.11.0) registers each route with its one method (``@router.post``,
    # ``@router.get``); FastAPI's APIRoute, unlike Starlette's Route, adds no HEAD to a GET route
    # (fastapi/routing.py, ``APIRoute.__init__``, FastAPI 0.129.0 beside vLLM 0.11.0 in our
    # optimum-neuron 0.4.5 tools). Of its other routes, none is served: docs/router.md says why,
    # route by route.
    api_routes = MappingProxyType({**dict.fromkeys(GENERATION_ROUTES, ("POST",)), "/v1/models": ("GET",)})
    # vllm/entrypoints/openai/api_server.py (0.11.0): GET /v1/models answers a ModelList {object,
    # data}. TGI serves /v1/models too (router/src/server.rs at v3.3.5), so an endpoint is asked
    # TGI's /info first (neuron_serving.ops.endpoint).
    probe = EngineProbe("/v1/models", "data")
    # vLLM takes any prompt up to max_model_len minus the tokens asked for
    # (vllm/entrypoints/openai/serving_engine.py, _validate_input): no separate input limit.
    unused_settings: tuple[str, ...] = ("max_input_tokens",)
    # vLLM 0.11.0 vllm/v1/metrics/loggers.py (PrometheusStatLogger): gauges and histograms with
    # labels model_name and engine. Requests and failures are the HTTP server's count of the
    # generation routes: prometheus-fastapi-instrumentator (>= 7.0.0, api_server.py mount_metrics)
    # counts http_requests_total by handler (the route), method and status grouped as 2xx, 4xx,
    # 5xx (prometheus_fastapi_instrumentator/metrics.py, default(), at 7.1.0).
    metrics = ReplicaMetrics(
        queued=(MetricSource("vllm:num_requests_waiting"),),
        running=(MetricSource("vllm:num_requests_running"),),
        counters={
            "Requests": tuple(MetricSource("http_requests_total", (("handler", r),)) for r in GENERATION_ROUTES),
            "RequestFailures": tuple(MetricSource("http_requests_total", (("handler", r), ("status", s)))
                                     for r in GENERATION_ROUTES for s in ("4xx", "5xx")),
            "GeneratedTokens": (MetricSource("vllm:generation_tokens_total"),),
        },
        histograms={
            "RequestDuration": "vllm:e2e_request_latency_seconds",
            "QueueDuration": "vllm:request_queue_time_seconds",
            "TimePerOutputToken": "vllm:request_time_per_output_token_seconds",
        },
    )

    def error_body(self, status: int, message: str) -> str:
        # vLLM 0.11.0's every route answers errors in OpenAI's shape (vllm/entrypoints/openai/
        # protocol.py, ``ErrorResponse``; api_server.py, ``http_exception_handler``).
        return openai_error_body(status, message)

    def readiness(self, plan: ServingPlan) -> ReadinessProbe:
        # vllm/entrypoints/openai/protocol.py (0.11.0), CompletionRequest: model, prompt, max_tokens.
        return ReadinessProbe("/v1/completions",
                              json.dumps({"model": plan.model_id, "prompt": "ping", "max_tokens": 1}))

    def smoke_requests(self, prompt: str, max_tokens: int) -> tuple[SmokeRequest, ...]:
        # vllm/entrypoints/openai/protocol.py (0.11.0): CompletionRequest (model optional: without
        # one, serving_engine.py _is_model_supported takes the served model), answered with
        # choices[0].text and usage.completion_tokens. Streamed (serving_completion.py), each
        # event is a CompletionStreamResponse with choices[0].text; with stream_options.include_usage
        # a last event has choices [] and usage, then ``data: [DONE]``.
        completion = {"prompt": prompt, "max_tokens": max_tokens}
        streamed = {**completion, "stream": True, "stream_options": {"include_usage": True}}
        return (
            SmokeRequest("OpenAI completions", "/v1/completions", json.dumps(completion), stream=False,
                         text=("choices", 0, "text"), tokens=("usage", "completion_tokens")),
            SmokeRequest("OpenAI completions, streamed", "/v1/completions", json.dumps(streamed), stream=True,
                         text=("choices", 0, "text"), tokens=("usage", "completion_tokens")),
            openai_chat(prompt, max_tokens),
        )

    def openai_model(self, probe_answer: object) -> str | None:
        # vllm/entrypoints/openai/serving_engine.py (0.11.0), _check_model: a request naming a model
        # the server does not serve is answered 404; GET /v1/models lists the served ones as
        # ModelList.data[].id (protocol.py), the first the --served-model-name.
        data = probe_answer.get("data") if isinstance(probe_answer, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        model = first.get("id") if isinstance(first, dict) else None
        return model if isinstance(model, str) and model else None


class Vllm(VllmServer):
    """vLLM 0.11.0 in optimum-neuron 0.4.5's image: the OpenAI-compatible API."""

    name = "vllm"
    title = "vLLM"
    images = (OPTIMUM_NEURON_VLLM_0_4_5,)
    min_batch_size = MIN_BATCH_SIZE
    # optimum-neuron 0.4.5's vLLM plugin serves no prefix cache (optimum/neuron/vllm/platform.py: "Disable
    # prefix-caching as it's not supported on optimum-neuron").
    unused_settings = (*VllmServer.unused_settings, "prefix_cache_block_size", "prefix_cache_blocks",
                       "tool_call_parser")

    def check_plan(self, plan: ServingPlan, image: ServingImage) -> None:
        problems = []
        if plan.batch_size < self.min_batch_size:
            problems.append(problem("batch_size", plan.batch_size, f"must be at least {MIN_BATCH_SIZE} with engine "
                                    "vllm: optimum-neuron compiles continuous batching, which its vLLM plugin "
                                    "needs, only for larger batches"))
        checkpoint = plan.model.torch_dtype
        if checkpoint is None:
            problems.append(problem("model_config", plan.model_id, "has no torch_dtype, which "
                                    f"{image.export.title} exports and serves with; add it to config.json"))
        elif checkpoint != TORCH_DTYPES.get(plan.dtype):
            wanted = next((short for short, long in TORCH_DTYPES.items() if long == checkpoint), None)
            hint = f"use -c dtype={wanted}" if wanted else "this engine serves bf16 and fp16 checkpoints only"
            problems.append(problem("dtype", plan.dtype, f"must be the checkpoint's own dtype ({checkpoint}) with "
                                    f"engine vllm: {image.export.title} exports with the dtype of "
                                    f"config.json whatever it is asked for; {hint}"))
        if problems:
            raise ServingConfigError(problems)

    def export_arguments(self, plan: ServingPlan, image: ServingImage, source: str, output: str) -> tuple[str, ...]:
        # optimum-neuron v0.4.5 optimum/commands/export/neuronx.py: --tensor_parallel_size (its
        # default is 1; --num_cores is a hidden alias). From a local directory the task cannot be
        # inferred. The dtype comes from config.json (optimum/neuron/models/inference/
        # modeling_utils.py), so none is passed: check_plan made the plan's dtype that one. The
        # target is the host's, read in the container (optimum/neuron/utils/instance.py).
        return ("export", "neuron", "--model", source, "--task", "text-generation",
                "--batch_size", str(plan.batch_size), "--sequence_length", str(plan.sequence_length),
                "--tensor_parallel_size", str(plan.degree), output)

    def export_expectations(self, plan: ServingPlan, image: ServingImage) -> dict[str, object]:
        """optimum-neuron 0.4.5 writes ``config.json``, ``neuron_config.json``, ``model.pt``, the
        tokenizer, and, exporting from a local directory, the weights sharded per rank under
        ``checkpoint/weights/`` (optimum/neuron/models/inference/backend/pretrained_model.py);
        without them the plugin downloads the checkpoint at load (``load_weights``). ``serve``
        loads an export only when its ``target``, ``optimum_neuron_version`` and
        ``neuronxcc_version`` are the host's and the image's (optimum/commands/neuron/serve.py,
        optimum/neuron/configuration_utils.py), and the plugin only with continuous batching."""
        return {
            "config": "neuron_config.json",
            "fields": {
                **shape_fields(plan),
                "continuous_batching": True,
                "target": NEURON_TARGET,
                "optimum_neuron_version": image.export.version,
                "neuronxcc_version": image.neuronx_cc,
            },
            # serve requires the whole string, local label and all, to be the installed
            # neuronxcc.__version__ (optimum-neuron v0.4.5 optimum/neuron/configuration_utils.py,
            # NeuronConfig.from_dict, `cfg_neuronxcc_version != neuronxcc_version`), as it does the
            # optimum-neuron version (no label: PyPI's). The host checks the release only: the label
            # of NEURONXCC_VERSION is not read from the image, and a wrong one would make every host
            # refuse its own export again. serve still refuses an export of another build at load,
            # naming both versions.
            "compare": {"neuronxcc_version": SAME_RELEASE},
            "files": export_files(plan),
        }

    def replica_environment(self, plan: ServingPlan, image: ServingImage, replica: Replica,
                            model_dir: str) -> dict[str, str]:
        """The image's entry point turns each ``SM_ON_<NAME>=<value>`` into ``--<name> <value>``
        (lower case; an empty value gives the bare flag) after ``--port 8080`` (docker/vllm/
        Dockerfile at v0.4.5, as docs/source/guides/export_model.mdx serves an export). ``serve``
        parses model, served model name, degree, batch and sequence length, checks them against
        the export, and passes vLLM ``--tensor-parallel-size``, ``--max-num-seqs`` (the batch)
        and ``--max-model-len`` (the sequence length); the arguments it does not know go to vLLM
        as they are (optimum/commands/neuron/serve.py)."""
        return {
            "SM_ON_MODEL": model_dir,
            # Clients name the model as on the Hub; the default would be the export's path.
            "SM_ON_SERVED_MODEL_NAME": plan.model_id,
            "SM_ON_TENSOR_PARALLEL_SIZE": str(plan.degree),
            "SM_ON_BATCH_SIZE": str(plan.batch_size),
            "SM_ON_SEQUENCE_LENGTH": str(plan.sequence_length),
            # vLLM 0.11.0 vllm/entrypoints/openai/cli_args.py: without these, uvicorn logs every
            # health check and scrape, and FastAPI serves /docs, /redoc and /openapi.json.
            "SM_ON_DISABLE_UVICORN_ACCESS_LOG": "",
            "SM_ON_DISABLE_FASTAPI_DOCS": "",
            "NEURON_PROCESS_TAG": replica.process_tag,
            # The export holds the weights and the tokenizer: nothing needs the Hub.
            "HF_HUB_OFFLINE": "1",
            # vllm/usage/usage_lib.py (0.11.0): no usage reports to stats.vllm.ai.
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # vllm/utils/__init__.py get_ip (0.11.0): without it vLLM looks for a route to 8.8.8.8
            # to learn its address, for a distributed setup a single server does not have.
            "VLLM_HOST_IP": "127.0.0.1",
        }

VLLM = Vllm()
