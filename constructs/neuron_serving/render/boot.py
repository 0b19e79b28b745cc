"""The boot script: the EC2 user data that turns a Neuron DLAMI instance into the plan's host.

It runs once as root under cloud-init and leaves on the host (every path below
``$NEURON_SERVING_ROOT``, which is empty on a real host and set by tests and chroot-style image
builds; devices handed to docker stay the real ``/dev/neuronN``):

- ``/opt/neuron-serving/bin/export-model``: the one-time export (the checkpoint downloaded, then
  compiled from that directory so the export holds the weights), or its download
  (``userdata/export-model.sh.j2``);
- ``/opt/neuron-serving/bin/check-export``: whether an export matches the plan (degree, shapes,
  dtype, compiled model, tokenizer, weights), run before any export is used
  (``userdata/check-export.py.j2``, ``Engine.export_expectations``);
- ``/opt/neuron-serving/bin/run-replica``: one serving container (``userdata/run-replica.sh.j2``);
- ``/etc/systemd/system/neuron-replica@.service``: one unit per replica
  (``userdata/neuron-replica@.service.j2``);
- with a signal or a warm pool hook, ``/opt/neuron-serving/bin/wait-ready``, which waits until
  every replica answers ``/health`` and a one-token generation (the engine's
  :class:`~neuron_serving.plan.engines.ReadinessProbe`), then the router's ``/health``
  (``userdata/wait-ready.sh.j2``);
- with a warm pool hook, ``/opt/neuron-serving/bin/complete-lifecycle`` and
  ``neuron-serving-ready.service`` (``userdata/complete-lifecycle.sh.j2``,
  ``userdata/neuron-serving-ready.service.j2``);
- when the host reads its instance metadata (:attr:`BootOptions.reports_phases`),
  ``/opt/neuron-serving/bin/report-phase``, which tags the instance with the boot's phase
  (``userdata/report-phase.sh.j2``; see **Boot progress** below);
- with monitoring, ``/opt/neuron-serving/bin/start-monitoring`` (``userdata/start-monitoring.sh.j2``),
  which installs the CloudWatch agent when missing (only once AWS's signature of the package
  verifies, by the key ``MonitoringOptions.agent_key_fingerprint`` pins) and configures it, the
  metrics publisher ``/opt/neuron-serving/bin/publish-metrics`` (``userdata/publish_metrics.py``)
  and its unit ``neuron-serving-metrics.service`` (``userdata/neuron-serving-metrics.service.j2``), and
  ``/etc/logrotate.d/neuron-serving-metrics``; see :mod:`~neuron_serving.render.monitoring`;
- ``/etc/neuron-serving/``: ``stack.env`` (values from the stack), ``replica.env`` (the
  engine's settings all replicas share), ``replicas.table`` (what differs per replica),
  ``replica-N.conf`` (devices, port,
  env file), ``replica-N.env`` (``docker --env-file``), ``hf-token.env`` (mode 0600, only with
  a token secret), ``host.env`` (region and instance id from IMDSv2, when AWS is called), and
  with monitoring ``metrics.json``, ``neuron-monitor.json`` and ``cloudwatch-agent.json``;
- ``/var/lib/neuron-serving/exports/<export key>/`` with its completion marker;
- ``/etc/haproxy/haproxy.cfg``: the router (:func:`~neuron_serving.render.router.render_router_config`);
- ``/var/log/neuron-serving/``: ``boot.log``, ``export.log``, ``ready.log`` and ``status`` (the
  step reached).

User data is limited to 16 KB, so the templates' comments are left out of it (each rendered file
keeps its ``#!`` line and shellcheck directives, the boot script its header), and the files
travel as one LZMA-compressed, base85-encoded :func:`bundle` of ``put`` commands (:func:`packed`) that the boot
script evaluates. Compressed at synth, the bundle cannot hold deploy-time values (CDK tokens such
as the cache bucket's name): those, and every value the stack chooses (image, cache location,
prebuilt export, lifecycle hook), are in ``/etc/neuron-serving/stack.env``, which the boot script
writes as is and the files source.

**Artifact cache.** Exports live in S3 under ``<artifact_cache>/<export key>/``: a host that
finds ``COMPLETE`` there downloads the upload it names; otherwise it exports, uploads to
``<instance id>/`` next to it and then creates ``COMPLETE`` with a conditional write
(``put-object --if-none-match '*'``) that fails if it already exists. Of racing hosts exactly
one publishes; the others delete their upload and serve their own export. ``COMPLETE`` is
written last, so an upload without it is never used. Its first line names the upload; the
others are its manifest, ``<sha256>  <path>`` per file as ``sha256sum`` prints them, sorted. A
host that downloads serves the upload only if its files are exactly the manifest's with the
same checksums, and then only if ``check-export`` passes; otherwise (and when the download
fails) it logs why, naming the files that differ, and exports for itself. The host role may
create ``COMPLETE`` but never replace or delete it (the stack's ``NeuronArtifactCache.grant_cache``),
so whoever alters a published upload makes other hosts export, never serve its files. Files are
hashed in parallel, one ``sha256sum`` per CPU, so checking takes about as long as hashing the
largest file, one rank's weight shard: some 20 s for the 8 GB shard of an 8B model at degree 2
(coreutils' SHA-256 runs at about 370 MB/s per core on the test machine).

**Readiness.** With a :class:`ReadinessSignal`, the host signals SUCCESS once ``wait-ready``
passes, and FAILURE when any step fails, so a deployment fails within minutes instead of at
the signal timeout. SignalResource has no reason field, but CloudFormation shows each signal's
unique id in the stack events (which ``cdk deploy`` prints): the unique id carries the reason,
``<instance id> <step>: <last error line>``, reduced to a plain character set and cut to
:data:`SIGNAL_ID_LIMIT` characters, the API's limit. The whole reason (with the last 20 lines
of ``export.log`` when the export failed) goes to ``boot.log`` and to the console, where
``aws ec2 get-console-output`` shows it. A SUCCESS signal's unique id is the instance id, as
CloudFormation asks of instances and Auto Scaling groups.

**Warm pool.** See :class:`WarmPoolHook`.

**Boot progress.** A host that reads its instance metadata reports each phase of
:data:`~neuron_serving.plan.phases.PHASES` it enters as three tags on its own instance
(:mod:`~neuron_serving.plan.phases`), with one CreateTags call per phase: every step's name as it
starts; ``download-export`` instead of ``export-model`` once ``export-model`` knows it downloads (a
prebuilt export, or the artifact cache's), and ``export-model`` again, with the reason, when it
refuses the download; ``wait-ready`` with ``<n> of <N> ready`` as each replica serves; ``ready``
once ``wait-ready`` passes, on the first boot and after every start of a warm pool's host
(``neuron-serving-ready.service``); ``warmed`` once prepared for the warm pool; ``failed`` with
``<step>: <reason>`` when a step, or the ready service's ``wait-ready``, fails. Without a
signal or a hook nothing checks that the replicas serve, so such a host ends in ``router`` with
``boot complete: readiness not checked``, never ``ready``. Reporting never fails a boot: a
refused call is logged and the boot goes on. The phases before the AWS CLI is installed
(``check-devices``, ``install-tools``) are reported only on images that have it, and
``metadata`` never is (``host.env`` does not exist yet).

**Monitoring.** With :class:`~neuron_serving.plan.metrics.MonitoringOptions`, a step right
after the tools are installed starts the CloudWatch agent, which ships the boot's logs, the
router's log and the publisher's EMF file, and the metrics publisher; docker's awslogs driver
ships each replica's output. A failure there is logged as a warning and the boot goes on.
"""

