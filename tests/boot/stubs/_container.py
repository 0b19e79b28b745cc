"""What the serving image's tools write, for the stand-ins of the inside of a container (no
Neuron compiler or Hub here). Each imitation names the upstream file it follows.

- A model's Hub repository (``CHECKPOINT``): what Meta's Llama 3 repositories hold, including
  Meta's own ``original/`` copy of the weights, which the export does not need.
- An export by optimum-neuron 0.3.0 (:func:`export_files`): ``NxDPreTrainedModel.save`` in
  optimum/neuron/models/inference/backend/pretrained_model.py writes ``config.json``,
  ``neuron_config.json`` (``NxDNeuronConfig``, optimum/neuron/models/inference/backend/config.py,
  ``torch_dtype`` as the dtype's name), the compiled ``model.pt`` and, only when exporting from a
  local checkpoint, ``checkpoint/weights/tp<rank>_sharded_checkpoint.safetensors`` per rank.
"""

import json

CHECKPOINT = {
    "config.json": '{"model_type": "llama"}\n',
    "generation_config.json": "{}\n",
    "model-00001-of-00002.safetensors": "weights, first half\n",
    "model-00002-of-00002.safetensors": "weights, second half\n",
    "model.safetensors.index.json": "{}\n",
    "tokenizer.json": "{}\n",
    "tokenizer_config.json": "{}\n",
    "special_tokens_map.json": "{}\n",
    "original/consolidated.00.pth": "Meta's copy of the weights\n",
    "original/params.json": "{}\n",
    "LICENSE": "license\n",
}

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def export_files(argv: list[str], degree: int, weights: bool) -> dict[str, str]:
    """The files of an export made by ``optimum-cli export neuron`` with ``argv``, compiled for
    ``degree`` cores, holding the weights when ``weights``."""
    neuron_config = {
        "batch_size": int(option(argv, "--batch_size") or 1),
        "sequence_length": int(option(argv, "--sequence_length") or 0),
        "tp_degree": degree,
        "torch_dtype": DTYPES.get(option(argv, "--auto_cast_type") or "", "float32"),
        "checkpoint_id": None if weights else option(argv, "--model"),
    }
    files = {
        "config.json": '{"model_type": "llama"}\n',
        "neuron_config.json": json.dumps(neuron_config) + "\n",
        "model.pt": "compiled graph\n",
        "tokenizer.json": "{}\n",
        "tokenizer_config.json": "{}\n",
    }
    if weights:
        files.update({f"checkpoint/weights/tp{rank}_sharded_checkpoint.safetensors": f"rank {rank} weights\n"
                      for rank in range(degree)})
    return files
