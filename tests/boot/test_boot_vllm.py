"""The vLLM engine's boot on a simulated host: one export, made with optimum-neuron 0.4.5's
arguments; one server per replica on its own devices, configured through the image's entry
point; readiness only after a one-token completion through each."""

from __future__ import annotations

import json
from collections.abc import Callable

from bootsim import EXPORTS, MARKER, Host, make_plan
from inside import VllmImage

from neuron_serving.plan import ServingPlan
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5, VLLM
from neuron_serving.render.boot import CHECK_EXPORT, RUN_REPLICA, BootOptions, ReadinessSignal, render_boot_script

MakeHost = Callable[..., Host]
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
SIGNAL = ReadinessSignal(stack_name="NeuronLlamaStack", logical_id="Host")


def _plan() -> ServingPlan:
    return make_plan("inf2.24xlarge", 2, model_id=MODEL)


def _boot(make_host: MakeHost, plan: ServingPlan, **knobs: str) -> tuple[Host, str]:
    host = make_host(plan.instance.devices)
    result = host.boot(render_boot_script(plan, BootOptions(engine="vllm", signal=SIGNAL)), **knobs)
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
