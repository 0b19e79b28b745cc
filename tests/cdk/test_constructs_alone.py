"""Each construct built alone in a bare stack and asserted the way aws-cdk-lib asserts its own
(aws-autoscaling/test/auto-scaling-group.test.ts): ``Template.has_resource_properties`` with
``Match`` and ``Capture`` for the behaviour a user relies on; a non-default prop and what it
changes; an invalid prop and the error that names it. Each stack is built and synthesized once
per module, and several tests read its template. The whole-stack snapshots stay in
test_synth_checks.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from aws_cdk import App, CfnElement, CfnParameter, DefaultStackSynthesizer, Duration, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Capture, Match, Template

from constructs import Construct
from neuron_serving import (
    AlarmThresholds,
    NeuronArtifactCache,
    NeuronBootScript,
    NeuronExportBuilder,
    NeuronServingEndpoint,
    NeuronServingFleet,
    NeuronServingInstance,
    NeuronServingLaunchTemplate,
    NeuronServingMonitoring,
    PinnedLinuxImage,
    ServingConfigError,
    ServingRequest,
    neuron_dlami,
    plan_serving,
    resolve_host,
)
from neuron_serving.cdk.artifact_cache import (
    BUCKET_DENIED_ACTIONS,
    CACHE_OBJECT_ACTIONS,
    HISTORY_DENIED_ACTIONS,
    MARKER_DENIED_ACTIONS,
)
from neuron_serving.cdk.buckets import LOG_BUCKET_REASON, log_bucket, private_bucket
from neuron_serving.cdk.instance import SESSION_MANAGER_ACTIONS
from neuron_serving.cdk.scanners import skip_checkov
from neuron_serving.plan.layout import builder_plan
from neuron_serving.plan.metrics import API_KEY_SYNC_FAILURES
from neuron_serving.plan.timing import boot_minutes
from neuron_serving.render.boot import BUNDLE_ENV, METADATA_KEY

from .conftest import FEATURE_FLAGS
from .constructs_support import (
    PRIVATE_SUBNETS,
    PUBLIC_SUBNETS,
    SIGNALLED_ID,
    STACK_NAME,
    VPC_CIDR,
    bare_stack,
    boot_script,
    imported_vpc,
    known_at_synth,
    small_plan,
)


@dataclass
class Built:
    """A bare stack, the construct built in it, and the stack's template."""

    stack: Stack
    construct: Any
    template: Template

    def logical_id(self, construct: Construct) -> str:
        """The logical id of ``construct``, a CloudFormation resource or an L2 around one."""
        child = construct if isinstance(construct, CfnElement) else construct.node.default_child
        assert isinstance(child, CfnElement)
        return self.stack.get_logical_id(child)


def _built(stack: Stack, construct: Any) -> Built:
    return Built(stack, construct, Template.from_stack(stack))


def _statements(template: Template) -> list[dict[str, Any]]:
    """Every statement of the stack's IAM policies."""
    return [s for p in template.find_resources("AWS::IAM::Policy").values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


# CDK writes a policy's actions sorted (aws-cdk-lib 2.275.0 aws-iam/lib/private/postprocess-policy-document.ts,
# PostProcessPolicyDocument with sort on: sortByJson), hence ``sorted(...)`` in the expected statements.
def _objects_arn(bucket_id: str, pattern: str) -> dict[str, Any]:
    """How CloudFormation spells ``bucket.arn_for_objects(pattern)``."""
    return {"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, f"/{pattern}"]]}


# --- NeuronArtifactCache ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache() -> Built:
    stack = bare_stack()
    construct = NeuronArtifactCache(stack, "Cache")
    construct.grant_cache(iam.Role(stack, "Host", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")))
    return _built(stack, construct)


def test_the_cache_bucket_is_encrypted_versioned_and_closed_to_the_public(cache: Built) -> None:
    cache.template.has_resource_properties("AWS::S3::Bucket", {
        "BucketEncryption": {"ServerSideEncryptionConfiguration": [
            {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
        "PublicAccessBlockConfiguration": {"BlockPublicAcls": True, "BlockPublicPolicy": True,
                                           "IgnorePublicAcls": True, "RestrictPublicBuckets": True},
        "VersioningConfiguration": {"Status": "Enabled"},
        "LifecycleConfiguration": {"Rules": [{
            "Status": "Enabled",
            "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
            "ExpiredObjectDeleteMarker": True,
        }]},
    })


def test_the_cache_bucket_refuses_requests_without_tls(cache: Built) -> None:
    cache.template.has_resource_properties("AWS::S3::BucketPolicy", {
        "Bucket": {"Ref": cache.logical_id(cache.construct.bucket)},
        "PolicyDocument": {"Statement": Match.array_with([Match.object_like({
            "Effect": "Deny", "Action": "s3:*", "Principal": {"AWS": "*"},
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        })])},
    })


def test_the_cache_is_kept_when_the_stack_is_deleted(cache: Built) -> None:
    cache.template.has_resource("AWS::S3::Bucket", {"DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"})
    assert cache.construct.uri.endswith("/exports")


def test_grant_cache_allows_objects_below_the_exports_prefix_and_listing_the_bucket(cache: Built) -> None:
    bucket = cache.logical_id(cache.construct.bucket)
    objects = Capture()
    cache.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        {"Effect": "Allow", "Action": sorted(CACHE_OBJECT_ACTIONS), "Resource": objects},
        # Unconditioned, so that a marker not there yet is a 404, not a 403 (grant_cache).
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": {"Fn::GetAtt": [bucket, "Arn"]}},
    ])}})
    assert objects.as_object() == _objects_arn(bucket, "exports/*")
    allowed = [s for s in _statements(cache.template) if s["Effect"] == "Allow"]
    assert len(allowed) == 2


def test_grant_cache_makes_markers_write_once_and_history_undeletable(cache: Built) -> None:
    bucket = cache.logical_id(cache.construct.bucket)
    markers = _objects_arn(bucket, "exports/*/COMPLETE")
    cache.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        {"Effect": "Deny", "Action": sorted(MARKER_DENIED_ACTIONS), "Resource": markers},
        {"Effect": "Deny", "Action": "s3:PutObject", "Resource": markers,
         "Condition": {"StringNotEquals": {"s3:if-none-match": "*"}}},
        {"Effect": "Deny", "Action": sorted(HISTORY_DENIED_ACTIONS), "Resource": _objects_arn(bucket, "*")},
        {"Effect": "Deny", "Action": sorted(BUCKET_DENIED_ACTIONS), "Resource": {"Fn::GetAtt": [bucket, "Arn"]}},
    ])}})


