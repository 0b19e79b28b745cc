"""The layout planner: from model, shapes and instance type to data-parallel replicas, each with
its own contiguous group of Neuron devices, and the device memory each NeuronCore needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from .errors import Problems, ServingConfigError, problem
from .identifiers import hub_revision
from .instances import CORES_PER_DEVICE, INSTANCES, InstanceSpec, instance_spec
from .models import ModelSpec, eagle_fc_parameter_count, resolve_draft, resolve_model

GIB = 1024**3

DTYPE_BYTES = {"bf16": 2, "fp16": 2}
"""Auto-cast types TGI's Neuron backend accepts (``HF_AUTO_CAST_TYPE``) and their width."""

QUANTIZATIONS = {"int8": 1}
"""Weight quantizations and the width of a quantized weight. NxD Inference quantizes the weights of
every linear layer of the model (its LM head too) per output channel, with a float32 scale for each,
and keeps the embeddings and norms in the model's dtype (neuronx-distributed-inference cd3abf3,
models/application_base.py ``generate_quantized_state_dict`` and models/model_base.py
``prepare_quantized_state_dict``; models/model_wrapper.py keeps the scales in float32)."""

OVERHEAD_FRACTION = 0.2
"""Margin on top of weights and KV cache for activations, compiler scratch buffers and the
Neuron runtime's own allocations. A stated estimate: layouts within it of the limit should be
confirmed with a real export."""

COMPILE_RAM_FACTOR = 2
COMPILE_RAM_BASE_GIB = 4
"""Host memory the export needs: about twice the full bf16 checkpoint plus the compiler itself.
An 8B model (16 GB of weights) does not compile reliably on 16 GiB inf2.xlarge or 32 GiB
trn1.2xlarge hosts (aws-neuron nki-samples #87, optimum-neuron PR #551)."""

ROOT_VOLUME_BASE_GIB = 100
"""Operating system, Docker's image store and logs, before any model data."""

SPECULATIVE_TOKENS = (2, 10)
"""The shortest and longest speculation (``ServingRequest.speculative_tokens``): vLLM's
``num_speculative_tokens``, which the vllm-neuron plugin makes NxD Inference's ``speculation_length`` k,
whose fused step drafts k - 1 candidates and yields up to k tokens (models/model_base.py at cd3abf3:
"Generate k-1 candidate tokens"). At k = 1 it drafts nothing and still pays the draft's pass, hence 2.
Neither vLLM (any positive number, vllm/config/speculative.py in 0.13.0) nor NxD Inference bounds it
above; the bound is the library's. A flat chain's candidate is accepted only if all before it were, so
with a per-token acceptance ``a`` a step yields ``(1 - a**k) / (1 - a)`` tokens, at most
``1 / (1 - a)``: at ``a`` = 0.8, 4.5 of 5 by k = 10, while each step of k costs k draft steps."""

DEFAULT_SPECULATIVE_TOKENS = 5
"""What AWS's guides speculate (vllm-user-guide-v1.rst's ``"num_speculative_tokens": 5``; NxD Inference's
feature guide, ``speculation_length=5``, both at v2.28.0)."""

DEFAULT_ROUTER_PORT = 8080
DEFAULT_FIRST_REPLICA_PORT = 8081


