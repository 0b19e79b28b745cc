"""The Neuron instance catalog, the tensor-parallel degrees each instance accepts, and the figures
of each family's Neuron device that the performance model needs.

Figures: AWS Neuron documentation, about-neuron/arch/neuron-hardware/{inf2,trn1}-arch and
{inferentia2,trainium}.
Hourly prices are on-demand us-east-1 figures from third-party sources (not verified against the
AWS price list). They give the performance model's cost per million tokens, which the ``cost``
objective ranks layouts by: on one instance type the price only scales the figures, so the ranking
holds whatever the real price; across instance types, check the prices before relying on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ServingConfigError, problem

CORES_PER_DEVICE = 2
"""NeuronCores per Neuron device on inf2 and trn1: device N holds cores 2N and 2N+1."""


@dataclass(frozen=True)
class DeviceSpec:
    """One Neuron device (chip) as the performance model sees it.

    :param name: the chip, e.g. ``Inferentia2``.
    :param memory_bytes_per_second: device memory (HBM) bandwidth of the whole chip.
    :param bf16_flops: dense BF16 FLOPS of the chip's NeuronCores together.
    """

    name: str
    memory_bytes_per_second: float
    bf16_flops: float

    @property
    def memory_bytes_per_second_per_core(self) -> float:
        return self.memory_bytes_per_second / CORES_PER_DEVICE

    @property
    def bf16_flops_per_core(self) -> float:
        return self.bf16_flops / CORES_PER_DEVICE


DEVICES: dict[str, DeviceSpec] = {
    # "Two NeuronCore-v2 cores, delivering ... 190 FP16/BF16/cFP8/TF32 TFLOPS"; "32GiB of
    # high-bandwidth device memory (HBM) ... with 820 GiB/sec of bandwidth" (Neuron docs,
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inferentia2.html).
    # Older releases of the page (v2.9.1) and the NKI architecture guide say 820 GB/s: the decimal
    # reading is taken, and the fitted memory efficiency of the performance model absorbs the 7% between.
    "inf2": DeviceSpec("Inferentia2", memory_bytes_per_second=820e9, bf16_flops=190e12),
    # The same NeuronCore-v2 pair and the same figures: "Two NeuronCore-v2 delivering ... 190
    # FP16/BF16/cFP8/TF32 TFLOPS"; "32 GiB of device memory ... with 820 GiB/sec of bandwidth"
    # (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trainium.html).
    # The chips differ in their NeuronLink-v2 links (2 per Inferentia2 chip in a ring, 4 per Trainium
    # chip in a torus), which the fitted collective cost, measured on inf2 only, does not tell apart.
    "trn1": DeviceSpec("Trainium", memory_bytes_per_second=820e9, bf16_flops=190e12),
}
"""The Neuron device of each instance family."""


@dataclass(frozen=True)
class InstanceSpec:
    """One Neuron instance type.

    :param name: EC2 instance type, e.g. ``inf2.48xlarge``.
    :param family: ``inf2`` or ``trn1`` (trn1n shares trn1's runtime topology rules).
    :param devices: Neuron devices (``/dev/neuron0`` .. ``/dev/neuron{devices-1}``).
    :param memory_per_core_gib: device memory per NeuronCore.
    :param vcpus: host vCPUs.
    :param host_ram_gib: host memory, which bounds what the compiler can export on this host.
    :param hourly_usd: approximate on-demand price in US dollars, for cost figures.
    """

    name: str
    family: str
    devices: int
    memory_per_core_gib: int
    vcpus: int
    host_ram_gib: int
    hourly_usd: float

    @property
    def cores(self) -> int:
        return self.devices * CORES_PER_DEVICE

    @property
    def device(self) -> DeviceSpec:
        """The family's Neuron device, whose figures drive the performance model."""
        return DEVICES[self.family]

    @property
    def has_instance_store(self) -> bool:
        """Whether the instance has NVMe instance store drives: every Trn1 size does (1 x 500 GB on
        trn1.2xlarge, 4 x 2 TB on trn1.32xlarge and trn1n.32xlarge), no Inf2 size does ("EBS only").
        Stated by AWS's Trn1 and Inf2 instance pages (https://aws.amazon.com/ec2/instance-types/trn1/,
        .../inf2/), not opened where this was written; the host finds the drives themselves by their
        model name, so a wrong count here only renders a step that finds none."""
        return self.family == "trn1"

    @property
    def min_root_volume_gib(self) -> int:
        """Neuron documentation asks for at least 512 GB of root volume on Trainium hosts."""
        return 512 if self.family == "trn1" else 0

    def allowed_degrees(self) -> tuple[int, ...]:
        """Tensor-parallel degrees (NeuronCores per replica) this instance can serve.

        The rule, and why:

        - A replica owns whole Neuron devices (each container gets its own ``/dev/neuronN``
          nodes), so the degree is a multiple of the 2 cores of a device, and at most the
          instance's cores.
        - trn1/trn1n: the Neuron runtime only builds collective rings of 2, 8, 16 or 32 cores and
          fails with "Unsupported topology" otherwise (optimum-neuron issues #619 and #424).
        - inf2: the runtime accepts any even degree; published deployments use 2, 8 and 24
          (Hugging Face TGI Neuron and optimum-neuron documentation).
        """
        even = range(CORES_PER_DEVICE, self.cores + 1, CORES_PER_DEVICE)
        if self.family == "trn1":
            return tuple(d for d in even if d in (2, 8, 16, 32))
        return tuple(even)

    def allowed_degrees_text(self) -> str:
        rule = (
            "trn1 runtime topologies 2, 8, 16, 32"
            if self.family == "trn1"
            else "whole devices of 2 NeuronCores"
        )
        return (
            f"must be one of {', '.join(map(str, self.allowed_degrees()))} on {self.name} "
            f"({self.cores} NeuronCores; {rule})"
        )


INSTANCES: dict[str, InstanceSpec] = {
    spec.name: spec
    for spec in (
        InstanceSpec("inf2.xlarge", "inf2", 1, 16, 4, 16, 0.76),
        InstanceSpec("inf2.8xlarge", "inf2", 1, 16, 32, 128, 1.97),
        InstanceSpec("inf2.24xlarge", "inf2", 6, 16, 96, 384, 6.49),
        InstanceSpec("inf2.48xlarge", "inf2", 12, 16, 192, 768, 12.98),
        InstanceSpec("trn1.2xlarge", "trn1", 1, 16, 8, 32, 1.34),
        InstanceSpec("trn1.32xlarge", "trn1", 16, 16, 128, 512, 21.50),
        InstanceSpec("trn1n.32xlarge", "trn1", 16, 16, 128, 512, 24.78),
    )
}


def instance_spec(instance_type: str) -> InstanceSpec:
    """The catalog entry for ``instance_type``; a clear error for anything else."""
    try:
        return INSTANCES[instance_type]
    except KeyError:
        raise ServingConfigError(
            [
                problem(
                    "instance_type",
                    instance_type,
                    "is not a supported Neuron instance type; choose one of " + ", ".join(INSTANCES),
                )
            ]
        ) from None
