"""The vLLM engine's boot on a simulated host: one export, made with optimum-neuron 0.4.5's
arguments; one server per replica on its own devices, configured through the image's entry
point; readiness only after a one-token completion through each."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bootsim import CACHE, EXPORTS, MARKER, Host, complete_marker, make_plan, require
from inside import DTYPES, TGI_NEURONXCC, VLLM_NEURONXCC, VllmImage, vllm_export_files

from neuron_serving.plan import ServingPlan
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5, VLLM
from neuron_serving.plan.host import resolve_host
from neuron_serving.render.boot import CHECK_EXPORT, RUN_REPLICA, render_boot_script
from neuron_serving.render.boot_options import BootOptions, ReadinessSignal
from tests.harness.test_optimum_neuron import TINY_LLAMA, TINY_TOKENIZER
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
SIGNAL = ReadinessSignal(stack_name="NeuronLlamaStack", logical_id="Host")


def _plan() -> ServingPlan:
    return make_plan("inf2.24xlarge", 2, model_id=MODEL)


def _boot(make_host: MakeHost, plan: ServingPlan, **knobs: str) -> tuple[Host, str]:
    host = make_host(plan.instance.devices)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL), engine="vllm"), **knobs)
    return host, result.stdout + result.stderr if result.returncode else ""


def _signals(host: Host) -> list[dict[str, str]]:
    return [dict(zip(a[2::2], a[3::2], strict=True)) for a in host.aws("cloudformation", "signal-resource")]


def test_the_model_is_exported_once_with_the_degree_as_tensor_parallel_size_on_one_replicas_devices(
    make_host: MakeHost,
) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    [argv] = host.exports()
    words = argv[argv.index(OPTIMUM_NEURON_VLLM_0_4_5.reference) + 1:]
    key = VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    assert words == ["export", "neuron", "--model", f"/models/{key}.src", "--task", "text-generation",
                     "--batch_size", "4", "--sequence_length", "4096", "--tensor_parallel_size", "2",
                     f"/models/{key}.tmp"]
    [export] = [c for c in host.containers() if c["Entrypoint"] == ["optimum-cli"]]
    assert [d["PathOnHost"] for d in export["HostConfig"]["Devices"]] == ["/dev/neuron0"]
    final = host.path(f"{EXPORTS}/{key}")
    assert (final / MARKER).is_file() and host.run(CHECK_EXPORT, str(final)).returncode == 0
    config = json.loads((final / "neuron_config.json").read_text())
    assert (config["tp_degree"], config["target"], config["continuous_batching"]) == (2, "trn1", True)


def test_each_server_gets_its_own_devices_its_port_and_serves_the_export_through_the_entry_point(
    make_host: MakeHost,
) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    for replica in plan.replicas:
        result = host.run(RUN_REPLICA, str(replica.index))
        assert result.returncode == 0, result.stderr
    created = {c["name"]: c for c in host.containers()}
    key = VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    for replica in plan.replicas:
        container = created[f"replica-{replica.index}"]
        config = container["HostConfig"]
        assert [d["PathOnHost"] for d in config["Devices"]] == list(replica.device_paths)
        assert config["PortBindings"] == {"8080/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(replica.port)}]}
        assert config["Binds"] == [f"{host.path(EXPORTS)}/{key}:/models/{key}:ro"]
        assert not config.get("Privileged")
        assert container.get("Cmd") in (None, []) and container.get("Entrypoint") in (None, [])
        env = dict(item.split("=", 1) for item in container["Env"])
        assert env["NEURON_PROCESS_TAG"] == replica.name and "HF_TOKEN" not in env
        argv = VllmImage.entry_point([], env)
        assert argv[:5] == ["optimum-cli", "neuron", "serve", "--port", "8080"]
        assert dict(zip(argv[5::2][:5], argv[6::2][:5], strict=True)) == {
            "--model": f"/models/{key}", "--served_model_name": MODEL, "--tensor_parallel_size": "2",
            "--batch_size": "4", "--sequence_length": "4096"}


def test_ready_is_signalled_only_after_a_one_token_completion_of_the_served_model_through_each_server(
    make_host: MakeHost,
) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL, STUB_READY_AFTER="1")
    assert failure == ""
    probes = [argv for argv in host.calls("curl") if argv[-1].startswith("http://127.0.0.1:")]
    completions = [argv for argv in probes if argv[-1].endswith("/v1/completions")]
    assert [argv[-1] for argv in completions] == [f"http://127.0.0.1:{r.port}/v1/completions" for r in plan.replicas]
    for argv in completions:
        assert json.loads(argv[argv.index("-d") + 1]) == {"model": MODEL, "prompt": "ping", "max_tokens": 1}
    assert probes[-1][-1] == f"http://127.0.0.1:{plan.router_port}/health"
    assert [s["--status"] for s in _signals(host)] == ["SUCCESS"]


def test_a_server_that_does_not_know_the_served_name_fails_the_boot_naming_the_replica(make_host: MakeHost) -> None:
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL="some/other-model", NEURON_SERVING_READY_SECONDS="1")
    assert "replica-0 not ready" in failure
    [signal] = _signals(host)
    assert signal["--status"] == "FAILURE" and "replica-0 not ready" in signal["--unique-id"]


def test_the_server_refuses_an_export_made_for_another_degree(make_host: MakeHost) -> None:
    # optimum-cli neuron serve checks the export against its arguments before vLLM starts.
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    key = VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    config_path = host.path(f"{EXPORTS}/{key}/neuron_config.json")
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "tp_degree": 4}))
    result = host.run(RUN_REPLICA, "0")
    assert result.returncode != 0
    assert "tensor_parallel_size 2 differs from the export's 4" in result.stderr


def _write_export(directory: Path, plan: ServingPlan, **recorded: object) -> None:
    """Write into ``directory`` what the vLLM image's export for ``plan`` holds (tests/boot/inside.py), with
    ``recorded`` changed in its ``neuron_config.json``."""
    argv = ["--batch_size", str(plan.batch_size), "--sequence_length", str(plan.sequence_length)]
    for name, text in vllm_export_files(argv, plan.degree, DTYPES[plan.dtype]).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    config = directory / "neuron_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **recorded}))


def test_the_host_accepts_and_serves_the_export_its_image_compiled_with_the_compilers_local_label(
    make_host: MakeHost,
) -> None:
    # Issue 22, defect 1: the export records neuronxcc.__version__, which carries the Neuron pip
    # repository's local label, and check-export wanted the bare release: every host refused its own export.
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    final = host.path(f"{EXPORTS}/{VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)}")
    assert json.loads((final / "neuron_config.json").read_text())["neuronxcc_version"] == "2.21.33363.0+82129205"
    assert (final / MARKER).read_text().startswith("exported at ")
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    for replica in plan.replicas:
        result = host.run(RUN_REPLICA, str(replica.index))
        assert result.returncode == 0, result.stderr
    assert [s["--status"] for s in _signals(host)] == ["SUCCESS"]


@pytest.mark.parametrize("source", ["prebuilt", "artifact cache"])
def test_a_prebuilt_or_cached_export_of_the_images_compiler_is_served_without_compiling(
    make_host: MakeHost, source: str,
) -> None:
    plan = _plan()
    host = make_host(plan.instance.devices)
    key = VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    if source == "prebuilt":
        prebuilt = host.staging("llama-neuron")
        _write_export(prebuilt, plan)
        host.publish_tree("s3://models/llama-neuron", prebuilt)
        spec, options = resolve_host(plan, engine="vllm", prebuilt_export="s3://models/llama-neuron"), BootOptions(
            signal=SIGNAL)
    else:
        upload = host.staging("i-0builder")
        _write_export(upload, plan)
        host.publish_tree(f"{CACHE}/{key}/i-0builder", upload)
        host.publish(f"{CACHE}/{key}/COMPLETE", complete_marker(f"exports/{key}/i-0builder", upload))
        spec, options = resolve_host(plan, engine="vllm"), BootOptions(signal=SIGNAL, artifact_cache=CACHE)
    result = host.boot(render_boot_script(plan, spec, options), STUB_SERVED_MODEL=MODEL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert host.exports() == []
    final = host.path(f"{EXPORTS}/{key}")
    assert json.loads((final / "neuron_config.json").read_text())["neuronxcc_version"] == VLLM_NEURONXCC
    assert (final / MARKER).read_text().startswith("downloaded from s3://")
    assert [s["--status"] for s in _signals(host)] == ["SUCCESS"]


def test_a_prebuilt_export_of_another_compiler_release_is_refused_naming_both_versions(make_host: MakeHost) -> None:
    # Compiled by TGI 3.3.5's image: neuronx-cc 2.19, which optimum-neuron 0.4.5's serve refuses to load.
    plan = _plan()
    host = make_host(plan.instance.devices)
    prebuilt = host.staging("llama-neuron")
    _write_export(prebuilt, plan, neuronxcc_version=TGI_NEURONXCC)
    host.publish_tree("s3://models/llama-neuron", prebuilt)
    spec = resolve_host(plan, engine="vllm", prebuilt_export="s3://models/llama-neuron")
    result = host.boot(render_boot_script(plan, spec, BootOptions(signal=SIGNAL)), STUB_SERVED_MODEL=MODEL)
    assert result.returncode != 0
    assert ("neuron_config.json has neuronxcc_version '2.19.8089.0+8ab9f450', the plan '2.21.33363.0+82129205'"
            in result.stdout + result.stderr)
    assert not host.path(f"{EXPORTS}/{VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)}/{MARKER}").exists()
    assert [s["--status"] for s in _signals(host)] == ["FAILURE"]


def test_the_check_leaves_the_compilers_local_label_to_serve_which_refuses_another(make_host: MakeHost) -> None:
    # check-export compares the release only, as the label is known from optimum-neuron's tests rather
    # than read from the image; serve, at load, requires the whole string (NeuronConfig.from_dict).
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    final = host.path(f"{EXPORTS}/{VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)}")
    config = json.loads((final / "neuron_config.json").read_text())
    (final / "neuron_config.json").write_text(json.dumps({**config, "neuronxcc_version": "2.21.33363.0+0badbeef"}))
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0
    result = host.run(RUN_REPLICA, "0")
    assert result.returncode != 0
    assert "exported using version 2.21.33363.0+0badbeef of the neuronxcc compiler" in result.stderr


ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "harness" / "optimum_neuron_045.py"


def _optimum_neuron_045(argv: list[str], devices: int, instance: str, env: dict[str, str],
                        tmp_path: Path) -> dict[str, Any]:
    """``argv`` (a container's optimum-cli words) through optimum-neuron 0.4.5 and vLLM 0.11.0's own code."""
    python = require(ROOT / ".tools" / "optimum-neuron-0.4.5" / "bin" / "python", "scripts/test makes it")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_RT_", "VLLM_"))}
    done = subprocess.run([str(python), str(RUNNER), "--devices", str(devices), "--instance", instance,
                           "--env", json.dumps(env), "--json", json.dumps(argv)],
                          capture_output=True, text=True, check=False, timeout=600,
                          env={**clean, "HF_HOME": str(tmp_path / "hf-home"), "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    assert result["exit_code"] == 0, (result.get("error"), done.stderr[-3000:])
    return result


def test_the_export_and_serve_words_the_boot_issues_reach_optimum_neuron_045_and_vllm_as_the_plan(
    make_host: MakeHost, tmp_path: Path,
) -> None:
    # The words the boot script really gave docker, through the real optimum-cli of the image's
    # optimum-neuron (tests/harness/optimum_neuron_045.py): the export on a tiny llama checkpoint,
    # then each server's entry point words on that export, through serve's checks and vLLM's parser.
    plan = _plan()
    host, failure = _boot(make_host, plan, STUB_SERVED_MODEL=MODEL)
    assert failure == ""
    assert host.run(RUN_REPLICA, "0").returncode == 0
    key = VLLM.export_key(plan, OPTIMUM_NEURON_VLLM_0_4_5)
    models = tmp_path / "models"
    (models / f"{key}.src").mkdir(parents=True)
    (models / f"{key}.src" / "config.json").write_text(json.dumps(TINY_LLAMA))
    (models / f"{key}.src" / "tokenizer.json").write_text(json.dumps(TINY_TOKENIZER))
    (models / f"{key}.src" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast"}))

    [export] = [c for c in host.containers() if c["Entrypoint"] == ["optimum-cli"]]
    words = [w.replace("/models/", f"{models}/") for w in export["Entrypoint"] + export["Cmd"]]
    env = dict(item.split("=", 1) for item in export["Env"])
    exported = _optimum_neuron_045(words, len(export["HostConfig"]["Devices"]), plan.instance.name, env, tmp_path)
    compiled = exported["compile"]["neuron_config"]
    expected = VLLM.export_expectations(plan, OPTIMUM_NEURON_VLLM_0_4_5)["fields"]
    assert {k: compiled[k] for k in expected} == expected  # what check-export requires is what 0.4.5 writes
    written = json.loads((models / f"{key}.tmp" / "neuron_config.json").read_text())
    assert {k: written[k] for k in expected} == expected
    assert exported["shard_checkpoint"].endswith("checkpoint")  # weights sharded into the export
    # The compiled model and the tokenizer land where check-export looks for them.
    files = VLLM.export_expectations(plan, OPTIMUM_NEURON_VLLM_0_4_5)["files"]
    assert exported["jit_save"] == str(models / f"{key}.tmp" / "model.pt")
    assert {"config.json", "neuron_config.json", "tokenizer_config.json"} <= set(exported["output_files"])
    assert {"config.json", "neuron_config.json", "model.pt", "tokenizer_config.json"} <= set(files)

    (models / f"{key}.tmp").rename(models / key)
    [server] = [c for c in host.containers() if c["name"] == "replica-0"]
    env = dict(item.split("=", 1) for item in server["Env"])
    words = [w.replace("/models/", f"{models}/") for w in VllmImage.entry_point([], env)]
    served = _optimum_neuron_045(words, len(server["HostConfig"]["Devices"]), plan.instance.name,
                                 {k: v for k, v in env.items() if not k.startswith("SM_ON_")}, tmp_path)
    assert served["run_server"] == {
        "model": str(models / key), "served_model_name": [MODEL], "task": "generate",
        "tensor_parallel_size": plan.degree, "max_num_seqs": plan.batch_size, "max_model_len": plan.sequence_length,
        "port": VLLM.container_port, "host": None, "dtype": "bfloat16", "disable_uvicorn_access_log": True,
        "disable_fastapi_docs": True, "model_loader_extra_config": {},
    }
    assert served["engine_config"]["platform"] == "OptimumNeuronPlatform"
    assert (served["engine_config"]["tensor_parallel_size"], served["engine_config"]["max_num_seqs"]) == (2, 4)

