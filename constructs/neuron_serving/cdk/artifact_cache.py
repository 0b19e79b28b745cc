"""The compile-once artifact cache: exports in S3, keyed by everything that changes them."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs import Construct

from .buckets import private_bucket

EXPORTS_PREFIX = "exports"

CACHE_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
"""What a host may do to objects below the exports prefix."""


class NeuronArtifactCache(Construct):
    """An S3 bucket of model exports shared by every host of a stack.

    A host that finds ``exports/<key>/COMPLETE`` downloads the export it names instead of
    compiling for 30 to 60+ minutes; the first host to export publishes its artifact under a
    prefix of its own and then creates the marker with a conditional write, so concurrent
    exporters never publish half an artifact. The key covers model, image (and so compiler),
    degree, batch size, sequence length and dtype.

    Encrypted (SSE-S3), SSL only, all public access blocked.

    :param server_access_logs_bucket: where S3 writes access logs of the cache.
        Default: none.
    :param removal_policy: an export costs an hour of accelerator time to rebuild.
        Default: ``RemovalPolicy.RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        server_access_logs_bucket: s3.IBucket | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        self.bucket = private_bucket(
            self,
            "Bucket",
            server_access_logs_bucket=server_access_logs_bucket,
            server_access_logs_prefix="s3/artifact-cache/" if server_access_logs_bucket else None,
            removal_policy=removal_policy,
        )
        self.uri: str = f"s3://{self.bucket.bucket_name}/{EXPORTS_PREFIX}"
        """The prefix hosts pass to the boot script."""

    def grant_cache(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read, publish and clean up exports, and list only the exports prefix.

        ``s3:AbortMultipartUpload`` is there because the AWS CLI uploads multi-gigabyte export
        files in parts and aborts the parts of an upload that fails."""
        objects = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=CACHE_OBJECT_ACTIONS,
            resource_arns=[self.bucket.arn_for_objects(f"{EXPORTS_PREFIX}/*")],
        )
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[self.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{EXPORTS_PREFIX}/*"]}},
            )
        )
        return objects
