"""Stack settings from CDK context (cdk.json or ``-c key=value``), validated in one pass.

Values given with ``-c`` arrive as strings, values in cdk.json as JSON types; both are accepted.
Every problem is collected and reported at once, each naming the context key.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .plan.engines import DEFAULT_ENGINE, ENGINES
from .plan.errors import Problems, ServingConfigError
from .plan.layout import ServingPlan, ServingRequest, plan_serving
from .plan.performance import DEFAULT_WORKLOAD, OBJECTIVES, Constraints, Workload, recommend
from .plan.timing import MAX_CLOUDFORMATION_MINUTES

DEFAULT_MODEL_ID = "NousResearch/Meta-Llama-3-8B-Instruct"
"""Llama 3 8B Instruct as published by Meta, mirrored without the gate: no token needed."""

DEFAULT_INSTANCE_TYPE = "inf2.24xlarge"
"""6 Neuron devices: the default 8B model fits at degree 2, giving 6 data-parallel replicas."""


CONTEXT_KEYS = (
    "model_id", "model_revision", "model_config", "instance_type", "tensor_parallel", "batch_size", "sequence_length",
    "max_input_tokens", "dtype", "hf_token_secret", "engine", "image", "ami_id", "dlami_parameter",
    "internet_facing", "allowed_cidrs", "certificate_arn", "api_keys", "api_keys_secret", "oidc_issuer",
    "oidc_client_id", "oidc_client_secret", "oidc_authorization_endpoint", "oidc_token_endpoint",
    "oidc_user_info_endpoint", "oidc_scope", "rate_limit", "permissions_boundary", "role_path", "fleet",
    "min_capacity", "max_capacity",
    "desired_capacity", "warm_pool", "scale_down_schedule", "scale_up_schedule", "target_requests_per_minute",
    "prebuilt_export", "boot_timeout_minutes", "target_in_flight_requests", "log_retention_days", "alarm_email",
    "alarm_5xx_percent", "alarm_p99_latency_seconds", "alarm_disk_percent", "objective", "max_itl_ms",
    "max_ttft_ms", "min_tokens_per_second", "workload_input_tokens", "workload_output_tokens",
)

CONSTRAINT_KEYS = ("max_itl_ms", "max_ttft_ms", "min_tokens_per_second")
"""Limits on the performance model's predictions that the chosen degree must meet, with ``objective``."""

OIDC_KEYS = ("oidc_issuer", "oidc_client_id", "oidc_client_secret", "oidc_authorization_endpoint",
             "oidc_token_endpoint", "oidc_user_info_endpoint")
"""What the load balancer's OIDC sign-in needs: all of them, or none."""

RATE_LIMIT_RANGE = (10, 2_000_000_000)
"""An AWS WAF rate-based rule's limit: 10 to 2e9 requests per evaluation window (WAFV2 API,
RateBasedStatement.Limit, min 10 and max 2000000000 in botocore 1.43.11
data/wafv2/2019-07-29/service-2.json)."""

_ROLE_PATH = re.compile(r"/(?:[\x21-\x7e]{0,510}/)?")
"""IAM's pattern for a path: / alone, or /.../ of printable ASCII, at most 512 characters."""

FLEET_KINDS = ("instance", "asg")
FLEET_ONLY_KEYS = ("min_capacity", "max_capacity", "desired_capacity", "warm_pool", "scale_down_schedule",
                   "scale_up_schedule", "target_requests_per_minute", "target_in_flight_requests")


