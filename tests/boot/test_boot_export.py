"""What the export step downloads, what reaches the compiler, what an export must hold before a
host serves it, and what the replicas are given: the defects issue 8 found, each run on a
simulated host. The real tools' side of each (optimum-neuron 0.3.0's parser, huggingface-cli
against a Hub on loopback) is in tests/harness."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import (
    CACHE,
    EXPORTS,
    FAKE_HF_TOKEN,
    HOOK,
    MARKER,
    SIGNAL,
    SMALL_MODEL,
    Host,
    complete_marker,
    make_plan,
    require,
    write_export,
)
from inside import CHECKPOINT

from neuron_serving.plan import ServingConfigError, ServingPlan
from neuron_serving.plan.engines import CHECKPOINT_EXCLUDED, CHECKPOINT_FILES, ENGINES, check_dlami_parameter
from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.host import resolve_host
from neuron_serving.render.boot import CHECK_EXPORT, RUN_REPLICA, render_boot_script
from neuron_serving.render.boot_options import BootOptions
from tests.harness.fake_hub import RESET, FakeHub, HubRepo
from tests.harness.test_optimum_neuron import TINY_LLAMA
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
ROOT = Path(__file__).resolve().parents[2]



def small_plan() -> ServingPlan:
    return make_plan("inf2.xlarge", model_id=SMALL_MODEL)


def export_dir(host: Host, plan: ServingPlan) -> str:
    return str(host.path(f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}"))


def hub_downloads(host: Host) -> list[list[str]]:
    return [a for a in host.calls("docker") if a[0] == "run" and "huggingface-cli" in a]


def test_the_checkpoint_is_downloaded_without_metas_original_weights_before_the_export(make_host: MakeHost) -> None:
    # Defects 2 and 5: the export compiled from a Hub id (no weights in it), and a pinned
    # revision downloaded the whole repository, original/*.pth included.
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan), STUB_EXPORT_FAIL="1")  # keeps the download
    assert result.returncode != 0
    [download] = hub_downloads(host)
    words = download[download.index(TGI_3_3_5.reference) + 1:]
    key = TGI.export_key(plan, TGI_3_3_5)
    # 16 files at once, not the client's 8 (neuron_serving.plan.transfer).
    assert words[:6] == ["download", "--max-workers", "16", plan.model_id, "--local-dir", f"/models/{key}.src"]
    assert words[words.index("--include") + 1:words.index("--exclude")] == list(CHECKPOINT_FILES)
    assert words[words.index("--exclude") + 1:] == list(CHECKPOINT_EXCLUDED)
    source = host.path(f"{EXPORTS}/{key}.src")
    assert sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file()) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json"]
    [export] = host.exports()
    assert export[export.index("--model") + 1] == f"/models/{key}.src"


def test_an_export_holds_the_weights_and_the_checkpoint_is_not_kept(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    assert host.boot(boot_of(plan)).returncode == 0
    final = host.path(f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}")
    assert sorted(p.name for p in (final / "checkpoint" / "weights").iterdir()) == [
        f"tp{rank}_sharded_checkpoint.safetensors" for rank in range(4)]
    assert json.loads((final / "neuron_config.json").read_text())["checkpoint_id"] is None
    assert not final.with_name(final.name + ".src").exists()


def test_replicas_serve_the_local_export_offline_without_the_token(make_host: MakeHost) -> None:
    # Defect 8: every replica was given the Hugging Face token.
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    assert host.boot(boot_of(plan, BootOptions(hf_token_secret="hf"))).returncode == 0
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
        env = dict(line.split("=", 1) for line in
                   host.path(f"/etc/neuron-serving/replica-{replica.index}.env").read_text().splitlines())
        assert env["HF_HUB_OFFLINE"] == "1" and env["USAGE_STATS"] == "off"
        assert "HF_TOKEN" not in env
    replicas = [a for a in host.calls("docker") if a[0] == "run" and "--name" in a]
    assert len(replicas) == len(plan.replicas)
    token_file = str(host.path("/etc/neuron-serving/hf-token.env"))
    assert all(token_file not in argv for argv in replicas)
    assert FAKE_HF_TOKEN not in host.calls_log.read_text()


@pytest.mark.parametrize(("degree", "weights", "problem"), [
    (8, True, "neuron_config.json has tp_degree 8, the plan 2"),
    (2, False, "lacks checkpoint/weights/tp0_sharded_checkpoint.safetensors"),
])
def test_a_prebuilt_export_that_does_not_match_the_plan_is_never_served(
    make_host: MakeHost, degree: int, weights: bool, problem: str,
) -> None:
    plan = small_plan()
    host = make_host(1)
    prebuilt = host.staging("export")
    write_export(prebuilt, plan, degree=degree, weights=weights)
    host.publish_tree("s3://models/export", prebuilt)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL), prebuilt_export="s3://models/export"))
    assert result.returncode != 0
    assert problem in result.stdout
    assert not host.path(f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}/{MARKER}").exists()
    assert host.started_units() == ["docker"]


def test_a_cached_artifact_that_does_not_match_the_plan_is_not_served_and_the_host_exports(
    make_host: MakeHost,
) -> None:
    plan = small_plan()
    host = make_host(1)
    key = TGI.export_key(plan, TGI_3_3_5)
    bad = host.staging("bad")
    write_export(bad, plan, degree=plan.degree, weights=False)
    # Published as it is (the manifest matches), but no export of this plan.
    host.publish_tree(f"{CACHE}/{key}/i-0badbadbadbadbad0", bad)
    host.publish(f"{CACHE}/{key}/COMPLETE", complete_marker(f"exports/{key}/i-0badbadbadbadbad0", bad))
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert len(host.exports()) == 1
    assert host.run(CHECK_EXPORT, export_dir(host, plan)).returncode == 0
    log = host.path("/var/log/neuron-serving/export.log").read_text()
    assert "is not an export of this plan; exporting here" in log


def test_a_complete_export_on_disk_that_no_longer_passes_the_check_is_redone(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    final = host.path(f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}")
    write_export(final, plan, weights=False)
    (final / MARKER).write_text("exported by an earlier script\n")
    assert host.boot(boot_of(plan)).returncode == 0
    assert len(host.exports()) == 1
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0


def test_artifacts_under_keys_of_earlier_formats_are_never_used(make_host: MakeHost) -> None:
    # Today's keys start with v4-<engine>-: artifacts published by earlier scripts (v1: compiled
    # for every core, without weights; v2: keys that did not name the engine; v3: a COMPLETE
    # without a manifest) stay where they are, unread.
    plan = small_plan()
    key = TGI.export_key(plan, TGI_3_3_5)
    assert key.startswith("v4-tgi-")
    host = make_host(1)
    unversioned = key.removeprefix("v4-tgi-")
    for old in (unversioned, "v2-" + unversioned, "v3-tgi-" + unversioned):
        artifact = host.staging(old)
        write_export(artifact, plan, weights=old != unversioned)  # v1 exports lacked weights
        host.publish_tree(f"{CACHE}/{old}/i-0", artifact)
        host.publish(f"{CACHE}/{old}/COMPLETE", f"exports/{old}/i-0\n")
    assert host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE))).returncode == 0
    assert len(host.exports()) == 1
    assert [[w for w in a if w.startswith("s3://")] for a in host.aws("s3", "cp")] == [
        [f"s3://cache-bucket/exports/{key}/COMPLETE"]]


def test_the_check_names_every_field_of_the_plan_and_accepts_a_matching_export(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    assert host.boot(boot_of(plan)).returncode == 0
    final = host.path(f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}")
    config = json.loads((final / "neuron_config.json").read_text())
    config.update(batch_size=8, sequence_length=2048, torch_dtype="float16")
    (final / "neuron_config.json").write_text(json.dumps(config))
    result = host.run(CHECK_EXPORT, str(final))
    assert result.returncode == 1
    assert [line.split(" has ")[1] for line in result.stdout.splitlines()] == [
        "batch_size 8, the plan 4", "sequence_length 2048, the plan 4096", "torch_dtype 'float16', the plan 'bfloat16'"]


def test_heartbeats_keep_the_launch_lifecycle_action_alive_during_a_long_export(make_host: MakeHost) -> None:
    # Defect 7: nothing renewed the lifecycle action during a boot of hours.
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(small_plan(), options), STUB_LIFECYCLE_STATE="InService",
                       STUB_EXPORT_SECONDS="2.5", NEURON_SERVING_HEARTBEAT_SECONDS="1", STUB_SLEEP_MAX="1")
    assert result.returncode == 0, result.stdout
    actions = [a[1] for a in host.calls("aws") if a[0] == "autoscaling"]
    assert actions.count("record-lifecycle-action-heartbeat") >= 2
    assert actions[-1] == "complete-lifecycle-action"
    [beat, *_] = host.aws("autoscaling", "record-lifecycle-action-heartbeat")
    assert dict(zip(beat[2::2], beat[3::2], strict=True)) == {
        "--region": "us-east-2", "--instance-id": host.instance_id,
        "--auto-scaling-group-name": HOOK.group_name, "--lifecycle-hook-name": HOOK.hook_name}


def test_a_model_the_images_optimum_neuron_cannot_export_is_refused_at_synth_naming_model_id() -> None:
    # Defect 3: optimum-neuron 0.3.0 exports no mistral model.
    plan = make_plan("inf2.48xlarge", 8, model_id="mistralai/Mistral-7B-Instruct-v0.3")
    with pytest.raises(ServingConfigError, match=r"^model_id \('mistralai/Mistral-7B-Instruct-v0.3'\) is a mistral "
                       r"model, which optimum-neuron 0.3.0 in .* cannot export and serve; it does granite, llama, "
                       r"mixtral, "
                       r"phi3, qwen2, qwen3$"):
        boot_of(plan)


def test_an_image_whose_tools_are_unknown_is_refused_naming_image() -> None:
    with pytest.raises(ServingConfigError, match=r"^image \('example.com/tgi:latest'\) is not a TGI serving image"):
        boot_of(small_plan(), image="example.com/tgi:latest")


def test_a_dlami_parameter_that_tracks_the_newest_driver_is_refused_for_the_tgi_image() -> None:
    check_dlami_parameter(TGI_3_3_5, TGI_3_3_5.dlami_parameter)
    check_dlami_parameter(TGI_3_3_5, "/my-org/golden-ami")
    with pytest.raises(ServingConfigError, match=r"^dlami_parameter \('/aws/service/neuron/dlami/base/ubuntu-24.04/"
                       r"latest/image_id'\) names the newest Neuron DLAMI at each launch, whose driver \(2.29 or "
                       r"newer\) rejects the Neuron runtime 2.26.42"):
        check_dlami_parameter(TGI_3_3_5, "/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id")


@pytest.mark.parametrize(("driver", "boots"), [("2.27.4.0", True), ("2.28.0.0", True), ("2.29.0.0", False),
                                               ("2.31.7.0", False), ("none", True)])
def test_a_neuron_driver_that_rejects_the_images_runtime_stops_the_boot_before_the_pull(
    make_host: MakeHost, driver: str, boots: bool,
) -> None:
    host = make_host(1)
    result = host.boot(boot_of(small_plan()), STUB_NEURON_DRIVER=driver)
    assert (result.returncode == 0) is boots, result.stdout
    if not boots:
        assert f"the Neuron driver (aws-neuronx-dkms {driver}) rejects the Neuron runtime 2.26.42" in result.stdout
        assert [a for a in host.calls("docker") if a[0] == "pull"] == []


def test_the_engine_receives_each_replica_with_its_devices_loopback_port_read_only_export_and_no_token(
    make_host: MakeHost,
) -> None:
    # What the real docker CLI sends the (recording) engine, not what the script's argv says.
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    assert host.boot(boot_of(plan, BootOptions(hf_token_secret="hf"))).returncode == 0
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    created = {c["name"]: c for c in host.containers()}
    key = TGI.export_key(plan, TGI_3_3_5)
    for replica in plan.replicas:
        container = created[f"replica-{replica.index}"]
        config = container["HostConfig"]
        assert [d["PathOnHost"] for d in config["Devices"]] == list(replica.device_paths)
        assert config["PortBindings"] == {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(replica.port)}]}
        assert config["Binds"] == [f"{host.path(EXPORTS)}/{key}:/models/{key}:ro"]
        assert not config.get("Privileged") and not config.get("CapAdd")
        env = dict(item.split("=", 1) for item in container["Env"])
        assert env["MODEL_ID"] == f"/models/{key}" and env["HF_NUM_CORES"] == "4"
        assert "HF_TOKEN" not in env
    [download] = [c for c in host.containers() if c["Entrypoint"] == ["huggingface-cli"]]
    assert dict(item.split("=", 1) for item in download["Env"])["HF_TOKEN"] == FAKE_HF_TOKEN
    [export] = [c for c in host.containers() if c["Entrypoint"] == ["optimum-cli"]]
    assert [d["PathOnHost"] for d in export["HostConfig"]["Devices"]] == ["/dev/neuron0", "/dev/neuron1"]
    assert "HF_TOKEN=" not in " ".join(export["Env"])


def _tiny_checkpoint_mounted(argv: list[str], key: str, tmp_path: Path) -> Path:
    """A tiny llama checkpoint where the export of ``key`` reads it, and the docker argv's ``-v`` mount
    of the exports pointed at it (the runner has no mounts): the exports directory."""
    exports = tmp_path / "exports"
    (exports / f"{key}.src").mkdir(parents=True)
    (exports / f"{key}.src" / "config.json").write_text(json.dumps(TINY_LLAMA))
    mount = argv.index("-v") + 1
    argv[mount] = f"{exports}:{argv[mount].split(':')[1]}"
    return exports


def test_the_export_command_the_script_issues_reaches_optimum_neuron_030s_exporter_as_the_plan(
    make_host: MakeHost, tmp_path: Path,
) -> None:
    # The docker words the boot script really issued, run through optimum-neuron 0.3.0's own
    # parsers and routing (tests/harness/optimum_neuron.py) on a tiny llama checkpoint.
    runner_python = require(ROOT / ".tools" / "optimum-neuron-0.3.0" / "bin" / "python", "scripts/test makes it")
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    assert host.boot(boot_of(plan)).returncode == 0
    [argv] = host.exports()
    key = TGI.export_key(plan, TGI_3_3_5)
    exports = _tiny_checkpoint_mounted(argv, key, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_RT_"))}
    done = subprocess.run([str(runner_python), str(ROOT / "tests" / "harness" / "optimum_neuron.py"), "--docker-run",
                           "--json", json.dumps(argv)], capture_output=True, text=True, check=False, timeout=600,
                          env={**env, "HF_HOME": str(tmp_path / "hf-home")})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["exit_code"] == 0, result.get("stderr")
    exported = result["export"]
    assert (exported["tp_degree"], exported["batch_size"], exported["sequence_length"], exported["torch_dtype"]) == (
        4, 4, 4096, "bfloat16")
    assert exported["model_id"] == str(exports / f"{key}.src")  # the mount, seen from the host
    config = json.loads((exports / f"{key}.tmp" / "neuron_config.json").read_text())
    assert {k: config[k] for k in ("tp_degree", "batch_size", "sequence_length", "torch_dtype")} == {
        "tp_degree": 4, "batch_size": 4, "sequence_length": 4096, "torch_dtype": "bfloat16"}


# Each image's huggingface-hub, as its tools venv has it: 0.34.4 in the TGI image (requirements-hub.txt),
# which sets HF_HUB_ENABLE_HF_TRANSFER=1 (TGI v3.3.5 Dockerfile.neuron); 0.36.2 in the vLLM image
# (requirements-optimum-neuron-0.4.5.txt), which does not (optimum-neuron v0.4.5 docker/vllm/Dockerfile).
HUB_CLIS = {"tgi": (".tools/hub/bin/huggingface-cli", True),
            "vllm": (".tools/optimum-neuron-0.4.5/bin/huggingface-cli", False)}


@pytest.mark.parametrize("engine_name", HUB_CLIS)
def test_the_hub_download_the_script_issues_runs_in_the_real_huggingface_cli_at_the_pinned_revision(
    make_host: MakeHost, tmp_path: Path, engine_name: str,
) -> None:
    # The download words the boot script really issued, with the container's environment (the
    # token from --env-file), in the image's own huggingface-hub CLI against a gated Hub repository
    # on loopback that holds Meta's layout: only what the export needs arrives, at the pinned commit.
    path, hf_transfer = HUB_CLIS[engine_name]
    cli = Path(require(ROOT / path, "scripts/test makes it"))
    engine = ENGINES[engine_name]
    plan = small_plan()
    repo = HubRepo(plan.model_id, gated=True)
    pinned = repo.commit({name: text.encode() for name, text in CHECKPOINT.items()})
    repo.commit({**{name: text.encode() for name, text in CHECKPOINT.items()}, "config.json": b"{}"})
    with FakeHub([repo], tokens={FAKE_HF_TOKEN}) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home", hf_transfer=hf_transfer)
        spec = resolve_host(plan, engine=engine_name, model_revision=pinned)
        result = host.boot(render_boot_script(plan, spec, BootOptions(hf_token_secret="hf")))
        assert result.returncode == 0, host.path("/var/log/neuron-serving/export.log").read_text()
        assert sorted(hub.downloads()) == sorted(
            name for name in CHECKPOINT if not name.startswith("original/") and name != "LICENSE")
        files = [r for r in hub.requests if r.file is not None and r.server == "hub"]
        assert files and all(f"/resolve/{pinned}/" in r.path for r in files)
    final = host.path(f"{EXPORTS}/{engine.export_key(plan, engine.default_image, pinned)}")
    assert host.run(CHECK_EXPORT, str(final)).returncode == 0


def checkpoint_hub(model_id: str) -> FakeHub:
    """A Hub on loopback holding ``model_id`` as :data:`inside.CHECKPOINT`, for the TGI image's real client."""
    repo = HubRepo(model_id)
    repo.commit({name: text.encode() for name, text in CHECKPOINT.items()})
    return FakeHub([repo])


