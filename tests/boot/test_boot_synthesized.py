"""The user data of synthesized NeuronLlamaStack templates, booted on simulated hosts with the
real AWS CLI against moto and the recorder (tests/harness/aws.py) and the real docker CLI against
the recording engine: the default stack, a fleet, trn1.32xlarge and two vLLM stacks, as `cdk
deploy` would launch them. The template's deploy-time values (the cache bucket, the log groups, the assets bucket),
in each launch template's metadata, are resolved the way CloudFormation would, to names this test's
emulator holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from bootsim import MARKER, PUBLISHER_SOURCE, Host, install_agent

from neuron_serving.plan.metrics import AGENT_KEY_FINGERPRINT
from neuron_serving.render.boot import CHECK_EXPORT, METADATA_KEY, START_MONITORING
from tests.cdk.conftest import synthesized
from tests.harness.aws import ACCOUNT_ID, AwsEmulator
from tests.harness.userdata import assembly_bundle, files_in, publish_bundle

REGION = "us-east-2"
STACK = "NeuronLlamaStack"

CONFIGS = {
    "default": {},
    "fleet": {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"},
    "trn1": {"instance_type": "trn1.32xlarge", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
             "tensor_parallel": "8", "batch_size": "32"},
    "vllm": {"engine": "vllm"},
    "vllm_trn1_fleet": {"engine": "vllm", "fleet": "asg", "instance_type": "trn1.32xlarge",
                        "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel": "8", "batch_size": "16"},
}


def _resolve(value: Any, refs: dict[str, str]) -> str:
    """A user data value as CloudFormation resolves it: ``Fn::Join``, ``Fn::Sub`` of pseudo
    parameters, and ``Ref`` of this stack's resources (to ``refs``)."""
    if isinstance(value, str):
        return value
    (function, argument), = value.items()
    if function == "Fn::Join":
        separator, parts = argument
        return str(separator).join(_resolve(part, refs) for part in parts)
    if function == "Fn::Sub":
        pseudo = {"AWS::AccountId": ACCOUNT_ID, "AWS::Region": REGION, "AWS::StackName": "NeuronLlamaStack",
                  "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}
        return re.sub(r"\$\{([^}]+)\}", lambda m: pseudo[m.group(1)], argument)
    if function == "Ref":
        return refs.get(argument) or {"AWS::StackName": "NeuronLlamaStack", "AWS::Region": REGION}[argument]
    raise AssertionError(f"user data uses {function}, which this test cannot resolve")


@dataclass(frozen=True)
class Launch:
    """A launch template of a synthesized stack as its hosts get it, resolved as CloudFormation would:
    its user data, and its metadata, which holds the stack's values (``NeuronBootScript.attach``)."""

    resource: str
    """The launch template's logical id, which the user data names."""
    script: str
    """The user data."""
    metadata: dict[str, str]
    """The launch template's metadata, each value resolved."""

    @property
    def values(self) -> str:
        """The lines the boot script adds to stack.env from the launch template's metadata."""
        return self.metadata[METADATA_KEY]

    def value(self, variable: str) -> str | None:
        """One of the stack's values (as the stack renders it, shell-quoted or not)."""
        found = re.search(rf"^{variable}=(\S+)$", self.values, re.M)
        return None if found is None else found.group(1).strip("'")

    def deploy(self, aws: AwsEmulator) -> None:
        """The launch template in ``aws``'s CloudFormation, with its metadata, as the stack deployed it."""
        aws.put_metadata(STACK, self.resource, json.dumps(self.metadata))


def launch_user_data(context: dict[str, str]) -> tuple[dict[str, Launch], Any]:
    """Each of the stack's launch templates (by logical id), resolved, and the stack's plan."""
    synth = synthesized(**context)
    refs = {name: name.lower() if resource["Type"] == "AWS::S3::Bucket" else f"/stack/{name}"
            for name, resource in synth.json["Resources"].items()}
    launches = {
        name: Launch(name, _resolve(template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"], refs),
                     {key: _resolve(value, refs) for key, value in template["Metadata"].items()})
        for name, template in synth.resources("AWS::EC2::LaunchTemplate").items()}
    return launches, synth.stack.plan


def user_data(context: dict[str, str]) -> tuple[Launch, int, Any]:
    """The stack's launch template, resolved, the Neuron device count of its instance type, and its plan."""
    launches, plan = launch_user_data(context)
    (launch,) = launches.values()
    return launch, plan.instance.devices, plan


@pytest.mark.parametrize("config", CONFIGS)
def test_a_synthesized_stack_boots_with_the_real_aws_cli_and_docker_cli(
    config: str, make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    launch, devices, plan = user_data(CONFIGS[config])
    # The user data is the same short script whatever the stack's features, with its bundle's place: under
    # 2.5 KB.
    assert len(launch.script.encode()) < 2560, len(launch.script.encode())
    # What CloudFormation and the CDK's asset publishing would have made: the launch template with
    # the stack's values in its metadata, the cache bucket, and the boot bundle, zipped and uploaded
    # by the CDK CLI itself.
    launch.deploy(aws)
    name = launch.value("CACHE_BUCKET")
    assert name is not None
    (bucket,) = [r for n, r in synthesized(**CONFIGS[config]).json["Resources"].items() if n.lower() == name]
    aws.create_bucket(name, versioned=bucket["Properties"].get("VersioningConfiguration") == {"Status": "Enabled"})
    bundle = assembly_bundle(launch.script, synthesized(**CONFIGS[config]).assembly)
    publish_bundle(aws, launch.script, bundle.parent)
    # The stack trusts only AWS's key for the CloudWatch agent's package, which no test can sign
    # with (test_boot_monitoring verifies packages signed by a key of its own): here the image
    # ships the agent.
    assert f"key={AGENT_KEY_FINGERPRINT}\n" in files_in(bundle)[START_MONITORING]
    host = make_host(devices)
    install_agent(host)
    result = host.boot(launch.script)
    assert result.returncode == 0, host.path("/var/log/neuron-serving/boot.log").read_text()
    assert len(host.exports()) == 1
    [final] = [p for p in host.path("/var/lib/neuron-serving/exports").iterdir() if (p / MARKER).is_file()]
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    published = aws.list_objects(name, f"exports/{final.name}/")
    assert f"exports/{final.name}/COMPLETE" in published
    [signal] = aws.recorder.calls("SignalResource")
    assert signal.valid and signal.ok and signal.params["Status"] == "SUCCESS"
    replicas = [unit for unit in host.started_units() if unit.startswith("neuron-replica@")]
    assert replicas == [f"neuron-replica@{r.index}" for r in plan.replicas]
    assert "neuron-serving-metrics" in host.started_units()  # monitoring is on by default
    # In the bundle, which the real CLI downloaded from the assets bucket.
    assert host.path("/opt/neuron-serving/bin/publish-metrics").read_bytes() == PUBLISHER_SOURCE.read_bytes()