from __future__ import annotations

import base64
import json
import lzma
import re
import shlex
from dataclasses import dataclass

from ..plan.engines import (
    CHECKPOINT_EXCLUDED,
    CHECKPOINT_FILES,
    DEFAULT_ENGINE,
    ENGINES,
    MODEL_MOUNT,
    Engine,
    ServingImage,
)
from ..plan.engines import engine as find_engine
from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.layout import Replica, ServingPlan, compile_memory_problem
from ..plan.metrics import EMF_LOG, LOG_KINDS, MonitoringOptions
from ..plan.phases import DETAIL_TAG, FAILED, PHASE_NAMES, PHASE_TAG, READY, SINCE_TAG, TAG_VALUE_LIMIT, WARMED
from ..plan.registry import ecr_registry_problem, parse_registry
from ..plan.timing import readiness_seconds
from ..plan.volume import default_throughput
from ..userdata.api_keys import METRICS_FILE as API_KEYS_METRICS_FILE
from .monitoring import (
    AGENT_CONFIG_TEMPLATE,
    AGENT_LOG_KINDS,
    NEURON_MONITOR_CONFIG,
    PUBLISHER,
    PUBLISHER_CONFIG,
    log_group_variable,
    render_agent_config,
    render_neuron_monitor_config,
    render_publisher_config,
)
from .router import render_router_config
from .templates import Unquoted, render

USER_DATA_LIMIT_BYTES = 16384
"""EC2 accepts at most 16 KB of user data, counted before base64 encoding."""

TOKEN_FILE = "/etc/neuron-serving/hf-token.env"
"""The root-only ``docker --env-file`` holding ``HF_TOKEN``, when a token secret is configured."""

SIGNAL_ID_LIMIT = 64
"""The longest unique id CloudFormation's SignalResource accepts (ResourceSignalUniqueId: 1 to 64
characters)."""

DEFAULT_PULL_ATTEMPTS = 5
"""Image pulls tried before the boot fails; the waits between them grow 10, 20, 40, 80 s."""

DOWNLOAD_ATTEMPTS = 5
"""Downloads of the checkpoint or of an export (Hugging Face Hub, S3) tried before the export step
gives up, each going on from the one before; the waits between them grow as the image pull's."""

HEREDOC_END = "EOF"
"""The terminator of the quoted heredocs that embed rendered files in the boot script."""

BIN = "/opt/neuron-serving/bin"
BOOT_STEPS = f"{BIN}/boot-steps"
"""The boot script's steps, which it sources from its compressed bundle (``userdata/boot-steps.sh.j2``)."""
EXPORT_MODEL = f"{BIN}/export-model"
CHECK_EXPORT = f"{BIN}/check-export"
RUN_REPLICA = f"{BIN}/run-replica"
WAIT_READY = f"{BIN}/wait-ready"
COMPLETE_LIFECYCLE = f"{BIN}/complete-lifecycle"
REPORT_PHASE = f"{BIN}/report-phase"
"""``report-phase PHASE [DETAIL]``: the phase as tags on the host's own instance (``userdata/report-phase.sh.j2``)."""
START_MONITORING = f"{BIN}/start-monitoring"
METRICS_UNIT = "neuron-serving-metrics"
API_KEYS = f"{BIN}/api-keys"
LOAD_API_KEYS = f"{BIN}/load-api-keys"
API_KEYS_UNIT = "neuron-serving-api-keys"
"""The oneshot service that runs ``api-keys sync``, and its timer's name."""
API_KEYS_SYNC_MINUTES = 2
"""A change to the API keys' secret reaches every host within about this: its timer runs the sync
a minute after the last run ended (``neuron-serving-api-keys.timer.j2``, OnUnitInactiveSec=60s)."""
REPLICA_UNIT = "neuron-replica"
"""The systemd template unit of the replicas: ``neuron-replica@N`` runs replica N."""
REPLICA_ENV = "/etc/neuron-serving/replica.env"
"""The ``docker --env-file`` lines every replica shares; each ``replica-N.env`` starts with them."""

