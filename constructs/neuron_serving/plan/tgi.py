"""What each TGI Neuron container is told, and how the model is exported for it.

TGI's Neuron backend works on static shapes. When any of the six settings below is missing it
guesses from the hub cache and can pick shapes that do not match the export (TGI #3299, #3248),
so every replica gets all of them explicitly.
"""

from __future__ import annotations

import hashlib

from .layout import Replica, ServingPlan

DEFAULT_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.5-neuron"
"""The last TGI release with Neuron backend changes (TGI is in maintenance mode since Dec 2025).
It bundles optimum-neuron 0.3.0 and neuronx-cc 2.19, which the export must run with."""

CONTAINER_PORT = 80
"""The TGI Neuron image listens on port 80 (its ``PORT`` default)."""

MAX_CONCURRENT_REQUESTS = 128
"""Requests one replica accepts at once (TGI's default, set explicitly): beyond it TGI answers
429. The router sends each replica at most this many and queues the rest itself, so both
figures come from this one constant."""

MODEL_MOUNT = "/models"
"""Where the host's export directory appears inside the containers."""


def export_key(plan: ServingPlan, image: str, revision: str | None = None) -> str:
    """A directory name that changes with everything that changes the compiled artifact.

    The serving image fixes the optimum-neuron and compiler versions, so it is part of the key;
    so is the model's Hub ``revision`` when one is pinned.
    """
    parts = [plan.model_id, image, str(plan.degree), str(plan.batch_size),
             str(plan.sequence_length), plan.dtype]
    if revision is not None:
        parts.append(f"revision={revision}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in plan.model_id.split("/")[-1].lower())
    return f"{slug}-tp{plan.degree}-b{plan.batch_size}-s{plan.sequence_length}-{plan.dtype}-{digest}"


def tgi_settings(plan: ServingPlan) -> dict[str, str]:
    """The six settings every replica needs, identical across replicas of one plan."""
    return {
        "HF_NUM_CORES": str(plan.degree),
        "HF_AUTO_CAST_TYPE": plan.dtype,
        "MAX_BATCH_SIZE": str(plan.batch_size),
        "MAX_TOTAL_TOKENS": str(plan.sequence_length),
        "MAX_INPUT_TOKENS": str(plan.max_input_tokens),
        "MAX_BATCH_PREFILL_TOKENS": str(plan.batch_size * plan.max_input_tokens),
    }


def replica_environment(plan: ServingPlan, replica: Replica, model_dir: str) -> dict[str, str]:
    """The full container environment of ``replica``, serving the export at ``model_dir``."""
    return {
        "MODEL_ID": model_dir,
        **tgi_settings(plan),
        "MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT_REQUESTS),
        "NEURON_PROCESS_TAG": replica.process_tag,
    }


def export_arguments(plan: ServingPlan) -> dict[str, str]:
    """``optimum-cli export neuron`` arguments by meaning; the boot script picks the flag names
    the image's optimum-neuron understands (``--num_cores`` became ``--tensor_parallel_size``)."""
    return {
        "model": plan.model_id,
        "batch_size": str(plan.batch_size),
        "sequence_length": str(plan.sequence_length),
        "cores": str(plan.degree),
        "auto_cast_type": plan.dtype,
    }
