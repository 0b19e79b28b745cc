"""NeuronLlamaStack: an LLM endpoint on one Inferentia2 or Trainium instance or a fleet of them,
with its dashboard and alarms."""

from __future__ import annotations

import inspect
import json
from typing import Any

import jsii
from aws_cdk import (
    Acknowledgment,
    Aspects,
    CfnOutput,
    CfnResource,
    Duration,
    IAspect,
    SecretValue,
    Stack,
    Tags,
    Validations,
)
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_elasticloadbalancingv2_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_sns as sns

from constructs import Construct, IConstruct

from ..plan.engines import check_dlami_parameter
from ..plan.errors import ServingConfigError, problem
from ..plan.identifiers import utc_time_value
from ..plan.layout import ServingPlan, layout_document
from ..plan.performance import predict, prediction_document
from ..plan.phases import phase_minutes
from ..plan.timing import boot_minutes, longest_generation_seconds
from ..render.boot_options import ReadinessSignal, WarmPoolHook
from ..render.router import STREAM_TIMEOUT_SECONDS
from ..settings import SETTING_NAMES, StackSettings, settings_docstring
from ..settings.suggestions import unknown_problems
from .artifact_cache import NeuronArtifactCache
from .boot_script import NeuronBootScript
from .buckets import LOG_BUCKET_REASON, log_bucket
from .builder import NeuronExportBuilder
from .endpoint import NeuronServingEndpoint, OidcSignIn
from .fleet import CapacityBlock, NeuronServingFleet
from .instance import NeuronServingInstance, NeuronServingLaunchTemplate
from .machine_image import PinnedLinuxImage, neuron_dlami
from .monitoring import AlarmThresholds, NeuronServingMonitoring
from .scanners import LOG_GROUP_KEY_REASON, skip_checkov
from .serving_ami import NeuronServingAmi

VPC_CIDR = "10.0.0.0/16"
INSTANCE_ID = "NeuronServingInstance"
FLEET_ID = "NeuronServingFleet"
"""Logical ids of the signalled resources, known to the boot script before they exist."""
WARM_POOL_HOOK = "neuron-serving-launch"