@pytest.fixture(scope="module")
def cache_with_props() -> Built:
    stack = bare_stack()
    logs = private_bucket(stack, "Logs")
    construct = NeuronArtifactCache(stack, "Cache", server_access_logs_bucket=logs,
                                    removal_policy=RemovalPolicy.DESTROY,
                                    noncurrent_version_expiration=Duration.days(7))
    return _built(stack, construct)


def test_a_cache_with_access_logs_logs_under_its_own_prefix_and_keeps_versions_as_told(
        cache_with_props: Built) -> None:
    logs = cache_with_props.stack.node.find_child("Logs")
    cache_with_props.template.has_resource("AWS::S3::Bucket", {
        "DeletionPolicy": "Delete",
        "Properties": Match.object_like({
            "LoggingConfiguration": {"DestinationBucketName": {"Ref": cache_with_props.logical_id(logs)},
                                     "LogFilePrefix": "s3/artifact-cache/"},
            "LifecycleConfiguration": {"Rules": [Match.object_like({
                "NoncurrentVersionExpiration": {"NoncurrentDays": 7}})]},
        }),
    })


def test_a_cache_refuses_a_noncurrent_version_expiration_of_part_of_a_day() -> None:
    with pytest.raises(ServingConfigError, match=r"^noncurrent_version_expiration \('0.5 days'\) must be a whole "
                                                 r"number of days, at least 1"):
        NeuronArtifactCache(bare_stack(), "Cache", noncurrent_version_expiration=Duration.hours(12))


# --- buckets.py and scanners.py -----------------------------------------------------------------

@pytest.fixture(scope="module")
def access_logs() -> Built:
    stack = bare_stack()
    return _built(stack, log_bucket(stack, "AccessLogs"))


def test_a_log_bucket_is_private_versioned_kept_and_expires_logs_after_90_days(access_logs: Built) -> None:
    access_logs.template.has_resource("AWS::S3::Bucket", {
        "DeletionPolicy": "Retain",
        "Properties": Match.object_like({
            "BucketEncryption": {"ServerSideEncryptionConfiguration": [
                {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]},
            "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True,
                                                                 "RestrictPublicBuckets": True}),
            "VersioningConfiguration": {"Status": "Enabled"},
            "LifecycleConfiguration": {"Rules": [{"Status": "Enabled", "ExpirationInDays": 90,
                                                  "NoncurrentVersionExpiration": {"NoncurrentDays": 90}}]},
        }),
    })
    access_logs.template.has_resource_properties("AWS::S3::BucketPolicy", {"PolicyDocument": {
        "Statement": Match.array_with([Match.object_like({"Condition": {"Bool": {"aws:SecureTransport": "false"}},
                                                          "Effect": "Deny"})])}})


def test_a_log_bucket_tells_checkov_why_it_logs_nowhere(access_logs: Built) -> None:
    access_logs.template.has_resource("AWS::S3::Bucket", {
        "Metadata": {"checkov": {"skip": [{"id": "CKV_AWS_18", "comment": LOG_BUCKET_REASON}]}},
    })


def test_skip_checkov_replaces_an_earlier_skip_of_the_same_check() -> None:
    stack = bare_stack()
    bucket = private_bucket(stack, "Bucket")
    skip_checkov(bucket, "CKV_AWS_18", "first reason")
    skip_checkov(bucket, "CKV_AWS_21", "versions are not kept")
    skip_checkov(bucket, "CKV_AWS_18", "second reason")
    skips = Capture()
    Template.from_stack(stack).has_resource("AWS::S3::Bucket", {"Metadata": {"checkov": {"skip": skips}}})
    assert skips.as_array() == [{"id": "CKV_AWS_21", "comment": "versions are not kept"},
                                {"id": "CKV_AWS_18", "comment": "second reason"}]


def test_skip_checkov_names_a_construct_that_is_no_resource() -> None:
    stack = bare_stack()
    with pytest.raises(ServingConfigError, match=r"^skip_checkov \('Own/Plain'\) is not a CloudFormation resource$"):
        skip_checkov(Construct(stack, "Plain"), "CKV_AWS_18", "reason")


# --- NeuronServingLaunchTemplate and the machine images -----------------------------------------

DLAMI_PARAMETER = "/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id"


@pytest.fixture(scope="module")
def launch_template() -> Built:
    stack = bare_stack()
    construct = NeuronServingLaunchTemplate(stack, "Host", vpc=imported_vpc(stack), boot_script=boot_script(stack),
                                            machine_image=neuron_dlami(DLAMI_PARAMETER))
    return _built(stack, construct)


def test_a_host_needs_imdsv2_with_one_hop_and_is_monitored_in_detail(launch_template: Built) -> None:
    launch_template.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        "Monitoring": {"Enabled": True},
        "InstanceType": "inf2.xlarge",
    }})


def test_a_hosts_root_volume_is_an_encrypted_gp3_sized_by_the_plan(launch_template: Built) -> None:
    volume = launch_template.construct.boot_script.root_volume
    launch_template.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
            "VolumeSize": small_plan().root_volume_gib, "VolumeType": "gp3", "Encrypted": True,
            "DeleteOnTermination": True, "Throughput": volume.throughput, "Iops": volume.iops}}],
    }})
    assert launch_template.construct.root_volume_gib == small_plan().root_volume_gib


