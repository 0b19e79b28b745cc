"""The hosts' gp3 root volume: its throughput and IOPS, sized from what the boot reads and writes.

Every boot writes the model's weights to the root volume at least once (the checkpoint downloaded
and the export written, or the export downloaded) and reads them back at least once: each replica
loads the export's weight shards, and a host that exports also compiles from the checkpoint and
hashes its export for the artifact cache. At gp3's included 125 MiB/s, reading the 131 GiB of a
70B model's bf16 weights takes 18 minutes before the NeuronCores see any of it, and unpacking the
serving image takes 4 more whatever the model. The default throughput therefore moves the boot's
disk traffic (:func:`boot_disk_bytes`) in ``boot_disk_minutes`` (:data:`DEFAULT_DISK_MINUTES`), the
one setting that sizes the volume, and the default IOPS carry that throughput in the reads the
kernel issues.

gp3's limits (botocore 1.44.8 ``data/ec2/2016-11-15/service-2.json``,
``LaunchTemplateEbsBlockDeviceRequest``: "Throughput ... Valid Range: Minimum value of 125.
Maximum value of 2,000", "Iops ... gp3: 3,000 - 80,000 IOPS"; aws-cdk-lib 2.275.0
``aws-ec2/lib/volume.js``, which checks at most 500 IOPS per GiB of gp3, and
``aws-ec2/lib/private/ebs-util.js``, which checks at most 0.25 MiB/s of throughput per IOPS, as
the EBS user guide's "gp3 volume performance" states:
https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-performance).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import Problems, ServingConfigError, problem
from .layout import GIB, ServingPlan

MIB = 1024**2

GP3_THROUGHPUT_MIB_S = (125, 2000)
"""gp3's throughput in MiB/s: 125 included in the storage price, at most 2,000."""

GP3_IOPS = (3000, 80_000)
"""gp3's IOPS: 3,000 included in the storage price, at most 80,000."""

GP3_IOPS_PER_GIB = 500
"""At most this many IOPS per GiB of volume size."""

GP3_IOPS_PER_MIB_S = 4
"""At least this many IOPS per MiB/s of throughput (0.25 MiB/s per IOPS at most)."""

THROUGHPUT_USD_PER_MIB_S_MONTH = 0.04
IOPS_USD_PER_MONTH = 0.005
"""What gp3 costs above what its storage price includes, us-east-1: "$0.040/provisioned MB/s-month
over 125" and "$0.005/provisioned IOPS-month over 3,000", the Amazon EBS pricing page's wording
(https://aws.amazon.com/ebs/pricing/) as public code quotes it; like the instance prices, not
checked against the AWS price list, and other regions differ."""

IMAGE_UNPACKED_BYTES = 30 * GIB
"""The serving image unpacked on the root volume. Our assumption, the figure the root volume is
sized with (``ServingPlan.root_volume_gib``); three times the pulled size, where a model-laden image
unpacks to 1.85 times (StaPH-B/docker-builds issue #1073: 8.5 GB compressed, 15.7 GB unpacked)."""

DEFAULT_DISK_MINUTES = 3.0
"""The default throughput moves the boot's disk traffic (:func:`boot_disk_bytes`) in at most this
long: about $0.04 per MiB/s per month above 125 (us-east-1), some $9 a month per host for an 8B
model, against 3 to 10 minutes more of every scale-out and warm-pool start at gp3's included
125 MiB/s (``neuron_serving.plan.time_to_serve``)."""

DISK_MINUTES_SETTING = "boot_disk_minutes"

READ_IO_KIB = 128
"""The size of the reads a sequential file read becomes: Linux's default readahead,
``VM_READAHEAD_PAGES (SZ_128K / PAGE_SIZE)`` (torvalds/linux ``include/linux/pagemap.h`` at
commit 0003e2a414687fff6a75250d381e4abf345d663f). EBS counts each I/O of up to 256 KiB as one
and merges smaller ones only when they are physically sequential (EBS user guide, "Amazon EBS I/O
characteristics and monitoring", https://docs.aws.amazon.com/ebs/latest/userguide/ebs-io-characteristics.html),
so the default IOPS carry the throughput in 128 KiB reads, whether or not EBS merges them."""

THROUGHPUT_SETTING = "root_volume_throughput"
IOPS_SETTING = "root_volume_iops"


