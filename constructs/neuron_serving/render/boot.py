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
- when the host reads its instance metadata (:func:`~neuron_serving.render.boot_options.reports_phases`),
  ``/opt/neuron-serving/bin/report-phase``, which tags the instance with the boot's phase
  (``userdata/report-phase.sh.j2``; see **Boot progress** below); on a host that also publishes its export
  (:func:`~neuron_serving.render.boot_options.publishes`), ``/opt/neuron-serving/bin/report-publish``
  (``userdata/report-publish.sh.j2``; see **Artifact cache** below);
- with monitoring, ``/opt/neuron-serving/bin/start-monitoring`` (``userdata/start-monitoring.sh.j2``),
  which installs the CloudWatch agent when missing (only once AWS's signature of the package
  verifies, by the key ``MonitoringOptions.agent_key_fingerprint`` pins) and configures it, the
  metrics publisher ``/opt/neuron-serving/bin/publish-metrics`` (``userdata/publish_metrics.py``)
  and its unit ``neuron-serving-metrics.service`` (``userdata/neuron-serving-metrics.service.j2``), and
  ``/etc/logrotate.d/neuron-serving-metrics``; see :mod:`~neuron_serving.render.monitoring`;
- with interruptions, ``/opt/neuron-serving/bin/watch-interruption`` and its unit
  ``neuron-serving-interruption.service`` (``userdata/watch_interruption.py``,
  ``userdata/neuron-serving-interruption.service.j2``), and the router's drain pattern file
  ``/etc/haproxy/draining.acl``, which holds no pattern (see **Spot interruptions** below);