def test_neuron_dlami_is_resolved_by_ec2_at_launch_not_looked_up_at_synth(launch_template: Built) -> None:
    launch_template.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "ImageId": f"resolve:ssm:{DLAMI_PARAMETER}"}})
    # What MachineImage.from_ssm_parameter would add instead: a parameter of type
    # AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>, resolved at each deploy, not each launch.
    assert launch_template.template.find_parameters("*", {"Type": Match.string_like_regexp("Image::Id")}) == {}


def test_a_hosts_security_group_lets_nothing_in_and_everything_out(launch_template: Built) -> None:
    launch_template.template.has_resource_properties("AWS::EC2::SecurityGroup", {
        "SecurityGroupIngress": Match.absent(),
        "SecurityGroupEgress": [{"CidrIp": "0.0.0.0/0", "IpProtocol": "-1",
                                 "Description": "Allow all outbound traffic by default"}],
    })
    launch_template.template.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)


def test_a_hosts_role_has_session_manager_without_the_managed_policy(launch_template: Built) -> None:
    launch_template.template.has_resource_properties("AWS::IAM::Role", {
        "AssumeRolePolicyDocument": {"Statement": [Match.object_like({
            "Action": "sts:AssumeRole", "Principal": {"Service": "ec2.amazonaws.com"}})]},
        "ManagedPolicyArns": Match.absent(),
    })
    instances = Capture()
    launch_template.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {
        "Statement": Match.array_with([
            {"Effect": "Allow", "Action": "ssm:UpdateInstanceInformation", "Resource": instances},
            {"Effect": "Allow", "Action": sorted(SESSION_MANAGER_ACTIONS), "Resource": "*"},
        ])}})
    assert instances.as_object() == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":ec2:", {"Ref": "AWS::Region"}, ":", {"Ref": "AWS::AccountId"},
        ":instance/*"]]}


@pytest.fixture(scope="module")
def launch_template_with_props() -> Built:
    stack = bare_stack()
    construct = NeuronServingLaunchTemplate(stack, "Host", vpc=imported_vpc(stack), boot_script=boot_script(stack),
                                            machine_image=PinnedLinuxImage("ami-0123456789abcdef0"),
                                            root_volume_gib=300, session_manager=False)
    return _built(stack, construct)


def test_a_pinned_ami_a_larger_root_volume_and_no_session_manager(launch_template_with_props: Built) -> None:
    launch_template_with_props.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": {
        "ImageId": "ami-0123456789abcdef0",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": Match.object_like({"VolumeSize": 300})}],
    }})
    actions = {a for s in _statements(launch_template_with_props.template)
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions.isdisjoint({"ssm:UpdateInstanceInformation", *SESSION_MANAGER_ACTIONS})


def test_a_launch_template_names_a_root_volume_too_small_for_its_iops() -> None:
    stack = bare_stack()
    with pytest.raises(ServingConfigError, match=r"^root_volume_iops \(3000\) must be at most 2500 on a root volume "
                                                 r"of 5 GiB"):
        NeuronServingLaunchTemplate(stack, "Host", vpc=imported_vpc(stack), boot_script=boot_script(stack),
                                    machine_image=neuron_dlami(DLAMI_PARAMETER), root_volume_gib=5)


def test_a_token_root_volume_is_checked_when_the_app_synthesizes() -> None:
    stack = bare_stack()
    NeuronServingLaunchTemplate(stack, "Host", vpc=imported_vpc(stack), boot_script=boot_script(stack),
                                machine_image=neuron_dlami(DLAMI_PARAMETER), root_volume_gib=known_at_synth(0))
    with pytest.raises(Exception, match=r"root_volume_gib \(0\) must be at least 1 on inf2.xlarge"):
        Template.from_stack(stack)


# --- NeuronServingInstance ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def instance() -> Built:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    return _built(stack, NeuronServingInstance(stack, "Instance", vpc=vpc, launch_template=host))


def test_an_instance_waits_for_its_boot_scripts_signal_within_the_boot_timeout(instance: Built) -> None:
    minutes = int(instance.construct.launch_template.boot_script.boot_timeout.to_minutes())
    instances = instance.template.find_resources("AWS::EC2::Instance", {
        "CreationPolicy": {"ResourceSignal": {"Count": 1, "Timeout": f"PT{minutes}M"}}})
    assert list(instances) == [SIGNALLED_ID]


def test_an_instance_runs_the_latest_launch_template_version_in_the_first_private_subnet(instance: Built) -> None:
    template_id = instance.logical_id(instance.construct.launch_template.launch_template)
    instance.template.has_resource_properties("AWS::EC2::Instance", {
        "LaunchTemplate": {"LaunchTemplateId": {"Ref": template_id},
                           "Version": {"Fn::GetAtt": [template_id, "LatestVersionNumber"]}},
        "SubnetId": PRIVATE_SUBNETS[0],
        "Monitoring": True,
        "Tags": Match.array_with([{"Key": "Name", "Value": "Own/Instance (inf2.xlarge)"}]),
    })


def test_an_instance_in_a_public_subnet_without_a_signal_has_no_creation_policy() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack, signalled=False),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    NeuronServingInstance(stack, "Instance", vpc=vpc, launch_template=host,
                          vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC))
    Template.from_stack(stack).has_resource("AWS::EC2::Instance", {
        "CreationPolicy": Match.absent(),
        "Properties": Match.object_like({"SubnetId": PUBLIC_SUBNETS[0]}),
    })


def test_an_instance_names_vpc_subnets_that_select_nothing() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    with pytest.raises(ServingConfigError, match=r"^vpc_subnets \(.*'us-west-2a'.*\) selects no subnet"):
        NeuronServingInstance(stack, "Instance", vpc=vpc, launch_template=host,
                              vpc_subnets=ec2.SubnetSelection(availability_zones=["us-west-2a"]))


# --- NeuronServingFleet -------------------------------------------------------------------------