MIN_HEARTBEAT_TIMEOUT_SECONDS = 30
MAX_HEARTBEAT_TIMEOUT_SECONDS = 7200
"""The bounds of a lifecycle hook's HeartbeatTimeout (Auto Scaling API reference, PutLifecycleHook)."""

_TOKEN_MARK = "${Token["
"""How aws-cdk-lib encodes an unresolved value in a string."""


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
        timeout = self.heartbeat_timeout_seconds
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not (
            MIN_HEARTBEAT_TIMEOUT_SECONDS <= timeout <= MAX_HEARTBEAT_TIMEOUT_SECONDS
        ):
            problems.add("warm_pool_hook.heartbeat_timeout_seconds", timeout,
                         f"must be an integer from {MIN_HEARTBEAT_TIMEOUT_SECONDS} to {MAX_HEARTBEAT_TIMEOUT_SECONDS} "
                         "(the PutLifecycleHook API's HeartbeatTimeout)")
        problems.raise_if_any()

    @property
    def heartbeat_interval_seconds(self) -> int:
        """How often the boot script records a heartbeat: four chances per timeout."""
        return self.heartbeat_timeout_seconds // 4


EXPORT_ROLES = ("serve", "wait", "build")
"""What a host does about the export: ``serve`` (download it from the cache, or make and publish it,
then serve), ``wait`` (never compile: wait for a builder's export in the cache, then serve) or
``build`` (make and publish it, serve nothing, then leave its Auto Scaling group)."""

WAIT_POLL_SECONDS = 30
"""How often a waiting host looks for the builder's export (one GetObject of a missing key)."""