@dataclass(frozen=True)
class StackSettings:
    """Everything ``NeuronLlamaStack`` is configured with.

    :param request: the serving request (model, instance type, shapes, degree).
    :param model_revision: the Hub revision (commit, branch or tag) of ``model_id`` to export.
        Part of the artifact cache key, so pinning a commit keeps a fleet's cached export from
        outliving the weights it was built from. Default: none (the repository's default
        branch at export time).
    :param engine: the serving engine, ``tgi`` or ``vllm``. Default: ``tgi``.
    :param image: the serving image: one of the engine's known images, whose tools the boot
        script is written for, optionally pinned to a digest (``<known image>@sha256:<64
        lowercase hex digits>``). A pinned image is pulled and run by its digest, and the digest
        is part of the export's cache key. A digest without the known tag is refused: the tag
        says which tools the image carries. Default: the engine's default image, by its tag.
    :param hf_token_secret: name or ARN of a Secrets Manager secret holding a Hugging Face
        token, for gated models. Default: none.
    :param ami_id: a pinned AMI id instead of the DLAMI parameter. Default: none.
    :param dlami_parameter: the public SSM parameter naming the DLAMI, resolved at each launch.
        Default: the serving image's (a Neuron DLAMI with drivers and tools only, meant for
        containerised serving, whose driver runs the image's Neuron runtime).
    :param internet_facing: an internet-facing load balancer. Default: false (internal).
    :param allowed_cidrs: CIDRs that may reach the endpoint. Default: the VPC's CIDR when
        internal; required when internet-facing.
    :param certificate_arn: an ACM certificate for an HTTPS listener, with HTTP redirected to it.
        Required when internet-facing (prompts never cross the internet in clear text).
        Default: HTTP only (internal endpoints).
    :param api_keys: clients must send ``Authorization: Bearer <key>`` with a key of the stack's
        keys secret, checked by each host's router (see ``neuron-serving api-key``).
        Default: true when internet-facing, false when internal.
    :param api_keys_secret: name or ARN of an existing secret holding the keys (a JSON object of
        name to key digest). Default: a new secret, created empty, output as ``ApiKeysSecretArn``.
    :param oidc_issuer: with the other ``oidc_*`` settings, browser users sign in at the load
        balancer (OIDC, which Cognito user pools also speak) on the HTTPS listener; requests with
        ``Authorization: Bearer`` skip the sign-in and need an API key. Default: no sign-in.
    :param oidc_client_secret: name of the Secrets Manager secret holding the OIDC client
        secret (resolved by CloudFormation at deploy time, never in the template).
    :param oidc_scope: Default: ``openid``.
    :param rate_limit: requests per client IP per 5 minutes above which an AWS WAF web ACL on
        the load balancer blocks the IP (429) until its rate falls. About $5 a month for the web ACL,
        $1 for the rule and $0.60 per million requests. Default: no rate limit.
    :param permissions_boundary: name or ARN of a managed policy set as the permissions
        boundary of every role the stack creates. Default: none.
    :param role_path: the IAM path of every role the stack creates, such as ``/neuron/``.
        Default: ``/``.
    :param fleet: ``instance`` (one EC2 instance) or ``asg`` (an Auto Scaling group).
        Default: ``instance``.
    :param min_capacity: fleet only. Default: 1.
    :param max_capacity: fleet only. Default: 2.
    :param desired_capacity: fleet only. Default: none (the group starts at ``min_capacity``).
    :param warm_pool: fleet only: keep stopped instances that already hold the image and the
        export, so scale-out skips both. Default: false.
    :param scale_down_schedule: fleet only: cron expression (UTC) scaling the fleet to zero.
    :param scale_up_schedule: fleet only: cron expression (UTC) restoring ``min_capacity``.
    :param target_in_flight_requests: fleet only: the average in-flight requests per replica
        (queued or in the batch) that target tracking holds. Default: the batch size.
    :param target_requests_per_minute: fleet only: scale on ALB requests per instance per minute
        instead, holding this many. Default: scale on in-flight requests.
    :param log_retention_days: how long the hosts' log groups keep logs. Default: 14.
    :param alarm_email: an address subscribed to the alarm topic. Default: none.
    :param alarm_5xx_percent: the 5xx alarm's threshold, percent of requests. Default: 5.
    :param alarm_p99_latency_seconds: the p99 latency alarm's threshold. Default: 60.
    :param alarm_disk_percent: the disk alarm's threshold. Default: 85.
    :param prebuilt_export: an existing export to serve instead of exporting: ``s3://bucket/prefix``
        or ``hf://org/repo``. Default: export once, through the stack's artifact cache.
    :param boot_timeout_minutes: how long CloudFormation waits for a host to serve.
        Default: estimated from the model (pull, export, load).
    :param objective: with ``tensor_parallel`` auto, choose the degree by the performance model
        (:mod:`neuron_serving.plan.performance`): ``latency`` (lowest time per token at full batch),
        ``throughput`` (most output tokens per second per instance) or ``cost`` (lowest price per
        million output tokens). Default: none (the smallest degree that fits, which gives the most
        replicas).
    :param constraints: with ``objective``, predictions the chosen degree must meet
        (``max_itl_ms``, ``max_ttft_ms``, ``min_tokens_per_second``); synthesis fails, naming the
        best figure any degree reaches, when none meets them. Default: none.
    :param workload: the tokens in and out of a typical request, for the predictions
        (``workload_input_tokens``, ``workload_output_tokens``). Default:
        :data:`~neuron_serving.plan.performance.DEFAULT_WORKLOAD`.
    """

    request: ServingRequest
    model_revision: str | None = None
    engine: str = DEFAULT_ENGINE
    image: str | None = None
    hf_token_secret: str | None = None
    ami_id: str | None = None
    dlami_parameter: str | None = None
    internet_facing: bool = False
    allowed_cidrs: tuple[str, ...] = field(default=())
    certificate_arn: str | None = None
    api_keys: bool = False
    api_keys_secret: str | None = None
    oidc: dict[str, str] = field(default_factory=dict)
    rate_limit: int | None = None
    permissions_boundary: str | None = None
    role_path: str | None = None
    fleet: str = "instance"
    min_capacity: int = 1
    max_capacity: int = 2
    desired_capacity: int | None = None
    warm_pool: bool = False
    scale_down_schedule: str | None = None
    scale_up_schedule: str | None = None
    target_requests_per_minute: int | None = None
    target_in_flight_requests: float | None = None
    log_retention_days: int = 14
    alarm_email: str | None = None
    alarm_5xx_percent: float = 5.0
    alarm_p99_latency_seconds: float = 60.0
    alarm_disk_percent: float = 85.0
    prebuilt_export: str | None = None
    boot_timeout_minutes: int | None = None
    objective: str | None = None
    constraints: Constraints = field(default_factory=Constraints)
    workload: Workload = DEFAULT_WORKLOAD

    def plan(self) -> ServingPlan:
        """The layout: ``tensor_parallel`` when given; else the degree ``objective`` recommends;
        else the smallest degree that fits. Raises :class:`ServingConfigError` naming the setting."""
        return self.layout()[0]

    def layout(self) -> tuple[ServingPlan, str]:
        """The layout (see :meth:`plan`) and why it was chosen, in a sentence."""
        if self.objective is None:
            plan = plan_serving(self.request)
            why = ("tensor_parallel given" if self.request.tensor_parallel is not None
                   else "the smallest degree that fits, which gives the most replicas")
            return plan, why
        chosen = recommend(self.request, self.objective, self.constraints, self.workload)
        return chosen.plan, chosen.reason

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> StackSettings:
        """Read and validate every context key; raise once with all problems."""
        problems = Problems()
        reader = _Reader(get, problems)
        request = ServingRequest(
            model_id=reader.text("model_id", DEFAULT_MODEL_ID),
            model_config=reader.optional_text("model_config"),
            instance_type=reader.text("instance_type", DEFAULT_INSTANCE_TYPE),
            tensor_parallel=reader.degree("tensor_parallel"),
            batch_size=reader.integer("batch_size", ServingRequest.batch_size),
            sequence_length=reader.integer("sequence_length", ServingRequest.sequence_length),
            max_input_tokens=reader.optional_integer("max_input_tokens"),
            dtype=reader.text("dtype", ServingRequest.dtype),
        )
        internet_facing = reader.boolean("internet_facing", False)
        settings = cls(
            request=request,
            model_revision=reader.optional_text("model_revision"),
            engine=reader.text("engine", DEFAULT_ENGINE),
            image=reader.optional_text("image"),
            hf_token_secret=reader.optional_text("hf_token_secret"),
            ami_id=reader.optional_text("ami_id"),
            dlami_parameter=reader.optional_text("dlami_parameter"),
            internet_facing=internet_facing,
            allowed_cidrs=reader.cidrs("allowed_cidrs"),
            certificate_arn=reader.optional_text("certificate_arn"),
            api_keys=reader.boolean("api_keys", internet_facing),
            api_keys_secret=reader.optional_text("api_keys_secret"),
            oidc={k.removeprefix("oidc_"): v for k in (*OIDC_KEYS, "oidc_scope")
                  if (v := reader.optional_text(k)) is not None},
            rate_limit=reader.optional_integer("rate_limit"),
            permissions_boundary=reader.optional_text("permissions_boundary"),
            role_path=reader.optional_text("role_path"),
            fleet=reader.text("fleet", "instance"),
            min_capacity=reader.integer("min_capacity", cls.min_capacity),
            max_capacity=reader.integer("max_capacity", cls.max_capacity),
            desired_capacity=reader.optional_integer("desired_capacity"),
            warm_pool=reader.boolean("warm_pool", False),
            scale_down_schedule=reader.optional_text("scale_down_schedule"),
            scale_up_schedule=reader.optional_text("scale_up_schedule"),
            target_requests_per_minute=reader.optional_integer("target_requests_per_minute"),
            target_in_flight_requests=reader.optional_number("target_in_flight_requests"),
            log_retention_days=reader.integer("log_retention_days", cls.log_retention_days),
            alarm_email=reader.optional_text("alarm_email"),
            alarm_5xx_percent=reader.number("alarm_5xx_percent", cls.alarm_5xx_percent),
            alarm_p99_latency_seconds=reader.number("alarm_p99_latency_seconds", cls.alarm_p99_latency_seconds),
            alarm_disk_percent=reader.number("alarm_disk_percent", cls.alarm_disk_percent),
            prebuilt_export=reader.optional_text("prebuilt_export"),
            boot_timeout_minutes=reader.optional_integer("boot_timeout_minutes"),
            objective=reader.optional_text("objective"),
            constraints=_constraints(reader, problems),
            workload=_workload(reader, request, problems),
        )
        _check_objective(settings, get, problems)
        if settings.engine not in ENGINES:
            problems.add("engine", settings.engine, f"must be one of {', '.join(ENGINES)}")
        else:
            if settings.image is not None:
                try:
                    ENGINES[settings.engine].image(settings.image)
                except ServingConfigError as error:
                    problems.add_all(error.problems)
            for key in ENGINES[settings.engine].unused_settings:
                if get(key) not in (None, ""):
                    problems.add(key, get(key), f"does not apply to engine {settings.engine}; it applies to engine "
                                 + ", ".join(e.name for e in ENGINES.values() if key not in e.unused_settings))
        _check_endpoint(settings, problems)
        if settings.fleet not in FLEET_KINDS:
            problems.add("fleet", settings.fleet, f"must be one of {', '.join(FLEET_KINDS)}")
        elif settings.fleet == "instance":
            for key in FLEET_ONLY_KEYS:
                if get(key) not in (None, ""):
                    problems.add(key, get(key), "applies to fleet=asg only; add -c fleet=asg")
        elif bool(settings.scale_down_schedule) != bool(settings.scale_up_schedule):
            missing = "scale_up_schedule" if settings.scale_down_schedule else "scale_down_schedule"
            problems.add(missing, None, "is required with the other schedule: a fleet scaled to zero must know "
                         "when to come back, and one scaled back when to stop")
        if settings.target_in_flight_requests is not None and settings.target_requests_per_minute is not None:
            problems.add("target_in_flight_requests", settings.target_in_flight_requests,
                         "cannot be combined with target_requests_per_minute: choose one scaling signal")
        if settings.target_in_flight_requests is not None and settings.target_in_flight_requests <= 0:
            problems.add("target_in_flight_requests", settings.target_in_flight_requests, "must be above 0")
        timeout = settings.boot_timeout_minutes
        if timeout is not None and not 1 <= timeout <= MAX_CLOUDFORMATION_MINUTES:
            problems.add("boot_timeout_minutes", timeout, f"must be 1 to {MAX_CLOUDFORMATION_MINUTES} "
                         "(CloudFormation waits at most 12 hours for signals)")
        problems.raise_if_any()
        return settings


