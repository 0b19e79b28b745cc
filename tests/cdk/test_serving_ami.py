"""serving_ami=build: the stack builds a serving AMI with EC2 Image Builder from the DLAMI's parameter, by
the hosts' own bake (render_bake_script), and the hosts launch it."""

from __future__ import annotations

import json

import pytest
import yaml

from neuron_serving import ServingConfigError, StackSettings
from neuron_serving.cdk.serving_ami import BUILD_INSTANCE_TYPE
from neuron_serving.render.boot import render_bake_script

from .conftest import synthesized

REGISTRY = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
DLAMI = "/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id"


def _document(synth) -> dict:
    # JSON, which YAML reads as Image Builder does.
    return yaml.safe_load(synth.only("AWS::ImageBuilder::Component")["Data"])


def test_the_hosts_launch_the_ami_the_stack_builds_from_the_dlami_s_parameter():
    synth = synthesized(serving_ami="build")

    (image_id,) = synth.resources("AWS::ImageBuilder::Image")
    template = synth.only("AWS::EC2::LaunchTemplate")
    assert template["LaunchTemplateData"]["ImageId"] == {"Fn::GetAtt": [image_id, "ImageId"]}
    recipe = synth.only("AWS::ImageBuilder::ImageRecipe")
    assert recipe["ParentImage"] == f"ssm:{DLAMI}"
    # The AMI's root is at most the hosts' own, which launch from it.
    root = template["LaunchTemplateData"]["BlockDeviceMappings"][0]
    (mapping,) = recipe["BlockDeviceMappings"]
    assert mapping["DeviceName"] == root["DeviceName"] == "/dev/sda1"
    assert mapping["Ebs"]["VolumeSize"] <= root["Ebs"]["VolumeSize"]
    assert mapping["Ebs"]["Encrypted"] is True
    # Without it, the hosts resolve the DLAMI's parameter at launch and nothing is built.
    plain = synthesized()
    assert plain.resources("AWS::ImageBuilder::Image") == {}
    assert "resolve:ssm:" in json.dumps(plain.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["ImageId"])


def test_the_component_runs_the_hosts_bake_and_checks_what_their_boot_expects_to_find():
    synth = synthesized(serving_ami="build")
    boot_script = synth.stack.boot_script

    document = _document(synth)

    phases = {p["name"]: p["steps"] for p in document["phases"]}
    assert list(phases) == ["build", "validate", "test"]
    (bake,) = phases["build"]
    assert (bake["action"], bake["inputs"]["commands"]) == (
        "ExecuteBash", [render_bake_script(boot_script.plan, boot_script.spec, boot_script.options)])
    for phase in ("validate", "test"):
        (check,) = phases[phase]
        command = check["inputs"]["commands"][0]
        assert f'docker image inspect "{boot_script.spec.pulled}"' in command and "command -v haproxy" in command


def test_the_build_runs_on_a_small_instance_in_a_private_subnet_with_imdsv2():
    synth = synthesized(serving_ami="build")
    infrastructure = synth.only("AWS::ImageBuilder::InfrastructureConfiguration")
    assert infrastructure["InstanceTypes"] == [BUILD_INSTANCE_TYPE]
    assert infrastructure["TerminateInstanceOnFailure"] is True
    assert infrastructure["InstanceMetadataOptions"]["HttpTokens"] == "required"
    (subnet,) = [k for k, v in synth.resources("AWS::EC2::Subnet").items()
                 if {"Ref": k} == infrastructure["SubnetId"]]
    assert "Private" in subnet
    image = synth.only("AWS::ImageBuilder::Image")
    assert image["ImageTestsConfiguration"]["ImageTestsEnabled"] is True


def test_a_new_bake_makes_a_component_and_recipe_of_new_names():
    # Image Builder's components and recipes are immutable versions (a change needs a new name).
    first = synthesized(serving_ami="build")
    other = synthesized(serving_ami="build", engine="vllm")
    names = [(s.only("AWS::ImageBuilder::Component")["Name"], s.only("AWS::ImageBuilder::ImageRecipe")["Name"])
             for s in (first, other)]
    assert names[0] != names[1] and names[0][0] == names[0][1]
    assert names[0][0].startswith("NeuronLlamaStack-serving-")


def test_the_build_instance_pulls_from_the_private_registry_with_the_hosts_grants():
    synth = synthesized(serving_ami="build", image_registry=f"{REGISTRY}/ghcr")
    (role,) = [k for k in synth.resources("AWS::IAM::Role") if "ServingAmiBuildRole" in k]
    statements = [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
                  for s in p["Properties"]["PolicyDocument"]["Statement"]]
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"}
    managed = json.dumps(synth.resources("AWS::IAM::Role")[role]["Properties"]["ManagedPolicyArns"])
    assert "AmazonSSMManagedInstanceCore" in managed and "EC2InstanceProfileForImageBuilder" in managed


def test_a_serving_ami_with_a_pinned_ami_or_an_unknown_value_is_refused_naming_the_setting():
    with pytest.raises(ServingConfigError, match=r"serving_ami \('build'\) builds from the DLAMI's parameter, not from "
                                                 r"ami_id \(ami-0123456789abcdef0\)"):
        StackSettings(serving_ami="build", ami_id="ami-0123456789abcdef0")
    with pytest.raises(ServingConfigError, match=r"serving_ami \('baked'\) must be one of"):
        StackSettings(serving_ami="baked")


def test_the_build_waits_for_the_role_s_pull_grant():
    synth = synthesized(serving_ami="build", image_registry=f"{REGISTRY}/ghcr")
    (image,) = synth.resources("AWS::ImageBuilder::Image").values()
    (policy,) = [k for k, v in synth.resources("AWS::IAM::Policy").items()
                 if any("ServingAmiBuildRole" in r["Ref"] for r in v["Properties"]["Roles"])]
    assert policy in image["DependsOn"]


def test_a_stack_name_too_long_for_the_ami_s_names_is_refused_naming_it():
    from aws_cdk import App

    from neuron_serving import NeuronLlamaStack

    with pytest.raises(ServingConfigError, match=r"stack_name \('S{108}'\) must be at most 107 characters with "
                                                 r"serving_ami=build"):
        NeuronLlamaStack(App(), "S" * 108, settings=StackSettings(serving_ami="build"))