def retry_waits(host: Host) -> list[str]:
    """The seconds of each wait between download attempts (the sleep stub's calls of 10 s or more)."""
    return [a[0] for a in host.calls("sleep") if float(a[0]) >= 10]


def test_a_hub_that_fails_twice_then_answers_does_not_fail_the_boot(make_host: MakeHost, tmp_path: Path) -> None:
    # Defect 4 of issue 22: the Hub download got one try (the image pull five), so one reset
    # connection failed the stack.
    cli = Path(require(ROOT / HUB_CLIS["tgi"][0], "scripts/test makes it"))
    plan = small_plan()
    with checkpoint_hub(plan.model_id) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home")
        hub.fail(2)
        result = host.boot(boot_of(plan))
        requests = hub.requests
    assert result.returncode == 0, result.stdout
    assert [r.status for r in requests[:2]] == [RESET, RESET]
    assert len(hub_downloads(host)) == 3
    assert retry_waits(host) == ["10", "20"]
    assert "export-model: download failed (attempt 2 of 5); retrying in 20s" in result.stdout
    assert host.run(CHECK_EXPORT, export_dir(host, plan)).returncode == 0


def test_a_retried_hub_download_fetches_only_the_files_the_failed_one_lacked(
    make_host: MakeHost, tmp_path: Path,
) -> None:
    # A retry goes on from the failed try: the files that arrived stay in --local-dir, and
    # huggingface-cli skips them (tests/harness/test_fake_hub.py shows the client's side).
    cli = Path(require(ROOT / HUB_CLIS["tgi"][0], "scripts/test makes it"))
    plan = small_plan()
    broken = "model-00002-of-00002.safetensors"
    with checkpoint_hub(plan.model_id) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home")
        hub.fail(1, file=broken)
        result = host.boot(boot_of(plan))
        requests = hub.requests
    assert result.returncode == 0, result.stdout
    assert len(hub_downloads(host)) == 2
    sent = sorted(r.file for r in requests if r.method == "GET" and r.status == 200 and r.file is not None)
    assert sent == sorted(name for name in CHECKPOINT if not name.startswith("original/") and name != "LICENSE")


