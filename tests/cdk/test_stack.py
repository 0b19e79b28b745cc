"""NeuronLlamaStack: one behaviour per test, on the synthesized template."""

import json

import pytest

from neuron_serving import ServingConfigError
from neuron_serving.cdk.instance import SESSION_MANAGER_ACTIONS
from neuron_serving.plan import ServingRequest, plan_serving
from neuron_serving.plan.engines.tgi import TGI_3_3_5
from neuron_serving.plan.timing import longest_generation_seconds
from neuron_serving.render.boot import BUNDLE_ENV, METADATA_KEY
from neuron_serving.settings import StackSettings

from .conftest import CERTIFICATE, SNAPSHOT_CONFIGS, synthesize


def _outputs(synth):
    return {k: v["Value"] for k, v in synth.json["Outputs"].items()}


# --- layout outputs -------------------------------------------------------------------------------

def test_default_stack_serves_at_least_two_replicas(synth):
    outputs = _outputs(synth())
    assert int(outputs["ReplicaCount"]) >= 2
    assert outputs["ReplicaCount"] == "6"
    assert outputs["CoresPerReplica"] == "2"


def test_inf2_24xlarge_at_degree_4_reports_3_replicas(synth):
    outputs = _outputs(synth(instance_type="inf2.24xlarge", tensor_parallel="4"))
    assert outputs["ReplicaCount"] == "3"
    assert outputs["CoresPerReplica"] == "4"
    assert outputs["ServingLayout"] == (
        "inf2.24xlarge NousResearch/Meta-Llama-3-8B-Instruct: replica-0: neuron0-1 (cores 0-3) on port 8081; "
        "replica-1: neuron2-3 (cores 4-7) on port 8082; replica-2: neuron4-5 (cores 8-11) on port 8083"
    )


def test_invalid_degree_fails_synthesis_naming_tensor_parallel():
    with pytest.raises(ServingConfigError, match=r"^tensor_parallel \(5\) must be one of 2, 4, 6, 8, 10, 12"):
        synthesize({"instance_type": "inf2.24xlarge", "tensor_parallel": "5"})


def test_outputs_name_the_endpoint_and_the_instance_for_session_manager(synth):
    outputs = synth().json["Outputs"]
    assert set(outputs) >= {"EndpointUrl", "ReplicaCount", "CoresPerReplica", "ServingLayout", "InstanceId"}
    (lb_id,) = synth().resources("AWS::ElasticLoadBalancingV2::LoadBalancer")
    assert outputs["EndpointUrl"]["Value"] == {"Fn::Join": ["", ["http://", {"Fn::GetAtt": [lb_id, "DNSName"]}]]}
    assert outputs["InstanceId"]["Value"] == {"Ref": next(iter(synth().resources("AWS::EC2::Instance")))}


# --- host -----------------------------------------------------------------------------------------

def test_launch_template_requires_imdsv2_with_hop_limit_1(synth):
    data = synth().only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}


def test_root_volume_is_encrypted_gp3_sized_for_image_weights_and_export(synth):
    (device,) = synth().only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["BlockDeviceMappings"]
    assert device == {"DeviceName": "/dev/sda1", "Ebs": {"DeleteOnTermination": True, "Encrypted": True,
                                                         "VolumeSize": 150, "VolumeType": "gp3",
                                                         "Throughput": 341, "Iops": 3000}}


