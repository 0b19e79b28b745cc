"""Everything ``NeuronLlamaStack`` is configured with: each setting defined once, as a field of
:class:`StackSettings`, checked as a whole when constructed (in code or from context), with every
problem reported at once."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..plan import identifiers
from ..plan.engines import DEFAULT_ENGINE, ENGINES, feature_problem, quantization_problem
from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.host import (
    DEFAULT_PULL_ATTEMPTS,
    FIRST_PULL_WAIT_SECONDS,
    MAX_PULL_ATTEMPTS,
    PUBLIC_HUB_CACHE,
    HostSpec,
    pull_waits_seconds,
    resolve_host,
)
from ..plan.layout import (
    DEFAULT_SPECULATIVE_TOKENS,
    QUANTIZATIONS,
    SPECULATIVE_TOKENS,
    ServingPlan,
    ServingRequest,
    builder_plan,
    compile_memory_problem,
    fleet_layouts,
    plan_serving,
)
from ..plan.performance import (
    BATCH_SIZES,
    DEFAULT_WORKLOAD,
    OBJECTIVES,
    Constraints,
    Goodput,
    LayoutSpace,
    LoadPrediction,
    Workload,
    recommend,
)
from ..plan.registry import ecr_registry_problem
from ..plan.timing import PULL_MINUTES, boot_timeout_problem
from ..plan.volume import DEFAULT_DISK_MINUTES, GP3_IOPS, GP3_THROUGHPUT_MIB_S, volume_performance
from . import limits
from .fields import Setting, definitions, setting, type_problem
from .limits import LOG_RETENTION_DAYS
from .sources import layered
from .suggestions import unknown_problems

DEFAULT_MODEL_ID = "NousResearch/Meta-Llama-3-8B-Instruct"
"""Llama 3 8B Instruct as published by Meta, mirrored without the gate: no token needed."""

DEFAULT_INSTANCE_TYPE = "inf2.24xlarge"
"""6 Neuron devices: the default 8B model fits at degree 2, giving 6 data-parallel replicas."""

CONSTRAINT_KEYS = ("max_itl_ms", "max_ttft_ms", "min_tokens_per_second")
"""Limits on the performance model's predictions that the chosen layout must meet, with ``objective``."""

GOODPUT_KEYS = ("rate", "p99_ttft_ms", "p99_itl_ms")
"""What the ``goodput`` objective serves: a request rate within p99 targets."""

OIDC_KEYS = ("oidc_issuer", "oidc_client_id", "oidc_client_secret", "oidc_authorization_endpoint",
             "oidc_token_endpoint", "oidc_user_info_endpoint")
"""What the load balancer's OIDC sign-in needs: all of them, or none."""

SERVING_AMIS = ("dlami", "build")
"""What the hosts launch (``serving_ami``): the Neuron DLAMI as it is, or a serving AMI the stack builds from it
(:class:`~neuron_serving.cdk.serving_ami.NeuronServingAmi`)."""

FLEET_KINDS = ("instance", "asg")
FLEET_ONLY_KEYS = ("min_capacity", "max_capacity", "desired_capacity", "warm_pool", "scale_down_schedule",
                   "scale_up_schedule", "target_requests_per_minute", "target_in_flight_requests", "instance_types",
                   "spot_percent", "on_demand_base_capacity", "capacity_reservations",
                   "capacity_reservation_preference", "capacity_block", "capacity_block_zone", "capacity_block_end")

CAPACITY_BLOCK_KEYS = ("capacity_block", "capacity_block_zone", "capacity_block_end")
CAPACITY_BLOCK_TYPES = ("trn1.32xlarge",)
"""The catalog's instance types offered as Capacity Blocks for ML (Amazon EC2 User Guide, "Capacity Blocks
for ML", supported instance types: trn1.32xlarge in some regions, no Inf2 size)."""
_ROLE_PATH = re.compile(r"/(?:[\x21-\x7e]{0,510}/)?")
"""IAM's pattern for a path: / alone, or /.../ of printable ASCII, at most 512 characters."""

_POLICY_ARN = re.compile(r"arn:aws[a-z-]*:iam::(\d{12}|aws):policy/[\w+=,.@/-]+")
_POLICY_NAME = re.compile(r"[\w+=,.@-]{1,128}")
_NAME_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
"""A stack name starts with a letter and holds letters, digits and hyphens (CloudFormation User
Guide, stack name constraints); a prefix of at most 32 leaves room for the stack's own name."""

_TAG_KEY = re.compile(r"[\w.:/=+@ -]{1,128}")
_TAG_VALUE = re.compile(r"[\w.:/=+@ -]{0,256}")
"""Tag keys (1-128) and values (0-256) of letters, digits, spaces and ``_.:/=+-@`` (Tagging AWS
resources, "Tag naming limits and requirements"); ``aws:`` keys are reserved."""


