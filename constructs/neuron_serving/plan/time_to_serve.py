"""How long a host takes to serve: predictions, phase by phase, for the three ways a host starts.

- **first deploy**: a new instance exports the model itself: it installs its tools, pulls the
  serving image, downloads the checkpoint from the Hub and compiles it (a hit in the public
  compile cache, or a full compile), then loads it onto the NeuronCores and warms up;
- **cache hit**: a new instance finds the export in the artifact cache and downloads it from S3
  instead of downloading the checkpoint and compiling;
- **warm pool**: a stopped instance that has done all of that already starts, starts its
  services, reads the weights back from its root volume and loads them.

Every figure below is either a rate or a size someone published (its docstring names the page or
the repository, issue and path, and says "measured" or "stated"), or our own assumption, which its
docstring says in so many words and which is chosen on the slow side. docs/time-to-serve.md lists
them all. These are expected times, for ``neuron-serving plan`` and ``status``; the timeouts that
the stack waits for are the ceilings of :mod:`~neuron_serving.plan.timing`, which stay well above
them (tests/plan/test_time_to_serve.py checks the margin).

Transfers are limited by the slowest of: the source (S3, the Hub, gzip), the network path (the
instance's bandwidth, its share through the NAT gateway), and the root volume's throughput, which
every byte downloaded is written to. Phases run one after another; nothing is overlapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import GIB, ServingPlan
from .timing import EXPORT_BASE_MINUTES, EXPORT_MINUTES_PER_BILLION, read_minutes
from .transfer import HUB_DOWNLOAD_WORKERS, network_gbps
from .volume import IMAGE_UNPACKED_BYTES, MIB

GB = 10**9
GBPS = 10**9 / 8
"""Bytes per second in one gigabit per second."""

# -- the instance and its network ------------------------------------------------------------------

SMALL_INSTANCE_VCPUS = 32
SMALL_INSTANCE_INTERNET_GBPS = 5.0
INTERNET_SHARE = 0.5
"""Traffic through an internet gateway gets "up to 50% of the network bandwidth available to a
current generation instance with a minimum of 32 vCPUs", and 5 Gbps below 32 vCPUs. Stated: EC2
user guide, "Amazon EC2 instance network bandwidth", multi-flow traffic
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html). The
hosts sit in private subnets: the Hub and the image's registry are reached that way, and through
the NAT gateway; S3, through the VPC's gateway endpoint, is not."""

NAT_GATEWAY_GBPS = 5.0
""""A NAT gateway supports 5 Gbps of bandwidth and automatically scales up to 100 Gbps." Stated:
Amazon VPC user guide, "NAT gateway basics"
(https://docs.aws.amazon.com/vpc/latest/userguide/nat-gateway-basics.html). Taken at its 5 Gbps
start, not at what it may scale to."""

# -- sources ---------------------------------------------------------------------------------------

S3_LINK_EFFICIENCY = 0.6
"""The share of an instance's bandwidth that a tuned S3 download reaches. Measured:
dvassallo/s3-benchmark (README, 2019, maximum download throughput over thread counts and object
sizes): 8,003 MB/s on c5n.18xlarge (100 Gbps: 64%), 5,741 MB/s on c5n.9xlarge (50 Gbps: 92%),
2,861 MB/s on c5n.2xlarge (up to 25 Gbps: 92%); the lowest, rounded down. The AWS CLI's CRT
transfer client with tuned concurrency is such a client."""

HUB_CONNECTION_BYTES_PER_S = 40 * 10**6
"""What one connection downloads from the Hub. Measured: huggingface/huggingface_hub issue #2658
(2024-11): "when downloading single file limited to only 40 megabytes per second", on a server
with over 1 Gbit, and over 300 MB/s with several files at once; oobabooga/textgen issue #2841
(2023-06): about 500 Mbit/s per connection. The lower one. hf_transfer, which the TGI image turns
on, goes faster per file (huggingface_hub PR #2989: about 1.5 GB/s on g4dn.metal), which is not
counted."""

CHECKPOINT_SHARD_BYTES = 5 * GB
"""The size of one safetensors file of a checkpoint: ``save_pretrained`` splits at
``max_shard_size="5GB"``. Stated: huggingface/transformers v4.51.3,
src/transformers/modeling_utils.py, ``PreTrainedModel.save_pretrained``. Each file is one
connection to the Hub."""

