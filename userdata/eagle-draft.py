"""eagle-draft TARGET DRAFT OUT [EXPECTED]: an EAGLE draft as NxD Inference compiles it, written to OUT.

Run by export-model inside the serving image (its Python has torch and safetensors), before the
compile: TARGET is the model's downloaded checkpoint, DRAFT the draft's, OUT the draft's directory
that vLLM's --speculative-config names. EXPECTED, a JSON object of ``config.json`` fields, is the
draft the stack was planned for (its memory is counted from them): a downloaded draft whose config
says otherwise is refused, naming the field.

"The draft model must include the LM head weights from the target model ... these pretrained EAGLE
model checkpoints don't include the LM head weights ... you must first copy the LM head weights from
the target to the draft model" (aws-neuron/aws-neuron-sdk v2.28.0, libraries/nxd-inference/
developer_guides/feature-guide.rst, "EAGLE Checkpoint Compatibility", whose script finds
``lm_head.weight`` through the target's ``model.safetensors.index.json`` and saves every draft tensor
and it, in the draft's dtype, as ``model.safetensors``). Published drafts come as safetensors or as
``pytorch_model.bin`` (SafeAILab's yuhuili/EAGLE-* repositories); NxD Inference reads either, but
``model.safetensors`` first (neuronx-distributed-inference cd3abf3, modules/checkpoint.py,
``load_state_dict``), so the draft is written as that alone. A target whose ``config.json`` says
``tie_word_embeddings`` has no ``lm_head.weight``: its LM head is ``model.embed_tokens.weight``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

LM_HEAD = "lm_head.weight"
EMBEDDINGS = "model.embed_tokens.weight"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def fail(message: str) -> None:
    print(f"eagle-draft: {message}", file=sys.stderr)
    raise SystemExit(1)


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def target_head(target: str) -> torch.Tensor:
    """The target's LM head: ``lm_head.weight``, or, for a target with tied embeddings, its embeddings; through
    its index of safetensors shards, or from its one file."""
    config = os.path.join(target, "config.json")
    tied = os.path.isfile(config) and bool(read_json(config).get("tie_word_embeddings", False))
    name = EMBEDDINGS if tied else LM_HEAD
    index = os.path.join(target, "model.safetensors.index.json")
    if os.path.isfile(index):
        path = os.path.join(target, read_json(index).get("weight_map", {}).get(name, ""))
    else:
        path = os.path.join(target, "model.safetensors")
    if os.path.isfile(path):
        with safe_open(path, framework="pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open has keys(), not __contains__)
                return f.get_tensor(name)
    fail(f"{target} has no {name} in its safetensors weights"
         + (" (its config.json ties the LM head to the embeddings)" if tied else ""))
    raise AssertionError


def draft_tensors(draft: str) -> dict[str, torch.Tensor]:
    """Every tensor of the draft's checkpoint, safetensors first, as NxD Inference reads them."""
    names = sorted(os.listdir(draft))
    tensors: dict[str, torch.Tensor] = {}
    safetensors = [n for n in names if n.endswith(".safetensors")]
    bins = [n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]
    for name in safetensors:
        with safe_open(os.path.join(draft, name), framework="pt") as f:
            tensors.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118
    if not safetensors:
        for name in bins:
            tensors.update(torch.load(os.path.join(draft, name), map_location="cpu", weights_only=True))
    if not tensors:
        fail(f"{draft} has no weights (model*.safetensors or pytorch_model*.bin)")
    return tensors


def main(target: str, draft: str, out: str, expected: str = "{}") -> None:
    config = read_json(os.path.join(draft, "config.json"))
    for name, value in json.loads(expected).items():
        if config.get(name) != value:
            fail(f"{draft}/config.json has {name} {config.get(name)}, but the stack was planned for a draft with "
                 f"{value} (speculative_model, speculative_model_config)")
    dtype = DTYPES.get(str(config.get("torch_dtype") or config.get("dtype") or "float16"), torch.float16)
    tensors = draft_tensors(draft)
    head = target_head(target)
    tensors[LM_HEAD] = head.to(dtype)
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(os.path.join(draft, "config.json"), os.path.join(out, "config.json"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    print(f"eagle-draft: {len(tensors)} tensors of {draft}, with the LM head of {target} "
          f"({tuple(head.shape)}), into {out}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        fail("usage: eagle-draft TARGET DRAFT OUT [EXPECTED]")
    main(*sys.argv[1:])
