"""The export argv of userdata/export-model.sh.j2, through optimum-neuron 0.3.0's real CLI parsing and export routing
(the optimum-neuron of ghcr.io/huggingface/text-generation-inference:3.3.5-neuron), up to the call that would compile.

`tests/harness/optimum_neuron.py` runs the argv with the tools venv `.tools/optimum-neuron-0.3.0`
(`tests/harness/requirements-optimum-neuron-0.3.0.txt`) and reports, as JSON, what reached
`NxDModelForCausalLM.export`. Without that venv these tests skip, or fail when `CI` is set.

Facts checked here (huggingface/optimum-neuron, tag v0.3.0):
- optimum/commands/export/neuronx.py accepts both `--num_cores` and `--tensor_parallel_size` (so `--help` cannot
  tell which one is honoured), and `NeuronxExportCommand.run` re-runs the words as
  `python3 -m optimum.exporters.neuron ...`.
- optimum/exporters/neuron/__main__.py `maybe_export_from_neuron_model_class` pops `tensor_parallel_size`; only
  `num_cores` reaches `NeuronModelForCausalLM._export` (optimum/neuron/modeling_decoder.py), where `None` means
  `get_available_cores()` = 2 x the /dev/neuron* devices (optimum/neuron/utils/system.py).
- `infer_task` cannot infer the task of a local directory (optimum 1.24 `TasksManager`): `--task` is required.
- From a local directory the export's `save` is given the directory as `weight_path` and shards the weights into
  checkpoint/weights/tp{rank}_sharded_checkpoint.safetensors (optimum/neuron/models/inference/backend/
  pretrained_model.py, `NxDPreTrainedModel.save`), next to config.json, neuron_config.json and model.pt; the
  tokenizer is saved too when the directory has one (`maybe_export_from_neuron_model_class`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".tools" / "optimum-neuron-0.3.0" / "bin" / "python"
RUNNER = Path(__file__).with_name("optimum_neuron.py")
IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.5-neuron"
REQUIREMENTS = Path(__file__).with_name("requirements-optimum-neuron-0.3.0.txt")

# A Llama small enough to write by hand: only its config matters up to the compile step.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}
# A word-level tokenizer in the `tokenizers` JSON format, which transformers loads as PreTrainedTokenizerFast.
TINY_TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "hello": 1, "world": 2}, "unk_token": "<unk>"},
}


@pytest.fixture
def tools_python() -> Path:
    if not TOOLS_PYTHON.is_file():
        message = (
            f"{TOOLS_PYTHON} is missing: python3.11 -m venv .tools/optimum-neuron-0.3.0 && "
            f".tools/optimum-neuron-0.3.0/bin/pip install --no-deps -r {REQUIREMENTS.relative_to(ROOT)}"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return TOOLS_PYTHON


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """The checkpoint as export-model downloads it into <exports>/KEY.src (here without weights)."""
    src = tmp_path / "KEY.src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(TINY_LLAMA))
    return src


def export_argv(
    model: Path,
    out: Path,
    *,
    cores_flag: str = "--num_cores",
    cores: int = 8,
    batch_size: int = 4,
    sequence_length: int = 4096,
    dtype: str = "bf16",
    task: bool = True,
) -> list[str]:
    """The container argv of export-model.sh.j2's `docker run --entrypoint optimum-cli ... export neuron ...`."""
    return [
        "optimum-cli", "export", "neuron", "--model", str(model), *(["--task", "text-generation"] if task else []),
        "--batch_size", str(batch_size), "--sequence_length", str(sequence_length),
        cores_flag, str(cores), "--auto_cast_type", dtype, str(out),
    ]  # fmt: skip


