"""How a host moves bytes: the AWS CLI's S3 transfer settings and the Hub download's workers, sized
for the instance's network instead of the tools' defaults.

The AWS CLI reads its ``s3`` settings from its config file (``AWS_CONFIG_FILE``), which the export
script points at :data:`AWS_CLI_CONFIG` for its transfers (exports and checkpoints of tens to
hundreds of gigabytes). Both major versions read the same file:

- AWS CLI v2 (the DLAMI's or snap's) takes ``preferred_transfer_client = crt``, the AWS Common
  Runtime's S3 client, which splits and parallelises transfers itself up to ``target_bandwidth``
  ("For most workloads, choosing ``crt`` will enable faster uploads and downloads": aws/aws-cli
  v2 branch, awscli/topics/s3-config.rst, from PR #8579; ``target_bandwidth`` applies to the crt
  client only, the same page);
- AWS CLI v1 knows neither key and reads ``max_concurrent_requests`` and ``multipart_chunksize``,
  which the CRT client ignores (aws/aws-cli 1.46.3, awscli/customizations/s3/transferconfig.py:
  ``RuntimeConfig`` maps those keys onto s3transfer's ``TransferConfig`` and passes no other on).
"""

from __future__ import annotations

import math

from .layout import ServingPlan

AWS_CLI_CONFIG = "/etc/neuron-serving/aws-cli.config"
"""The AWS CLI config file of the host's large S3 transfers."""

NETWORK_GBPS: dict[str, float] = {
    "inf2.xlarge": 15, "inf2.8xlarge": 15, "inf2.24xlarge": 50, "inf2.48xlarge": 100,
    "trn1.2xlarge": 12.5, "trn1.32xlarge": 800, "trn1n.32xlarge": 1600,
}
"""Each instance type's network bandwidth, Gbps ("up to" for the two smallest of each family).
Stated by AWS: the Inf2 and Trn1 instance pages (https://aws.amazon.com/ec2/instance-types/inf2/,
https://aws.amazon.com/ec2/instance-types/trn1/), "Instance size ... Network bandwidth"; these pages
could not be opened where this was written, so the figures are the ones our issue 26 quotes from
them. inf2.8xlarge is taken at 15, the lower of two readings (a third-party catalog says 25)."""

S3_REQUEST_BYTES_PER_S = 85 * 10**6
"""What one S3 request (one connection) carries: "about 85-90 MB/s per request" is the Amazon S3
user guide's figure for sizing parallel requests ("Performance guidelines for Amazon S3",
"Horizontal scaling and request parallelization",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance-guidelines.html).
The lower end."""

S3_PART_BYTES = 16 * 1024**2
"""The part size of the v1 client's multipart transfers: "typical sizes for byte-range requests
are 8 MB or 16 MB" (the same guide, "Use Byte-Range Fetches"), the larger for files of
gigabytes."""

S3_MAX_CONCURRENT_REQUESTS = 128
S3_MIN_CONCURRENT_REQUESTS = 10
"""The v1 client's concurrency stays between its own default (10: transferconfig.py ``DEFAULTS``)
and 128 threads of one process."""

HUB_DOWNLOAD_WORKERS = 16
"""Files ``huggingface-cli download --max-workers`` fetches at once (its default is 8:
huggingface/huggingface_hub v0.34.4 and v0.36.2, src/huggingface_hub/commands/download.py). A Hub
connection carries about 40 MB/s (``time_to_serve.HUB_CONNECTION_BYTES_PER_S``), so 16 fill the
NAT gateway's 5 Gbps (625 MB/s) where a 70B checkpoint's 30 files allow; an 8B one has 4 files,
which 8 already cover."""


def network_gbps(plan: ServingPlan) -> float:
    """``plan``'s instance's network bandwidth (:data:`NETWORK_GBPS`)."""
    return NETWORK_GBPS[plan.instance.name]


def s3_concurrent_requests(plan: ServingPlan) -> int:
    """Requests the v1 client keeps open to fill the instance's bandwidth at
    :data:`S3_REQUEST_BYTES_PER_S` each."""
    wanted = math.ceil(network_gbps(plan) * 10**9 / 8 / S3_REQUEST_BYTES_PER_S)
    return max(S3_MIN_CONCURRENT_REQUESTS, min(wanted, S3_MAX_CONCURRENT_REQUESTS))


def aws_cli_config(plan: ServingPlan) -> str:
    """The AWS CLI config file for ``plan``'s host (AWS CLI user guide, "Configuration and
    credential file settings": an ``s3`` setting nests under the profile, indented)."""
    gbps = network_gbps(plan)
    return (
        "# The S3 transfer settings of the host's large transfers (neuron_serving.plan.transfer).\n"
        "[default]\n"
        "s3 =\n"
        "  preferred_transfer_client = crt\n"
        f"  target_bandwidth = {gbps:g}Gb/s\n"
        f"  max_concurrent_requests = {s3_concurrent_requests(plan)}\n"
        f"  multipart_chunksize = {S3_PART_BYTES // 1024**2}MB\n"
    )
