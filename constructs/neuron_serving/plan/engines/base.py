"""What every serving engine provides, and what the engines share.

An engine is one way of serving the exported model in containers: its images and what their
tools can do, how the model is exported for it, what each replica container is told, how to ask
a replica for one token, and the names of its Prometheus metrics. The rest of the library asks
the engine (:class:`Engine`) and never tests which engine it has; adding an engine is one module
here, its entry in :data:`neuron_serving.plan.engines.ENGINES`, and nothing else.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus

from ..errors import ServingConfigError, problem
from ..layout import Replica, ServingPlan

MODEL_MOUNT = "/models"
"""Where the host's export directory appears inside the containers."""

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
"""What is downloaded of a model's Hub repository before the export (``huggingface-cli download
--include``): the configuration, the safetensors weights (optimum-neuron's
optimum/neuron/models/inference/backend/modules/checkpoint.py, at v0.3.0 and v0.4.5, reads
``model.safetensors`` or the index and its shards) and the tokenizer, which the export copies for
the server. Not Meta's own copy of the weights under ``original/`` (16 GB of
``consolidated.*.pth`` for Llama 3 8B), ``*.bin`` or ``*.pth`` duplicates, nor files such as
``modules.json`` that would make optimum route the export to another library. huggingface-hub
matches with ``fnmatch``, where ``*`` also matches ``/`` (src/huggingface_hub/utils/_paths.py at
v0.34.4): ``original/`` is excluded by name too."""

CHECKPOINT_EXCLUDED = ("original/*",)

DRAFT_DIR = "eagle-draft"
"""Where an EAGLE draft (``ServingRequest.speculative_model``) is, beside the checkpoint at the export
(converted there: ``userdata/eagle-draft.py``) and in the export at every replica (its ``config.json``)."""

DRAFT_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json", "pytorch_model*.bin",
               "pytorch_model.bin.index.json")
"""What is downloaded of a draft's Hub repository: its configuration and its weights, as safetensors or
as ``pytorch_model.bin`` (SafeAILab's yuhuili/EAGLE-* drafts), which the conversion reads."""