def _constraints(reader: _Reader, problems: Problems) -> Constraints:
    try:
        return Constraints(**{key: reader.optional_number(key) for key in CONSTRAINT_KEYS})
    except ServingConfigError as error:
        problems.add_all(error.problems)
        return Constraints()


def _workload(reader: _Reader, request: ServingRequest, problems: Problems) -> Workload:
    """The workload keys, checked against the export's shapes (its problems named by their context keys)."""
    try:
        workload = Workload(reader.integer("workload_input_tokens", DEFAULT_WORKLOAD.input_tokens),
                            reader.integer("workload_output_tokens", DEFAULT_WORKLOAD.output_tokens))
    except ServingConfigError as error:
        # Workload names its fields input_tokens and output_tokens.
        problems.add_all(f"workload_{p}" for p in error.problems)
        return DEFAULT_WORKLOAD
    try:
        workload.check_fits(request, prefix="workload_")
    except ServingConfigError as error:
        problems.add_all(error.problems)
    return workload


def _check_objective(settings: StackSettings, get: Callable[[str], Any], problems: Problems) -> None:
    """An objective and its constraints choose a degree: only when none is given."""
    objective = settings.objective
    if objective is not None and objective not in OBJECTIVES:
        problems.add("objective", objective, f"must be one of {', '.join(OBJECTIVES)}")
    if objective is not None and settings.request.tensor_parallel is not None:
        problems.add("objective", objective, f"applies only with tensor_parallel=auto: tensor_parallel "
                     f"{settings.request.tensor_parallel} leaves no degree to choose")
    for key in CONSTRAINT_KEYS:
        value = get(key)
        if value in (None, ""):
            continue
        if objective is None:
            problems.add(key, value, "is a constraint on the degree the objective chooses: add "
                         f"-c objective=<{'|'.join(OBJECTIVES)}> (and tensor_parallel=auto)")


