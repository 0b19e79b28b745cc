"""The nxdi engine's command lines for its second image, AWS's vLLM Deep Learning Container
pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04 (``DLC_VLLM_0_16_0``), checked against
the real CLI of the vLLM it bundles, 0.16.0, through tests/harness/vllm_cli.py with the python of
.tools/vllm-0.16.0 (requirements-vllm-0.16.0.txt): the export's ``vllm run-batch`` and a replica's ``vllm serve``
parse, and every engine argument reaches vLLM's engine with the plan's value. Four runs of vLLM, a few seconds
each; tests/harness/test_vllm_013.py checks the default image's vLLM 0.13.0 more widely."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness.test_vllm_013 import QUANTIZED, model
from tests.harness.test_vllm_013 import run as run_with

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".tools" / "vllm-0.16.0" / "bin" / "python"

ADDED_TOOL_CALL_PARSERS = {"functiongemma", "glm47", "step3p5"}
"""The tool call parsers vLLM 0.16.0 registers that 0.13.0 does not (vllm/tool_parsers/__init__.py,
``_TOOL_PARSERS_TO_REGISTER``, in each wheel): FunctionGemma's, GLM-4.7's and Step-3.5's, none of them a model
the nxdi engine serves. 0.16.0 drops none of 0.13.0's, so ``nxdi.TOOL_CALL_PARSERS`` (0.13.0's) are all
registered in both images."""


def run(argv: list[str], tmp_path: Path) -> dict[str, Any]:
    # HF_HUB_OFFLINE=1, as the export and the replicas run (nxdi.export_environment, replica_environment).
    return run_with(argv, tmp_path, env={"HF_HUB_OFFLINE": "1"}, python=PYTHON)


def _plan(model_id: str, **request: Any):
    from neuron_serving.plan import ServingRequest, plan_serving

    return plan_serving(ServingRequest(model_id, "inf2.24xlarge", tensor_parallel=2, **request))


def _wanted(plan: Any, override: dict[str, Any]) -> dict[str, Any]:
    block = plan.request.prefix_cache_block_size
    return {"tensor_parallel_size": 2, "max_num_seqs": 4, "max_model_len": 4096, "dtype": "bfloat16",
            "enable_prefix_caching": block is not None, "block_size": block,
            "num_gpu_blocks_override": 512 if block else 4,
            # --additional-config's JSON arrives parsed (vllm/config/utils.py) for the plugin to read. The SDK
            # 2.31.1 image's NxD Inference (0.10) turns an NKI attention kernel on by itself from 4096 tokens,
            # which the engine turns off (nxdi.ATTENTION_KERNEL_OFF_FROM). No --quantization: the plugin
            # quantizes itself.
            "additional_config": {"override_neuron_config": {"save_sharded_checkpoint": True,
                                                             "attn_kernel_enabled": False, **override}},
            "quantization": None}


def test_the_nxdi_export_and_replica_of_the_0_16_0_image_reach_vllm_0_16_0s_engine_with_the_plans_values(tmp_path):
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_16_0, NXDI

    # Qwen 2.5 with a prefix cache of 32-token blocks, INT8 weights, and Hermes tool calls.
    plan = _plan("qwen2.5-7b", prefix_cache_block_size=32, quantization="int8")
    wanted = _wanted(plan, QUANTIZED)
    replica = run([NXDI.replica_entrypoint(DLC_VLLM_0_16_0), *NXDI.replica_command(plan, DLC_VLLM_0_16_0,
                                                                                   model(tmp_path))], tmp_path)
    assert replica["exit_code"] == 0, replica.get("error")
    assert replica["subcommand"] == "serve" and replica["started"] == "run_server_worker"
    assert replica["platform"] == "NeuronPlatformStandIn"
    assert {k: replica["engine_args"][k] for k in wanted} == wanted
    assert replica["engine_args"]["model"] == model(tmp_path)
    assert replica["engine_args"]["served_model_name"] == [plan.model_id]
    assert replica["engine_args_types"]["additional_config"] == "dict"
    # validate_api_server_args took the parser: the server went on to bind its port.
    assert replica["server_socket"] == ["", 8080]
    assert {k: replica["frontend"][k] for k in ("port", "disable_uvicorn_access_log", "disable_fastapi_docs",
                                                "enable_auto_tool_choice", "tool_call_parser")} == {
        "port": 8080, "disable_uvicorn_access_log": True, "disable_fastapi_docs": True,
        "enable_auto_tool_choice": True, "tool_call_parser": "hermes"}
    source, output = model(tmp_path, "KEY.src"), model(tmp_path, "KEY.tmp")
    export = run(["vllm", *NXDI.export_arguments(plan, DLC_VLLM_0_16_0, source, output)], tmp_path)
    assert export["exit_code"] == 0, export.get("error")
    assert export["subcommand"] == "run-batch"
    # The real run_batch read the empty batch, built its serving objects over the engine and asked it nothing.
    assert export["run_batch"] == {
        "engine_started_with": {"usage_context": "OPENAI_BATCH_RUNNER", "disable_frontend_multiprocessing": False,
                                "client_config": None},
        "calls": ["get_supported_tasks"], "completed": True, "engine_closed": True}
    assert {k: export["engine_args"][k] for k in wanted} == wanted
    assert export["engine_args"]["model"] == source


def test_a_speculating_replica_of_the_0_16_0_image_serves_with_llama3_json_tool_calls(tmp_path):
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_16_0, NXDI

    # Llama 3.1 (llama3_json by default) without a prefix cache (a contiguous KV cache of one block per sequence)
    # and with an EAGLE draft of its shape.
    plan = _plan("llama-3.1-8b", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B", speculative_tokens=4)
    wanted = _wanted(plan, {})
    result = run([NXDI.replica_entrypoint(DLC_VLLM_0_16_0), *NXDI.replica_command(plan, DLC_VLLM_0_16_0,
                                                                                  model(tmp_path))], tmp_path)
    assert result["exit_code"] == 0, result.get("error")
    assert {k: result["engine_args"][k] for k in wanted} == wanted
    # The draft in the export, as the plugin reads it on every load.
    assert result["engine_args"]["speculative_config"] == {
        "method": "eagle", "model": f"{model(tmp_path)}/eagle-draft", "num_speculative_tokens": 4}
    assert result["server_socket"] == ["", 8080]
    assert (result["frontend"]["enable_auto_tool_choice"], result["frontend"]["tool_call_parser"]) == (
        True, "llama3_json")


def test_vllm_0_16_0_registers_the_tool_call_parsers_of_0_13_0_and_three_more(tmp_path):
    from neuron_serving.plan.engines.nxdi import TOOL_CALL_PARSERS

    result = run(["vllm", "serve", model(tmp_path), "--port", "8080", "--enable-auto-tool-choice",
                  "--tool-call-parser", "no_such_parser"], tmp_path)
    # api_server.py's validate_api_server_args refuses the name, listing the registered ones, before the port.
    assert result["exit_code"] == 1 and "server_socket" not in result and "started" not in result
    assert result["error"].startswith("KeyError: 'invalid tool call parser: no_such_parser")
    registered = {name.strip() for name in result["error"].partition("(chose from {")[2].partition("}")[0].split(",")}
    assert set(TOOL_CALL_PARSERS) - registered == set()
    assert registered - set(TOOL_CALL_PARSERS) == ADDED_TOOL_CALL_PARSERS