def _fleet(**props: Any) -> Built:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    return _built(stack, NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, **props))


@pytest.fixture(scope="module")
def fleet() -> Built:
    return _fleet()


def test_a_fleet_is_created_and_rolled_one_host_at_a_time_waiting_for_signals(fleet: Built) -> None:
    boot = fleet.construct.launch_template.boot_script
    pause = Capture()
    groups = fleet.template.find_resources("AWS::AutoScaling::AutoScalingGroup", {
        "CreationPolicy": {"ResourceSignal": {"Count": 1, "Timeout": pause}},
        "UpdatePolicy": Match.object_like({"AutoScalingRollingUpdate": Match.object_like({
            "MaxBatchSize": 1, "MinInstancesInService": 0, "WaitOnResourceSignals": True, "PauseTime": pause})}),
    })
    assert list(groups) == [SIGNALLED_ID]
    hours, minutes = divmod(int(boot.boot_timeout.to_minutes()), 60)
    assert pause.as_string() == f"PT{hours}H{minutes}M"


def test_a_fleet_checks_elb_health_after_a_grace_of_the_boot_timeout(fleet: Built) -> None:
    boot = fleet.construct.launch_template.boot_script
    warmup = boot_minutes(small_plan(), throughput=boot.root_volume.throughput, exports=False)
    fleet.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "MinSize": "1", "MaxSize": "2", "DesiredCapacity": Match.absent(),
        "HealthCheckType": "ELB", "HealthCheckGracePeriod": int(boot.boot_timeout.to_seconds()),
        "DefaultInstanceWarmup": warmup * 60,
        "MetricsCollection": [{"Granularity": "1Minute"}],
        "VPCZoneIdentifier": PRIVATE_SUBNETS,
    })


def test_a_fleet_notifies_a_topic_encrypted_with_a_key_auto_scaling_may_use(fleet: Built) -> None:
    topic = fleet.logical_id(fleet.construct.notifications_topic)
    fleet.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "NotificationConfigurations": [Match.object_like({"TopicARN": {"Ref": topic}})]})
    key = Capture()
    fleet.template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": {"Fn::GetAtt": [key, "Arn"]}})
    fleet.template.has_resource("AWS::KMS::Key", {"Properties": Match.object_like({
        "EnableKeyRotation": True,
        "KeyPolicy": {"Statement": Match.array_with([Match.object_like({
            "Action": ["kms:Decrypt", "kms:GenerateDataKey*"],
            "Principal": {"AWS": {"Fn::Join": ["", Match.array_with([Match.string_like_regexp(
                "role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling$")])]}},
        })])},
    })})
    assert key.as_string() in fleet.template.find_resources("AWS::KMS::Key")
    fleet.template.has_resource_properties("AWS::SNS::TopicPolicy", {"PolicyDocument": {"Statement": [
        Match.object_like({"Effect": "Deny", "Condition": {"Bool": {"aws:SecureTransport": "false"}}})]}})


@pytest.fixture(scope="module")
def fleet_with_props() -> Built:
    return _fleet(min_capacity=2, max_capacity=4, desired_capacity=3, health_check_grace=Duration.minutes(10),
                  instance_warmup=Duration.minutes(5))


def test_a_fleet_of_two_keeps_one_host_serving_through_an_update(fleet_with_props: Built) -> None:
    fleet_with_props.template.has_resource("AWS::AutoScaling::AutoScalingGroup", {
        "CreationPolicy": {"ResourceSignal": Match.object_like({"Count": 2})},
        "UpdatePolicy": Match.object_like({"AutoScalingRollingUpdate": Match.object_like({
            "MinInstancesInService": 1})}),
        "Properties": Match.object_like({"MinSize": "2", "MaxSize": "4", "DesiredCapacity": "3",
                                         "HealthCheckGracePeriod": 600, "DefaultInstanceWarmup": 300}),
    })


def test_a_fleet_given_a_topic_makes_no_topic_or_key_of_its_own() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    topic = sns.Topic.from_topic_arn(stack, "Ops", "arn:aws:sns:us-east-1:111122223333:ops")
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, notifications_topic=topic)
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"NotificationConfigurations": [
        Match.object_like({"TopicARN": "arn:aws:sns:us-east-1:111122223333:ops"})]})
    template.resource_count_is("AWS::SNS::Topic", 0)
    template.resource_count_is("AWS::KMS::Key", 0)


def test_a_fleet_names_a_negative_min_capacity() -> None:
    with pytest.raises(ServingConfigError, match=r"^min_capacity \(-1\) must be at least 0$"):
        _fleet(min_capacity=-1)


def test_a_token_desired_capacity_is_checked_when_the_app_synthesizes() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, desired_capacity=known_at_synth(9))
    with pytest.raises(Exception, match=r"desired_capacity \(9\) must lie between min_capacity \(1\) and "
                                        r"max_capacity \(2\)"):
        Template.from_stack(stack)


def test_a_token_min_capacity_still_keeps_min_capacity_minus_one_in_service() -> None:
    built = _fleet(min_capacity=known_at_synth(3), max_capacity=4)
    built.template.has_resource("AWS::AutoScaling::AutoScalingGroup", {"UpdatePolicy": Match.object_like({
        "AutoScalingRollingUpdate": Match.object_like({"MinInstancesInService": 2})})})


def test_a_token_min_capacity_scales_back_to_itself_on_schedule() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    fleet = NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=known_at_synth(3),
                               max_capacity=4)
    fleet.scale_on_schedule(scale_down="0 20 * * 1-5", scale_up="0 7 * * 1-5")
    template = Template.from_stack(stack)
    template.has_resource_properties("AWS::AutoScaling::ScheduledAction", {
        "Recurrence": "0 7 * * 1-5", "MinSize": 3, "DesiredCapacity": 3})
    template.has_resource_properties("AWS::AutoScaling::ScheduledAction", {
        "Recurrence": "0 20 * * 1-5", "MinSize": 0, "DesiredCapacity": 0})


