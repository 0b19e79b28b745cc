"""Each construct built alone in a bare stack and asserted the way aws-cdk-lib asserts its own
(aws-autoscaling/test/auto-scaling-group.test.ts): ``Template.has_resource_properties`` with
``Match`` and ``Capture`` for the behaviour a user relies on; a non-default prop and what it
changes; an invalid prop and the error that names it. Each stack is built and synthesized once
per module, and several tests read its template. The whole-stack snapshots stay in
test_synth_checks.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Capture, Match, Template

from constructs import Construct
from neuron_serving import NeuronArtifactCache, ServingConfigError
from neuron_serving.cdk.artifact_cache import (
    BUCKET_DENIED_ACTIONS,
    CACHE_OBJECT_ACTIONS,
    HISTORY_DENIED_ACTIONS,
    MARKER_DENIED_ACTIONS,
)
from neuron_serving.cdk.buckets import LOG_BUCKET_REASON, log_bucket, private_bucket
from neuron_serving.cdk.scanners import skip_checkov

from .constructs_support import bare_stack


@dataclass
class Built:
    """A bare stack, the construct built in it, and the stack's template."""

    stack: Stack
    construct: Any
    template: Template

    def logical_id(self, construct: Construct) -> str:
        child = construct.node.default_child
        assert child is not None
        return self.stack.get_logical_id(child)  # type: ignore[arg-type]


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


def test_grant_cache_allows_objects_and_listing_only_below_the_exports_prefix(cache: Built) -> None:
    bucket = cache.logical_id(cache.construct.bucket)
    objects = Capture()
    cache.template.has_resource_properties("AWS::IAM::Policy", {"PolicyDocument": {"Statement": Match.array_with([
        {"Effect": "Allow", "Action": sorted(CACHE_OBJECT_ACTIONS), "Resource": objects},
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": {"Fn::GetAtt": [bucket, "Arn"]},
         "Condition": {"StringLike": {"s3:prefix": ["exports/*"]}}},
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