def _check_endpoint(settings: StackSettings, problems: Problems) -> None:
    """Who may use the endpoint, and how."""
    given = [k for k in OIDC_KEYS if k.removeprefix("oidc_") in settings.oidc]
    if settings.internet_facing and not settings.certificate_arn:
        problems.add("certificate_arn", None, "is required when internet_facing is true: an internet-facing "
                     "endpoint serves HTTPS only (HTTP redirects to it), so prompts and keys never cross the "
                     "internet in clear text; give an ACM certificate ARN of the endpoint's domain")
    elif settings.certificate_arn and not _CERTIFICATE.fullmatch(settings.certificate_arn):
        problems.add("certificate_arn", settings.certificate_arn,
                     "must be an ACM certificate ARN such as arn:aws:acm:us-east-1:111122223333:certificate/<id>")
    if settings.internet_facing and not settings.api_keys and not given:
        problems.add("api_keys", False, "cannot be false when internet_facing is true unless browser users sign in "
                     "with oidc_*: an internet-facing endpoint never serves anyone who is not authenticated")
    if given and len(given) < len(OIDC_KEYS):
        for key in OIDC_KEYS:
            if key not in given:
                problems.add(key, None, f"is required with {', '.join(given)}: the load balancer's OIDC sign-in "
                             f"needs {', '.join(OIDC_KEYS)}")
    if given and not settings.certificate_arn:
        problems.add("certificate_arn", None, "is required with oidc_*: a load balancer signs users in on an "
                     "HTTPS listener only")
    for key in ("oidc_issuer", "oidc_authorization_endpoint", "oidc_token_endpoint", "oidc_user_info_endpoint"):
        value = settings.oidc.get(key.removeprefix("oidc_"))
        if value is not None and not value.startswith("https://"):
            problems.add(key, value, "must be an https:// URL")
    if settings.api_keys_secret and not settings.api_keys:
        problems.add("api_keys_secret", settings.api_keys_secret, "applies only with api_keys=true")
    low, high = RATE_LIMIT_RANGE
    if settings.rate_limit is not None and not low <= settings.rate_limit <= high:
        problems.add("rate_limit", settings.rate_limit, f"must be {low} to {high} requests per client IP per "
                     "5 minutes (AWS WAF's rate-based rule limits)")
    if settings.role_path is not None and not _ROLE_PATH.fullmatch(settings.role_path):
        problems.add("role_path", settings.role_path, "must start and end with / (such as /neuron/), with at most "
                     "512 printable ASCII characters")
    boundary = settings.permissions_boundary
    if boundary is not None and not (_POLICY_ARN.fullmatch(boundary) or _POLICY_NAME.fullmatch(boundary)):
        problems.add("permissions_boundary", boundary, "must be a managed policy's name or its ARN "
                     "(arn:aws:iam::111122223333:policy/<name>)")