def run(python: Path, tmp: Path, argv: list[str], *, devices: int = 6, docker_run: bool = False) -> dict[str, Any]:
    """The runner's JSON for `argv`, run as in the container: offline (`-e HF_HUB_OFFLINE=1`), `devices` devices;
    `tmp` holds the Hugging Face cache."""
    cmd = [str(python), str(RUNNER), "--json", json.dumps(argv)]
    cmd += ["--docker-run"] if docker_run else ["--neuron-devices", str(devices)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_RT_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf-home")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        pytest.fail(f"the runner failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def neuron_config(out: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((out / "neuron_config.json").read_text())
    return config


def test_num_cores_reaches_the_exporter_as_the_degree(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "KEY.tmp"
    result = run(tools_python, tmp_path, export_argv(model_dir, out, cores_flag="--num_cores", cores=8), devices=6)
    assert result["exit_code"] == 0, result["stderr"]
    assert result["routed"]["kwargs"]["num_cores"] == 8
    assert result["export"]["tp_degree"] == 8
    assert result["export"]["neuron_config"]["local_ranks_size"] == 8
    assert neuron_config(out)["tp_degree"] == 8


def test_tensor_parallel_size_does_not_reach_the_exporter(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    """The defect: 0.3.0 accepts --tensor_parallel_size, then drops it; the export takes every core it sees."""
    out = tmp_path / "KEY.tmp"
    argv = export_argv(model_dir, out, cores_flag="--tensor_parallel_size", cores=8)
    result = run(tools_python, tmp_path, argv, devices=6)
    assert result["exit_code"] == 0, result["stderr"]
    assert "--tensor_parallel_size" in result["exporter_argv"]
    assert "num_cores" not in result["routed"]["kwargs"]
    assert "tensor_parallel_size" not in result["routed"]["kwargs"]
    assert result["routed"]["available_cores"] == 12
    assert result["export"]["tp_degree"] == 12 != 8
    assert neuron_config(out)["tp_degree"] == 12


def test_help_lists_both_degree_flags(tools_python: Path, tmp_path: Path) -> None:
    """So a `--help` probe that prefers --tensor_parallel_size when listed picks the flag 0.3.0 ignores."""
    result = run(tools_python, tmp_path, ["optimum-cli", "export", "neuron", "--help"])
    assert result["exit_code"] == 0
    assert "--tensor_parallel_size" in result["stdout"]
    assert "--num_cores" in result["stdout"]
    assert result["export"] is None


@pytest.mark.parametrize(("dtype", "torch_dtype"), [("bf16", "bfloat16"), ("fp16", "float16")])
def test_shapes_dtype_and_paths_reach_the_exporter(
    tools_python: Path, model_dir: Path, tmp_path: Path, dtype: str, torch_dtype: str
) -> None:
    out = tmp_path / "KEY.tmp"
    argv = export_argv(model_dir, out, cores=2, batch_size=3, sequence_length=2048, dtype=dtype)
    result = run(tools_python, tmp_path, argv, devices=1)
    assert result["exit_code"] == 0, result["stderr"]
    assert result["model_class_lookups"] == [
        {
            "model_type": "llama",
            "task": "text-generation",
            "mode": "inference",
            "class": "optimum.neuron.models.inference.auto_models.LLamaModelForCausalLM",
        }
    ]
    export = result["export"]
    assert export["model_id"] == str(model_dir)
    assert export["model_id_is_local"] is True
    assert export["checkpoint_id"] is None  # a local directory: no Hub checkpoint to fall back to
    assert export["load_weights"] is False
    assert (export["tp_degree"], export["batch_size"], export["sequence_length"]) == (2, 3, 2048)
    assert export["torch_dtype"] == torch_dtype
    assert export["continuous_batching"] is True  # batch_size > 1 (llama/modeling_llama.py _get_neuron_config)
    # What the export writes into the output dir: the real configs here; the compiled model and the weights,
    # sharded from the local directory, are recorded only.
    assert result["save"]["dest_path"] == str(out)
    assert result["save"]["weight_path"] == str(model_dir)
    assert result["save"]["shard_checkpoint"] == {"src_path": str(model_dir), "dest_path": str(out / "checkpoint")}
    assert result["output_files"] == ["config.json", "neuron_config.json"]
    assert result["not_written"] == [
        str(out / "model.pt"),
        *(str(out / "checkpoint" / "weights" / f"tp{r}_sharded_checkpoint.safetensors") for r in range(2)),
    ]
    saved = neuron_config(out)
    assert (saved["batch_size"], saved["sequence_length"], saved["tp_degree"], saved["torch_dtype"]) == (
        3, 2048, 2, torch_dtype,
    )  # fmt: skip
    assert saved["_serialized_key"] == "NxDNeuronConfig"
    assert saved["optimum_neuron_version"] == "0.3.0"
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_the_tokenizer_of_the_directory_is_saved_into_the_export(
    tools_python: Path, model_dir: Path, tmp_path: Path
) -> None:
    (model_dir / "tokenizer.json").write_text(json.dumps(TINY_TOKENIZER))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    out = tmp_path / "KEY.tmp"
    result = run(tools_python, tmp_path, export_argv(model_dir, out))
    assert result["exit_code"] == 0, result["stderr"]
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(result["output_files"])


def test_an_unknown_flag_is_rejected_before_exporting(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    argv = export_argv(model_dir, tmp_path / "KEY.tmp")
    result = run(tools_python, tmp_path, [*argv[:-1], "--bogus_flag", argv[-1]])
    assert result["exit_code"] == 2
    assert "unrecognized arguments: --bogus_flag" in result["error"]
    assert result["exporter_command"] is None
    assert result["export"] is None


def test_an_unknown_dtype_is_rejected(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    result = run(tools_python, tmp_path, export_argv(model_dir, tmp_path / "KEY.tmp", dtype="fp8"))
    assert result["exit_code"] == 2
    assert "argument --auto_cast_type: invalid choice: 'fp8'" in result["error"]
    assert result["export"] is None


def test_a_local_directory_needs_the_task(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    result = run(tools_python, tmp_path, export_argv(model_dir, tmp_path / "KEY.tmp", task=False))
    assert result["exit_code"] == 1
    assert result["exporter_exit_code"] == 1
    assert "Cannot infer the task from a local directory" in result["exporter_error"]
    assert result["export"] is None


def test_an_unsupported_model_type_fails(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    """mistral has no NxD class in 0.3.0 (auto_models.py), and the legacy exporter has no decoder config for it."""
    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA | {"model_type": "mistral"}))
    result = run(tools_python, tmp_path, export_argv(model_dir, tmp_path / "KEY.tmp"))
    assert result["exit_code"] == 1
    assert "mistral is not supported yet with the neuron backend" in result["exporter_error"]
    assert result["export"] is None


def test_a_whole_docker_run_argv(tools_python: Path, model_dir: Path, tmp_path: Path) -> None:
    """The `docker run` words export-model.sh.j2 issues: --device per device, -e, and the -v mount of the exports."""
    exports = tmp_path
    models = Path("/models")
    command = export_argv(models / "KEY.src", models / "KEY.tmp", cores_flag="--tensor_parallel_size", cores=4)
    docker = [
        "run", "--rm", "--entrypoint", "optimum-cli",
        "--device", "/dev/neuron0", "--device", "/dev/neuron1", "--device", "/dev/neuron2",
        "-e", "HF_HUB_OFFLINE=1", "-v", f"{exports}:/models", IMAGE,
        *command[1:],  # after the image: the entrypoint's arguments
    ]  # fmt: skip
    result = run(tools_python, tmp_path, docker, docker_run=True)
    assert result["exit_code"] == 0, result["stderr"]
    assert result["container_env"] == {"HF_HUB_OFFLINE": "1"}
    assert result["container_argv"][-1] == "/models/KEY.tmp"
    assert result["export"]["model_id"] == str(model_dir)
    assert result["export"]["tp_degree"] == 6  # 3 devices x 2 cores, not the 4 asked for
    assert neuron_config(exports / "KEY.tmp")["tp_degree"] == 6
