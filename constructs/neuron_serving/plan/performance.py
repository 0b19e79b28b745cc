"""The performance model: time to first token, inter-token latency, throughput at saturation and
cost per million output tokens of a serving plan, and the layout an objective recommends.

The physics, for one replica of ``degree`` NeuronCores:

- **Static shapes.** Both engines' optimum-neuron (0.3.0 in TGI 3.3.5, 0.4.5 in the vLLM image;
  0.1.0 and 0.3.1.dev in the runs of :data:`PUBLISHED`) compile Llama without bucketing: one
  context-encoding graph of ``sequence_length`` tokens, so every prompt is padded to the export's
  sequence length, and one token-generation graph that runs every slot of the batch over the whole
  sequence length, busy or not (optimum-neuron v0.3.0,
  optimum/neuron/models/inference/backend/modules/decoder/modeling_decoder.py,
  ``create_context_encoding_wrapper`` and ``create_token_generation_wrapper``, with
  ``enable_bucketing`` left at its default, False, by llama/modeling_llama.py; v0.1.0 pads the
  same way in optimum/neuron/backends/hlo/decoder.py). So the time to first token does not depend
  on the prompt's length, and the device's share of a decode step depends on the batch the graph
  was compiled for, not on how many of its slots are busy.
- **Decode** is bound by device memory bandwidth: each step reads every weight once and the KV
  cache of every slot of the compiled batch at the sequence length, each core its share, at the
  device's bandwidth times :data:`DECODE_MEMORY_EFFICIENCY`. Every decoder layer also all-reduces
  its activations across the replica's cores twice; an all-reduce costs :data:`ALLREDUCE_HOP_S`
  for each of a ring's ``2 (degree - 1)`` hops, which is why more cores stop paying off.
- **Each busy slot** adds :data:`SLOT_STEP_S` to the step: its logits over the vocabulary come back
  to the host, which samples the next token (``model.generate``'s loop without a server; TGI's
  and vLLM's per-sequence work behind one). A fitted figure, not derived: optimum-neuron's static
  batching benchmark of Llama 3.1 8B (every slot busy, no server) grows by 28 ms from batch 1 to
  48, more than twice what reading the larger KV cache explains, while a lone request on a batch of
  32 behind a server steps in 26.6 to 26.8 ms, less than the same benchmark's full batch of 32
  without one (33 ms): the growth follows the busy slots, not the compiled batch.
- **Prefill** is bound by compute: 2 FLOPs per parameter per token plus attention's quadratic
  term, over the cores' BF16 FLOPS times :data:`PREFILL_COMPUTE_EFFICIENCY` (or by the weight
  read, for a prompt too short to be compute bound).
- **Behind a server** (TGI, vLLM) every prefill and step also pays :data:`SERVER_STEP_S`.
- **At saturation** every batch slot is busy and new requests queue. A replica then alternates
  between decoding the whole batch and prefilling one newcomer while the batch waits: TGI's
  Neuron backend pauses the active slots during a prefill (TGI v3.3.1,
  backends/neuron/server/text_generation_server/generator.py, ``Generator.prefill``).

What is physics and what is fitted: the FLOPs, the bytes read, the all-reduce hops and the
pauses are derived from the model's shape and the engines' code; hardware figures come from
:class:`~neuron_serving.plan.instances.DeviceSpec`; the five constants above
(:class:`Calibration`) are fitted on the published measurements of :data:`PUBLISHED` (the fit:
``scripts/fit_performance.py``; the check of every figure: ``tests/plan/test_performance.py``).
The error on each figure is the table of docs/performance-model.md (``scripts/fit_performance.py
--table``, which a test compares with the page): the static-batching steps from -7.6% to +4.0%
(growth from batch 1 to 48: +29.6 ms against +28 ms), the Llama 2 figures within 3.0%, the served
figures within 22.0% (the engines' TTFTs at equal shapes are 50% apart, and one server cost stands
for both).

Under load, :func:`predict_load` replays a trace through :mod:`~neuron_serving.plan.queueing` with
each replica's :func:`replica_costs`, a cached prefix and a draft counted in them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

from .errors import Problems, ServingConfigError, problem
from .hub_cache import HubCache
from .instances import INSTANCES, DeviceSpec, instance_spec
from .layout import DTYPE_BYTES, ServingPlan, ServingRequest, degree_options, plan_serving
from .models import ModelSpec, eagle_fc_parameter_count, resolve_model
from .queueing import Arrival, ReplicaCosts, percentile, poisson_trace, simulate

T = TypeVar("T")

# --- Fitted constants ------------------------------------------------------------------------------------------

DECODE_MEMORY_EFFICIENCY = 0.555  # fitted: see PUBLISHED and tests/plan/test_performance.py
"""Fraction of the device memory bandwidth a decode step achieves while it streams weights and KV
cache (the rest goes to the step's other work, which the model does not itemise). The Llama 2
figures, timed without a server at degrees 2 and 24, set it."""

PREFILL_COMPUTE_EFFICIENCY = 0.25  # fitted: see PUBLISHED and tests/plan/test_performance.py
"""Fraction of the NeuronCores' BF16 FLOPS a prefill achieves. The three served prefills set it:
16512 and 4096 padded tokens, where attention is a fifth and a sixteenth of the FLOPs."""

ALLREDUCE_HOP_S = 1.67e-6  # fitted: see PUBLISHED and tests/plan/test_performance.py
"""Cost of each hop of a ring all-reduce (reduce-scatter, then all-gather: ``2 (degree - 1)`` hops).
Decode all-reduces carry a few kilobytes, so their cost is each hop's latency, not the links'
bandwidth. The Llama 2 figures at degrees 2 and 24 set it; a fixed cost per all-reduce besides
the hops does not improve the fit (the figures cannot tell it apart), so the model has none."""

SERVER_STEP_S = 7.92e-3  # fitted: see PUBLISHED and tests/plan/test_performance.py
"""What a server adds to every prefill and decode step: for TGI, the gRPC call from its router to
its Python server and the Python work around each forward pass; for vLLM, its scheduler and
engine loop; for both, detokenizing and streaming. One figure for both servers: their synchronous
inter-token latencies at the same shapes differ by under 1% (26.79 and 26.59 ms)."""

SLOT_STEP_S = 3.35e-4  # fitted: see PUBLISHED and tests/plan/test_performance.py
"""What each busy slot of the batch adds to a decode step (its logits, its sampling and the host's
work on its token). optimum-neuron's static-batching benchmark of Llama 3.1 8B at batches 1 to 48
sets it, with the served runs' throughputs at batch 32."""

# --- Architecture constants ------------------------------------------------------------------------------------

ALLREDUCES_PER_LAYER = 2
"""Tensor-parallel decoder layers all-reduce twice in a forward pass: after attention's output
projection and after the MLP's down projection (Shoeybi et al., "Megatron-LM", arXiv:1909.08053,
section 3; transformers-neuronx and optimum-neuron shard Llama the same way)."""


@dataclass(frozen=True)
class Calibration:
    """The fitted constants together, so that a fit can try other values.

    :param decode_memory_efficiency: Default: :data:`DECODE_MEMORY_EFFICIENCY`.
    :param prefill_compute_efficiency: Default: :data:`PREFILL_COMPUTE_EFFICIENCY`.
    :param allreduce_hop_s: Default: :data:`ALLREDUCE_HOP_S`.
    :param server_step_s: Default: :data:`SERVER_STEP_S`.
    :param slot_step_s: Default: :data:`SLOT_STEP_S`.
    """

    decode_memory_efficiency: float = DECODE_MEMORY_EFFICIENCY
    prefill_compute_efficiency: float = PREFILL_COMPUTE_EFFICIENCY
    allreduce_hop_s: float = ALLREDUCE_HOP_S
    server_step_s: float = SERVER_STEP_S
    slot_step_s: float = SLOT_STEP_S


CALIBRATION = Calibration()
"""The shipped calibration."""

# --- Workload -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """Tokens per request: the prompt and the generated text.

    :param input_tokens: prompt tokens per request.
    :param output_tokens: generated tokens per request.
    :param prefix_tokens: of the prompt's tokens, those of a prefix an earlier request already sent (a
        shared system prompt, a conversation's earlier turns), which a replica's prefix cache holds
        (``ServingRequest.prefix_cache_block_size``). Default: 0.
    :param acceptance: with a draft (``ServingRequest.speculative_model``), the chance that the model
        accepts each of the draft's tokens, from 0 to 1 (exclusive), which depends on the draft and
        the prompts; None to leave speculation out of the predictions. Default: None.
    """

    input_tokens: int
    output_tokens: int
    prefix_tokens: int = 0
    acceptance: float | None = None

    def __post_init__(self) -> None:
        problems = Problems()
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.add(name, value, "must be an integer of at least 1")
        prefix = self.prefix_tokens
        if not isinstance(prefix, int) or isinstance(prefix, bool) or prefix < 0:
            problems.add("prefix_tokens", prefix, "must be an integer of at least 0")
        elif isinstance(self.input_tokens, int) and prefix > self.input_tokens:
            problems.add("prefix_tokens", prefix, f"must be at most input_tokens ({self.input_tokens}): the prefix "
                         "is part of the prompt")
        a = self.acceptance
        if a is not None and (not isinstance(a, (int, float)) or isinstance(a, bool) or not 0 < a < 1):
            problems.add("acceptance", a, "must be a number between 0 and 1 (exclusive)")
        problems.raise_if_any()

    def check_fits(self, request: ServingRequest, prefix: str = "") -> None:
        """Raise :class:`ServingConfigError` unless every request of this workload fits the export's shapes.

        :param prefix: put before the field names in the problems, such as ``workload_`` for the
            stack's context keys. Default: none.
        """
        problems = Problems()
        if self.input_tokens > request.effective_max_input_tokens:
            problems.add(f"{prefix}input_tokens", self.input_tokens,
                         f"must be at most max_input_tokens ({request.effective_max_input_tokens})")
        longest, limit = request.sequence_length, f"sequence_length ({request.sequence_length})"
        if request.speculative_model is not None:
            # The plugin's scheduler ends a request that many tokens before --max-model-len, so that a
            # step's tokens never run past it (vllm-neuron release-0.4.1 and release-0.5.0,
            # vllm_neuron/core/scheduler.py, NeuronScheduler._update_request_with_output).
            longest -= request.speculative_tokens
            limit += (f" less speculative_tokens ({request.speculative_tokens}), {longest}: with a draft, a request "
                      "ends that many tokens before the sequence's end")
        if self.input_tokens + self.output_tokens > longest:
            problems.add(f"{prefix}output_tokens", self.output_tokens,
                         f"plus {prefix}input_tokens ({self.input_tokens}) must be at most {limit}")
        problems.raise_if_any()


DEFAULT_WORKLOAD = Workload(input_tokens=512, output_tokens=256)
"""A chat turn: a system prompt and some history (512 tokens) and an answer of a few paragraphs
(256 tokens). A stated choice, not a measurement; give the workload you expect."""

# --- The physics ----------------------------------------------------------------------------------------------


def _allreduces_s(model: ModelSpec, degree: int, calibration: Calibration) -> float:
    hops = 2 * (degree - 1)
    return model.num_layers * ALLREDUCES_PER_LAYER * hops * calibration.allreduce_hop_s


def _weights_read_s(model: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int,
                    calibration: Calibration) -> float:
    weights_per_core = model.parameter_count * dtype_bytes / degree
    return weights_per_core / (device.memory_bytes_per_second_per_core * calibration.decode_memory_efficiency)


def decode_step_s(model: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int, *, batch_size: int,
                  sequence_length: int, busy: int | None = None, calibration: Calibration = CALIBRATION,
                  served: bool = True) -> float:
    """Seconds one decode step takes: a new token for each of the ``busy`` slots of a graph compiled
    for ``batch_size``, every slot attending over a cache of ``sequence_length`` positions.

    :param busy: slots with a request. Default: ``batch_size`` (a full batch).
    :param served: whether a server (TGI, vLLM) runs the step, adding its own time. Default: true.
    """
    return step_costs(model, device, degree, dtype_bytes, batch_size=batch_size, sequence_length=sequence_length,
                      calibration=calibration, served=served).step(batch_size if busy is None else busy)


@dataclass(frozen=True)
class StepCosts:
    """A decode step's cost as a function of its busy slots: ``fixed_s + busy * per_slot_s``.

    :param fixed_s: the step with no slot busy: the device's work for the compiled batch and the
        server's own, seconds.
    :param per_slot_s: what each busy slot adds, seconds.
    """

    fixed_s: float
    per_slot_s: float

    def step(self, busy: int) -> float:
        """Seconds of a step with ``busy`` slots busy."""
        return self.fixed_s + busy * self.per_slot_s


def step_costs(model: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int, *, batch_size: int,
               sequence_length: int, calibration: Calibration = CALIBRATION, served: bool = True) -> StepCosts:
    """The :class:`StepCosts` of a replica compiled for ``batch_size`` and ``sequence_length``."""
    kv_per_core = batch_size * sequence_length * model.kv_cache_bytes_per_token(dtype_bytes, degree)
    kv_read = kv_per_core / (device.memory_bytes_per_second_per_core * calibration.decode_memory_efficiency)
    fixed = _weights_read_s(model, device, degree, dtype_bytes, calibration) + kv_read
    fixed += _allreduces_s(model, degree, calibration)
    return StepCosts(fixed + (calibration.server_step_s if served else 0.0), calibration.slot_step_s)


def prefill_s(model: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int, *, tokens: int,
              calibration: Calibration = CALIBRATION, served: bool = True, cached: int = 0) -> float:
    """Seconds the prefill of a ``tokens``-token context takes, which yields the first output token.

    FLOPs: 2 per parameter per token, plus attention's scores and weighted values (2 matrix
    products of ``tokens x tokens x attention width``, 2 FLOPs per multiply-add) in every layer,
    over the causal half: from 4096 tokens, optimum-neuron runs the causal flash-attention kernel
    ``CausalAttentionMMSoftmaxMMWithoutSwap`` (v0.3.0, backend/modules/attention/attention_base.py,
    ``perform_prefill``). Shorter prompts compute the full square, where attention is a tenth of
    the FLOPs or less.

    With ``cached`` of the context's tokens in a prefix cache, only the others are computed, each
    attending over the whole context: ``tokens - cached`` tokens' parameters, and attention's
    products of ``(tokens - cached) x tokens``.

    :param served: whether a server (TGI, vLLM) runs the prefill, adding its own time. Default: true.
    :param cached: tokens of the context whose keys and values a prefix cache holds. Default: 0.
    """
    attention_width = model.num_attention_heads * model.head_dim
    new = tokens - cached
    flops = 2 * model.parameter_count * new + 2 * model.num_layers * new * tokens * attention_width
    compute = flops / (degree * device.bf16_flops_per_core * calibration.prefill_compute_efficiency)
    prefill = max(compute, _weights_read_s(model, device, degree, dtype_bytes, calibration))
    prefill += _allreduces_s(model, degree, calibration)
    return prefill + (calibration.server_step_s if served else 0.0)


def saturated_requests_per_second(batch_size: int, prefill: float, full_batch_step: float,
                                  output_tokens: int) -> float:
    """Requests per second one replica completes when requests always wait for its slots.

    In a cycle, each of the ``batch_size`` slots takes a new request (a prefill, while the other
    slots wait, which yields its first token) and the slots decode their remaining
    ``output_tokens - 1`` tokens together, one full-batch step per token.
    """
    return batch_size / (batch_size * prefill + (output_tokens - 1) * full_batch_step)


@dataclass(frozen=True)
class Prediction:
    """What the model predicts for one layout and workload.

    :param degree: NeuronCores per replica.
    :param replicas: replicas on the instance.
    :param ttft_s: time to first token of a request alone on a replica (synchronous), seconds:
        the prefill of a whole sequence, whatever the prompt's length (static shapes).
    :param itl_batch1_s: inter-token latency of a request alone on a replica, seconds: the
        engines' static token-generation graph computes every slot of the compiled batch, but only
        the busy slot's token goes back to the host.
    :param itl_full_batch_s: inter-token latency with every batch slot busy, seconds. At
        saturation, the prefills of newcomers pause it further.
    :param tokens_per_second_replica: output tokens per second of one replica at saturation,
        prefills included.
    :param tokens_per_second_instance: the same for every replica of the instance.
    :param requests_per_second_instance: requests per second of the instance at saturation.
    :param usd_per_million_tokens: on-demand price of the instance per million output tokens at
        saturation (``InstanceSpec.hourly_usd``).
    """

    degree: int
    replicas: int
    ttft_s: float
    itl_batch1_s: float
    itl_full_batch_s: float
    tokens_per_second_replica: float
    tokens_per_second_instance: float
    requests_per_second_instance: float
    usd_per_million_tokens: float


@dataclass(frozen=True)
class Speculation:
    """What a draft does to each step. With a speculation length ``k`` (``ServingRequest.speculative_tokens``,
    NxD Inference's ``speculation_length``), the fused step drafts ``k - 1`` candidate tokens, one draft
    step each, the model verifies the ``k`` positions in its own step, and a last draft pass over them
    prepares the next step (neuronx-distributed-inference cd3abf3, models/model_base.py, the EAGLE token
    generation of ``NeuronFusedSpecModel``: "Generate k-1 candidate tokens"): ``k`` draft steps and up to
    ``k`` tokens a step. Each candidate is accepted with chance ``acceptance`` if every one before it was.

    A step then yields ``(1 - a**k) / (1 - a)`` tokens on average, the accepted candidates and the model's
    own next (Leviathan, Kalman and Matias, "Fast Inference from Transformers via Speculative Decoding",
    ICML 2023, arXiv:2211.17192, equation 1, with ``k - 1`` candidates, for acceptances independent of one
    another). The model's verifying step reads the same weights and KV cache for its ``k`` positions as for
    one, so decode, bound by those reads, costs about the same.

    :param draft_step_s: seconds of one draft step (:func:`draft_step_s`).
    :param tokens: the speculation length ``k``.
    :param acceptance: ``Workload.acceptance``.
    """

    draft_step_s: float
    tokens: int
    acceptance: float

    @property
    def tokens_per_step(self) -> float:
        a = self.acceptance
        return (1 - a**self.tokens) / (1 - a)

    def per_token(self, step: float) -> float:
        """Seconds per generated token when the model's step takes ``step``."""
        return (step + self.tokens * self.draft_step_s) / self.tokens_per_step


def draft_step_s(draft: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int, *, batch_size: int,
                 sequence_length: int, calibration: Calibration = CALIBRATION) -> float:
    """Seconds one step of an EAGLE draft takes inside the model's compiled graph (NxD Inference's fused
    speculation: no server between draft steps): reading its weights, ``fc`` too
    (:func:`~neuron_serving.plan.models.eagle_fc_parameter_count`), sharded as the model's, and its one layer's
    KV cache for the compiled batch, and its layer's all-reduces. Its embeddings are not read whole: a step
    looks up one row per token. (The model's own step counts its embeddings, as the fit of
    :data:`DECODE_MEMORY_EFFICIENCY` did; in a 1-layer draft they would be a third of its weights.)"""
    bandwidth = device.memory_bytes_per_second_per_core * calibration.decode_memory_efficiency
    read = draft.parameter_count - draft.vocab_size * draft.hidden_size
    weights = (read + eagle_fc_parameter_count(draft)) * dtype_bytes / degree
    kv = batch_size * sequence_length * draft.kv_cache_bytes_per_token(dtype_bytes, degree)
    return (weights + kv) / bandwidth + _allreduces_s(draft, degree, calibration)


def cached_prefix_tokens(plan: ServingPlan, workload: Workload) -> int:
    """Of each prompt's tokens, those ``plan``'s prefix cache serves: ``workload.prefix_tokens`` in whole
    blocks (vLLM caches blocks, by the hash of their tokens: vllm/v1/core/kv_cache_utils.py in 0.13.0),
    less one token when that would be the whole prompt (vllm/v1/core/kv_cache_manager.py,
    ``get_computed_blocks``: "When all tokens hit the cache, we must recompute the last token to obtain
    logits"), which recomputes that last block; 0 without a prefix cache."""
    block = plan.request.prefix_cache_block_size
    if not block:
        return 0
    hit = min(workload.prefix_tokens, workload.input_tokens - 1)
    return hit // block * block


def speculation_of(plan: ServingPlan, workload: Workload,
                   calibration: Calibration = CALIBRATION) -> Speculation | None:
    """``plan``'s draft at ``workload.acceptance``, or None without a draft or an acceptance."""
    if plan.draft is None or workload.acceptance is None:
        return None
    step = draft_step_s(plan.draft, plan.instance.device, plan.degree, DTYPE_BYTES[plan.dtype],
                        batch_size=plan.batch_size, sequence_length=plan.sequence_length, calibration=calibration)
    return Speculation(step, plan.request.speculative_tokens, workload.acceptance)


def predict(plan: ServingPlan, workload: Workload = DEFAULT_WORKLOAD) -> Prediction:
    """The predicted latency, throughput and cost of ``plan`` serving ``workload``: with a prefix cache,
    each prompt's cached prefix is not prefilled (:func:`cached_prefix_tokens`); with a draft and
    ``workload.acceptance``, each step yields more than a token (:class:`Speculation`).

    Raises :class:`ServingConfigError` when the workload does not fit the plan's shapes.
    """
    workload.check_fits(plan.request)
    return _predict(plan.model, plan.instance.device, plan.degree, DTYPE_BYTES[plan.dtype], plan.batch_size,
                    plan.sequence_length, len(plan.replicas), plan.instance.hourly_usd, workload.output_tokens,
                    CALIBRATION, cached=cached_prefix_tokens(plan, workload),
                    speculation=speculation_of(plan, workload))


def _predict(model: ModelSpec, device: DeviceSpec, degree: int, dtype_bytes: int, batch_size: int,
             sequence_length: int, replicas: int, hourly_usd: float, output_tokens: int,
             calibration: Calibration, *, cached: int = 0, speculation: Speculation | None = None) -> Prediction:
    shape = (model, device, degree, dtype_bytes)
    ttft = prefill_s(*shape, tokens=sequence_length, calibration=calibration, cached=cached)
    steps = step_costs(*shape, batch_size=batch_size, sequence_length=sequence_length, calibration=calibration)
    step, alone = steps.step(batch_size), steps.step(1)
    if speculation is not None:
        step, alone = speculation.per_token(step), speculation.per_token(alone)
    requests = saturated_requests_per_second(batch_size, ttft, step, output_tokens)
    per_replica = requests * output_tokens
    per_instance = per_replica * replicas
    return Prediction(
        degree=degree,
        replicas=replicas,
        ttft_s=ttft,
        itl_batch1_s=alone,
        itl_full_batch_s=step,
        tokens_per_second_replica=per_replica,
        tokens_per_second_instance=per_instance,
        requests_per_second_instance=requests * replicas,
        usd_per_million_tokens=hourly_usd / (per_instance * 3600) * 1e6,
    )


def prediction_document(prediction: Prediction) -> dict[str, float | int]:
    """``prediction``'s fields, times in seconds, rounded to four significant digits: the stack's
    ``PredictedPerformance`` output, which ``neuron-serving bench --stack`` compares with what it
    measures."""
    return {name: float(f"{value:.4g}") if isinstance(value, float) else value
            for name, value in asdict(prediction).items()}


def replica_costs(plan: ServingPlan, calibration: Calibration = CALIBRATION,
                  workload: Workload | None = None) -> ReplicaCosts:
    """What one replica of ``plan`` costs per operation, for the discrete-event model of
    :mod:`~neuron_serving.plan.queueing`: each prefill the whole sequence's (static shapes), each
    step the compiled batch's plus each busy slot's share.

    With ``workload``, as :func:`predict` counts them: a prefix cache leaves each prompt's cached prefix
    unprefilled (:func:`cached_prefix_tokens`), and a draft, given ``workload.acceptance``, makes a step
    stand for the mean time of a token (:meth:`Speculation.per_token`: the model's step and its draft
    steps over the tokens a step yields on average). The simulation then steps one token at a time at
    that mean; how the accepted tokens vary from step to step is not simulated.

    :param workload: the requests, for their cached prefix and the draft's acceptance. Default: none
        (neither counted).
    """
    shape = (plan.model, plan.instance.device, plan.degree, DTYPE_BYTES[plan.dtype])
    steps = step_costs(*shape, batch_size=plan.batch_size, sequence_length=plan.sequence_length,
                       calibration=calibration)
    cached = 0 if workload is None else cached_prefix_tokens(plan, workload)
    prefill = prefill_s(*shape, tokens=plan.sequence_length, calibration=calibration, cached=cached)
    fixed, per_slot = steps.fixed_s, steps.per_slot_s
    speculation = None if workload is None else speculation_of(plan, workload, calibration)
    if speculation is not None:
        # per_token(fixed + busy x per_slot) = per_token(fixed) + busy x per_slot / tokens_per_step
        fixed, per_slot = speculation.per_token(fixed), per_slot / speculation.tokens_per_step
    return ReplicaCosts(plan.batch_size, prefill, fixed, step_per_slot_s=per_slot)


LOAD_REQUESTS = 2000
"""Requests of the trace a load prediction replays: its p99 is the 20th slowest."""


@dataclass(frozen=True)
class LoadPrediction:
    """What the discrete-event model predicts for a fleet of one layout under a request rate.

    :param rate: requests per second arriving at the fleet.
    :param instances: instances of the fleet, each with the layout's replicas.
    :param utilisation: the rate over what the fleet completes at saturation.
    :param ttft_p50_s: median time to first token, seconds.
    :param ttft_p99_s: 99th percentile of the time to first token, seconds.
    :param itl_p99_s: 99th percentile of each request's mean inter-token latency (prefills of
        newcomers that pause its batch included), seconds.
    :param e2e_p99_s: 99th percentile of the end-to-end latency, seconds.
    :param usd_per_hour: on-demand price of the fleet per hour.
    :param usd_per_million_tokens: that price over the output tokens the rate asks for.
    """

    rate: float
    instances: int
    utilisation: float
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p99_s: float
    e2e_p99_s: float
    usd_per_hour: float
    usd_per_million_tokens: float


def predict_load(plan: ServingPlan, workload: Workload, rate: float, instances: int = 1,
                 trace: Sequence[Arrival] | None = None, calibration: Calibration = CALIBRATION) -> LoadPrediction:
    """The latency percentiles of ``instances`` instances laid out as ``plan`` under ``rate``
    requests per second of ``workload``: :data:`LOAD_REQUESTS` Poisson arrivals (seed 0), or
    ``trace``. The fleet's load balancer (least outstanding requests) and each host's router
    (leastconn) are modelled as one leastconn over every replica of the fleet. With ``trace``,
    ``workload`` checks the shapes (give its largest request) and gives the prefix and the acceptance,
    and the utilisation and the price per token are the trace's mean request's. A cached prefix and a
    draft count as :func:`replica_costs` says, for the mean request."""
    workload.check_fits(plan.request)
    requests = poisson_trace(rate, LOAD_REQUESTS, workload.input_tokens, workload.output_tokens) \
        if trace is None else trace
    mean = workload if trace is None else _mean_workload(trace, workload)
    timings = simulate(replica_costs(plan, calibration, mean), len(plan.replicas) * instances, requests)
    itl = [(t.e2e_s - t.ttft_s) / (r.output_tokens - 1) for t, r in zip(timings, requests, strict=True)
           if r.output_tokens > 1]
    saturated = _predict(plan.model, plan.instance.device, plan.degree, DTYPE_BYTES[plan.dtype], plan.batch_size,
                         plan.sequence_length, len(plan.replicas), plan.instance.hourly_usd, mean.output_tokens,
                         calibration, cached=cached_prefix_tokens(plan, mean),
                         speculation=speculation_of(plan, mean, calibration))
    hourly = plan.instance.hourly_usd * instances
    return LoadPrediction(
        rate=rate,
        instances=instances,
        utilisation=rate / (saturated.requests_per_second_instance * instances),
        ttft_p50_s=percentile([t.ttft_s for t in timings], 50),
        ttft_p99_s=percentile([t.ttft_s for t in timings], 99),
        itl_p99_s=percentile(itl, 99) if itl else 0.0,
        e2e_p99_s=percentile([t.e2e_s for t in timings], 99),
        usd_per_hour=hourly,
        usd_per_million_tokens=hourly / (rate * mean.output_tokens * 3600) * 1e6,
    )


def _mean_workload(trace: Sequence[Arrival], workload: Workload) -> Workload:
    """The mean request of ``trace``, in whole tokens: with static shapes, what a replica completes
    at saturation depends on the prompt not at all and on the output's mean only. ``workload``'s
    prefix (at most the mean prompt) and acceptance hold for it."""
    inputs = max(1, round(sum(r.input_tokens for r in trace) / len(trace)))
    return Workload(inputs, max(1, round(sum(r.output_tokens for r in trace) / len(trace))),
                    min(workload.prefix_tokens, inputs), workload.acceptance)


# --- Published measurements -----------------------------------------------------------------------------------

_PYTORCH_BLOG = "High performance Llama 2 deployments with AWS Inferentia2 using TorchServe (PyTorch blog)"
_PYTORCH_BLOG_URL = "https://pytorch.org/blog/high-performance-llama/"
_TRANSFORMERS_NEURONX = "transformers-neuronx LlamaForSampling, no server; Neuron SDK 2.13 (2.13.2 artifacts)"
_HF_GUIDE = "Optimum Neuron benchmark guide: TGI on Inferentia2 with data parallelism, measured with GuideLLM"
_HF_GUIDE_URL = "https://huggingface.co/docs/optimum-neuron/guides/benchmark"
_TGI = ("TGI latest-neuron image run 2025-05-27; TGI v3.3.0 to v3.3.2 build it with optimum-neuron 0.1.0, "
        "neuronx-cc 2.16.372 and transformers-neuronx 0.13.322 (Dockerfile.neuron)")
_TGI_BENCHMARK = "optimum-neuron's TGI benchmark of Llama 3.1 8B on inf2.48xlarge with 3 replicas (GuideLLM)"
_TGI_BENCHMARK_URL = ("https://github.com/huggingface/optimum-neuron/blob/main/benchmark/text-generation-inference/"
                      "performance/llama3.1-8b/tgi-results.csv")
_TGI_JUNE = ("TGI Neuron image run 2025-06-03 (the benchmark's README pulls latest-neuron; TGI v3.3.2 of 2025-05-30 "
             "builds it with optimum-neuron 0.1.0 and neuronx-cc 2.16.372)")
_VLLM_BENCHMARK = "optimum-neuron's vLLM data-parallel benchmark of Llama 3.1 8B on inf2.48xlarge (GuideLLM)"
_VLLM_BENCHMARK_URL = ("https://github.com/huggingface/optimum-neuron/blob/main/benchmark/vllm/data-parallel/"
                       "llama3.1-8b/vllm-results-dp3.csv")
_VLLM = ("optimum-neuron-vllm image built from optimum-neuron main (0.3.1.dev, Neuron SDK 2.24 runtime), "
         "run 2025-09-16")
_LLAMA2_NOTE = ("end-to-end latency over 256 output tokens after a 256-token prompt (the lengths the post "
                "states for its inf2.xlarge/inf2.48xlarge comparison), bf16")
_TGI_BENCHMARK_NOTE = ("3 replicas of degree 8 behind nginx (the benchmark's docker-compose.yaml and .env); "
                       "figures are the means of the CSV's three runs; output lengths are its tokens per second "
                       "over its requests per second")
_VLLM_BENCHMARK_NOTE = ("3 replicas of degree 8 behind nginx (docker-compose-dp3.yaml, .env), GuideLLM "
                        "prompt_tokens=1500, generated_tokens=250; output lengths are its tokens per second over "
                        "its requests per second")
_GUIDE_NOTE = ("3 replicas of degree 8 behind nginx round robin; figures are GuideLLM's means, the workload "
               "its mean prompt and output lengths")


@dataclass(frozen=True)
class PublishedFigure:
    """One published measurement the model is fitted on and checked against.

    :param model: catalog name of the model.
    :param instance: instance type it ran on.
    :param degree: tensor-parallel degree of each replica.
    :param replicas: replicas serving together (figures of the whole instance).
    :param batch: static batch size of the export.
    :param sequence: static sequence length of the export.
    :param workload: prompt and output tokens per request.
    :param metric: what was measured, in its unit: ``ms_per_output_token`` (end-to-end latency
        over output tokens), ``ttft_s``, ``itl_ms`` (a lone request's), ``step_ms`` (a decode
        step with every slot busy), ``requests_per_second`` or ``output_tokens_per_second``.
    :param value: the published figure, in the metric's unit.
    :param engine: the software that served it, with its Neuron SDK.
    :param served: whether a server (TGI, vLLM) stood between the clock and the model.
    :param source: the publication's title.
    :param url: where it is published.
    :param note: how the figure was taken.
    """

    model: str
    instance: str
    degree: int
    replicas: int
    batch: int
    sequence: int
    workload: Workload
    metric: str
    value: float
    engine: str
    served: bool
    source: str
    url: str
    note: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        """A short label, e.g. ``llama-2-7b degree 2 ms_per_output_token``."""
        return f"{self.model} degree {self.degree} {self.metric}"


def _llama2(model: str, instance: str, degree: int, ms_per_token: float) -> PublishedFigure:
    return PublishedFigure(model, instance, degree, 1, 1, 512, Workload(256, 256), "ms_per_output_token",
                           ms_per_token, _TRANSFORMERS_NEURONX, False, _PYTORCH_BLOG, _PYTORCH_BLOG_URL,
                           _LLAMA2_NOTE)


def _llama31_long(metric: str, value: float, workload: Workload) -> PublishedFigure:
    return PublishedFigure("llama-3.1-8b", "inf2.48xlarge", 8, 3, 8, 16512, workload, metric, value, _TGI, True,
                           _HF_GUIDE, _HF_GUIDE_URL, _GUIDE_NOTE)


def _llama31_short(metric: str, value: float, workload: Workload) -> PublishedFigure:
    return PublishedFigure("llama-3.1-8b", "inf2.48xlarge", 8, 3, 32, 4096, workload, metric, value, _TGI_JUNE, True,
                           _TGI_BENCHMARK, _TGI_BENCHMARK_URL, _TGI_BENCHMARK_NOTE)


def _llama31_vllm(metric: str, value: float, workload: Workload) -> PublishedFigure:
    return PublishedFigure("llama-3.1-8b", "inf2.48xlarge", 8, 3, 32, 4096, workload, metric, value, _VLLM, True,
                           _VLLM_BENCHMARK, _VLLM_BENCHMARK_URL, _VLLM_BENCHMARK_NOTE)


_STATIC_BATCHING = "optimum-neuron's static-batching benchmark of Llama 3.1 8B on inf2.48xlarge (model.generate)"
_STATIC_BATCHING_URL = ("https://github.com/huggingface/optimum-neuron/blob/main/docs/source/benchmarks/"
                        "inferentia-llama3.1-8b.mdx")
_STATIC_BATCHING_ENGINE = ("optimum-neuron 0.2.0.dev7 (Neuron SDK 2.22) NeuronModelForCausalLM.generate, greedy, "
                           "no server; run of 2025-06-04 (optimum-neuron 55ecce60)")
_STATIC_BATCHING_NOTE = ("benchmark/text-generation/performance/benchmark.py at 55ecce60: every slot of the batch "
                         "holds the same prompt, 256 new tokens, latency = (generate time - one-token generate time) "
                         "/ new tokens; the figure is docs/assets/benchmarks/inferentia-llama3.1-8b/latency.png's "
                         "plateau from 1024 input tokens (12 at 1024, 13 from 1280 for batch 4)")


def _static_batch(batch: int, step_ms: float) -> PublishedFigure:
    return PublishedFigure("llama-3.1-8b", "inf2.48xlarge", 8, 1, batch, 4096, Workload(1792, 256), "step_ms",
                           step_ms, _STATIC_BATCHING_ENGINE, False, _STATIC_BATCHING, _STATIC_BATCHING_URL,
                           _STATIC_BATCHING_NOTE)


STATIC_BATCHING = tuple(_static_batch(batch, step) for batch, step in
                        ((1, 11.0), (4, 12.5), (8, 16.0), (16, 21.0), (32, 33.0), (48, 39.0)))
"""optimum-neuron's published decode step of Llama 3.1 8B at degree 8 and sequence 4096, by batch."""

_SYNCHRONOUS = Workload(15903, 293)
"""GuideLLM's synchronous run: one request at a time, mean prompt 15902.82 and output 293.09 tokens."""
_THROUGHPUT = Workload(15899, 294)
"""GuideLLM's throughput run: as many requests as the replicas take, mean prompt 15899.22 and output
294.24 tokens."""

PUBLISHED: tuple[PublishedFigure, ...] = (
    # "For the Llama-2 7B model, latency decreases from 30.1 ms/token with 2 cores to 7.9 ms/token with
    # 24 cores; similarly for the Llama-2 13B model, it goes down from 57.3 ms/token to 11.1 ms/token."
    # Batch 1, bf16. 7B's 2 cores are an inf2.xlarge (the post's cost comparison); 13B's instance
    # with 2 cores is not named, and one device is one device on inf2.xlarge and inf2.8xlarge.
    _llama2("llama-2-7b", "inf2.xlarge", 2, 30.1),
    _llama2("llama-2-7b", "inf2.48xlarge", 24, 7.9),
    _llama2("llama-2-13b", "inf2.8xlarge", 2, 57.3),
    _llama2("llama-2-13b", "inf2.48xlarge", 24, 11.1),
    # GuideLLM's "Performance Summary by Benchmark": synchronous TTFT 1585.08 ms and ITL 29.81 ms;
    # throughput 0.85 req/sec and 249.64 tokens/sec. The guide's latest text names optimum-neuron's
    # vLLM image, but its results are those of the TGI run of 2025-05-27 that the earlier text
    # (and its `docker pull ghcr.io/huggingface/text-generation-inference:latest-neuron`) describes.
    _llama31_long("ttft_s", 1.585, _SYNCHRONOUS),
    _llama31_long("itl_ms", 29.81, _SYNCHRONOUS),
    _llama31_long("requests_per_second", 0.85, _THROUGHPUT),
    _llama31_long("output_tokens_per_second", 249.64, _THROUGHPUT),
    # The same layout with short prompts (GuideLLM prompt_tokens=1500, generated_tokens=250, many
    # answers ending sooner), batch 32, sequence 4096: synchronous TTFT 315.8, 317.9 and 316.8 ms,
    # ITL 26.79, 26.90 and 26.69 ms; throughput 5.17, 5.01 and 5.14 req/s, 929.0, 913.6 and
    # 914.9 tokens/s.
    _llama31_short("ttft_s", 0.3168, Workload(1500, 175)),
    _llama31_short("itl_ms", 26.79, Workload(1500, 175)),
    _llama31_short("requests_per_second", 5.108, Workload(1500, 180)),
    _llama31_short("output_tokens_per_second", 919.2, Workload(1500, 180)),
    # The same layout and workload on optimum-neuron's vLLM server (the run of 2025-09-16, committed
    # in optimum-neuron 1a5f34f4): synchronous TTFT 475.05 ms and ITL 26.59 ms; throughput 5.331
    # req/s and 1226.1 tokens/s.
    _llama31_vllm("ttft_s", 0.4751, Workload(1500, 242)),
    _llama31_vllm("itl_ms", 26.59, Workload(1500, 242)),
    _llama31_vllm("requests_per_second", 5.331, Workload(1500, 230)),
    _llama31_vllm("output_tokens_per_second", 1226.1, Workload(1500, 230)),
    # Inter-token latency with every slot busy, batches 1 to 48, sequence 4096, no server.
    *STATIC_BATCHING,
)
"""Every published measurement the fitted constants rest on, with its source."""


def predict_published(figure: PublishedFigure, calibration: Calibration = CALIBRATION) -> float:
    """What the model predicts for ``figure``, in the figure's unit."""
    model = resolve_model(figure.model)
    instance = instance_spec(figure.instance)
    shape = (model, instance.device, figure.degree, DTYPE_BYTES["bf16"])
    if figure.metric == "step_ms":
        return decode_step_s(*shape, batch_size=figure.batch, sequence_length=figure.sequence,
                             calibration=calibration, served=figure.served) * 1e3
    if figure.metric == "ms_per_output_token":
        # transformers-neuronx of 2023 encoded the context in buckets near the prompt's length
        # ("parallel context encoding" in the post), so the prompt is what its prefill computes.
        output = figure.workload.output_tokens
        first = prefill_s(*shape, tokens=figure.workload.input_tokens, calibration=calibration,
                          served=figure.served)
        step = decode_step_s(*shape, batch_size=figure.batch, sequence_length=figure.sequence,
                             calibration=calibration, served=figure.served)
        return (first + (output - 1) * step) / output * 1e3
    prediction = _predict(*shape, figure.batch, figure.sequence, figure.replicas, instance.hourly_usd,
                          figure.workload.output_tokens, calibration)
    figures = {
        "ttft_s": prediction.ttft_s,
        "itl_ms": prediction.itl_batch1_s * 1e3,
        "requests_per_second": prediction.requests_per_second_instance,
        "output_tokens_per_second": prediction.tokens_per_second_instance,
    }
    return figures[figure.metric]


# --- Recommending a layout ------------------------------------------------------------------------------------

OBJECTIVES = ("latency", "throughput", "cost", "goodput")
"""What a recommendation optimises: ``latency`` the inter-token latency at full batch (among those
within :data:`LATENCY_TIE_FRACTION` of the lowest, the time to first token), ``throughput`` the
output tokens per second of the instance, ``cost`` the price per million output tokens at
saturation, ``goodput`` the price per hour of the fewest instances that serve a request rate
within p99 latency targets (:class:`Goodput`)."""

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 48)
"""The batch sizes an objective chooses among. 48 is the largest batch the model's step is fitted
on (:data:`STATIC_BATCHING`); beyond it, the model would extrapolate."""