KEY_FORMAT = "v4"
"""The export key's format. v1 keys named exports made by scripts that compiled for every core
on the host and exported from a Hub id, without weights; v2 keys did not name the engine; the
``COMPLETE`` marker of v3 keys named the upload without a manifest of its files (which no host
can add, markers being write-once). No artifact of an older format is ever used again."""

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""How optimum-neuron (0.3.0 and 0.4.5) names a dtype in ``neuron_config.json`` and ``config.json``
(``torch_dtype``: the torch dtype's name; optimum/neuron/models/inference/backend/config.py, ``to_dict``)."""


SAME_RELEASE = "release"
"""A rule of ``Engine.export_expectations``' ``compare``: the recorded version and the expected one
have the same release, whatever their PEP 440 local labels (the part after ``+``). check-export
(userdata/check-export.py.j2) applies it; every other field must equal the expected value."""


def shape_fields(plan: ServingPlan) -> dict[str, object]:
    """What every optimum-neuron NxD export records of the plan in ``neuron_config.json``: batch
    size, sequence length, degree and dtype."""
    return {"batch_size": plan.batch_size, "sequence_length": plan.sequence_length, "tp_degree": plan.degree,
            "torch_dtype": TORCH_DTYPES[plan.dtype]}


def export_files(plan: ServingPlan) -> list[str]:
    """The files every optimum-neuron NxD export made from a local checkpoint holds (0.3.0 and 0.4.5,
    optimum/neuron/models/inference/backend/pretrained_model.py): the configuration, the Neuron
    configuration, the compiled ``model.pt``, the tokenizer's configuration and the weights
    sharded per rank under ``checkpoint/weights/``."""
    return ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json",
            *(f"checkpoint/weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(plan.degree))]


DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
"""The digest that may pin a known image (``<reference>@<digest>``): sha256, the canonical
algorithm of image content (go-digest's ``Canonical``), hex-encoded in lowercase, 64 digits, as
``docker images --digests`` and registries print it. docker refuses other encodings itself, at
the host's pull (opencontainers/go-digest algorithm.go, vendored by docker/cli v28.2.2:
``^[a-f0-9]{64}$`` for sha256); sha384 and sha512, which docker accepts, are refused here so that
a pinned image has one spelling."""

PINNED_FORM = "@sha256:<64 lowercase hex digits>"
"""How a digest follows a known reference, in messages."""

PUBLIC_DLAMI_PARAMETERS = "/aws/service/neuron/dlami/"
"""Where the public parameters of the Neuron DLAMIs live (Neuron DLAMI guide)."""


@dataclass(frozen=True)
class ExportToolchain:
    """What exports (compiles) the model inside a serving image, and everything the host's export
    step needs to know of it: the one value an engine's image gives its consumers (the boot's
    ``export-model``, the host rules, the stack's outputs), as aws-cdk-lib's
    ``IMachineImage.getImage()`` gives a launch everything of an image in one ``MachineImageConfig``.

    :param name: the package that exports, as its version is named (``optimum-neuron``): with
        :attr:`version`, part of every export key.
    :param version: its version inside the image.
    :param entrypoint: the program the export's container runs (``docker run --entrypoint``); the
        engine's :meth:`Engine.export_arguments` are its arguments.
    :param hub_cli: the image's Hugging Face Hub command line, which downloads checkpoints.
    :param checkpoint_files: what it reads of a model's Hub repository, downloaded before the
        export (``--include`` patterns of :attr:`hub_cli`).
    :param checkpoint_excluded: what is not downloaded even where :attr:`checkpoint_files` match
        (``--exclude`` patterns).
    :param exports_offline: whether it can export without reaching the Hub cache repository; one
        that cannot stops at its first graph when offline.
    :param hub_cache_variable: the container variable that names the Hugging Face Hub repository
        of compiled graphs it consults before compiling (optimum-neuron's ``CUSTOM_CACHE_REPO``), or
        None for a toolchain without a Hub cache, whose hosts are given none.
    :param served_checkpoint_files: files of the downloaded checkpoint that the server reads from
        the export and the toolchain does not write there itself (a configuration, a tokenizer),
        copied into the export once it is made; those missing from the checkpoint are skipped.
        Default: none (optimum-neuron's export holds its own copies).
    """

    name: str
    version: str
    entrypoint: str
    hub_cli: str = "huggingface-cli"
    checkpoint_files: tuple[str, ...] = CHECKPOINT_FILES
    checkpoint_excluded: tuple[str, ...] = CHECKPOINT_EXCLUDED
    exports_offline: bool = True
    hub_cache_variable: str | None = "CUSTOM_CACHE_REPO"
    served_checkpoint_files: tuple[str, ...] = ()

    @property
    def title(self) -> str:
        """``<name> <version>``, as messages and outputs name it."""
        return f"{self.name} {self.version}"


def optimum_neuron(version: str, *, exports_offline: bool = True) -> ExportToolchain:
    """optimum-neuron ``version``'s export: ``optimum-cli export neuron`` (optimum-neuron's
    optimum/commands/export/neuronx.py, at v0.3.0 and v0.4.5), with the image's ``huggingface-cli``."""
    return ExportToolchain("optimum-neuron", version, "optimum-cli", exports_offline=exports_offline)


@dataclass(frozen=True)
class ServingImage:
    """What one serving image can do, read from the sources of the versions it bundles.

    :param reference: the image reference pulled and run: a tag whose tools the library knows,
        or, for an image the user pinned, that tag followed by ``@sha256:<digest>``
        (:meth:`Engine.image`).
    :param export: what exports and loads the model inside (:class:`ExportToolchain`).
    :param model_types: the ``model_type`` values its toolchain exports and serves for text
        generation.
    :param neuron_sdk: the Neuron SDK release whose runtime and compiler the image carries.
    :param neuron_runtime: the version of the Neuron runtime library inside.
    :param driver_below: the first host Neuron driver (``aws-neuronx-dkms``) version that
        rejects that runtime, or None.
    :param dlami_parameter: a public SSM parameter of a Neuron DLAMI whose driver runs that
        runtime.
    :param neuronx_cc: the version of the Neuron compiler inside, as ``neuronxcc.__version__``
        names it (with the Neuron pip repository's local label): what an export records and what
        names the compiler's folders of optimum-neuron's Hub cache (``neuronxcc-<version>/``).
    :param driver_from: the oldest host Neuron driver version that runs that runtime, or None
        when the release notes name no lower bound.
    """

    reference: str
    export: ExportToolchain
    model_types: tuple[str, ...]
    neuron_sdk: str
    neuron_runtime: str
    driver_below: str | None
    dlami_parameter: str
    neuronx_cc: str
    driver_from: str | None = None


@dataclass(frozen=True)
class ReadinessProbe:
    """How ``wait-ready`` asks a replica for one generated token once its ``/health`` passes.

    :param path: the route, POSTed with ``Content-Type: application/json``.
    :param body: the JSON body.
    """

    path: str
    body: str


JsonPath = tuple[str | int, ...]
"""Keys and list indexes leading to one value in a JSON document: ``("choices", 0, "text")``."""


@dataclass(frozen=True)
class SmokeRequest:
    """One request ``neuron-serving smoke`` sends a deployed endpoint, and where its answer says
    what was generated (:meth:`Engine.smoke_requests`).

    :param label: what the request exercises, in the report (``native``, ``native, streamed``,
        ``OpenAI chat``).
    :param path: the route, POSTed with ``Content-Type: application/json``.
    :param body: the JSON body.
    :param stream: whether the answer is a stream of Server-Sent Events (``data: <json>``).
    :param text: where the generated text is: in the JSON answer, or, streamed, in each event;
        an event with text there bears a token.
    :param tokens: where the answer (or, streamed, any event) counts the generated tokens; when
        no answer says, the tokens counted are the token-bearing events.
    """

    label: str
    path: str
    body: str
    stream: bool
    text: JsonPath
    tokens: JsonPath


def openai_chat(prompt: str, max_tokens: int) -> SmokeRequest:
    """The OpenAI chat completion both engines serve, unstreamed: ``messages`` and ``max_tokens``
    in; ``choices[0].message.content`` and ``usage.completion_tokens`` out (text-generation-inference
    v3.3.5 router/src/lib.rs, ``ChatRequest``, ``ChatCompletion`` and ``Usage``; vLLM 0.11.0
    vllm/entrypoints/openai/protocol.py, ``ChatCompletionRequest``, ``ChatCompletionResponse`` and
    ``UsageInfo``)."""
    return SmokeRequest("OpenAI chat", "/v1/chat/completions",
                        json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}),
                        stream=False, text=("choices", 0, "message", "content"), tokens=("usage", "completion_tokens"))