@dataclass(frozen=True)
class ServingRequest:
    """What the user asks for. Every field is validated by :func:`plan_serving`.

    :param model_id: Hugging Face model id (or a catalog name such as ``llama-3.1-8b``).
    :param instance_type: a Neuron instance type from the catalog.
    :param batch_size: static batch size of the export (TGI ``MAX_BATCH_SIZE``).
    :param sequence_length: static sequence length of the export (TGI ``MAX_TOTAL_TOKENS``).
    :param max_input_tokens: longest prompt; below ``sequence_length``.
        Default: three quarters of ``sequence_length``.
    :param dtype: ``bf16`` or ``fp16``.
    :param tensor_parallel: NeuronCores per replica. Default: the smallest valid degree whose
        memory estimate fits, which gives the most replicas.
    :param model_config: path to a ``config.json`` for a model outside the catalog.
    :param router_port: host port of the on-host router. Default: 8080.
    :param first_replica_port: host port of replica 0; replica i listens on this + i. Default: 8081.
    :param prefix_cache_block_size: tokens per block of a paged KV cache that keeps the prefixes of
        past requests for later ones (prefix caching), or None for a contiguous KV cache of one
        sequence per batch slot. Default: None.
    :param prefix_cache_blocks: the blocks of that cache. Default: as many as the running batch
        needs, ``ceil(sequence_length / prefix_cache_block_size) * batch_size``; more keep more
        prefixes, at their memory's cost.
    :param tool_call_parser: how the server reads the tool calls a model generates: a parser's name,
        or ``none`` for no tool calling. Default: the engine's choice for the model. Serving only: the
        planner does not use it.
    :param quantization: the weights' quantization (:data:`QUANTIZATIONS`: ``int8``), done by the
        export from the checkpoint, or None for weights in ``dtype``. Default: None.
    :param speculative_model: the Hugging Face id of an EAGLE v1 draft of the model, which proposes
        ``speculative_tokens`` tokens each step for the model to verify in one (speculative decoding),
        or None. Its shape is the catalog's (:data:`~neuron_serving.plan.models.EAGLE_DRAFTS`) unless
        ``speculative_model_config`` is given. Default: None.
    :param speculative_model_config: path to the draft's ``config.json``, for a draft outside the catalog.
    :param speculative_model_revision: the draft's Hub revision (commit, branch or tag), or None for its
        default branch when the export downloads it. Default: None.
    :param speculative_tokens: the speculation length: the most tokens a step yields, of which the draft
        proposes all but one (:data:`SPECULATIVE_TOKENS`).
        Default: :data:`DEFAULT_SPECULATIVE_TOKENS`.
    """

    model_id: str
    instance_type: str
    batch_size: int = 4
    sequence_length: int = 4096
    max_input_tokens: int | None = None
    dtype: str = "bf16"
    tensor_parallel: int | None = None
    model_config: str | None = None
    router_port: int = DEFAULT_ROUTER_PORT
    first_replica_port: int = DEFAULT_FIRST_REPLICA_PORT
    prefix_cache_block_size: int | None = None
    prefix_cache_blocks: int | None = None
    tool_call_parser: str | None = None
    quantization: str | None = None
    speculative_model: str | None = None
    speculative_model_config: str | None = None
    speculative_model_revision: str | None = None
    speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS

    @property
    def effective_max_input_tokens(self) -> int:
        if self.max_input_tokens is not None:
            return self.max_input_tokens
        return max(1, self.sequence_length * 3 // 4)

    @property
    def min_prefix_cache_blocks(self) -> int:
        """The blocks every running sequence needs at its longest: ``ceil(sequence_length /
        prefix_cache_block_size) * batch_size`` (0 without a prefix cache)."""
        if not self.prefix_cache_block_size:
            return 0
        return -(-self.sequence_length // self.prefix_cache_block_size) * self.batch_size

    @property
    def effective_prefix_cache_blocks(self) -> int:
        """The prefix cache's blocks: :attr:`prefix_cache_blocks`, or the least the batch needs."""
        return self.prefix_cache_blocks if self.prefix_cache_blocks is not None else self.min_prefix_cache_blocks

    @property
    def kv_cache_tokens(self) -> int:
        """The tokens each replica's KV cache holds: one sequence per batch slot, or, with a prefix
        cache, its blocks and two more (vLLM's null block, which the vllm-neuron plugin adds to
        ``num_gpu_blocks_override``, vllm_neuron/platform.py at release-0.4.1, and NxD Inference's
        reserved block, ``_NUM_EXTRA_RESERVED_BLOCK``, modules/kvcache/block_kv_cache_manager.py at
        cd3abf3)."""
        if not self.prefix_cache_block_size:
            return self.batch_size * self.sequence_length
        return (self.effective_prefix_cache_blocks + 2) * self.prefix_cache_block_size


@dataclass(frozen=True)
class MemoryEstimate:
    """Device memory one NeuronCore needs, in bytes, against what it has."""

    weights: int
    kv_cache: int
    overhead: int
    available: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def describe(self) -> str:
        return (
            f"{self.total / GIB:.1f} GiB of {self.available / GIB:.0f} GiB per core "
            f"(weights {self.weights / GIB:.1f}, KV cache {self.kv_cache / GIB:.1f}, "
            f"overhead {self.overhead / GIB:.1f})"
        )


@dataclass(frozen=True)
class Replica:
    """One serving container: its contiguous devices, their cores, its host port and process tag."""

    index: int
    devices: tuple[int, ...]
    port: int

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def process_tag(self) -> str:
        """``NEURON_PROCESS_TAG``, which names this replica's runtime in neuron-monitor reports."""
        return self.name

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(c for d in self.devices for c in (CORES_PER_DEVICE * d, CORES_PER_DEVICE * d + 1))

    @property
    def device_paths(self) -> tuple[str, ...]:
        return tuple(f"/dev/neuron{d}" for d in self.devices)

    def describe(self) -> str:
        devices = _span("neuron", self.devices)
        return f"{self.name}: {devices} (cores {_span('', self.cores)}) on port {self.port}"


def _span(prefix: str, values: tuple[int, ...]) -> str:
    if len(values) == 1:
        return f"{prefix}{values[0]}"
    return f"{prefix}{values[0]}-{values[-1]}"


@dataclass(frozen=True)
class DegreeOption:
    """One candidate tensor-parallel degree and what it would give."""

    degree: int
    replicas: int
    idle_cores: int
    memory: MemoryEstimate


@dataclass(frozen=True)
class ServingPlan:
    """The validated layout of one instance: every figure the render and CDK layers use."""

    request: ServingRequest
    model: ModelSpec
    instance: InstanceSpec
    degree: int
    replicas: tuple[Replica, ...]
    memory: MemoryEstimate
    draft: ModelSpec | None = None
    """The EAGLE draft's architecture (``ServingRequest.speculative_model``), or None."""

    @property
    def model_id(self) -> str:
        return self.request.model_id

    @property
    def batch_size(self) -> int:
        return self.request.batch_size

    @property
    def sequence_length(self) -> int:
        return self.request.sequence_length

    @property
    def max_input_tokens(self) -> int:
        return self.request.effective_max_input_tokens

    @property
    def dtype(self) -> str:
        return self.request.dtype

    @property
    def router_port(self) -> int:
        return self.request.router_port

    @property
    def devices_per_replica(self) -> int:
        return self.degree // CORES_PER_DEVICE

    @property
    def idle_devices(self) -> tuple[int, ...]:
        used = {d for r in self.replicas for d in r.devices}
        return tuple(d for d in range(self.instance.devices) if d not in used)

    @cached_property
    def weights_bytes(self) -> int:
        """The checkpoint's weights in the plan's dtype, as the host downloads them (quantizing
        happens in the export)."""
        return self.model.parameter_count * DTYPE_BYTES[self.dtype]

    @property
    def root_volume_gib(self) -> int:
        """Root volume size: the serving image unpacked (about 30 GiB), the downloaded checkpoint,
        the export (compiled graphs plus its own copy of the weights), room for a second export
        while a configuration changes, and logs; at least what the instance family requires."""
        weights_gib = math.ceil(self.weights_bytes / GIB)
        size = ROOT_VOLUME_BASE_GIB + 3 * weights_gib
        return max(-(-size // 10) * 10, self.instance.min_root_volume_gib)

    def describe(self) -> str:
        """A readable layout, one replica after another (the stack's ``ServingLayout`` output)."""
        text = "; ".join(r.describe() for r in self.replicas)
        if self.idle_devices:
            text += f"; idle: {_span('neuron', self.idle_devices)}"
        return text


def _memory_estimate(model: ModelSpec, instance: InstanceSpec, request: ServingRequest,
                     degree: int, draft: ModelSpec | None = None) -> MemoryEstimate:
    """What one NeuronCore holds at ``degree``: the weights and KV cache of the model and, with an EAGLE
    ``draft``, the draft's, which NxD Inference compiles into the same model ("fused speculation",
    developer_guides/feature-guide.rst at v2.28.0), sharded as the target's are, its ``fc`` too
    (:func:`~neuron_serving.plan.models.eagle_fc_parameter_count`); its KV cache has the target's length."""
    dtype_bytes = DTYPE_BYTES[request.dtype]
    weights = model.weight_bytes(dtype_bytes, QUANTIZATIONS.get(request.quantization or "")) // degree
    kv_cache = model.kv_cache_bytes_per_token(dtype_bytes, degree) * request.kv_cache_tokens
    if draft is not None:
        weights += (draft.parameter_count + eagle_fc_parameter_count(draft)) * dtype_bytes // degree
        kv_cache += draft.kv_cache_bytes_per_token(dtype_bytes, degree) * request.kv_cache_tokens
    overhead = int((weights + kv_cache) * OVERHEAD_FRACTION)
    return MemoryEstimate(weights, kv_cache, overhead, instance.memory_per_core_gib * GIB)


def _validate(request: ServingRequest) -> tuple[ModelSpec, InstanceSpec, ModelSpec | None]:
    problems = Problems()
    instance: InstanceSpec | None = None
    model: ModelSpec | None = None
    draft: ModelSpec | None = None
    try:
        instance = instance_spec(request.instance_type)
    except ServingConfigError as err:
        problems.add_all(err.problems)
    try:
        model = resolve_model(request.model_id, request.model_config)
    except ServingConfigError as err:
        problems.add_all(err.problems)
    if request.speculative_model is not None and model is not None:
        try:
            draft = resolve_draft(request.speculative_model, model, request.speculative_model_config)
        except ServingConfigError as err:
            problems.add_all(err.problems)
    elif request.speculative_model is None:
        for name in ("speculative_model_config", "speculative_model_revision"):
            if getattr(request, name) is not None:
                problems.add(name, getattr(request, name), "applies only with speculative_model")
    revision = request.speculative_model_revision
    if revision is not None and (said := hub_revision(revision)) is not None:
        problems.add("speculative_model_revision", revision, said)
    low, high = SPECULATIVE_TOKENS
    if not _is_int(request.speculative_tokens) or not low <= request.speculative_tokens <= high:
        problems.add("speculative_tokens", request.speculative_tokens, f"must be an integer from {low} to {high}")
    for name in ("batch_size", "sequence_length"):
        value = getattr(request, name)
        if not _is_int(value) or value < 1:
            problems.add(name, value, "must be an integer of at least 1")
    mit = request.max_input_tokens
    if mit is not None and (not _is_int(mit) or mit < 1):
        problems.add("max_input_tokens", mit, "must be an integer of at least 1")
    elif _is_int(request.sequence_length) and request.sequence_length >= 1 and (
        request.effective_max_input_tokens >= request.sequence_length
    ):
        problems.add(
            "max_input_tokens",
            request.effective_max_input_tokens,
            f"must be below sequence_length ({request.sequence_length}) to leave room for output tokens",
        )
    if request.dtype not in DTYPE_BYTES:
        problems.add("dtype", request.dtype, f"must be one of {', '.join(DTYPE_BYTES)}")
    if request.quantization is not None and request.quantization not in QUANTIZATIONS:
        problems.add("quantization", request.quantization, f"must be none or one of {', '.join(QUANTIZATIONS)}")
    if model is not None and _is_int(request.sequence_length) and (
        request.sequence_length > model.max_position_embeddings
    ):
        problems.add(
            "sequence_length",
            request.sequence_length,
            f"exceeds the {model.max_position_embeddings} positions {model.name} supports",
        )
    tp = request.tensor_parallel
    if tp is not None and instance is not None and tp not in instance.allowed_degrees():
        problems.add("tensor_parallel", tp, instance.allowed_degrees_text())
    block, blocks = request.prefix_cache_block_size, request.prefix_cache_blocks
    if block is not None and (not _is_int(block) or block < 1):
        problems.add("prefix_cache_block_size", block, "must be an integer of at least 1")
    elif blocks is not None and block is None:
        problems.add("prefix_cache_blocks", blocks, "applies only with a prefix cache (prefix_caching)")
    elif blocks is not None and not _is_int(blocks):
        problems.add("prefix_cache_blocks", blocks, "must be an integer")
    elif (blocks is not None and _is_int(request.batch_size) and _is_int(request.sequence_length)
          and blocks < request.min_prefix_cache_blocks):
        problems.add("prefix_cache_blocks", blocks, f"must be at least {request.min_prefix_cache_blocks}, "
                     f"ceil(sequence_length / prefix_cache_block_size) x batch_size: every running sequence needs "
                     "its blocks at its longest")
    for name in ("router_port", "first_replica_port"):
        port = getattr(request, name)
        if not _is_int(port) or not 1 <= port <= 65535:
            problems.add(name, port, "must be a TCP port from 1 to 65535")
    if instance is not None and _is_int(request.router_port) and _is_int(request.first_replica_port) and (
        request.first_replica_port <= request.router_port < request.first_replica_port + instance.cores
    ):
        problems.add("router_port", request.router_port, "must not fall among the replica ports")
    problems.raise_if_any()
    assert instance is not None and model is not None
    return model, instance, draft


def compile_memory_problem(plan: ServingPlan) -> str | None:
    """Why ``plan``'s host cannot export (compile) its model, or ``None`` when it can. Only a host
    that compiles needs this memory: one serving a prebuilt export does not.

    Quantized weights (``ServingRequest.quantization``) are made first, alone: NxD Inference loads the
    whole checkpoint on the CPU with transformers' ``from_pretrained`` and no dtype
    (models/llama/modeling_llama.py ``load_hf_model``, at cd3abf3), which in transformers 4 (vLLM
    0.13.0 requires <5) is float32 ("set fp32 as the default dtype for BC", transformers 4.57.3
    modeling_utils.py ``_get_dtype``): 4 bytes a parameter, what this estimate counts for a 2-byte
    dtype (:data:`COMPILE_RAM_FACTOR` times 2)."""
    model, instance = plan.model, plan.instance
    need_gib = model.parameter_count * DTYPE_BYTES[plan.request.dtype] * COMPILE_RAM_FACTOR / GIB + COMPILE_RAM_BASE_GIB
    if need_gib <= instance.host_ram_gib:
        return None
    return problem(
        "instance_type", instance.name,
        f"has {instance.host_ram_gib} GiB of host memory; exporting {model.name} ({model.parameter_count / 1e9:.1f} B "
        f"parameters) needs about {need_gib:.0f} GiB: let a builder instance compile it (builder_instance_type; "
        "NeuronExportBuilder), or serve an export built elsewhere (prebuilt_export); this host then never compiles",
    )


def builder_instance(plan: ServingPlan, instance_type: str | None = None) -> InstanceSpec:
    """The instance type that exports ``plan``'s model for it: ``instance_type`` when given, else the
    cheapest that can. A builder is of the serving instance's family, whose image, driver and
    devices the export is made with (the export runs on one replica's Neuron devices: each
    replica's ``--device`` list in ``export-model``), has at least one replica's devices, and the
    host memory to compile. Raises :class:`ServingConfigError` naming ``builder_instance_type``."""
    family = [i for i in INSTANCES.values() if i.family == plan.instance.family]
    able = [i for i in family if i.devices >= plan.devices_per_replica
            and compile_memory_problem(dataclasses.replace(plan, instance=i)) is None]
    if instance_type is None:
        if not able:
            raise ServingConfigError([problem(
                "instance_type", plan.instance.name, f"cannot compile {plan.model.name}, and no {plan.instance.family} "
                "instance type can: serve an export built elsewhere with prebuilt_export")])
        return min(able, key=lambda i: (i.hourly_usd, i.name))
    chosen = INSTANCES.get(instance_type)
    if chosen is None or chosen not in able:
        allowed = ", ".join(i.name for i in sorted(able, key=lambda i: i.hourly_usd)) or "none"
        raise ServingConfigError([problem(
            "builder_instance_type", instance_type, f"must be a {plan.instance.family} instance type with at least "
            f"{plan.devices_per_replica} Neuron devices and the host memory to compile {plan.model.name}: {allowed}")])
    return chosen


def builder_plan(plan: ServingPlan, instance_type: str | None = None) -> ServingPlan:
    """``plan`` laid out on its builder (:func:`builder_instance`): the same model, degree, shapes and
    dtype, so the same export and export key, on the builder's devices."""
    builder = builder_instance(plan, instance_type)
    return plan_serving(dataclasses.replace(plan.request, instance_type=builder.name, tensor_parallel=plan.degree))


def fleet_layouts(plan: ServingPlan, instance_types: Sequence[str]) -> tuple[ServingPlan, ...]:
    """``plan`` laid out on each of ``instance_types``, a fleet's types in order of preference, of
    which ``plan``'s own is the first: the same model, degree, shapes and dtype, so one export and one
    export key serve them all (an export is compiled for one replica's devices, not for the instance),
    with as many replicas as each type's devices hold.

    Every type must be of ``plan``'s family: the export is compiled with that family's devices, and
    its builder is of the family (:func:`builder_instance`). Raises :class:`ServingConfigError`
    naming ``instance_types`` and each type that cannot serve the layout, with why."""
    problems = Problems()
    if not instance_types or instance_types[0] != plan.instance.name:
        problems.add("instance_types", list(instance_types), f"must start with the layout's instance type, "
                     f"{plan.instance.name}")
    layouts = [plan]
    for name in instance_types[1:]:
        if name in instance_types[:instance_types.index(name)] or name == plan.instance.name:
            problems.add("instance_types", name, "is listed twice")
            continue
        spec = INSTANCES.get(name)
        if spec is None:
            problems.add("instance_types", name, f"must be one of {', '.join(INSTANCES)}")
            continue
        if spec.family != plan.instance.family:
            problems.add("instance_types", name, f"is a {spec.family} type, but the fleet's export is compiled "
                         f"for {plan.instance.family} devices ({plan.instance.name}): every type of a fleet is of "
                         "one family")
            continue
        if plan.degree not in spec.allowed_degrees():
            problems.add("instance_types", name, f"cannot hold a replica of tensor_parallel {plan.degree} "
                         f"({plan.model.name} on {plan.instance.name}): it {spec.allowed_degrees_text()}")
            continue
        try:
            layouts.append(plan_serving(dataclasses.replace(plan.request, instance_type=name,
                                                            tensor_parallel=plan.degree)))
        except ServingConfigError as error:
            problems.add_all(f"instance_types ({name}) cannot serve the layout: {p}" for p in error.problems)
    problems.raise_if_any()
    return tuple(layouts)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def degree_options(request: ServingRequest) -> tuple[DegreeOption, ...]:
    """Every degree the instance accepts, with its replica count and memory estimate."""
    model, instance, draft = _validate(request)
    return tuple(
        DegreeOption(
            degree,
            instance.cores // degree,
            instance.cores % degree,
            _memory_estimate(model, instance, request, degree, draft),
        )
        for degree in instance.allowed_degrees()
    )


def plan_serving(request: ServingRequest) -> ServingPlan:
    """Validate ``request`` and lay the replicas out on the instance's devices.

    Raises :class:`ServingConfigError` (a ``ValueError``) naming each bad setting.
    """
    model, instance, draft = _validate(request)
    if request.tensor_parallel is not None:
        degree = request.tensor_parallel
        memory = _memory_estimate(model, instance, request, degree, draft)
        if not memory.fits:
            raise ServingConfigError(
                [
                    problem(
                        "tensor_parallel",
                        degree,
                        f"is too small for {model.name} with batch_size {request.batch_size} and "
                        f"sequence_length {request.sequence_length}: needs {memory.describe()}"
                        + _fitting_hint(model, instance, request, draft),
                    )
                ]
            )
    else:
        fitting = [
            (d, m)
            for d in instance.allowed_degrees()
            if (m := _memory_estimate(model, instance, request, d, draft)).fits
        ]
        if not fitting:
            largest = instance.allowed_degrees()[-1]
            memory = _memory_estimate(model, instance, request, largest, draft)
            raise ServingConfigError(
                [
                    problem(
                        "model_id",
                        request.model_id,
                        f"fits at no tensor_parallel degree on {instance.name}: even at {largest} it "
                        f"needs {memory.describe()}; lower batch_size or sequence_length, "
                        "or choose an instance with more NeuronCores",
                    )
                ]
            )
        degree, memory = fitting[0]
    per_replica = degree // CORES_PER_DEVICE
    replicas = tuple(
        Replica(
            index=i,
            devices=tuple(range(i * per_replica, (i + 1) * per_replica)),
            port=request.first_replica_port + i,
        )
        for i in range(instance.devices // per_replica)
    )
    return ServingPlan(request, model, instance, degree, replicas, memory, draft)


def _fitting_hint(model: ModelSpec, instance: InstanceSpec, request: ServingRequest,
                  draft: ModelSpec | None) -> str:
    fitting = [d for d in instance.allowed_degrees() if _memory_estimate(model, instance, request, d, draft).fits]
    if fitting:
        return f"; degrees that fit: {', '.join(map(str, fitting))}"
    return "; no degree fits on this instance"


def layout_document(plan: ServingPlan) -> dict[str, object]:
    """What a deployed layout is made of, as the stack's ``ServingPlan`` output carries it for
    ``neuron-serving bench``; :func:`request_from_layout` reads it back."""
    request = plan.request
    document: dict[str, object] = {
        "model_id": request.model_id,
        "instance_type": request.instance_type,
        "tensor_parallel": plan.degree,
        "batch_size": request.batch_size,
        "sequence_length": request.sequence_length,
        "max_input_tokens": plan.max_input_tokens,
        "dtype": request.dtype,
    }
    if request.prefix_cache_block_size is not None:
        document.update(prefix_cache_block_size=request.prefix_cache_block_size,
                        prefix_cache_blocks=request.effective_prefix_cache_blocks)
    if request.quantization is not None:
        document["quantization"] = request.quantization
    if request.speculative_model is not None:
        document.update(speculative_model=request.speculative_model, speculative_tokens=request.speculative_tokens)
    return document


def request_from_layout(document: Mapping[str, object]) -> ServingRequest:
    """The request that :func:`layout_document` describes; :func:`plan_serving` validates it."""
    missing = [key for key in _LAYOUT_KEYS if key not in document]
    if missing:
        raise ServingConfigError([problem("ServingPlan", dict(document), f"lacks {', '.join(missing)}")])
    optional = {key: document[key] for key in _OPTIONAL_KEYS if key in document}
    return ServingRequest(**{key: document[key] for key in _LAYOUT_KEYS}, **optional)  # type: ignore[arg-type]


_LAYOUT_KEYS = ("model_id", "instance_type", "tensor_parallel", "batch_size", "sequence_length",
                "max_input_tokens", "dtype")
_OPTIONAL_KEYS = ("prefix_cache_block_size", "prefix_cache_blocks", "quantization", "speculative_model",
                  "speculative_tokens")
"""Only in the layout of a prefix cache, of quantized weights or of a draft; a layout without them has none."""
