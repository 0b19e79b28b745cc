"""The beliefs about optimum-neuron 0.4.5 that tests/boot/inside.py (VllmImage) encodes, checked against its real
code through tests/harness/optimum_neuron_045.py: the export's default degree and dtype, and serve's refusals."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.test_optimum_neuron import TINY_LLAMA

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".tools" / "optimum-neuron-0.4.5" / "bin" / "python"
RUNNER = ROOT / "tests" / "harness" / "optimum_neuron_045.py"


def run(argv: list[str], tmp_path: Path, devices: int = 1, instance: str = "inf2.24xlarge") -> dict[str, Any]:
    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYTHON} is missing: scripts/test makes it")
        pytest.skip(f"{PYTHON} is missing: scripts/test makes it")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_RT_", "VLLM_"))}
    done = subprocess.run([str(PYTHON), str(RUNNER), "--devices", str(devices), "--instance", instance,
                           "--env", json.dumps({"HF_HUB_OFFLINE": "1"}), "--json", json.dumps(argv)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**clean, "HF_HOME": str(tmp_path / "hf-home"), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def checkpoint(path: Path, **config: Any) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**TINY_LLAMA, **config}))
    return path


def export(tmp_path: Path, *flags: str, **config: Any) -> tuple[dict[str, Any], Path]:
    src = checkpoint(tmp_path / "src", **config)
    out = tmp_path / "out"
    result = run(["optimum-cli", "export", "neuron", "--model", str(src), "--task", "text-generation",
                  "--batch_size", "4", "--sequence_length", "2048", *flags, str(out)], tmp_path)
    assert result["exit_code"] == 0, result.get("error")
    return result, out


def test_without_tensor_parallel_size_the_export_compiles_for_one_core_with_the_checkpoints_dtype(tmp_path):
    # The auto-cast type asked for is ignored: the dtype is config.json's (fp16 here).
    result, _ = export(tmp_path, "--auto_cast_type", "bf16", torch_dtype="float16")
    config = result["compile"]["neuron_config"]
    assert (config["tp_degree"], config["torch_dtype"], config["target"], config["continuous_batching"]) == (
        1, "float16", "trn1", True)


def test_serve_refuses_an_export_of_another_degree_before_vllm_starts(tmp_path):
    _, out = export(tmp_path, "--tensor_parallel_size", "2")
    result = run(["optimum-cli", "neuron", "serve", "--port", "8080", "--model", str(out),
                  "--tensor_parallel_size", "4", "--batch_size", "4", "--sequence_length", "2048"], tmp_path, devices=2)
    assert result["exit_code"] != 0 and "run_server" not in result
    assert "ValueError" in result["error"] and "tensor" in result["error"].lower()


def test_serve_refuses_an_export_of_another_optimum_neuron_version(tmp_path):
    _, out = export(tmp_path, "--tensor_parallel_size", "2")
    config = json.loads((out / "neuron_config.json").read_text())
    (out / "neuron_config.json").write_text(json.dumps({**config, "optimum_neuron_version": "0.3.0"}))
    result = run(["optimum-cli", "neuron", "serve", "--port", "8080", "--model", str(out)], tmp_path)
    assert result["exit_code"] != 0 and "run_server" not in result
    assert "0.3.0" in result["error"]


def test_the_export_records_the_compilers_version_with_its_local_label_and_serve_refuses_any_other(tmp_path):
    # What NeuronConfig.from_dict compares: the whole neuronxcc.__version__ string, so the bare
    # release (what check-export once required) is refused as another compiler would be.
    result, out = export(tmp_path, "--tensor_parallel_size", "2")
    assert result["compile"]["neuron_config"]["neuronxcc_version"] == "2.21.33363.0+82129205"
    served = run(["optimum-cli", "neuron", "serve", "--port", "8080", "--model", str(out)], tmp_path, devices=1)
    assert served["exit_code"] == 0 and "run_server" in served, served.get("error")
    config = json.loads((out / "neuron_config.json").read_text())
    (out / "neuron_config.json").write_text(json.dumps({**config, "neuronxcc_version": "2.21.33363.0"}))
    refused = run(["optimum-cli", "neuron", "serve", "--port", "8080", "--model", str(out)], tmp_path, devices=1)
    assert refused["exit_code"] != 0 and "run_server" not in refused
    assert ("exported using version 2.21.33363.0 of the neuronxcc compiler, but 2.21.33363.0+82129205 is installed"
            in refused["error"])


def test_the_replica_environment_turns_off_vllms_usage_reports_and_route_probe_and_the_hub(tmp_path):
    # vLLM 0.11.0's and huggingface-hub 0.36.2's own readings of the environment each server gets.
    from neuron_serving.plan import ServingRequest, plan_serving
    from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5, VLLM

    plan = plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge"))
    env = VLLM.replica_environment(plan, OPTIMUM_NEURON_VLLM_0_4_5, plan.replicas[0], "/models/x")
    if not PYTHON.exists():
        pytest.skip(f"{PYTHON} is missing: scripts/test makes it")
    probe = ("import json, huggingface_hub.constants as hub, vllm.usage.usage_lib as usage, vllm.utils as utils;"
             "print(json.dumps([usage.is_usage_stats_enabled(), utils.get_ip(), hub.HF_HUB_OFFLINE]))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "VLLM_", "DO_NOT_TRACK"))}
    done = subprocess.run([str(PYTHON), "-c", probe], capture_output=True, text=True, check=False, timeout=300,
                          env={**clean, **{k: v for k, v in env.items() if not k.startswith("SM_ON_")},
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, "127.0.0.1", True]


# The router answers its own errors in vLLM's ErrorResponse (neuron_serving.plan.engines.vllm, error_body):
# checked against the models of the vLLM 0.11.0 the tools venv installs, as its api_server's
# http_exception_handler builds one (type: the status's phrase; code: the status).
ERROR_CHECK = """
import json, sys
from http import HTTPStatus
from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
bodies = json.load(sys.stdin)
print(json.dumps([ErrorResponse(error=ErrorInfo(message=json.loads(body)["error"]["message"],
                                                type=HTTPStatus(int(status)).phrase, code=int(status))
                                ).model_dump_json() for status, body in bodies]))
"""


def test_the_routers_vllm_errors_are_what_vllm_0_11_0s_own_models_write(tmp_path: Path) -> None:
    from neuron_serving.plan.engines import engine
    from neuron_serving.render.router import UNAUTHORIZED, error_pages

    if not PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{PYTHON} is missing: scripts/test makes it")
        pytest.skip(f"{PYTHON} is missing: scripts/test makes it")
    vllm = engine("vllm")
    bodies = [*error_pages(vllm).items(), (401, vllm.error_body(401, UNAUTHORIZED))]
    done = subprocess.run([str(PYTHON), "-c", ERROR_CHECK], input=json.dumps(bodies), capture_output=True, text=True,
                          check=False, timeout=300, env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    written = json.loads(done.stdout.strip().splitlines()[-1])
    assert [json.loads(w) for w in written] == [json.loads(body) for _, body in bodies]
