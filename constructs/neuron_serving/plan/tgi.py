"""What each TGI Neuron container is told, and how the model is exported for it.

TGI's Neuron backend works on static shapes. When any of the six settings below is missing it
guesses from the hub cache and can pick shapes that do not match the export (TGI #3299, #3248),
so every replica gets all of them explicitly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .errors import ServingConfigError, problem
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

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)
"""What is downloaded of a model's Hub repository before the export (``huggingface-cli download
--include``): the configuration, the safetensors weights (optimum-neuron 0.3.0
optimum/neuron/models/inference/backend/modules/checkpoint.py reads ``model.safetensors`` or the
index and its shards) and the tokenizer, which the export copies for TGI. Not Meta's own copy of
the weights under ``original/`` (16 GB of ``consolidated.*.pth`` for Llama 3 8B), ``*.bin`` or
``*.pth`` duplicates, nor files such as ``modules.json`` that would make optimum route the export
to another library. huggingface-hub matches with ``fnmatch``, where ``*`` also matches ``/``
(src/huggingface_hub/utils/_paths.py at v0.34.4): ``original/`` is excluded by name too."""

CHECKPOINT_EXCLUDED = ("original/*",)

KEY_FORMAT = "v2"
"""The export key's format. v1 keys named exports made by scripts that compiled for every core
on the host and exported from a Hub id, without weights: no v1 artifact is ever used again."""


@dataclass(frozen=True)
class ServingImage:
    """What one serving image can do, read from the sources of the versions it bundles.

    :param reference: the image reference.
    :param optimum_neuron: the optimum-neuron version inside, which exports and loads the model.
    :param model_types: the ``model_type`` values its optimum-neuron exports and serves for text
        generation.
    :param cores_flag: the ``optimum-cli export neuron`` option whose value reaches the exporter
        as the tensor-parallel degree.
    :param neuron_runtime: the version of the Neuron runtime library inside.
    :param driver_below: the first host Neuron driver (``aws-neuronx-dkms``) version that
        rejects that runtime, or None.
    :param dlami_parameter: a public SSM parameter of a Neuron DLAMI whose driver runs that
        runtime.
    """

    reference: str
    optimum_neuron: str
    model_types: tuple[str, ...]
    cores_flag: str
    neuron_runtime: str
    driver_below: str | None
    dlami_parameter: str


TGI_3_3_5 = ServingImage(
    reference=DEFAULT_IMAGE,
    # huggingface/text-generation-inference v3.3.5 Dockerfile.neuron installs optimum-neuron
    # from its v0.3.0 source archive.
    optimum_neuron="0.3.0",
    # optimum-neuron v0.3.0 optimum/neuron/models/inference/auto_models.py registers text
    # generation for these model types (no mistral).
    model_types=("granite", "llama", "mixtral", "phi3", "qwen2", "qwen3"),
    # optimum-neuron v0.3.0 lists both --num_cores and --tensor_parallel_size, but its decoder
    # export (optimum/exporters/neuron/__main__.py) drops tensor_parallel_size; without
    # --num_cores it compiles for every core it can see (optimum/neuron/utils/system.py).
    cores_flag="--num_cores",
    # Dockerfile.neuron at v3.3.5: aws-neuronx-runtime-lib=2.26.42.0 (Neuron SDK 2.24).
    neuron_runtime="2.26.42",
    # Neuron release notes, runtime, Neuron 2.31.0: "Neuron Driver 2.29 requires Neuron Runtime
    # Library 2.33 or later"; older drivers stay compatible with older runtimes
    # (neuron-runtime/nrt-troubleshoot).
    driver_below="2.29",
    # Ubuntu 22.04 Neuron DLAMIs stopped with Neuron SDK 2.30 (driver 2.28 at most); the Neuron
    # DLAMI guide keeps their parameter, which names the last one. The Ubuntu 24.04 ones track
    # the newest driver, and the parameters have no pinned, versioned form.
    dlami_parameter="/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id",
)

SERVING_IMAGES = {image.reference: image for image in (TGI_3_3_5,)}
"""The serving images whose tooling the boot script is written and tested against."""


def serving_image(plan: ServingPlan, reference: str) -> ServingImage:
    """The known serving image ``reference``, which must export and serve ``plan``'s model.

    Raises :class:`ServingConfigError` naming ``image`` or ``model_id``.
    """
    image = SERVING_IMAGES.get(reference)
    if image is None:
        raise ServingConfigError([problem(
            "image", reference, "is not a serving image this library knows the export and serving tools of; "
            f"known: {', '.join(SERVING_IMAGES)}")])
    if plan.model.model_type not in image.model_types:
        raise ServingConfigError([problem(
            "model_id", plan.model_id, f"is a {plan.model.model_type} model, which optimum-neuron "
            f"{image.optimum_neuron} in {reference} cannot export; it exports {', '.join(image.model_types)}")])
    return image


PUBLIC_DLAMI_PARAMETERS = "/aws/service/neuron/dlami/"
"""Where the public parameters of the Neuron DLAMIs live (Neuron DLAMI guide)."""


def check_dlami_parameter(image: ServingImage, parameter: str) -> None:
    """Refuse a public Neuron DLAMI parameter other than ``image``'s own when ``image``'s runtime
    is too old for the newest drivers: such a parameter resolves, at every launch, to the newest
    DLAMI of its kind, whose driver rejects the runtime (``nrt_init`` fails)."""
    if image.driver_below is None or not parameter.startswith(PUBLIC_DLAMI_PARAMETERS):
        return
    if parameter != image.dlami_parameter:
        raise ServingConfigError([problem(
            "dlami_parameter", parameter,
            f"names the newest Neuron DLAMI at each launch, whose driver ({image.driver_below} or newer) "
            f"rejects the Neuron runtime {image.neuron_runtime} in {image.reference}; use "
            f"{image.dlami_parameter}, or ami_id with a DLAMI whose aws-neuronx-dkms is below {image.driver_below}")])


def export_key(plan: ServingPlan, image: ServingImage, revision: str | None = None) -> str:
    """A directory name that changes with everything that changes the compiled artifact.

    The serving image fixes the optimum-neuron and compiler versions, so it is part of the key;
    so is the model's Hub ``revision`` when one is pinned. Keys start with :data:`KEY_FORMAT`.
    """
    parts = [KEY_FORMAT, plan.model_id, image.reference, f"optimum-neuron={image.optimum_neuron}",
             str(plan.degree), str(plan.batch_size), str(plan.sequence_length), plan.dtype]
    if revision is not None:
        parts.append(f"revision={revision}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in plan.model_id.split("/")[-1].lower())
    return (f"{KEY_FORMAT}-{slug}-tp{plan.degree}-b{plan.batch_size}-s{plan.sequence_length}-{plan.dtype}"
            f"-{digest}")


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
    """The full container environment of ``replica``, serving the export at ``model_dir``.

    The export holds the weights and the tokenizer, so a replica never needs the Hub:
    ``HF_HUB_OFFLINE`` makes any attempt fail at once instead of hanging or downloading. With the
    six TGI settings given, TGI's entry point reads no Hub cache (backends/neuron tgi_entry_point.py
    at v3.3.5), and with no ``REVISION`` its router treats a local directory as local
    (router/src/server.rs).
    """
    return {
        "MODEL_ID": model_dir,
        **tgi_settings(plan),
        "MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT_REQUESTS),
        "NEURON_PROCESS_TAG": replica.process_tag,
        "HF_HUB_OFFLINE": "1",
        # TGI's router posts usage statistics to huggingface.co from containers
        # (router/src/usage_stats.rs at v3.3.5), which HF_HUB_OFFLINE does not stop.
        "USAGE_STATS": "off",
    }


NEURON_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""How optimum-neuron 0.3.0 records an auto-cast type: ``torch_dtype`` as the torch dtype's name
(optimum/neuron/models/inference/backend/config.py, ``to_dict``)."""


def export_expectations(plan: ServingPlan) -> dict[str, object]:
    """What an export for ``plan`` holds, for the host's ``check-export``: the files, and the
    values its configuration must record.

    optimum-neuron 0.3.0 (optimum/neuron/models/inference/backend/pretrained_model.py,
    ``NxDPreTrainedModel.save``) writes ``config.json``, ``neuron_config.json`` (with
    ``batch_size``, ``sequence_length``, ``tp_degree`` and ``torch_dtype``), the compiled
    ``model.pt`` and, when it exported from a local checkpoint, the weights sharded per rank
    under ``checkpoint/weights/``; without them a replica downloads the checkpoint at load. The
    export also holds the tokenizer (optimum/exporters/neuron/__main__.py saves it when it can
    load one, and only logs when it cannot), which TGI loads from the export.
    """
    return {
        "config": "neuron_config.json",
        "fields": {
            "batch_size": plan.batch_size,
            "sequence_length": plan.sequence_length,
            "tp_degree": plan.degree,
            "torch_dtype": NEURON_DTYPES[plan.dtype],
        },
        "files": ["config.json", "neuron_config.json", "model.pt", "tokenizer_config.json",
                  *(f"checkpoint/weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(plan.degree))],
    }