OPENAI_ROUTES = "/v1/"
"""The prefix of the OpenAI-compatible routes (both engines'), whose errors OpenAI's clients parse."""


def openai_error_body(status: int, message: str) -> str:
    """An error of HTTP ``status`` carrying ``message`` in OpenAI's shape, ``{"error": {"message",
    "type", "param", "code"}}``: the only shape whose message the OpenAI SDK shows. openai 3.51.0
    src/openai/_base_client.py, ``_make_status_error_from_response``, adds ``body["error"]["message"]``
    to ``Error code: <status>`` and nothing else of the body; _exceptions.py, ``APIError``, reads
    ``code``, ``param`` and ``type`` beside it. The type and code are the ones vLLM 0.11.0 gives an
    HTTP error (vllm/entrypoints/openai/api_server.py, ``http_exception_handler``: the status's
    phrase and the status), so that both engines' endpoints answer alike."""
    return json.dumps({"error": {"message": message, "type": HTTPStatus(status).phrase, "param": None,
                                 "code": status}}, separators=(",", ":"))


@dataclass(frozen=True)
class EngineProbe:
    """A cheap GET that tells an endpoint's engine without generating anything: the route answers
    200 with a JSON object holding ``field`` on this engine's endpoints only.

    :param path: the route, one of the engine's :attr:`Engine.api_routes` (the router forwards
        only those).
    :param field: a top-level key of its JSON answer.
    """

    path: str
    field: str