@dataclass(frozen=True)
class BootOptions:
    """What the boot script needs beyond the serving plan.

    :param engine: the serving engine, a key of :data:`~neuron_serving.plan.engines.ENGINES`.
        Default: ``tgi``.
    :param image: the serving image, one of the engine's ``images`` (whose tools the script is
        written for), optionally pinned to a digest: ``<known image>@sha256:<64 lowercase hex
        digits>``, which the host then pulls and runs by that digest and which is part of the
        export key. The export runs inside it, so the compiler is the one the replicas run
        with. Default: the engine's first image, by its tag.
    :param hf_token_secret: name or ARN of a Secrets Manager secret whose plain-text value is a
        Hugging Face token, for gated models. Only this id is in the user data; the host reads
        the token at boot into a root-only file, which only the Hub download is given (never
        the compiler or a replica). The instance role must be allowed to read the secret.
        Default: no token (public models only).
    :param pull_attempts: how many times the image pull is tried before the boot fails.
        Default: 5 (about 2.5 minutes of waits).
    :param artifact_cache: an S3 URI prefix (``s3://bucket/prefix``; the bucket may be a CDK
        token) shared by hosts: a host downloads ``<prefix>/<export key>/`` when another one
        published it, else exports and publishes its export there. Needs s3:GetObject,
        s3:PutObject and s3:DeleteObject below the prefix and s3:ListBucket on it. Ignored with
        ``prebuilt_export``. Default: every host exports for itself.
    :param prebuilt_export: an export to serve instead of exporting: ``s3://bucket/prefix``
        (``aws s3 sync``) or ``hf://org/repo`` (a Hugging Face repository of a Neuron export,
        downloaded inside the serving image, with the token when one is configured). It must
        match the plan's shapes, degree and dtype and the image's compiler. Default: none.
    :param model_revision: the Hub revision (commit, branch or tag) of the model to export: the
        checkpoint is downloaded at it (optimum-cli has no revision option), and it is part of the
        export key. Default: none (the repository's default branch).
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
    :param api_keys_program: required with ``api_keys_secret``: the S3 URI of
        ``userdata/api_keys.py``, which the host downloads as ``/opt/neuron-serving/bin/api-keys``
        (the user data has no room for it); the instance role needs s3:GetObject on it.
    :param load_balancer_authentication: with ``api_keys_secret``, the router also accepts
        requests that the load balancer signed in (see ``render_router_config``). Default: false.
    :param metrics_publisher: required with monitoring: the S3 URI of the metrics publisher
        (``userdata/publish_metrics.py``), which the host downloads: at about 7 KB compressed it
        would not fit in the user data beside the rest. The bucket and key may be CDK tokens (a
        CDK asset's); the instance role needs s3:GetObject on it. Default: none.

    :param export_role: ``serve``, ``wait`` or ``build`` (:data:`EXPORT_ROLES`); ``wait`` and ``build``
        need ``artifact_cache``. Default: ``serve``.
    :param image_registry: a private ECR registry (and optional repository prefix) holding the image
        under its usual repository path and tag (:mod:`~neuron_serving.plan.registry`): the host
        logs docker in to it and pulls from it. Default: the image's own (public) registry.
    :param export_wait_minutes: with ``wait``, how long the host waits for the builder's export
        before its boot fails. Default: 12 hours (CloudFormation's longest wait for a signal).
    :param ready_seconds: with a signal or a warm pool hook, how long ``wait-ready`` waits for every
        replica to load its model and answer, then for the router, polling every 10 s (the
        environment variable ``NEURON_SERVING_READY_SECONDS`` overrides it on the host). With a
        warm pool hook it may not exceed the hook's heartbeat timeout: started from the pool, the
        host waits with no heartbeat. Default: ``plan.timing.readiness_seconds`` at the plan's
        default root volume throughput (``plan.volume.default_throughput``).

    Boot progress (see the module documentation) has no option of its own: it is on exactly when
    the host reads its instance metadata (:attr:`reports_phases`), that is with any option above
    that calls AWS (an S3 artifact cache or prebuilt export, API keys, a signal, a warm pool hook
    or monitoring). Such a host already has its region and instance id and an AWS role; one
    without calls no AWS API at all and needs no role, and it would gain one only to report. The
    instance role then needs ``ec2:CreateTags`` on the instance itself and for the three keys of
    :data:`~neuron_serving.plan.phases.PHASE_TAGS` only (``NeuronBootScript.grant_boot`` grants
    exactly that); without it the host logs each refused report and boots all the same.
    """

    engine: str = DEFAULT_ENGINE
    image: str | None = None
    hf_token_secret: str | None = None
    pull_attempts: int = DEFAULT_PULL_ATTEMPTS
    artifact_cache: str | None = None
    prebuilt_export: str | None = None
    model_revision: str | None = None
    signal: ReadinessSignal | None = None
    warm_pool_hook: WarmPoolHook | None = None
    monitoring: MonitoringOptions | None = None
    metrics_publisher: str | None = None
    api_keys_secret: str | None = None
    api_keys_program: str | None = None
    load_balancer_authentication: bool = False
    export_role: str = "serve"
    export_wait_minutes: int = 12 * 60
    image_registry: str | None = None
    ready_seconds: int | None = None

    @property
    def reports_phases(self) -> bool:
        """Whether the host reads its instance metadata, and so reports its boot's phases as tags
        on its instance (see the class documentation)."""
        s3 = (_s3_parts(self.prebuilt_export) is not None
              or (self.artifact_cache is not None and self.prebuilt_export is None))
        return (s3 or self.api_keys_secret is not None or self.signal is not None
                or self.warm_pool_hook is not None or self.monitoring is not None)

    def __post_init__(self) -> None:
        problems = Problems()
        if self.engine not in ENGINES:
            problems.add("engine", self.engine, f"must be one of {', '.join(ENGINES)}")
        if self.image is not None and (not isinstance(self.image, str) or not self.image or _has_space(self.image)):
            problems.add("image", self.image, "must be a non-empty image reference without spaces, or None")
        secret = self.hf_token_secret
        if secret is not None and (not isinstance(secret, str) or not secret or _has_space(secret)):
            problems.add("hf_token_secret", secret, "must be a secret name or ARN without spaces, or None")
        attempts = self.pull_attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            problems.add("pull_attempts", attempts, "must be an integer of at least 1")
        cache = self.artifact_cache
        if cache is not None and _s3_parts(cache) is None:
            problems.add("artifact_cache", cache, "must be an S3 URI prefix such as s3://bucket/exports, "
                         "without spaces, or None")
        prebuilt = self.prebuilt_export
        if prebuilt is not None and _s3_parts(prebuilt) is None and _hf_repo(prebuilt) is None:
            problems.add("prebuilt_export", prebuilt, "must be s3://bucket/prefix or hf://org/repo, "
                         "without spaces, or None")
        revision = self.model_revision
        if revision is not None and (not isinstance(revision, str) or not _REVISION.fullmatch(revision)):
            problems.add("model_revision", revision, "must be a Hub commit, branch or tag: letters, digits and "
                         "._/- only, at most 255 characters, or None")
        elif revision is not None and prebuilt is not None:
            problems.add("model_revision", revision, "does not apply to a prebuilt_export, which is served as is")
        if self.signal is not None and not isinstance(self.signal, ReadinessSignal):
            problems.add("signal", self.signal, "must be a ReadinessSignal or None")
        if self.warm_pool_hook is not None and not isinstance(self.warm_pool_hook, WarmPoolHook):
            problems.add("warm_pool_hook", self.warm_pool_hook, "must be a WarmPoolHook or None")
        monitoring = self.monitoring
        if monitoring is not None and not isinstance(monitoring, MonitoringOptions):
            problems.add("monitoring", monitoring, "must be a MonitoringOptions or None")
        elif monitoring is not None:
            if _TOKEN_MARK in monitoring.namespace:
                problems.add("monitoring.namespace", monitoring.namespace, "must be known at synth, not a CDK "
                             "token: it is in the publisher's config, in the compressed part of the user data")
            for kind, group in monitoring.log_groups.items():
                if _TOKEN_MARK not in group and not _LOG_GROUP.fullmatch(group):
                    problems.add(f"monitoring.log_groups[{kind!r}]", group, "must be a CloudWatch Logs group name: "
                                 "1 to 512 letters, digits and ._/#- (or a CDK token)")
        publisher = self.metrics_publisher
        if publisher is not None and monitoring is None:
            problems.add("metrics_publisher", publisher, "applies only with monitoring")
        elif publisher is None and monitoring is not None:
            problems.add("metrics_publisher", publisher, "is required with monitoring: the host downloads the "
                         "publisher, which does not fit in the user data")
        elif publisher is not None:
            _, key = _s3_parts(publisher) or (None, None)
            if not key:
                problems.add("metrics_publisher", publisher, "must be the S3 URI of an object, such as "
                             "s3://bucket/publish_metrics.py, without spaces, or None")
        keys, program = self.api_keys_secret, self.api_keys_program
        if keys is not None and (not isinstance(keys, str) or not keys or _has_space(keys)):
            problems.add("api_keys_secret", keys, "must be a secret name or ARN without spaces, or None")
        if (keys is None) != (program is None):
            problems.add("api_keys_program", program, "must be given with api_keys_secret, and only with it: the "
                         "host downloads the key sync from it")
        elif program is not None and not (_s3_parts(program) or (None, None))[1]:
            problems.add("api_keys_program", program, "must be the S3 URI of an object, such as s3://bucket/api_keys.py")
        if self.load_balancer_authentication and keys is None:
            problems.add("load_balancer_authentication", True, "applies only with api_keys_secret")
        if self.export_role not in EXPORT_ROLES:
            problems.add("export_role", self.export_role, f"must be one of {', '.join(EXPORT_ROLES)}")
        elif self.export_role != "serve" and (cache is None or prebuilt is not None):
            problems.add("export_role", self.export_role, "needs artifact_cache and no prebuilt_export: the "
                         "builder publishes the export there, and the serving hosts wait for it there")
        if self.export_role == "build" and (self.signal is not None or self.warm_pool_hook is not None):
            problems.add("export_role", self.export_role, "takes no signal or warm_pool_hook: a builder serves "
                         "nothing, and leaves its group once the export is in the cache")
        if self.image_registry is not None and (shape := ecr_registry_problem(str(self.image_registry))) is not None:
            problems.add("image_registry", self.image_registry, shape)
        wait = self.export_wait_minutes
        if not isinstance(wait, int) or isinstance(wait, bool) or wait < 1:
            problems.add("export_wait_minutes", wait, "must be a whole number of minutes, at least 1")
        ready = self.ready_seconds
        if ready is not None and (not isinstance(ready, int) or isinstance(ready, bool) or ready < 1):
            problems.add("ready_seconds", ready, "must be a whole number of seconds, at least 1, or None")
        problems.raise_if_any()