def test_a_min_capacity_only_cloudformation_knows_is_refused_at_synth_naming_it() -> None:
    stack = bare_stack()
    vpc = imported_vpc(stack)
    host = NeuronServingLaunchTemplate(stack, "Host", vpc=vpc, boot_script=boot_script(stack),
                                       machine_image=neuron_dlami(DLAMI_PARAMETER))
    minimum = CfnParameter(stack, "Min", type="Number", default=2)
    NeuronServingFleet(stack, "Fleet", vpc=vpc, launch_template=host, min_capacity=minimum.value_as_number,
                       max_capacity=4)
    with pytest.raises(Exception, match=r"min_capacity \(.*\) must be known at synth: a rolling update keeps"):
        Template.from_stack(stack)


# --- NeuronServingEndpoint ----------------------------------------------------------------------

CERTIFICATE = "arn:aws:acm:us-east-1:111122223333:certificate/3f2a6c1e-8d4b-4e7a-9c2f-1b5d7e9a0c3d"


@pytest.fixture(scope="module")
def endpoint() -> Built:
    stack = bare_stack()
    return _built(stack, NeuronServingEndpoint(stack, "Endpoint", vpc=imported_vpc(stack), target_port=8080))


def test_an_endpoint_is_internal_in_private_subnets_and_logs_access(endpoint: Built) -> None:
    bucket = endpoint.logical_id(endpoint.construct.access_logs_bucket)
    endpoint.template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {
        "Scheme": "internal",
        "Subnets": PRIVATE_SUBNETS,
        "LoadBalancerAttributes": Match.array_with([
            {"Key": "idle_timeout.timeout_seconds", "Value": "300"},
            {"Key": "routing.http.drop_invalid_header_fields.enabled", "Value": "true"},
            {"Key": "access_logs.s3.enabled", "Value": "true"},
            {"Key": "access_logs.s3.bucket", "Value": {"Ref": bucket}},
            {"Key": "access_logs.s3.prefix", "Value": "alb"},
        ]),
    })
    endpoint.template.has_resource_properties("AWS::S3::BucketPolicy", {"PolicyDocument": {
        "Statement": Match.array_with([Match.object_like({
            "Action": "s3:PutObject", "Effect": "Allow",
            "Principal": {"Service": "logdelivery.elasticloadbalancing.amazonaws.com"}})])}})


def test_an_endpoint_balances_by_outstanding_requests_and_checks_health(endpoint: Built) -> None:
    endpoint.template.has_resource_properties("AWS::ElasticLoadBalancingV2::TargetGroup", {
        "Port": 8080, "Protocol": "HTTP", "TargetType": "instance",
        "HealthCheckPath": "/health", "Matcher": {"HttpCode": "200"},
        "HealthCheckIntervalSeconds": 15, "HealthCheckTimeoutSeconds": 5,
        "HealthyThresholdCount": 2, "UnhealthyThresholdCount": 3,
        "TargetGroupAttributes": Match.array_with([
            {"Key": "deregistration_delay.timeout_seconds", "Value": "300"},
            {"Key": "load_balancing.algorithm.type", "Value": "least_outstanding_requests"},
        ]),
    })
    group = endpoint.logical_id(endpoint.construct.target_group)
    endpoint.template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {
        "Port": 80, "Protocol": "HTTP",
        "DefaultActions": [{"Type": "forward", "TargetGroupArn": {"Ref": group}}],
    })


def test_an_endpoint_without_allowed_cidrs_opens_port_80_to_the_vpc_only(endpoint: Built) -> None:
    ingress = Capture()
    endpoint.template.has_resource_properties("AWS::EC2::SecurityGroup", {"SecurityGroupIngress": ingress})
    assert ingress.as_array() == [{"CidrIp": VPC_CIDR, "Description": "LLM clients", "FromPort": 80,
                                   "IpProtocol": "tcp", "ToPort": 80}]
    endpoint.template.resource_count_is("AWS::WAFv2::WebACL", 0)


@pytest.fixture(scope="module")
def public_endpoint() -> Built:
    stack = bare_stack()
    construct = NeuronServingEndpoint(
        stack, "Endpoint", vpc=imported_vpc(stack), target_port=8080, internet_facing=True,
        allowed_cidrs=["203.0.113.0/24"], certificate=elbv2.ListenerCertificate.from_arn(CERTIFICATE),
        rate_limit=2000, deregistration_delay=Duration.seconds(30))
    return _built(stack, construct)


def test_an_internet_facing_endpoint_serves_https_and_redirects_http(public_endpoint: Built) -> None:
    template = public_endpoint.template
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::LoadBalancer", {
        "Scheme": "internet-facing", "Subnets": PUBLIC_SUBNETS})
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {
        "Port": 443, "Protocol": "HTTPS", "Certificates": [{"CertificateArn": CERTIFICATE}],
        # elbv2.SslPolicy.RECOMMENDED_TLS, TLS 1.2 and 1.3 only (aws-cdk-lib 2.275.0
        # aws-elasticloadbalancingv2/lib/shared/enums.ts).
        "SslPolicy": "ELBSecurityPolicy-TLS13-1-2-2021-06"})
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::Listener", {
        "Port": 80, "DefaultActions": [Match.object_like({"Type": "redirect", "RedirectConfig": Match.object_like({
            "Port": "443", "Protocol": "HTTPS", "StatusCode": "HTTP_301"})})]})
    ingress = Capture()
    template.has_resource_properties("AWS::EC2::SecurityGroup", {"SecurityGroupIngress": ingress})
    assert {(r["CidrIp"], r["FromPort"]) for r in ingress.as_array()} == {("203.0.113.0/24", 443),
                                                                         ("203.0.113.0/24", 80)}
    template.has_resource_properties("AWS::ElasticLoadBalancingV2::TargetGroup", {"TargetGroupAttributes":
        Match.array_with([{"Key": "deregistration_delay.timeout_seconds", "Value": "30"}])})