@dataclass(frozen=True)
class MetricSource:
    """Where one published metric comes from in a replica's Prometheus text: the sum of the
    samples named ``name`` whose labels include ``labels``.

    :param name: the sample name, with its suffix (``_total``, ``_sum``...) where it has one.
    :param labels: labels a sample must carry to count. Default: any.
    """

    name: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReplicaMetrics:
    """The engine's Prometheus names behind the catalog's replica metrics
    (:mod:`neuron_serving.plan.metrics`, source ``replica``).

    :param queued: gauges of requests waiting for a batch slot (``QueueSize``).
    :param running: gauges of requests in the running batch (``BatchSize``).
    :param counters: counters by published metric name (``Requests``, ``RequestFailures``,
        ``GeneratedTokens``): each the sum of its sources, published as a delta.
    :param histograms: the histogram (without ``_bucket``) of each published per-request metric
        (``RequestDuration``, ``QueueDuration``, ``TimePerOutputToken``).
    """

    queued: tuple[MetricSource, ...]
    running: tuple[MetricSource, ...]
    counters: Mapping[str, tuple[MetricSource, ...]]
    histograms: Mapping[str, str]

    def describe(self, metric: str) -> str:
        """The engine's names behind the published ``metric``, for documentation."""
        if metric == "QueueSize":
            return _names(self.queued)
        if metric == "BatchSize":
            return _names(self.running)
        if metric == "InFlightRequests":
            return f"{_names(self.queued)} + {_names(self.running)}"
        if metric in self.counters:
            return _names(self.counters[metric])
        return self.histograms[metric]

    @property
    def published(self) -> tuple[str, ...]:
        """The catalog metrics these sources produce."""
        return ("QueueSize", "BatchSize", "InFlightRequests", *self.counters, *self.histograms)

    def to_json(self) -> dict[str, object]:
        """The publisher's form of these sources (``userdata/publish_metrics.py``)."""
        def sources(items: tuple[MetricSource, ...]) -> list[dict[str, object]]:
            return [{"name": s.name, "labels": dict(s.labels)} for s in items]
        return {
            "queued": sources(self.queued),
            "running": sources(self.running),
            "counters": {metric: sources(items) for metric, items in self.counters.items()},
            "histograms": dict(self.histograms),
        }


def _names(sources: tuple[MetricSource, ...]) -> str:
    return " + ".join(s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in s.labels) + "}" if s.labels else "")
                      for s in sources)