# -- the serving image -----------------------------------------------------------------------------

IMAGE_PULL_BYTES = 10 * GB
"""The serving image as pulled (compressed layers), TGI 3.3.5-neuron and optimum-neuron-vllm
0.4.5 alike. Our assumption: no size of either image is published where we could read it; the
AWS Neuron vLLM containers are "18+GB" (vllm-project/vllm issue #4838, 2025-11, a user, unpacked).
docs/deploying.md says about 10 GB."""

GZIP_INFLATE_BYTES_PER_S = round(2.7 * GIB / 30)
"""How fast a pull inflates the compressed layers: one core, one layer after another. Measured:
containerd/containerd issue #13559 (2026-06): a 2.7 GiB layer fetched in about 15 s and inflated
in about 30 s with Go's gzip on a Xeon 8488C; moby/moby issue #37957: docker extracts layers one
at a time."""

# -- fixed allowances ------------------------------------------------------------------------------

LAUNCH_MINUTES = 2.0
"""From RunInstances to the boot script running. Measured for small instances and AMIs: 25.8 s
on average (brevdev/ec2-coldboot-research, @fix_plan.md: API, pending to running, boot to SSH) and
about 30 s on c5.xlarge (Colin Percival, "EC2 boot time benchmarking", 2021,
http://www.daemonology.net/blog/2021-08-12-EC2-boot-time-benchmarking.html). Our assumption on top:
four times as long for a Neuron instance, the large DLAMI and an encrypted root volume (EBS
encryption slows launches: https://www.martysweet.co.uk/ec2-launch-times/)."""

START_MINUTES = 1.0
"""A stopped warm-pool instance started until its boot script runs. Stated: warm-pool instances
"can be launched to serve traffic in as low as 30 seconds" (AWS, as reported by InfoQ, "AWS
Launches EC2 Auto Scaling Warm Pools", 2021-05). Our assumption: twice that."""

INSTALL_MINUTES = 3.0
"""apt-get update, docker.io and HAProxy from Ubuntu's archive, and AWS CLI v2 from its zip, when
the DLAMI lacks them. Our assumption: nothing published times it."""

SERVICES_MINUTES = 0.5
"""A warm-pool start: docker, the monitoring and the replicas' containers starting again. Our
assumption."""

TRACE_MINUTES = 3.0
"""A compile that the public compile cache serves: optimum-cli loads the checkpoint and traces the
model's graphs before it looks each one up. Our assumption: the optimum-neuron cache guide says
only that cached graphs download "in seconds" instead of 30 to 60 minutes
(https://huggingface.co/docs/optimum-neuron/guides/cache_system)."""

CACHED_GRAPHS = 2
NEFF_BYTES = 100 * 10**6
"""The compiled graphs a decoder export fetches from the public cache (context encoding and token
generation) and a generous size for each. Our assumption; the fetch takes seconds either way."""

LOAD_FIXED_SECONDS = 10.0
"""What a replica's load costs whatever its size: the Neuron runtime's start and the compiled graphs'
load. Stated: vLLM Neuron's checkpoint loading design (aws-neuron/aws-neuron-sdk at a3247f5b,
vllm-neuron/docs/design/framework/checkpoint_loading.md, "Benchmarking") loads GPT-OSS 120B in 12 s at
degree 64 and says small models are "bottlenecked by Neuron Runtime initialization"; measured: a 12 GB
pre-sharded model loads onto one inf2 device in 11 s in all (aws-neuron/neuronx-distributed-inference
at c8184dcd, contrib/models/Trinity/README.md, "Trinity-Nano on inf2.8xlarge"). Our reading of both:
about 10 s."""

LOAD_HOST_BYTES_PER_S = 5.1 * GB
"""How fast one replica's process reads its pre-sharded weights: the export's files hold each rank's
shard (``weights/tp{rank}_sharded_checkpoint.safetensors``), which optimum-neuron (v0.4.5,
optimum/neuron/models/inference/backend/pretrained_model.py, ``_load_weights_from_path``) and NxD
Inference (models/application_base.py, ``load_weights``) read one rank after another in one thread,
sharding nothing. Measured: GLM-5.2's 705 GB from pre-sharded files in 139 s on trn2.48xlarge
(neuronx-distributed-inference at b52ae648, contrib/models/GLM-5.2/README.md, "Status"); stated: Llama
3.1 405B, 810 GB, in 108 s on trn2.48xlarge (aws-neuron-sdk, libraries/nxd-inference/developer_guides/
weights-sharding-guide.rst, "Shard on compile"). The slower of the two; that inf2 and trn1 hosts read as
fast as trn2's is our assumption, which :data:`NEURON_LOAD_ALLOWANCE` covers."""

