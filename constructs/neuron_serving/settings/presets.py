"""Named configurations: a model, an instance and a layout known to fit and to pass the stack's
checks, selected with ``-c preset=NAME`` or ``StackSettings.from_preset(NAME)``. Settings given
explicitly override a preset's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named set of settings.

    :param name: what ``-c preset=`` takes.
    :param summary: what the preset is for, in a sentence.
    :param settings: the settings it sets, by name.
    """

    name: str
    summary: str
    settings: Mapping[str, Any] = field(default_factory=dict)


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        "llama-3.1-8b-latency",
        "Llama 3.1 8B Instruct on inf2.48xlarge for the lowest time per token: 3 replicas of degree 8, the "
        "layout of Hugging Face's inf2 data-parallel benchmark (29.8 ms per token at batch 8 there).",
        {"model_id": "NousResearch/Meta-Llama-3.1-8B-Instruct", "instance_type": "inf2.48xlarge",
         "tensor_parallel": 8, "batch_size": 4, "sequence_length": 4096},
    ),
    Preset(
        "llama-3.1-8b-throughput",
        "Llama 3.1 8B Instruct on inf2.48xlarge for the most tokens per second and the lowest cost per token: "
        "12 replicas of degree 2, batch 8.",
        {"model_id": "NousResearch/Meta-Llama-3.1-8B-Instruct", "instance_type": "inf2.48xlarge",
         "tensor_parallel": 2, "batch_size": 8, "sequence_length": 4096},
    ),
    Preset(
        "llama-3-8b-inf2-xlarge",
        "Llama 3 8B Instruct on inf2.xlarge, the cheapest published inf2 configuration (about $0.76/h): one "
        "replica of degree 2. The host has too little memory to compile, so a builder instance exports once "
        "into the artifact cache and the host only downloads.",
        {"model_id": "NousResearch/Meta-Llama-3-8B-Instruct", "instance_type": "inf2.xlarge",
         "tensor_parallel": 2, "batch_size": 4, "sequence_length": 4096},
    ),
    Preset(
        "llama-3-70b-inf2",
        "Llama 3 70B Instruct on inf2.48xlarge: one replica over all 24 NeuronCores. The first boot exports for "
        "hours; later hosts read the artifact cache.",
        {"model_id": "NousResearch/Meta-Llama-3-70B-Instruct", "instance_type": "inf2.48xlarge",
         "tensor_parallel": 24, "batch_size": 4, "sequence_length": 4096},
    ),
    Preset(
        "llama-3-70b-trn1",
        "Llama 3 70B Instruct on trn1.32xlarge: one replica over all 32 NeuronCores.",
        {"model_id": "NousResearch/Meta-Llama-3-70B-Instruct", "instance_type": "trn1.32xlarge",
         "tensor_parallel": 32, "batch_size": 4, "sequence_length": 4096},
    ),
)}
"""Every preset, by name."""