def test_a_hub_that_never_answers_fails_the_boot_naming_the_attempts(make_host: MakeHost, tmp_path: Path) -> None:
    cli = Path(require(ROOT / HUB_CLIS["tgi"][0], "scripts/test makes it"))
    plan = small_plan()
    with checkpoint_hub(plan.model_id) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home")
        hub.fail(100, status=500)
        result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)))
    assert result.returncode != 0
    assert len(hub_downloads(host)) == 5
    assert retry_waits(host) == ["10", "20", "40", "80"]
    assert f"export-model: could not download {plan.model_id} after 5 attempts" in result.stdout
    assert host.exports() == []
    log = host.path("/var/log/neuron-serving/export.log").read_text()
    assert "500 Server Error" in log


@pytest.mark.parametrize("engine_name", HUB_CLIS)
@pytest.mark.parametrize(("refusal", "status"), [("unknown token", 401), ("token not granted the gated repo", 403)])
def test_a_hub_that_refuses_the_token_fails_the_boot_at_once_naming_the_secret(
    make_host: MakeHost, tmp_path: Path, engine_name: str, refusal: str, status: int,
) -> None:
    # Issue 37, defect 9: a wrong or ungranted token was tried five times, then reported as a download
    # that failed. The Hub on loopback refuses it as huggingface.co does (tests/harness/fake_hub.py).
    cli = Path(require(ROOT / HUB_CLIS[engine_name][0], "scripts/test makes it"))
    plan = small_plan()
    secret = "neuron-serving/hf-token"
    repo = HubRepo(plan.model_id, gated=True, granted=frozenset({"hf_someone_else"}))
    repo.commit({name: text.encode() for name, text in CHECKPOINT.items()})
    known = {"hf_someone_else"} | ({FAKE_HF_TOKEN} if status == 403 else set())
    with FakeHub([repo], tokens=known) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home", hf_transfer=HUB_CLIS[engine_name][1])
        spec = resolve_host(plan, engine=engine_name)
        result = host.boot(render_boot_script(plan, spec, BootOptions(hf_token_secret=secret)))
        statuses = {r.status for r in hub.requests}
    assert result.returncode != 0
    assert status in statuses, refusal
    assert len(hub_downloads(host)) == 1
    assert retry_waits(host) == []
    assert "attempts" not in result.stdout
    [line] = [line for line in result.stdout.splitlines() if line.startswith("export-model: ")
              and "refused" in line]
    assert f"the Hub refused the token of hf_token_secret {secret}" in line
    assert f"HTTP {status}" in line and plan.model_id in line
    # The line a failed boot reports, in its signal and its phase tag.
    assert host.path("/var/log/neuron-serving/export.log").read_text().splitlines()[-1] == line


