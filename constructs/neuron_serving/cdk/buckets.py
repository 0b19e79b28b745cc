"""The buckets the constructs create, with the house defaults in one place."""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3

from constructs import Construct

from .scanners import skip_checkov

LOG_EXPIRY = Duration.days(90)
LOG_BUCKET_REASON = ("This bucket receives access logs (of the load balancer, and of the artifact cache when there "
                     "is one); logging it into itself would loop")


def private_bucket(scope: Construct, construct_id: str, **props: Any) -> s3.Bucket:
    """An S3 bucket encrypted with S3-managed keys, reachable over SSL only, with every kind of
    public access blocked; ``props`` are any other ``s3.Bucket`` properties."""
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        **props,
    )


def log_bucket(scope: Construct, construct_id: str) -> s3.Bucket:
    """A :func:`private_bucket` for access logs: kept when the stack is deleted (logs are
    evidence), versioned so that an overwritten or deleted log can be recovered, each object and
    each old version expiring after :data:`LOG_EXPIRY`."""
    bucket = private_bucket(
        scope,
        construct_id,
        removal_policy=RemovalPolicy.RETAIN,
        versioned=True,
        lifecycle_rules=[s3.LifecycleRule(expiration=LOG_EXPIRY, noncurrent_version_expiration=LOG_EXPIRY)],
    )
    skip_checkov(bucket, "CKV_AWS_18", LOG_BUCKET_REASON)
    return bucket