def test_a_rate_limit_blocks_a_client_ip_with_429_over_five_minutes(public_endpoint: Built) -> None:
    rule = Capture()
    public_endpoint.template.has_resource_properties("AWS::WAFv2::WebACL", {
        "Scope": "REGIONAL", "DefaultAction": {"Allow": {}}, "Rules": [rule]})
    assert rule.as_object()["Statement"] == {"RateBasedStatement": {
        "AggregateKeyType": "IP", "Limit": 2000, "EvaluationWindowSec": 300}}
    assert rule.as_object()["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 429
    acl = public_endpoint.logical_id(public_endpoint.construct.web_acl)
    public_endpoint.template.has_resource_properties("AWS::WAFv2::WebACLAssociation", {
        "WebACLArn": {"Fn::GetAtt": [acl, "Arn"]}})


def test_an_internet_facing_endpoint_names_every_missing_prop_at_once() -> None:
    stack = bare_stack()
    with pytest.raises(ServingConfigError) as err:
        NeuronServingEndpoint(stack, "Endpoint", vpc=imported_vpc(stack), target_port=8080, internet_facing=True)
    assert [p.split(" ")[0] for p in err.value.problems] == ["allowed_cidrs", "certificate"]


def test_a_token_rate_limit_is_checked_when_the_app_synthesizes() -> None:
    stack = bare_stack()
    NeuronServingEndpoint(stack, "Endpoint", vpc=imported_vpc(stack), target_port=8080, rate_limit=known_at_synth(5))
    with pytest.raises(Exception, match=r"rate_limit \(5\) must be 10 to 2000000000 requests per client IP"):
        Template.from_stack(stack)


# --- NeuronServingMonitoring --------------------------------------------------------------------

def _monitoring(**props: Any) -> Built:
    """Monitoring watching an endpoint's load balancer (the input ``watch`` needs)."""
    api_keys = props.pop("api_keys", False)
    stack = bare_stack()
    construct = NeuronServingMonitoring(stack, "Monitoring", **props)
    endpoint = NeuronServingEndpoint(stack, "Endpoint", vpc=imported_vpc(stack), target_port=8080)
    construct.watch(plan=small_plan(), endpoint_load_balancer=endpoint.load_balancer,
                    target_group=endpoint.target_group, api_keys=api_keys)
    construct.grant_publish(iam.Role(stack, "Host", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")))
    return _built(stack, construct)


@pytest.fixture(scope="module")
def monitoring() -> Built:
    return _monitoring()


def test_monitoring_keeps_four_log_groups_for_two_weeks(monitoring: Built) -> None:
    monitoring.template.resource_properties_count_is("AWS::Logs::LogGroup", {"RetentionInDays": 14}, 4)
    groups = Capture()
    monitoring.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([{
        "Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"],
        "Resource": groups}])}})
    assert sorted(r["Fn::GetAtt"][0] for r in groups.as_array()) == sorted(
        monitoring.logical_id(g) for g in monitoring.construct.log_groups.values())


def test_monitoring_alarms_on_the_error_rate_above_five_percent_in_two_of_three_periods(monitoring: Built) -> None:
    topic = monitoring.logical_id(monitoring.construct.alarm_topic)
    metrics = Capture()
    monitoring.template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "AlarmDescription": "5xx answers above 5.0% of requests",
        "Threshold": 5, "EvaluationPeriods": 3, "DatapointsToAlarm": 2,
        "ComparisonOperator": "GreaterThanThreshold", "TreatMissingData": "notBreaching",
        "AlarmActions": [{"Ref": topic}], "OKActions": [{"Ref": topic}],
        "Metrics": metrics,
    })
    expression = next(m for m in metrics.as_array() if "Expression" in m)
    assert expression["Expression"] == "IF(requests > 0, 100 * (FILL(target, 0) + FILL(elb, 0)) / requests, 0)"
    assert expression["ReturnData"] is True
    monitoring.template.resource_count_is("AWS::CloudWatch::Alarm", 6)


def test_monitoring_alarms_on_the_fullest_hosts_disk(monitoring: Built) -> None:
    threshold, metric = Capture(), Capture()
    monitoring.template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "AlarmDescription": Match.string_like_regexp("root file system"),
        "Threshold": threshold, "MetricName": metric, "Namespace": "NeuronServing", "Statistic": "Maximum",
        "Period": 300, "Dimensions": [{"Name": "Service", "Value": "Own"}],
    })
    assert (metric.as_string(), threshold.as_number()) == ("DiskUtilization", 85)


def test_monitoring_publishes_alarms_to_a_topic_cloudwatch_may_encrypt_for(monitoring: Built) -> None:
    monitoring.template.has_resource_properties("AWS::KMS::Key", {
        "EnableKeyRotation": True,
        "KeyPolicy": {"Statement": Match.array_with([Match.object_like({
            "Action": ["kms:Decrypt", "kms:GenerateDataKey*"], "Principal": {"Service": "cloudwatch.amazonaws.com"},
        })])},
    })
    monitoring.template.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardName": "Own"})


@pytest.fixture(scope="module")
def monitoring_with_props() -> Built:
    return _monitoring(log_retention_days=30, alarm_email="ops@example.com",
                       thresholds=AlarmThresholds(disk_percent=70), dashboard_name="llama", api_keys=True)