- ``/etc/neuron-serving/``: ``stack.env`` (values from the stack; ``bundle.env`` holds those
  known at synth), ``replica.env`` (the
  engine's settings all replicas share), ``replicas.table`` (what differs per replica),
  ``replica-N.conf`` (devices, port,
  env file), ``replica-N.env`` (``docker --env-file``), ``hf-token.env`` (mode 0600, only with
  a token secret), ``host.env`` (region and instance id from IMDSv2, when AWS is called), and
  with monitoring ``metrics.json``, ``neuron-monitor.json`` and ``cloudwatch-agent.json``;
- ``/var/lib/neuron-serving/exports/<export key>/`` with its completion marker;
- ``/etc/haproxy/haproxy.cfg``: the router (:func:`~neuron_serving.render.router.render_router_config`);
- ``/var/log/neuron-serving/``: ``boot.log``, ``export.log``, ``ready.log``, ``status`` (the
  step reached) and, when it reports phases, ``phases.tsv`` (see **Boot times** below).

The files travel as the boot bundle (:mod:`~neuron_serving.render.bundle`): a CDK asset the
user data downloads from S3 and installs only when its manifest's SHA-256 is the one the user data
carries and every file matches the manifest (:meth:`HostBoot.user_data`). The bundle is made at
synth, so it cannot hold deploy-time values (CDK tokens such as the cache bucket's name); the user
data does not hold them either. As aws-cdk-lib's ``CloudFormationInit`` does, the stack keeps them
in the CloudFormation metadata of the host's resource (its launch template, :meth:`HostBoot.metadata`),
and the user data reads them with ``DescribeStackResource`` into ``/etc/neuron-serving/stack.env``.
So the user data is the same short script (about 2 KB) whatever the features: where the values are,
the target of its FAILURE signal, and the bundle's place and checksum, which stay with the launch
template version a host was launched from (a host launched from an older one while the stack updates
reads the current metadata, but its own bundle). The
boot's steps add the stack's values known at synth (image, cache prefix, prebuilt export, lifecycle
hook), which come as the bundle's ``bundle.env``, and the files source the whole. The options and
their checks are in :mod:`~neuron_serving.render.boot_options`.

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
so whoever alters a published upload makes other hosts export, never serve its files. A host that
exported says what became of its publish in its tag :data:`~neuron_serving.plan.phases.PUBLISH_TAG`
(``published``, ``another host published first``, or ``failed: <the AWS CLI's error>``), which
``neuron-serving status`` shows, and with monitoring puts
:data:`~neuron_serving.plan.metrics.EXPORT_PUBLISH_FAILURES` = 1 when it failed (``report-publish``):
it still serves its own export and signals SUCCESS, but each host after it compiles again. A builder
whose publish failed fails its boot, naming the error. Files are
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
:data:`~neuron_serving.plan.phases.PHASES` it enters as tags on its own instance
(:mod:`~neuron_serving.plan.phases`), with one CreateTags call per phase: every step's name as it
starts; ``download-export`` instead of ``export-model`` once ``export-model`` knows it downloads (a
prebuilt export, or the artifact cache's), and ``export-model`` again, with the reason, when it
refuses the download; when it exports, ``download-checkpoint`` while the checkpoint downloads, then
``export-model`` again (``compiling``) while the compiler runs; ``wait-ready`` with ``<n> of <N>
ready`` as each replica serves; ``ready`` once ``wait-ready`` passes, on the first boot and after
every start of a warm pool's host (``neuron-serving-ready.service``); ``warmed`` once prepared for
the warm pool; ``failed`` with ``<step>: <reason>`` when a step, or the ready service's
``wait-ready``, fails. Without a signal or a hook nothing checks that the replicas serve, so such a
host ends in ``router`` with ``boot complete: readiness not checked``, never ``ready``. Reporting
never fails a boot: a refused call is logged and the boot goes on. The phases before the AWS CLI is
installed (``check-devices``, ``install-tools``) are reported only on images that have it, and
``metadata`` never is (``host.env`` does not exist yet).

**Boot times.** ``report-phase`` also ends the phase before the one it reports (``ready``,
``failed`` and ``warmed`` end a boot and start none): it appends the phase, its start and end and
its seconds, by ``/proc/uptime``, to ``/var/log/neuron-serving/phases.tsv``
(:data:`~neuron_serving.plan.phases.PHASES_FILE`), and each report's tags carry every finished
phase's seconds (:data:`~neuron_serving.plan.phases.SECONDS_TAG`), which ``neuron-serving status``
shows beside the estimates. A phase that ends a boot, or ``report-phase --end`` at the end of a boot
that reaches none (a builder's, or one that checks no readiness), then puts the phases finished
since the last such report, with monitoring, as the CloudWatch metric
:data:`~neuron_serving.plan.phases.BOOT_PHASE_METRIC` (``Service``, ``Phase``), by PutMetricData:
before the group stops a warm pool's host, and again for ``wait-ready`` after its start. A metric
that cannot be put is logged; it never fails the boot.

**Spot interruptions.** With ``BootOptions.interruptions`` (``NeuronLlamaStack`` sets it for a fleet
with ``spot_percent`` above 0, with a ``termination_hook``), ``neuron-serving-interruption.service``
starts once the router serves (and at every later start) and asks the instance metadata (IMDSv2, its
token renewed before it expires) every second for ``spot/instance-action`` (Amazon EC2 user guide,
"Spot Instance interruption notices": the action and its time, about two minutes ahead), with a
termination hook for ``autoscaling/target-lifecycle-state`` (``Terminated`` once the group terminates
the host: Amazon EC2 Auto Scaling user guide, "Retrieve the target lifecycle state through instance
metadata"), and for ``events/recommendations/rebalance`` (Amazon EC2 user guide, "EC2 instance
rebalance recommendations"), which it only logs: the group's Capacity Rebalancing launches a
replacement first and then terminates the host through its termination lifecycle. On the first Spot
notice or termination it drains the host, each step logged to ``/var/log/neuron-serving/interruption.log``
and none stopping the next when it fails: the router's ``/health`` answers 503 from then on, so the load
balancer sends it nothing new, while every request in flight or still arriving is served (``add acl``
of the pattern ``draining`` to the running router's copy of ``/etc/haproxy/draining.acl`` on its
runtime socket, at level user: no reload, no connection closed; ``userdata/haproxy.cfg.j2`` says why
this and not ``set var`` or a server's drain state); it reports the phase ``draining``
(:data:`~neuron_serving.plan.phases.DRAINING`); on a Spot notice it asks its Auto Scaling group to replace
it now (``TerminateInstanceInAutoScalingGroup`` without decrementing the desired capacity); then it waits
until the router has no request at a replica or in its queue, or until 10 s before the notice's time
(the hook's heartbeat timeout, after a termination), and logs what was still in flight when it gave
up; with a termination hook it then completes the lifecycle action with CONTINUE (asked again every 5 s
while none is pending yet: the group calls the hook once the load balancer has deregistered the host).
It then exits, and is not started again until the next start of the host. The drain lives in the
running router only: a restart of HAProxy ends it (the file on disk holds no pattern, so a host that
starts again serves). Passing the health check within 2 s of the notice takes the watcher's 1 s poll
and one runtime API command (tests/router, tests/twin).

**Monitoring.** With :class:`~neuron_serving.plan.metrics.MonitoringOptions`, a step right
after the tools are installed starts the CloudWatch agent, which ships the boot's logs, the
router's log and the publisher's EMF file, and the metrics publisher; docker's awslogs driver
ships each replica's output. A failure there is logged as a warning and the boot goes on.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from ..plan.engines import (
    DRAFT_DIR,
    DRAFT_FILES,
    MODEL_MOUNT,
    Engine,
    ServingImage,
)
from ..plan.errors import Problems, ServingConfigError, problem
from ..plan.host import FIRST_PULL_WAIT_SECONDS, PUBLIC_HUB_CACHE, HostSpec, has_space, hf_repo, s3_parts
from ..plan.layout import Replica, ServingPlan, compile_memory_problem
from ..plan.metrics import EMF_LOG, EXPORT_PUBLISH_FAILURES, INSTANCE, LOG_KINDS, SERVICE, MonitoringOptions
from ..plan.phases import (
    BOOT_PHASE_METRIC,
    DETAIL_TAG,
    DRAINING,
    ENDS,
    FAILED,
    PHASE_DIMENSION,
    PHASE_NAMES,
    PHASE_TAG,
    PHASES_FILE,
    PUBLISH_FAILED,
    PUBLISH_RACED,
    PUBLISH_TAG,
    PUBLISHED,
    READY,
    SECONDS_TAG,
    SINCE_TAG,
    TAG_VALUE_LIMIT,
    WARMED,
)
from ..plan.timing import readiness_seconds
from ..plan.transfer import AWS_CLI_CONFIG, HUB_DOWNLOAD_WORKERS, aws_cli_config
from ..plan.volume import default_throughput
from ..userdata.api_keys import METRICS_FILE as API_KEYS_METRICS_FILE
from ..userdata.watch_interruption import DRAIN_FILE, DRAIN_FILE_TEXT
from .boot_options import WAIT_POLL_SECONDS, BootOptions, check_boot, publishes, reports_phases
from .bundle import TOKEN_MARK, digest
from .monitoring import (
    AGENT_CONFIG_TEMPLATE,
    AGENT_LOG_KINDS,
    NEURON_MONITOR_CONFIG,
    PUBLISHER,
    PUBLISHER_CONFIG,
    PUBLISHER_SOURCE,
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

DOWNLOAD_ATTEMPTS = 5
"""Downloads of the checkpoint or of an export (Hugging Face Hub, S3) tried before the export step
gives up, each going on from the one before; the waits between them grow as the image pull's."""

BIN = "/opt/neuron-serving/bin"
BOOT_STEPS = f"{BIN}/boot-steps"
"""The boot script's steps, which it sources from its bundle (``userdata/boot-steps.sh.j2``, which puts
together one fragment of ``userdata/boot/`` per step)."""
EXPORT_MODEL = f"{BIN}/export-model"
CHECK_EXPORT = f"{BIN}/check-export"
RUN_REPLICA = f"{BIN}/run-replica"
WAIT_READY = f"{BIN}/wait-ready"
COMPLETE_LIFECYCLE = f"{BIN}/complete-lifecycle"
REPORT_PHASE = f"{BIN}/report-phase"
"""``report-phase PHASE [DETAIL]``: the phase as tags on the host's own instance (``userdata/report-phase.sh.j2``)."""
REPORT_PUBLISH = f"{BIN}/report-publish"
"""``report-publish OUTCOME [REASON]``: what became of the export's publish to the artifact cache, as a tag on
the host's own instance and, when it failed, a metric (``userdata/report-publish.sh.j2``)."""
START_MONITORING = f"{BIN}/start-monitoring"
METRICS_UNIT = "neuron-serving-metrics"
API_KEYS = f"{BIN}/api-keys"
API_KEYS_SOURCE = "api_keys.py"
"""The key sync's file in ``neuron_serving.userdata``, installed as :data:`API_KEYS`."""
LOAD_API_KEYS = f"{BIN}/load-api-keys"
API_KEYS_UNIT = "neuron-serving-api-keys"
"""The oneshot service that runs ``api-keys sync``, and its timer's name."""
API_KEYS_SYNC_MINUTES = 2
"""A change to the API keys' secret reaches every host within about this: its timer runs the sync
a minute after the last run ended (``neuron-serving-api-keys.timer.j2``, OnUnitInactiveSec=60s)."""
EAGLE_DRAFT = f"{BIN}/eagle-draft"
EAGLE_DRAFT_SOURCE = "eagle-draft.py"
"""The EAGLE draft's conversion in ``neuron_serving.userdata``, installed as :data:`EAGLE_DRAFT` on a host
that exports with ``speculative_model``, and run by ``export-model`` inside the serving image."""
WATCH_INTERRUPTION = f"{BIN}/watch-interruption"
WATCH_INTERRUPTION_SOURCE = "watch_interruption.py"
"""The Spot interruption watcher's file in ``neuron_serving.userdata``, installed as :data:`WATCH_INTERRUPTION`."""
INTERRUPTION_UNIT = "neuron-serving-interruption"
"""The service that runs :data:`WATCH_INTERRUPTION`, with interruptions."""
INTERRUPTION_LOG = "/var/log/neuron-serving/interruption.log"
REPLICA_UNIT = "neuron-replica"
"""The systemd template unit of the replicas: ``neuron-replica@N`` runs replica N."""
REPLICA_ENV = "/etc/neuron-serving/replica.env"
"""The ``docker --env-file`` lines every replica shares; each ``replica-N.env`` starts with them."""
BUNDLE_ENV = "/etc/neuron-serving/bundle.env"
"""The stack's values known at synth, which the boot's steps add to stack.env."""
BOOTSTRAP_ENV = ("SIGNAL_RESOURCE",)
"""What the boot script reads before it has the stack's values, besides where they are: the
resource its FAILURE signal goes to (in the stack whose values it reads). In the user data."""
METADATA_KEY = "NeuronServing"
"""The key of the host resource's CloudFormation metadata that holds the stack's deploy-time values
(``{"NeuronServing": "<stack.env lines>"}``), which the boot script reads with DescribeStackResource
(:meth:`HostBoot.metadata`)."""


LAYOUTS = "/etc/neuron-serving/layouts"
"""Where a fleet of several instance types keeps each type's own files in its bundle:
``<LAYOUTS>/<instance type>/<host path>`` (:func:`render_fleet_boot`)."""


def render_fleet_boot(plans: Sequence[ServingPlan], spec: HostSpec, options: BootOptions | None = None) -> HostBoot:
    r"""The boot of a host that may be any of ``plans``' instance types: the same layout on each
    (:func:`~neuron_serving.plan.layout.fleet_layouts`, the first being the plan ``spec`` was resolved for), so
    the same export, with each type's own replicas, router, readiness count and metrics.

    Each type's boot is rendered at synth (:func:`render_boot_script`); the bundle holds once the files all
    types share, and the others below ``<LAYOUTS>/<type>``. Its boot's steps are then a selector
    (``userdata/select-layout.sh.j2``) that reads the host's instance type from the instance metadata and
    runs that type's steps, which put that type's files in their places; a host of a type the fleet has no
    layout for fails its boot, naming its type and the fleet's. One type is :func:`render_boot_script`'s
    boot itself."""
    if not plans:
        raise ValueError("render_fleet_boot needs at least one plan")
    if len(plans) == 1:
        return render_boot_script(plans[0], spec, options)
    boots = {plan.instance.name: _render(plan, spec, options, in_fleet=True) for plan in plans}
    first = boots[plans[0].instance.name]
    if any(b.deploy_env != first.deploy_env or b.bootstrap_env != first.bootstrap_env for b in boots.values()):
        raise ValueError("the layouts of a fleet must share the stack's values")
    paths = {path for boot in boots.values() for path in boot.files}
    shared = {path for path in paths if len({boot.files.get(path) for boot in boots.values()}) == 1}
    files = {path: first.files[path] for path in sorted(shared)}
    for name, boot in boots.items():
        files.update({f"{LAYOUTS}/{name}{path}": text for path, text in boot.files.items() if path not in shared})
    files[BOOT_STEPS] = render("select-layout.sh.j2", layouts=LAYOUTS, boot_steps=BOOT_STEPS,
                               types=" ".join(boots)) + "\n"
    return HostBoot(files=files, deploy_env=first.deploy_env, bootstrap_env=first.bootstrap_env)


def render_boot_script(plan: ServingPlan, spec: HostSpec, options: BootOptions | None = None) -> HostBoot:
    """The user data for ``plan``: a bash script that checks the Neuron devices, installs what is
    missing, reads the Hugging Face token (when configured), pulls the image, exports the model
    once (or downloads it from the artifact cache or a prebuilt export), starts one
    ``neuron-replica@N`` unit per replica and the HAProxy router; with a signal or a warm pool hook,
    it then waits until every replica serves and reports that (see :class:`BootOptions`).

    :param plan: the validated serving layout.
    :param spec: the host's engine, image, registry and export, resolved for ``plan``
        (:func:`~neuron_serving.plan.host.resolve_host`).
    :param options: what the stack supplies: the token secret, the cache, readiness reporting,
        monitoring and API keys. Default: ``BootOptions()``.

    The result is not checked against the user data limit: see :func:`check_user_data_size`.
    """
    return _render(plan, spec, options, in_fleet=False)


def _render(plan: ServingPlan, spec: HostSpec, options: BootOptions | None, *, in_fleet: bool) -> HostBoot:
    """:func:`render_boot_script`; ``in_fleet``: one of a fleet's layouts (:func:`render_fleet_boot`), whose
    steps install their own type's files from :data:`LAYOUTS`."""
    options = options or BootOptions()
    check_boot(spec, options)
    if (spec.exports and spec.export_role != "wait"
            and (cannot_compile := compile_memory_problem(plan)) is not None):
        raise ServingConfigError([cannot_compile])
    engine, image = spec.engine, spec.image
    key = engine.export_key(plan, image, spec.model_revision)
    token_file = TOKEN_FILE if options.hf_token_secret is not None else None
    common_env, replica_table, named_settings = _replica_settings(plan, engine, image, f"{MODEL_MOUNT}/{key}")
    probe = engine.readiness(plan)
    prebuilt_s3 = s3_parts(spec.prebuilt_export)
    prebuilt_hf = hf_repo(spec.prebuilt_export) if prebuilt_s3 is None else None
    prebuilt = None
    if prebuilt_s3 is not None:
        bucket, prefix = prebuilt_s3
        # A trailing slash: sync lists exactly the prefix's objects, as its IAM grant expects.
        prebuilt = f"s3://{bucket}/{prefix}/" if prefix else f"s3://{bucket}/"
    elif prebuilt_hf is not None:
        prebuilt = f"hf://{prebuilt_hf}"
    cache = _artifact_cache(spec, options)
    # Only a host that may compile consults the compile caches.
    compile_cache = options.compile_cache if spec.compiles else None
    signal, hook, monitoring = options.signal, options.warm_pool_hook, options.monitoring
    termination = options.termination_hook
    s3 = cache is not None or prebuilt_s3 is not None or compile_cache is not None
    api_keys = options.api_keys_secret is not None
    report = reports_phases(spec, options)
    report_phase = REPORT_PHASE if report else None
    # A host that publishes has an artifact cache, so it reports its phases too.
    report_publish = REPORT_PUBLISH if publishes(spec, options) else None
    log_groups = monitoring.log_groups if monitoring else {}
    # The stack's values: those CloudFormation fills in go to stack.env, which the user data writes
    # as is; the rest to bundle.env, which the boot's steps add to it (userdata/boot/prelude.sh.j2).
    stack_env: dict[str, str | None] = {
        "IMAGE": spec.pulled,
        "HF_TOKEN_SECRET": options.hf_token_secret,
        "PREBUILT": prebuilt,
        "CACHE_BUCKET": cache[0] if cache else None,
        "CACHE_PREFIX": (f"{cache[1]}/" if cache[1] else "") if cache else None,
        "COMPILE_CACHE": compile_cache,
        "GROUP_NAME": hook.group_name if hook else termination.group_name if termination else None,
        "HOOK_NAME": hook.hook_name if hook else None,
        "TERMINATION_HOOK_NAME": termination.hook_name if termination else None,
        "SERVICE": monitoring.service if monitoring else None,
        # For report-phase's boot phase metric and api-keys sync's failure metric; the publisher has
        # its namespace in its config.
        "METRICS_NAMESPACE": monitoring.namespace if monitoring else None,
        **{log_group_variable(kind): log_groups.get(kind) for kind in LOG_KINDS},
        "API_KEYS_SECRET": options.api_keys_secret,
        "SIGNAL_STACK": signal.stack_name if signal else None,
        # Also for the boot script's FAILURE signal before it has its bundle (userdata/bootstrap.sh.j2).
        "SIGNAL_RESOURCE": signal.logical_id if signal else None,
    }
    files = {
        EXPORT_MODEL: render(
            "export-model.sh.j2",
            key=key,
            replica_devices=plan.devices_per_replica,
            token_file=token_file,
            mount=MODEL_MOUNT,
            hub_cli=image.export.hub_cli,
            export_entrypoint=image.export.entrypoint,
            hub_cache_variable=image.export.hub_cache_variable,
            model=plan.model_id,
            revision=spec.model_revision,
            checkpoint_files=image.export.checkpoint_files,
            checkpoint_excluded=image.export.checkpoint_excluded,
            export_args=Unquoted(_export_words(engine, plan, image, key)),
            export_env=_export_environment(engine, plan, image, key),
            served_checkpoint_files=image.export.served_checkpoint_files,
            draft=plan.request.speculative_model,
            draft_revision=plan.request.speculative_model_revision,
            # The draft's figures the planner counted, which eagle-draft checks the downloaded config.json for.
            draft_expected=None if plan.draft is None else json.dumps(
                {"hidden_size": plan.draft.hidden_size, "num_hidden_layers": plan.draft.num_layers,
                 "vocab_size": plan.draft.vocab_size}, separators=(",", ":"), sort_keys=True),
            draft_dir=DRAFT_DIR,
            draft_files=DRAFT_FILES,
            eagle_draft=EAGLE_DRAFT,
            engine=engine.title,
            aws=s3,
            prebuilt=prebuilt,
            prebuilt_s3=prebuilt_s3,
            cache_bucket=cache[0] if cache else None,
            hub_cache=spec.hub_cache if spec.compiles else None,
            compile_cache=compile_cache is not None,
            public_hub_cache=PUBLIC_HUB_CACHE,
            hub_workers=HUB_DOWNLOAD_WORKERS,
            aws_cli_config=AWS_CLI_CONFIG,
            report_phase=report_phase,
            report_publish=report_publish,
            published=PUBLISHED,
            raced=PUBLISH_RACED,
            failed=PUBLISH_FAILED,
            download_export=_phase("download-export"),
            export_model=_phase("export-model"),
            wait_export=_phase("wait-export"),
            download_checkpoint=_phase("download-checkpoint"),
            role=spec.export_role,
            wait_seconds=options.export_wait_minutes * 60,
            poll_seconds=WAIT_POLL_SECONDS,
            download_attempts=DOWNLOAD_ATTEMPTS,
        ),
        **({AWS_CLI_CONFIG: aws_cli_config(plan)} if s3 else {}),
        CHECK_EXPORT: render("check-export.py.j2",
                                expect=json.dumps(engine.export_expectations(plan, image), sort_keys=True)),
        RUN_REPLICA: render(
            "run-replica.sh.j2",
            key=key,
            mount=MODEL_MOUNT,
            container_port=engine.container_port,
            engine=engine.title,
            monitoring=monitoring is not None,
            replica_command=Unquoted(_replica_command(engine, plan, image, key)),
            replica_entrypoint=engine.replica_entrypoint(image),
        ),
        f"/etc/systemd/system/{REPLICA_UNIT}@.service": render(
            "neuron-replica@.service.j2", engine=engine.title, ready_unit=hook is not None),
        REPLICA_ENV: common_env,
        "/etc/neuron-serving/replicas.table": replica_table,
        "/etc/haproxy/haproxy.cfg.new": render_router_config(
            plan, engine, api_keys=api_keys, load_balancer_authentication=options.load_balancer_authentication,
            drain=options.interruptions),
    }
    if plan.request.speculative_model is not None and spec.compiles:
        files[EAGLE_DRAFT] = _userdata_file(EAGLE_DRAFT_SOURCE)
    if options.interruptions:
        files[WATCH_INTERRUPTION] = _userdata_file(WATCH_INTERRUPTION_SOURCE)
        files[f"/etc/systemd/system/{INTERRUPTION_UNIT}.service"] = render(
            f"{INTERRUPTION_UNIT}.service.j2", program=WATCH_INTERRUPTION, report_phase=REPORT_PHASE,
            phase=_phase(DRAINING), log=INTERRUPTION_LOG,
            hook_seconds=termination.heartbeat_timeout_seconds if termination else None)
        files[DRAIN_FILE] = DRAIN_FILE_TEXT
    if api_keys:
        files[API_KEYS] = _userdata_file(API_KEYS_SOURCE)
        files[LOAD_API_KEYS] = render("load-api-keys.sh.j2", program=API_KEYS)
        for kind in ("service", "timer"):
            files[f"/etc/systemd/system/{API_KEYS_UNIT}.{kind}"] = render(
                f"{API_KEYS_UNIT}.{kind}.j2", program=API_KEYS, unit=API_KEYS_UNIT,
                metrics_file=API_KEYS_METRICS_FILE if monitoring is not None else None)
    if signal is not None or hook is not None:
        files[WAIT_READY] = render("wait-ready.sh.j2", seconds=_ready_seconds(plan, options),
                                      router_port=plan.router_port,
                                      health_path=engine.health_path, probe_path=probe.path, probe_body=probe.body,
                                      report_phase=REPORT_PHASE, wait_ready=_phase("wait-ready"), ready=READY,
                                      failed=FAILED)
    if report:
        files[REPORT_PHASE] = render("report-phase.sh.j2", limit=TAG_VALUE_LIMIT, phase_tag=PHASE_TAG,
                                     since_tag=SINCE_TAG, detail_tag=DETAIL_TAG, seconds_tag=SECONDS_TAG,
                                     ends=ENDS, phases_file=PHASES_FILE, metrics=monitoring is not None,
                                     metric=BOOT_PHASE_METRIC, service_dimension=SERVICE,
                                     dimension=PHASE_DIMENSION)
    if report_publish is not None:
        files[report_publish] = render("report-publish.sh.j2", tag=PUBLISH_TAG, limit=TAG_VALUE_LIMIT,
                                       published=PUBLISHED, raced=PUBLISH_RACED, failed=PUBLISH_FAILED,
                                       metrics=monitoring is not None, metric=EXPORT_PUBLISH_FAILURES,
                                       service_dimension=SERVICE, instance_dimension=INSTANCE)
    if hook is not None:
        files[COMPLETE_LIFECYCLE] = render("complete-lifecycle.sh.j2")
        files["/etc/systemd/system/neuron-serving-ready.service"] = render("neuron-serving-ready.service.j2")
    if monitoring is not None:
        files.update(_monitoring_files(plan, engine, monitoring, api_keys=api_keys))
    # The steps are in the bundle, so they hold no deploy-time value: those are in stack.env.
    steps = dict(
        devices=plan.instance.devices,
        # A host of a warm pool is stopped, which empties the instance store.
        instance_store=plan.instance.has_instance_store and hook is None,
        instance_type=plan.instance.name,
        layout=f"{LAYOUTS}/{plan.instance.name}".lstrip("/") if in_fleet else None,
        boot_steps=BOOT_STEPS,
        hf_token_secret=options.hf_token_secret is not None,
        token_file=TOKEN_FILE,
        replica_unit=REPLICA_UNIT,
        replica_env=REPLICA_ENV,
        driver_below=image.driver_below,
        driver_from=image.driver_from,
        runtime=image.neuron_runtime,
        **_baked_steps(spec, options),
        named_settings=named_settings,
        replicas=_replicas(plan),
        router_port=plan.router_port,
        metadata=report,
        report=report,
        warmed=WARMED,
        api_keys=api_keys,
        load_api_keys=LOAD_API_KEYS,
        api_keys_unit=API_KEYS_UNIT,
        interruptions=options.interruptions,
        interruption_unit=INTERRUPTION_UNIT,
        signal=signal,
        hook=hook,
        heartbeat_seconds=hook.heartbeat_interval_seconds if hook else None,
        wait_ready=files.get(WAIT_READY),
        monitoring=monitoring is not None,
        start_monitoring=START_MONITORING,
        builder=spec.export_role == "build",
        signal_id_limit=SIGNAL_ID_LIMIT,
        failed=FAILED,
        export_model=EXPORT_MODEL,
    )
    files[BOOT_STEPS] = render("boot-steps.sh.j2", description=Unquoted(_describe(plan)), **steps)
    known = {k: v for k, v in stack_env.items() if v is not None}
    bootstrap = {k: v for k, v in known.items() if k in BOOTSTRAP_ENV}
    deploy_time = {k: v for k, v in known.items() if TOKEN_MARK in v and k not in bootstrap}
    files[BUNDLE_ENV] = _env_file({k: v for k, v in known.items() if k not in deploy_time | bootstrap})
    # Jinja drops a template's last line break; every file ends with one, as editors write them.
    files = {path: text if text.endswith("\n") else text + "\n" for path, text in files.items()}
    return HostBoot(files=files, deploy_env=deploy_time, bootstrap_env=bootstrap)


def _baked_steps(spec: HostSpec, options: BootOptions) -> dict[str, Any]:
    """The values of the boot's steps that a serving AMI bakes (``userdata/boot/install-tools.sh.j2``,
    ``pull-image.sh.j2``), which the boot and the bake (:func:`render_bake_script`) render alike."""
    # A host that may publish to the artifact cache needs AWS CLI v2's conditional writes (install-tools).
    return dict(pull_attempts=spec.pull_attempts, first_pull_wait=FIRST_PULL_WAIT_SECONDS,
                conditional_write=_artifact_cache(spec, options) is not None and spec.export_role != "wait",
                registry=spec.registry)


def _artifact_cache(spec: HostSpec, options: BootOptions) -> tuple[str, str] | None:
    """The artifact cache's ``(bucket, prefix)``, or None: none, or a prebuilt export, which the host serves
    instead of the cache's."""
    prebuilt = s3_parts(spec.prebuilt_export) is not None or hf_repo(spec.prebuilt_export) is not None
    return None if prebuilt else s3_parts(options.artifact_cache)


def render_bake_script(plan: ServingPlan, spec: HostSpec, options: BootOptions | None = None) -> str:
    """The script that bakes a serving AMI for the hosts :func:`render_boot_script` boots with the same
    arguments (``userdata/bake.sh.j2``): their install-tools and pull-image steps, from the same fragments
    and values, so that what the AMI holds is what each boot would install and pull. It needs no Neuron
    device, and runs as root on an instance of the hosts' AMI (an EC2 Image Builder build)."""
    options = options or BootOptions()
    return render("bake.sh.j2", description=Unquoted(_describe(plan)), image=spec.pulled,
                  **_baked_steps(spec, options))


@dataclass(frozen=True)
class HostBoot:
    """A host's boot, rendered: its files (the bundle, which the stack ships as an asset), the
    stack's deploy-time values (CDK tokens), which the stack keeps in the metadata of the host's
    resource, and what the user data itself carries.

    :param files: host path to content (:mod:`~neuron_serving.render.bundle`).
    :param deploy_env: the deploy-time values, which the boot script reads from the metadata
        (:meth:`metadata`) into ``/etc/neuron-serving/stack.env``.
    :param bootstrap_env: what the boot script needs before it has read them: the target of its
        FAILURE signal (:data:`BOOTSTRAP_ENV`), written to stack.env by the user data.
    """

    files: Mapping[str, str]
    deploy_env: Mapping[str, str]
    bootstrap_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """The SHA-256 of the bundle's manifest, which the user data checks the bundle by."""
        return digest(self.files)

    def values(self) -> str:
        """The lines the boot script adds to stack.env from the host resource's metadata: the
        deploy-time values. Not the bundle's place: a host reads the stack's current metadata, which may
        be newer than the launch template version it was launched from (see :meth:`user_data`)."""
        return _env_file(dict(self.deploy_env))

    def metadata(self) -> dict[str, str]:
        """The CloudFormation metadata of the host's resource (its launch template) that holds
        :meth:`values`: ``{METADATA_KEY: values}``."""
        return {METADATA_KEY: self.values()}

    def user_data(self, region: str, stack_name: str, resource: str, bundle: str) -> str:
        """The boot script (EC2 user data) that reads the stack's values from the metadata of
        ``resource`` (a logical id) in the stack ``stack_name`` in ``region``, downloads the bundle at
        ``bundle`` (its S3 URI; each may be a CDK token), checks it against its digest, installs its files
        and runs the boot's steps (``userdata/bootstrap.sh.j2``). Its size does not depend on the stack's
        features.

        The bundle's place is in the user data with its digest, not in the metadata: a host launched from
        an older launch template version (during a stack update, or a rollback) reads the stack's current
        metadata, and would find there a newer bundle than the digest its user data checks. The bundle's
        key is its content's hash (a CDK asset's), so a launch template version names its own bundle for
        as long as the asset stays in the bucket.

        The result is not checked against the user data limit: see :func:`check_user_data_size`.
        """
        env = {"STACK_REGION": region, "STACK_NAME": stack_name, "HOST_RESOURCE": resource, "BUNDLE": bundle,
               **self.bootstrap_env}
        script = render(
            "bootstrap.sh.j2",
            stack_env=Unquoted(_env_file(env)),
            key=METADATA_KEY,
            digest=self.digest,
            boot_steps=BOOT_STEPS,
        )
        return _without_comments(script)


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


def _shell_words(words: Sequence[str], suffixes: Sequence[str], key: str) -> list[str]:
    """``words`` as shell words for a script whose ``$key`` names the export: a container path
    ``/models/<key><suffix>`` (each of ``suffixes``) as ``"/models/$key<suffix>"``, the rest quoted."""
    paths = {f"{MODEL_MOUNT}/{key}{suffix}": f'"{MODEL_MOUNT}/$key{suffix}"' for suffix in suffixes}
    return [paths.get(word) or shlex.quote(word) for word in words]


def _export_words(engine: Engine, plan: ServingPlan, image: ServingImage, key: str) -> str:
    """The engine's export arguments as shell words for ``export-model``: the checkpoint directory
    and the output as ``"/models/$key.src"`` and ``.tmp``."""
    source, output = (f"{MODEL_MOUNT}/{key}{suffix}" for suffix in (".src", ".tmp"))
    return " ".join(_shell_words(engine.export_arguments(plan, image, source, output), (".src", ".tmp"), key))


def _export_environment(engine: Engine, plan: ServingPlan, image: ServingImage,
                        key: str) -> list[tuple[str, Unquoted]]:
    """The engine's export variables as ``NAME`` and a shell word, the export's directory as
    ``"/models/$key.tmp"``."""
    env = engine.export_environment(plan, image, f"{MODEL_MOUNT}/{key}.tmp")
    words = _shell_words(list(env.values()), (".tmp",), key)
    return [(name, Unquoted(word)) for name, word in zip(env, words, strict=True)]


def _replica_command(engine: Engine, plan: ServingPlan, image: ServingImage, key: str) -> str:
    """The engine's replica command as shell words for ``run-replica``: the export's directory
    inside the container as ``"/models/$key"``."""
    return " ".join(_shell_words(engine.replica_command(plan, image, f"{MODEL_MOUNT}/{key}"), ("",), key))


def _userdata_file(name: str) -> str:
    """A file of ``neuron_serving.userdata`` as the package ships it."""
    return (resources.files("neuron_serving.userdata") / name).read_text()


def _monitoring_files(plan: ServingPlan, engine: Engine, monitoring: MonitoringOptions, *,
                      api_keys: bool) -> dict[str, str]:
    return {
        PUBLISHER: _userdata_file(PUBLISHER_SOURCE),
        START_MONITORING: render(
            "start-monitoring.sh.j2",
            log_group_variables=[log_group_variable(kind) for kind in AGENT_LOG_KINDS],
            agent_key_fingerprint=monitoring.agent_key_fingerprint,
            publisher=PUBLISHER,
            unit=METRICS_UNIT,
        ),
        f"/etc/systemd/system/{METRICS_UNIT}.service": render(
            "neuron-serving-metrics.service.j2",
            stack_env="/etc/neuron-serving/stack.env",
            host_env="/etc/neuron-serving/host.env",
            publisher=PUBLISHER,
            config=PUBLISHER_CONFIG,
        ),
        f"/etc/logrotate.d/{METRICS_UNIT}": render(
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
                f"limit of {USER_DATA_LIMIT_BYTES} bytes: it holds the boot bundle's place and the stack's values "
                "(stack.env), so shorter secret names, image names or name prefixes make it smaller"
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
            elif k in own and (has_space(v) or not v):
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


def _env_file(env: Mapping[str, str]) -> str:
    """``env`` as lines a shell sources and systemd reads alike: ``NAME=value``, shell-quoted."""
    return "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items())


def _without_comments(text: str) -> str:
    """The boot script with only its first two lines of comment (what it is, where it is explained):
    the rest explain it in ``userdata/bootstrap.sh.j2``, and EC2 counts user data against 16 KB.
    The bundle's files keep theirs: operators read them on the host and in the cloud assembly."""
    lines = text.splitlines()
    return "".join(f"{line}\n" for n, line in enumerate(lines) if n < 2 or not line.lstrip().startswith("#"))