class Engine(ABC):
    """One serving engine: everything the boot script, the router and the monitoring need to know
    about it. Subclasses set the class attributes and implement the methods; instances hold no
    state.
    """

    name: str
    """The value of the ``engine`` setting."""
    title: str
    """The engine's name in documentation and on the dashboard."""
    images: tuple[ServingImage, ...]
    """The images whose tools the boot script is written and tested against, by tag; the first is
    the default. Each may be pinned to a digest (:meth:`image`)."""
    container_port: int
    """The port the server listens on inside its container."""
    max_concurrent_requests: int
    """The most requests the router may send one replica at once (by default it sends the
    plan's batch size and queues the rest itself)."""
    min_batch_size: int = 1
    """The smallest static batch the engine serves; an objective chooses among those at least this."""
    health_path: str = "/health"
    """The route that answers 200 once the replica can generate."""
    api_routes: Mapping[str, tuple[str, ...]]
    """The routes clients use, each with the methods the engine serves it with, for documentation
    and the router, which forwards nothing else (any other method on a route: 405)."""
    metrics: ReplicaMetrics
    """The Prometheus names of each replica's ``/metrics`` behind the published metrics."""
    unused_settings: tuple[str, ...] = ()
    """Settings of the serving request the engine has no use for: giving one is an error."""
    prefix_caching: bool = False
    """Whether the engine serves a prefix cache (``ServingRequest.prefix_cache_block_size``), and
    keeps one unless told not to."""
    min_prefix_cache_sequence: int = 1
    """The shortest sequence length the engine compiles a prefix cache for."""
    quantizations: tuple[str, ...] = ()
    """The weight quantizations the export can make (``ServingRequest.quantization``)."""
    speculative_decoding: bool = False
    """Whether the engine serves an EAGLE draft beside the model (``ServingRequest.speculative_model``)."""
    probe: EngineProbe
    """How ``neuron-serving smoke`` tells, with one GET, that an endpoint serves this engine."""

    @property
    def default_image(self) -> ServingImage:
        return self.images[0]

    def image(self, reference: str) -> ServingImage:
        """The known image ``reference`` names: one of :attr:`images` by its tag, or that tag
        pinned to a digest (``<tag>@sha256:<64 lowercase hex digits>``). A pinned image has the
        known tag's facts and the pinned ``reference``, which is what the host pulls and runs.
        Raises :class:`ServingConfigError` naming ``image``.

        docker pulls and runs ``name:tag@digest`` by the digest alone: the CLI sends the engine
        the name and the digest, not the tag (docker/cli v28.2.2
        vendor/github.com/docker/docker/client/image_pull.go: ``getAPITagFromNamedRef`` gives a
        digested reference's digest as the ``tag`` parameter); the engine pulls that digest (moby v28.2.2
        api/server/router/image/image_routes.go, ``postImagesCreate``: "The "tag" could actually
        be a digest") and resolves a reference with both by its digest (moby v28.2.2
        reference/store.go, ``Get``: "only lookup by digest as it takes precedence over tag"). So
        the tag only says which image's tools the digest's image carries; the library cannot
        tell that from a digest alone, and refuses a digest without a tag.
        """
        known = ", ".join(i.reference for i in self.images)
        tagged, at, digest = reference.partition("@")
        if at and not DIGEST.fullmatch(digest):
            raise ServingConfigError([problem(
                "image", reference, f"has a malformed digest ({digest!r}): a pinned image is a known image followed "
                f"by {PINNED_FORM}, such as {self.default_image.reference}{PINNED_FORM}")])
        image = next((i for i in self.images if i.reference == tagged), None)
        if image is None and at and ":" not in tagged.rpartition("/")[2]:
            same = [f"{i.reference}@{digest}" for i in self.images if i.reference.rpartition(":")[0] == tagged]
            raise ServingConfigError([problem(
                "image", reference, "pins a digest without a tag, which does not say whose export and serving tools "
                f"the image carries; include the tag: {' or '.join(same) or f'{known}, then @{digest}'}")])
        if image is None:
            raise ServingConfigError([problem(
                "image", reference, f"is not a {self.title} serving image this library knows the export and serving "
                f"tools of; known: {known} (each may be pinned by digest: <image>{PINNED_FORM})")])
        return dataclasses.replace(image, reference=reference) if at else image

    def serving_image(self, plan: ServingPlan, reference: str) -> ServingImage:
        """The known image ``reference`` of this engine (:meth:`image`: a known tag, optionally
        pinned to a digest), which must export and serve ``plan``'s model. Raises
        :class:`ServingConfigError` naming ``image`` or ``model_id``."""
        image = self.image(reference)
        self.check_serves(plan, image)
        return image

    def check_serves(self, plan: ServingPlan, image: ServingImage) -> None:
        """Raise :class:`ServingConfigError` naming ``model_id`` (or the shapes) when ``image``, one
        of this engine's (:meth:`image`), cannot export and serve ``plan``."""
        if plan.model.model_type not in image.model_types:
            raise ServingConfigError([problem(
                "model_id", plan.model_id, f"is a {plan.model.model_type} model, which {image.export.title} "
                f"in {image.reference} cannot export and serve; it does "
                f"{', '.join(image.model_types)}")])
        request = plan.request
        if request.quantization is not None and request.quantization not in self.quantizations:
            raise ServingConfigError([problem(
                "quantization", request.quantization, f"is not made by engine {self.name}, which serves the weights "
                f"in dtype{'; it makes ' + ', '.join(self.quantizations) if self.quantizations else ''}")])
        if request.prefix_cache_block_size is not None and not self.prefix_caching:
            raise ServingConfigError([problem(
                "prefix_cache_block_size", request.prefix_cache_block_size,
                f"asks for a prefix cache, which engine {self.name} does not serve")])
        if request.speculative_model is not None and not self.speculative_decoding:
            raise ServingConfigError([problem(
                "speculative_model", request.speculative_model,
                f"asks for speculative decoding, which engine {self.name} does not serve")])
        self.check_plan(plan, image)

    def check_plan(self, plan: ServingPlan, image: ServingImage) -> None:  # noqa: B027 (optional hook)
        """Raise :class:`ServingConfigError` when ``image`` cannot serve ``plan`` (limits beyond
        the planner's own). Default: every plan the planner accepts."""

    def export_key(self, plan: ServingPlan, image: ServingImage, revision: str | None = None) -> str:
        """A directory name that changes with everything that changes the compiled artifact: the
        engine, the image (which fixes the export toolchain's and compiler's versions), the model and
        its Hub ``revision`` when one is pinned, the degree, shapes and dtype. Keys start with
        :data:`KEY_FORMAT` and the engine's name.

        A pinned image's digest is part of the key, so a pinned deployment never serves an
        export compiled in another image: an export is only valid for the compiler that made it,
        and a tag can move (rebuilt with another compiler build, or re-pushed) while the digest
        cannot. The cost is one more export when a deployment switches between a tag and a pinned
        digest of the same content; an unpinned tag keeps its key."""
        parts = [KEY_FORMAT, self.name, plan.model_id, image.reference, f"{image.export.name}={image.export.version}",
                 str(plan.degree), str(plan.batch_size), str(plan.sequence_length), plan.dtype]
        if plan.request.prefix_cache_block_size is not None:
            # A compile of a prefix cache holds its block size and count (NxD Inference's pa_block_size,
            # pa_num_blocks); keys without one are those of before it existed.
            parts.append(f"prefix-cache={plan.request.prefix_cache_block_size}x"
                         f"{plan.request.effective_prefix_cache_blocks}")
        if plan.request.quantization is not None:
            parts.append(f"quantization={plan.request.quantization}")
        if plan.request.speculative_model is not None:
            # The draft is compiled into the model with its speculation length (fused speculation).
            parts.append(f"speculation={plan.request.speculative_model}x{plan.request.speculative_tokens}")
            if plan.request.speculative_model_revision is not None:
                parts.append(f"speculative-revision={plan.request.speculative_model_revision}")
        if revision is not None:
            parts.append(f"revision={revision}")
        digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
        slug = "".join(c if c.isalnum() else "-" for c in plan.model_id.split("/")[-1].lower())
        quantized = "" if plan.request.quantization is None else f"-{plan.request.quantization}"
        speculated = "" if plan.request.speculative_model is None else f"-eagle{plan.request.speculative_tokens}"
        return (f"{KEY_FORMAT}-{self.name}-{slug}-tp{plan.degree}-b{plan.batch_size}-s{plan.sequence_length}"
                f"-{plan.dtype}{quantized}{speculated}-{digest}")

    @abstractmethod
    def error_body(self, status: int, message: str) -> str:
        """The JSON body the engine answers an error of HTTP ``status`` with on its native routes,
        carrying ``message``: the router answers its own errors there in it, so a client parses one
        shape whatever refused it."""

    def route_error_body(self, path: str, status: int, message: str) -> str:
        """The JSON body of an error the router answers on ``path``: OpenAI's shape on the
        OpenAI-compatible routes (:data:`OPENAI_ROUTES`), whose clients parse only that
        (:func:`openai_error_body`), the engine's own (:meth:`error_body`) elsewhere."""
        if path.startswith(OPENAI_ROUTES):
            return openai_error_body(status, message)
        return self.error_body(status, message)

    @abstractmethod
    def export_arguments(self, plan: ServingPlan, image: ServingImage, source: str, output: str) -> tuple[str, ...]:
        """The arguments of ``image``'s export entry point (``image.export.entrypoint``) that export
        ``plan``'s model from the checkpoint directory ``source`` into ``output`` (both paths inside
        the container)."""

    def export_environment(self, plan: ServingPlan, image: ServingImage, output: str) -> dict[str, str]:
        """Variables the export's container is given beside what the host sets (``output`` is the
        export's directory inside it). Default: none."""
        return {}

    def replica_command(self, plan: ServingPlan, image: ServingImage, model_dir: str) -> tuple[str, ...]:
        """The command every replica's container runs (``docker run IMAGE COMMAND...``), serving the
        export at ``model_dir``; empty for an image whose entry point needs none. Default: empty."""
        return ()

    def replica_entrypoint(self, image: ServingImage) -> str | None:
        """The program each replica's container runs in place of the image's entry point
        (``docker run --entrypoint``), :meth:`replica_command` its arguments; None for the image's own.
        Default: None."""
        return None

    @abstractmethod
    def export_expectations(self, plan: ServingPlan, image: ServingImage) -> dict[str, object]:
        """What an export for ``plan`` holds, for the host's ``check-export``: ``files`` (paths
        that must exist), ``config`` (the JSON file of the export's Neuron configuration),
        ``fields`` (values it must record: equal ones, unless ``compare`` gives the field another
        rule) and, optionally, ``compare`` (field name to rule; the one rule is :data:`SAME_RELEASE`)."""

    @abstractmethod
    def replica_environment(self, plan: ServingPlan, image: ServingImage, replica: Replica,
                            model_dir: str) -> dict[str, str]:
        """The full container environment of ``replica``, serving the export at ``model_dir``."""

    @abstractmethod
    def readiness(self, plan: ServingPlan) -> ReadinessProbe:
        """The one-token generation ``wait-ready`` sends each replica."""

    @abstractmethod
    def smoke_requests(self, prompt: str, max_tokens: int) -> tuple[SmokeRequest, ...]:
        """The requests ``neuron-serving smoke`` sends: one to each of the engine's native and
        OpenAI-compatible generation routes, one of them streamed, each asking for at most
        ``max_tokens`` tokens answering ``prompt``. They name no model, so that they need nothing
        but the endpoint: both engines then use the one they serve."""

    @abstractmethod
    def openai_model(self, probe_answer: object) -> str | None:
        """The ``model`` that OpenAI-compatible requests name to reach the served model, given the
        endpoint's answer to :attr:`probe`; None when the answer names none. A load generator must
        name one: guidellm 0.8.1 asks ``GET /v1/models`` for it otherwise
        (guidellm/backends/openai/http.py, ``default_model``), and TGI's answer there names the
        export's directory, which TGI takes for a LoRA adapter to load."""


