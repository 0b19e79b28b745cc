"""vLLM on NxD Inference's boot on a simulated host: the export is vLLM itself, run once over an empty
batch, compiling into NEURON_COMPILED_ARTIFACTS with the weights sharded; each replica runs `vllm serve`
on that export, read-only, with the same engine arguments, and compiles nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from bootsim import CACHE, EXPORTS, MARKER, Host, complete_marker, make_plan
from inside import NxdiImage

from neuron_serving.plan import ServingConfigError, ServingPlan, ServingRequest, plan_serving
from neuron_serving.plan.engines import ServingImage, check_dlami_parameter
from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_13_0, DLC_VLLM_0_16_0, NXDI, QUANTIZED_CHECKPOINT
from neuron_serving.plan.host import resolve_host
from neuron_serving.render.boot import CHECK_EXPORT, RUN_REPLICA, render_boot_script
from neuron_serving.render.boot_options import BootOptions, ReadinessSignal
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
SIGNAL = ReadinessSignal(stack_name="NeuronLlamaStack", logical_id="Host")
ENGINE_ARGS = ["--tensor-parallel-size", "2", "--max-num-seqs", "4", "--max-model-len", "4096", "--dtype", "bfloat16",
               "--num-gpu-blocks-override", "4", "--no-enable-prefix-caching",
               "--additional-config", '{"override_neuron_config":{"save_sharded_checkpoint":true}}']


def _plan() -> ServingPlan:
    return make_plan("inf2.24xlarge", 2, model_id=MODEL)


def _boot(make_host: MakeHost, plan: ServingPlan, **knobs: str) -> tuple[Host, str]:
    host = make_host(plan.instance.devices)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL), engine="nxdi"), **knobs)
    return host, result.stdout + result.stderr if result.returncode else ""


def _exports(host: Host) -> list[dict[str, Any]]:
    return [c for c in host.containers() if c.get("Cmd", [None])[0] == "run-batch"]


def _signals(host: Host) -> list[dict[str, str]]:
    return [dict(zip(a[2::2], a[3::2], strict=True)) for a in host.aws("cloudformation", "signal-resource")]


def test_the_export_runs_vllm_once_and_each_replica_serves_it_read_only_ready_after_a_completion_through_it(
    make_host: MakeHost,
) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL, STUB_READY_AFTER="1")
    assert failure == ""
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)

    # The export: vLLM itself, once, over an empty batch, compiling into the export with its weights.
    [export] = _exports(host)
    assert export["Cmd"] == ["run-batch", "-i", "/dev/null", "-o", "/dev/null", "--model", f"/models/{key}.src",
                             *ENGINE_ARGS]
    env = dict(item.split("=", 1) for item in export["Env"])
    assert env["NEURON_COMPILED_ARTIFACTS"] == f"/models/{key}.tmp" and env["HF_HUB_OFFLINE"] == "1"
    assert [d["PathOnHost"] for d in export["HostConfig"]["Devices"]] == ["/dev/neuron0"]
    final = host.path(f"{EXPORTS}/{key}")
    assert (final / MARKER).read_text().startswith("exported at ")
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    saved = json.loads((final / "neuron_config.json").read_text())["neuron_config"]
    assert (saved["tp_degree"], saved["batch_size"], saved["seq_len"], saved["torch_dtype"]) == (2, 4, 4096, "bfloat16")
    # The compile, its weights per rank, and what vLLM reads of the checkpoint: not the checkpoint's weights.
    assert sorted(str(f.relative_to(final)) for f in final.rglob("*") if f.is_file()) == sorted([
        ".neuron-serving-complete", "config.json", "generation_config.json", "model.pt", "neuron_config.json",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
        "weights/tp0_sharded_checkpoint.safetensors", "weights/tp1_sharded_checkpoint.safetensors"])
    assert not host.path(f"{EXPORTS}/{key}.src").exists()

    # Ready only after a one-token completion of the served model through each replica.
    completions = [argv for argv in host.calls("curl") if argv[-1].endswith("/v1/completions")]
    assert [argv[-1] for argv in completions] == [f"http://127.0.0.1:{r.port}/v1/completions" for r in plan.replicas]
    for argv in completions:
        assert json.loads(argv[argv.index("-d") + 1]) == {"model": MODEL, "prompt": "ping", "max_tokens": 1}
    assert [s["--status"] for s in _signals(host)] == ["SUCCESS"]

    # Each replica: the export read-only, the export's engine arguments, nothing compiled.
    before = {f: f.stat().st_mtime_ns for f in final.rglob("*")}
    for replica in plan.replicas:
        result = host.run(RUN_REPLICA, str(replica.index))
        assert result.returncode == 0, result.stderr
    assert {f: f.stat().st_mtime_ns for f in final.rglob("*")} == before
    created = {c["name"]: c for c in host.containers()}
    for replica in plan.replicas:
        container = created[f"replica-{replica.index}"]
        config = container["HostConfig"]
        assert [d["PathOnHost"] for d in config["Devices"]] == list(replica.device_paths)
        assert config["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(replica.port)}]}
        assert config["Binds"] == [f"{final}:/models/{key}:ro"]
        # vLLM itself is PID 1, so that docker stop's SIGTERM reaches it (Nxdi.replica_entrypoint).
        assert container["Entrypoint"] == ["vllm"]
        assert container["Cmd"] == ["serve", f"/models/{key}", "--served-model-name", MODEL, "--port", "8080",
                                    "--disable-uvicorn-access-log", "--disable-fastapi-docs", *ENGINE_ARGS]
        env = dict(item.split("=", 1) for item in container["Env"])
        assert env["NEURON_COMPILED_ARTIFACTS"] == f"/models/{key}"
        assert env["NEURON_PROCESS_TAG"] == replica.name and "HF_TOKEN" not in env


def test_check_export_refuses_a_compile_of_other_shapes_which_the_plugin_would_load_and_a_replica_compiles_nothing(
    make_host: MakeHost,
) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    final = host.path(f"{EXPORTS}/{NXDI.export_key(plan, DLC_VLLM_0_13_0)}")
    saved = json.loads((final / "neuron_config.json").read_text())
    for field, value, said in [
        ("tp_degree", 4, "neuron_config.tp_degree 4, the plan 2"),
        ("batch_size", 8, "neuron_config.batch_size 8, the plan 4"),
        ("save_sharded_checkpoint", False, "neuron_config.save_sharded_checkpoint False, the plan True"),
    ]:
        (final / "neuron_config.json").write_text(json.dumps({**saved, "neuron_config": {
            **saved["neuron_config"], field: value}}))
        result = host.run(CHECK_EXPORT, str(final))
        assert result.returncode == 1 and said in result.stdout.splitlines()[-1], (field, result.stdout)
    (final / "neuron_config.json").write_text(json.dumps(saved))
    # A replica whose export lost its compile fails rather than compile into the read-only export.
    (final / "model.pt").unlink()
    result = host.run(RUN_REPLICA, "0")
    assert result.returncode != 0
    assert "Recompiling" in result.stdout and "Read-only file system" in result.stderr


def test_a_cached_export_is_served_by_every_host_without_compiling(make_host: MakeHost) -> None:
    plan = _plan()
    builder, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)
    upload = builder.path(f"{EXPORTS}/{key}")
    (upload / MARKER).unlink()
    host = make_host(plan.instance.devices)
    host.publish_tree(f"{CACHE}/{key}/i-0builder", upload)
    host.publish(f"{CACHE}/{key}/COMPLETE", complete_marker(f"exports/{key}/i-0builder", upload))
    spec = resolve_host(plan, engine="nxdi")
    result = host.boot(render_boot_script(plan, spec, BootOptions(signal=SIGNAL, artifact_cache=CACHE)),
                       STUB_SERVED_MODEL=MODEL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _exports(host) == []
    assert (host.path(f"{EXPORTS}/{key}") / MARKER).read_text().startswith("downloaded from s3://")
    for replica in plan.replicas:
        run = host.run(RUN_REPLICA, str(replica.index))
        assert run.returncode == 0 and "Successfully loaded pre-compiled model artifacts" in run.stdout, run.stderr


def test_the_image_without_nxdis_kernels_on_inf2_and_trn1_compiles_with_the_attention_kernel_off() -> None:
    plan = _plan()
    old, new = (NXDI.neuron_config(plan, image) for image in (DLC_VLLM_0_13_0, DLC_VLLM_0_16_0))
    assert old == {"save_sharded_checkpoint": True}
    assert new == {"save_sharded_checkpoint": True, "attn_kernel_enabled": False}


def test_the_fake_image_runs_only_what_the_entry_point_would_find() -> None:
    assert NxdiImage({}).run(["python3", "-c", "1"], [], 1, {})[0] == 127


def test_the_sdk_2_28_image_refuses_the_newest_dlamis_and_the_sdk_2_31_image_the_ubuntu_22_04_dlamis_older_driver(
) -> None:
    ubuntu_22, ubuntu_24 = (f"/aws/service/neuron/dlami/base/ubuntu-{v}/latest/image_id" for v in ("22.04", "24.04"))
    check_dlami_parameter(DLC_VLLM_0_13_0, ubuntu_22)
    check_dlami_parameter(DLC_VLLM_0_16_0, ubuntu_24)
    check_dlami_parameter(DLC_VLLM_0_16_0, "/my-org/golden-ami")
    with pytest.raises(ServingConfigError, match=r"rejects the Neuron runtime 2.30.51 in public.ecr.aws/neuron/"
                       r"pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04"):
        check_dlami_parameter(DLC_VLLM_0_13_0, ubuntu_24)
    with pytest.raises(ServingConfigError, match=r"^dlami_parameter \('/aws/service/neuron/dlami/base/ubuntu-22.04/"
                       r"latest/image_id'\) names a Neuron DLAMI whose driver \(aws-neuronx-dkms 2.27.4.0\) is older "
                       r"than the Neuron runtime 2.33.10 in .* runs on \(2.28 or newer\)"):
        check_dlami_parameter(DLC_VLLM_0_16_0, ubuntu_22)


@pytest.mark.parametrize(("image", "driver", "said"), [
    (DLC_VLLM_0_13_0, "2.29.0.0", "rejects the Neuron runtime 2.30.51"),
    (DLC_VLLM_0_13_0, "2.27.4.0", None),
    (DLC_VLLM_0_16_0, "2.27.4.0", "is older than the Neuron runtime 2.33.10 of"),
    (DLC_VLLM_0_16_0, "2.30.2.0", None),
])
def test_a_host_driver_the_images_runtime_cannot_use_stops_the_boot_before_the_pull(
    make_host: MakeHost, image: ServingImage, driver: str, said: str | None,
) -> None:
    plan = _plan()
    host = make_host(plan.instance.devices)
    result = host.boot(boot_of(plan, engine="nxdi", image=image.reference), STUB_NEURON_DRIVER=driver,
                       STUB_SERVED_MODEL=MODEL)
    if said is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode != 0 and f"(aws-neuronx-dkms {driver}) {said}" in result.stdout
        assert [a for a in host.calls("docker") if a[0] == "pull"] == []


@pytest.mark.parametrize(("model_id", "degree"), [("mistralai/Mistral-7B-Instruct-v0.2", 2), ("mixtral-8x7b", 8)])
def test_a_catalog_model_the_image_cannot_serve_stops_synth_naming_what_it_serves(model_id: str, degree: int) -> None:
    plan = make_plan("inf2.48xlarge", degree, model_id=model_id)
    with pytest.raises(ServingConfigError, match=r"^model_id \('.*'\) is a (mistral|mixtral) model, which "
                       r"neuronx-distributed-inference 0.8.16251 in public.ecr.aws/neuron/.* cannot export and "
                       r"serve; it does llama, qwen2, qwen3"):
        resolve_host(plan, engine="nxdi")


def _prefix_plan(**request: Any) -> ServingPlan:
    return plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2, prefix_cache_block_size=32,
                                       **request))


def test_with_a_prefix_cache_the_export_and_every_replica_page_the_kv_cache_in_the_same_blocks(
    make_host: MakeHost,
) -> None:
    plan = _prefix_plan()
    host = make_host(plan.instance.devices)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL), engine="nxdi"), STUB_SERVED_MODEL=MODEL)
    assert result.returncode == 0, result.stdout + result.stderr
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)
    assert key != NXDI.export_key(_plan(), DLC_VLLM_0_13_0)
    # ceil(4096 / 32) x 4 blocks: the batch at full length.
    kv_cache = ["--enable-prefix-caching", "--block-size", "32", "--num-gpu-blocks-override", "512"]
    [export] = _exports(host)
    assert export["Cmd"][export["Cmd"].index("--dtype") + 2:][:5] == kv_cache
    final = host.path(f"{EXPORTS}/{key}")
    saved = json.loads((final / "neuron_config.json").read_text())["neuron_config"]
    assert (saved["is_prefix_caching"], saved["pa_block_size"], saved["pa_num_blocks"]) == (True, 32, 513)
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    run = host.run(RUN_REPLICA, "0")
    assert run.returncode == 0, run.stderr
    [replica] = [c for c in host.containers() if c["name"] == "replica-0"]
    assert replica["Cmd"][replica["Cmd"].index("--dtype") + 2:][:5] == kv_cache


def test_a_prefix_cache_of_more_blocks_is_its_own_compile_and_costs_its_memory() -> None:
    least, more = _prefix_plan(), _prefix_plan(prefix_cache_blocks=2048)
    assert NXDI.export_key(least, DLC_VLLM_0_13_0) != NXDI.export_key(more, DLC_VLLM_0_13_0)
    assert least.request.kv_cache_tokens == (512 + 2) * 32
    assert more.memory.kv_cache == least.memory.kv_cache * (2048 + 2) // (512 + 2)
    with pytest.raises(ServingConfigError, match=r"^tensor_parallel \(2\) is too small for llama-3-8b"):
        _prefix_plan(prefix_cache_blocks=40_000)


def test_a_prefix_cache_too_small_for_the_batch_or_of_a_block_size_vllm_refuses_stops_synth() -> None:
    with pytest.raises(ServingConfigError, match=r"^prefix_cache_blocks \(511\) must be at least 512, "
                       r"ceil\(sequence_length / prefix_cache_block_size\) x batch_size"):
        _prefix_plan(prefix_cache_blocks=511)
    with pytest.raises(ServingConfigError, match=r"^prefix_cache_block_size \(24\) must be one of 8, 16, 32, 64, "
                       r"128, 256 \(vLLM's --block-size\)"):
        resolve_host(plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2,
                                                 prefix_cache_block_size=24)), engine="nxdi")
    with pytest.raises(ServingConfigError, match=r"^sequence_length \(256\) must be at least 512 with prefix_caching"):
        resolve_host(_prefix_plan(sequence_length=256), engine="nxdi")


@pytest.mark.parametrize(("model_id", "asked", "parser"), [
    ("NousResearch/Meta-Llama-3-8B-Instruct", None, None),  # Llama 3.0: no tool calls in its chat template
    ("llama-3.1-8b", None, "llama3_json"),
    ("llama-3.2-1b", None, "llama3_json"),
    ("qwen2.5-7b", None, "hermes"),
    ("llama-3.1-8b", "none", None),
    ("NousResearch/Meta-Llama-3-8B-Instruct", "pythonic", "pythonic"),
])
def test_each_replica_reads_tool_calls_with_the_models_parser_unless_told(
    model_id: str, asked: str | None, parser: str | None,
) -> None:
    plan = plan_serving(ServingRequest(model_id, "inf2.24xlarge", tensor_parallel=2, tool_call_parser=asked))
    resolve_host(plan, engine="nxdi")
    command = NXDI.replica_command(plan, DLC_VLLM_0_13_0, "/models/key")
    flags = ["--enable-auto-tool-choice", "--tool-call-parser", parser] if parser else []
    assert [w for w in command if w in ("--enable-auto-tool-choice", "--tool-call-parser")] == flags[:2]
    if parser:
        assert command[command.index("--tool-call-parser") + 1] == parser
    # Serving only: the export, and so its key, is the same whatever reads the tool calls.
    export = NXDI.export_arguments(plan, DLC_VLLM_0_13_0, "/s", "/o")
    assert "--tool-call-parser" not in export and "--enable-auto-tool-choice" not in export


def test_a_tool_call_parser_vllm_does_not_register_stops_synth_naming_the_ones_it_does() -> None:
    plan = plan_serving(ServingRequest("llama-3.1-8b", "inf2.24xlarge", tensor_parallel=2,
                                       tool_call_parser="llama3"))
    with pytest.raises(ServingConfigError, match=r"^tool_call_parser \('llama3'\) must be none or one of vLLM "
                       r"0.13.0's parsers: deepseek_v3, .*llama3_json, "):
        resolve_host(plan, engine="nxdi")


def _quantized_plan(**request: Any) -> ServingPlan:
    return plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2, quantization="int8", **request))


def test_int8_weights_are_quantized_by_the_export_and_every_replica_loads_them_from_its_shards(
    make_host: MakeHost,
) -> None:
    plan = _quantized_plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)
    assert "-bf16-int8-" in key and key != NXDI.export_key(_plan(), DLC_VLLM_0_13_0)
    [export] = _exports(host)
    override = json.loads(export["Cmd"][export["Cmd"].index("--additional-config") + 1])["override_neuron_config"]
    assert override == {"save_sharded_checkpoint": True, "quantized": True,
                        "quantized_checkpoints_path": QUANTIZED_CHECKPOINT,
                        "quantization_type": "per_channel_symmetric", "quantization_dtype": "int8"}
    final = host.path(f"{EXPORTS}/{key}")
    saved = json.loads((final / "neuron_config.json").read_text())
    assert [saved["neuron_config"][k] for k in ("quantized", "quantization_type", "quantization_dtype")] == [
        True, "per_channel_symmetric", "int8"]
    # The quantized checkpoint stayed in the export's container; the export holds the quantized shards.
    assert not [f for f in final.rglob("*") if "quantized" in f.name]
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    run = host.run(RUN_REPLICA, "0")
    assert run.returncode == 0 and "Successfully loaded pre-compiled model artifacts" in run.stdout, run.stderr
    # A compile of unquantized weights is not this plan's, though the plugin would load it as it is.
    saved["neuron_config"]["quantized"] = False
    (final / "neuron_config.json").write_text(json.dumps(saved))
    result = host.run(CHECK_EXPORT, str(final))
    assert result.returncode == 1 and "neuron_config.quantized False, the plan True" in result.stdout


def test_int8_weights_take_about_half_the_device_memory_so_a_larger_model_fits_more_replicas() -> None:
    plain, quantized = _plan(), _quantized_plan()
    model = plain.model
    # The linear layers in one byte with a float32 scale per output channel; embeddings and norms in bf16.
    assert quantized.memory.weights == ((model.parameter_count - model.linear_parameter_count) * 2
                                        + model.linear_parameter_count + model.linear_output_channels * 4) // 2
    assert 0.5 < quantized.memory.weights / plain.memory.weights < 0.55
    big = [plan_serving(ServingRequest("llama-3.1-70b", "inf2.48xlarge", quantization=q)) for q in (None, "int8")]
    assert [(p.degree, len(p.replicas)) for p in big] == [(12, 2), (6, 4)]


@pytest.mark.parametrize(("engine", "quantization", "said"), [
    ("nxdi", "f8e4m3", r"^quantization \('f8e4m3'\) must be none or one of int8$"),
    ("tgi", "int8", r"^quantization \('int8'\) is not made by engine tgi, which serves the weights in dtype$"),
    ("vllm", "int8", r"^quantization \('int8'\) is not made by engine vllm"),
])
def test_a_quantization_the_engine_does_not_make_stops_synth(engine: str, quantization: str, said: str) -> None:
    with pytest.raises(ServingConfigError, match=said):
        resolve_host(plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2,
                                                 quantization=quantization)), engine=engine)


DRAFT = "yuhuili/EAGLE-LLaMA3-Instruct-8B"


def _speculating_plan(**request: Any) -> ServingPlan:
    return plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2, speculative_model=DRAFT,
                                       speculative_tokens=4, **request))


def test_an_eagle_draft_gets_the_models_lm_head_is_compiled_into_the_export_and_every_replica_reads_its_config(
    make_host: MakeHost,
) -> None:
    plan = _speculating_plan(speculative_model_revision="0123abcd")
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)
    assert "-bf16-eagle4-" in key and key != NXDI.export_key(_plan(), DLC_VLLM_0_13_0)
    # The draft's revision is part of the key, as the model's is.
    assert key != NXDI.export_key(_speculating_plan(), DLC_VLLM_0_13_0)
    # The draft's repository, downloaded beside the checkpoint (its README is not), then converted by the real
    # userdata/eagle-draft.py in the image's Python: its tensors and the model's LM head, in one file.
    [download] = [c for c in host.containers() if DRAFT in c.get("Cmd", [])]
    assert download["Cmd"][download["Cmd"].index("--local-dir") + 1] == f"/models/{key}.src/eagle-draft.download"
    assert download["Cmd"][download["Cmd"].index("--revision") + 1] == "0123abcd"
    [convert] = [c for c in host.containers() if c.get("Entrypoint") == ["python"]]
    # With the figures the planner counted, which the downloaded config must have.
    assert convert["Cmd"] == ["/opt/neuron-serving/bin/eagle-draft", f"/models/{key}.src",
                              f"/models/{key}.src/eagle-draft.download", f"/models/{key}.src/eagle-draft",
                              '{"hidden_size":4096,"num_hidden_layers":1,"vocab_size":128256}']
    log = host.path("/var/log/neuron-serving/export.log").read_text()
    [said] = [line for line in log.splitlines() if line.startswith("eagle-draft: ")]
    assert said.startswith("eagle-draft: 3 tensors of ") and ", with the LM head of " in said and "((2, 4))" in said
    [export] = _exports(host)
    speculation = json.loads(export["Cmd"][export["Cmd"].index("--speculative-config") + 1])
    assert speculation == {"method": "eagle", "model": f"/models/{key}.src/eagle-draft", "num_speculative_tokens": 4}
    final = host.path(f"{EXPORTS}/{key}")
    saved = json.loads((final / "neuron_config.json").read_text())["neuron_config"]
    assert [saved[k] for k in ("enable_fused_speculation", "enable_eagle_speculation", "speculation_length")] == [
        True, True, 4]
    # The export keeps the draft's config for the replicas, not its weights (they are in the compile's shards),
    # and the checkpoint with the draft is gone.
    assert sorted(p.name for p in (final / "eagle-draft").iterdir()) == ["config.json"]
    assert not host.path(f"{EXPORTS}/{key}.src").exists()
    run = host.run(RUN_REPLICA, "0")
    assert run.returncode == 0 and "Successfully loaded pre-compiled model artifacts" in run.stdout, run.stderr
    replica = {c["name"]: c for c in host.containers()}["replica-0"]
    speculation = json.loads(replica["Cmd"][replica["Cmd"].index("--speculative-config") + 1])
    assert speculation == {"method": "eagle", "model": f"/models/{key}/eagle-draft", "num_speculative_tokens": 4}
    # A replica whose export lacks the draft's config fails as the plugin does; check-export refuses the export.
    (final / "eagle-draft" / "config.json").unlink()
    run = host.run(RUN_REPLICA, "0")
    assert run.returncode != 0 and f"Cannot load draft model config from '/models/{key}/eagle-draft'" in (
        run.stdout + run.stderr)
    result = host.run(CHECK_EXPORT, str(final))
    assert result.returncode == 1 and "eagle-draft/config.json" in result.stdout


def test_a_draft_costs_its_weights_and_kv_cache_on_every_core() -> None:
    from neuron_serving.plan.models import EAGLE_DRAFTS, eagle_fc_parameter_count

    plain, speculating = _plan(), _speculating_plan()
    draft = EAGLE_DRAFTS[DRAFT.lower()]
    assert speculating.draft == draft and plain.draft is None
    # One layer of Llama 3 8B's shape with its embeddings, the LM head and fc, sharded as the model's.
    assert speculating.memory.weights - plain.memory.weights == (
        (draft.parameter_count + eagle_fc_parameter_count(draft)) * 2 // 2)
    assert speculating.memory.kv_cache - plain.memory.kv_cache == plain.memory.kv_cache // 32
    assert 1.1 < (speculating.memory.weights - plain.memory.weights) / 2**30 < 1.3


@pytest.mark.parametrize(("request_", "said"), [
    ({"speculative_model": "yuhuili/EAGLE-LLaMA3-Instruct-70B"},
     r"^speculative_model \('yuhuili/EAGLE-LLaMA3-Instruct-70B'\) has hidden_size 8192, but llama-3-8b has 4096: "),
    ({"speculative_model": "someone/eagle-draft"}, r"^speculative_model \('someone/eagle-draft'\) is not an EAGLE "
     r"draft the library knows the shape of; give speculative_model_config .* or use one of yuhuili/"),
    ({"speculative_model": DRAFT, "speculative_tokens": 11}, r"^speculative_tokens \(11\) must be an integer from 2 "
     r"to 10$"),
    ({"speculative_model": DRAFT, "speculative_tokens": 1}, r"^speculative_tokens \(1\) must be an integer from 2 "),
    ({"speculative_model": DRAFT, "quantization": "int8"}, r"^quantization \('int8'\) cannot be served with "
     r"speculative_model: the vllm-neuron plugin compiles the draft with the model's quantization"),
    ({"speculative_model_config": "/x/config.json"}, r"^speculative_model_config \('/x/config.json'\) applies only "
     r"with speculative_model$"),
])
def test_a_draft_the_model_cannot_use_stops_synth_naming_the_setting(request_: dict[str, Any], said: str) -> None:
    with pytest.raises(ServingConfigError, match=said):
        resolve_host(plan_serving(ServingRequest(MODEL, "inf2.24xlarge", tensor_parallel=2, **request_)),
                     engine="nxdi")


@pytest.mark.parametrize("engine", ["tgi", "vllm"])
def test_speculative_decoding_by_another_engine_stops_synth(engine: str) -> None:
    with pytest.raises(ServingConfigError, match=rf"^speculative_model \('{DRAFT}'\) asks for speculative decoding, "
                       rf"which engine {engine} does not serve$"):
        resolve_host(_speculating_plan(), engine=engine)


def test_an_eagle_3_draft_or_a_draft_with_a_prefix_cache_stops_synth(tmp_path) -> None:
    config = tmp_path / "config.json"
    # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's kind: its own architecture and a draft vocabulary.
    config.write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                                  "hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32,
                                  "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                                  "draft_vocab_size": 32000, "max_position_embeddings": 2048}))
    with pytest.raises(ServingConfigError, match=r"^speculative_model_config \('.*config.json'\) is an EAGLE 3 "
                       r"draft's \(draft_vocab_size or an Eagle3 architecture\), which the image's vllm-neuron plugin"):
        _speculating_plan(speculative_model_config=str(config))
    with pytest.raises(ServingConfigError, match=r"^speculative_model \('yuhuili/EAGLE-LLaMA3-Instruct-8B'\) cannot "
                       r"be served with a prefix cache: .*; set prefix_caching=false$"):
        resolve_host(_speculating_plan(prefix_cache_block_size=32), engine="nxdi")