def test_a_gated_repo_without_a_token_fails_the_boot_at_once_asking_for_hf_token_secret(
    make_host: MakeHost, tmp_path: Path,
) -> None:
    cli = Path(require(ROOT / HUB_CLIS["tgi"][0], "scripts/test makes it"))
    plan = small_plan()
    repo = HubRepo(plan.model_id, gated=True)
    repo.commit({name: text.encode() for name, text in CHECKPOINT.items()})
    with FakeHub([repo]) as hub:
        host = make_host(1)
        host.inside.use_hub(hub, cli, tmp_path / "hf-home")
        result = host.boot(boot_of(plan))
        statuses = {r.status for r in hub.requests}
    assert result.returncode != 0
    assert 401 in statuses
    assert len(hub_downloads(host)) == 1
    assert f"export-model: the Hub refused {plan.model_id} without a token (HTTP 401)" in result.stdout
    assert "set hf_token_secret" in result.stdout


def test_a_prebuilt_export_whose_s3_download_fails_twice_is_downloaded_on_the_third_try(make_host: MakeHost) -> None:
    # aws s3 sync is retried like the Hub download; each try copies only what the last one lacked.
    plan = small_plan()
    host = make_host(1)
    prebuilt = host.staging("export")
    write_export(prebuilt, plan)
    host.publish_tree("s3://models/export", prebuilt)
    result = host.boot(boot_of(plan, prebuilt_export="s3://models/export"),
                       STUB_S3_SYNC_FAILURES="2")
    assert result.returncode == 0, result.stdout
    assert len(host.aws("s3", "sync")) == 3
    assert retry_waits(host) == ["10", "20"]
    assert host.run(CHECK_EXPORT, export_dir(host, plan)).returncode == 0