NEWEST_DLAMI_DRIVERS = {
    "/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id": "2.27.4.0",
    "/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id": "2.30.2.0",
    "/aws/service/neuron/dlami/base/amazon-linux-2023/latest/image_id": "2.30.2.0",
}
"""The host Neuron driver (``aws-neuronx-dkms``) of the DLAMI that public parameters name today. Each
DLAMI release "upgraded [its Neuron packages] to support AWS Neuron SDK version 2.XX"
(aws-neuron/aws-neuron-sdk release-notes/components/dlamis.rst, which lists no driver versions),
and each SDK's driver is its manifest's (src/helperscripts/n2-manifest.json: 2.27.4.0 in SDK 2.29,
2.30.2.0 in SDK 2.32.0). The Ubuntu 22.04 base DLAMI is no longer published from SDK 2.30 on (its
2.30 release notes), so its parameter stays at SDK 2.29's DLAMI. The pairing is inferred, not read
from an AMI."""


def release(version: str) -> str:
    """A version without its PEP 440 local label: ``2.19.8089.0`` of ``2.19.8089.0+8ab9f450``."""
    return version.partition("+")[0]


def version_key(version: str) -> tuple[int, ...]:
    """``version``'s release as numbers, which compare as releases do: ``(0, 10, 18399)`` of
    ``0.10.18399``, above ``(0, 9)``; a local label (``+3b612583``) does not count."""
    return tuple(int(part) for part in release(version).split("."))


