"""The Neuron DLAMI, resolved at launch, or a pinned AMI."""

from __future__ import annotations

import jsii
from aws_cdk import aws_ec2 as ec2

from constructs import Construct


@jsii.implements(ec2.IMachineImage)
class PinnedLinuxImage:
    """A fixed AMI id in every region, without the region map ``generic_linux`` needs."""

    def __init__(self, ami_id: str) -> None:
        self.ami_id = ami_id

    def get_image(self, scope: Construct) -> ec2.MachineImageConfig:
        return ec2.MachineImageConfig(
            image_id=self.ami_id,
            os_type=ec2.OperatingSystemType.LINUX,
            user_data=ec2.UserData.for_linux(),
        )


def neuron_dlami(parameter_name: str) -> ec2.IMachineImage:
    """The DLAMI named by a public SSM parameter, resolved by EC2 at every launch.

    No lookup at synth (the stack stays environment-agnostic) and every new instance gets the
    newest DLAMI; a running instance is not replaced when the parameter moves.
    """
    return ec2.MachineImage.resolve_ssm_parameter_at_launch(parameter_name, os=ec2.OperatingSystemType.LINUX)
