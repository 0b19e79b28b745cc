"""What a boot script needs beyond the serving plan and its host's spec
(:class:`~neuron_serving.plan.host.HostSpec`): what the stack supplies (:class:`BootOptions`: secret
ids, the cache, log groups) and the CloudFormation resources the host reports to
(:class:`ReadinessSignal`, :class:`WarmPoolHook`, :class:`TerminationHook`), each checked when made:
every problem at once, naming the option."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..plan.errors import Problems
from ..plan.host import HostSpec, has_space, s3_parts
from ..plan.metrics import MonitoringOptions
from ..plan.timing import MAX_CLOUDFORMATION_MINUTES
from .bundle import TOKEN_MARK

MIN_HEARTBEAT_TIMEOUT_SECONDS = 30
MAX_HEARTBEAT_TIMEOUT_SECONDS = 7200
"""The bounds of a lifecycle hook's HeartbeatTimeout (Auto Scaling API reference, PutLifecycleHook)."""

@dataclass(frozen=True)
class ReadinessSignal:
    """The CloudFormation resource the host signals: SUCCESS once every replica serves, FAILURE
    with the reason when a boot step fails (see the module documentation).

    :param stack_name: the stack's name (or id).
    :param logical_id: the logical id of the instance or Auto Scaling group with the creation
        or update policy that waits for the signal.
    """

    stack_name: str
    logical_id: str

    def __post_init__(self) -> None:
        problems = Problems()
        _check_word(problems, "signal.stack_name", self.stack_name)
        _check_word(problems, "signal.logical_id", self.logical_id)
        problems.raise_if_any()


@dataclass(frozen=True)
class WarmPoolHook:
    """The Auto Scaling launch lifecycle hook the host completes, for groups with a warm pool.

    The host reads its target lifecycle state from the instance metadata. Launched into the warm
    pool (``Warmed:*``), it prepares everything (image, export or download, units enabled but not
    started, router config), completes the hook with CONTINUE, signals nothing, and the group
    stops it. Started from the pool, cloud-init runs no user data: the units serve from the local
    export (no pull, no export) and ``neuron-serving-ready.service`` completes the hook (which
    fires again) once ``wait-ready`` passes. Launched straight into service, the boot script
    completes it after the readiness signal. A failed boot completes it with ABANDON, so the
    group replaces the host. Completing an action none awaits (a later reboot) fails harmlessly.

    Only a warm pool of stopped instances works: a running or hibernated one never boots again,
    so nothing would start the replicas.

    :param hook_name: the lifecycle hook's name.
    :param group_name: the Auto Scaling group's name, which the stack knows (a CDK token is
        fine); on the host it would take tags in the instance metadata or a DescribeTags grant.
    :param heartbeat_timeout_seconds: the hook's heartbeat timeout, which the hook must be
        created with: the boot script records a heartbeat every quarter of it, so a boot may take
        as long as the hook's global timeout allows (100 heartbeat timeouts, at most 48 hours).
        Default: 7200, the API's maximum.
    """

    hook_name: str
    group_name: str
    heartbeat_timeout_seconds: int = MAX_HEARTBEAT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        problems = Problems()
        _check_word(problems, "warm_pool_hook.hook_name", self.hook_name)
        _check_word(problems, "warm_pool_hook.group_name", self.group_name)
        _check_heartbeat(problems, "warm_pool_hook.heartbeat_timeout_seconds", self.heartbeat_timeout_seconds)
        problems.raise_if_any()

    @property
    def heartbeat_interval_seconds(self) -> int:
        """How often the boot script records a heartbeat: four chances per timeout."""
        return self.heartbeat_timeout_seconds // 4