def test_monitoring_with_its_own_thresholds_retention_email_and_key_sync_alarm(monitoring_with_props: Built) -> None:
    template = monitoring_with_props.template
    template.resource_properties_count_is("AWS::Logs::LogGroup", {"RetentionInDays": 30}, 4)
    template.has_resource_properties("AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"})
    template.has_resource_properties("AWS::CloudWatch::Alarm", {"MetricName": "DiskUtilization", "Threshold": 70})
    template.has_resource_properties("AWS::CloudWatch::Alarm", {
        "MetricName": API_KEY_SYNC_FAILURES, "Threshold": 1,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold"})
    template.resource_count_is("AWS::CloudWatch::Alarm", 7)
    template.has_resource_properties("AWS::CloudWatch::Dashboard", {"DashboardName": "llama"})


def test_monitoring_names_a_retention_cloudwatch_logs_does_not_offer() -> None:
    with pytest.raises(ServingConfigError, match=r"^log_retention_days \(15\) must be one of 1, 3, 5, 7, 14, 30"):
        NeuronServingMonitoring(bare_stack(), "Monitoring", log_retention_days=15)


def test_a_token_latency_threshold_is_checked_when_the_app_synthesizes() -> None:
    stack = bare_stack()
    NeuronServingMonitoring(stack, "Monitoring",
                            thresholds=AlarmThresholds(p99_latency_seconds=known_at_synth(4000)))
    with pytest.raises(Exception, match=r"p99_latency_seconds \(4000\) must be a number above 0 and at most 3600"):
        Template.from_stack(stack)


def test_a_token_retention_is_checked_when_the_app_synthesizes() -> None:
    stack = bare_stack()
    NeuronServingMonitoring(stack, "Monitoring", log_retention_days=known_at_synth(15))
    with pytest.raises(Exception, match=r"log_retention_days \(15\) must be one of"):
        Template.from_stack(stack)


# --- NeuronBootScript ---------------------------------------------------------------------------

REGISTRY = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ghcr"


@pytest.fixture(scope="module")
def boot() -> Built:
    """A boot script granted to a role and attached to a launch template of the user's, with a spec of
    its own (vLLM from an ECR pull through cache, a pinned revision) and an artifact cache."""
    stack = bare_stack()
    spec = resolve_host(small_plan(), engine="vllm", image_registry=REGISTRY, image_registry_pull_through=True,
                        model_revision="5f0b02c75b57c5855da9ae460ce51323ea669d8a")
    construct = boot_script(stack, spec=spec, artifact_cache=NeuronArtifactCache(stack, "Cache"))
    construct.grant_boot(iam.Role(stack, "Host", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")))
    template = ec2.LaunchTemplate(stack, "Template", user_data=construct.user_data)
    construct.attach(template.node.default_child)  # type: ignore[arg-type]
    return _built(stack, construct)


def _values(boot: Built) -> tuple[str, str]:
    """The logical id of the launch template holding the boot script's values, and the values
    (``Fn::Join``'s parts, tokens as their intrinsic functions)."""
    metadata = Capture()
    boot.template.has_resource("AWS::EC2::LaunchTemplate", {"Metadata": {METADATA_KEY: metadata}})
    [logical_id] = boot.template.find_resources("AWS::EC2::LaunchTemplate")
    value = metadata.as_object()
    return logical_id, json.dumps(value)


def test_a_boot_script_lets_its_host_read_the_zipped_assets_of_the_assets_bucket_and_nothing_else_of_it(
        boot: Built) -> None:
    # A host launched from an older launch template version while the stack updates reads that version's
    # bundle (defect 8 of issue 37), which the policy of the current synth cannot name by its key.
    resource = Capture()
    boot.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        Match.object_like({"Action": "s3:GetObject", "Effect": "Allow", "Resource": resource})])}})
    # The assets bucket's ARN (account and region filled in at deploy), then its zipped assets' keys.
    assert resource.as_object()["Fn::Join"][1][-1] == "/*.zip"


def test_a_stacks_asset_bucket_prefix_narrows_its_hosts_read_of_the_zipped_assets_to_it() -> None:
    # The asset bucket is the CDK bootstrap's, shared by every CDK app of the account and region.
    stack = Stack(App(context=FEATURE_FLAGS), STACK_NAME,
                  synthesizer=DefaultStackSynthesizer(bucket_prefix="neuron-serving/"))
    construct = boot_script(stack)
    construct.grant_boot(iam.Role(stack, "Host", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")))
    construct.attach(ec2.LaunchTemplate(stack, "Template", user_data=construct.user_data).node.default_child)  # type: ignore[arg-type]
    resource = Capture()
    Template.from_stack(stack).has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {
        "Statement": Match.array_with([Match.object_like({"Action": "s3:GetObject", "Resource": resource})])}})
    assert resource.as_object()["Fn::Join"][1][-1] == "/neuron-serving/*.zip"


def test_a_boot_scripts_user_data_names_its_own_bundle_and_its_digest_and_the_metadata_neither(
        boot: Built) -> None:
    bundle = boot.construct.bundle
    user_data = Capture()
    boot.template.has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": Match.object_like({"UserData": {"Fn::Base64": user_data}})})
    # The bundle's key follows the assets bucket's name (filled in at deploy) in the user data's stack.env lines.
    parts = user_data.as_object()["Fn::Join"][1]
    assert [p for p in parts if isinstance(p, str) and p.startswith(f"/{bundle.s3_object_key}'\n")]
    assert f'<<<"{boot.construct.boot.digest}  MANIFEST"' in boot.construct.script
    assert bundle.s3_object_key not in _values(boot)[1]


def test_a_boot_script_keeps_the_stacks_values_in_the_metadata_of_the_resource_it_is_attached_to(
        boot: Built) -> None:
    logical_id, values = _values(boot)
    user_data = Capture()
    boot.template.has_resource_properties("AWS::EC2::LaunchTemplate", {
        "LaunchTemplateData": Match.object_like({"UserData": {"Fn::Base64": user_data}})})
    # The user data names the stack and that launch template, where the host reads the values,
    # with the permission to read them on this stack only.
    # (The logical id is quoted: it was a token when the script was rendered.)
    assert f"\nSTACK_NAME={STACK_NAME}\nHOST_RESOURCE='{logical_id}'\n" in user_data.as_object()["Fn::Join"][1][2]
    boot.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        Match.object_like({"Action": ["cloudformation:DescribeStackResource", "cloudformation:SignalResource"],
                           "Resource": {"Ref": "AWS::StackId"}}),
    ])}})
    assert "CACHE_BUCKET=" in values