@dataclass(frozen=True)
class LayoutSpace:
    """The batch sizes and sequence lengths an objective chooses among (with every degree whose
    memory fits).

    :param batch_sizes: Default: :data:`BATCH_SIZES`.
    :param sequence_lengths: Default: the powers of two from the shortest the workload fits in up to
        the request's ``sequence_length``, and that length itself.
    :param min_sequence_length: the shortest sequence the engine compiles for the request (a prefix
        cache's buckets start at 512 tokens with engine nxdi). Default: 1.
    """

    batch_sizes: tuple[int, ...] | None = None
    sequence_lengths: tuple[int, ...] | None = None
    min_sequence_length: int = 1

    @classmethod
    def fixed(cls, request: ServingRequest) -> LayoutSpace:
        """Only the request's own batch size and sequence length: the degree alone is chosen."""
        return cls((request.batch_size,), (request.sequence_length,))

    def requests(self, request: ServingRequest, workload: Workload) -> list[ServingRequest]:
        """``request`` with each batch size and sequence length of the space that ``workload`` fits in."""
        sequences = self.sequence_lengths
        if sequences is None:
            need = max(workload.input_tokens + workload.output_tokens, math.ceil(workload.input_tokens * 4 / 3) + 1)
            length = 1 << max(0, need - 1).bit_length()
            shorter = []
            while length < request.sequence_length:
                shorter.append(length)
                length *= 2
            sequences = (*shorter, request.sequence_length)
        found = []
        for sequence in sequences:
            if sequence < self.min_sequence_length:
                continue
            explicit = request.max_input_tokens is not None and request.max_input_tokens < sequence
            for batch in BATCH_SIZES if self.batch_sizes is None else self.batch_sizes:
                candidate = replace(request, batch_size=batch, sequence_length=sequence,
                                    max_input_tokens=request.max_input_tokens if explicit else None)
                # A prefix cache of a given block count holds only the batches it covers at full length.
                if (candidate.prefix_cache_blocks is not None
                        and candidate.prefix_cache_blocks < candidate.min_prefix_cache_blocks):
                    continue
                try:
                    workload.check_fits(candidate)
                except ServingConfigError:
                    continue
                found.append(candidate)
        return found


