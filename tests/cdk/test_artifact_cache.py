"""The artifact cache's bucket and the host's cache permissions: versioning and its lifecycle, and
the explicit denies that make a completion marker write-once and the bucket's history the hosts'
to read, never to erase. Each action, resource type and condition key is checked against AWS's
Service Authorization Reference as parliament 1.6.4 ships it."""

import json
from typing import Any

import pytest
from aws_cdk import App, Duration, Stack
from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Template

from neuron_serving import NeuronArtifactCache, ServingConfigError

from .conftest import service_authorization_reference


def _cache_id(template: Any) -> str:
    (logical_id,) = [k for k in template.resources("AWS::S3::Bucket") if k.startswith("ArtifactCache")]
    return logical_id


def _arn(value: Any, bucket: str) -> str:
    """A resource of the template as text: the cache bucket's ARN as ``<bucket>``."""
    if value == {"Fn::GetAtt": [bucket, "Arn"]}:
        return "<bucket>"
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_arn(part, bucket) for part in parts)
    assert isinstance(value, str), value
    return value


def _cache_statements(template: Any) -> list[dict[str, Any]]:
    """The host role's statements on the cache bucket, resources as text (``<bucket>/exports/*``)."""
    bucket = _cache_id(template)
    cached = []
    for statement in template.host_statements():
        resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        texts = [_arn(r, bucket) for r in resources if bucket in json.dumps(r)]
        if texts:
            cached.append({**statement, "Resource": texts})
    return cached


def _actions(statement: dict[str, Any]) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


@pytest.mark.parametrize("config", [{}, {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"}])
def test_the_host_may_create_a_marker_only_where_none_is_and_never_delete_it(synth, config):
    denies = [s for s in _cache_statements(synth(**config)) if s["Effect"] == "Deny"]
    assert denies == [
        {"Action": ["s3:DeleteObject", "s3:PutObjectAcl"], "Effect": "Deny",
         "Resource": ["<bucket>/exports/*/COMPLETE"]},
        {"Action": "s3:PutObject", "Effect": "Deny", "Resource": ["<bucket>/exports/*/COMPLETE"],
         "Condition": {"StringNotEquals": {"s3:if-none-match": "*"}}},
        {"Action": ["s3:DeleteObjectVersion", "s3:PutObjectVersionAcl"], "Effect": "Deny",
         "Resource": ["<bucket>/*"]},
        {"Action": ["s3:PutBucketVersioning", "s3:PutLifecycleConfiguration"], "Effect": "Deny",
         "Resource": ["<bucket>"]},
    ]


def test_the_host_is_allowed_no_version_action_and_no_bucket_setting(synth):
    allowed = {a for s in _cache_statements(synth()) if s["Effect"] == "Allow" for a in _actions(s)}
    assert allowed == {"s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject", "s3:ListBucket"}


def test_the_cache_is_versioned_and_expires_replaced_versions_and_abandoned_uploads(synth):
    template = synth()
    bucket = template.json["Resources"][_cache_id(template)]["Properties"]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    assert bucket["LifecycleConfiguration"] == {"Rules": [{
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
        "ExpiredObjectDeleteMarker": True,
        "NoncurrentVersionExpiration": {"NoncurrentDays": 30},
        "Status": "Enabled",
    }]}


def _cache_template(**props: Any) -> dict[str, Any]:
    stack = Stack(App(), "Own")
    cache = NeuronArtifactCache(stack, "Cache", **props)
    cache.grant_cache(iam.Role(stack, "Host", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com")))
    return Template.from_stack(stack).to_json()


def test_how_long_replaced_versions_are_kept_is_a_prop():
    template = _cache_template(noncurrent_version_expiration=Duration.days(90))
    (bucket,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::S3::Bucket"]
    assert bucket["LifecycleConfiguration"]["Rules"][0]["NoncurrentVersionExpiration"] == {"NoncurrentDays": 90}


@pytest.mark.parametrize(("expiration", "shown"), [(Duration.hours(36), "1.5 days"), (Duration.days(0), "0 days")])
def test_a_noncurrent_version_expiration_that_s3_cannot_take_fails_naming_the_prop(expiration, shown):
    with pytest.raises(ServingConfigError, match=rf"^noncurrent_version_expiration \('{shown}'\) must be a whole "
                                                 r"number of days, at least 1"):
        _cache_template(noncurrent_version_expiration=expiration)


def test_every_cache_action_resource_type_and_condition_key_is_one_aws_defines(synth):
    privileges = service_authorization_reference()
    for statement in _cache_statements(synth()):
        resource_type = "bucket" if statement["Resource"] == ["<bucket>"] else "object"
        for action in _actions(statement):
            assert action.startswith("s3:") and action in privileges, action
            kinds = privileges[action]["resource_types"]
            assert f"{resource_type}*" in {k["resource_type"] for k in kinds}, (action, resource_type)
            keys = {key for k in kinds for key in k["condition_keys"]}
            for operator in statement.get("Condition", {}).values():
                for key in operator:
                    assert key in keys, (action, key)
