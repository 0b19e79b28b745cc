"""moto's server for the operator's commands: CloudFormation, EC2, Auto Scaling, ELBv2, CloudWatch Logs and
IAM, all on loopback (``tests/harness/aws.py``). The commands run in this process with the emulator's
environment, which botocore reads (``AWS_ENDPOINT_URL_*``, fake credentials); nothing reaches AWS."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator

from tests.harness.aws import REGION, TOOLS, AwsEmulator


def need_moto() -> None:
    """Skip the calling test module when moto is not installed (fail on CI)."""
    if not (TOOLS / "bin" / "python").exists() and importlib.util.find_spec("moto") is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs moto: pip install -r tests/harness/requirements-aws.txt", pytrace=False)
        pytest.skip("pip install -r tests/harness/requirements-aws.txt (no moto)", allow_module_level=True)

STACK = "NeuronLlamaStack"
SNAPSHOTS = Path(__file__).parents[1] / "cdk" / "__snapshots__" / "test_synth_checks"
SERVICES = ("cloudformation", "ec2", "autoscaling", "elbv2", "logs", "iam", "sts", "s3", "secretsmanager")
AMI = "ami-12c6146b"  # one of moto's built-in images


@pytest.fixture
def emulator(aws_for: Callable[..., AwsEmulator]) -> AwsEmulator:
    """moto for every service the commands call; this process's environment reaches it and nothing else."""
    return aws_for(*SERVICES)


def output_keys(config: str) -> list[str]:
    """The output keys of a synthesized template (the snapshot of ``tests/cdk/test_synth_checks.py``)."""
    template = json.loads((SNAPSHOTS / f"test_template_matches_snapshot[{config}].json").read_text())
    return sorted(template["Outputs"])


def _value_for(key: str, values: dict[str, str]) -> str | None:
    for name, value in values.items():
        if key == name or (key.startswith("Monitoring" + name) and len(key) == len("Monitoring" + name) + 8):
            return value
    return None


@dataclass
class Deployment:
    """A stack in moto whose outputs carry the real keys, with values of resources made directly in moto."""

    emulator: AwsEmulator
    vpc: str = ""
    subnet: str = ""
    target_group: str = ""
    outputs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ec2 = self.emulator.client("ec2")
        self.vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = ec2.create_subnet(VpcId=self.vpc, CidrBlock="10.0.0.0/24",
                                        AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
        self.target_group = self.emulator.client("elbv2").create_target_group(
            Name="routers", Protocol="HTTP", Port=8080, VpcId=self.vpc, TargetType="instance",
            HealthCheckPath="/health")["TargetGroups"][0]["TargetGroupArn"]

    def instance(self, tags: dict[str, str] | None = None, *, register: bool = True,
                 instance_type: str = "inf2.48xlarge", spot: bool = False) -> str:
        ec2 = self.emulator.client("ec2")
        spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()]}]
        instance_id = str(ec2.run_instances(ImageId=AMI, InstanceType=instance_type, MinCount=1, MaxCount=1,
                                            SubnetId=self.subnet, **({"TagSpecifications": spec} if tags else {}),
                                            **({"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}))
                          ["Instances"][0]["InstanceId"])
        if register:
            self.emulator.client("elbv2").register_targets(TargetGroupArn=self.target_group,
                                                           Targets=[{"Id": instance_id, "Port": 8080}])
        return instance_id

    def group(self, name: str, size: int) -> list[str]:
        """An Auto Scaling group in moto (which launches its instances and registers them in the target group)."""
        self.emulator.client("ec2").create_launch_template(
            LaunchTemplateName="hosts", LaunchTemplateData={"ImageId": AMI, "InstanceType": "inf2.48xlarge"})
        autoscaling = self.emulator.client("autoscaling")
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=name, LaunchTemplate={"LaunchTemplateName": "hosts"}, MinSize=size, MaxSize=3,
            DesiredCapacity=size, VPCZoneIdentifier=self.subnet, TargetGroupARNs=[self.target_group])
        described = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        return sorted(i["InstanceId"] for i in described["AutoScalingGroups"][0]["Instances"])

    def tag(self, instance_id: str, tags: dict[str, str]) -> None:
        self.emulator.client("ec2").create_tags(Resources=[instance_id],
                                                Tags=[{"Key": k, "Value": v} for k, v in tags.items()])

    def stack(self, config: str = "default", *, monitoring: bool = True, **values: str) -> None:
        values = {
            "EndpointUrl": "https://llm.example.com", "Engine": "tgi", "TargetGroupArn": self.target_group,
            "RouterPort": "8080", "ReplicaCount": "6",
            "BootPhaseMinutes": json.dumps({"checkpoint": 5, "compile": 53, "download": 9, "export": 58, "install": 5,
                                            "load": 15, "pull": 12}),
            "DashboardUrl": f"https://console.aws.amazon.com/cloudwatch/home?region={REGION}#dashboards:name=d",
            "BootLogGroup": "boot-logs", "ReplicasLogGroup": "replica-logs", "RouterLogGroup": "router-logs",
            "MetricsLogGroup": "metrics-logs", **values,
        }
        outputs = {}
        for key in output_keys(config):
            value = _value_for(key, values)
            if value is not None and (monitoring or not key.startswith("Monitoring")):
                outputs[key] = value
        self.outputs = outputs
        template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                    "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
        self.emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))


@pytest.fixture
def deployment(emulator: AwsEmulator) -> Deployment:
    return Deployment(emulator)


def model_checked_answer(service: str, operation: str, body: dict[str, Any]) -> tuple[AWSResponse, dict[str, Any]]:
    """What a ``before-call`` handler returns to answer ``operation`` itself, after checking ``body`` against the
    operation's output shape in botocore's model (types, required members, enums are not checked by
    ``ParamValidator``: the caller names only documented values)."""
    model = boto3.session.Session().client(service, region_name=REGION).meta.service_model
    report = ParamValidator().validate(body, model.operation_model(operation).output_shape)
    assert not report.has_errors(), report.generate_report()
    return AWSResponse("https://stub.invalid", 200, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
