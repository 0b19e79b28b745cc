"""The boot scripts as a construct: the rendered user data plus exactly the permissions it uses."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jsii
from aws_cdk import (
    Acknowledgment,
    ArnFormat,
    Aws,
    CfnResource,
    Duration,
    IStableStringProducer,
    Lazy,
    Stack,
    Token,
    Validations,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import aws_secretsmanager as secretsmanager

from constructs import Construct, IValidation

from ..plan.engines import Engine, ServingImage
from ..plan.errors import ServingConfigError, problem
from ..plan.host import HostSpec, resolve_host, s3_parts
from ..plan.layout import ServingPlan, fleet_layouts
from ..plan.phases import HOST_TAGS
from ..plan.registry import EcrRegistry
from ..plan.timing import boot_minutes, boot_timeout_problem, longest_generation_seconds, readiness_seconds
from ..plan.volume import DEFAULT_DISK_MINUTES, VolumePerformance, volume_performance
from ..render.boot import HostBoot, check_user_data_size, render_bake_script, render_fleet_boot
from ..render.boot_options import (
    MAX_HEARTBEAT_TIMEOUT_SECONDS,
    BootOptions,
    ReadinessSignal,
    TerminationHook,
    WarmPoolHook,
    publishes,
    reports_phases,
)
from ..render.bundle import write_bundle
from .artifact_cache import COMPILE_CACHE_PREFIX, EXPORTS_PREFIX, NeuronArtifactCache
from .monitoring import NeuronServingMonitoring
from .scanners import acknowledge_any_resource, nag_arn

TERMINATION_HOOK = "neuron-serving-termination"
"""The name of the termination lifecycle hook of a group whose hosts drain (``interruptions``)."""
TERMINATION_SLACK_SECONDS = 60
"""What the termination hook's heartbeat timeout adds to the longest generation: the watcher's
margin before the timeout and its retries of CompleteLifecycleAction."""


class NeuronBootScript(Construct):
    """User data that exports the model once (or fetches it) and starts the plan's replicas
    and router, plus :meth:`grant_boot` for the permissions those steps use.

    The host's files (scripts, units, configs, the metrics publisher and the key sync) are the boot
    bundle, an S3 asset of the stack (:attr:`bundle`; readable in the cloud assembly as
    ``asset.<hash>/``), which the user data downloads and installs once its checksums match the
    ones it carries, from the place it names: a host launched from an older launch template version
    (while the stack updates) installs that version's bundle. The stack's values known at synth travel
    in the bundle too (``bundle.env``); the deploy-time ones (names CloudFormation fills in) are in the
    CloudFormation metadata of the resource the boot script is attached to (:meth:`attach`; the
    launch template of a :class:`NeuronServingLaunchTemplate`), which the host reads at boot as
    cfn-init does. So the user data is about 2 KB whatever the features. It is still checked against
    the EC2 user-data limit (16 KB) when constructed.

    :param plan: the serving plan to realise on the host.
    :param instance_types: the instance types the host may be, in order of preference, ``plan``'s own
        first: a fleet of several types (:class:`NeuronServingFleet` launches each). The boot holds ``plan``
        laid out on each (:attr:`layouts`, one export for all) and runs the one of the type the host is.
        Default: ``plan``'s instance type alone.
    :param spec: the host's engine, image (pinned or not), private registry, export source and role
        and model revision, resolved once for ``plan``
        (:func:`~neuron_serving.plan.host.resolve_host`; ``NeuronLlamaStack`` takes the settings'
        :meth:`~neuron_serving.settings.stack_settings.StackSettings.host`). :meth:`grant_boot`
        grants pulling from its registry, and reading its S3 prebuilt export.
        Default: ``resolve_host(plan)``: TGI's image from its public registry, exporting on the host.
    :param hf_token_secret: a secret holding a Hugging Face token for gated models. The token is
        read on the host at boot; it never appears in the user data or the template.
        Default: no token.
    :param artifact_cache: exports shared through S3, so only the first host compiles.
        Default: every host exports for itself.
    :param compile_cache: with ``artifact_cache``, the export also keeps the graphs it compiles in
        the cache's bucket (:attr:`NeuronArtifactCache.compile_cache_uri`) and fetches those it finds
        there instead of compiling them, so a graph compiled for any export of the stack is not
        compiled again. :meth:`grant_boot` grants reading and adding graphs there. Default: true.
    :param signal: the resource the host signals CloudFormation for once every replica serves,
        or with the reason when the boot fails. The instance or fleet construct takes this
        logical id. Default: no signal.
    :param monitoring: publish metrics (Neuron Monitor, replicas, router, host) and ship logs to this
        monitoring's log groups; :meth:`grant_boot` grants that too. Default: no monitoring.
    :param warm_pool_hook: the launch lifecycle hook the host completes when prepared for (or
        started from) a warm pool. Default: none.
    :param api_keys_secret: the secret of the endpoint's API keys (a JSON object of key name to
        key digest; see ``neuron-serving api-key``): each host's router then refuses requests
        without a known ``Authorization: Bearer`` key, and picks up keys added, rotated or revoked
        in the secret within about a minute. :meth:`grant_boot` grants reading it.
        Default: no API keys (whoever reaches the router may use the model).
    :param load_balancer_authentication: with ``api_keys_secret``, the routers also accept the
        requests the load balancer signed in (OIDC), which it sends without an ``Authorization``
        header. Default: false.
    :param interruptions: drain each host on a Spot interruption notice and when its Auto Scaling group
        terminates it (``BootOptions.interruptions``): its router's health check fails within 2 s while
        every request is still served; on a Spot notice the host asks its group to replace it; then it waits
        for its requests in flight and completes the group's termination lifecycle hook
        (:attr:`termination_hook`, which :class:`NeuronServingFleet` adds to its group). A rebalance
        recommendation is only logged: the group's Capacity Rebalancing replaces the host first and then
        terminates it through that hook. :meth:`grant_boot` grants
        ``autoscaling:TerminateInstanceInAutoScalingGroup`` and ``autoscaling:CompleteLifecycleAction`` on
        the group ``group_name`` names, and only there. Default: false.
    :param group_name: the name of the Auto Scaling group the hosts run in, fixed before the group
        exists (the fleet takes it as its group's name), with ``interruptions``. Default: the warm pool
        hook's group, else none.
    :param root_volume_throughput: the throughput of the host's gp3 root volume, in MiB/s (125 to
        2,000), which the launch template provisions: the replicas read the model's weights from
        it, and ``wait-ready``'s limit and the boot timeout's estimate allow for reading them at
        this rate. Above 125, about $0.04 per MiB/s per month per host (us-east-1).
        Default: what moves the boot's disk traffic in ``boot_disk_minutes``, at least 125
        (``plan.volume.default_throughput``).
    :param root_volume_iops: the root volume's IOPS (3,000 to 80,000, at least 4 per MiB/s of
        throughput, at most 500 per GiB). Above 3,000, about $0.005 each per month per host
        (us-east-1). Default: enough to carry the throughput in 128 KiB reads, at least 3,000.
    :param boot_disk_minutes: how long the boot's disk traffic (the image unpacked, the weights
        written and read once: ``plan.volume.boot_disk_bytes``) may take, which sizes the default
        throughput and IOPS. Default: 3.
    :param boot_timeout: how long a host may take to serve. Default: estimated from the model
        (image pull, export unless prebuilt, load; see ``plan.timing``).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        plan: ServingPlan,
        instance_types: Sequence[str] | None = None,
        spec: HostSpec | None = None,
        hf_token_secret: secretsmanager.ISecret | None = None,
        artifact_cache: NeuronArtifactCache | None = None,
        compile_cache: bool = True,
        signal: ReadinessSignal | None = None,
        warm_pool_hook: WarmPoolHook | None = None,
        boot_timeout: Duration | None = None,
        root_volume_throughput: int | None = None,
        root_volume_iops: int | None = None,
        boot_disk_minutes: float = DEFAULT_DISK_MINUTES,
        monitoring: NeuronServingMonitoring | None = None,
        api_keys_secret: secretsmanager.ISecret | None = None,
        load_balancer_authentication: bool = False,
        interruptions: bool = False,
        group_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.interruptions = interruptions
        self.group_name: str | None = group_name or (warm_pool_hook.group_name if warm_pool_hook else None)
        """The Auto Scaling group's fixed name, when the hosts act on their group (interruptions, a warm pool)."""
        if interruptions and self.group_name is None:
            raise ServingConfigError([problem(
                "group_name", None, "is needed with interruptions: a draining host asks its Auto Scaling group to "
                "replace it, and its role may do that on that group only, named before it exists")])
        if (warm_pool_hook is not None and group_name is not None and group_name != warm_pool_hook.group_name):
            raise ServingConfigError([problem(
                "group_name", group_name, f"must be the warm pool hook's group ({warm_pool_hook.group_name})")])
        self.plan = plan
        self.layouts: tuple[ServingPlan, ...] = (
            fleet_layouts(plan, instance_types) if instance_types is not None else (plan,))
        """``plan`` on each instance type the host may be, its own first
        (:func:`~neuron_serving.plan.layout.fleet_layouts`)."""
        self.spec: HostSpec = spec or resolve_host(plan)
        """The host's engine, image, registry and export, resolved."""
        self.hf_token_secret = hf_token_secret
        self.artifact_cache = artifact_cache
        self.compile_cache: NeuronArtifactCache | None = (
            artifact_cache if compile_cache and self.spec.compiles else None)
        """The artifact cache whose bucket keeps the compiled graphs, when the host compiles and uses it."""
        self.signal = signal
        self.warm_pool_hook = warm_pool_hook
        self.monitoring = monitoring
        self.api_keys_secret = api_keys_secret
        self.root_volume: VolumePerformance = volume_performance(
            plan, root_volume_throughput, root_volume_iops, boot_disk_minutes)
        """The root volume's throughput and IOPS, which the launch template provisions."""
        self.boot_timeout: Duration = boot_timeout or Duration.minutes(
            boot_minutes(plan, throughput=self.root_volume.throughput, exports=self.spec.exports)
        )
        minutes = self.boot_timeout.to_minutes()
        if (wrong := boot_timeout_problem(minutes)) is not None:
            raise ServingConfigError([problem("boot_timeout", f"{minutes:g} minutes", wrong)])
        # wait-ready gives up within the boot timeout (the signal's, the fleet's pause), so a slow
        # load fails with its reason instead of at CloudFormation's timeout.
        self.ready_seconds: int = min(readiness_seconds(plan, self.root_volume.throughput),
                                      int(self.boot_timeout.to_seconds()))
        """How long ``wait-ready`` waits for every replica (``plan.timing.readiness_seconds``)."""
        self.termination_hook: TerminationHook | None = TerminationHook(
            hook_name=TERMINATION_HOOK, group_name=self.group_name,
            heartbeat_timeout_seconds=min(longest_generation_seconds(plan) + TERMINATION_SLACK_SECONDS,
                                          MAX_HEARTBEAT_TIMEOUT_SECONDS),
        ) if interruptions and self.group_name is not None else None
        """With ``interruptions``, the termination lifecycle hook the group must have and the hosts complete
        once drained: its heartbeat timeout covers the longest generation the plan allows."""
        self.options = BootOptions(
            hf_token_secret=_secret_id(hf_token_secret),
            api_keys_secret=_secret_id(api_keys_secret),
            load_balancer_authentication=load_balancer_authentication,
            artifact_cache=artifact_cache.uri if artifact_cache else None,
            compile_cache=self.compile_cache.compile_cache_uri if self.compile_cache else None,
            signal=signal,
            warm_pool_hook=warm_pool_hook,
            monitoring=monitoring.boot_options if monitoring else None,
            # A waiting host gives up with its boot, whose estimate includes the builder's export.
            export_wait_minutes=int(self.boot_timeout.to_minutes()),
            ready_seconds=self.ready_seconds,
            interruptions=interruptions,
            termination_hook=self.termination_hook,
        )
        self.boot: HostBoot = render_fleet_boot(self.layouts, self.spec, self.options)
        """The host's files (the bundle) and the stack's values."""
        # The bundle is an asset: a directory of the host's files and their manifest, which the
        # CDK zips and publishes to the bootstrap bucket and the user data downloads and checks.
        # Written to a directory of its own: staging copies it into the cloud assembly, but a
        # synth without staging (aws:cdk:disable-asset-staging) reads it where it is.
        bundle_directory = Path(tempfile.mkdtemp(prefix="neuron-serving-bundle-"))
        write_bundle(self.boot.files, bundle_directory)
        self.bundle = s3_assets.Asset(self, "Bundle", path=str(bundle_directory))
        """The boot bundle's asset (:mod:`~neuron_serving.render.bundle`)."""
        self._host: CfnResource | None = None
        self.script: str = self.boot.user_data(
            Aws.REGION, Stack.of(self).stack_name, Lazy.string(_HostResource(self)), _asset_uri(self.bundle))
        """The rendered boot script (tokens, if any, unresolved)."""
        self.node.add_validation(_Attached(self))
        check_user_data_size(self.script, plan)
        self.user_data = ec2.UserData.custom(self.script)
        """The script as EC2 user data, for a launch template."""

    def attach(self, resource: CfnResource) -> None:
        """Keep the stack's deploy-time values in ``resource``'s metadata
        (:meth:`~neuron_serving.render.boot.HostBoot.metadata`), where the user data reads them: the
        launch template or instance that runs :attr:`user_data`, in this construct's stack, as
        ``CloudFormationInit.attach`` does. ``NeuronServingLaunchTemplate`` attaches its own; a boot
        script runs on one resource's hosts, and synthesis stops if it was never attached.
        :meth:`grant_boot` grants reading it.

        A host reads the values when it boots. A change of the bundle changes the user data (it
        carries the bundle's digest), so the launch template gets a new version and the hosts are
        replaced; a change of the values alone (a resource the values name replaced, say) reaches
        the hosts launched after it, as with ``CloudFormationInit``."""
        if self._host is not None:
            raise ServingConfigError([problem(
                "resource", resource.node.path, f"is a second resource for the boot script {self.node.path}, "
                f"attached to {self._host.node.path}: each launch template needs a NeuronBootScript of its own")])
        if Stack.of(resource) is not Stack.of(self):
            raise ServingConfigError([problem(
                "resource", resource.node.path, f"must be in the stack of the boot script {self.node.path} "
                f"({Stack.of(self).stack_name}), whose name its user data carries")])
        self._host = resource
        for key, value in self.boot.metadata().items():
            resource.add_metadata(key, value)

    @property
    def host_resource(self) -> CfnResource | None:
        """The resource whose metadata holds the stack's values (:meth:`attach`), once attached."""
        return self._host

    @property
    def engine(self) -> Engine:
        """The serving engine (the spec's)."""
        return self.spec.engine

    @property
    def serving_image(self) -> ServingImage:
        """What the image's tools can do, which the boot script is written for (the spec's)."""
        return self.spec.image

    @property
    def image(self) -> str:
        """The reference hosts run: the image's tag, with its digest when pinned."""
        return self.spec.image.reference

    @property
    def publishes_exports(self) -> bool:
        """Whether the hosts compile the model and publish the export to the artifact cache, and so
        report a publish that failed: pass it to
        :meth:`NeuronServingMonitoring.watch` (``publishes_exports``) for its alarm."""
        return publishes(self.spec, self.options)

    @property
    def bake_script(self) -> str:
        """The script that bakes a serving AMI for these hosts
        (:func:`~neuron_serving.render.boot.render_bake_script`): their install-tools and pull-image steps."""
        return render_bake_script(self.plan, self.spec, self.options)

    def grant_bake(self, grantee: iam.IGrantable) -> None:
        """Give ``grantee`` (the serving AMI's build instance) what :attr:`bake_script` calls: a pull from
        the image's private registry, when it has one."""
        if self.spec.registry is not None:
            self._grant_pull(grantee, self.spec.registry)

    def grant_boot(self, grantee: iam.IGrantable) -> None:
        """Give ``grantee`` (the host role) exactly what the boot script calls."""
        if self.spec.registry is not None:
            self._grant_pull(grantee, self.spec.registry)
        if self.hf_token_secret is not None:
            self.hf_token_secret.grant_read(grantee)
        if self.monitoring is not None:
            self.monitoring.grant_publish(grantee)
        if self.api_keys_secret is not None:
            self.api_keys_secret.grant_read(grantee)
        stack = Stack.of(self)
        self._grant_bundles(grantee)
        # The stack's values, in the host resource's metadata (attach), as CloudFormationInit grants
        # cfn-init the same action on the stack.
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["cloudformation:DescribeStackResource"], resource_arns=[stack.stack_id],
        )
        if self.signal is not None:
            iam.Grant.add_to_principal(
                grantee=grantee, actions=["cloudformation:SignalResource"], resource_arns=[stack.stack_id],
            )
        if self.artifact_cache is not None:
            self.artifact_cache.grant_cache(grantee)
            _acknowledge_cache_prefix(
                self.artifact_cache, EXPORTS_PREFIX,
                "exports are keyed at boot by a hash of model, image and shapes; the host may read and "
                "write only below the cache prefix",
            )
        if self.compile_cache is not None:
            self.compile_cache.grant_compile_cache(grantee)
            _acknowledge_cache_prefix(
                self.compile_cache, COMPILE_CACHE_PREFIX,
                "compiled graphs are keyed by the compiler by a hash of each graph; the host may read and add "
                "them only below the compile cache prefix",
            )
        if (prebuilt := s3_parts(self.spec.prebuilt_export)) is not None:
            bucket, prefix = prebuilt
            objects = f"{prefix}/*" if prefix else "*"
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["s3:GetObject"],
                resource_arns=[f"arn:{Aws.PARTITION}:s3:::{bucket}/{objects}"],
            )
            grantee.grant_principal.add_to_principal_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}"],
                    conditions={"StringLike": {"s3:prefix": [objects]}},
                )
            )
            _acknowledge_prefix(
                stack, f"arn:<AWS::Partition>:s3:::{bucket}/{objects}",
                "read-only access to the objects of the prebuilt export the user named",
            )
        if reports_phases(self.spec, self.options):
            self._grant_phase_tags(grantee)
        if self.interruptions and self.group_name is not None:
            self._grant_leave_group(grantee, self.group_name)
        if self.warm_pool_hook is not None:
            iam.Grant.add_to_principal(
                grantee=grantee,
                actions=["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"],
                resource_arns=[
                    Stack.of(self).format_arn(
                        service="autoscaling",
                        resource="autoScalingGroup",
                        resource_name=f"*:autoScalingGroupName/{self.warm_pool_hook.group_name}",
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
            _acknowledge_prefix(
                stack,
                nag_arn(stack, "autoscaling",
                        f"autoScalingGroup:*:autoScalingGroupName/{self.warm_pool_hook.group_name}"),
                "the group's id is assigned at creation; the resource names the one group by name",
            )

    def _grant_bundles(self, grantee: iam.IGrantable) -> None:
        """``s3:GetObject`` on the asset bucket's zipped assets, not only on this synth's bundle: a host
        launched from an older launch template version, while the stack updates, downloads that version's
        bundle, and the role's policy names the current one by then. The CDK keys an asset by its content's
        hash (``<bucket prefix><hash>.zip``), so no pattern narrower than the synthesizer's bucket prefix
        holds every version's bundle. The asset bucket is the CDK bootstrap's, which every CDK app of the
        account and region shares: with the default synthesizer (no prefix) the hosts may read every app's
        zipped assets there; a ``DefaultStackSynthesizer(bucket_prefix=...)`` of the stack's own narrows the
        grant to its prefix."""
        key, asset_hash = self.bundle.s3_object_key, self.bundle.asset_hash
        suffix = f"{asset_hash}.zip"
        prefix = key[:-len(suffix)] if not Token.is_unresolved(key) and key.endswith(suffix) else ""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["s3:GetObject"],
            resource_arns=[self.bundle.bucket.arn_for_objects(f"{prefix}*.zip")],
        )
        stack = Stack.of(self)
        _acknowledge_prefix(
            stack,
            f"arn:{_nag_text(stack, stack.partition)}:s3:::"
            f"{_nag_text(stack, self.bundle.s3_bucket_name)}/{prefix}*.zip",
            "a host launched from an older launch template version while the stack updates reads that "
            "version's boot bundle, keyed by its content's hash in the asset bucket; read only",
        )

    def _grant_leave_group(self, grantee: iam.IGrantable, group_name: str) -> None:
        """``autoscaling:TerminateInstanceInAutoScalingGroup`` and ``autoscaling:CompleteLifecycleAction``
        on the one group, for a draining host (``watch-interruption``): each action's resource is the
        group (Service Authorization Reference, Amazon EC2 Auto Scaling), whose id is assigned at creation,
        so its ARN names it by name."""
        stack = Stack.of(self)
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["autoscaling:TerminateInstanceInAutoScalingGroup", "autoscaling:CompleteLifecycleAction"],
            resource_arns=[stack.format_arn(
                service="autoscaling", resource="autoScalingGroup",
                resource_name=f"*:autoScalingGroupName/{group_name}", arn_format=ArnFormat.COLON_RESOURCE_NAME)],
        )
        _acknowledge_prefix(
            stack, nag_arn(stack, "autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{group_name}"),
            "the group's id is assigned at creation; the resource names the one group by name",
        )

    def _grant_pull(self, grantee: iam.IGrantable, registry: EcrRegistry) -> None:
        """Pull the image from ``registry``: a token for docker (``ecr:GetAuthorizationToken``, which
        takes no resource: Service Authorization Reference, Amazon Elastic Container Registry), and
        the image's layers from its one repository (``ecr:BatchGetImage``,
        ``ecr:GetDownloadUrlForLayer``: Amazon ECR User Guide, "Private repository policy examples",
        pull); a pull through cache also creates the repository and imports the image on the first
        pull (Amazon ECR User Guide, "IAM permissions required to sync an upstream registry")."""
        repository = (f"arn:{registry.partition}:ecr:{registry.region}:{registry.account}:repository/"
                      f"{registry.repository(self.image)}")
        actions = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
        if self.spec.registry_pull_through:
            actions += ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
        principal = grantee.grant_principal
        principal.add_to_principal_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        principal.add_to_principal_policy(iam.PolicyStatement(actions=actions, resources=[repository]))
        acknowledge_any_resource(self, "ecr:GetAuthorizationToken takes no resource (Service Authorization "
                                 "Reference, Amazon Elastic Container Registry); the pull itself is granted on the "
                                 "image's one repository")

    def _grant_phase_tags(self, grantee: iam.IGrantable) -> None:
        """ec2:CreateTags on the host's own instance, with the boot phase's keys only (report-phase).

        The instance's id is assigned at launch, so the resource is every instance of the stack's
        account and region, and the conditions narrow it down:

        - ``aws:ARN`` (the ARN of the resource acted on) must equal ``${ec2:SourceInstanceARN}``
          (the instance whose role credentials sign the request): the instance tags itself only.
          ``ec2:SourceInstanceARN`` is a single-valued EC2 condition key, and any single-valued key
          may be a policy variable (IAM user guide, "Single-valued vs. multivalued context keys",
          https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-single-vs-multi-valued-context-keys.html);
          AWS's own managed policies use it so (AWS Managed Policy Reference,
          AWSElasticDisasterRecoveryEc2InstancePolicy, ``"${ec2:SourceInstanceARN}"``). ``aws:ARN``
          is not in the Service Authorization Reference nor among the documented global condition
          keys; it is the common way to name the target (qoomon/aws-cheatsheet,
          "Limit EC2 Instance Permissions to itself", ec2-self-management.policy.json, which notes
          that it is undocumented and works). Should it ever be absent from the request context,
          StringEquals on it is false and the statement allows nothing: reporting stops, never the
          boot (report-phase logs the refusal).
        - ``ForAllValues:StringEquals`` on ``aws:TagKeys`` (a condition key of ec2:CreateTags on
          instances, Service Authorization Reference): only the keys of
          :data:`~neuron_serving.plan.phases.HOST_TAGS` (the phase's four and the publish's outcome), so
          the host cannot rewrite ``Name`` or
          the tags that identify its stack or group. ``ForAllValues`` is true for a request
          without tags (the same IAM user guide page), hence the ``Null`` check that
          ``aws:TagKeys`` is present.
        """
        stack = Stack.of(self)
        grantee.grant_principal.add_to_principal_policy(iam.PolicyStatement(
            actions=["ec2:CreateTags"],
            resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
            conditions={
                "StringEquals": {"aws:ARN": "${ec2:SourceInstanceARN}"},
                "ForAllValues:StringEquals": {"aws:TagKeys": list(HOST_TAGS)},
                "Null": {"aws:TagKeys": "false"},
            },
        ))
        Validations.of(stack).acknowledge(Acknowledgment(
            id=f"AwsSolutions-IAM5[Resource::{nag_arn(stack, 'ec2', 'instance/*')}]",
            reason="An instance id is assigned at launch: the host may tag only the instance whose credentials "
            "sign the request (aws:ARN equals ec2:SourceInstanceARN), and only with the boot phase's four keys",
        ))


@jsii.implements(IValidation)
class _Attached:
    """A boot script whose user data names no resource stops synthesis."""

    def __init__(self, boot: NeuronBootScript) -> None:
        self._boot = boot

    def validate(self) -> list[str]:
        if self._boot.host_resource is not None:
            return []
        return [f"NeuronBootScript {self._boot.node.path} is attached to no resource: call attach() with the "
                "launch template or instance that runs its user data, whose metadata then holds the stack's values "
                "(NeuronServingLaunchTemplate attaches its own)"]


@jsii.implements(IStableStringProducer)
class _HostResource:
    """The attached resource's logical id, for the user data."""

    def __init__(self, boot: NeuronBootScript) -> None:
        self._boot = boot

    def produce(self) -> str:
        host = self._boot.host_resource
        # Not attached: the validation has already stopped synthesis with its reason.
        return host.logical_id if host is not None else "NotAttached"


def _secret_id(secret: secretsmanager.ISecret | None) -> str | None:
    """How the host names ``secret``: the complete ARN identifies it exactly; a secret imported
    by name has only a partial ARN (a deploy-time token), and the name is then the identifier."""
    if secret is None:
        return None
    arn, name = secret.secret_arn, secret.secret_name
    return arn if not Token.is_unresolved(arn) or Token.is_unresolved(name) else name


def _asset_uri(asset: s3_assets.Asset) -> str:
    return f"s3://{asset.s3_bucket_name}/{asset.s3_object_key}"


def _nag_text(stack: Stack, value: str) -> str:
    """How cdk-nag writes ``value`` (a name, a pseudo parameter, or a token CloudFormation fills in with
    ``Fn::Sub``, as the default synthesizer's asset bucket) in its finding ids: a ``Ref`` and each
    ``${Name}`` become ``<Name>`` (cdk-nag 3.0.2 ``src/utils/flatten-cfn-reference.ts``)."""
    resolved = stack.resolve(value)
    if isinstance(resolved, dict) and set(resolved) == {"Ref"}:
        return f"<{resolved['Ref']}>"
    text = resolved["Fn::Sub"] if isinstance(resolved, dict) and isinstance(resolved.get("Fn::Sub"), str) else resolved
    if not isinstance(text, str):
        raise ValueError(f"cannot name {resolved} in a cdk-nag finding")
    return re.sub(r"\$\{([^}]+)\}", r"<\1>", text)


def _acknowledge_prefix(stack: Stack, resource: str, reason: str) -> None:
    Validations.of(stack).acknowledge(
        Acknowledgment(id=f"AwsSolutions-IAM5[Resource::{resource}]", reason=reason)
    )


def _acknowledge_cache_prefix(cache: NeuronArtifactCache, prefix: str, reason: str) -> None:
    """:func:`_acknowledge_prefix` for the objects below ``prefix`` of ``cache``'s bucket."""
    stack = Stack.of(cache)
    bucket = stack.get_logical_id(cache.bucket.node.default_child)  # type: ignore[arg-type]
    _acknowledge_prefix(stack, f"<{bucket}.Arn>/{prefix}/*", reason)