class NeuronLlamaStack(Stack):
    """A VPC (or yours); one Neuron instance or an Auto Scaling fleet of them, each host running
    data-parallel TGI or vLLM replicas behind its on-host router; an S3 artifact cache so only the first
    host compiles; an ALB in front; and the hosts' logs, metrics, dashboard and alarms.

    ``NeuronLlamaStack(app, "Llama")`` builds the default stack. Every setting of
    :class:`StackSettings` is also a keyword argument here, with the same default; the other keyword
    arguments are ``Stack``'s (``env``, ``stack_name``, ``description``...).

    :param settings: all settings at once (see :class:`StackSettings`); keyword settings override
        its values. Default: the defaults.
    :param preset: a named configuration (:data:`neuron_serving.settings.PRESETS`) under the keyword
        settings. Default: none.
    :param vpc: an existing VPC with private subnets with egress (and public subnets when
        internet-facing). Default: the ``vpc_id`` setting's, else a new VPC over two AZs with one
        NAT gateway.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StackSettings | None = None,
        preset: str | None = None,
        vpc: ec2.IVpc | None = None,
        **kwargs: Any,
    ) -> None:
        settings = _settings(settings, preset, {k: kwargs.pop(k) for k in list(kwargs) if k in SETTING_NAMES})
        unknown = [k for k in kwargs if k not in _STACK_PROPS]
        if unknown:
            raise ServingConfigError(unknown_problems(unknown, kwargs, sorted(SETTING_NAMES | _STACK_PROPS)))
        if settings.name_prefix:
            # The organisation's prefix goes on every stack name, a given one too.
            name = kwargs.get("stack_name") or construct_id
            kwargs["stack_name"] = name if name.startswith(settings.name_prefix) else settings.name_prefix + name
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        self.plan: ServingPlan
        self.plan, self.layout_reason = settings.layout()
        given_vpc = vpc or self._imported_vpc()
        self.vpc = given_vpc or self._new_vpc()
        for key, value in settings.tags.items():
            Tags.of(self).add(key, value)

        secret = self._import_secret("HfToken", settings.hf_token_secret) if settings.hf_token_secret else None
        self.api_keys_secret: secretsmanager.ISecret | None = None
        """The endpoint's API keys, with ``api_keys``."""
        if settings.api_keys:
            self.api_keys_secret = (
                self._import_secret("ApiKeys", settings.api_keys_secret)
                if settings.api_keys_secret
                else secretsmanager.Secret(
                    self,
                    "ApiKeys",
                    # Fixed text: CloudFormation writes the initial value again whenever a property
                    # of this resource changes, which would drop every key added since.
                    description="API keys of a neuron-serving endpoint: a JSON object of key name to "
                    "sha256:<digest>; manage them with neuron-serving api-key",
                    secret_string_value=SecretValue.unsafe_plain_text("{}"),
                )
            )
        fleet = settings.fleet == "asg"
        # The ALB's access logs and the cache's S3 access logs share one bucket.
        self.logs_bucket = log_bucket(self, "Logs")
        self.monitoring = NeuronServingMonitoring(
            self,
            "Monitoring",
            log_retention_days=settings.log_retention_days,
            alarm_email=settings.alarm_email,
            alarm_topic=(sns.Topic.from_topic_arn(self, "AlarmTopic", settings.alarm_topic_arn)
                         if settings.alarm_topic_arn else None),
            thresholds=AlarmThresholds(
                error_rate_percent=settings.alarm_5xx_percent,
                p99_latency_seconds=settings.alarm_p99_latency_seconds,
                disk_percent=settings.alarm_disk_percent,
            ),
        )
        self.artifact_cache = (
            NeuronArtifactCache(self, "ArtifactCache", server_access_logs_bucket=self.logs_bucket)
            if settings.prebuilt_export is None
            else None
        )
        self.boot_script = NeuronBootScript(
            self,
            "BootScript",
            plan=self.plan,
            instance_types=settings.fleet_types if fleet else None,
            spec=settings.host(),
            hf_token_secret=secret,
            api_keys_secret=self.api_keys_secret,
            # Signed-in browsers pass a router that checks keys; without keys it checks nothing.
            load_balancer_authentication=bool(settings.oidc) and bool(settings.api_keys),
            artifact_cache=self.artifact_cache,
            compile_cache=settings.compile_cache,
            monitoring=self.monitoring,
            signal=ReadinessSignal(stack_name=self.stack_name, logical_id=FLEET_ID if fleet else INSTANCE_ID),
            warm_pool_hook=(
                WarmPoolHook(hook_name=WARM_POOL_HOOK, group_name=f"{self.stack_name}-{FLEET_ID}")
                if settings.warm_pool
                else None
            ),
            # Spot hosts drain on an interruption notice or their group's termination (its lifecycle hook).
            interruptions=fleet and settings.spot_percent > 0,
            group_name=f"{self.stack_name}-{FLEET_ID}" if fleet and settings.spot_percent > 0 else None,
            boot_timeout=(
                Duration.minutes(settings.boot_timeout_minutes)
                if settings.boot_timeout_minutes is not None
                else None
            ),
            root_volume_throughput=settings.root_volume_throughput,
            root_volume_iops=settings.root_volume_iops,
            boot_disk_minutes=settings.boot_disk_minutes,
        )
        dlami_parameter = settings.dlami_parameter or self.boot_script.serving_image.dlami_parameter
        if not settings.ami_id:
            check_dlami_parameter(self.boot_script.serving_image, dlami_parameter)
        machine_image = PinnedLinuxImage(settings.ami_id) if settings.ami_id else neuron_dlami(dlami_parameter)
        self.serving_ami: NeuronServingAmi | None = None
        """The serving AMI the stack builds (``serving_ami=build``), which every host launches."""
        if settings.serving_ami == "build":
            self.serving_ami = NeuronServingAmi(
                self, "ServingAmi", vpc=self.vpc, boot_script=self.boot_script, dlami_parameter=dlami_parameter,
                root_volume_gib=min(p.root_volume_gib for p in (self.plan, settings.builder) if p is not None))
            machine_image = self.serving_ami.machine_image
        self.export_builder: NeuronExportBuilder | None = None
        """The one-off instance that exports for hosts too small to compile (``builder_instance_type``)."""
        if settings.builder is not None and self.artifact_cache is not None:
            self.export_builder = NeuronExportBuilder(
                self, "ExportBuilder", vpc=self.vpc, plan=settings.builder, artifact_cache=self.artifact_cache,
                machine_image=machine_image, spec=settings.host(), hf_token_secret=secret,
                compile_cache=settings.compile_cache, root_volume_throughput=settings.root_volume_throughput,
                root_volume_iops=settings.root_volume_iops, boot_disk_minutes=settings.boot_disk_minutes,
            )
        self.launch_template = NeuronServingLaunchTemplate(
            self, "Host", vpc=self.vpc, boot_script=self.boot_script, machine_image=machine_image
        )
        certificate = (
            elbv2.ListenerCertificate.from_arn(settings.certificate_arn) if settings.certificate_arn else None
        )
        # Non-streamed requests send nothing until the whole generation is done, and a host
        # leaving the target group keeps its in-flight generations: both timeouts cover the
        # longest generation the shapes allow (the idle timeout within the router's own).
        longest = longest_generation_seconds(self.plan)
        self.endpoint = NeuronServingEndpoint(
            self,
            "Endpoint",
            vpc=self.vpc,
            target_port=self.plan.router_port,
            internet_facing=settings.internet_facing,
            allowed_cidrs=settings.allowed_cidrs or self._default_cidrs(given_vpc),
            certificate=certificate,
            oidc=self._oidc(),
            api_keys=bool(settings.api_keys),
            rate_limit=settings.rate_limit,
            idle_timeout=Duration.seconds(min(max(longest, 300), STREAM_TIMEOUT_SECONDS)),
            deregistration_delay=Duration.seconds(min(max(longest, 300), 3600)),
            access_logs_bucket=self.logs_bucket,
        )
        self.instance: NeuronServingInstance | None = None
        self.fleet: NeuronServingFleet | None = None
        if fleet:
            capacity = settings.capacity()
            self.fleet = NeuronServingFleet(
                self,
                "Fleet",
                vpc=self.vpc,
                launch_template=self.launch_template,
                # The settings' sizes, raised to the instance count objective=goodput chose.
                min_capacity=capacity[0],
                max_capacity=capacity[1],
                desired_capacity=capacity[2],
                spot_percent=settings.spot_percent,
                on_demand_base_capacity=settings.on_demand_base_capacity,
                capacity_reservations=settings.capacity_reservations,
                capacity_reservation_preference=settings.capacity_reservation_preference,
                capacity_block=CapacityBlock(
                    settings.capacity_block, settings.capacity_block_zone or "",
                    utc_time_value(settings.capacity_block_end),
                ) if settings.capacity_block and settings.capacity_block_end else None,
            )
            self.endpoint.add_target(self.fleet.auto_scaling_group, self.fleet)
            if settings.target_requests_per_minute is not None:
                self.fleet.scale_on_requests(settings.target_requests_per_minute)
            else:
                self.fleet.scale_on_in_flight_requests(self.monitoring, settings.target_in_flight_requests)
            # Settings give both schedules or neither.
            if settings.scale_down_schedule and settings.scale_up_schedule:
                self.fleet.scale_on_schedule(
                    scale_down=settings.scale_down_schedule, scale_up=settings.scale_up_schedule
                )
        else:
            self.instance = NeuronServingInstance(
                self, "Instance", vpc=self.vpc, launch_template=self.launch_template
            )
            self.endpoint.add_target(
                targets.InstanceIdTarget(self.instance.instance_id, self.plan.router_port), self.instance
            )
        self.monitoring.watch(
            plan=self.plan,
            engine=self.boot_script.engine,
            endpoint_load_balancer=self.endpoint.load_balancer,
            target_group=self.endpoint.target_group,
            desired_capacity=self.fleet.metric_desired_capacity() if self.fleet is not None else None,
            launch_shortfall=self.fleet.metric_launch_shortfall() if self.fleet is not None else None,
            capacity_reservations=(*settings.capacity_reservations,
                                   *([settings.capacity_block] if settings.capacity_block else [])),
            boot_minutes=boot_minutes(self.plan, throughput=self.boot_script.root_volume.throughput, exports=False),
            api_keys=self.api_keys_secret is not None,
            publishes_exports=self.boot_script.publishes_exports,
        )
        if settings.permissions_boundary:
            boundary = settings.permissions_boundary
            iam.PermissionsBoundary.of(self).apply(
                iam.ManagedPolicy.from_managed_policy_arn(self, "PermissionsBoundary", boundary)
                if boundary.startswith("arn:")
                else iam.ManagedPolicy.from_managed_policy_name(self, "PermissionsBoundary", boundary)
            )
        if settings.role_path:
            Aspects.of(self).add(RolePath(settings.role_path))
        self._outputs()
        self._acknowledge()

    def _import_secret(self, construct_id: str, name_or_arn: str) -> secretsmanager.ISecret:
        if name_or_arn.startswith("arn:"):
            return secretsmanager.Secret.from_secret_complete_arn(self, construct_id, name_or_arn)
        return secretsmanager.Secret.from_secret_name_v2(self, construct_id, name_or_arn)

    def _oidc(self) -> OidcSignIn | None:
        oidc = self.settings.oidc
        if not oidc:
            return None
        return OidcSignIn(
            issuer=oidc["issuer"],
            client_id=oidc["client_id"],
            client_secret=SecretValue.secrets_manager(oidc["client_secret"]),
            authorization_endpoint=oidc["authorization_endpoint"],
            token_endpoint=oidc["token_endpoint"],
            user_info_endpoint=oidc["user_info_endpoint"],
            scope=oidc.get("scope", "openid"),
        )

    def _default_cidrs(self, given_vpc: ec2.IVpc | None) -> tuple[str, ...]:
        # Internal endpoints default to the stack's own VPC (a literal CIDR, which cdk-nag can
        # check); internet-facing ones get no default at all: the endpoint construct refuses them.
        if self.settings.internet_facing or given_vpc is not None:
            return ()
        return (VPC_CIDR,)

    def _imported_vpc(self) -> ec2.IVpc | None:
        """The ``vpc_id`` setting's VPC, imported from its attributes (a lookup would need credentials
        at synth)."""
        settings = self.settings
        if settings.vpc_id is None:
            return None
        return ec2.Vpc.from_vpc_attributes(
            self, "Vpc", vpc_id=settings.vpc_id, availability_zones=list(settings.availability_zones),
            private_subnet_ids=list(settings.private_subnet_ids),
            public_subnet_ids=list(settings.public_subnet_ids) or None,
        )

    def _new_vpc(self) -> ec2.Vpc:
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH)
        skip_checkov(flow_logs, "CKV_AWS_158", LOG_GROUP_KEY_REASON)
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(VPC_CIDR),
            # The zones given (those that offer the fleet's types, or a Capacity Block's), else two.
            availability_zones=list(self.settings.availability_zones) or None,
            max_azs=None if self.settings.availability_zones else 2,
            nat_gateways=1,
            # S3 (the artifact and compile caches, the boot bundle, ECR's layers) at the instance's
            # bandwidth instead of the NAT gateway's 5 Gbps, and without its per-gigabyte charge:
            # a gateway endpoint has no charge of its own (Amazon VPC user guide, "Gateway endpoints").
            gateway_endpoints={"S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=22
                ),
            ],
            flow_logs={
                "All": ec2.FlowLogOptions(
                    destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
                    traffic_type=ec2.FlowLogTrafficType.REJECT,
                )
            },
        )
        # aws-cdk-lib's provider for restricting the default security group (a recommended
        # feature flag) states a DependsOn that its GetAtt already implies; cfn-lint warns
        # (W3005) on code that is not ours. Silence that one check on that one resource.
        provider = self.node.try_find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
        handler = provider.node.try_find_child("Handler") if provider else None
        if isinstance(handler, CfnResource):
            handler.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})
            for check, reason in (
                ("CKV_AWS_115", "aws-cdk-lib's deploy-time handler, invoked only by CloudFormation, once per "
                 "deployment: no concurrency to reserve"),
                ("CKV_AWS_116", "Invoked synchronously by CloudFormation, which reports its failures in the stack "
                 "events: a dead-letter queue would never receive an event"),
                ("CKV_AWS_117", "Calls only the EC2 API, at deploy time: in a VPC it would need a NAT route to "
                 "reach it and protect nothing"),
            ):
                skip_checkov(handler, check, reason)
        if self.settings.availability_zones:
            # cfn-lint warns on every subnet of a named zone (W3010, "Avoid hardcoding availability zones"):
            # these are the zones the user chose, for the types they offer or a Capacity Block's zone.
            for subnet in [*vpc.public_subnets, *vpc.private_subnets]:
                cfn_subnet = subnet.node.default_child
                assert isinstance(cfn_subnet, CfnResource)
                cfn_subnet.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})
        return vpc

    def _outputs(self) -> None:
        plan, engine, image = self.plan, self.boot_script.engine, self.boot_script.serving_image
        CfnOutput(self, "EndpointUrl", value=self.endpoint.url,
                  description=f"Base URL of the {engine.title} API: {', '.join(engine.api_routes)}")
        layouts = self.boot_script.layouts
        CfnOutput(self, "ReplicaCount", value=str(len(plan.replicas)),
                  description=f"{engine.title} replicas per instance" + (
                      f" of {plan.instance.name} (ReplicasByInstanceType has each type's)" if len(layouts) > 1 else ""))
        if len(layouts) > 1:
            CfnOutput(self, "ReplicasByInstanceType",
                      value=json.dumps({p.instance.name: len(p.replicas) for p in layouts}),
                      description=f"{engine.title} replicas per instance, by each instance type the fleet may launch")
        CfnOutput(self, "ServingImage", value=image.reference, description=f"The {engine.title} image: "
                  f"{image.export.title}, Neuron SDK {image.neuron_sdk}")
        CfnOutput(self, "CoresPerReplica", value=str(plan.degree), description="Tensor-parallel degree")
        CfnOutput(
            self,
            "ServingLayout",
            value=" | ".join(f"{p.instance.name} {p.model_id}: {p.describe()}" for p in layouts),
            description="Each replica's Neuron devices, cores and host port",
        )
        # What `neuron-serving status`, `logs` and `smoke` read (neuron_serving/ops): the engine (its
        # routes), the target group (its health), the router's port (Session Manager forwarding to a
        # host) and each boot phase's estimate.
        CfnOutput(self, "Engine", value=engine.name, description="The serving engine")
        CfnOutput(self, "TargetGroupArn", value=self.endpoint.target_group.target_group_arn,
                  description="The load balancer's target group of the hosts' routers")
        CfnOutput(self, "RouterPort", value=str(plan.router_port), description="Each host's router port")
        phases = phase_minutes(plan, self.boot_script.root_volume.throughput)
        CfnOutput(self, "BootPhaseMinutes", value=json.dumps(phases, sort_keys=True),
                  description="Estimated minutes of the boot's phases (neuron_serving.plan.phases)")
        # What `neuron-serving bench --stack` compares its measurements with: the layout, and the
        # performance model's predictions for it.
        CfnOutput(self, "ServingPlan", value=json.dumps(layout_document(plan), sort_keys=True),
                  description=f"The layout ({self.layout_reason})")
        CfnOutput(self, "PredictedPerformance",
                  value=json.dumps(prediction_document(predict(plan, self.settings.workload)), sort_keys=True),
                  description=f"The performance model's predictions for {self.settings.workload.input_tokens} "
                  f"input and {self.settings.workload.output_tokens} output tokens per request")
        if self.api_keys_secret is not None:
            CfnOutput(self, "ApiKeysSecretArn", value=self.api_keys_secret.secret_arn,
                      description="The API keys' secret: neuron-serving api-key create <name> --stack "
                      f"{self.stack_name} prints a new key once; clients send Authorization: Bearer <key>")
        if self.instance is not None:
            CfnOutput(
                self,
                "InstanceId",
                value=self.instance.instance_id,
                description="aws ssm start-session --target <this id>",
            )
        if self.fleet is not None:
            CfnOutput(
                self,
                "AutoScalingGroupName",
                value=self.fleet.auto_scaling_group.auto_scaling_group_name,
                description="The fleet; its instances accept aws ssm start-session",
            )

    def _acknowledge(self) -> None:
        if isinstance(self.api_keys_secret, secretsmanager.Secret):
            Validations.of(self.api_keys_secret).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-SMG4",
                    reason="The secret holds digests of keys only their clients know; operators rotate a key with "
                    "neuron-serving api-key rotate, which a rotation function could not do for them",
                )
            )
        if self.instance is not None:
            Validations.of(self.instance).acknowledge(
                Acknowledgment(
                    id="AwsSolutions-EC29",
                    reason="CloudFormation replaces the instance when the model or layout changes; "
                    "termination protection would block that",
                )
            )
        if self.artifact_cache is None:
            # cdk-nag takes a bucket that receives S3 access logs for a log bucket; without the cache
            # this one receives only the load balancer's.
            Validations.of(self.logs_bucket).acknowledge(Acknowledgment(id="AwsSolutions-S1",
                                                                        reason=LOG_BUCKET_REASON))
        if isinstance(self.api_keys_secret, secretsmanager.Secret):
            skip_checkov(self.api_keys_secret, "CKV_AWS_149", "Holds digests of the API keys, never a key: "
                         "Secrets Manager's AWS managed key encrypts it, and a customer managed key would add "
                         "a key policy to maintain without protecting anything a digest reveals")