def check_dlami_parameter(image: ServingImage, parameter: str) -> None:
    """Refuse a public Neuron DLAMI parameter other than ``image``'s own when ``image``'s runtime
    is too old for the newest drivers: such a parameter resolves, at every launch, to the newest
    DLAMI of its kind, whose driver rejects the runtime (``nrt_init`` fails). Refuse, too, a public
    parameter whose DLAMI's driver (:data:`NEWEST_DLAMI_DRIVERS`) is older than ``image``'s runtime
    needs (:attr:`ServingImage.driver_from`)."""
    newest = NEWEST_DLAMI_DRIVERS.get(parameter)
    if image.driver_from is not None and newest is not None and version_key(newest) < version_key(image.driver_from):
        raise ServingConfigError([problem(
            "dlami_parameter", parameter,
            f"names a Neuron DLAMI whose driver (aws-neuronx-dkms {newest}) is older than the Neuron runtime "
            f"{image.neuron_runtime} in {image.reference} runs on ({image.driver_from} or newer); use "
            f"{image.dlami_parameter}, or ami_id with a DLAMI whose aws-neuronx-dkms is {image.driver_from} or newer")])
    if image.driver_below is None or not parameter.startswith(PUBLIC_DLAMI_PARAMETERS):
        return
    if parameter != image.dlami_parameter:
        raise ServingConfigError([problem(
            "dlami_parameter", parameter,
            f"names the newest Neuron DLAMI at each launch, whose driver ({image.driver_below} or newer) "
            f"rejects the Neuron runtime {image.neuron_runtime} in {image.reference}; use "
            f"{image.dlami_parameter}, or ami_id with a DLAMI whose aws-neuronx-dkms is below {image.driver_below}")])
