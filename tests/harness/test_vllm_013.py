"""The beliefs about vLLM 0.13.0's command line that the engine for AWS's vLLM Deep Learning Container
(pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04) rests on, checked against vLLM 0.13.0's
real CLI through tests/harness/vllm_cli.py: what `vllm serve` and `vllm run-batch` accept, refuse, and hand the
engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".tools" / "vllm-0.13.0" / "bin" / "python"
RUNNER = ROOT / "tests" / "harness" / "vllm_cli.py"
ADDITIONAL = '{"override_neuron_config": {"save_sharded_checkpoint": true}}'


def run(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None, python: Path = PYTHON) -> dict[str, Any]:
    """``argv`` through the runner with ``python``, a tools venv's (tests/harness/test_vllm_016.py passes vLLM
    0.16.0's): missing, the test fails under CI and is skipped elsewhere."""
    if not python.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{python} is missing: scripts/test makes it")
        pytest.skip(f"{python} is missing: scripts/test makes it")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_RT_", "VLLM_"))}
    done = subprocess.run([str(python), str(RUNNER), "--env", json.dumps(env or {}), "--json", json.dumps(argv)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**clean, "HF_HOME": str(tmp_path / "hf-home"), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def model(tmp_path: Path, name: str = "KEY") -> str:
    """The model's folder: it must exist, as /models/KEY does in the container (see the last test)."""
    path = tmp_path / "models" / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


def serve(tmp_path: Path, *flags: str) -> list[str]:
    return ["vllm", "serve", model(tmp_path), "--served-model-name", "meta-llama/Meta-Llama-3-8B", "--port", "8080",
            "--tensor-parallel-size", "2", "--max-num-seqs", "4", "--max-model-len", "4096", *flags]


NEURON_FLAGS = ("--num-gpu-blocks-override", "4", "--no-enable-prefix-caching", "--disable-uvicorn-access-log",
                "--disable-fastapi-docs", "--additional-config", ADDITIONAL)


def test_the_serve_command_reaches_the_engine_with_its_values(tmp_path):
    result = run(serve(tmp_path, *NEURON_FLAGS), tmp_path)
    assert result["exit_code"] == 0, result.get("error")
    assert result["subcommand"] == "serve" and result["started"] == "run_server_worker"
    assert result["platform"] == "NeuronPlatformStandIn"
    engine = result["engine_args"]
    assert {k: engine[k] for k in ("model", "served_model_name", "tensor_parallel_size", "max_num_seqs",
                                   "max_model_len", "block_size", "num_gpu_blocks_override",
                                   "enable_prefix_caching", "enable_lora", "speculative_config")} == {
        "model": model(tmp_path), "served_model_name": ["meta-llama/Meta-Llama-3-8B"], "tensor_parallel_size": 2,
        "max_num_seqs": 4, "max_model_len": 4096, "block_size": None, "num_gpu_blocks_override": 4,
        "enable_prefix_caching": False, "enable_lora": None, "speculative_config": None}
    # --additional-config's JSON arrives parsed, a dict, as the Neuron plugin reads it.
    assert result["engine_args_types"]["additional_config"] == "dict"
    assert engine["additional_config"] == {"override_neuron_config": {"save_sharded_checkpoint": True}}
    # The server's own flags are not the engine's: they stay on the namespace.
    assert {k: result["frontend"][k] for k in ("port", "disable_uvicorn_access_log", "disable_fastapi_docs")} == {
        "port": 8080, "disable_uvicorn_access_log": True, "disable_fastapi_docs": True}
    assert "port" not in engine and "disable_fastapi_docs" not in engine
    assert result["server_socket"] == ["", 8080]


def test_a_block_size_of_4096_is_refused_by_the_parser(tmp_path):
    # vllm/config/cache.py: BlockSize = Literal[1, 8, 16, 32, 64, 128, 256], which argparse offers as its choices.
    # (Without prefix caching, vllm-neuron's NeuronPlatform.check_and_update_config sets block_size to
    # max_model_len itself.)
    result = run(serve(tmp_path, "--block-size", "4096", *NEURON_FLAGS), tmp_path)
    assert result["exit_code"] == 2 and "started" not in result
    assert result["error"] == ("vllm serve: error: argument --block-size: invalid choice: 4096 "
                               "(choose from 1, 8, 16, 32, 64, 128, 256)")


def test_an_unknown_flag_is_refused_and_named(tmp_path):
    result = run(serve(tmp_path, "--no-such-flag", "1"), tmp_path)
    assert result["exit_code"] == 2 and "started" not in result
    assert "--no-such-flag" in result["error"] and ": error: " in result["error"]


def test_prefix_caching_lora_speculation_and_tool_choice_flags_parse(tmp_path):
    lora = model(tmp_path, "lora")
    result = run(serve(tmp_path, "--enable-prefix-caching", "--block-size", "32", "--num-gpu-blocks-override", "256",
                       "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16", "--lora-modules", f"name={lora}",
                       "--speculative-config", '{"model": "/x", "method": "eagle", "num_speculative_tokens": 5}',
                       "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"), tmp_path)
    assert result["exit_code"] == 0, result.get("error")
    engine = result["engine_args"]
    assert {k: engine[k] for k in ("enable_prefix_caching", "block_size", "num_gpu_blocks_override", "enable_lora",
                                   "max_loras", "max_lora_rank")} == {
        "enable_prefix_caching": True, "block_size": 32, "num_gpu_blocks_override": 256, "enable_lora": True,
        "max_loras": 2, "max_lora_rank": 16}
    # The speculative config stays the parsed dict: SpeculativeConfig is made only by create_engine_config.
    assert engine["speculative_config"] == {"model": "/x", "method": "eagle", "num_speculative_tokens": 5}
    assert result["engine_args_types"]["speculative_config"] == "dict"
    assert result["frontend"]["lora_modules"] == [{"name": "name", "path": lora, "base_model_name": None}]
    assert (result["frontend"]["enable_auto_tool_choice"], result["frontend"]["tool_call_parser"]) == (
        True, "llama3_json")


def test_auto_tool_choice_without_a_parser_is_refused_by_the_validate_hook(tmp_path):
    result = run(serve(tmp_path, "--enable-auto-tool-choice"), tmp_path)
    assert result["exit_code"] == 1 and "started" not in result
    assert result["error"] == "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"


def batch(tmp_path: Path, *flags: str) -> list[str]:
    return ["vllm", "run-batch", "-i", "/dev/null", "-o", "/dev/null", "--model", model(tmp_path, "KEY.src"),
            "--tensor-parallel-size", "2", "--max-num-seqs", "4", "--max-model-len", "4096", *flags]


def test_run_batch_with_no_requests_completes_without_a_request_to_the_engine(tmp_path):
    result = run(batch(tmp_path, "--num-gpu-blocks-override", "4", "--no-enable-prefix-caching",
                       "--additional-config", ADDITIONAL), tmp_path)
    assert result["exit_code"] == 0, result.get("error")
    assert result["subcommand"] == "run-batch"
    assert result["run_batch"] == {
        "engine_started_with": {"usage_context": "OPENAI_BATCH_RUNNER", "disable_frontend_multiprocessing": False,
                                "client_config": None},
        "calls": ["get_supported_tasks"], "completed": True, "engine_closed": True}
    engine = result["engine_args"]
    assert {k: engine[k] for k in ("model", "tensor_parallel_size", "max_num_seqs", "max_model_len",
                                   "num_gpu_blocks_override", "enable_prefix_caching", "additional_config")} == {
        "model": model(tmp_path, "KEY.src"), "tensor_parallel_size": 2, "max_num_seqs": 4, "max_model_len": 4096,
        "num_gpu_blocks_override": 4, "enable_prefix_caching": False,
        "additional_config": {"override_neuron_config": {"save_sharded_checkpoint": True}}}


def test_run_batch_refuses_the_servers_own_flags(tmp_path):
    # run_batch.py's make_arg_parser has its own flags and AsyncEngineArgs', not serve's FrontendArgs.
    flags = ("--disable-uvicorn-access-log", "--disable-fastapi-docs", "--lora-modules", "name=/x",
             "--enable-auto-tool-choice")
    result = run(batch(tmp_path, *flags), tmp_path)
    assert result["exit_code"] == 2 and "run_batch" not in result
    # The top parser reports every word no subparser took (argparse's parse_args: "unrecognized arguments: %s"
    # of them all), as "vllm: error:", not "vllm run-batch: error:": one run refuses each of the four flags.
    assert result["error"].startswith("vllm: error: unrecognized arguments: " + " ".join(flags))


def test_a_missing_model_folder_fails_before_the_engine_when_the_hub_is_offline(tmp_path):
    # EngineArgs.__post_init__ (vllm/engine/arg_utils.py), with HF_HUB_OFFLINE=1 as the replicas run: a model
    # that is not a path on disk is looked up in the Hub's cache (get_model_path), where an absolute path is no
    # repository id.
    result = run(["vllm", "serve", str(tmp_path / "absent"), "--port", "8080"], tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert result["exit_code"] == 1 and "engine_args" not in result
    assert result["error"].startswith("huggingface_hub.errors.HFValidationError: Repo id must be")


# -- the nxdi engine's own command lines (neuron_serving.plan.engines.nxdi), as the boot renders them -------------


def _nxdi_plan(**request: Any):
    from neuron_serving.plan import ServingRequest, plan_serving

    return plan_serving(ServingRequest("NousResearch/Meta-Llama-3-8B-Instruct", "inf2.24xlarge", tensor_parallel=2,
                                       **request))


QUANTIZED = {"quantized": True, "quantized_checkpoints_path": "/tmp/neuron-serving-quantized-checkpoint.pt",
             "quantization_type": "per_channel_symmetric", "quantization_dtype": "int8"}
"""What the vllm-neuron plugin (release-0.4.1, neuronx_distributed_model_loader.py) passes to NxD Inference
for INT8 weights: ``quantized`` with its path, type and dtype, in ``override_neuron_config``."""


# A draft is served neither with quantized weights nor with a prefix cache (Nxdi.check_plan).
@pytest.mark.parametrize(("prefix_cache", "quantization", "draft"),
                         [(32, "int8", None), (None, None, "yuhuili/EAGLE-LLaMA3-Instruct-8B")])
def test_the_nxdi_engines_export_and_replica_commands_reach_vllm_0_13_0s_engine_with_the_plans_values(
    tmp_path, prefix_cache, quantization, draft,
):
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_13_0, NXDI

    plan = _nxdi_plan(prefix_cache_block_size=prefix_cache, quantization=quantization, speculative_model=draft)
    override = {"save_sharded_checkpoint": True, **(QUANTIZED if quantization else {})}
    wanted = {"tensor_parallel_size": 2, "max_num_seqs": 4, "max_model_len": 4096, "dtype": "bfloat16",
              "enable_prefix_caching": prefix_cache is not None, "block_size": prefix_cache,
              "num_gpu_blocks_override": 512 if prefix_cache else 4,
              # vLLM takes --additional-config as JSON (vllm/config/utils.py, the parser's json.loads) and does
              # not read it: the plugin does. No --quantization: the plugin quantizes itself.
              "additional_config": {"override_neuron_config": override}, "quantization": None}

    def speculation(where: str) -> dict[str, Any] | None:
        # --speculative-config, JSON too (EngineArgs.add_cli_args), reaches the engine as the dict whose
        # method, model and num_speculative_tokens SpeculativeConfig takes (vllm/config/speculative.py).
        return None if draft is None else {"method": "eagle", "model": f"{where}/eagle-draft",
                                           "num_speculative_tokens": 5}

    replica = run([NXDI.replica_entrypoint(DLC_VLLM_0_13_0), *NXDI.replica_command(plan, DLC_VLLM_0_13_0,
                                                                                   model(tmp_path))], tmp_path,
                  env={"HF_HUB_OFFLINE": "1"})
    assert replica["exit_code"] == 0, replica.get("error")
    assert {k: replica["engine_args"][k] for k in wanted} == wanted
    assert replica["engine_args"]["speculative_config"] == speculation(model(tmp_path))
    assert replica["engine_args"]["served_model_name"] == [plan.model_id]
    assert replica["server_socket"] == ["", 8080]
    source, output = model(tmp_path, "KEY.src"), model(tmp_path, "KEY.tmp")
    export = run(["vllm", *NXDI.export_arguments(plan, DLC_VLLM_0_13_0, source, output)], tmp_path,
                 env={"HF_HUB_OFFLINE": "1"})
    assert export["exit_code"] == 0, export.get("error")
    assert export["run_batch"]["completed"] and export["run_batch"]["calls"] == ["get_supported_tasks"]
    assert {k: export["engine_args"][k] for k in wanted} == wanted
    assert export["engine_args"]["speculative_config"] == speculation(source)
    assert export["engine_args"]["model"] == source


@pytest.mark.parametrize(("model_id", "parser"), [("llama-3.1-8b", "llama3_json"), ("qwen2.5-7b", "hermes")])
def test_the_nxdi_engines_tool_call_parser_for_the_model_is_one_vllm_0_13_0_serves_with(tmp_path, model_id, parser):
    from neuron_serving.plan import ServingRequest, plan_serving
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_13_0, NXDI

    plan = plan_serving(ServingRequest(model_id, "inf2.24xlarge", tensor_parallel=2))
    result = run([NXDI.replica_entrypoint(DLC_VLLM_0_13_0), *NXDI.replica_command(plan, DLC_VLLM_0_13_0,
                                                                                  model(tmp_path))], tmp_path,
                 env={"HF_HUB_OFFLINE": "1"})
    assert result["exit_code"] == 0, result.get("error")
    # validate_api_server_args accepted the parser: the server went on to bind its port.
    assert result["server_socket"] == ["", 8080]
    assert (result["frontend"]["enable_auto_tool_choice"], result["frontend"]["tool_call_parser"]) == (True, parser)


def test_an_unregistered_tool_call_parser_is_refused_before_the_port_is_bound_naming_exactly_the_librarys_parsers(
    tmp_path,
):
    from neuron_serving.plan.engines.nxdi import TOOL_CALL_PARSERS

    # The parser takes any name; api_server.py's validate_api_server_args refuses it in setup_server, listing the
    # registered ones, which are the ones the library accepts.
    result = run(serve(tmp_path, "--enable-auto-tool-choice", "--tool-call-parser", "no_such_parser"), tmp_path)
    assert result["exit_code"] == 1 and "server_socket" not in result and "started" not in result
    assert result["error"].startswith("KeyError: 'invalid tool call parser: no_such_parser")
    registered = result["error"].partition("(chose from {")[2].partition("}")[0]
    assert sorted(name.strip() for name in registered.split(",")) == sorted(TOOL_CALL_PARSERS)