# --- the compile caches (issue 26) ------------------------------------------------------------------
# What the real docker CLI sends the recording engine for the export. That optimum-neuron then looks
# the graphs up in these caches, and compiles none that they hold, is run against its real cache
# proxies in tests/harness/test_compile_cache.py.

def _env(container: dict[str, object]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in container["Env"])  # type: ignore[attr-defined]


def _export_container(host: Host) -> dict[str, object]:
    [export] = [c for c in host.containers() if c["Entrypoint"] == ["optimum-cli"]]
    return export


def test_the_export_consults_the_public_hub_cache_and_the_s3_compile_cache_without_the_token(
    make_host: MakeHost,
) -> None:
    plan = small_plan()
    host = make_host(1)
    options = BootOptions(hf_token_secret="hf", compile_cache="s3://cache-bucket/compile-cache")
    assert host.boot(boot_of(plan, options)).returncode == 0
    export = _export_container(host)
    env = _env(export)
    assert env["CUSTOM_CACHE_REPO"] == "aws-neuron/optimum-neuron-cache"
    assert env["NEURON_COMPILE_CACHE_URL"] == "s3://cache-bucket/compile-cache"
    # Online, so that the proxy can be made; the public cache needs no token, so it gets none.
    assert "HF_HUB_OFFLINE" not in env and "HF_TOKEN" not in env
    # The instance role through the instance metadata, which allows one hop: the host's network.
    assert export["HostConfig"]["NetworkMode"] == "host"  # type: ignore[index]
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    for container in host.containers():
        if container["Entrypoint"] in (["optimum-cli"], ["huggingface-cli"]):
            continue
        # The replicas stay offline, on docker's network, without the token.
        assert _env(container)["HF_HUB_OFFLINE"] == "1" and "HF_TOKEN" not in _env(container)
        assert container["HostConfig"]["NetworkMode"] != "host"


