"""The compile-once artifact cache: exports in S3, keyed by everything that changes them."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from constructs import Construct

from ..plan.errors import ServingConfigError, problem
from .buckets import private_bucket

EXPORTS_PREFIX = "exports"

COMPILE_CACHE_PREFIX = "compile-cache"
"""Where the compiler's persistent cache keeps compiled graphs (``NEURON_COMPILE_CACHE_URL``), one
directory per graph below ``neuronxcc-<compiler version>/``, as the public Hub cache lays them out."""

COMPILE_CACHE_ACTIONS = ["s3:GetObject", "s3:PutObject"]
"""What a host may do to objects below the compile cache prefix: the compiler's cache reads a graph
it finds and writes one it compiled (libneuronxla's ``CompileCacheS3``, whose source is not public:
the actions are those of a cache that never deletes). What it does with a denied call cannot be read,
and nothing above it catches an error (:meth:`NeuronArtifactCache.grant_compile_cache`), so the
export may fail on one: a miss is made a 404 by the listing grant."""

COMPLETE_MARKER = "COMPLETE"
"""The name of the completion marker of each key: ``exports/<key>/COMPLETE``
(``userdata/export-model.sh.j2`` writes and reads it)."""

CACHE_OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"]
"""What a host may do to objects below the exports prefix."""

MARKER_DENIED_ACTIONS = ["s3:DeleteObject", "s3:PutObjectAcl"]
"""What no host may do to a completion marker: remove it (a host could then publish a marker of its
own) or change its ACL. ACLs are disabled on the bucket (S3's default Object Ownership for new
buckets, "Bucket owner enforced": https://docs.aws.amazon.com/AmazonS3/latest/userguide/about-object-ownership.html),
so ``s3:PutObjectAcl`` fails anyway; denied in case someone enables them."""

CONDITIONAL_WRITE_KEY = "s3:if-none-match"
"""The condition key of a request's ``If-None-Match`` header: a String key of ``s3:PutObject``
(S3 user guide, "Enforce conditional writes on Amazon S3 buckets",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes-enforce.html, English
copy read at https://docs.amazonaws.cn/en_us/AmazonS3/latest/userguide/conditional-writes-enforce.html;
the Service Authorization Reference lists it under PutObject, as parliament 1.6.4's copy of it
shows: tests/cdk/test_artifact_cache.py). S3 takes it only as ``*`` ("Expects the '*' (asterisk)
character": the S3 API's IfNoneMatch, as https://docs.aws.amazon.com/sdk-for-kotlin/api/latest/s3/aws.sdk.kotlin.services.s3.model/-complete-multipart-upload-request/if-none-match.html
prints it). ``CreateMultipartUpload`` and ``UploadPart`` cannot carry the header, so denying a
write without it also denies a multipart upload of the marker, which is a few kilobytes written
with one ``put-object``."""

HISTORY_DENIED_ACTIONS = ["s3:DeleteObjectVersion", "s3:PutObjectVersionAcl"]
"""What no host may do to any object version: versioning keeps what a host overwrote or deleted,
for recovery and for the record, only while no host can remove it."""

BUCKET_DENIED_ACTIONS = ["s3:PutBucketVersioning", "s3:PutLifecycleConfiguration"]
"""Bucket settings no host may change: suspending versioning would let an overwrite destroy the
original, and a lifecycle rule could expire a marker or the history."""

DEFAULT_NONCURRENT_VERSION_EXPIRATION = Duration.days(30)
INCOMPLETE_UPLOAD_EXPIRY = Duration.days(7)
"""Parts of multipart uploads that a host never completed (it died mid-upload) are deleted after
this long; S3 bills them until then, and no listing of objects shows them."""


class NeuronArtifactCache(Construct):
    """An S3 bucket of model exports shared by every host of a stack.

    A host that finds ``exports/<key>/COMPLETE`` downloads the export it names instead of
    compiling for 30 to 60+ minutes; the first host to export publishes its artifact under a
    prefix of its own and then creates the marker with a conditional write, so concurrent
    exporters never publish half an artifact. The key covers model, image (and so compiler),
    degree, batch size, sequence length and dtype.

    **Artifacts that cannot be poisoned quietly.** ``COMPLETE`` names the upload and lists the
    SHA-256 of every file in it. A host that downloads serves the upload only if its files are
    exactly those, with those checksums, and ``check-export`` then passes; otherwise, or when the
    download fails, it logs why (naming the files that differ) and exports for itself.
    :meth:`grant_cache` makes the marker write-once: a host may create it only with
    ``If-None-Match: *`` and may never delete it. The bucket is versioned: whatever a host
    overwrites or deletes stays as a noncurrent version for ``noncurrent_version_expiration``,
    and no host may delete versions or change versioning or lifecycle. So a host that turns
    rogue after a key is published can make the other hosts refuse that key's artifact, never
    serve its files; until an administrator restores the altered objects' earlier versions or
    deletes the key, each host that boots exports for itself.

    What this does not cover: the first host to publish a key wins. A host compromised before
    it exports can publish a poisoned export under a correct manifest, and every later host
    serves it. Against that, serve a ``prebuilt_export`` built by a pipeline you trust, pin
    ``model_revision``, and to force a re-export delete ``exports/<key>/`` (an administrator's
    step: hosts cannot). The denies are on the host's role, not in the bucket policy: an
    explicit deny there beats any allow the role gets from elsewhere, while in the bucket
    policy they would also bind the administrators who must be able to delete a key, and the
    construct does not know who they are.

    Encrypted (SSE-S3), SSL only, all public access blocked.

    :param server_access_logs_bucket: where S3 writes access logs of the cache.
        Default: none.
    :param removal_policy: an export costs an hour of accelerator time to rebuild.
        Default: ``RemovalPolicy.RETAIN``.
    :param noncurrent_version_expiration: how long S3 keeps a version that was overwritten or
        deleted (whole days, at least 1). Each is billed as stored until then: normally only the
        uploads of hosts that lost a race to publish (each a whole export, about twice the
        model's bf16 size: some 16 GB for an 8B model, 140 GB for 70B) and keys an administrator
        deleted. Default: 30 days.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        server_access_logs_bucket: s3.IBucket | None = None,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        noncurrent_version_expiration: Duration = DEFAULT_NONCURRENT_VERSION_EXPIRATION,
    ) -> None:
        super().__init__(scope, construct_id)
        days = noncurrent_version_expiration.to_days(integral=False)
        if days < 1 or days != int(days):
            raise ServingConfigError([
                problem("noncurrent_version_expiration", f"{days:g} days",
                        "must be a whole number of days, at least 1 (S3's NoncurrentDays)")
            ])
        self.bucket = private_bucket(
            self,
            "Bucket",
            server_access_logs_bucket=server_access_logs_bucket,
            server_access_logs_prefix="s3/artifact-cache/" if server_access_logs_bucket else None,
            removal_policy=removal_policy,
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    noncurrent_version_expiration=noncurrent_version_expiration,
                    abort_incomplete_multipart_upload_after=INCOMPLETE_UPLOAD_EXPIRY,
                    # A delete marker whose versions have all expired.
                    expired_object_delete_marker=True,
                )
            ],
        )
        self.uri: str = f"s3://{self.bucket.bucket_name}/{EXPORTS_PREFIX}"
        """The prefix hosts pass to the boot script."""
        self.compile_cache_uri: str = f"s3://{self.bucket.bucket_name}/{COMPILE_CACHE_PREFIX}"
        """The compiler's persistent cache in this bucket (:meth:`grant_compile_cache`)."""

    def grant_compile_cache(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read and add compiled graphs below :attr:`compile_cache_uri`, and list
        the bucket, so that a graph the cache lacks is a 404 and not a 403.

        A graph one host compiled is loaded by the exports of every other: like the first export
        of a key (see the class), a host compromised before it compiles can leave a graph that
        others use. Turn the cache off (``NeuronBootScript(compile_cache=False)``) where hosts
        must not trust each other's compilers.

        The listing is of the whole bucket: the names of its keys, never their contents. This
        construct writes only below ``exports/`` and ``compile-cache/``, which a host with
        :meth:`grant_cache` may list anyway."""
        objects = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=COMPILE_CACHE_ACTIONS,
            resource_arns=[self.bucket.arn_for_objects(f"{COMPILE_CACHE_PREFIX}/*")],
        )
        # The compiler's cache looks each graph up by its key, and a miss must read as a miss.
        # S3 answers a HEAD or GET of a missing key with 404 only to a caller that may list the
        # bucket, and with 403 AccessDenied otherwise (S3 API reference, HeadObject and GetObject,
        # "Permissions": https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html, as
        # https://docs.aws.amazon.com/sdk-for-kotlin/api/latest/s3/aws.sdk.kotlin.services.s3/head-object.html
        # prints it). S3 can weigh only the HEAD's own request, which has no prefix parameter, and
        # s3:prefix is a condition key of ListBucket only (the Service Authorization Reference, as
        # parliament 1.6.4's copy shows: tests/cdk/test_compile_cache.py), so a listing conditioned
        # on s3:prefix is false for it (IAM user guide, "IAM JSON policy elements: Condition": a key
        # absent from the request context matches no value) and a miss was a 403. A condition that
        # holds without s3:prefix ("Null") also allows a ListObjects that names no prefix, the whole
        # bucket, unless S3 sets the key empty there, which its documentation does not say; the other
        # keys a HEAD carries (TLS version, signature, VPC endpoint) do not narrow what is listed. So:
        # the bucket, unconditioned, as in AWS's own example, where that grant turns the same
        # `aws s3 cp` of a missing key from 403 into 404 (re:Post, https://repost.aws/articles/
        # ARotCurEfWTCm7CzGu4vs9lw, read in its Simplified Chinese copy). The compile cache's client is
        # libneuronxla's CompileCacheS3, whose source is not public (its wheels are on AWS's Neuron
        # pip repository only; PyPI's libneuronxla 1.0 is a placeholder that raises ImportError):
        # what it does with a 403 cannot be read, and its callers catch nothing (optimum-neuron
        # v0.3.0 and v0.4.5 optimum/neuron/cache/hub_cache.py CompileCacheHfProxy.exists; v0.3.0
        # optimum/neuron/models/inference/backend/cache.py generate_neff_with_cache;
        # aws-neuron/neuronx-distributed v2.26.0 src/neuronx_distributed/trace/model_builder.py
        # submit_compilation_job_with_cache, TypeError only), so a 403 it raises fails the export
        # (tests/harness/test_compile_cache.py runs both optimum-neuron versions into one).
        grantee.grant_principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        return objects

    def grant_cache(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` read, publish and clean up exports, and list the bucket's keys; deny it,
        explicitly, whatever would let it replace a published marker or erase history.

        The listing is of the whole bucket (the names of its keys, never their contents), for the
        reason :meth:`grant_compile_cache` gives: S3 answers a GET or HEAD of a missing key with 404
        only to a caller that may list the bucket, and a listing conditioned on ``s3:prefix`` does
        not apply to a GET. With it, a host tells a marker that is not there yet (404) from one it
        may not read (403), and fails at once on the latter instead of waiting or compiling for
        nothing (``read_marker`` in userdata/export-model.sh.j2).

        ``s3:AbortMultipartUpload`` is there because the AWS CLI uploads multi-gigabyte export
        files in parts and aborts the parts of an upload that fails."""
        objects = iam.Grant.add_to_principal(
            grantee=grantee,
            actions=CACHE_OBJECT_ACTIONS,
            resource_arns=[self.bucket.arn_for_objects(f"{EXPORTS_PREFIX}/*")],
        )
        principal = grantee.grant_principal
        principal.add_to_principal_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        markers = self.bucket.arn_for_objects(f"{EXPORTS_PREFIX}/*/{COMPLETE_MARKER}")
        for statement in (
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=MARKER_DENIED_ACTIONS, resources=[markers]),
            # A marker is only ever created: a write is denied unless it carries
            # "If-None-Match: *", with which S3 fails (412) when the key exists. A negated
            # operator holds when the key is absent from the request (IAM user guide, "Condition
            # operators", https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html),
            # so a write without the header is denied; StringNotEquals matches exactly (only the
            # *Like operators read wildcards), so is one whose If-None-Match names an ETag,
            # which, were S3 to accept it, would overwrite any marker of another ETag.
            iam.PolicyStatement(
                effect=iam.Effect.DENY, actions=["s3:PutObject"], resources=[markers],
                conditions={"StringNotEquals": {CONDITIONAL_WRITE_KEY: "*"}},
            ),
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=HISTORY_DENIED_ACTIONS,
                                resources=[self.bucket.arn_for_objects("*")]),
            iam.PolicyStatement(effect=iam.Effect.DENY, actions=BUCKET_DENIED_ACTIONS,
                                resources=[self.bucket.bucket_arn]),
        ):
            principal.add_to_principal_policy(statement)
        return objects
