"""How long things may take on a Neuron host, as stated estimates that size CloudFormation and load
balancer timeouts. Each is a ceiling to wait for, not a prediction; all can be overridden. The
predictions, phase by phase and each with its source, are :mod:`~neuron_serving.plan.time_to_serve`'s;
tests/plan/test_time_to_serve.py keeps these ceilings above them."""

from __future__ import annotations

import math

from .layout import GIB, ServingPlan
from .models import eagle_fc_parameter_count
from .volume import MIB

PULL_MINUTES = 20
"""Installing tools and pulling the ~10 GB serving image through a NAT gateway."""

EXPORT_BASE_MINUTES = 20
EXPORT_MINUTES_PER_BILLION = 4
"""optimum-neuron export time: 30 to 60+ minutes for 7-8B models (optimum-neuron docs, cache
system guide), growing with the parameter count; 20 + 4 per billion gives 52 minutes for 8B and
about 5 hours for 70B."""

QUANTIZE_MINUTES_PER_BILLION = 0.5
"""Quantizing the weights before the compile (``ServingRequest.quantization``): NxD Inference reads
the whole checkpoint into float32 on the CPU, quantizes each linear layer and writes the result, one
byte a parameter (docs/engines.md, "INT8 weights"), before it compiles. Not measured: a stated
ceiling of 30 seconds per billion parameters (4 minutes for 8B, 35 for 70B) on top of the export's."""

DOWNLOAD_BASE_MINUTES = 2
DOWNLOAD_MINUTES_PER_BILLION = 0.5
"""Downloading a finished export (artifact cache, prebuilt export): about 2 bytes per parameter
in bf16 (16 GB for 8B), at a stated floor of about 100 MB/s from S3 or the Hub; 6 minutes for 8B
and 37 for 70B."""

LOAD_BASE_MINUTES = 10
LOAD_MINUTES_PER_BILLION = 0.5
"""Loading the compiled model onto the NeuronCores, and TGI's warm-up, once its weights are read."""

READY_MARGIN = 1.5
"""How much longer than its estimate the load may take before ``wait-ready`` gives up on it."""

MAX_CLOUDFORMATION_MINUTES = 12 * 60
"""CloudFormation waits at most 12 hours for resource signals."""


def boot_timeout_problem(minutes: float) -> str | None:
    """What a boot timeout of ``minutes`` must be, or ``None`` when it is one CloudFormation waits for."""
    if 1 <= minutes <= MAX_CLOUDFORMATION_MINUTES:
        return None
    return f"must be 1 to {MAX_CLOUDFORMATION_MINUTES} minutes (CloudFormation waits at most 12 hours for signals)"

SECONDS_PER_TOKEN_CEILING = 0.1
"""An upper bound on time per output token for a served model under full batch load (published
inf2 figures are 20 to 50 ms); it sizes how long one generation may run."""

QUEUE_ALLOWANCE_SECONDS = 60
"""Time a request may wait for a free batch slot before its generation starts."""


def read_minutes(plan: ServingPlan, throughput: int) -> float:
    """Minutes for the replicas to read ``plan``'s weights from a root volume of ``throughput`` MiB/s.

    Every replica reads all of the export's weight shards. They start together and read the same
    files, so the page cache serves all but the first read when host memory holds the weights;
    otherwise each replica reads them from the volume."""
    reads = 1 if plan.weights_bytes <= plan.instance.host_ram_gib * GIB else len(plan.replicas)
    return reads * plan.weights_bytes / (throughput * MIB) / 60


def ready_minutes(plan: ServingPlan, throughput: int) -> int:
    """The longest the replicas may take to serve once started: reading the weights at
    ``throughput`` MiB/s, then the load and warm-up estimate, with :data:`READY_MARGIN`."""
    billions = plan.model.parameter_count / 1e9
    load = LOAD_BASE_MINUTES + LOAD_MINUTES_PER_BILLION * billions
    return math.ceil(READY_MARGIN * (read_minutes(plan, throughput) + load))


def readiness_seconds(plan: ServingPlan, throughput: int) -> int:
    """How long ``wait-ready`` waits for every replica and the router: :func:`ready_minutes`."""
    return ready_minutes(plan, throughput) * 60


def boot_minutes(plan: ServingPlan, *, throughput: int, exports: bool = True) -> int:
    """Minutes from launch until every replica serves, for a host that exports the model itself
    (``exports``) or finds a finished export (artifact cache hit, prebuilt export), and reads it
    from a root volume of ``throughput`` MiB/s. The load's share is :func:`ready_minutes`, so
    ``wait-ready`` gives up before a signal's timeout that this sizes."""
    # An EAGLE draft is downloaded and compiled with the model (fused speculation), and loaded with its shards.
    draft = 0 if plan.draft is None else plan.draft.parameter_count + eagle_fc_parameter_count(plan.draft)
    billions = (plan.model.parameter_count + draft) / 1e9
    minutes: float = PULL_MINUTES + ready_minutes(plan, throughput)
    if exports:
        minutes += EXPORT_BASE_MINUTES + EXPORT_MINUTES_PER_BILLION * billions
        if plan.request.quantization is not None:
            minutes += QUANTIZE_MINUTES_PER_BILLION * billions
    else:
        minutes += DOWNLOAD_BASE_MINUTES + DOWNLOAD_MINUTES_PER_BILLION * billions
    return min(math.ceil(minutes), MAX_CLOUDFORMATION_MINUTES)


def longest_generation_seconds(plan: ServingPlan) -> int:
    """The longest a single request can run: every token the shapes allow after a one-token
    prompt, at :data:`SECONDS_PER_TOKEN_CEILING`, plus queueing."""
    return math.ceil((plan.sequence_length - 1) * SECONDS_PER_TOKEN_CEILING) + QUEUE_ALLOWANCE_SECONDS