def test_the_export_with_the_s3_compile_cache_is_given_the_hosts_region(make_host: MakeHost) -> None:
    # Without one, the compile cache's S3 client (boto3, in libneuronxla: not public) would sign for
    # us-east-1 at S3's global endpoint and lean on redirects for a bucket elsewhere (botocore
    # args.py _should_force_s3_global).
    plan = small_plan()
    host = make_host(1)
    assert host.boot(boot_of(plan, BootOptions(compile_cache="s3://cache-bucket/compile-cache"))).returncode == 0
    [region] = [line.split("=", 1)[1] for line in host.path("/etc/neuron-serving/host.env").read_text().splitlines()
                if line.startswith("REGION=")]
    assert region
    env = _env(_export_container(host))
    assert env["AWS_REGION"] == region
    assert env["AWS_DEFAULT_REGION"] == region


def test_a_private_hub_cache_is_read_with_the_token(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    boot = boot_of(plan, BootOptions(hf_token_secret="hf"), hub_cache="my-org/neuron-cache")
    assert host.boot(boot).returncode == 0
    env = _env(_export_container(host))
    assert env["CUSTOM_CACHE_REPO"] == "my-org/neuron-cache" and env["HF_TOKEN"] == FAKE_HF_TOKEN
    # Without the S3 compile cache, the export stays on docker's network.
    assert _export_container(host)["HostConfig"]["NetworkMode"] != "host"  # type: ignore[index]
    assert "NEURON_COMPILE_CACHE_URL" not in env


def test_without_a_hub_cache_the_export_runs_offline(make_host: MakeHost) -> None:
    # optimum-neuron 0.4.5 (the vLLM image) falls back to compiling every graph offline; 0.3.0 cannot
    # (test_compile_cache.py), which the host spec refuses.
    plan = small_plan()
    host = make_host(1)
    assert host.boot(boot_of(plan, BootOptions(hf_token_secret="hf"), engine="vllm", hub_cache=None)).returncode == 0
    env = _env(_export_container(host))
    assert env["HF_HUB_OFFLINE"] == "1" and "CUSTOM_CACHE_REPO" not in env and "HF_TOKEN" not in env


@pytest.mark.parametrize("role", ["wait", "prebuilt"])
def test_a_host_that_compiles_nothing_is_given_no_compile_cache(role: str) -> None:
    plan = small_plan()
    options = BootOptions(compile_cache="s3://cache-bucket/compile-cache",
                          artifact_cache="s3://cache-bucket/exports" if role == "wait" else None)
    spec = {"export_role": "wait"} if role == "wait" else {"prebuilt_export": "s3://prebuilt/llama"}
    boot = boot_of(plan, options, **spec)
    assert "NEURON_COMPILE_CACHE_URL" not in "".join(boot.files.values())
    assert "COMPILE_CACHE=" not in "".join(boot.files.values()) and "COMPILE_CACHE" not in boot.deploy_env


def test_the_export_the_script_issues_fetches_what_the_public_hub_cache_holds_and_compiles_nothing(
    make_host: MakeHost, tmp_path: Path,
) -> None:
    # The docker words the boot script really issued (online, CUSTOM_CACHE_REPO, the S3 compile cache, the host's
    # network), run through optimum-neuron 0.3.0's real export and Hub cache proxy (tests/harness/optimum_neuron.py
    # --compile-cache, over tests/harness/neuron_compile.py's imitated compiler) against a Hub on loopback whose
    # public cache repo holds both graphs of the plan: each is looked up in S3 first, then fetched from the Hub, and
    # the compiler never runs.
    from tests.harness.test_compile_cache import PUBLIC, hub_cache_repo, module_files, run_against, tools

    version = tools("0.3.0")
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    host = make_host(1)
    options = BootOptions(compile_cache="s3://cache-bucket/compile-cache")
    assert host.boot(boot_of(plan, options)).returncode == 0
    [argv] = host.exports()
    assert argv[argv.index("--network") + 1] == "host"
    # The graphs of this plan, compiled once by an export with an empty cache (as `optimum-cli neuron cache
    # synchronize` would then upload them).
    with FakeHub([hub_cache_repo(PUBLIC)]) as hub:
        seed = run_against(hub, "0.3.0", tmp_path / "seed")
    assert seed.result["exit_code"] == 0 and len(seed.compiled()) == 2
    graphs = [module_files(seed, seed.graph(part)) for part in ("context_encoding", "token_generation")]
    _tiny_checkpoint_mounted(argv, TGI.export_key(plan, TGI_3_3_5), tmp_path)
    with FakeHub([hub_cache_repo(PUBLIC, *graphs)]) as hub:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "NEURON_", "CUSTOM_CACHE"))}
        done = subprocess.run(
            [str(version.python), str(version.runner), "--docker-run", "--compile-cache",
             "--local-cache", str(tmp_path / "local-cache"), "--s3-root", str(tmp_path / "s3"),
             "--scratch", str(tmp_path / "scratch"), "--json", json.dumps(argv)],
            capture_output=True, text=True, check=False, timeout=600,
            env={**env, "HOME": str(tmp_path), **hub.client_env(tmp_path / "hf-home")})
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["exit_code"] == 0, result.get("stderr")
        assert result["container_env"]["CUSTOM_CACHE_REPO"] == PUBLIC
        record = result["compile_cache"]
        assert record["compilations"] == []
        found = {lookup["graph"]: lookup["found"] for lookup in record["lookups"]}
        assert sorted(found.values()) == ["hub", "hub"]
        # The S3 compile cache (empty here) was asked for each graph before the Hub.
        assert {lookup["default_cache"] for lookup in record["lookups"]} == {"s3://cache-bucket/compile-cache"}
        for graph in found:
            first = next(e for e in record["events"] if e["graph"] == graph)
            assert (first["cache"], first["op"]) == ("s3", "exists")
            assert first["target"].startswith("s3://cache-bucket/compile-cache/neuronxcc-")
        assert sorted(f["from"] for f in record["fetches"]) == ["hub", "hub"]