_STACK_PROPS = frozenset(inspect.signature(Stack.__init__).parameters) - {"self", "scope", "id"}
"""``Stack``'s own keyword arguments (``env``, ``stack_name``...); ``tags`` and ``permissions_boundary``
are also settings, which take them."""


def _settings(settings: StackSettings | None, preset: str | None, given: dict[str, Any]) -> StackSettings:
    if preset is not None:
        if settings is not None:
            raise ServingConfigError([problem("preset", preset, "cannot be combined with settings: pass the "
                                              "preset's overrides as keyword arguments instead")])
        return StackSettings.from_preset(preset, **given)
    if settings is None:
        return StackSettings(**given)
    return settings.replace(**given) if given else settings


NeuronLlamaStack.__doc__ = (NeuronLlamaStack.__doc__ or "") + "\n" + settings_docstring() + "\n"


@jsii.implements(IAspect)
class RolePath:
    """Puts every IAM role of a scope under one path, including those of aws-cdk-lib's own
    custom resource providers (plain ``AWS::IAM::Role`` resources)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def visit(self, node: IConstruct) -> None:
        if isinstance(node, iam.CfnRole):
            node.path = self.path
        elif isinstance(node, CfnResource) and node.cfn_resource_type == "AWS::IAM::Role":
            node.add_property_override("Path", self.path)