_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_LOG_GROUP = re.compile(r"[A-Za-z0-9._/#-]{1,512}")


def _has_space(text: str) -> bool:
    return any(c.isspace() for c in text)


def _check_word(problems: Problems, setting: str, value: object) -> None:
    if not isinstance(value, str) or not value or _has_space(value):
        problems.add(setting, value, "must be a non-empty name without spaces")


def _after_scheme(uri: object, scheme: str) -> str | None:
    if not isinstance(uri, str) or not uri.startswith(scheme) or _has_space(uri):
        return None
    return uri[len(scheme):].strip("/") or None


def _s3_parts(uri: object) -> tuple[str, str] | None:
    """``(bucket, prefix)`` of an ``s3://`` URI, the prefix without slashes at either end."""
    rest = _after_scheme(uri, "s3://")
    if rest is None:
        return None
    bucket, _, prefix = rest.partition("/")
    return bucket, prefix.strip("/")


def _hf_repo(uri: object) -> str | None:
    return _after_scheme(uri, "hf://")


def render_boot_script(plan: ServingPlan, options: BootOptions | None = None) -> str:
    """The user data for ``plan``: a bash script that checks the Neuron devices, installs what is
    missing, reads the Hugging Face token (when configured), pulls the image, exports the model
    once (or downloads it from the artifact cache or a prebuilt export), starts one
    ``neuron-replica@N`` unit per replica and the HAProxy router; with a signal or a warm pool hook,
    it then waits until every replica serves and reports that (see :class:`BootOptions`).

    :param plan: the validated serving layout.
    :param options: image, token secret, retries, export source, readiness reporting and
        monitoring. Default: ``BootOptions()``.

    The result is not checked against the user data limit: see :func:`check_user_data_size`.
    """
    options = options or BootOptions()
    if (options.prebuilt_export is None and options.export_role != "wait"
            and (cannot_compile := compile_memory_problem(plan)) is not None):
        raise ServingConfigError([cannot_compile])
    engine = find_engine(options.engine)
    image = serving_image(plan, options)
    key = engine.export_key(plan, image, options.model_revision)
    token_file = TOKEN_FILE if options.hf_token_secret is not None else None
    common_env, replica_table, named_settings = _replica_settings(plan, engine, image, f"{MODEL_MOUNT}/{key}")
    probe = engine.readiness(plan)
    prebuilt_s3 = _s3_parts(options.prebuilt_export)
    prebuilt_hf = _hf_repo(options.prebuilt_export) if prebuilt_s3 is None else None
    prebuilt = None
    if prebuilt_s3 is not None:
        bucket, prefix = prebuilt_s3
        # A trailing slash: sync lists exactly the prefix's objects, as its IAM grant expects.
        prebuilt = f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/"
    elif prebuilt_hf is not None:
        prebuilt = f"hf://{prebuilt_hf}"
    cache = _s3_parts(options.artifact_cache) if prebuilt is None else None
    signal, hook, monitoring = options.signal, options.warm_pool_hook, options.monitoring
    s3 = cache is not None or prebuilt_s3 is not None
    api_keys = options.api_keys_secret is not None
    report = options.reports_phases
    report_phase = REPORT_PHASE if report else None
    log_groups = monitoring.log_groups if monitoring else {}
    # Values that may be deploy-time tokens go to stack.env, which the boot script writes as is;
    # everything else is bundled and compressed at synth.
    registry = parse_registry(options.image_registry) if options.image_registry else None
    stack_env: dict[str, str | None] = {
        "IMAGE": registry.reference(image.reference) if registry else image.reference,
        "HF_TOKEN_SECRET": options.hf_token_secret,
        "PREBUILT": prebuilt,
        "CACHE_BUCKET": cache[0] if cache else None,
        "CACHE_PREFIX": (f"{cache[1]}/" if cache[1] else "") if cache else None,
        "GROUP_NAME": hook.group_name if hook else None,
        "HOOK_NAME": hook.hook_name if hook else None,
        "SERVICE": monitoring.service if monitoring else None,
        # For api-keys sync's failure metric; the publisher has its namespace in its config.
        "METRICS_NAMESPACE": monitoring.namespace if monitoring and api_keys else None,
        **{log_group_variable(kind): log_groups.get(kind) for kind in LOG_KINDS},
        "PUBLISHER": options.metrics_publisher,
        "API_KEYS_SECRET": options.api_keys_secret,
        "API_KEYS_PROGRAM": options.api_keys_program,
    }
    files = {
        EXPORT_MODEL: _rendered(
            "export-model.sh.j2",
            key=key,
            replica_devices=plan.devices_per_replica,
            token_file=token_file,
            mount=MODEL_MOUNT,
            hub_cli=image.hub_cli,
            model=plan.model_id,
            revision=options.model_revision,
            checkpoint_files=CHECKPOINT_FILES,
            checkpoint_excluded=CHECKPOINT_EXCLUDED,
            export_args=Unquoted(_export_words(engine, plan, image, key)),
            engine=engine.title,
            aws=s3,
            prebuilt=prebuilt,
            prebuilt_s3=prebuilt_s3,
            cache_bucket=cache[0] if cache else None,
            report_phase=report_phase,
            download_export=_phase("download-export"),
            export_model=_phase("export-model"),
            wait_export=_phase("wait-export"),
            role=options.export_role,
            wait_seconds=options.export_wait_minutes * 60,
            poll_seconds=WAIT_POLL_SECONDS,
            download_attempts=DOWNLOAD_ATTEMPTS,
        ),
        CHECK_EXPORT: _rendered("check-export.py.j2",
                                expect=json.dumps(engine.export_expectations(plan, image), sort_keys=True)),
        RUN_REPLICA: _rendered(
            "run-replica.sh.j2",
            key=key,
            mount=MODEL_MOUNT,
            container_port=engine.container_port,
            engine=engine.title,
            monitoring=monitoring is not None,
        ),
        f"/etc/systemd/system/{REPLICA_UNIT}@.service": _rendered(
            "neuron-replica@.service.j2", engine=engine.title, ready_unit=hook is not None),
        REPLICA_ENV: common_env,
        "/etc/neuron-serving/replicas.table": replica_table,
        "/etc/haproxy/haproxy.cfg.new": _without_comments(render_router_config(
            plan, engine, api_keys=api_keys, load_balancer_authentication=options.load_balancer_authentication)),
    }
    if api_keys:
        files[LOAD_API_KEYS] = _rendered("load-api-keys.sh.j2", program=API_KEYS)
        for kind in ("service", "timer"):
            files[f"/etc/systemd/system/{API_KEYS_UNIT}.{kind}"] = _rendered(
                f"{API_KEYS_UNIT}.{kind}.j2", program=API_KEYS, unit=API_KEYS_UNIT,
                metrics_file=API_KEYS_METRICS_FILE if monitoring is not None else None)
    if signal is not None or hook is not None:
        files[WAIT_READY] = _rendered("wait-ready.sh.j2", seconds=_ready_seconds(plan, options),
                                      router_port=plan.router_port,
                                      health_path=engine.health_path, probe_path=probe.path, probe_body=probe.body,
                                      report_phase=REPORT_PHASE, wait_ready=_phase("wait-ready"), ready=READY,
                                      failed=FAILED)
    if report:
        files[REPORT_PHASE] = _rendered("report-phase.sh.j2", limit=TAG_VALUE_LIMIT,
                                        phase_tag=PHASE_TAG, since_tag=SINCE_TAG, detail_tag=DETAIL_TAG)
    if hook is not None:
        files[COMPLETE_LIFECYCLE] = _rendered("complete-lifecycle.sh.j2")
        files["/etc/systemd/system/neuron-serving-ready.service"] = _rendered("neuron-serving-ready.service.j2")
    if monitoring is not None:
        files.update(_monitoring_files(plan, engine, monitoring, api_keys=api_keys))
    # The steps are bundled (compressed), so they hold no deploy-time value: those are in stack.env.
    steps = dict(
        devices=plan.instance.devices,
        instance_type=plan.instance.name,
        hf_token_secret=options.hf_token_secret is not None,
        token_file=TOKEN_FILE,
        replica_unit=REPLICA_UNIT,
        replica_env=REPLICA_ENV,
        driver_below=image.driver_below,
        runtime=image.neuron_runtime,
        pull_attempts=options.pull_attempts,
        conditional_write=cache is not None and options.export_role != "wait",
        named_settings=named_settings,
        replicas=_replicas(plan),
        router_port=plan.router_port,
        metadata=report,
        report=report,
        warmed=WARMED,
        api_keys=api_keys,
        load_api_keys=LOAD_API_KEYS,
        api_keys_unit=API_KEYS_UNIT,
        signal=signal,
        hook=hook,
        heartbeat_seconds=hook.heartbeat_interval_seconds if hook else None,
        wait_ready=files.get(WAIT_READY),
        monitoring=monitoring is not None,
        start_monitoring=START_MONITORING,
        builder=options.export_role == "build",
        registry=registry,
        signal_id_limit=SIGNAL_ID_LIMIT,
        failed=FAILED,
        export_model=EXPORT_MODEL,
    )
    files[BOOT_STEPS] = _rendered("boot-steps.sh.j2", **steps)
    script = render(
        "bootstrap.sh.j2",
        description=Unquoted(_describe(plan)),
        stack_env=Unquoted("".join(f"{k}={shlex.quote(v)}\n" for k, v in stack_env.items() if v is not None)),
        bundle=Unquoted(packed(bundle(files))),
        boot_steps=BOOT_STEPS,
    )
    return _without_comments(script, keep_header=True)