LOAD_DEVICE_BYTES_PER_S = 1.1 * GB
"""What one Neuron device takes in. Measured: 12 GB onto one inf2 device in 11 s, fixed costs included,
so at least this (the Trinity README above). No host-to-device bandwidth of Inferentia2 or Trainium is
published."""

NEURON_LOAD_ALLOWANCE = 1.5
"""Our assumption: half as long again as the figures above, measured on trn2's newer hosts."""

WARMUP_MINUTES = 1.0
"""The engine's warm-up (one prefill of the full static batch) and wait-ready's one-token probe of
every replica. Our assumption: seconds on static graphs, taken as a minute."""

# -- the scenarios ---------------------------------------------------------------------------------

PHASE_TITLES: dict[str, str] = {
    "launch": "launch and boot",
    "start": "start from stopped",
    "install": "install tools",
    "pull": "pull the image",
    "checkpoint": "download the checkpoint",
    "compile-cached": "compile: public cache hit",
    "compile": "compile: full",
    "download": "download the export",
    "services": "start the services",
    "read": "read the weights",
    "load": "load onto the NeuronCores",
    "warm-up": "warm up",
}
"""Every phase :func:`time_to_serve` estimates, by key, and what it is called."""

FIRST_DEPLOY = "first deploy"
FIRST_DEPLOY_COMPILING = "first deploy, full compile"
CACHE_HIT = "cache hit"
WARM_POOL = "warm pool"

SCENARIOS: dict[str, tuple[str, ...]] = {
    FIRST_DEPLOY: ("launch", "install", "pull", "checkpoint", "compile-cached", "read", "load", "warm-up"),
    FIRST_DEPLOY_COMPILING: ("launch", "install", "pull", "checkpoint", "compile", "read", "load", "warm-up"),
    CACHE_HIT: ("launch", "install", "pull", "download", "read", "load", "warm-up"),
    WARM_POOL: ("start", "services", "read", "load", "warm-up"),
}
"""The phases of each way to start, in order: a first deploy whose layout the public compile
cache holds, the same without it, a scale-out that finds the export in the artifact cache, and a
warm-pool start."""


@dataclass(frozen=True)
class TimeToServe:
    """Predicted minutes of each phase, and of each scenario of :data:`SCENARIOS`.

    :param phases: minutes by phase key (:data:`PHASE_TITLES`).
    :param warm_read: minutes to read the weights after a warm-pool start, from a cold page cache;
        ``phases["read"]`` is the read after a download, which the page cache may serve.
    :param throughput: the root volume's throughput the predictions are for, MiB/s.
    """

    phases: dict[str, float]
    warm_read: float
    throughput: int

    def minutes(self, scenario: str, phase: str) -> float | None:
        """``phase``'s minutes in ``scenario``, or None when that scenario skips it."""
        if phase not in SCENARIOS[scenario]:
            return None
        return self.warm_read if (scenario, phase) == (WARM_POOL, "read") else self.phases[phase]

    def total(self, scenario: str) -> float:
        """Minutes from launch (or start) until every replica serves, in ``scenario``."""
        return sum(self.minutes(scenario, phase) or 0.0 for phase in SCENARIOS[scenario])


def internet_bytes_per_second(plan: ServingPlan) -> float:
    """What the host can fetch from outside its VPC (the Hub, and S3 without a gateway endpoint):
    its share through the internet gateway, at most the NAT gateway's."""
    instance = plan.instance
    share = (SMALL_INSTANCE_INTERNET_GBPS if instance.vcpus < SMALL_INSTANCE_VCPUS
             else INTERNET_SHARE * network_gbps(plan))
    return min(share, NAT_GATEWAY_GBPS, network_gbps(plan)) * GBPS


def hub_bytes_per_second(plan: ServingPlan) -> float:
    """How fast the checkpoint comes from the Hub: one connection per file, a few files at once."""
    files = math.ceil(plan.weights_bytes / CHECKPOINT_SHARD_BYTES)
    return min(min(files, HUB_DOWNLOAD_WORKERS) * HUB_CONNECTION_BYTES_PER_S, internet_bytes_per_second(plan))