@dataclass(frozen=True)
class TerminationHook:
    """The Auto Scaling termination lifecycle hook (``autoscaling:EC2_INSTANCE_TERMINATING``) a host with
    interruptions completes once it has drained, so the group terminates it only when its requests in
    flight are done.

    Whatever ends the host, a scale-in, a Spot replacement by Capacity Rebalancing, an interruption
    notice or the host's own request to leave, the group sets the instance metadata's
    ``autoscaling/target-lifecycle-state`` to ``Terminated`` (Amazon EC2 Auto Scaling user guide,
    "Retrieve the target lifecycle state through instance metadata"), deregisters the host from the
    load balancer, waiting out its deregistration delay, and only then holds it in ``Terminating:Wait``
    until the action is completed or the heartbeat timeout ends (the same guide, "How lifecycle hooks
    work", and "Capacity Rebalancing": "waits for the instance to deregister from the load balancer
    before calling the termination lifecycle hook"). ``watch-interruption`` drains on the first of
    these and completes the action with CONTINUE.

    :param hook_name: the lifecycle hook's name.
    :param group_name: the Auto Scaling group's name (a CDK token is fine).
    :param heartbeat_timeout_seconds: the hook's heartbeat timeout: how long the group waits for the
        host once it is in ``Terminating:Wait``, and how long the host waits for its requests in flight
        before it completes the action all the same.
    """

    hook_name: str
    group_name: str
    heartbeat_timeout_seconds: int

    def __post_init__(self) -> None:
        problems = Problems()
        _check_word(problems, "termination_hook.hook_name", self.hook_name)
        _check_word(problems, "termination_hook.group_name", self.group_name)
        _check_heartbeat(problems, "termination_hook.heartbeat_timeout_seconds", self.heartbeat_timeout_seconds)
        problems.raise_if_any()


WAIT_POLL_SECONDS = 30
"""How often a waiting host looks for the builder's export (one GetObject of a missing key)."""