def _ready_seconds(plan: ServingPlan, options: BootOptions) -> int:
    """``wait-ready``'s limit: the options', else the plan's at its default root volume throughput.
    A host started from the warm pool waits that long with no heartbeat, so a hook's heartbeat
    timeout must cover it."""
    seconds = options.ready_seconds or readiness_seconds(plan, default_throughput(plan))
    hook = options.warm_pool_hook
    if hook is not None and seconds > hook.heartbeat_timeout_seconds:
        raise ServingConfigError([problem(
            "warm_pool_hook.heartbeat_timeout_seconds", hook.heartbeat_timeout_seconds,
            f"must be at least wait-ready's limit ({seconds} s for {plan.model.name}): a host started from the "
            "warm pool waits that long for its replicas without a heartbeat (a faster root volume, "
            "root_volume_throughput, shortens the limit)")])
    return seconds


def _phase(name: str) -> str:
    """``name``, a phase of :data:`~neuron_serving.plan.phases.PHASES` that a script reports."""
    if name not in PHASE_NAMES:
        raise ValueError(f"{name!r} is no phase of neuron_serving.plan.phases.PHASES")
    return name


def serving_image(plan: ServingPlan, options: BootOptions) -> ServingImage:
    """The image ``options`` name (or their engine's default), which must export and serve
    ``plan``'s model. Raises :class:`ServingConfigError` naming ``engine``, ``image`` or
    ``model_id``."""
    engine = find_engine(options.engine)
    return engine.serving_image(plan, options.image or engine.default_image.reference)