@dataclass(frozen=True)
class Goodput:
    """What the ``goodput`` objective must serve: a request rate within p99 latency targets.

    :param rate: requests per second arriving at the fleet.
    :param p99_ttft_ms: the highest 99th percentile of the time to first token, milliseconds.
        Default: no target.
    :param p99_itl_ms: the highest 99th percentile of a request's mean inter-token latency,
        milliseconds. Default: no target.
    :param max_instances: the most instances the fleet may have. Default: 32.
    """

    rate: float
    p99_ttft_ms: float | None = None
    p99_itl_ms: float | None = None
    max_instances: int = 32

    def __post_init__(self) -> None:
        problems = Problems()
        for name in ("rate", "p99_ttft_ms", "p99_itl_ms"):
            value = getattr(self, name)
            if value is None and name != "rate":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                problems.add(name, value, "must be a positive number")
        if isinstance(self.max_instances, bool) or not isinstance(self.max_instances, int) or self.max_instances < 1:
            problems.add("max_instances", self.max_instances, "must be an integer of at least 1")
        problems.raise_if_any()

    def misses(self, load: LoadPrediction) -> tuple[str, ...]:
        """Each target ``load`` does not meet, as ``setting (target): predicted figure``."""
        misses = []
        if self.p99_ttft_ms is not None and load.ttft_p99_s * 1e3 > self.p99_ttft_ms:
            misses.append(f"p99_ttft_ms ({_number(self.p99_ttft_ms)}): {load.ttft_p99_s * 1e3:.0f} ms")
        if self.p99_itl_ms is not None and load.itl_p99_s * 1e3 > self.p99_itl_ms:
            misses.append(f"p99_itl_ms ({_number(self.p99_itl_ms)}): {load.itl_p99_s * 1e3:.1f} ms")
        return tuple(misses)

    def describe(self) -> str:
        targets = [f"p99 TTFT <= {_number(self.p99_ttft_ms)} ms"] if self.p99_ttft_ms is not None else []
        targets += [f"p99 ITL <= {_number(self.p99_itl_ms)} ms"] if self.p99_itl_ms is not None else []
        return f"{_number(self.rate)} requests/s" + (f" with {' and '.join(targets)}" if targets else "")