@dataclass(frozen=True)
class VolumePerformance:
    """The throughput and IOPS of a gp3 root volume, checked against gp3's limits.

    :param throughput: MiB/s, 125 to 2,000.
    :param iops: 3,000 to 80,000, and at least 4 per MiB/s of ``throughput``.
    """

    throughput: int
    iops: int

    def __post_init__(self) -> None:
        problems = Problems()
        low, high = GP3_THROUGHPUT_MIB_S
        if not _whole(self.throughput) or not low <= self.throughput <= high:
            problems.add(THROUGHPUT_SETTING, self.throughput, f"must be a whole number of MiB/s from {low} to "
                         f"{high} (gp3's throughput; {low} is included in the storage price)")
        low, high = GP3_IOPS
        if not _whole(self.iops) or not low <= self.iops <= high:
            problems.add(IOPS_SETTING, self.iops, f"must be a whole number from {low} to {high} (gp3's IOPS; "
                         f"{low} are included in the storage price)")
        if not problems and self.iops < GP3_IOPS_PER_MIB_S * self.throughput:
            problems.add(IOPS_SETTING, self.iops, f"must be at least {GP3_IOPS_PER_MIB_S * self.throughput} for a "
                         f"{THROUGHPUT_SETTING} of {self.throughput} MiB/s: gp3 gives at most 0.25 MiB/s per IOPS")
        problems.raise_if_any()

    def size_problem(self, size_gib: int) -> str | None:
        """What is wrong with these IOPS on a volume of ``size_gib``, or None."""
        most = GP3_IOPS_PER_GIB * size_gib
        if self.iops <= most:
            return None
        return problem(IOPS_SETTING, self.iops, f"must be at most {most} on a root volume of {size_gib} GiB: gp3 "
                       f"gives at most {GP3_IOPS_PER_GIB} IOPS per GiB")

    @property
    def monthly_usd(self) -> float:
        """What the throughput and IOPS cost per month above the storage price (us-east-1)."""
        return (THROUGHPUT_USD_PER_MIB_S_MONTH * (self.throughput - GP3_THROUGHPUT_MIB_S[0])
                + IOPS_USD_PER_MONTH * (self.iops - GP3_IOPS[0]))


def boot_disk_bytes(plan: ServingPlan) -> int:
    """What a boot moves through the root volume at the least: the image unpacked, the weights
    written once (the checkpoint downloaded, or the export) and read once (the replicas load them;
    after a warm-pool stop, from the volume)."""
    return IMAGE_UNPACKED_BYTES + 2 * plan.weights_bytes


def default_throughput(plan: ServingPlan, minutes: float = DEFAULT_DISK_MINUTES) -> int:
    """MiB/s that move :func:`boot_disk_bytes` in ``minutes``, within gp3's range."""
    if not isinstance(minutes, int | float) or isinstance(minutes, bool) or not 0 < minutes <= 24 * 60:
        raise ServingConfigError([problem(DISK_MINUTES_SETTING, minutes, "must be a number of minutes above 0 and at "
                                          "most 1440: how long the boot's disk traffic may take, which sizes the "
                                          "root volume's throughput")])
    low, high = GP3_THROUGHPUT_MIB_S
    return min(max(math.ceil(boot_disk_bytes(plan) / MIB / (minutes * 60)), low), high)


def default_iops(throughput: int) -> int:
    """IOPS that carry ``throughput`` MiB/s in :data:`READ_IO_KIB` reads, within gp3's range."""
    low, high = GP3_IOPS
    return min(max(throughput * 1024 // READ_IO_KIB, low), high)


def volume_performance(plan: ServingPlan, throughput: int | None = None, iops: int | None = None,
                       disk_minutes: float = DEFAULT_DISK_MINUTES) -> VolumePerformance:
    """The root volume's performance for ``plan``: ``throughput`` and ``iops`` when given, else
    :func:`default_throughput` (in ``disk_minutes``) and :func:`default_iops` (of the throughput).
    Raises :class:`ServingConfigError` naming ``root_volume_throughput``, ``root_volume_iops`` or
    ``boot_disk_minutes``."""
    chosen = default_throughput(plan, disk_minutes) if throughput is None else throughput
    if not _whole(chosen):
        raise ServingConfigError([problem(THROUGHPUT_SETTING, chosen, "must be a whole number of MiB/s")])
    return VolumePerformance(chosen, default_iops(chosen) if iops is None else iops)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