def _export_words(engine: Engine, plan: ServingPlan, image: ServingImage, key: str) -> str:
    """The engine's export arguments as shell words for ``export-model``, whose ``$key`` names the
    export: the checkpoint directory and the output as ``"/models/$key.src"`` and ``.tmp``."""
    paths = {f"{MODEL_MOUNT}/{key}{suffix}": f'"{MODEL_MOUNT}/$key{suffix}"' for suffix in (".src", ".tmp")}
    words = engine.export_arguments(plan, image, *paths)
    return " ".join(paths.get(word) or shlex.quote(word) for word in words)


def _monitoring_files(plan: ServingPlan, engine: Engine, monitoring: MonitoringOptions, *,
                      api_keys: bool) -> dict[str, str]:
    return {
        START_MONITORING: _rendered(
            "start-monitoring.sh.j2",
            log_group_variables=[log_group_variable(kind) for kind in AGENT_LOG_KINDS],
            agent_key_fingerprint=monitoring.agent_key_fingerprint,
            publisher=PUBLISHER,
            unit=METRICS_UNIT,
        ),
        f"/etc/systemd/system/{METRICS_UNIT}.service": _rendered(
            "neuron-serving-metrics.service.j2",
            stack_env="/etc/neuron-serving/stack.env",
            host_env="/etc/neuron-serving/host.env",
            publisher=PUBLISHER,
            config=PUBLISHER_CONFIG,
        ),
        f"/etc/logrotate.d/{METRICS_UNIT}": _rendered(
            "neuron-serving-metrics.logrotate.j2", emf_logs=[EMF_LOG, *([API_KEYS_METRICS_FILE] if api_keys else [])]),
        PUBLISHER_CONFIG: render_publisher_config(plan, engine, monitoring),
        NEURON_MONITOR_CONFIG: render_neuron_monitor_config(plan),
        AGENT_CONFIG_TEMPLATE: render_agent_config(api_keys=api_keys),
    }


def check_user_data_size(script: str, plan: ServingPlan) -> None:
    """Raise a ``ValueError`` when ``script`` is larger than EC2 accepts as user data.

    :param script: the rendered boot script.
    :param plan: the plan it was rendered for, named in the message.
    """
    size = len(script.encode("utf-8"))
    if size > USER_DATA_LIMIT_BYTES:
        raise ServingConfigError(
            [
                f"the boot script for {_configuration(plan)} is {size} bytes, over the EC2 user data "
                f"limit of {USER_DATA_LIMIT_BYTES} bytes; a larger tensor_parallel (fewer replicas), "
                "a shorter model_id or a shorter image name makes it smaller"
            ]
        )