GOODPUT_TIES = 8
"""Fleets of the lowest price that meet the targets the ``goodput`` objective compares (in the
order of their time to first token alone) before it takes the one with the lowest p99 TTFT."""

GOODPUT_UTILISATION = 0.95
"""The highest utilisation the ``goodput`` objective starts its search of instance counts from:
at 100% a queue grows without end."""


@dataclass(frozen=True)
class Constraints:
    """Limits every recommended layout must meet; ``None`` sets no limit.

    :param max_itl_ms: highest inter-token latency with every batch slot busy, milliseconds.
    :param max_ttft_ms: highest time to first token of a request alone on a replica, milliseconds.
    :param min_tokens_per_second: fewest output tokens per second of the instance at saturation.
    """

    max_itl_ms: float | None = None
    max_ttft_ms: float | None = None
    min_tokens_per_second: float | None = None

    def __post_init__(self) -> None:
        problems = Problems()
        for name in ("max_itl_ms", "max_ttft_ms", "min_tokens_per_second"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                problems.add(name, value, "must be a positive number")
        problems.raise_if_any()

    def misses(self, prediction: Prediction) -> tuple[str, ...]:
        """Each limit ``prediction`` does not meet, as ``setting (limit): predicted figure``."""
        return tuple(
            f"{_CONSTRAINTS[name].setting} ({_number(limit)}): {_CONSTRAINTS[name].show(prediction)}"
            for name, limit in self.limits()
            if not _CONSTRAINTS[name].meets(prediction, limit)
        )

    def limits(self) -> tuple[tuple[str, float], ...]:
        """``(setting, limit)`` for each limit that is set."""
        return tuple((name, limit) for name in _CONSTRAINTS if (limit := getattr(self, name)) is not None)


@dataclass(frozen=True)
class _Constraint:
    setting: str
    figure: Callable[[Prediction], float]
    unit: str
    at_most: bool
    describes: str

    def meets(self, prediction: Prediction, limit: float) -> bool:
        value = self.figure(prediction)
        return value <= limit if self.at_most else value >= limit

    def show(self, prediction: Prediction) -> str:
        return f"{self.figure(prediction):.1f} {self.unit}"


_CONSTRAINTS = {
    "max_itl_ms": _Constraint("max_itl_ms", lambda p: p.itl_full_batch_s * 1e3, "ms", True,
                              "inter-token latency at full batch"),
    "max_ttft_ms": _Constraint("max_ttft_ms", lambda p: p.ttft_s * 1e3, "ms", True, "time to first token"),
    "min_tokens_per_second": _Constraint("min_tokens_per_second", lambda p: p.tokens_per_second_instance,
                                         "tokens/s", False, "output tokens per second of the instance"),
}


def _number(value: float) -> str:
    return f"{value:g}"


def layout_label(plan: ServingPlan) -> str:
    """``degree 8, batch 32, sequence 1024``: what an objective chooses of a layout."""
    return f"degree {plan.degree}, batch {plan.batch_size}, sequence {plan.sequence_length}"


@dataclass(frozen=True)
class Recommendation:
    """The layout an objective picks, and why.

    :param plan: the recommended layout.
    :param prediction: its predicted figures.
    :param reason: why, in one or two sentences for the user, starting with what the layout has
        that the objective asks for: it reads after "degree 8 (3 replicas), batch 32, sequence 1024: ".
    :param candidates: every layout whose memory fits and that holds the workload, each with its
        prediction, by degree, batch size and sequence length.
    :param rejected: ``(layout, why)`` for each layout ruled out, by memory or by a constraint;
        ``layout`` is a degree alone (``degree 2``) where the memory of the request's own batch
        and sequence rules it out.
    :param load: with ``goodput``, the fleet and its predicted percentiles at the rate.
    """

    plan: ServingPlan
    prediction: Prediction
    reason: str
    candidates: tuple[tuple[ServingPlan, Prediction], ...]
    rejected: tuple[tuple[str, str], ...]
    load: LoadPrediction | None = None

    @property
    def instances(self) -> int:
        """Instances of the recommended fleet: ``goodput``'s count, else 1."""
        return 1 if self.load is None else self.load.instances


LATENCY_TIE_FRACTION = 0.05
"""Inter-token latencies within this fraction of the lowest count as equal for the ``latency``
objective, which then prefers the shortest time to first token. Degrees of one model differ by
less only where the collectives' cost catches up with the bandwidth gained, and the model is not
that precise: its figures stray up to a quarter from the published ones."""


def _ranked(objective: str, items: Sequence[T], prediction: Callable[[T], Prediction]) -> list[T]:
    """``items`` best first for ``objective`` (not ``goodput``, whose order is its fleet's price)."""
    if objective == "throughput":
        return sorted(items, key=lambda i: (-prediction(i).tokens_per_second_instance, prediction(i).itl_full_batch_s))
    if objective == "cost":
        return sorted(items, key=lambda i: (prediction(i).usd_per_million_tokens, prediction(i).itl_full_batch_s))
    lowest = min(prediction(i).itl_full_batch_s for i in items)

    def latency(item: T) -> tuple[bool, float]:
        figures = prediction(item)
        if figures.itl_full_batch_s <= lowest * (1 + LATENCY_TIE_FRACTION):
            return False, figures.ttft_s
        return True, figures.itl_full_batch_s

    return sorted(items, key=latency)


def candidates(request: ServingRequest, workload: Workload = DEFAULT_WORKLOAD,
               space: LayoutSpace | None = None) -> tuple[tuple[ServingPlan, Prediction], ...]:
    """Every layout of ``request``'s instance whose memory fits, each laid out and predicted: every
    degree (``request.tensor_parallel`` is ignored), with each batch size and sequence length of
    ``space`` that ``workload`` fits in. Raises :class:`ServingConfigError` for a bad request or
    workload.

    :param space: Default: the request's own batch size and sequence length (:meth:`LayoutSpace.fixed`).
    """
    request = replace(request, tensor_parallel=None)
    degree_options(request)  # validates the request itself
    space = LayoutSpace.fixed(request) if space is None else space
    if space == LayoutSpace.fixed(request):
        workload.check_fits(request)
    found = []
    for shaped in space.requests(request, workload):
        for option in degree_options(shaped):
            if option.memory.fits:
                plan = plan_serving(replace(shaped, tensor_parallel=option.degree))
                found.append((plan, predict(plan, workload)))
    return tuple(sorted(found, key=lambda c: (c[0].degree, c[0].batch_size, c[0].sequence_length)))


def _check_objective(objective: str, goodput: Goodput | None) -> None:
    if objective not in OBJECTIVES:
        raise ServingConfigError([problem("objective", objective, f"must be one of {', '.join(OBJECTIVES)}")])
    if objective == "goodput" and goodput is None:
        raise ServingConfigError([problem("rate", None, "is needed by the goodput objective: the requests per "
                                                        "second the fleet must serve")])
    if objective != "goodput" and goodput is not None:
        raise ServingConfigError([problem("rate", goodput.rate, f"applies only to the goodput objective, "
                                                                f"not {objective}")])


def recommend(request: ServingRequest, objective: str, constraints: Constraints = Constraints(),
              workload: Workload = DEFAULT_WORKLOAD, *, goodput: Goodput | None = None,
              space: LayoutSpace | None = None, trace: Sequence[Arrival] | None = None,
              cached: HubCache | None = None) -> Recommendation:
    """The layout of ``request``'s instance that best meets ``objective`` within ``constraints``.

    Every layout of ``space`` is predicted: each degree the instance accepts whose memory fits
    (``request.tensor_parallel`` is ignored), with each batch size and sequence length that holds
    ``workload``. Those missing a constraint are ruled out; the objective picks among the rest:
    ``latency`` the lowest inter-token latency at full batch (within :data:`LATENCY_TIE_FRACTION`,
    the shortest time to first token), ``throughput`` the most output tokens per second of the
    instance, ``cost`` the lowest price per million output tokens at saturation, ``goodput`` the
    cheapest fleet (layout and instance count) whose predicted p99s at ``goodput.rate`` meet its
    targets, replaying ``trace`` if given (see :func:`predict_load`).

    :param space: Default: :class:`LayoutSpace` ``()``, every batch size of :data:`BATCH_SIZES`
        and the sequence lengths the workload fits in.
    :param cached: what optimum-neuron's Hub cache holds of the model for the image: when the best
        layout is not in it but one that is comes within :data:`CACHED_MARGIN` of it on the
        objective's figure, that one is recommended, and the reason says so. Default: the cache is
        not consulted.

    Raises :class:`ServingConfigError` for a bad objective, request or workload, when nothing fits,
    and when no layout meets the constraints or targets (naming each, with the best any reaches).
    """
    _check_objective(objective, goodput)
    request = replace(request, tensor_parallel=None)
    space = LayoutSpace() if space is None else space
    found = candidates(request, workload, space)
    if not found:
        if space.requests(request, workload):
            plan_serving(request)  # raises the planner's own error, which says what would fit
        workload.check_fits(request)  # raises what does not hold the workload
        raise ServingConfigError([problem("batch_size", request.batch_size, "and sequence_length: no batch size and "
                                          "sequence length of the search both fits in memory and holds the workload")])
    rejected = [
        (f"degree {option.degree}", f"does not fit: needs {option.memory.describe()}")
        for option in degree_options(request)
        if not option.memory.fits
    ]
    passing = []
    for plan, prediction in found:
        misses = constraints.misses(prediction)
        if misses:
            rejected.append((layout_label(plan), "misses " + "; ".join(misses)))
        else:
            passing.append((plan, prediction))
    if not passing:
        raise ServingConfigError(_unmet(constraints, found))
    missed = sorted(label for label, why in rejected if why.startswith("misses"))
    if objective == "goodput":
        assert goodput is not None
        plan, prediction, load = _cheapest_fleet(passing, workload, goodput, trace)
        reason = _goodput_reason(plan, load, goodput, len(passing))
        if cached is not None:
            plan, prediction, load, reason = _prefer_cached_fleet(cached, passing, workload, goodput, trace,
                                                                  (plan, prediction, load), reason)
        return Recommendation(plan, prediction, reason, found, tuple(rejected), load)
    ranked = _ranked(objective, passing, lambda candidate: candidate[1])
    plan, prediction = ranked[0]
    reason = _reason(objective, ranked, missed)
    if cached is not None:
        plan, prediction, reason = _prefer_cached(objective, cached, ranked, reason)
    return Recommendation(plan, prediction, reason, found, tuple(rejected))


CACHED_MARGIN = 0.10
"""How far behind the best layout, on the objective's own figure, a layout in optimum-neuron's Hub
cache may be and still be recommended instead (``latency``: the inter-token latency at full batch;
``throughput``: the tokens per second; ``cost``: the price per million tokens; ``goodput``: the
fleet's price per hour). A cached layout is one the cache's own pipeline compiled and published for
this optimum-neuron and compiler, so the host's export fetches its graphs rather than compiling
them (the ``hub_compile_cache`` setting, on by default). 10% is under half the performance
model's error on served figures (up to 22%, docs/performance-model.md): layouts that close are not
told apart with confidence, so the cached one costs little that the model can vouch for."""


@dataclass(frozen=True)
class _Figure:
    show: Callable[[Prediction], str]
    value: Callable[[Prediction], float]
    lower_is_better: bool


_FIGURES = {
    "latency": _Figure(lambda p: f"{p.itl_full_batch_s * 1e3:.1f} ms inter-token latency at full batch",
                       lambda p: p.itl_full_batch_s, True),
    "throughput": _Figure(lambda p: f"{_throughput_figure(p)}", lambda p: p.tokens_per_second_instance, False),
    "cost": _Figure(lambda p: f"{_cost_figure(p)} per million output tokens", lambda p: p.usd_per_million_tokens,
                    True),
}


def _behind(best: float, other: float, lower_is_better: bool) -> float:
    """How far ``other`` is behind ``best``, as a fraction of ``best`` (0 or less: as good)."""
    return (other - best) / best if lower_is_better else (best - other) / best


def _prefer_cached(objective: str, cached: HubCache, ranked: Sequence[tuple[ServingPlan, Prediction]],
                   reason: str) -> tuple[ServingPlan, Prediction, str]:
    """The objective's pick, or the best cached layout within :data:`CACHED_MARGIN` of it, with the
    reason saying which and why."""
    best_plan, best = ranked[0]
    if cached.holds(best_plan):
        return best_plan, best, f"{reason} It is {cached.describe()}."
    figure = _FIGURES[objective]
    nearest = next(((plan, p) for plan, p in ranked if cached.holds(plan)), None)
    if nearest is None:
        return best_plan, best, f"{reason} No layout that fits is {cached.describe()}."
    plan, prediction = nearest
    behind = max(0.0, _behind(figure.value(best), figure.value(prediction), figure.lower_is_better))
    if behind > CACHED_MARGIN:
        return best_plan, best, (f"{reason} The best layout {cached.describe()}, {layout_label(plan)}, is "
                                 f"{behind:.1%} behind ({figure.show(prediction)}), beyond the "
                                 f"{CACHED_MARGIN:.0%} margin within which a cached layout is preferred.")
    return plan, prediction, (
        f"{cached.describe()}, and {behind:.1%} behind the best layout for the {objective} objective: "
        f"{figure.show(prediction)} against {figure.show(best)} at {layout_label(best_plan)}, which is not "
        f"cached (a cached layout is preferred within {CACHED_MARGIN:.0%} of the best).")


def _prefer_cached_fleet(cached: HubCache, passing: Sequence[tuple[ServingPlan, Prediction]], workload: Workload,
                         goodput: Goodput, trace: Sequence[Arrival] | None,
                         best: tuple[ServingPlan, Prediction, LoadPrediction],
                         reason: str) -> tuple[ServingPlan, Prediction, LoadPrediction, str]:
    """``goodput``'s :func:`_prefer_cached`: the cheapest fleet of a cached layout, when its price
    per hour is within :data:`CACHED_MARGIN` of the cheapest fleet's."""
    plan, prediction, load = best
    if cached.holds(plan):
        return plan, prediction, load, f"{reason} It is {cached.describe()}."
    inside = [candidate for candidate in passing if cached.holds(candidate[0])]
    if not inside:
        return plan, prediction, load, f"{reason} No layout that fits is {cached.describe()}."
    try:
        fleet = _cheapest_fleet(inside, workload, goodput, trace)
    except ServingConfigError:
        return plan, prediction, load, (f"{reason} No layout {cached.describe()} serves "
                                        f"{goodput.describe()}.")
    behind = max(0.0, _behind(load.usd_per_hour, fleet[2].usd_per_hour, True))
    price = f"${fleet[2].usd_per_hour:.2f}/h"
    if behind > CACHED_MARGIN:
        return plan, prediction, load, (
            f"{reason} The cheapest fleet of a layout {cached.describe()}, {layout_label(fleet[0])}, costs {price}, "
            f"{behind:.1%} more, beyond the {CACHED_MARGIN:.0%} margin within which a cached layout is preferred.")
    return (*fleet, f"{cached.describe()}, and the cheapest such fleet that serves {goodput.describe()}: "
                    f"{fleet[2].instances} instance(s) at {price}, {behind:.1%} more than the cheapest fleet "
                    f"(${load.usd_per_hour:.2f}/h at {layout_label(plan)}, which is not cached; a cached layout "
                    f"is preferred within {CACHED_MARGIN:.0%}). " + _goodput_reason(fleet[0], fleet[2], goodput,
                                                                                   len(passing)))


def _cheapest_fleet(passing: Sequence[tuple[ServingPlan, Prediction]], workload: Workload, goodput: Goodput,
                    trace: Sequence[Arrival] | None) -> tuple[ServingPlan, Prediction, LoadPrediction]:
    """The layout and instance count of the lowest price per hour whose p99s meet ``goodput``'s
    targets. Layouts are tried from the cheapest fleet their saturation allows
    (:data:`GOODPUT_UTILISATION`), adding instances while the fleet stays cheaper than the best
    found; among the fleets of that price, the first :data:`GOODPUT_TIES` that meet the targets are
    compared and the lowest p99 TTFT wins. A layout whose request alone misses a target is never
    simulated."""
    rate = goodput.rate
    mean = workload if trace is None else _mean_workload(trace, workload)
    options = []
    alone_best: tuple[float, float] = (math.inf, math.inf)
    for plan, prediction in passing:
        alone = (prediction.ttft_s * 1e3, prediction.itl_batch1_s * 1e3)
        alone_best = min(alone_best, alone)
        if (goodput.p99_ttft_ms is not None and alone[0] > goodput.p99_ttft_ms) or (
                goodput.p99_itl_ms is not None and alone[1] > goodput.p99_itl_ms):
            continue
        capacity = prediction.requests_per_second_instance if trace is None else predict(plan, mean) \
            .requests_per_second_instance
        fewest = max(1, math.ceil(rate / (capacity * GOODPUT_UTILISATION)))
        if fewest <= goodput.max_instances:
            options.append((fewest * plan.instance.hourly_usd, prediction.ttft_s, fewest, plan, prediction))
    options.sort(key=lambda option: option[:2])
    best: tuple[ServingPlan, Prediction, LoadPrediction] | None = None
    closest: tuple[int, float, ServingPlan, LoadPrediction] | None = None
    ties = 0
    for price, _, fewest, plan, prediction in options:
        if best is not None and (price > best[2].usd_per_hour or ties >= GOODPUT_TIES):
            break
        for instances in range(fewest, min(goodput.max_instances, fewest + 3) + 1):
            if best is not None and instances * plan.instance.hourly_usd > best[2].usd_per_hour:
                break
            load = predict_load(plan, workload, rate, instances, trace)
            misses = goodput.misses(load)
            if not misses:
                if best is None or load.usd_per_hour < best[2].usd_per_hour:
                    best, ties = (plan, prediction, load), 1
                else:
                    ties += 1
                    if load.ttft_p99_s < best[2].ttft_p99_s:
                        best = (plan, prediction, load)
                break
            over = max((load.ttft_p99_s * 1e3 / goodput.p99_ttft_ms) if goodput.p99_ttft_ms else 0.0,
                       (load.itl_p99_s * 1e3 / goodput.p99_itl_ms) if goodput.p99_itl_ms else 0.0)
            if closest is None or over < closest[1]:
                closest = (instances, over, plan, load)
    if best is not None:
        return best
    instance = passing[0][0].instance.name
    if closest is None:
        why = (f"no layout on {instance} serves a request alone within the targets (best alone: time to first "
               f"token {alone_best[0]:.0f} ms, inter-token latency {alone_best[1]:.1f} ms), or none serves "
               f"{_number(rate)} requests/s with {goodput.max_instances} instances or fewer")
    else:
        instances, _, plan, load = closest
        why = (f"no layout on {instance} with {goodput.max_instances} instances or fewer meets the targets; the "
               f"closest is {layout_label(plan)} on {instances} instance(s): p99 TTFT {load.ttft_p99_s * 1e3:.0f} ms, "
               f"p99 ITL {load.itl_p99_s * 1e3:.1f} ms, utilisation {load.utilisation:.0%}")
    raise ServingConfigError([problem("rate", rate, f"cannot be served as asked ({goodput.describe()}): {why}")])


def _goodput_reason(plan: ServingPlan, load: LoadPrediction, goodput: Goodput, count: int) -> str:
    fleet = f"{load.instances} instance" + ("" if load.instances == 1 else "s")
    return (f"the cheapest fleet of the {count} layouts that serves {goodput.describe()}: {fleet} of "
            f"{plan.instance.name} at ${load.usd_per_hour:.2f}/h (${load.usd_per_million_tokens:.2f} per million "
            f"output tokens at that rate), predicted p99 TTFT {load.ttft_p99_s * 1e3:.0f} ms, p99 ITL "
            f"{load.itl_p99_s * 1e3:.1f} ms, p99 end-to-end {load.e2e_p99_s:.1f} s, utilisation "
            f"{load.utilisation:.0%}.")


def _unmet(constraints: Constraints, found: Sequence[tuple[ServingPlan, Prediction]]) -> list[str]:
    instance = found[0][0].instance.name
    problems = []
    each_alone = True
    for name, limit in constraints.limits():
        constraint = _CONSTRAINTS[name]
        pick = min if constraint.at_most else max
        plan, prediction = pick(found, key=lambda candidate: constraint.figure(candidate[1]))
        best = f"{constraint.show(prediction)} ({layout_label(plan)})"
        if constraint.meets(prediction, limit):
            best += ", but not together with the other limits"
        else:
            each_alone = False
        problems.append(problem(name, limit, f"cannot be met on {instance}: the best {constraint.describes} "
                                             f"of any layout that fits is {best}"))
    if each_alone:
        problems.append("no single layout meets every limit: relax one of them")
    return problems


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def _reason(objective: str, ranked: Sequence[tuple[ServingPlan, Prediction]], missed: Sequence[str]) -> str:
    plan, best = ranked[0]
    if objective == "latency":
        reason = _latency_reason(ranked)
    elif objective == "throughput":
        reason = f"the most output tokens per second on {plan.instance.name}, {_throughput_figure(best)}"
    else:
        hourly = plan.instance.hourly_usd
        reason = f"the lowest price per million output tokens, {_cost_figure(best)} at ${hourly:.2f}/h"
    if objective != "latency" and len(ranked) > 1:
        figure = _throughput_figure if objective == "throughput" else _cost_figure
        reason += f" ({figure(ranked[1][1])} at {layout_label(ranked[1][0])})"
    if len(ranked) == 1:
        reason += ", the only layout that fits" + (" and meets the limits" if missed else "")
    reason += "."
    if objective == "cost":
        reason += " " + _ONE_PRICE
    if missed:
        reason += f" Ruled out by the limits: {len(missed)} layout{'s' if len(missed) > 1 else ''}."
    return reason


_ONE_PRICE = ("On one instance type the price per hour is fixed, so the cheapest layout is also the one with the "
              "most tokens per second: the throughput objective picks the same.")


def _throughput_figure(prediction: Prediction) -> str:
    return f"{prediction.tokens_per_second_instance:.0f} tokens/s"


def _cost_figure(prediction: Prediction) -> str:
    return f"${prediction.usd_per_million_tokens:.2f}"


def _latency_reason(ranked: Sequence[tuple[ServingPlan, Prediction]]) -> str:
    best = ranked[0][1]
    itl = f"{best.itl_full_batch_s * 1e3:.1f} ms"
    lowest_plan, lowest = min(ranked, key=lambda candidate: candidate[1].itl_full_batch_s)
    if lowest is not best:
        return (f"an inter-token latency at full batch of {itl}, within {LATENCY_TIE_FRACTION:.0%} of the lowest "
                f"({lowest.itl_full_batch_s * 1e3:.1f} ms at {layout_label(lowest_plan)}), and the shortest time "
                f"to first token of those, {best.ttft_s:.2f} s")
    reason = f"the lowest inter-token latency at full batch, {itl}"
    if len(ranked) > 1:
        reason += f" ({ranked[1][1].itl_full_batch_s * 1e3:.1f} ms at {layout_label(ranked[1][0])})"
    return reason + f", with a time to first token of {best.ttft_s:.2f} s"


@dataclass(frozen=True)
class InstanceComparison:
    """The recommendation of each instance type of the catalog for one model and objective.

    :param best: the recommendation of the instance type that best meets the objective.
    :param per_instance: every instance type's own recommendation, best first.
    :param ruled_out: ``(instance type, why)`` for each instance type with no recommendation.
    """

    best: Recommendation
    per_instance: tuple[Recommendation, ...]
    ruled_out: tuple[tuple[str, str], ...]


def compare_instances(request: ServingRequest, objective: str, constraints: Constraints = Constraints(),
                      workload: Workload = DEFAULT_WORKLOAD, instance_types: Sequence[str] = tuple(INSTANCES), *,
                      goodput: Goodput | None = None, space: LayoutSpace | None = None,
                      trace: Sequence[Arrival] | None = None, cached: HubCache | None = None) -> InstanceComparison:
    """:func:`recommend` on each of ``instance_types`` (``request.instance_type`` is ignored), and the
    one whose recommendation best meets ``objective``: with ``cost``, the cheapest per token of all;
    with ``goodput``, the cheapest fleet per hour. ``cached`` applies to each instance type's own
    recommendation (see :func:`recommend`).

    Raises :class:`ServingConfigError` for a bad objective, and naming each instance type when none
    has a recommendation.
    """
    _check_objective(objective, goodput)
    found: list[Recommendation] = []
    ruled_out: list[tuple[str, str]] = []
    for instance_type in instance_types:
        try:
            found.append(recommend(replace(request, instance_type=instance_type), objective, constraints, workload,
                                   goodput=goodput, space=space, trace=trace, cached=cached))
        except ServingConfigError as err:
            ruled_out.append((instance_type, "; ".join(err.problems)))
    if not found:
        raise ServingConfigError([f"{instance_type}: {why}" for instance_type, why in ruled_out])
    if objective == "goodput":
        ranked = sorted(found, key=lambda r: (r.load.usd_per_hour if r.load else math.inf,
                                              r.load.ttft_p99_s if r.load else math.inf))
    else:
        ranked = _ranked(objective, found, lambda recommendation: recommendation.prediction)
    best = ranked[0]
    reason = f"the best of the {len(ranked)} instance types that can serve the model"
    if len(ranked) > 1:
        reason += f" (next: {ranked[1].plan.instance.name} at {layout_label(ranked[1].plan)})"
    reason += ", with " + best.reason.replace(" " + _ONE_PRICE, "")
    return InstanceComparison(replace(best, reason=reason), tuple(ranked), tuple(ruled_out))
