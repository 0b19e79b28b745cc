"""NeuronExportBuilder: a one-off instance that exports a model into the artifact cache for serving
hosts too small to compile it, then leaves."""

from __future__ import annotations

import jsii
from aws_cdk import Acknowledgment, ArnFormat, Stack, Validations
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager

from constructs import Construct

from ..plan.host import HostSpec, resolve_host
from ..plan.layout import ServingPlan
from ..plan.volume import DEFAULT_DISK_MINUTES
from .artifact_cache import NeuronArtifactCache
from .boot_script import NeuronBootScript
from .instance import NeuronServingLaunchTemplate
from .scanners import nag_arn


@jsii.implements(iam.IGrantable)
class NeuronExportBuilder(Construct):
    """Exports ``plan``'s model once into ``artifact_cache`` on an instance that can compile it, for
    serving hosts whose boot scripts wait for it (``export_role="wait"``) and never compile.

    The builder is an Auto Scaling group of at most one instance, which starts with one. Its boot
    script (``export_role="build"``) exports, or finds the export already in the cache, publishes
    it, then leaves the group with ``TerminateInstanceInAutoScalingGroup`` and
    ``ShouldDecrementDesiredCapacity``, so nothing replaces it and EC2 terminates it. If the export
    fails, it writes the reason to ``<cache>/<key>/FAILED`` first: the waiting hosts fail at once
    with it.

    A group rather than a plain instance, because CloudFormation keeps no terminated instance in
    working order: a later update of one (its tags, say) fails once EC2 has forgotten it. A group
    outlives its instances. A stack update that changes the group sets its desired capacity back
    to one; the new builder finds the export in the cache and leaves within minutes. A change of
    the export (model, image, shapes) changes the launch template, so a builder always runs for a
    new export.

    :param vpc: where the builder runs (private subnets with egress: it pulls the image and the
        checkpoint).
    :param plan: the serving plan laid out on the builder's instance type
        (:func:`~neuron_serving.plan.layout.builder_plan`): same export, the builder's devices.
    :param artifact_cache: where the export goes, and where the serving hosts look.
    :param machine_image: the serving hosts' AMI (the same Neuron driver).
    :param spec: the serving hosts' spec (:class:`~neuron_serving.plan.host.HostSpec`): the builder's
        is derived from it (:meth:`~neuron_serving.plan.host.HostSpec.for_builder`), so it exports
        with the same engine, image, registry and revision, under the same export key.
        Default: ``resolve_host(plan)``.
    :param hf_token_secret: for gated models. Default: none.
    :param root_volume_throughput: the builder's gp3 root volume throughput, MiB/s (see
        :class:`NeuronBootScript`). Default: enough to read the weights in 5 minutes.
    :param root_volume_iops: the builder's root volume IOPS. Default: enough for the throughput.
    :param boot_disk_minutes: sizes the builder's root volume (``NeuronBootScript``'s). Default: 3.
    :param compile_cache: keep and reuse compiled graphs in the artifact cache's bucket
        (``NeuronBootScript``'s ``compile_cache``). Default: true.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        plan: ServingPlan,
        artifact_cache: NeuronArtifactCache,
        machine_image: ec2.IMachineImage,
        spec: HostSpec | None = None,
        hf_token_secret: secretsmanager.ISecret | None = None,
        root_volume_throughput: int | None = None,
        root_volume_iops: int | None = None,
        compile_cache: bool = True,
        boot_disk_minutes: float = DEFAULT_DISK_MINUTES,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.plan = plan
        self.boot_script = NeuronBootScript(
            self, "BootScript", plan=plan, spec=(spec or resolve_host(plan)).for_builder(),
            hf_token_secret=hf_token_secret, artifact_cache=artifact_cache, compile_cache=compile_cache,
            root_volume_throughput=root_volume_throughput, root_volume_iops=root_volume_iops,
            boot_disk_minutes=boot_disk_minutes,
        )
        self.launch_template = NeuronServingLaunchTemplate(
            self, "Host", vpc=vpc, boot_script=self.boot_script, machine_image=machine_image,
        )
        self.role = self.launch_template.role
        # The group's name is in the builder's permission to leave it, so it is fixed before it exists.
        self.group_name = f"{stack.stack_name}-{self.node.id}"[:255]
        self.auto_scaling_group = autoscaling.AutoScalingGroup(
            self, "Group", vpc=vpc, launch_template=self.launch_template.launch_template,
            auto_scaling_group_name=self.group_name, min_capacity=0, max_capacity=1, desired_capacity=1,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
        )
        group_arn = stack.format_arn(
            service="autoscaling", resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{self.group_name}", arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role.add_to_principal_policy(iam.PolicyStatement(
            actions=["autoscaling:TerminateInstanceInAutoScalingGroup"], resources=[group_arn],
        ))
        shown = nag_arn(stack, "autoscaling", f"autoScalingGroup:*:autoScalingGroupName/{self.group_name}")
        Validations.of(stack).acknowledge(
            Acknowledgment(
                id=f"AwsSolutions-IAM5[Resource::{shown}]",
                reason="a group's id is assigned at creation; the resource names the builder's one group by name",
            ),
        )
        Validations.of(self.auto_scaling_group).acknowledge(
            Acknowledgment(
                id="AwsSolutions-AS3",
                reason="the builder's group launches one instance, which ends itself; its outcome reaches the serving "
                "hosts through the artifact cache (COMPLETE or FAILED) and its boot log",
            ),
        )

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self.role
