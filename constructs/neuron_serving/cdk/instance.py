"""One Neuron instance from a launch template, running the boot scripts."""

from __future__ import annotations

import jsii
from aws_cdk import Acknowledgment, CfnCreationPolicy, CfnResourceSignal, Duration, Stack, Tags, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam

from constructs import Construct

from ..plan.errors import ServingConfigError, problem
from ..plan.layout import ServingPlan
from .boot_script import NeuronBootScript
from .scanners import acknowledge_any_resource, nag_arn
from .validation import check_props

SESSION_MANAGER_ACTIONS = (
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)
"""Session Manager's channels, which name no resource (AWS Systems Manager user guide, "Step 2:
Verify or add instance permissions for Session Manager", awsdocs/aws-systems-manager-user-guide
doc_source/getting-started-create-iam-instance-profile.md: the minimal instance profile policy,
without session logging to S3 or KMS-encrypted sessions). tests/cdk/test_security.py checks every
host action against the Service Authorization Reference."""


@jsii.implements(ec2.IConnectable, iam.IGrantable)
class NeuronServingLaunchTemplate(Construct):
    """The launch template every Neuron serving host starts from: the single instance here, the
    Auto Scaling fleet later.

    Secure by default: IMDSv2 only with a hop limit of 1 (the containers cannot reach instance
    credentials), an encrypted gp3 root volume, Session Manager access, no key pair and no
    inbound rule of its own.

    The role gets what Session Manager needs and nothing more: ``ssm:UpdateInstanceInformation``
    on instances of the stack's account and region, and the four ``ssmmessages`` channel
    actions. Not the AWS-managed ``AmazonSSMManagedInstanceCore``, which also lets the host read
    every Parameter Store parameter of the account (``ssm:GetParameter`` and
    ``ssm:GetParameters`` on ``*``), fetch SSM documents and report inventory and patches; Run
    Command and State Manager therefore do not reach these hosts.

    :param vpc: the VPC of the security group.
    :param boot_script: the user data and the plan it realises. The launch template holds the
        stack's values the user data reads at boot, in its metadata (``NeuronBootScript.attach``).
    :param machine_image: the AMI. Use ``neuron_dlami(...)`` or ``PinnedLinuxImage``.
    :param root_volume_gib: root volume size. Default: ``plan.root_volume_gib``, sized for the
        image, the weights and the export (at least 512 on trn1). The volume's throughput and IOPS
        are the boot script's (``root_volume_throughput``, ``root_volume_iops``), which its
        readiness limit allows for; the IOPS may be at most 500 per GiB of this size.
    :param security_group: Default: a new group allowing all outbound traffic (image and model
        downloads) and no inbound traffic.
    :param role: Default: a new role with Session Manager access and what the boot script needs.
    :param session_manager: grant the role what Session Manager sessions need. Default: true.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        boot_script: NeuronBootScript,
        machine_image: ec2.IMachineImage,
        root_volume_gib: int | None = None,
        security_group: ec2.ISecurityGroup | None = None,
        role: iam.IRole | None = None,
        session_manager: bool = True,
    ) -> None:
        super().__init__(scope, construct_id)
        plan = boot_script.plan
        size = plan.root_volume_gib if root_volume_gib is None else root_volume_gib

        def size_problems(gib: int) -> list[str]:
            if gib < plan.instance.min_root_volume_gib or gib < 1:
                least = max(1, plan.instance.min_root_volume_gib)
                return [problem("root_volume_gib", gib, f"must be at least {least} on {plan.instance.name}")]
            too_many = boot_script.root_volume.size_problem(gib)
            return [] if too_many is None else [too_many]

        if problems := check_props(self, [size], size_problems):
            raise ServingConfigError(problems)
        volume = boot_script.root_volume
        self.plan: ServingPlan = plan
        self.boot_script = boot_script
        self.role: iam.IRole = role or iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description=f"Neuron serving host ({plan.instance.name}, {plan.model_id})",
        )
        if session_manager:
            stack = Stack.of(self)
            self.role.add_to_principal_policy(iam.PolicyStatement(
                actions=["ssm:UpdateInstanceInformation"],
                resources=[stack.format_arn(service="ec2", resource="instance", resource_name="*")],
            ))
            self.role.add_to_principal_policy(iam.PolicyStatement(actions=list(SESSION_MANAGER_ACTIONS),
                                                                  resources=["*"]))
            acknowledge_any_resource(stack, "Session Manager's ssmmessages channel actions name no resource "
                                     "type (Service Authorization Reference, Amazon Message Gateway Service)")
            Validations.of(stack).acknowledge(
                Acknowledgment(
                    id=f"AwsSolutions-IAM5[Resource::{nag_arn(stack, 'ec2', 'instance/*')}]",
                    reason="The SSM agent registers the instance it runs on, whose id is assigned at launch",
                ),
            )
        boot_script.grant_boot(self.role)
        self.security_group: ec2.ISecurityGroup = security_group or ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Neuron serving hosts: inbound only from the load balancer",
            allow_all_outbound=True,
        )
        self.connections = ec2.Connections(security_groups=[self.security_group])
        self.launch_template = ec2.LaunchTemplate(
            self,
            "Resource",
            instance_type=ec2.InstanceType(plan.instance.name),
            machine_image=machine_image,
            user_data=boot_script.user_data,
            role=self.role,
            security_group=self.security_group,
            require_imdsv2=True,
            http_put_response_hop_limit=1,
            detailed_monitoring=True,
            block_devices=[
                ec2.BlockDevice(
                    device_name="/dev/sda1",
                    volume=ec2.BlockDeviceVolume.ebs(
                        size,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        throughput=volume.throughput,
                        iops=volume.iops,
                        encrypted=True,
                        delete_on_termination=True,
                    ),
                )
            ],
        )
        self.root_volume_gib = size
        # The stack's values the user data reads at boot are in this launch template's metadata.
        boot_script.attach(self.launch_template.node.default_child)  # type: ignore[arg-type]

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self.role

    def launch_into_capacity_block(self, reservation_id: str) -> None:
        """Launch every host into the Capacity Block for ML ``reservation_id``: the launch template's market
        type ``capacity-block`` and its reservation as the target, as the Auto Scaling user guide asks of a
        group that uses a Capacity Block ("Use Capacity Blocks for machine learning workloads";
        LaunchTemplateData InstanceMarketOptions.MarketType and CapacityReservationSpecification, CloudFormation
        resource reference, AWS::EC2::LaunchTemplate)."""
        cfn = self.launch_template.node.default_child
        assert isinstance(cfn, ec2.CfnLaunchTemplate)
        cfn.add_property_override("LaunchTemplateData.InstanceMarketOptions.MarketType", "capacity-block")
        cfn.add_property_override(
            "LaunchTemplateData.CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId",
            reservation_id)


@jsii.implements(ec2.IConnectable, iam.IGrantable)
class NeuronServingInstance(Construct):
    """A single Neuron serving instance launched from a :class:`NeuronServingLaunchTemplate`.

    A change to the plan, the image or the AMI creates a new launch template version, and
    CloudFormation replaces the instance.

    :param vpc: the VPC to launch into.
    :param launch_template: the host definition.
    :param vpc_subnets: where to launch; the first selected subnet is used. Not every AZ offers
        every Neuron type: pick the subnet of one that does. Default: private subnets with egress.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        launch_template: NeuronServingLaunchTemplate,
        vpc_subnets: ec2.SubnetSelection | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        selection = vpc_subnets or ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        subnets = vpc.select_subnets(
            availability_zones=selection.availability_zones,
            one_per_az=selection.one_per_az,
            subnet_filters=selection.subnet_filters,
            subnet_group_name=selection.subnet_group_name,
            subnets=selection.subnets,
            subnet_type=selection.subnet_type,
        ).subnet_ids
        if not subnets:
            raise ServingConfigError(
                [problem("vpc_subnets", vpc_subnets, "selects no subnet to launch the Neuron instance into")]
            )
        if len(launch_template.boot_script.layouts) > 1:
            raise ServingConfigError([problem(
                "launch_template", launch_template.node.path, "has a boot script for several instance types ("
                + ", ".join(p.instance.name for p in launch_template.boot_script.layouts)
                + "): a single instance is of one type; launch several types with NeuronServingFleet")])
        self.launch_template = launch_template
        self.plan = launch_template.plan
        self.role = launch_template.role
        self.connections = launch_template.connections
        template = launch_template.launch_template
        self.instance = ec2.CfnInstance(
            self,
            "Resource",
            launch_template=ec2.CfnInstance.LaunchTemplateSpecificationProperty(
                launch_template_id=template.launch_template_id,
                version=template.latest_version_number,
            ),
            subnet_id=subnets[0],
            monitoring=True,
        )
        boot_script = launch_template.boot_script
        if boot_script.signal is not None:
            # The boot script signals this logical id once every replica serves, or with the
            # reason of a failed boot, so a deployment fails in minutes instead of at timeout.
            self.instance.override_logical_id(boot_script.signal.logical_id)
            self.instance.cfn_options.creation_policy = CfnCreationPolicy(
                resource_signal=CfnResourceSignal(count=1, timeout=_iso_minutes(boot_script.boot_timeout))
            )
        Tags.of(self.instance).add("Name", f"{self.node.path} ({self.plan.instance.name})")
        self.instance_id: str = self.instance.ref

    @property
    def grant_principal(self) -> iam.IPrincipal:
        return self.role



def _iso_minutes(duration: Duration) -> str:
    return f"PT{int(duration.to_minutes())}M"