def _configuration(plan: ServingPlan) -> str:
    return (
        f"{plan.model_id} on {plan.instance.name} ({_replicas(plan)} of tensor_parallel "
        f"{plan.degree}, batch_size {plan.batch_size}, sequence_length {plan.sequence_length})"
    )


def _replicas(plan: ServingPlan) -> str:
    count = len(plan.replicas)
    return f"{count} replica" if count == 1 else f"{count} replicas"


def _describe(plan: ServingPlan) -> str:
    # A comment line of the script: no line break may end it early. The image is in the script.
    return " ".join(f"{_configuration(plan)}, {plan.dtype}".split())


def _replica_settings(plan: ServingPlan, engine: Engine, image: ServingImage,
                      model_dir: str) -> tuple[str, str, list[str]]:
    """The ``docker --env-file`` lines all replicas share, the table the boot script turns into
    per-replica files (``index port devices KEY=value...`` with the settings that differ), and
    the settings whose value is the replica's name (``replica-<index>``), which the boot script
    writes itself rather than carry them in every row.

    A setting differs when it does for another replica index, so the split does not depend on
    how many replicas the plan has.
    """
    replicas = [*plan.replicas, Replica(index=len(plan.replicas), devices=(), port=0)]
    envs = [engine.replica_environment(plan, image, r, model_dir) for r in replicas]
    own = [k for k, v in envs[0].items() if any(e.get(k) != v for e in envs)]
    # The boot script names each replica's files replica-<index>, as Replica.name does.
    named = [k for k in own
             if all(e.get(k) == r.name == f"replica-{r.index}" for r, e in zip(replicas, envs, strict=True))]
    envs.pop()
    problems = Problems()
    for env in envs:
        for k, v in env.items():
            if "\n" in v or "\r" in v:
                problems.add(f"replica setting {k}", v, "must fit on one line of a docker env file")
            elif k in own and (_has_space(v) or not v):
                problems.add(f"replica setting {k}", v, "must be one word: it differs between replicas")
    problems.raise_if_any()
    common = "".join(f"{k}={v}\n" for k, v in envs[0].items() if k not in own)
    rows = "".join(
        " ".join([str(r.index), str(r.port), ",".join(map(str, r.devices)),
                  *(f"{k}={env[k]}" for k in own if k not in named)])
        + "\n"
        for r, env in zip(plan.replicas, envs, strict=True)
    )
    return common, rows, named


def _rendered(template: str, **context: object) -> str:
    return _without_comments(render(template, **context))


def _without_comments(text: str, *, keep_header: bool = False) -> str:
    """``text`` without its whole-line ``#`` comments, but with its ``#!`` line, shellcheck
    directives and, with ``keep_header``, the comment lines it starts with.

    The templates explain every step, and the router's is two thirds comments: kept, comments
    would take a third of the 16 KB of user data. On the host, the scripts and configs
    themselves are what bash, systemd, HAProxy and an operator need; the boot script's header
    names the templates.
    """
    lines = text.splitlines()
    header = 0
    while keep_header and header < len(lines) and lines[header].startswith("#"):
        header += 1
    return "".join(
        f"{line}\n" for n, line in enumerate(lines)
        if n < header or not line.lstrip().startswith("#") or line.startswith(("#!", "# shellcheck "))
    )


def packed(text: str) -> str:
    """``text`` LZMA-compressed and base85-encoded on one line, which the host's ``python3`` unpacks
    (:func:`unpacked`; userdata/bootstrap.sh.j2). Against gzip and base64 lines, 12% of the user
    data of the largest configurations: LZMA's ``.lzma`` format (its 13-byte header) compresses
    these files 7% smaller than gzip -9, base85 carries 4 bytes in 5 characters where base64 needs
    5.3, and one line has no line breaks. Base85's alphabet (RFC 1924) has no ``[``, so the text can
    hold no CDK token, and no quote or backslash, which JSON would escape in the template."""
    compressed = lzma.compress(text.encode(), format=lzma.FORMAT_ALONE, preset=9 | lzma.PRESET_EXTREME)
    return base64.b85encode(compressed).decode() + "\n"


def unpacked(blob: str) -> str:
    """The text :func:`packed` packed: what the boot script's ``python3`` line computes."""
    return lzma.decompress(base64.b85decode(blob.strip())).decode()


def bundle(files: dict[str, str]) -> str:
    """``files`` (host path to content) as the ``put PATH MODE`` commands with quoted heredocs that
    the boot script evaluates: executables (``#!``) get mode 755, the rest 644.

    The bundle is compressed at synth, so no file may hold a deploy-time value: those reach the
    host through ``stack.env``. A CDK token (``${Token[...]}``, as aws-cdk-lib encodes them in
    strings) is therefore refused here, as is any text a quoted heredoc cannot carry.
    """
    commands = []
    for path, text in files.items():
        if not text.endswith("\n") or HEREDOC_END in text.splitlines():
            raise ServingConfigError(
                [problem(path, text[:60] + "...",
                         f"cannot be embedded in a heredoc: it must end with a line break and have no "
                         f"line '{HEREDOC_END}'")]
            )
        if _TOKEN_MARK in text:
            raise ServingConfigError(
                [problem(path, text[:60] + "...", "cannot hold a deploy-time value (a CDK token); "
                         "the boot script passes those in stack.env")]
            )
        mode = 755 if text.startswith("#!") else 644
        commands.append(f"put {path} {mode} <<'{HEREDOC_END}'\n{text}{HEREDOC_END}\n")
    return "".join(commands)
