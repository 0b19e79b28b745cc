"""userdata/eagle-draft.py, the EAGLE draft's conversion that export-model runs inside the serving image, run with
the torch and safetensors of .tools/vllm-0.13.0 (requirements-vllm-0.13.0.txt: torch 2.13.0, safetensors 0.7.0;
the image's own are torch-neuronx's torch 2.9 and vLLM's safetensors) on checkpoints of the layouts it meets:
a target sharded with an index (Meta's Llama 3 repositories), one file with tied embeddings (Llama 3.2 1B), and
drafts as ``pytorch_model.bin`` (SafeAILab's yuhuili/EAGLE-*) or safetensors.

One process (torch takes seconds to import) makes the checkpoints, runs the script on each as ``python SCRIPT
TARGET DRAFT OUT`` runs it (``runpy.run_path`` as ``__main__``, with that ``sys.argv``), and reads what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".tools" / "vllm-0.13.0" / "bin" / "python"
SCRIPT = ROOT / "userdata" / "eagle-draft.py"

DRIVER = r"""
import contextlib, io, json, os, runpy, sys, torch
from safetensors import safe_open
from safetensors.torch import save_file

script, root = sys.argv[1], sys.argv[2]
head = torch.arange(12, dtype=torch.bfloat16).reshape(4, 3)
layer = {"fc.weight": torch.full((3, 6), 0.5, dtype=torch.float16),
         "layers.0.self_attn.q_proj.weight": torch.eye(3, dtype=torch.float16)}


def make(case, target_layout, draft_format):
    target, draft = (os.path.join(root, case, name) for name in ("target", "draft"))
    os.makedirs(target); os.makedirs(draft)
    if target_layout == "tied":
        save_file({"model.embed_tokens.weight": head, "model.norm.weight": torch.ones(3, dtype=torch.bfloat16)},
                  os.path.join(target, "model.safetensors"))
    else:
        save_file({"model.embed_tokens.weight": -head}, os.path.join(target, "model-00001-of-00002.safetensors"))
        save_file({"lm_head.weight": head}, os.path.join(target, "model-00002-of-00002.safetensors"))
        weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}
        if target_layout == "sharded":
            weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
        json.dump({"metadata": {}, "weight_map": weight_map},
                  open(os.path.join(target, "model.safetensors.index.json"), "w"))
    json.dump({"model_type": "llama", "tie_word_embeddings": target_layout == "tied"},
              open(os.path.join(target, "config.json"), "w"))
    if draft_format == "bin":
        torch.save(layer, os.path.join(draft, "pytorch_model.bin"))
    else:
        save_file(layer, os.path.join(draft, "model.safetensors"))
    json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
               "torch_dtype": "float16"}, open(os.path.join(draft, "config.json"), "w"))
    return target, draft, os.path.join(root, case, "out")


results = {}
for case, target_layout, draft_format, expected in json.loads(sys.argv[3]):
    target, draft, out = make(case, target_layout, draft_format)
    stdout, stderr = io.StringIO(), io.StringIO()
    sys.argv = [script, target, draft, out, *([json.dumps(expected)] if expected else [])]
    code = 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit:
            code = exit.code
    tensors = {}
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        with safe_open(os.path.join(out, "model.safetensors"), framework="pt") as f:
            tensors = {k: [str(f.get_tensor(k).dtype), f.get_tensor(k).tolist()] for k in f.keys()}
    results[case] = {"code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "tensors": tensors,
                     "files": sorted(os.listdir(out)) if os.path.isdir(out) else [],
                     "config": json.load(open(os.path.join(out, "config.json"))) if tensors else None}
print(json.dumps(results))
"""

CASES = [("sharded-bin", "sharded", "bin", {"num_hidden_layers": 1, "model_type": "llama"}),
         ("tied-safetensors", "tied", "safetensors", None), ("headless", "headless", "safetensors", None),
         ("unplanned", "sharded", "safetensors", {"num_hidden_layers": 1, "hidden_size": 4096})]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYTHON} is missing: scripts/test makes it")
        pytest.skip(f"{PYTHON} is missing: scripts/test makes it")
    root = tmp_path_factory.mktemp("eagle")
    done = subprocess.run([str(PYTHON), "-c", DRIVER, str(SCRIPT), str(root), json.dumps(CASES)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, Any] = json.loads(done.stdout)
    results["root"] = str(root)
    return results


@pytest.mark.parametrize("case", ["sharded-bin", "tied-safetensors"])
def test_the_draft_gets_the_targets_lm_head_in_its_dtype_beside_its_own_tensors(converted, case):
    result = converted[case]
    assert result["code"] == 0, result["stderr"]
    assert result["stdout"].startswith("eagle-draft: 3 tensors of ") and "(4, 3)" in result["stdout"]
    # One file, which NxD Inference reads before any other (modules/checkpoint.py, load_state_dict), and the config.
    assert result["files"] == ["config.json", "model.safetensors"]
    assert result["config"]["num_hidden_layers"] == 1
    tensors = result["tensors"]
    # The head is the target's (not its embeddings, which an untied target has apart), cast to the draft's float16.
    assert tensors["lm_head.weight"] == ["torch.float16", [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]]
    assert tensors["fc.weight"] == ["torch.float16", [[0.5] * 6] * 3]
    assert set(tensors) == {"lm_head.weight", "fc.weight", "layers.0.self_attn.q_proj.weight"}


def test_an_untied_target_without_a_head_in_its_index_fails_naming_what_it_looked_for(converted):
    # Its embeddings are not taken for the head: only a config that ties them makes them the head.
    result = converted["headless"]
    target = Path(converted["root"]) / "headless" / "target"
    # export-model fails the boot with the log's last line: this one; nothing is written.
    assert result["code"] == 1 and result["files"] == []
    assert result["stderr"].splitlines()[-1] == (
        f"eagle-draft: {target} has no lm_head.weight in its safetensors weights")


def test_a_draft_other_than_the_one_planned_for_is_refused_naming_the_field(converted):
    result = converted["unplanned"]
    draft = Path(converted["root"]) / "unplanned" / "draft"
    assert result["code"] == 1 and result["files"] == []
    assert result["stderr"].splitlines()[-1] == (
        f"eagle-draft: {draft}/config.json has hidden_size None, but the stack was planned for a draft with 4096 "
        "(speculative_model, speculative_model_config)")