def _cidr(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        return "is not a valid CIDR (such as 203.0.113.0/24)"
    return None


def _role_path(value: str) -> str | None:
    if _ROLE_PATH.fullmatch(value):
        return None
    return "must start and end with / (such as /neuron/), with at most 512 printable ASCII characters"


def _policy(value: str) -> str | None:
    if _POLICY_ARN.fullmatch(value) or _POLICY_NAME.fullmatch(value):
        return None
    return "must be a managed policy's name or its ARN (arn:aws:iam::111122223333:policy/<name>)"


def _https(value: str) -> str | None:
    return None if value.startswith("https://") and len(value) > len("https://") else "must be an https:// URL"


def _name_prefix(value: str) -> str | None:
    if _NAME_PREFIX.fullmatch(value):
        return None
    return "must start with a letter and hold at most 32 letters, digits and hyphens"


def _between(low: int, high: int, what: str) -> identifiers.Check:
    def check(value: object) -> str | None:
        return None if isinstance(value, int) and low <= value <= high else f"must be {low} to {high} {what}"
    return check


def _choice(*allowed: str) -> identifiers.Check:
    def check(value: str) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"
    return check


@dataclass(frozen=True)
class StackSettings:
    """Everything ``NeuronLlamaStack`` is configured with. Every field is a keyword argument here
    and of ``NeuronLlamaStack``, and a context key (``-c key=value`` or cdk.json), with the same
    default. A bad value raises :class:`~neuron_serving.ServingConfigError` listing every problem,
    each naming the setting, the value and what is allowed.

    The settings, from their definitions (the table in docs/configuration.md is made from them too):
    """

    # The model and its layout
    model_id: str = setting(DEFAULT_MODEL_ID, """Hugging Face model (or a catalog name such as `llama-3.1-8b`).
        The default is Llama 3 8B Instruct without the gate, so it needs no token.""")
    model_revision: str | None = setting(None, """The model's Hub revision (commit, branch or tag) to export. Pin
        a commit for fleets: the revision is part of the artifact cache key, so a cached export never outlives the
        weights it was built from. Without it, the first export of the default branch is what the cache serves.""")
    model_config: str | None = setting(None, """Path to a `config.json`, for a model outside the catalog. The
        architecture must be one the engine's image exports and serves (see
        [Choosing a serving engine](engines.md)); anything else stops synthesis naming
        `model_id`.""")
    instance_type: str | None = setting(None, """inf2.xlarge, inf2.8xlarge, inf2.24xlarge, inf2.48xlarge, trn1.2xlarge,
        trn1.32xlarge or trn1n.32xlarge. The layout (degree, shapes) is planned on it.""",
        shown=f"`{DEFAULT_INSTANCE_TYPE}`, or the first of `instance_types`")
    tensor_parallel: int | None = setting(None, """NeuronCores per replica. `auto` picks the smallest valid
        degree whose memory estimate fits, which gives the most replicas, unless `objective` is set.""",
                                          shown="`auto`", kind="degree")
    objective: str | None = setting(None, """With `tensor_parallel=auto`, choose the layout with the
        [performance model](performance-model.md#choosing-a-layout-the-performance-model): the degree, and the
        batch size and sequence length unless given. `latency` (lowest time per token at full batch; within 5% of
        it, shortest time to first token), `throughput` (most output tokens per second per instance), `cost`
        (lowest price per million output tokens) or `goodput` (the cheapest fleet that serves `rate` within
        `p99_ttft_ms` and `p99_itl_ms`; with `fleet=asg` it sets the fleet's size). The stack's `ServingPlan`
        output says which layout and why.""", check=_choice(*OBJECTIVES))
    rate: float | None = setting(None, """With `objective=goodput`: the requests per second the endpoint must
        serve, of the workload (`workload_input_tokens`, `workload_output_tokens`).""")
    p99_ttft_ms: float | None = setting(None, """With `objective=goodput`: the highest 99th percentile of the
        time to first token at `rate`, in milliseconds.""")
    p99_itl_ms: float | None = setting(None, """With `objective=goodput`: the highest 99th percentile of a
        request's inter-token latency at `rate`, in milliseconds.""")
    max_itl_ms: float | None = setting(None, """With `objective`: the highest inter-token latency at full
        batch, in milliseconds, the chosen layout must reach. When no layout does, synthesis stops naming the
        setting and the best figure any layout reaches.""")
    max_ttft_ms: float | None = setting(None, """With `objective`: the highest time to first token of a
        request alone on a replica, in milliseconds.""")
    min_tokens_per_second: float | None = setting(None, """With `objective`: the fewest output tokens per
        second of the instance at saturation.""")
    workload_input_tokens: int = setting(DEFAULT_WORKLOAD.input_tokens, """A typical request's input tokens,
        for the predictions in the `PredictedPerformance` output and for `objective`. Must fit
        `max_input_tokens`.""")
    workload_output_tokens: int = setting(DEFAULT_WORKLOAD.output_tokens, """A typical request's output
        tokens. Input and output together must fit `sequence_length`.""")
    workload_prefix_tokens: int = setting(0, """Of a typical request's input tokens, those of a prefix an earlier
        request sent (a shared system prompt, earlier turns of a conversation), which the prefix cache keeps
        (`prefix_caching`): the predictions do not prefill them.""")
    workload_acceptance: float | None = setting(None, """With `speculative_model`: the chance that the model accepts
        each of the draft's tokens (0 to 1, exclusive), for the predictions. It depends on the draft and the
        prompts; `neuron-serving bench` measures the speed it gives. Without it the predictions leave speculation
        out.""")
    engine: str = setting(DEFAULT_ENGINE, """`tgi` (Hugging Face TGI 3.3.5 Neuron), `vllm` (vLLM 0.11.0
        through optimum-neuron 0.4.5) or `nxdi` (vLLM on NxD Inference, AWS's Deep Learning Container: vLLM
        0.13.0 and Neuron SDK 2.28 by default).""", check=_choice(*ENGINES))
    batch_size: int | None = setting(None, """Static batch size of the export (TGI `MAX_BATCH_SIZE`, vLLM
        `--max-num-seqs`). At least 2 with `vllm`. With `objective`, the objective chooses it unless given.""",
                                     shown=f"{ServingRequest.batch_size}, or the objective's choice")
    sequence_length: int | None = setting(None, f"""Static sequence length (TGI `MAX_TOTAL_TOKENS`, vLLM
        `--max-model-len`). With `objective`, the objective chooses it, up to {ServingRequest.sequence_length},
        unless given.""", shown=f"{ServingRequest.sequence_length}, or the objective's choice")
    max_input_tokens: int | None = setting(None, """Longest prompt (TGI `MAX_INPUT_TOKENS`). Must be below
        `sequence_length`. TGI only: vLLM takes any prompt that leaves room for the tokens asked for, and refuses
        the setting.""", shown="3/4 of `sequence_length`")
    dtype: str = setting(ServingRequest.dtype, """`bf16` or `fp16` (TGI `HF_AUTO_CAST_TYPE`, `--dtype` with
        `nxdi`). With `vllm` it must be the checkpoint's own dtype (`torch_dtype` in `config.json`: `fp16` for Llama
        2, `bf16` for the rest of the catalog).""")
    prefix_caching: bool | None = setting(None, """Keep the KV cache of past prompts in blocks, so that a request
        starting with a prefix already seen (a system prompt, a conversation's earlier turns) skips prefilling
        it. `nxdi` only.""", shown="`true` with `nxdi`")
    prefix_cache_block_size: int = setting(32, """Tokens per block of the prefix cache: 8, 16, 32, 64, 128 or 256
        (vLLM's `--block-size`; AWS recommends 32 or 16). `nxdi` only.""")
    prefix_cache_blocks: int | None = setting(None, """Blocks of the prefix cache on each replica (vLLM's
        `--num-gpu-blocks-override`): at least what the batch needs at full length; more keep more prefixes, and
        take device memory, which the planner counts. `nxdi` only.""",
        shown="`ceil(sequence_length / prefix_cache_block_size) x batch_size`")
    quantization: str = setting("none", """`int8` to quantize the model's weights at export: each linear layer's
        weights as 8-bit integers with a scale per output channel (NxD Inference's `per_channel_symmetric`), about
        half of their device memory, which the planner counts (and so may fit a smaller degree, a larger batch or a
        longer sequence), at some accuracy. The export then needs host memory for the whole model in float32.
        `none` serves the weights in `dtype`. `nxdi` only; FP8 is not offered on inf2 and trn1 (docs/engines.md).""",
        check=_choice("none", *QUANTIZATIONS))
    speculative_model: str | None = setting(None, """Hugging Face id of an EAGLE v1 draft of the model, for
        speculative decoding: each step the draft proposes `speculative_tokens` - 1 tokens and the model verifies
        them in one, so that a request's tokens come faster where the draft guesses well, at the draft's device memory,
        which the planner counts. The export downloads it, copies the model's LM head into it (as NxD Inference
        requires) and compiles it into the model. Known: `yuhuili/EAGLE-LLaMA3-Instruct-8B` (Llama 3 8B) and
        `yuhuili/EAGLE-LLaMA3-Instruct-70B` (Llama 3 and 3.1 70B); give `speculative_model_config` for another.
        `nxdi` only; not with `quantization`, nor with a prefix cache (set `prefix_caching=false`).""",
        check=identifiers.hub_repo)
    speculative_model_config: str | None = setting(None, """Path to the draft's `config.json`, for an EAGLE
        draft outside the catalog. Its hidden size and vocabulary must be the model's.""")
    speculative_model_revision: str | None = setting(None, """The draft's Hub revision (commit, branch or tag) to
        download. Pin a commit for fleets: it is part of the artifact cache key, as `model_revision` is.""")
    speculative_tokens: int = setting(DEFAULT_SPECULATIVE_TOKENS, f"""The speculation length (vLLM's
        `num_speculative_tokens`, NxD Inference's `speculation_length`), {SPECULATIVE_TOKENS[0]} to
        {SPECULATIVE_TOKENS[1]}: the most tokens a step yields, of which the draft proposes all but one. With
        `speculative_model` only.""")
    tool_call_parser: str | None = setting(None, """How the server reads the tool calls the model generates, for
        OpenAI's `tools` and `tool_choice: "auto"`: one of vLLM's parsers (`llama3_json`, `hermes`...), or `none`.
        `nxdi` only.""", shown="`llama3_json` for Llama 3.1 and later, `hermes` for Qwen 2.5 and 3, else `none` "
        "(with `nxdi`)")
    hf_token_secret: str | None = setting(None, """Name or ARN of a Secrets Manager secret that holds a Hugging
        Face token, for gated models. It is read on the host; the token never appears in user data or the
        template.""", check=identifiers.secret)
    image: str | None = setting(None, """The serving image. The export runs inside it, so compiler versions
        match. Only images whose tools the library knows are accepted, because the export's flags, the model
        types and the export's layout come from its export toolchain's version (one image each for `tgi` and
        `vllm`; for `nxdi`, the SDK 2.28 image and, not supported on inf2 and trn1 by AWS's release notes, the
        SDK 2.31.1 one). Pin one by digest with
        `<image>@sha256:<64 lowercase hex digits>`: hosts then pull and run exactly that content, and the digest is
        part of the export's cache key.""", shown="the engine's: `ghcr.io/huggingface/text-generation-inference:"
        "3.3.5-neuron`, `ghcr.io/huggingface/optimum-neuron-vllm:0.4.5` or `public.ecr.aws/neuron/"
        "pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04`")
    image_registry: str | None = setting(None, """A private ECR registry, with an optional repository
        prefix, that holds the serving image under its usual repository path and tag, for hosts that cannot
        reach public registries: a mirror you fill, or an ECR pull through cache rule's prefix
        (`111122223333.dkr.ecr.us-east-1.amazonaws.com/ghcr` serves
        `.../ghcr/huggingface/text-generation-inference:3.3.5-neuron`). The hosts log docker in to ECR with
        their role, which may pull that one repository only.""", shown="the image's public registry",
        check=ecr_registry_problem)
    image_registry_pull_through: bool = setting(False, """The `image_registry` is an ECR pull through cache:
        the hosts' role may also create the image's repository and import the image on the first pull
        (`ecr:CreateRepository`, `ecr:BatchImportUpstreamImage` on that repository).""")
    dlami_parameter: str | None = setting(None, """Public SSM parameter of the Neuron DLAMI, resolved at each
        launch (no lookup at synth). See [The Neuron driver and the image's
        runtime](operations.md#the-neuron-driver-and-the-images-runtime): parameters that track the newest driver
        are refused with both images.""",
        shown="the image's: `/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id`",
        check=identifiers.ssm_parameter)
    ami_id: str | None = setting(None, "A pinned AMI instead of the parameter.", check=identifiers.ami_id)
    serving_ami: str = setting("dlami", """`dlami`: the hosts launch the Neuron DLAMI (`dlami_parameter`, or
        `ami_id`) and each installs its tools and pulls the serving image at boot. `build`: the stack builds a
        serving AMI from that DLAMI with EC2 Image Builder, the tools installed and the image pulled by the
        boot's own steps, on a small build instance without Neuron devices, and the hosts launch it; they
        still run those steps, which find their work done. See [The serving AMI](operations.md#the-serving-ami).""",
        check=_choice(*SERVING_AMIS))
    prebuilt_export: str | None = setting(None, """Serve an existing export instead of compiling:
        `s3://bucket/prefix` or `hf://org/repo` (a Hugging Face repository of a Neuron export).""",
        check=identifiers.export_location)
    hub_compile_cache: bool = setting(True, """The export fetches the graphs that a Hugging Face Hub cache of
        compiled graphs holds (optimum-neuron's cache: `hub_compile_cache_repo`) instead of compiling them, so a
        layout that someone compiled before with the image's optimum-neuron and compiler takes minutes, not an
        hour. The export then reaches the Hub, with the token of `hf_token_secret` when given; the replicas never
        do. `false` exports offline and compiles every graph: only with `engine=vllm`, whose optimum-neuron can (the TGI
        image's optimum-neuron 0.3.0 stops at its first graph offline, so TGI refuses `false`). `nxdi` compiles with
        NxD Inference, which has no Hub cache, and refuses the setting.""")
    hub_compile_cache_repo: str = setting(PUBLIC_HUB_CACHE, """The Hub repository of that cache: optimum-neuron's
        public one, or your organisation's own (private ones need `hf_token_secret`, whose token must read it).
        Not with `nxdi`.""", check=identifiers.hub_repo)
    compile_cache: bool = setting(True, """The export also keeps its compiled graphs in the artifact cache's
        bucket (`s3://<bucket>/compile-cache/`, the Neuron persistent cache's `NEURON_COMPILE_CACHE_URL`), looked
        up before the Hub cache: a graph compiled once for any layout, revision or stack size of this stack is never
        compiled again. A `prebuilt_export` compiles nothing and needs neither cache.""")
    builder_instance_type: str | None = setting(None, """The instance type of the builder: a one-off
        instance that exports the model into the artifact cache, then terminates, for serving hosts too
        small to compile it (Llama 3 8B on inf2.xlarge). Those hosts wait for its export and never
        compile. Given, a builder exports even for hosts that could. Not with `prebuilt_export`.""",
        shown="when the serving host cannot compile: the cheapest instance type of its family that can")
    boot_timeout_minutes: int | None = setting(None, """How long CloudFormation waits for a host to serve. The
        estimate is 20 min pull, plus 20 + 4 per billion parameters for the export, plus the load: reading the
        weights at `root_volume_throughput`, then 10 + 0.5 per billion, all times 1.5 (the limit the host itself
        waits for its replicas): 98 min for 8B, under 7 h for 70B. The host's own limit never exceeds this
        timeout.""", shown="estimated")
    pull_attempts: int = setting(DEFAULT_PULL_ATTEMPTS, f"""How many times each host pulls the serving image before
        its boot fails, waiting {FIRST_PULL_WAIT_SECONDS} s after the first failure and twice as long after each
        next one: 1 to {MAX_PULL_ATTEMPTS} ({MAX_PULL_ATTEMPTS} pulls wait {pull_waits_seconds(MAX_PULL_ATTEMPTS)} s,
        half the {PULL_MINUTES} minutes the boot timeout allows for pulling). More ride out a registry's longer
        outage or throttling (an ECR pull through cache's first import, say).""")
    boot_disk_minutes: float = setting(DEFAULT_DISK_MINUTES, """How long each boot's disk traffic may take at the
        root volume's throughput, which it sizes (with the IOPS): the serving image unpacked (about 30 GiB), the
        model's weights written once and read once. At gp3's included 125 MiB/s that is 8 minutes for 8B and 40
        for 70B, of every scale-out and warm-pool start. 3 gives 341 MiB/s for 8B (about $9 a month more per
        host, us-east-1) and 1,666 for 70B (about $113, with the IOPS to carry it).""")
    root_volume_throughput: int | None = setting(None, """The throughput of each host's gp3 root volume, in MiB/s
        (125 to 2,000), instead of the one `boot_disk_minutes` sizes. The replicas read the model's weights from
        it at every boot: at gp3's included 125 MiB/s the 131 GiB of a 70B model take 18 minutes. The readiness
        limit and the boot timeout allow for reading the weights at this rate. Above 125, about $0.04 per MiB/s
        per month per host (us-east-1; Amazon EBS pricing).""", shown="what moves the boot's disk traffic in "
        "`boot_disk_minutes`, at least 125 (341 for 8B, 1,666 for 70B)",
        check=_between(*GP3_THROUGHPUT_MIB_S, "MiB/s (gp3's throughput)"))
    root_volume_iops: int | None = setting(None, """The IOPS of each host's gp3 root volume (3,000 to 80,000, at
        least 4 per MiB/s of `root_volume_throughput`, at most 500 per GiB of the volume). Above 3,000, about
        $0.005 each per month per host (us-east-1; Amazon EBS pricing): $3 a month for 70B's 3,592.""",
        shown="enough to carry the throughput in 128 KiB reads, at least 3,000",
        check=_between(*GP3_IOPS, "(gp3's IOPS)"))

    # The endpoint
    internet_facing: bool = setting(False, """Put the ALB in public subnets. Requires `allowed_cidrs` and
        `certificate_arn`, and turns API keys on.""")
    allowed_cidrs: tuple[str, ...] = setting((), """Who may connect: comma-separated, or a JSON list.""",
                                             shown="the VPC CIDR", check=_cidr)
    certificate_arn: str | None = setting(None, """An ACM certificate: adds an HTTPS listener (TLS 1.2+) and
        redirects HTTP to it. Required when internet-facing.""", check=identifiers.certificate_arn)
    api_keys: bool | None = setting(None, """Clients must send `Authorization: Bearer <key>`; see [Managing API
        keys](security.md#managing-api-keys). An internet-facing endpoint cannot turn them off unless browsers
        sign in with `oidc_*`.""", shown="`true` when internet-facing, else `false`")
    api_keys_secret: str | None = setting(None, """Name or ARN of an existing secret of keys instead of the
        stack's (output `ApiKeysSecretArn`).""", shown="a new secret", check=identifiers.secret)
    oidc_issuer: str | None = setting(None, """Browser sign-in at the HTTPS listener with an OpenID Connect
        provider (a Cognito user pool is one): the issuer URL. All six `oidc_*` settings but `oidc_scope`, or none.
        Requests with `Authorization: Bearer` skip the sign-in and need a key.""", check=_https)
    oidc_client_id: str | None = setting(None, "The OIDC client id.")
    oidc_client_secret: str | None = setting(None, """Name of the Secrets Manager secret holding the OIDC client
        secret (resolved by CloudFormation at deploy time, never in the template).""", check=identifiers.secret)
    oidc_authorization_endpoint: str | None = setting(None, "The OIDC authorization endpoint.", check=_https)
    oidc_token_endpoint: str | None = setting(None, "The OIDC token endpoint.", check=_https)
    oidc_user_info_endpoint: str | None = setting(None, "The OIDC user info endpoint.", check=_https)
    oidc_scope: str | None = setting(None, "The OIDC scope.", shown="`openid`")
    rate_limit: int | None = setting(None, """Requests per client IP per 5 minutes above which an AWS WAF rule
        answers 429 (10 to 2e9). About $5/month for the web ACL, $1 for the rule, $0.60 per million requests.""")

    # The network, names and permissions (an organisation's config file sets these for every stack)
    vpc_id: str | None = setting(None, """An existing VPC instead of a new one (no lookup: give its
        `private_subnet_ids` and their `availability_zones`, and `allowed_cidrs`).""", shown="a new VPC",
        check=identifiers.vpc_id)
    availability_zones: tuple[str, ...] = setting((), """With `vpc_id`: the Availability Zones of the subnets, in
        the order of `private_subnet_ids` (and of `public_subnet_ids`). Without it: the new VPC's zones, two or
        more of the stack's region (those that offer the fleet's instance types: `neuron-serving preflight`
        shows which), each with a public and a private subnet; the fleet launches in all of them.""",
        shown="with a new VPC, two zones chosen at deploy", check=identifiers.availability_zone)
    private_subnet_ids: tuple[str, ...] = setting((), """With `vpc_id`: subnets with egress for the hosts (and an
        internal load balancer).""", check=identifiers.subnet_id)
    public_subnet_ids: tuple[str, ...] = setting((), """With `vpc_id` and `internet_facing`: subnets for the
        load balancer.""", check=identifiers.subnet_id)
    name_prefix: str | None = setting(None, """Put in front of the stack's name (a `stack_name` given in code
        too), and so of every name CloudFormation gives its resources (roles, log groups, the dashboard).""",
        check=_name_prefix)
    tags: Mapping[str, str] = setting({}, """Tags on every resource of the stack: a mapping of key to value
        (a JSON object on the command line).""")
    permissions_boundary: str | None = setting(None, """A managed policy (name or ARN) set as the boundary of
        every role of the stack.""", check=_policy)
    role_path: str | None = setting(None, "The IAM path of every role of the stack, such as `/neuron/`.",
                                    shown="`/`", check=_role_path)

    # The fleet
    fleet: str = setting("instance", """`instance` (one EC2 instance) or `asg` (an Auto Scaling fleet over the
        private subnets of every zone of the VPC: two, or `availability_zones`).""", check=_choice(*FLEET_KINDS))
    min_capacity: int = setting(limits.DEFAULT_MIN_CAPACITY, """Fleet size, lowest (`fleet=asg` only), in hosts of
        `instance_type` (with several `instance_types`, those hosts' replicas, whatever types hold them).""")
    max_capacity: int = setting(limits.DEFAULT_MAX_CAPACITY, """Fleet size, highest (`fleet=asg` only), in hosts
        of `instance_type`, as `min_capacity`.""")
    desired_capacity: int | None = setting(None, "Fleet size at creation (`fleet=asg` only).",
                                           shown="`min_capacity`")
    target_in_flight_requests: float | None = setting(None, """The average in-flight requests per replica
        (queued or in the batch) that target tracking holds (`fleet=asg` only).""", shown="`batch_size`")
    target_requests_per_minute: int | None = setting(None, """Scale on ALB requests per host per minute instead
        (`fleet=asg` only; not with `target_in_flight_requests`).""")
    warm_pool: bool = setting(False, """Keep stopped hosts that already hold the image and the export, so a
        scale-out skips both (`fleet=asg`, needs `max_capacity` >= 2).""")
    scale_down_schedule: str | None = setting(None, """Cron expression (5 fields, UTC) that scales the fleet to
        zero. Give both schedules or neither.""", check=identifiers.cron)
    scale_up_schedule: str | None = setting(None, """Cron expression (5 fields, UTC) that scales the fleet back
        to `min_capacity`.""", check=identifiers.cron)
    instance_types: tuple[str, ...] = setting((), """The instance types the fleet may launch, in order of
        preference (`fleet=asg`): `instance_type` first (the layout is planned on it; leave it out or give it
        first), then types of its family that hold a replica of the same degree, tried when it has no capacity.
        They serve one export; each host lays out as many replicas as its type holds. With more than one, the
        group counts replicas: each host weighs its replicas, and the capacities are hosts of `instance_type`
        (`min_capacity` 2 of inf2.24xlarge is 12 replicas: two inf2.24xlarge, one inf2.48xlarge or twelve
        inf2.8xlarge). Not with `warm_pool` (Auto Scaling keeps no warm pool for several types) or
        `target_requests_per_minute` (which counts per host).""", shown="`instance_type` alone")
    spot_percent: int = setting(0, """The share of the fleet above `on_demand_base_capacity` that runs on Spot,
        0 to 100 (`fleet=asg`), allocated capacity-optimized across `instance_types` in their order. A host told
        of its interruption, or terminated by its group, stops taking requests and lets those in flight finish
        before it goes; on a rebalance recommendation, capacity rebalancing launches its replacement before it
        terminates the host. Not with `warm_pool`.""",
        check=_between(0, 100, "percent"))
    on_demand_base_capacity: int | None = setting(None, """With `spot_percent`: the fleet's size, in hosts of
        `instance_type`, that is always On-Demand.""", shown="`min_capacity`")
    capacity_reservations: tuple[str, ...] = setting((), """On-Demand Capacity Reservations the fleet launches
        into (`fleet=asg`): ids (`cr-...`) or ARNs of resource groups of reservations, of the fleet's types and
        zones.""", check=identifiers.capacity_reservation)
    capacity_reservation_preference: str | None = setting(None, """`capacity-reservations-first` (the
        reservations, then On-Demand capacity), `capacity-reservations-only` (the reservations or nothing) or
        `none` (never a reservation, not even an open one) (`fleet=asg`).""",
        shown="`capacity-reservations-first` with `capacity_reservations`, else open reservations that match",
        check=_choice(*limits.CAPACITY_RESERVATION_PREFERENCES))
    capacity_block: str | None = setting(None, """A Capacity Block for ML (its reservation id) the fleet runs in
        (`fleet=asg`): one instance type (`instance_type`, which must be the block's), in the block's
        `capacity_block_zone`, until `capacity_block_end`.""", check=identifiers.capacity_block)
    capacity_block_zone: str | None = setting(None, "With `capacity_block`: the block's Availability Zone.",
                                              check=identifiers.availability_zone)
    capacity_block_end: str | None = setting(None, """With `capacity_block`: when the block ends, in UTC
        (`2026-12-01T11:30Z`). A scheduled action scales the fleet to zero before then.""",
        check=identifiers.utc_time)

    # Logs and alarms
    log_retention_days: int = setting(limits.DEFAULT_LOG_RETENTION_DAYS, f"""Retention of the hosts' log groups: one of
        {', '.join(map(str, LOG_RETENTION_DAYS))} (the values CloudWatch Logs accepts).""")
    alarm_email: str | None = setting(None, "An address subscribed to the alarm topic. It must confirm the "
                                      "subscription.", check=identifiers.email)
    alarm_topic_arn: str | None = setting(None, """An existing SNS topic for the alarms (an organisation's
        on-call topic) instead of the stack's own.""", shown="a new topic", check=identifiers.topic_arn)
    alarm_5xx_percent: float = setting(limits.DEFAULT_ERROR_RATE_PERCENT, "The 5xx alarm's threshold, percent "
                                       "of requests; see [Monitoring](monitoring.md).")
    alarm_p99_latency_seconds: float = setting(limits.DEFAULT_P99_LATENCY_SECONDS, "The p99 latency alarm's "
                                               "threshold, seconds.")
    alarm_disk_percent: float = setting(limits.DEFAULT_DISK_PERCENT, "The disk alarm's threshold, percent used.")

    def __post_init__(self) -> None:
        problems = Problems()
        typed = self._check_types(problems)
        if typed:
            self._resolve_instance_type(problems)
            if self.api_keys is None:
                object.__setattr__(self, "api_keys", self.internet_facing)
            self._check_values(problems)
        if not problems:
            try:
                object.__setattr__(self, "_layout", self._choose_layout())
                object.__setattr__(self, "_host", resolve_host(
                    self.plan(), engine=self.__dict__["_engine"], image=self.__dict__["_image"],
                    image_registry=self.image_registry,
                    image_registry_pull_through=self.image_registry_pull_through,
                    model_revision=self.model_revision, prebuilt_export=self.prebuilt_export,
                    pull_attempts=self.pull_attempts,
                    hub_cache=self.hub_compile_cache_repo if self.hub_compile_cache else None,
                    # With a builder, the hosts never compile: they wait for its export in the cache.
                    export_role="wait" if self.builder is not None else "serve"))
            except ServingConfigError as error:
                problems.add_all(error.problems)
        problems.raise_if_any()

    # -- derived views --------------------------------------------------------------------------

    @property
    def request(self) -> ServingRequest:
        """The serving request the planner takes."""
        return ServingRequest(
            model_id=self.model_id, instance_type=self.instance_type or DEFAULT_INSTANCE_TYPE,
            batch_size=ServingRequest.batch_size if self.batch_size is None else self.batch_size,
            sequence_length=ServingRequest.sequence_length if self.sequence_length is None else self.sequence_length,
            max_input_tokens=self.max_input_tokens, dtype=self.dtype,
            tensor_parallel=self.tensor_parallel, model_config=self.model_config,
            prefix_cache_block_size=self.prefix_cache_block_size if self.prefix_cache_kept else None,
            prefix_cache_blocks=self.prefix_cache_blocks if self.prefix_cache_kept else None,
            tool_call_parser=self.tool_call_parser,
            quantization=self._request_quantization,
            speculative_model=self.speculative_model,
            speculative_model_config=self.speculative_model_config,
            speculative_model_revision=self.speculative_model_revision,
            speculative_tokens=self.speculative_tokens,
        )

    @property
    def _request_quantization(self) -> str | None:
        """The ``quantization`` setting as the request takes it: None for ``none``."""
        return None if self.quantization == "none" else self.quantization

    @property
    def prefix_cache_kept(self) -> bool:
        """Whether the replicas keep a prefix cache: when asked, or by default where the engine serves one."""
        # The engine _check_model looked up (once: tests/cdk/test_host_spec.py counts the lookups).
        engine = self.__dict__.get("_engine")
        served = engine is not None and engine.prefix_caching
        return served if self.prefix_caching is None else bool(self.prefix_caching)

    @property
    def oidc(self) -> dict[str, str]:
        """The given ``oidc_*`` settings, without the prefix."""
        return {k.removeprefix("oidc_"): v for k in (*OIDC_KEYS, "oidc_scope") if (v := getattr(self, k)) is not None}

    @property
    def constraints(self) -> Constraints:
        return Constraints(self.max_itl_ms, self.max_ttft_ms, self.min_tokens_per_second)

    @property
    def workload(self) -> Workload:
        return Workload(self.workload_input_tokens, self.workload_output_tokens, self.workload_prefix_tokens,
                        self.workload_acceptance)

    @property
    def goodput(self) -> Goodput | None:
        """What ``objective=goodput`` serves, when ``rate`` is given."""
        return None if self.rate is None else Goodput(self.rate, self.p99_ttft_ms, self.p99_itl_ms)

    @property
    def space(self) -> LayoutSpace:
        """The batch sizes and sequence lengths an objective chooses among: the given ones alone, else
        every one the engine serves (:attr:`~neuron_serving.plan.engines.base.Engine.min_batch_size`)."""
        # The engine _check_model looked up (once: tests/cdk/test_host_spec.py counts the lookups).
        engine = self.__dict__.get("_engine")
        least = 1 if engine is None else engine.min_batch_size
        batches = tuple(b for b in BATCH_SIZES if b >= least) if self.batch_size is None else (self.batch_size,)
        shortest = engine.min_prefix_cache_sequence if engine is not None and self.prefix_cache_kept else 1
        return LayoutSpace(batches, None if self.sequence_length is None else (self.sequence_length,), shortest)

    @property
    def load(self) -> LoadPrediction | None:
        """With ``objective=goodput``, the fleet it chose and its predicted percentiles at ``rate``."""
        load: LoadPrediction | None = self.__dict__["_load"]
        return load

    def capacity(self) -> tuple[int, int, int | None]:
        """The fleet's ``(min, max, desired)`` size: the settings', raised to the instance count
        ``objective=goodput`` chose (``fleet=asg``)."""
        if self.load is None:
            return self.min_capacity, self.max_capacity, self.desired_capacity
        count = self.load.instances
        desired = None if self.desired_capacity is None else max(self.desired_capacity, count)
        return max(self.min_capacity, count), max(self.max_capacity, count), desired

    def plan(self) -> ServingPlan:
        """The layout: ``tensor_parallel`` when given; else the degree ``objective`` recommends;
        else the smallest degree that fits."""
        return self.layout()[0]

    def host(self) -> HostSpec:
        """The serving hosts' engine, image, registry and export, resolved once (the builder's, if
        any, is :meth:`~neuron_serving.plan.host.HostSpec.for_builder` of it)."""
        host: HostSpec = self.__dict__["_host"]
        return host

    def layout(self) -> tuple[ServingPlan, str]:
        """The layout (see :meth:`plan`) and why it was chosen, in a sentence."""
        chosen: tuple[ServingPlan, str] = self.__dict__["_layout"]
        return chosen

    @classmethod
    def from_context(cls, get: Callable[[str], Any], *, given: Iterable[str] | None = None) -> StackSettings:
        """The settings context gives: ``get(key)`` reads a context key (``app.node.try_get_context``).

        Precedence, lowest first: defaults, the organisation's config file named by ``config``, the
        preset named by ``preset``, then each setting's own key. ``given`` (``app.node.get_all_context()``)
        lists every key present, so that one naming no setting (and no CDK feature flag or lookup) is
        refused with the closest setting's name. Raises :class:`ServingConfigError` with every problem."""
        definitions = {s.name: s for s in SETTINGS}
        settings: StackSettings = layered(get, definitions, cls, given=given)
        return settings

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> StackSettings:
        """The preset ``name`` (see :data:`~neuron_serving.settings.PRESETS`), with ``overrides``."""
        unknown = [k for k in overrides if k not in SETTING_NAMES]
        if unknown:
            raise ServingConfigError(unknown_problems(unknown, overrides, SETTING_NAMES))
        definitions = {s.name: s for s in SETTINGS}
        settings: StackSettings = layered({"preset": name}.get, definitions, cls, overrides=overrides)
        return settings

    def replace(self, **changes: Any) -> StackSettings:
        """A copy with ``changes`` (settings by name), checked as a whole."""
        unknown = [k for k in changes if k not in SETTING_NAMES]
        if unknown:
            raise ServingConfigError(unknown_problems(unknown, changes, SETTING_NAMES))
        return dataclasses.replace(self, **changes)

    # -- checks ---------------------------------------------------------------------------------

    def _resolve_instance_type(self, problems: Problems) -> None:
        """``instance_type`` is the first of ``instance_types`` when only they are given, else its default."""
        if self.instance_types and self.instance_type is not None and self.instance_type != self.instance_types[0]:
            problems.add("instance_types", list(self.instance_types), f"must start with instance_type "
                         f"({self.instance_type}), on which the layout is planned: list it first, or leave "
                         "instance_type out")
        if self.instance_type is None:
            object.__setattr__(self, "instance_type", self.instance_types[0] if self.instance_types
                               else DEFAULT_INSTANCE_TYPE)

    @property
    def fleet_types(self) -> tuple[str, ...]:
        """The instance types the hosts may be, in order of preference: ``instance_types``, else
        ``instance_type`` alone."""
        return tuple(self.instance_types) or (self.request.instance_type,)

    def layouts(self) -> tuple[ServingPlan, ...]:
        """The layout (:meth:`plan`) on each of :attr:`fleet_types`, its own first
        (:func:`~neuron_serving.plan.layout.fleet_layouts`)."""
        layouts: tuple[ServingPlan, ...] = self.__dict__["_layouts"]
        return layouts

    def _check_types(self, problems: Problems) -> bool:
        before = len(problems)
        for definition in SETTINGS:
            value = getattr(self, definition.name)
            wrong = type_problem(definition, value)
            if wrong is not None:
                problems.add(definition.name, value, wrong)
            elif value is not None and definition.check is not None:
                for item in (value if definition.kind == "list" else (value,)):
                    if (shape := definition.check(item)) is not None:
                        problems.add(definition.name, item, shape)
        return len(problems) == before

    def _check_values(self, problems: Problems) -> None:
        self._check_model(problems)
        self._check_endpoint(problems)
        self._check_network(problems)
        self._check_ami(problems)
        self._check_fleet(problems)
        self._check_alarms(problems)
        if (retention := limits.log_retention(self.log_retention_days)) is not None:
            problems.add("log_retention_days", self.log_retention_days, retention)
        timeout = self.boot_timeout_minutes
        if timeout is not None and (wrong := boot_timeout_problem(timeout)) is not None:
            problems.add("boot_timeout_minutes", timeout, wrong)
        for key, value in self.tags.items():
            if not _TAG_KEY.fullmatch(key) or key.lower().startswith("aws:"):
                problems.add("tags", key, "has a key that is not 1-128 letters, digits, spaces and _.:/=+-@, or "
                             "starts with the reserved aws:")
            elif not _TAG_VALUE.fullmatch(value):
                problems.add(f"tags.{key}", value, "must be at most 256 letters, digits, spaces and _.:/=+-@")

    def _check_model(self, problems: Problems) -> None:
        try:
            Constraints(self.max_itl_ms, self.max_ttft_ms, self.min_tokens_per_second)
        except ServingConfigError as error:
            problems.add_all(error.problems)
        try:
            self.workload.check_fits(self.request, prefix="workload_")
        except ServingConfigError as error:
            # Workload names its fields input_tokens and output_tokens.
            problems.add_all(p if p.startswith("workload_") else f"workload_{p}" for p in error.problems)
        objective = self.objective
        if objective is not None and self.tensor_parallel is not None:
            problems.add("objective", objective, f"applies only with tensor_parallel=auto: tensor_parallel "
                         f"{self.tensor_parallel} leaves no degree to choose")
        for key in CONSTRAINT_KEYS:
            if getattr(self, key) is not None and objective is None:
                problems.add(key, getattr(self, key), "is a constraint on the layout the objective chooses: add "
                             f"-c objective=<{'|'.join(OBJECTIVES)}> (and tensor_parallel=auto)")
        for key in GOODPUT_KEYS:
            if getattr(self, key) is not None and objective != "goodput":
                problems.add(key, getattr(self, key), "applies only with -c objective=goodput")
        if objective == "goodput" and self.rate is None:
            problems.add("rate", None, "is required with objective=goodput: the requests per second to serve")
        try:
            self.goodput  # noqa: B018 (checks the targets)
        except ServingConfigError as error:
            problems.add_all(error.problems)
        if objective is not None and self.prebuilt_export is not None:
            for key in ("batch_size", "sequence_length"):
                if getattr(self, key) is None:
                    problems.add(key, None, "must be given with objective and prebuilt_export: the export's "
                                 "shapes are fixed, so the objective cannot choose them")
        # The engine and the image are looked up here, once: the host's spec takes them as found. An
        # unknown engine is the engine setting's own check's (_choice).
        engine = ENGINES.get(self.engine)
        if engine is None:
            return
        object.__setattr__(self, "_engine", engine)
        try:
            object.__setattr__(self, "_image", engine.image(self.image or engine.default_image.reference))
        except ServingConfigError as error:
            problems.add_all(error.problems)
        if self.prefix_caching and (said := feature_problem(engine, "prefix_caching")):
            problems.add("prefix_caching", True, said)
        if said := quantization_problem(engine, self._request_quantization):
            problems.add("quantization", self.quantization, said)
        if self.speculative_model is not None and (said := feature_problem(engine, "speculative_decoding")):
            problems.add("speculative_model", self.speculative_model, said)
        if self.workload_prefix_tokens and not self.prefix_cache_kept:
            why = "which is false" if engine.prefix_caching else f"which engine {self.engine} does not serve"
            problems.add("workload_prefix_tokens", self.workload_prefix_tokens,
                         f"applies only with prefix_caching, {why}")
        for key in ("speculative_tokens", "speculative_model_config", "workload_acceptance"):
            if self.speculative_model is None and getattr(self, key) != _DEFAULTS[key]:
                problems.add(key, getattr(self, key), "applies only with speculative_model")
        if self.prefix_caching is False:
            for key in ("prefix_cache_block_size", "prefix_cache_blocks"):
                if getattr(self, key) != _DEFAULTS[key]:
                    problems.add(key, getattr(self, key), "applies only with prefix_caching, which is false")
        for key in engine.unused_settings:
            if getattr(self, key) != _DEFAULTS[key]:
                problems.add(key, getattr(self, key), f"does not apply to engine {self.engine}; it applies to engine "
                             + ", ".join(e.name for e in ENGINES.values() if key not in e.unused_settings))

    def _check_endpoint(self, problems: Problems) -> None:
        """Who may use the endpoint, and how."""
        given = [k for k in OIDC_KEYS if getattr(self, k) is not None]
        if self.internet_facing and not self.certificate_arn:
            problems.add("certificate_arn", None, "is required when internet_facing is true: an internet-facing "
                         "endpoint serves HTTPS only (HTTP redirects to it), so prompts and keys never cross the "
                         "internet in clear text; give an ACM certificate ARN of the endpoint's domain")
        if self.internet_facing and not self.allowed_cidrs:
            problems.add("allowed_cidrs", [], "must list who may connect when internet_facing is true (an "
                         "unauthenticated LLM endpoint is never opened to everyone by default)")
        if self.internet_facing and not self.api_keys and not given:
            problems.add("api_keys", False, "cannot be false when internet_facing is true unless browser users "
                         "sign in with oidc_*: an internet-facing endpoint never serves anyone who is not "
                         "authenticated")
        if given and len(given) < len(OIDC_KEYS):
            for key in OIDC_KEYS:
                if key not in given:
                    problems.add(key, None, f"is required with {', '.join(given)}: the load balancer's OIDC "
                                 f"sign-in needs {', '.join(OIDC_KEYS)}")
        if given and not self.certificate_arn:
            problems.add("certificate_arn", None, "is required with oidc_*: a load balancer signs users in on an "
                         "HTTPS listener only")
        if self.api_keys_secret and not self.api_keys:
            problems.add("api_keys_secret", self.api_keys_secret, "applies only with api_keys=true")
        if self.rate_limit is not None and (wrong := limits.rate_limit(self.rate_limit)) is not None:
            problems.add("rate_limit", self.rate_limit, wrong)

    def _check_ami(self, problems: Problems) -> None:
        if self.serving_ami == "build" and self.ami_id:
            problems.add("serving_ami", self.serving_ami, f"builds from the DLAMI's parameter, not from ami_id "
                         f"({self.ami_id}); leave ami_id out, or serving_ami at dlami to launch that AMI as it is")

    def _check_network(self, problems: Problems) -> None:
        attached = ("private_subnet_ids", "public_subnet_ids")
        if self.vpc_id is None:
            for key in attached:
                if getattr(self, key):
                    problems.add(key, list(getattr(self, key)), "applies only with vpc_id")
            zones = self.availability_zones
            if zones and (len(set(zones)) < 2 or len(set(zones)) < len(zones)):
                problems.add("availability_zones", list(zones), "must name at least two different zones for the new "
                             "VPC: the load balancer needs two")
            elif zones and len({z[:-1] for z in zones}) > 1:
                problems.add("availability_zones", list(zones), "must all be zones of one region, the stack's")
            return
        zones = self.availability_zones
        for key in ("availability_zones", "private_subnet_ids"):
            if not getattr(self, key):
                problems.add(key, None, "is required with vpc_id: the stack imports the VPC without a lookup")
        if self.internet_facing and not self.public_subnet_ids:
            problems.add("public_subnet_ids", None, "is required with vpc_id when internet_facing is true: the "
                         "load balancer needs public subnets")
        for key in ("private_subnet_ids", "public_subnet_ids"):
            subnets = getattr(self, key)
            if zones and subnets and len(subnets) % len(zones):
                problems.add(key, list(subnets), f"must hold a multiple of {len(zones)} subnets, one per "
                             "availability_zones entry in the same order")
        # An internet-facing endpoint without them is reported once, by _check_endpoint.
        if not self.allowed_cidrs and not self.internet_facing:
            problems.add("allowed_cidrs", None, "is required with vpc_id: the stack cannot read an imported VPC's "
                         "CIDR without a lookup; give the networks that may reach the endpoint")

    def _check_fleet(self, problems: Problems) -> None:
        if self.fleet == "instance":
            for key in FLEET_ONLY_KEYS:
                if getattr(self, key) != _DEFAULTS[key]:
                    problems.add(key, getattr(self, key), "applies to fleet=asg only; add -c fleet=asg")
            return
        for key, value, allowed in limits.capacity_problems(self.min_capacity, self.max_capacity,
                                                            self.desired_capacity):
            problems.add(key, value, allowed)
        if self.warm_pool and (wrong := limits.warm_pool_capacity(self.max_capacity)) is not None:
            problems.add("warm_pool", True, wrong)
        if self.target_requests_per_minute is not None and (
                wrong := limits.requests_per_minute(self.target_requests_per_minute)) is not None:
            problems.add("target_requests_per_minute", self.target_requests_per_minute, wrong)
        if bool(self.scale_down_schedule) != bool(self.scale_up_schedule):
            missing = "scale_up_schedule" if self.scale_down_schedule else "scale_down_schedule"
            problems.add(missing, None, "is required with the other schedule: a fleet scaled to zero must know "
                         "when to come back, and one scaled back when to stop")
        if self.target_in_flight_requests is not None and self.target_requests_per_minute is not None:
            problems.add("target_in_flight_requests", self.target_in_flight_requests,
                         "cannot be combined with target_requests_per_minute: choose one scaling signal")
        if self.target_in_flight_requests is not None and (
                wrong := limits.in_flight_requests(self.target_in_flight_requests)) is not None:
            problems.add("target_in_flight_requests", self.target_in_flight_requests, wrong)
        self._check_capacity(problems)

    def _check_capacity(self, problems: Problems) -> None:
        """Where the fleet's hosts come from: several types, Spot, reservations, a Capacity Block."""
        several = len(self.fleet_types) > 1
        if several and self.target_requests_per_minute is not None:
            problems.add("target_requests_per_minute", self.target_requests_per_minute, "counts requests per host, "
                         "and hosts of several instance_types serve different numbers of replicas: scale with "
                         "target_in_flight_requests, which counts per replica")
        for key, value, allowed in limits.capacity_source_problems(
                several_types=several, spot_percent=self.spot_percent, on_demand_base=self.on_demand_base_capacity,
                max_capacity=self.max_capacity, reservations=self.capacity_reservations,
                preference=self.capacity_reservation_preference, warm_pool=self.warm_pool, block=self.capacity_block):
            problems.add(key, list(self.instance_types) if key == "instance_types" else value, allowed)
        given = [k for k in CAPACITY_BLOCK_KEYS if getattr(self, k) is not None]
        if not given:
            return
        for key in CAPACITY_BLOCK_KEYS:
            if key not in given:
                problems.add(key, None, f"is required with {', '.join(given)}: a Capacity Block is one reservation "
                             "in one zone, ending at a set time")
        block = self.capacity_block
        if block is None:
            return
        if self.request.instance_type not in CAPACITY_BLOCK_TYPES:
            problems.add("instance_type", self.request.instance_type, "is not offered as a Capacity Block for ML; "
                         f"of the catalog only {', '.join(CAPACITY_BLOCK_TYPES)} is (Amazon EC2 User Guide, "
                         "Capacity Blocks for ML, supported instance types)")
        zone = self.capacity_block_zone
        if zone is not None and zone not in self.availability_zones:
            problems.add("capacity_block_zone", zone, f"must be one of availability_zones "
                         f"({', '.join(self.availability_zones)}): the hosts launch in the block's zone" if
                         self.availability_zones else "needs availability_zones that include it: the hosts launch "
                         "in the block's zone, and the new VPC's zones are otherwise chosen at deploy")
        end = self.capacity_block_end
        lead = datetime.timedelta(minutes=limits.CAPACITY_BLOCK_LEAD_MINUTES)
        now = datetime.datetime.now(datetime.UTC)
        if end is not None and identifiers.utc_time(end) is None and identifiers.utc_time_value(end) - now < lead:
            problems.add("capacity_block_end", end, f"must be more than {limits.CAPACITY_BLOCK_LEAD_MINUTES} minutes "
                         "from now: the fleet stops serving that long before the block ends")

    def _check_alarms(self, problems: Problems) -> None:
        for key, (low, high) in (("alarm_5xx_percent", limits.PERCENT_RANGE),
                                 ("alarm_p99_latency_seconds", limits.LATENCY_SECONDS_RANGE),
                                 ("alarm_disk_percent", limits.PERCENT_RANGE)):
            if not limits.in_range(getattr(self, key), low, high):
                problems.add(key, getattr(self, key), limits.above_at_most(low, high))

    @property
    def builder(self) -> ServingPlan | None:
        """The layout on the builder instance (see ``builder_instance_type``), when there is one."""
        builder: ServingPlan | None = self.__dict__["_builder"]
        return builder

    def _choose_layout(self) -> tuple[ServingPlan, str]:
        if self.objective is None:
            plan = plan_serving(self.request)
            why = ("tensor_parallel given" if self.tensor_parallel is not None
                   else "the smallest degree that fits, which gives the most replicas")
        else:
            chosen = recommend(self.request, self.objective, self.constraints, self.workload,
                               goodput=self.goodput, space=self.space)
            plan, why = chosen.plan, chosen.reason
            if chosen.load is not None and chosen.load.instances > 1 and self.fleet == "instance":
                raise ServingConfigError([problem(
                    "fleet", self.fleet, f"is one instance, but objective=goodput needs {chosen.load.instances} "
                    f"instances of {plan.instance.name} to serve rate {self.rate:g} within the targets: add "
                    "-c fleet=asg (the fleet then has that many), or lower the rate or relax the targets")])
        object.__setattr__(self, "_load", None if self.objective is None else chosen.load)
        # Only a host that compiles needs the compiler's memory: one that cannot waits for a builder's export.
        builder = None
        layouts = fleet_layouts(plan, self.fleet_types) if self.fleet == "asg" else (plan,)
        object.__setattr__(self, "_layouts", layouts)
        if self.prebuilt_export is not None:
            if self.builder_instance_type is not None:
                raise ServingConfigError([problem("builder_instance_type", self.builder_instance_type,
                                                  "does not apply with prebuilt_export: nothing is compiled")])
        elif self.builder_instance_type is not None or any(compile_memory_problem(p) for p in layouts):
            # A fleet with a type too small to compile has a builder: every host then waits for its export.
            builder = builder_plan(plan, self.builder_instance_type)
        object.__setattr__(self, "_builder", builder)
        self._check_volume(plan, builder)
        return plan, why

    def _check_volume(self, plan: ServingPlan, builder: ServingPlan | None) -> None:
        """The root volumes' throughput and IOPS against gp3's limits, on the hosts' and the builder's
        volume sizes."""
        too_many = {
            wrong
            for host in (plan, builder) if host is not None
            if (wrong := volume_performance(host, self.root_volume_throughput, self.root_volume_iops,
                                            self.boot_disk_minutes)
                .size_problem(host.root_volume_gib)) is not None
        }
        if too_many:
            raise ServingConfigError(sorted(too_many))


SETTINGS: tuple[Setting, ...] = definitions(StackSettings)
"""Every setting, in the order the configuration table (docs/configuration.md) lists them."""

SETTING_NAMES = frozenset(s.name for s in SETTINGS)

_DEFAULTS = {s.name: s.default for s in SETTINGS}


def settings_docstring(indent: str = "    ") -> str:
    """Each setting as a ``:param:`` line (jsii style), for the docstrings of the classes that take them."""
    lines = []
    for s in SETTINGS:
        lines.append(f"{indent}:param {s.name}: {s.doc} Default: {s.default_text}.")
    return "\n".join(lines)


StackSettings.__doc__ = (StackSettings.__doc__ or "") + "\n" + settings_docstring() + "\n"
