
"""NeuronLlamaStack from code: every setting a keyword argument, presets, and what an organisation's
settings do to the template (imported VPC, tags, name prefix, alarm topic)."""

import dataclasses
import json

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from neuron_serving import NeuronBootScript, NeuronLlamaStack, ServingConfigError, StackSettings

from .conftest import FEATURE_FLAGS, synthesized

ORG = {
    "vpc_id": "vpc-0123456789abcdef0", "availability_zones": "us-east-1a,us-east-1b",
    "private_subnet_ids": "subnet-0123456789abcdef0,subnet-0123456789abcdef1", "allowed_cidrs": "10.20.0.0/16",
    "tags": '{"team": "ml-platform"}', "name_prefix": "ml-",
    "alarm_topic_arn": "arn:aws:sns:us-east-1:111122223333:on-call",
}


def _app() -> App:
    return App(context=FEATURE_FLAGS)


def test_the_default_stack_needs_no_argument(synth):
    stack = NeuronLlamaStack(_app(), "NeuronLlamaStack")
    assert stack.settings == StackSettings()
    assert Template.from_stack(stack).to_json() == synth().json


def test_settings_are_keyword_arguments():
    stack = NeuronLlamaStack(_app(), "Llama", instance_type="inf2.48xlarge", tensor_parallel=8,
                             description="team endpoint")
    assert (stack.plan.degree, len(stack.plan.replicas)) == (8, 3)
    assert stack.template_options.description == "team endpoint"


def test_keyword_settings_override_the_settings_object():
    stack = NeuronLlamaStack(_app(), "Llama", settings=StackSettings(batch_size=8), tensor_parallel=4)
    assert (stack.settings.batch_size, stack.settings.tensor_parallel) == (8, 4)


def test_a_preset_from_code_with_an_override():
    stack = NeuronLlamaStack(_app(), "Llama", preset="llama-3.1-8b-throughput", batch_size=4)
    assert (stack.plan.instance.name, stack.plan.degree, stack.settings.batch_size) == ("inf2.48xlarge", 2, 4)


def test_the_name_prefix_goes_on_a_given_stack_name_too():
    assert NeuronLlamaStack(_app(), "Llama", name_prefix="ml-", stack_name="search").stack_name == "ml-search"
    assert NeuronLlamaStack(_app(), "Llama", name_prefix="ml-", stack_name="ml-search").stack_name == "ml-search"


def test_an_unknown_keyword_is_refused_with_the_closest_setting():
    with pytest.raises(ServingConfigError, match=r"tensor_paralel \(8\) is not a setting; did you mean "
                                                 r"tensor_parallel\?"):
        NeuronLlamaStack(_app(), "Llama", tensor_paralel=8)


def test_an_organisations_vpc_is_imported_without_a_lookup():
    template = synthesized(**ORG).json
    assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::VPC"]
    (instance,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EC2::Instance"]
    assert instance["SubnetId"] == "subnet-0123456789abcdef0"
    (balancer,) = [r["Properties"] for r in template["Resources"].values()
                   if r["Type"] == "AWS::ElasticLoadBalancingV2::LoadBalancer"]
    assert balancer["Subnets"] == ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]


def test_an_organisations_tags_name_prefix_and_alarm_topic():
    synth = synthesized(**ORG)
    assert synth.stack.stack_name == "ml-NeuronLlamaStack"
    tagged = [r for r in synth.json["Resources"].values() if "Tags" in r.get("Properties", {})]
    assert tagged and all({"Key": "team", "Value": "ml-platform"} in r["Properties"]["Tags"] for r in tagged
                          if isinstance(r["Properties"]["Tags"], list))
    assert not [r for r in synth.json["Resources"].values() if r["Type"] == "AWS::SNS::Topic"]
    actions = [a for r in synth.json["Resources"].values() if r["Type"] == "AWS::CloudWatch::Alarm"
               for a in r["Properties"].get("AlarmActions", [])]
    assert actions and set(actions) == {"arn:aws:sns:us-east-1:111122223333:on-call"}


def test_a_stack_with_an_account_and_region_passes_cdk_nag_with_its_acknowledgments():
    from aws_cdk import Environment, Validations
    from cdk_nag import AwsSolutionsChecks

    app = _app()
    NeuronLlamaStack(app, "Pinned", env=Environment(account="111122223333", region="eu-west-1"), fleet="asg",
                     warm_pool=True)
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()  # an unacknowledged finding raises ValidationFailed


# -- small hosts: a builder exports, the serving host waits -------------------------------------

def test_inf2_xlarge_serves_llama_3_8b_with_a_builder_and_never_compiles():
    synth = synthesized(instance_type="inf2.xlarge")
    template = synth.json
    (group,) = [r["Properties"] for r in template["Resources"].values()
                if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == ("0", "1", "1")
    assert group["AutoScalingGroupName"] == "NeuronLlamaStack-ExportBuilder"
    types = sorted(r["Properties"]["LaunchTemplateData"]["InstanceType"] for r in template["Resources"].values()
                   if r["Type"] == "AWS::EC2::LaunchTemplate")
    assert types == ["inf2.8xlarge", "inf2.xlarge"]
    serving = synth.stack.boot_script
    assert serving.spec.export_role == "wait"
    assert "waiting for the builder's export" in _export_script(serving)
    assert "exporting into" not in _export_script(serving)
    builder = synth.stack.export_builder
    # The builder's spec is the serving hosts', building: the same image and revision, the same export key.
    assert builder is not None and builder.boot_script.spec == dataclasses.replace(serving.spec, export_role="build")
    assert builder.boot_script.options.artifact_cache == serving.options.artifact_cache
    statements = [s for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  for s in r["Properties"]["PolicyDocument"]["Statement"]]
    (leave,) = [s for s in statements if s["Action"] == "autoscaling:TerminateInstanceInAutoScalingGroup"]
    assert "autoScalingGroupName/NeuronLlamaStack-ExportBuilder" in json.dumps(leave["Resource"])


def test_a_host_that_compiles_has_no_builder_unless_one_is_asked_for():
    assert synthesized().stack.export_builder is None
    assert StackSettings(builder_instance_type="inf2.8xlarge").builder is not None


def test_a_builder_that_cannot_compile_either_is_refused_naming_what_can():
    with pytest.raises(ServingConfigError, match=r"builder_instance_type \('inf2.xlarge'\) must be a inf2 instance "
                                                 r"type with at least 1 Neuron devices and the host memory to compile "
                                                 r"llama-3-8b: inf2.8xlarge, inf2.24xlarge, inf2.48xlarge"):
        StackSettings(instance_type="inf2.xlarge", builder_instance_type="inf2.xlarge")


def test_a_builder_with_a_prebuilt_export_is_refused():
    with pytest.raises(ServingConfigError, match=r"builder_instance_type \('inf2.8xlarge'\) does not apply with "
                                                 r"prebuilt_export"):
        StackSettings(prebuilt_export="s3://team-exports/x", builder_instance_type="inf2.8xlarge")


def _export_script(boot_script: NeuronBootScript) -> str:
    return boot_script.boot.files["/opt/neuron-serving/bin/export-model"]