def test_trainium_root_volume_is_at_least_512_gib(synth):
    (device,) = synth(**{"instance_type": "trn1.32xlarge", "tensor_parallel": "8"}).only(
        "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["BlockDeviceMappings"]
    assert device["Ebs"]["VolumeSize"] == 512


def test_ami_is_the_neuron_dlami_resolved_at_launch_without_a_lookup(synth):
    data = synth().only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["ImageId"] == f"resolve:ssm:{TGI_3_3_5.dlami_parameter}"
    assert not synth().json.get("Parameters", {}).keys() - {"BootstrapVersion"}


def test_a_pinned_ami_replaces_the_dlami_parameter(synth):
    data = synth(ami_id="ami-0123456789abcdef0").only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["ImageId"] == "ami-0123456789abcdef0"


def test_no_key_pair_and_no_ssh_port(synth):
    template = synth()
    assert "KeyName" not in template.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    for resource in [*template.resources("AWS::EC2::SecurityGroupIngress").values(),
                     *template.resources("AWS::EC2::SecurityGroup").values()]:
        rules = resource["Properties"].get("SecurityGroupIngress", [resource["Properties"]])
        for rule in rules:
            assert not (rule.get("FromPort", 0) <= 22 <= rule.get("ToPort", -1)), rule


def test_instance_launches_from_the_template_in_a_private_subnet(synth):
    template = synth()
    instance = template.only("AWS::EC2::Instance")
    (lt_id,) = template.resources("AWS::EC2::LaunchTemplate")
    assert instance["LaunchTemplate"] == {
        "LaunchTemplateId": {"Ref": lt_id},
        "Version": {"Fn::GetAtt": [lt_id, "LatestVersionNumber"]},
    }
    subnet = instance["SubnetId"]["Ref"]
    assert template.json["Resources"][subnet]["Properties"]["MapPublicIpOnLaunch"] is False
    assert template.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["InstanceType"] == "inf2.24xlarge"


def test_user_data_is_the_rendered_boot_script(synth):
    template = synth()
    [(logical_id, launch_template)] = template.resources("AWS::EC2::LaunchTemplate").items()
    user_data = launch_template["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    assert user_data == template.stack.resolve(template.stack.boot_script.script)
    # It names the launch template, whose metadata holds the stack's values; the artifact cache's
    # bucket name is a deploy-time token among them.
    assert f"\nHOST_RESOURCE='{logical_id}'\n" in json.dumps(user_data["Fn::Join"][1]).replace("\\n", "\n")
    values = launch_template["Metadata"][METADATA_KEY]
    bucket = template.stack.get_logical_id(template.stack.artifact_cache.bucket.node.default_child)
    assert {"Ref": bucket} in values["Fn::Join"][1]
    assert bucket not in json.dumps(user_data)
    # The image, known at synth, is in the bundle.
    assert TGI_3_3_5.reference not in json.dumps([user_data, values])
    assert f"IMAGE={TGI_3_3_5.reference}\n" in template.stack.boot_script.boot.files[BUNDLE_ENV]


PINNED_TGI = f"{TGI_3_3_5.reference}@sha256:{'0123456789abcdef' * 4}"


def test_a_pinned_image_is_the_serving_image_output_and_what_the_hosts_pull(synth):
    template = synth(image=PINNED_TGI)
    template.template.has_output("ServingImage", {
        "Value": PINNED_TGI, "Description": "The TGI image: optimum-neuron 0.3.0, Neuron SDK 2.24"})
    assert f"IMAGE={PINNED_TGI}\n" in template.stack.boot_script.boot.files[BUNDLE_ENV]


def test_a_malformed_digest_fails_synthesis_naming_image():
    with pytest.raises(ServingConfigError, match=r"^image \('ghcr.io/huggingface/text-generation-inference:3.3.5-"
                       r"neuron@sha256:ABC'\) has a malformed digest"):
        synthesize({"image": f"{TGI_3_3_5.reference}@sha256:ABC"})



def test_instance_role_has_session_manager_the_cache_and_its_signal_only(synth):
    template = synth()
    roles = [r["Properties"] for r in template.resources("AWS::IAM::Role").values()
             if r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"].get("Service")
             == "ec2.amazonaws.com"]
    (role,) = roles
    assert "ManagedPolicyArns" not in role
    # What it is allowed; the cache's explicit denies are tests/cdk/test_artifact_cache.py's.
    actions = sorted(json.dumps(s["Action"]) for s in template.host_statements() if s["Effect"] == "Allow")
    assert actions == sorted(json.dumps(a) for a in (
        "ssm:UpdateInstanceInformation", list(SESSION_MANAGER_ACTIONS),
        ["s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"],
        # The compile cache's graphs; one listing of the whole bucket, which the artifact cache and the
        # compile cache both need for a miss to be a 404 (CDK merges their identical statements).
        ["s3:GetObject", "s3:PutObject"], "s3:ListBucket",
        ["cloudformation:DescribeStackResource", "cloudformation:SignalResource"],
        ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"], "s3:GetObject", "ec2:CreateTags",
        "cloudwatch:PutMetricData"))
    assert "secretsmanager" not in json.dumps(template.host_statements())


def test_the_token_secret_is_readable_by_the_instance_and_never_in_the_template(synth):
    template = synth(hf_token_secret="arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf")
    (statement,) = [s for s in template.host_statements() if "secretsmanager" in json.dumps(s)]
    assert statement == {
        "Action": ["secretsmanager:DescribeSecret", "secretsmanager:GetSecretValue"],
        "Effect": "Allow",
        "Resource": "arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf",
    }
    assert "HF_TOKEN_SECRET=arn:aws:secretsmanager:us-east-1:111122223333:secret:hf-AbCdEf\n" in (
        template.stack.boot_script.boot.files[BUNDLE_ENV])


def test_a_token_secret_given_by_name_is_granted_by_name_pattern(synth):
    template = synth(hf_token_secret="hf/token")
    (statement,) = [s for s in template.host_statements() if "secretsmanager" in json.dumps(s)]
    assert ":secret:hf/token-??????" in json.dumps(statement["Resource"])


def test_instance_accepts_only_the_router_port_and_only_from_the_load_balancer(synth):
    template = synth()
    ingress = [r["Properties"] for r in template.resources("AWS::EC2::SecurityGroupIngress").values()
               if "Host" in r["Properties"]["GroupId"]["Fn::GetAtt"][0]]
    (rule,) = ingress
    assert (rule["FromPort"], rule["ToPort"], rule["IpProtocol"]) == (8080, 8080, "tcp")
    assert "LoadBalancer" in rule["SourceSecurityGroupId"]["Fn::GetAtt"][0]


# --- endpoint -------------------------------------------------------------------------------------

def test_load_balancer_is_internal_by_default_and_open_only_to_the_vpc(synth):
    template = synth()
    assert template.only("AWS::ElasticLoadBalancingV2::LoadBalancer")["Scheme"] == "internal"
    ingress = [rule for sg in template.resources("AWS::EC2::SecurityGroup").values()
               for rule in sg["Properties"].get("SecurityGroupIngress", [])]
    assert ingress == [{"CidrIp": "10.0.0.0/16", "Description": "LLM clients", "FromPort": 80,
                        "IpProtocol": "tcp", "ToPort": 80}]


def test_no_ingress_from_anywhere_by_default(synth):
    assert "0.0.0.0/0" not in json.dumps([r for r in synth().json["Resources"].values()
                                          if r["Type"].startswith("AWS::EC2::SecurityGroup")
                                          and "Ingress" in json.dumps(r)])
    assert "::/0" not in json.dumps(synth().json)


def test_internet_facing_is_open_only_to_the_listed_cidrs(synth):
    template = synth(internet_facing="true", allowed_cidrs="203.0.113.0/24,2001:db8::/32", certificate_arn=CERTIFICATE)
    assert template.only("AWS::ElasticLoadBalancingV2::LoadBalancer")["Scheme"] == "internet-facing"
    ingress = [rule for sg in template.resources("AWS::EC2::SecurityGroup").values()
               for rule in sg["Properties"].get("SecurityGroupIngress", [])]
    assert sorted((r.get("CidrIp") or r.get("CidrIpv6"), r["FromPort"]) for r in ingress) == [
        ("2001:db8::/32", 80), ("2001:db8::/32", 443), ("203.0.113.0/24", 80), ("203.0.113.0/24", 443)]


def test_internet_facing_without_allowed_cidrs_fails_naming_allowed_cidrs():
    with pytest.raises(ValueError, match=r"^allowed_cidrs \(\[\]\) must list who may connect"):
        synthesize({"internet_facing": "true", "certificate_arn": CERTIFICATE})


def test_alb_idle_timeout_covers_the_longest_generation_and_drops_invalid_headers_and_logs_access(synth):
    attributes = {a["Key"]: a["Value"] for a in
                  synth().only("AWS::ElasticLoadBalancingV2::LoadBalancer")["LoadBalancerAttributes"]}
    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    # 4095 tokens at 0.1 s plus a minute of queueing: a non-streamed /generate sends nothing until done.
    assert attributes["idle_timeout.timeout_seconds"] == str(longest_generation_seconds(plan)) == "470"
    assert attributes["routing.http.drop_invalid_header_fields.enabled"] == "true"
    assert attributes["access_logs.s3.enabled"] == "true"
    assert attributes["access_logs.s3.prefix"] == "alb"


def test_access_log_bucket_is_encrypted_private_ssl_only_and_writable_by_log_delivery(synth):
    template = synth()
    (logs_id, logs), = [(k, r) for k, r in template.resources("AWS::S3::Bucket").items() if k.startswith("Logs")]
    bucket = logs["Properties"]
    assert bucket["PublicAccessBlockConfiguration"] == {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                                       "IgnorePublicAcls": True, "RestrictPublicBuckets": True}
    assert bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
        "ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
    (policy,) = [p["Properties"] for p in template.resources("AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == {"Ref": logs_id}]
    statements = policy["PolicyDocument"]["Statement"]
    assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
               for s in statements)
    principals = [s["Principal"] for s in statements if s.get("Action") == "s3:PutObject"]
    assert {"Service": "logdelivery.elasticloadbalancing.amazonaws.com"} in principals
    assert {"Service": "logging.s3.amazonaws.com"} in principals  # the artifact cache's access logs


def test_target_group_checks_health_and_balances_by_least_outstanding_requests(synth):
    group = synth().only("AWS::ElasticLoadBalancingV2::TargetGroup")
    assert group["Port"] == 8080
    assert group["HealthCheckPath"] == "/health"
    assert group["Matcher"] == {"HttpCode": "200"}
    attributes = {a["Key"]: a["Value"] for a in group["TargetGroupAttributes"]}
    assert attributes["load_balancing.algorithm.type"] == "least_outstanding_requests"
    assert attributes["deregistration_delay.timeout_seconds"] == "470"  # drains the longest generation
    assert group["Targets"] == [{"Id": {"Ref": next(iter(synth().resources("AWS::EC2::Instance")))},
                                 "Port": 8080}]


def test_http_only_without_a_certificate(synth):
    (listener,) = synth().resources("AWS::ElasticLoadBalancingV2::Listener").values()
    assert (listener["Properties"]["Port"], listener["Properties"]["Protocol"]) == (80, "HTTP")


def test_a_certificate_adds_https_and_redirects_http(synth):
    template = synth(certificate_arn=CERTIFICATE)
    listeners = {listener["Properties"]["Port"]: listener["Properties"]
                 for listener in template.resources("AWS::ElasticLoadBalancingV2::Listener").values()}
    assert listeners[443]["Protocol"] == "HTTPS"
    assert listeners[443]["Certificates"] == [{"CertificateArn": CERTIFICATE}]
    assert listeners[80]["DefaultActions"][0]["Type"] == "redirect"
    assert json.loads(json.dumps(template.json["Outputs"]["EndpointUrl"]["Value"]))["Fn::Join"][1][0] == "https://"


# --- network --------------------------------------------------------------------------------------

def test_new_vpc_spans_two_azs_with_public_and_private_subnets_and_one_nat(synth):
    template = synth()
    subnets = template.resources("AWS::EC2::Subnet").values()
    assert len(subnets) == 4
    assert len({json.dumps(s["Properties"]["AvailabilityZone"]) for s in subnets}) == 2
    assert len(template.resources("AWS::EC2::NatGateway")) == 1


def test_vpc_flow_logs_go_to_a_log_group_with_retention(synth):
    template = synth()
    assert template.only("AWS::EC2::FlowLog")["LogDestinationType"] == "cloud-watch-logs"
    destination = template.only("AWS::EC2::FlowLog")["LogGroupName"]["Ref"]
    assert template.json["Resources"][destination]["Properties"]["RetentionInDays"] == 30


def test_endpoint_idle_timeout_cannot_outlast_the_router():
    from aws_cdk import App, Duration, Stack
    from aws_cdk import aws_ec2 as ec2

    from neuron_serving import NeuronServingEndpoint

    stack = Stack(App(), "Endpoint")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    with pytest.raises(ValueError, match=r"^idle_timeout \(1000\) must be 1 to 900 seconds"):
        NeuronServingEndpoint(stack, "Endpoint", vpc=vpc, target_port=8080, idle_timeout=Duration.seconds(1000))


def test_an_existing_vpc_is_used_instead_of_a_new_one():
    from aws_cdk import App, Stack, Validations
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk.assertions import Template
    from cdk_nag import AwsSolutionsChecks

    from neuron_serving import NeuronLlamaStack, StackSettings

    from .conftest import FEATURE_FLAGS

    app = App(context=FEATURE_FLAGS)
    network = Stack(app, "Network")
    vpc = ec2.Vpc(network, "Shared", max_azs=2, flow_logs={"All": ec2.FlowLogOptions()})
    stack = NeuronLlamaStack(app, "NeuronLlamaStack", settings=StackSettings.from_context(lambda key: None), vpc=vpc)
    Validations.of(stack).add_plugins(AwsSolutionsChecks(stack))
    template = Template.from_stack(stack).to_json()
    types = {r["Type"] for r in template["Resources"].values()}
    assert "AWS::EC2::VPC" not in types and "AWS::EC2::NatGateway" not in types
    ingress = [rule for r in template["Resources"].values() if r["Type"] == "AWS::EC2::SecurityGroup"
               for rule in r["Properties"].get("SecurityGroupIngress", [])]
    (rule,) = ingress
    assert list(rule["CidrIp"]) == ["Fn::GetStackOutput"]  # the shared VPC's own CIDR, from its stack

def test_instance_is_grantable_and_connectable_like_an_l2(synth):
    from aws_cdk import App, Stack
    from aws_cdk import aws_ec2 as ec2
    from aws_cdk import aws_s3 as s3
    from aws_cdk.assertions import Template

    from neuron_serving import (
        NeuronBootScript,
        NeuronServingInstance,
        NeuronServingLaunchTemplate,
        ServingRequest,
        neuron_dlami,
        plan_serving,
    )

    stack = Stack(App(), "Own")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    boot = NeuronBootScript(stack, "Boot", plan=plan)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot, machine_image=neuron_dlami("/p"))
    instance = NeuronServingInstance(stack, "Instance", vpc=vpc, launch_template=host)
    s3.Bucket(stack, "Weights").grant_read(instance)
    instance.connections.allow_from(ec2.Peer.ipv4("10.9.0.0/16"), ec2.Port.tcp(8404), "metrics")
    template = Template.from_stack(stack).to_json()
    (policy,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    assert policy["Roles"] == [{"Ref": next(k for k, r in template["Resources"].items()
                                            if r["Type"] == "AWS::IAM::Role")}]
    assert "s3:GetObject*" in json.dumps(policy["PolicyDocument"])
    (group,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::EC2::SecurityGroup"]
    assert group["SecurityGroupIngress"][0]["CidrIp"] == "10.9.0.0/16"
    assert host.role is instance.role and instance.grant_principal is host.role


def test_values_known_at_synth_however_long_go_to_the_bundle_not_the_user_data():
    from aws_cdk import App, Stack
    from aws_cdk import aws_secretsmanager as secretsmanager

    from neuron_serving import NeuronBootScript

    # A setting's shape check keeps secret names to 512 characters; the construct takes any secret.
    # Such a name once made user data over EC2's 16 KB; only deploy-time values are in it now.
    stack = Stack(App(), "Own")
    name = "neuron-serving/" + "x" * 16000
    secret = secretsmanager.Secret.from_secret_name_v2(stack, "Token", name)
    boot = NeuronBootScript(stack, "Boot", plan=plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge")),
                            hf_token_secret=secret)
    assert f"HF_TOKEN_SECRET={name}\n" in boot.boot.files[BUNDLE_ENV]
    assert name not in boot.script and len(boot.script.encode()) < 3 * 1024


def test_the_vllm_stack_boots_the_vllm_image_on_its_dlami_and_scales_on_in_flight_requests(synth):
    template = synth(**SNAPSHOT_CONFIGS["vllm_fleet_trn1"])
    assert "IMAGE=ghcr.io/huggingface/optimum-neuron-vllm:0.4.5\n" in template.stack.boot_script.boot.files[BUNDLE_ENV]
    image_id = template.only("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["ImageId"]
    assert image_id == "resolve:ssm:/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id"
    [policy] = [p["Properties"] for p in template.resources("AWS::AutoScaling::ScalingPolicy").values()
                if "TargetTrackingConfiguration" in p["Properties"]]
    metric = policy["TargetTrackingConfiguration"]["CustomizedMetricSpecification"]
    assert json.dumps(metric).count('"InFlightRequests"') == 1
    assert policy["TargetTrackingConfiguration"]["TargetValue"] == 16  # the batch size


# --- the performance model's choice and predictions ----------------------------------------------------

def test_outputs_carry_the_layout_and_its_predicted_performance(synth):
    outputs = _outputs(synth())
    assert json.loads(outputs["ServingPlan"]) == {
        "model_id": "NousResearch/Meta-Llama-3-8B-Instruct", "instance_type": "inf2.24xlarge", "tensor_parallel": 2,
        "batch_size": 4, "sequence_length": 4096, "max_input_tokens": 3072, "dtype": "bf16"}
    predicted = json.loads(outputs["PredictedPerformance"])
    assert predicted["ttft_s"] > 0 and predicted["itl_full_batch_s"] >= predicted["itl_batch1_s"] > 0
    assert predicted["usd_per_million_tokens"] > 0


def test_goodput_builds_the_layout_and_the_fleet_size_it_recommends():
    context = {"model_id": "meta-llama/Meta-Llama-3.1-8B-Instruct", "instance_type": "inf2.48xlarge",
               "objective": "goodput", "rate": "30", "p99_ttft_ms": "2000", "fleet": "asg"}
    settings = StackSettings.from_context(context.get)
    assert settings.load is not None and settings.load.instances > 1
    synthesized = synthesize(context)
    [group] = synthesized.resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert int(group["Properties"]["MinSize"]) == settings.load.instances
    assert int(group["Properties"]["MaxSize"]) == settings.load.instances
    layout = json.loads(synthesized.json["Outputs"]["ServingPlan"]["Value"])
    assert (layout["batch_size"], layout["sequence_length"]) == (settings.plan().batch_size,
                                                                settings.plan().sequence_length)
    assert "the cheapest fleet" in synthesized.json["Outputs"]["ServingPlan"]["Description"]


def test_an_objective_chooses_the_degree_and_says_why():
    latency = synthesize({"model_id": "meta-llama/Meta-Llama-3.1-8B-Instruct", "instance_type": "inf2.48xlarge",
                          "objective": "latency"})
    chosen = latency.json["Outputs"]["ServingPlan"]
    assert json.loads(chosen["Value"])["tensor_parallel"] > 2
    assert chosen["Description"].startswith("The layout (")