_CERTIFICATE = re.compile(r"arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[A-Za-z0-9-]+")
_POLICY_ARN = re.compile(r"arn:aws[a-z-]*:iam::(\d{12}|aws):policy/[\w+=,.@/-]+")
_POLICY_NAME = re.compile(r"[\w+=,.@-]{1,128}")


class _Reader:
    def __init__(self, get: Callable[[str], Any], problems: Problems) -> None:
        self._get = get
        self._problems = problems

    def _raw(self, key: str) -> Any:
        value = self._get(key)
        return None if value is None or value == "" else value

    def optional_text(self, key: str) -> str | None:
        value = self._raw(key)
        if value is None:
            return None
        if not isinstance(value, str):
            self._problems.add(key, value, "must be a string")
            return None
        return value.strip()

    def text(self, key: str, default: str) -> str:
        return self.optional_text(key) or default

    def optional_integer(self, key: str) -> int | None:
        value = self._raw(key)
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        self._problems.add(key, value, "must be a whole number")
        return None

    def optional_number(self, key: str) -> float | None:
        value = self._raw(key)
        if value is None:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = float("nan")
            if math.isfinite(number):
                return number
        self._problems.add(key, value, "must be a number")
        return None

    def number(self, key: str, default: float) -> float:
        value = self.optional_number(key)
        return default if value is None else value

    def integer(self, key: str, default: int) -> int:
        value = self.optional_integer(key)
        return default if value is None else value

    def degree(self, key: str) -> int | None:
        value = self._raw(key)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        return self.optional_integer(key)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._raw(key)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self._problems.add(key, value, "must be true or false")
        return default

    def cidrs(self, key: str) -> tuple[str, ...]:
        value = self._raw(key)
        if value is None:
            return ()
        items: Any
        if isinstance(value, str):
            text = value.strip()
            try:
                items = json.loads(text) if text.startswith("[") else text.split(",")
            except json.JSONDecodeError:
                items = None
            if not isinstance(items, list):
                self._problems.add(key, value, "must be a list of CIDRs or a comma-separated string")
                return ()
        elif isinstance(value, list):
            items = value
        else:
            self._problems.add(key, value, "must be a list of CIDRs or a comma-separated string")
            return ()
        result = []
        for item in items:
            try:
                result.append(str(ipaddress.ip_network(str(item).strip(), strict=True)))
            except ValueError:
                self._problems.add(key, item, "is not a valid CIDR (such as 203.0.113.0/24)")
        return tuple(result)