def s3_bytes_per_second(plan: ServingPlan) -> float:
    """How fast an export comes from the artifact cache: through the VPC's S3 gateway endpoint
    (the stack's VPC has one; an imported VPC should), so at the instance's own bandwidth, not
    through the NAT gateway."""
    return S3_LINK_EFFICIENCY * network_gbps(plan) * GBPS


def load_seconds(plan: ServingPlan) -> float:
    """Seconds ``plan``'s replicas take to load the export onto their NeuronCores, once the weights are in
    memory: :data:`LOAD_FIXED_SECONDS` plus a replica's weights at the slower of its process's read
    (:data:`LOAD_HOST_BYTES_PER_S`) and its devices' intake (:data:`LOAD_DEVICE_BYTES_PER_S` each), times
    :data:`NEURON_LOAD_ALLOWANCE`. The replicas load at once, each a process of its own on devices of its
    own, so the phase lasts one replica's load. Stated: 8 servers of degree 8 loaded in 25 s where one of
    degree 64 took 12 s (vLLM Neuron's checkpoint loading design, above)."""
    # The devices a replica uses: one for a replica on one core of a device.
    rate = min(LOAD_HOST_BYTES_PER_S, len(plan.replicas[0].devices) * LOAD_DEVICE_BYTES_PER_S)
    return NEURON_LOAD_ALLOWANCE * (LOAD_FIXED_SECONDS + plan.weights_bytes / rate)


def time_to_serve(plan: ServingPlan, throughput: int) -> TimeToServe:
    """The predictions for ``plan`` on a root volume of ``throughput`` MiB/s."""
    volume = throughput * MIB
    weights = plan.weights_bytes
    billions = plan.model.parameter_count / 1e9

    def minutes(seconds: float) -> float:
        return seconds / 60

    write_weights = minutes(weights / volume)
    pull = max(IMAGE_PULL_BYTES / GZIP_INFLATE_BYTES_PER_S, IMAGE_UNPACKED_BYTES / volume,
               IMAGE_PULL_BYTES / internet_bytes_per_second(plan))
    fetch_graphs = CACHED_GRAPHS * NEFF_BYTES / HUB_CONNECTION_BYTES_PER_S
    # Just downloaded or written, the weights are in the page cache when the host's memory holds
    # them beside the unpacked image; after a stop, memory is empty and they come off the volume.
    cached = weights + IMAGE_UNPACKED_BYTES <= plan.instance.host_ram_gib * GIB
    cold_read = read_minutes(plan, throughput)
    phases = {
        "launch": LAUNCH_MINUTES,
        "start": START_MINUTES,
        "install": INSTALL_MINUTES,
        "pull": minutes(pull),
        "checkpoint": minutes(weights / min(hub_bytes_per_second(plan), volume)),
        # The export writes its own copy of the weights (optimum-neuron, from a local directory).
        "compile-cached": TRACE_MINUTES + minutes(fetch_graphs) + write_weights,
        "compile": EXPORT_BASE_MINUTES + EXPORT_MINUTES_PER_BILLION * billions + write_weights,
        "download": minutes(weights / min(s3_bytes_per_second(plan), volume)),
        "services": SERVICES_MINUTES,
        "read": 0.0 if cached else cold_read,
        "load": minutes(load_seconds(plan)),
        "warm-up": WARMUP_MINUTES,
    }
    return TimeToServe(phases, cold_read, throughput)


def time_to_serve_document(plan: ServingPlan, throughput: int) -> dict[str, object]:
    """The predictions as JSON: ``throughput`` (MiB/s), ``phases`` (``{key: title}``), and per
    scenario of :data:`SCENARIOS` its ``total`` and ``phases`` (``{key: minutes}``, the phases it
    goes through), minutes rounded to a tenth; ``sources``: the page that lists every figure."""
    predicted = time_to_serve(plan, throughput)
    return {
        "throughput": throughput,
        "phases": dict(PHASE_TITLES),
        "scenarios": {
            scenario: {
                "total": round(predicted.total(scenario), 1),
                "phases": {phase: round(predicted.minutes(scenario, phase) or 0.0, 1) for phase in phases},
            }
            for scenario, phases in SCENARIOS.items()
        },
        "sources": "docs/time-to-serve.md",
    }