def test_a_boot_script_that_is_attached_to_nothing_stops_synthesis_naming_itself() -> None:
    stack = bare_stack()
    boot_script(stack)
    with pytest.raises(Exception, match=r"NeuronBootScript Own/Boot is attached to no resource: call attach\(\)"):
        Template.from_stack(stack)


def test_a_boot_script_runs_on_one_resource_of_its_own_stack() -> None:
    stack = bare_stack()
    construct = boot_script(stack)
    first = ec2.LaunchTemplate(stack, "First", user_data=construct.user_data)
    construct.attach(first.node.default_child)  # type: ignore[arg-type]
    second = ec2.LaunchTemplate(stack, "Second", user_data=construct.user_data)
    with pytest.raises(ServingConfigError, match=r"^resource \('Own/Second/Resource'\) is a second resource for "
                       r"the boot script Own/Boot, attached to Own/First/Resource"):
        construct.attach(second.node.default_child)  # type: ignore[arg-type]
    other = ec2.LaunchTemplate(Stack(stack.node.root, "Other"), "Template")  # type: ignore[arg-type]
    alone = NeuronBootScript(bare_stack(), "Boot", plan=small_plan())
    with pytest.raises(ServingConfigError, match=r"^resource \('Other/Template/Resource'\) must be in the stack "):
        alone.attach(other.node.default_child)  # type: ignore[arg-type]


def test_a_boot_script_pulls_its_specs_image_from_its_registry_and_may_import_it(boot: Built) -> None:
    spec = boot.construct.spec
    repository = "ghcr/huggingface/optimum-neuron-vllm"
    assert spec.pulled == f"{REGISTRY}/huggingface/optimum-neuron-vllm:0.4.5"
    boot.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        # A token for docker takes no resource; the pull (and the pull through import) one repository.
        Match.object_like({"Action": "ecr:GetAuthorizationToken", "Resource": "*"}),
        Match.object_like({"Action": sorted(["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
                                             "ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]),
                           "Resource": f"arn:aws:ecr:us-east-1:111122223333:repository/{repository}"}),
    ])}})
    assert f"IMAGE={spec.pulled}\n" in boot.construct.boot.files[BUNDLE_ENV]


def test_a_boot_script_signals_its_stack_and_uses_its_cache(boot: Built) -> None:
    for statement in [{"Action": "s3:ListBucket"}, {"Action": Match.array_with(["cloudformation:SignalResource"]),
                                                     "Resource": {"Ref": "AWS::StackId"}}]:
        boot.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
            Match.object_like(statement)])}})
    # The cache's bucket is a deploy-time name: in the launch template's metadata, not in the user
    # data or the bundle.
    assert "CACHE_BUCKET=" in _values(boot)[1]
    assert "CACHE_BUCKET" not in boot.construct.script and "CACHE_BUCKET" not in boot.construct.boot.files[BUNDLE_ENV]


def test_a_boot_script_names_a_boot_timeout_cloudformation_cannot_wait_for() -> None:
    with pytest.raises(ServingConfigError, match=r"^boot_timeout \('900 minutes'\) must be 1 to 720 minutes"):
        boot_script(bare_stack(), boot_timeout=Duration.minutes(900))


# --- NeuronExportBuilder ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def builder() -> Built:
    """A builder for hosts that wait for its export: its spec derived from theirs."""
    stack = bare_stack()
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "inf2.xlarge", tensor_parallel=2))
    hosts = resolve_host(plan, model_revision="v1", export_role="wait")
    construct = NeuronExportBuilder(stack, "Builder", vpc=imported_vpc(stack), plan=builder_plan(plan, "inf2.8xlarge"),
                                    artifact_cache=NeuronArtifactCache(stack, "Cache"),
                                    machine_image=neuron_dlami(DLAMI_PARAMETER), spec=hosts)
    return _built(stack, construct)


def test_a_builder_is_a_group_of_at_most_one_that_starts_with_one(builder: Built) -> None:
    builder.template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {
        "MinSize": "0", "MaxSize": "1", "DesiredCapacity": "1",
        "AutoScalingGroupName": f"{STACK_NAME}-Builder",
        "VPCZoneIdentifier": PRIVATE_SUBNETS,
    })
    builder.template.has_resource_properties("AWS::EC2::LaunchTemplate", {"LaunchTemplateData": Match.object_like(
        {"InstanceType": "inf2.8xlarge"})})


def test_a_builder_may_leave_its_own_group_only(builder: Built) -> None:
    resource = Capture()
    builder.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        Match.object_like({"Action": "autoscaling:TerminateInstanceInAutoScalingGroup", "Resource": resource})])}})
    assert json.dumps(resource.as_object()).endswith(f':autoScalingGroupName/{STACK_NAME}-Builder"]]}}')


def test_a_builders_spec_is_the_hosts_building_under_the_same_export_key(builder: Built) -> None:
    spec = builder.construct.boot_script.spec
    assert spec.export_role == "build" and spec.model_revision == "v1"
    plan = builder.construct.plan
    assert spec.engine.export_key(plan, spec.image, spec.model_revision) in (
        builder.construct.boot_script.boot.files["/opt/neuron-serving/bin/export-model"])


def test_a_builder_for_hosts_that_serve_a_prebuilt_export_is_refused_naming_export_role() -> None:
    # Such hosts compile nothing, so there is nothing to build: the builder's spec (the hosts', building)
    # is checked as any boot's.
    stack = bare_stack()
    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "inf2.xlarge", tensor_parallel=2))
    refused = r"^export_role \('build'\) needs artifact_cache and no prebuilt_export"
    with pytest.raises(ServingConfigError, match=refused):
        NeuronExportBuilder(stack, "Builder", vpc=imported_vpc(stack), plan=builder_plan(plan, "inf2.8xlarge"),
                            artifact_cache=NeuronArtifactCache(stack, "Cache"),
                            machine_image=neuron_dlami(DLAMI_PARAMETER),
                            spec=resolve_host(plan, prebuilt_export="s3://models/llama"))