@dataclass(frozen=True)
class BootOptions:
    """What the boot script needs beyond the serving plan and the host's spec: mostly what the stack
    supplies (secret ids, the cache's place, the signal's and the hook's targets, the log groups),
    any of which may be a CDK token unless said otherwise.

    :param hf_token_secret: name or ARN of a Secrets Manager secret whose plain-text value is a
        Hugging Face token, for gated models. Only this id is in the user data; the host reads
        the token at boot into a root-only file, which only the Hub download is given (never
        the compiler or a replica). The instance role must be allowed to read the secret.
        Default: no token (public models only).
    :param artifact_cache: an S3 URI prefix (``s3://bucket/prefix``; the bucket may be a CDK
        token) shared by hosts: a host downloads ``<prefix>/<export key>/`` when another one
        published it, else exports and publishes its export there. Needs s3:GetObject,
        s3:PutObject and s3:DeleteObject below the prefix and s3:ListBucket on it. Ignored with
        the spec's ``prebuilt_export``. Default: every host exports for itself.
    :param compile_cache: an S3 URI prefix (``s3://bucket/prefix``; the bucket may be a CDK token)
        of compiled graphs shared by hosts, the compiler's persistent cache
        (``NEURON_COMPILE_CACHE_URL``): the export fetches each graph found there instead of
        compiling it, before it looks in the spec's Hub cache, and leaves there each graph it
        compiles. The export's container then runs in the host's network namespace, to reach the
        instance role's credentials (the instance metadata allows one hop). Needs s3:GetObject and
        s3:PutObject below the prefix and s3:ListBucket on it. Ignored with the spec's
        ``prebuilt_export`` and by a host that waits for a builder. Default: none (each export
        compiles what the Hub cache lacks).
    :param signal: the CloudFormation resource to signal once every replica serves, or on
        failure. Default: no signal.
    :param warm_pool_hook: the launch lifecycle hook of an Auto Scaling group with a warm pool.
        Default: none (the host starts serving on its first boot and completes no hook).
    :param monitoring: publish the catalog's metrics and ship the logs to these log groups (the
        service name and group names may be CDK tokens; the namespace may not). The instance
        role needs logs:CreateLogStream, logs:PutLogEvents and logs:DescribeLogStreams on the
        groups (the agent and docker create the streams); the host downloads the CloudWatch
        agent from its region's S3 when the image lacks it, and installs it only if its
        signature is a good one by the key ``monitoring.agent_key_fingerprint`` pins (AWS's).
        Default: no monitoring.
    :param api_keys_secret: name or ARN of the Secrets Manager secret of the endpoint's API keys
        (``neuron_serving/userdata/api_keys.py`` describes it; a CDK token is fine). The router
        then refuses every request without a known key, and ``api-keys sync`` keeps its keys in
        line with the secret: before the router starts (a secret that cannot be read fails the
        boot), then every minute (``neuron-serving-api-keys.timer``). The instance role needs
        secretsmanager:GetSecretValue on it. Default: no API keys.
    :param load_balancer_authentication: with ``api_keys_secret``, the router also accepts
        requests that the load balancer signed in (see ``render_router_config``). Default: false.
    :param export_wait_minutes: with the spec's export role ``wait``, how long the host waits for the builder's export
        before its boot fails. Default: 12 hours (CloudFormation's longest wait for a signal).
    :param ready_seconds: with a signal or a warm pool hook, how long ``wait-ready`` waits for every
        replica to load its model and answer, then for the router, polling every 10 s (the
        environment variable ``NEURON_SERVING_READY_SECONDS`` overrides it on the host). With a
        warm pool hook it may not exceed the hook's heartbeat timeout: started from the pool, the
        host waits with no heartbeat. Default: ``plan.timing.readiness_seconds`` at the plan's
        default root volume throughput (``plan.volume.default_throughput``).
    :param interruptions: drain the host on a Spot interruption notice, and on its group's termination
        with ``termination_hook`` (``neuron-serving-interruption.service``, ``userdata/watch_interruption.py``;
        see the module documentation of :mod:`~neuron_serving.render.boot`): the router's ``/health``
        answers 503 within 2 s while every request is still served, the host reports the phase
        ``draining`` (on a Spot notice, it also asks its Auto Scaling group to replace it), then waits for
        its requests in flight. A rebalance recommendation is only logged: the group's Capacity
        Rebalancing replaces the host, then terminates it through its termination lifecycle. For hosts of
        an Auto Scaling group only; the instance role needs
        ``autoscaling:TerminateInstanceInAutoScalingGroup`` on the group (``NeuronBootScript.grant_boot``).
        Default: false.
    :param termination_hook: with ``interruptions``, the group's termination lifecycle hook, which the
        host completes with CONTINUE once drained; the instance role needs
        ``autoscaling:CompleteLifecycleAction`` on the group. Default: none (the group terminates the
        host once the load balancer's deregistration delay is over).

    Boot progress (see the module documentation) has no option of its own: it is on exactly when
    the host reads its instance metadata (:func:`reports_phases`), that is with any option above
    that calls AWS (an S3 artifact cache or the spec's S3 prebuilt export, API keys, a signal, a warm pool hook,
    monitoring or interruptions). Such a host already has its region and instance id and an AWS role; one
    without calls no AWS API at all and needs no role, and it would gain one only to report. The
    instance role then needs ``ec2:CreateTags`` on the instance itself and for the keys of
    :data:`~neuron_serving.plan.phases.HOST_TAGS` only (the phase's four, and the publish's outcome of a host
    that :func:`publishes`; ``NeuronBootScript.grant_boot`` grants exactly that); without it the host logs
    each refused report and boots all the same.
    """

    hf_token_secret: str | None = None
    artifact_cache: str | None = None
    compile_cache: str | None = None
    signal: ReadinessSignal | None = None
    warm_pool_hook: WarmPoolHook | None = None
    monitoring: MonitoringOptions | None = None
    api_keys_secret: str | None = None
    load_balancer_authentication: bool = False
    export_wait_minutes: int = MAX_CLOUDFORMATION_MINUTES
    ready_seconds: int | None = None
    interruptions: bool = False
    termination_hook: TerminationHook | None = None

    def __post_init__(self) -> None:
        problems = Problems()
        secret = self.hf_token_secret
        if secret is not None and (not isinstance(secret, str) or not secret or has_space(secret)):
            problems.add("hf_token_secret", secret, "must be a secret name or ARN without spaces, or None")
        cache = self.artifact_cache
        if cache is not None and s3_parts(cache) is None:
            problems.add("artifact_cache", cache, "must be an S3 URI prefix such as s3://bucket/exports, "
                         "without spaces, or None")
        if self.compile_cache is not None and s3_parts(self.compile_cache) is None:
            problems.add("compile_cache", self.compile_cache, "must be an S3 URI prefix such as "
                         "s3://bucket/compile-cache, without spaces, or None")
        if self.signal is not None and not isinstance(self.signal, ReadinessSignal):
            problems.add("signal", self.signal, "must be a ReadinessSignal or None")
        if self.warm_pool_hook is not None and not isinstance(self.warm_pool_hook, WarmPoolHook):
            problems.add("warm_pool_hook", self.warm_pool_hook, "must be a WarmPoolHook or None")
        monitoring = self.monitoring
        if monitoring is not None and not isinstance(monitoring, MonitoringOptions):
            problems.add("monitoring", monitoring, "must be a MonitoringOptions or None")
        elif monitoring is not None:
            if TOKEN_MARK in monitoring.namespace:
                problems.add("monitoring.namespace", monitoring.namespace, "must be known at synth, not a CDK "
                             "token: it is in the publisher's config, in the boot bundle made at synth")
            for kind, group in monitoring.log_groups.items():
                if TOKEN_MARK not in group and not _LOG_GROUP.fullmatch(group):
                    problems.add(f"monitoring.log_groups[{kind!r}]", group, "must be a CloudWatch Logs group name: "
                                 "1 to 512 letters, digits and ._/#- (or a CDK token)")
        keys = self.api_keys_secret
        if keys is not None and (not isinstance(keys, str) or not keys or has_space(keys)):
            problems.add("api_keys_secret", keys, "must be a secret name or ARN without spaces, or None")
        if self.load_balancer_authentication and keys is None:
            problems.add("load_balancer_authentication", True, "applies only with api_keys_secret")
        wait = self.export_wait_minutes
        if not isinstance(wait, int) or isinstance(wait, bool) or wait < 1:
            problems.add("export_wait_minutes", wait, "must be a whole number of minutes, at least 1")
        ready = self.ready_seconds
        if ready is not None and (not isinstance(ready, int) or isinstance(ready, bool) or ready < 1):
            problems.add("ready_seconds", ready, "must be a whole number of seconds, at least 1, or None")
        if not isinstance(self.interruptions, bool):
            problems.add("interruptions", self.interruptions, "must be true or false")
        if self.termination_hook is not None and not isinstance(self.termination_hook, TerminationHook):
            problems.add("termination_hook", self.termination_hook, "must be a TerminationHook or None")
        elif self.termination_hook is not None and self.interruptions is not True:
            problems.add("termination_hook", self.termination_hook.hook_name, "applies only with interruptions: "
                         "the interruption watcher completes it")
        if (self.termination_hook is not None and self.warm_pool_hook is not None
                and self.termination_hook.group_name != self.warm_pool_hook.group_name):
            problems.add("termination_hook.group_name", self.termination_hook.group_name,
                         f"must be the warm pool hook's group ({self.warm_pool_hook.group_name})")
        problems.raise_if_any()


