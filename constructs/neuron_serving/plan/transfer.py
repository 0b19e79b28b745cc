"""How a host moves bytes: the AWS CLI's S3 transfer settings and the Hub download's workers, sized
for the instance's network instead of the tools' defaults.

The AWS CLI reads its ``s3`` settings from its config file (``AWS_CONFIG_FILE``), which the export
script points at :data:`AWS_CLI_CONFIG` for its transfers (exports and checkpoints of tens to
hundreds of gigabytes). The hosts run AWS CLI v2 only: the bootstrap installs AWS's snap of v2 where
the image has no CLI (userdata/bootstrap.sh.j2), and the boot installs AWS's v2 installer over a CLI
too old for its calls (userdata/boot/install-tools.sh.j2). So the file is written for v2 (aws/aws-cli tag
2.36.7, which the tests run), and says only what v2's CRT client uses:

- ``preferred_transfer_client = crt``, the AWS Common Runtime's S3 client, which splits and
  parallelises transfers itself up to ``target_bandwidth`` ("For most workloads, choosing ``crt``
  will enable faster uploads and downloads": aws/aws-cli v2 branch, awscli/topics/s3-config.rst,
  from PR #8579);
- ``target_bandwidth`` as an integer of bytes per second. v2 reads a rate ending ``b/s`` or ``B/s``
  through ``human_readable_to_int``, which takes integers only (``int("12.5")`` fails: every ``aws
  s3`` command then exits 255) and reads ``Gb`` as 1024**3 bits (awscli/customizations/s3/
  transferconfig.py, ``RuntimeConfig._convert_human_readable_rates``, and
  awscli/customizations/s3/utils.py, ``human_readable_to_int``/``SIZE_SUFFIX``, at 2.36.7), while
  the CRT client takes its target as ``bytes * 8 / 10**9`` Gbps (awscli/s3transfer/crt.py,
  ``_get_crt_throughput_target_gbps``): bytes per second carry the instance's decimal Gbps exactly.

Nothing else: the CRT client reads ``multipart_chunksize`` as a fixed part size when the file names
it, and chooses the part size itself otherwise (awscli/customizations/s3/factory.py,
``_create_crt_client``, at 2.36.7), and takes neither ``max_concurrent_requests`` nor
``max_queue_size`` (the classic client's, the same function passes neither on). An image's own v1
CLI new enough to be kept (1.34.2 or later, install-tools) knows neither key written here and moves the
bytes with its defaults (aws/aws-cli 1.46.3, awscli/customizations/s3/transferconfig.py:
``RuntimeConfig`` passes on the classic client's keys only).
"""

from __future__ import annotations

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

HUB_DOWNLOAD_WORKERS = 16
"""Files ``huggingface-cli download --max-workers`` fetches at once (its default is 8:
huggingface/huggingface_hub v0.34.4 and v0.36.2, src/huggingface_hub/commands/download.py). A Hub
connection carries about 40 MB/s (``time_to_serve.HUB_CONNECTION_BYTES_PER_S``), so 16 fill the
NAT gateway's 5 Gbps (625 MB/s) where a 70B checkpoint's 30 files allow; an 8B one has 4 files,
which 8 already cover."""


def network_gbps(plan: ServingPlan) -> float:
    """``plan``'s instance's network bandwidth (:data:`NETWORK_GBPS`)."""
    return NETWORK_GBPS[plan.instance.name]


def target_bandwidth(plan: ServingPlan) -> int:
    """``target_bandwidth`` for ``plan``'s host: its network bandwidth in bytes per second, the form
    AWS CLI v2 takes as is (see the module's docstring)."""
    return round(network_gbps(plan) * 10**9 / 8)


def aws_cli_config(plan: ServingPlan) -> str:
    """The AWS CLI config file for ``plan``'s host (AWS CLI user guide, "Configuration and
    credential file settings": an ``s3`` setting nests under the profile, indented)."""
    return (
        "# The S3 transfer settings of the host's large transfers (neuron_serving.plan.transfer), for AWS CLI v2:\n"
        f"# target_bandwidth is bytes per second ({network_gbps(plan):g} Gbps).\n"
        "[default]\n"
        "s3 =\n"
        "  preferred_transfer_client = crt\n"
        f"  target_bandwidth = {target_bandwidth(plan)}\n"
    )
