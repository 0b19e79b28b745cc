"""A serving AMI the stack builds: the Neuron DLAMI with the hosts' tools installed and the serving image
pulled, by EC2 Image Builder on a small build instance (``serving_ami=build``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_imagebuilder as imagebuilder

from constructs import Construct

from ..plan.errors import ServingConfigError, problem
from .boot_script import NeuronBootScript
from .machine_image import PinnedLinuxImage

BUILD_INSTANCE_TYPE = "m6i.large"
"""The build instance: the bake needs no Neuron device, only the DLAMI's architecture (x86_64), room for the
serving image and a network to pull it (m6i.large: 2 vCPUs, 8 GiB, up to 12.5 Gbps; about $0.10 an hour on
demand in us-east-1, against $0.76 for the smallest inf2)."""

BUILD_TIMEOUT_MINUTES = 120
"""How long Image Builder may take for the build and its checks (``ImageTestsConfiguration.TimeoutMinutes``
bounds the tests; the build's own steps are bounded by ``timeoutSeconds`` in the component document)."""

BAKE_TIMEOUT_SECONDS = 3600
"""The bake step's limit (the component document's ``timeoutSeconds``): installing the tools and pulling an
image of about 10 GB, with the pull's retries."""

NAME_LIMIT = 128
"""The longest name of an Image Builder component or recipe (``Name``, 1 to 128 characters: CreateComponent and
CreateImageRecipe, EC2 Image Builder API reference)."""

DEVICE = "/dev/sda1"
"""The root device of the Ubuntu DLAMIs, as the hosts' launch template names it."""


def bake_document(bake_script: str, image: str) -> str:
    """The Image Builder component document (schema 1.0, "Use documents to build components", EC2 Image
    Builder user guide) that runs ``bake_script`` in its build phase and checks that the image is there,
    HAProxy installed and docker enabled, as the hosts' boot expects to find them: in its validate phase, on
    the build instance, and in its test phase, on an instance launched from the new AMI. JSON, which is
    YAML too."""
    check = ("set -eu\n"
             f"docker image inspect {json.dumps(image)} >/dev/null\n"
             "command -v haproxy >/dev/null\n"
             "systemctl is-enabled docker\n")
    document = {
        "name": "neuron-serving-bake",
        "description": "The serving hosts' tools and image, by their boot's own steps (userdata/bake.sh.j2)",
        "schemaVersion": 1.0,
        "phases": [
            {"name": "build", "steps": [{"name": "Bake", "action": "ExecuteBash",
                                         "timeoutSeconds": BAKE_TIMEOUT_SECONDS,
                                         "inputs": {"commands": [bake_script]}}]},
            *({"name": phase, "steps": [{"name": "Check", "action": "ExecuteBash", "inputs": {"commands": [check]}}]}
              for phase in ("validate", "test")),
        ],
    }
    return json.dumps(document, indent=1)


class NeuronServingAmi(Construct):
    """A serving AMI, built once per change of what it bakes: the hosts' DLAMI (its public SSM parameter,
    resolved by Image Builder when the build starts: ``ssm:`` parent image, ``CreateImageRecipe``,
    EC2 Image Builder API reference) with :attr:`NeuronBootScript.bake_script` run on it, on a
    :data:`BUILD_INSTANCE_TYPE` in the VPC's private subnets (which reach the registries through the NAT
    gateway, as the hosts do). CloudFormation waits for the build (``AWS::ImageBuilder::Image``) and the
    hosts launch :attr:`machine_image`.

    Each change of the bake (the image, the registry, the tools' steps) or of the parent parameter makes a
    component and a recipe of new names, so the build runs again; a newer DLAMI behind the same parameter
    does not, until then. A host still runs the baked steps at boot: they find the tools and the image
    there and cost seconds.

    :param vpc: where the build instance runs: one of its private subnets.
    :param boot_script: the hosts' boot, whose bake this builds and whose registry grants it pulls with.
    :param dlami_parameter: the public SSM parameter of the DLAMI to build from.
    :param root_volume_gib: the build's root volume, and so the AMI's smallest: at most the hosts' own.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, boot_script: NeuronBootScript,
                 dlami_parameter: str, root_volume_gib: int) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self, "BuildRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="The serving AMI's build instance: Image Builder's agent and the image's pull",
            # What an Image Builder build instance needs: Systems Manager runs the component's steps through
            # the SSM agent, and the instance reports to Image Builder (EC2 Image Builder user guide,
            # "Prerequisites": the instance profile's two managed policies).
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore"),
                iam.ManagedPolicy.from_aws_managed_policy_name("EC2InstanceProfileForImageBuilder"),
            ],
        )
        Validations.of(self.role).acknowledge(*(Acknowledgment(
            id=f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{policy}]",
            reason="Image Builder's build instance needs the two managed policies its user guide names "
                   "(Prerequisites): AmazonSSMManagedInstanceCore and EC2InstanceProfileForImageBuilder")
            for policy in ("AmazonSSMManagedInstanceCore", "EC2InstanceProfileForImageBuilder")))
        boot_script.grant_bake(self.role)
        profile = iam.CfnInstanceProfile(self, "BuildProfile", roles=[self.role.role_name])
        self.security_group = ec2.SecurityGroup(
            self, "BuildSecurityGroup", vpc=vpc, allow_all_outbound=True,
            description="Serving AMI build instance: no inbound, outbound to the registries and AWS")
        subnet = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets[0]
        document = bake_document(boot_script.bake_script, boot_script.spec.pulled)
        component_props: dict[str, Any] = {
            "platform": "Linux", "version": "1.0.0", "data": document,
            "description": "Installs the serving hosts' tools and pulls their image (neuron-serving)"}
        volume: dict[str, Any] = {
            "volume_size": root_volume_gib, "volume_type": "gp3", "encrypted": True, "delete_on_termination": True}
        recipe_props: dict[str, Any] = {
            "version": "1.0.0", "parent_image": f"ssm:{dlami_parameter}",
            "description": "The Neuron DLAMI with the serving hosts' tools and image"}
        # Image Builder's components and recipes are immutable: a change of any of their properties replaces
        # them ("Update requires: Replacement", AWS::ImageBuilder::Component and ::ImageRecipe), and a
        # replacement under the same name and version fails. So their name carries a hash of all of them.
        digest = hashlib.sha256(json.dumps([component_props, recipe_props, DEVICE, volume],
                                           sort_keys=True).encode()).hexdigest()[:12]
        name = f"{stack.stack_name}-serving-{digest}"
        if len(name) > NAME_LIMIT:
            raise ServingConfigError([problem(
                "stack_name", stack.stack_name, f"must be at most {NAME_LIMIT - len(name) + len(stack.stack_name)} "
                f"characters with serving_ami=build: the AMI's component and recipe are named after it, in at most "
                f"{NAME_LIMIT} characters")])
        component = imagebuilder.CfnComponent(self, "Bake", name=name, **component_props)
        recipe = imagebuilder.CfnImageRecipe(
            self, "Recipe", name=name, **recipe_props,
            components=[imagebuilder.CfnImageRecipe.ComponentConfigurationProperty(component_arn=component.attr_arn)],
            block_device_mappings=[imagebuilder.CfnImageRecipe.InstanceBlockDeviceMappingProperty(
                device_name=DEVICE, ebs=imagebuilder.CfnImageRecipe.EbsInstanceBlockDeviceSpecificationProperty(
                    **volume))])
        infrastructure = imagebuilder.CfnInfrastructureConfiguration(
            self, "Infrastructure", name=f"{stack.stack_name}-serving-ami",
            instance_profile_name=profile.ref, instance_types=[BUILD_INSTANCE_TYPE],
            subnet_id=subnet.subnet_id, security_group_ids=[self.security_group.security_group_id],
            terminate_instance_on_failure=True,
            instance_metadata_options=imagebuilder.CfnInfrastructureConfiguration.InstanceMetadataOptionsProperty(
                http_tokens="required", http_put_response_hop_limit=2),
            description="The serving AMI's build: a small instance in a private subnet")
        self.image = imagebuilder.CfnImage(
            self, "Image", image_recipe_arn=recipe.attr_arn,
            infrastructure_configuration_arn=infrastructure.attr_arn,
            enhanced_image_metadata_enabled=True,
            image_tests_configuration=imagebuilder.CfnImage.ImageTestsConfigurationProperty(
                image_tests_enabled=True, timeout_minutes=BUILD_TIMEOUT_MINUTES))
        # The build pulls with the role's policy (grant_bake), which the instance profile does not wait for.
        self.image.node.add_dependency(self.role)
        self.image_id: str = self.image.attr_image_id
        """The AMI's id, known once CloudFormation has built it."""
        self.machine_image: ec2.IMachineImage = PinnedLinuxImage(self.image_id)
        """The AMI, for the hosts' launch template."""