_LOG_GROUP = re.compile(r"[A-Za-z0-9._/#-]{1,512}")


def reports_phases(spec: HostSpec, options: BootOptions) -> bool:
    """Whether the host reads its instance metadata, and so reports its boot's phases as tags on
    its instance (see :class:`BootOptions`): with any option that calls AWS."""
    s3 = s3_parts(spec.prebuilt_export) is not None or (
        (options.artifact_cache is not None or options.compile_cache is not None) and spec.exports)
    return (s3 or options.api_keys_secret is not None or options.signal is not None
            or options.warm_pool_hook is not None or options.monitoring is not None or options.interruptions)


def publishes(spec: HostSpec, options: BootOptions) -> bool:
    """Whether the host publishes the export it compiles to the artifact cache: it has one, and it may
    compile (a builder, or a host that serves). Such a host reports what became of the publish
    (``report-publish``: the tag :data:`~neuron_serving.plan.phases.PUBLISH_TAG` and, with monitoring,
    the metric :data:`~neuron_serving.plan.metrics.EXPORT_PUBLISH_FAILURES` when it failed)."""
    return options.artifact_cache is not None and spec.compiles


def check_boot(spec: HostSpec, options: BootOptions) -> None:
    """What the spec's export role asks of the options. Raises
    :class:`~neuron_serving.plan.errors.ServingConfigError` with every problem at once."""
    problems = Problems()
    if spec.export_role != "serve" and (options.artifact_cache is None or not spec.exports):
        problems.add("export_role", spec.export_role, "needs artifact_cache and no prebuilt_export: the "
                     "builder publishes the export there, and the serving hosts wait for it there")
    if spec.export_role == "build" and options.interruptions:
        problems.add("export_role", spec.export_role, "takes no interruptions: a builder serves nothing to drain")
    if spec.export_role == "build" and (options.signal is not None or options.warm_pool_hook is not None):
        problems.add("export_role", spec.export_role, "takes no signal or warm_pool_hook: a builder serves "
                     "nothing, and leaves its group once the export is in the cache")
    problems.raise_if_any()


def _check_heartbeat(problems: Problems, setting: str, timeout: object) -> None:
    if not isinstance(timeout, int) or isinstance(timeout, bool) or not (
        MIN_HEARTBEAT_TIMEOUT_SECONDS <= timeout <= MAX_HEARTBEAT_TIMEOUT_SECONDS
    ):
        problems.add(setting, timeout, f"must be an integer from {MIN_HEARTBEAT_TIMEOUT_SECONDS} to "
                     f"{MAX_HEARTBEAT_TIMEOUT_SECONDS} (the PutLifecycleHook API's HeartbeatTimeout)")


def _check_word(problems: Problems, setting: str, value: object) -> None:
    if not isinstance(value, str) or not value or has_space(value):
        problems.add(setting, value, "must be a non-empty name without spaces")
