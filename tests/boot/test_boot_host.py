"""The boot script, run under bash on a simulated host: what it does, and what it refuses to do."""

from __future__ import annotations

import stat
from collections.abc import Callable

from bootsim import (
    EXPORTS,
    FAKE_HF_TOKEN,
    HOST_STACK,
    MARKER,
    SECRET_ARN,
    SMALL_MODEL,
    Host,
    host_resource,
    make_plan,
    write_export,
)

from neuron_serving.plan import ServingPlan
from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.render.boot import BUNDLE_ENV, CHECK_EXPORT, EXPORT_MODEL, RUN_REPLICA
from neuron_serving.render.boot_options import BootOptions
from neuron_serving.render.router import render_router_config
from tests.harness.userdata import boot_of, deployed_metadata, readable

Booted = Callable[..., tuple[Host, ServingPlan, str]]
MakeHost = Callable[..., Host]



def export_dir(plan: ServingPlan) -> str:
    return f"{EXPORTS}/{TGI.export_key(plan, TGI_3_3_5)}"


def read_env_file(host: Host, path: str) -> dict[str, str]:
    lines = host.path(path).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines)


def device_flags(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == "--device"]


def test_export_runs_once_across_two_boots_and_every_unit_start(booted: Booted) -> None:
    host, plan, script = booted("inf2.48xlarge", 8)
    second = host.boot(script)
    for _ in plan.replicas:  # each neuron-replica@N unit's ExecStartPre after the reboot
        assert host.run(EXPORT_MODEL).returncode == 0
    assert second.returncode == 0, second.stdout
    assert len(host.exports()) == 1
    assert host.path(f"{export_dir(plan)}/{MARKER}").is_file()


def test_concurrent_export_callers_wait_for_one_export(make_host: MakeHost) -> None:
    plan = make_plan("inf2.48xlarge", 8)
    host = make_host(12)
    assert host.boot(boot_of(plan), STUB_EXPORT_FAIL="1").returncode != 0
    callers = [host.start(EXPORT_MODEL, STUB_EXPORT_SECONDS="0.5") for _ in range(4)]
    assert [c.wait(timeout=30) for c in callers] == [0, 0, 0, 0]
    assert len(host.exports()) == 2  # the failed one at boot, then exactly one more


def test_each_replica_runs_with_exactly_its_devices_and_port(booted: Booted) -> None:
    host, plan, _ = booted("inf2.48xlarge", 8)
    key = TGI.export_key(plan, TGI_3_3_5)
    for replica in plan.replicas:
        conf = host.path(f"/etc/neuron-serving/replica-{replica.index}.conf").read_text()
        assert f'DEVICES="{" ".join(map(str, replica.devices))}"' in conf
        assert f"PORT={replica.port}" in conf
        result = host.run(RUN_REPLICA, str(replica.index))
        assert result.returncode == 0, result.stderr
        argv = host.calls("docker")[-1]
        assert device_flags(argv) == list(replica.device_paths)
        assert argv[argv.index("-p") + 1] == f"127.0.0.1:{replica.port}:80"
        assert argv[argv.index("--name") + 1] == f"replica-{replica.index}"
        assert argv[argv.index("-v") + 1] == f"{host.path(export_dir(plan))}:/models/{key}:ro"
        assert "--privileged" not in argv


def test_each_replica_env_file_holds_exactly_its_tgi_settings(booted: Booted) -> None:
    host, plan, _ = booted("trn1.32xlarge", 2)
    model_dir = f"/models/{TGI.export_key(plan, TGI_3_3_5)}"
    for replica in plan.replicas:
        env_file = f"/etc/neuron-serving/replica-{replica.index}.env"
        assert read_env_file(host, env_file) == TGI.replica_environment(plan, TGI_3_3_5, replica, model_dir)
        host.run(RUN_REPLICA, str(replica.index))
        argv = host.calls("docker")[-1]
        assert argv[argv.index("--env-file") + 1] == str(host.path(env_file))


def test_every_replica_unit_is_enabled_and_started_after_the_export(booted: Booted) -> None:
    host, plan, _ = booted("trn1.32xlarge", 2)
    assert host.started_units() == ["docker"] + [f"neuron-replica@{r.index}" for r in plan.replicas]
    unit = host.path("/etc/systemd/system/neuron-replica@.service").read_text()
    assert "Restart=always" in unit
    assert "ExecStartPre=/opt/neuron-serving/bin/export-model" in unit
    assert "ExecStart=/opt/neuron-serving/bin/run-replica %i" in unit
    assert "--privileged" not in unit


def test_export_compiles_from_the_downloaded_checkpoint_with_one_replicas_devices_never_privileged(
    booted: Booted,
) -> None:
    host, plan, _ = booted("inf2.24xlarge", 4)
    [argv] = host.exports()
    assert device_flags(argv) == ["/dev/neuron0", "/dev/neuron1"]
    assert "--privileged" not in argv
    assert argv[argv.index("--entrypoint") + 1] == "optimum-cli"
    # Online, for optimum-neuron's public Hub cache of compiled graphs (tests/boot/test_boot_export.py).
    assert argv[argv.index("-e") + 1] == "CUSTOM_CACHE_REPO=aws-neuron/optimum-neuron-cache"
    command = argv[argv.index(TGI_3_3_5.reference) + 1:]
    key = TGI.export_key(plan, TGI_3_3_5)
    assert command == ["export", "neuron", "--model", f"/models/{key}.src", "--task", "text-generation",
                       "--batch_size", "4", "--sequence_length", "4096", "--num_cores", "4",
                       "--auto_cast_type", "bf16", f"/models/{key}.tmp"]


def test_hf_token_is_only_in_its_root_only_env_file(booted: Booted) -> None:
    host, plan, script = booted("inf2.48xlarge", 8, SECRET_ARN)
    for replica in plan.replicas:
        host.run(RUN_REPLICA, str(replica.index))
    token_file = host.path("/etc/neuron-serving/hf-token.env")
    assert token_file.read_text() == f"HF_TOKEN={FAKE_HF_TOKEN}\n"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert FAKE_HF_TOKEN not in readable(script)
    assert FAKE_HF_TOKEN not in host.calls_log.read_text()
    leaks = [p for p in host.root.rglob("*")
             if p.is_file() and p != token_file and FAKE_HF_TOKEN in p.read_text(errors="replace")]
    assert leaks == []
    [get_secret] = host.calls("aws")
    # The ARN of SECRET_ARN's name and region, its suffix moto's.
    assert get_secret[get_secret.index("--secret-id") + 1].startswith(SECRET_ARN.rsplit("-", 1)[0] + "-")


def test_secret_arn_is_read_in_the_region_it_names(booted: Booted) -> None:
    host, _, _ = booted("inf2.48xlarge", 8, SECRET_ARN)
    [get_secret] = host.calls("aws")
    assert get_secret[get_secret.index("--region") + 1] == "eu-west-1"
    assert host.calls("curl") == []


def test_secret_name_is_read_in_the_instance_region_from_imdsv2(booted: Booted) -> None:
    host, _, _ = booted("inf2.48xlarge", 8, "neuron-serving/hf-token")
    [get_secret] = host.calls("aws")
    assert get_secret[get_secret.index("--secret-id") + 1] == "neuron-serving/hf-token"
    assert get_secret[get_secret.index("--region") + 1] == "us-east-2"
    assert [c[-1] for c in host.calls("curl")] == [
        "http://169.254.169.254/latest/api/token",
        "http://169.254.169.254/latest/meta-data/placement/region",
    ]


def test_hf_token_file_is_given_to_the_hub_download_only(booted: Booted) -> None:
    host, plan, _ = booted("inf2.48xlarge", 8, "neuron-serving/hf-token")
    for replica in plan.replicas:
        host.run(RUN_REPLICA, str(replica.index))
    runs = [a for a in host.calls("docker") if a[0] == "run"]
    token_file = str(host.path("/etc/neuron-serving/hf-token.env"))
    with_token = [a[a.index("--entrypoint") + 1] for a in runs if token_file in a]
    assert with_token == ["huggingface-cli"]
    assert len(runs) == 2 + len(plan.replicas)


def test_secret_holding_json_is_refused_without_printing_it(make_host: MakeHost) -> None:
    host = make_host(12)
    result = host.boot(boot_of(make_plan("inf2.48xlarge", 8), BootOptions(hf_token_secret="hf")),
                       STUB_SECRET_JSON="1")
    assert result.returncode != 0
    assert "secret hf must hold the Hugging Face token as plain text, not JSON" in result.stdout
    assert FAKE_HF_TOKEN not in result.stdout + result.stderr
    assert not host.path("/etc/neuron-serving/hf-token.env").exists()
    assert host.calls("docker") == []


def test_no_secret_means_no_aws_call_and_no_token_file(booted: Booted) -> None:
    host, _, _ = booted("inf2.xlarge", model_id=SMALL_MODEL)
    assert host.calls("aws") == []
    assert host.calls("curl") == []
    assert not host.path("/etc/neuron-serving/hf-token.env").exists()


def test_failing_image_pull_is_retried_with_growing_waits(make_host: MakeHost) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    host = make_host(1)
    result = host.boot(boot_of(plan), STUB_DOCKER_PULL_FAILURES="3")
    assert result.returncode == 0, result.stdout
    assert len([a for a in host.calls("docker") if a[0] == "pull"]) == 4
    assert host.calls("sleep") == [["10"], ["20"], ["40"]]
    assert len(host.exports()) == 1


def test_image_pull_fails_clearly_after_the_last_attempt(make_host: MakeHost) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    host = make_host(1)
    result = host.boot(boot_of(plan), STUB_DOCKER_PULL_FAILURES="5")
    assert result.returncode != 0
    assert f"could not pull {TGI_3_3_5.reference} after 5 attempts" in result.stdout
    assert "FAILED in step pull-image" in result.stdout
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed pull-image\n"
    assert host.exports() == []
    assert host.started_units() == ["docker"]


def test_device_count_unlike_the_catalog_stops_before_any_replica(make_host: MakeHost) -> None:
    host = make_host(6)
    result = host.boot(boot_of(make_plan("inf2.48xlarge", 8)))
    assert result.returncode != 0
    assert "expected 12 Neuron devices for inf2.48xlarge, found 6 (/dev/neuron0..5)" in result.stdout
    assert "| 5      |" in result.stdout  # neuron-ls ran, for diagnosis
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed check-devices\n"
    assert host.calls("docker") == []
    assert host.started_units() == []
    assert "expected 12 Neuron devices" in host.path("/var/log/neuron-serving/boot.log").read_text()


def test_no_neuron_device_at_all_is_reported_as_found_0(make_host: MakeHost) -> None:
    host = make_host(0)
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    result = host.boot(boot_of(plan))
    assert "expected 1 Neuron devices for inf2.xlarge, found 0;" in result.stdout
    assert host.started_units() == []


def test_the_degree_reaches_the_export_as_num_cores_never_as_tensor_parallel_size(make_host: MakeHost) -> None:
    # Defect 1 of issue 8: the script passed --tensor_parallel_size whenever the image's help
    # listed it, and optimum-neuron 0.3.0 drops it for decoders (the real parser's test is in
    # tests/harness/test_optimum_neuron.py). The export then compiled for every core.
    plan = make_plan("trn1.32xlarge", 8)
    host = make_host(16)
    result = host.boot(boot_of(plan))
    assert result.returncode == 0, result.stdout
    [argv] = host.exports()
    assert argv[argv.index("--num_cores") + 1] == "8"
    assert "--tensor_parallel_size" not in argv
    assert [a for a in host.calls("docker") if "--help" in a] == []
    config = host.path(f"{export_dir(plan)}/neuron_config.json").read_text()
    assert '"tp_degree": 8' in config


def test_export_is_skipped_when_its_marker_is_present(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    final = host.path(export_dir(plan))
    final.mkdir(parents=True)
    write_export(final, plan)
    (final / MARKER).write_text("exported earlier\n")
    result = host.boot(boot_of(plan))
    assert result.returncode == 0, result.stdout
    assert [a for a in host.calls("docker") if a[0] == "run"] == []
    assert host.started_units()[1:] == [f"neuron-replica@{r.index}" for r in plan.replicas]


def test_half_finished_export_is_not_used_and_is_redone(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    final = host.path(export_dir(plan))
    final.with_name(final.name + ".tmp").mkdir(parents=True)
    (final.with_name(final.name + ".tmp") / "partial.neff").write_text("interrupted\n")
    final.mkdir()  # renamed, but the marker was never written
    (final / "stale.neff").write_text("interrupted\n")
    result = host.boot(boot_of(plan))
    assert result.returncode == 0, result.stdout
    assert len(host.exports()) == 1
    assert "stale.neff" not in [p.name for p in final.iterdir()]
    assert (final / MARKER).is_file() and host.run(CHECK_EXPORT, str(final)).returncode == 0
    assert not final.with_name(final.name + ".tmp").exists()


def test_failed_export_leaves_no_marker_and_starts_no_replica(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    result = host.boot(boot_of(plan), STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    assert "neuronx-cc: error: compilation failed" in result.stdout  # the end of export.log
    assert "FAILED in step export-model" in result.stdout
    assert not host.path(export_dir(plan)).exists()
    assert host.started_units() == ["docker"]


def test_router_config_is_validated_then_installed_and_restarted(booted: Booted) -> None:
    host, plan, _ = booted("inf2.48xlarge", 2)
    installed = host.path("/etc/haproxy/haproxy.cfg").read_text()
    assert installed.rstrip("\n") == render_router_config(plan).rstrip("\n")
    assert host.calls("haproxy") == [["-c", "-f", str(host.path("/etc/haproxy/haproxy.cfg.new"))]]
    assert host.calls("systemctl")[-2:] == [["enable", "haproxy"], ["restart", "haproxy"]]
    assert host.path("/var/log/neuron-serving/status").read_text() == "done\n"


def test_invalid_router_config_keeps_the_previous_one(make_host: MakeHost) -> None:
    host = make_host(1)
    previous = host.path("/etc/haproxy/haproxy.cfg")
    previous.parent.mkdir(parents=True)
    previous.write_text("# the previous config\n")
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    result = host.boot(boot_of(plan), STUB_HAPROXY_INVALID="1")
    assert "FAILED in step router" in result.stdout
    assert previous.read_text() == "# the previous config\n"
    assert ["restart", "haproxy"] not in host.calls("systemctl")


def test_tools_present_on_the_image_are_not_installed_again(booted: Booted) -> None:
    host, _, _ = booted("inf2.xlarge", model_id=SMALL_MODEL)
    assert host.calls("apt-get") == []
    assert host.calls("snap") == []


def test_missing_tools_are_installed_docker_and_haproxy_by_apt_aws_cli_by_snap(make_host: MakeHost) -> None:
    host = make_host(1, missing=("docker", "aws", "haproxy"))
    host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL)))
    installs = [a[a.index("install") + 1:] for a in host.calls("apt-get") if "install" in a]
    assert installs == [["-y", "-q", "docker.io"], ["-y", "-q", "haproxy"]]
    assert host.calls("snap") == [["install", "aws-cli", "--classic"]]
    assert ["enable", "--now", "docker"] in host.calls("systemctl")


def test_installing_haproxy_restarts_rsyslog_so_the_router_log_is_written_from_the_first_boot(
    make_host: MakeHost,
) -> None:
    # Defect 4 of issue 8: /var/log/haproxy.log comes from the rsyslog rule the package installs,
    # which rsyslog reads only when it starts (tests/test_tools.py checks the rule in Debian's
    # package).
    host = make_host(1, missing=("haproxy",))
    host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL)))
    entries = host.entries()
    install = entries.index(("apt-get", ["-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "haproxy"]))
    assert entries[install + 1] == ("systemctl", ["try-restart", "rsyslog"])


def test_without_an_aws_cli_or_snap_the_boot_fails_at_once_in_step_bundle_saying_why(make_host: MakeHost) -> None:
    # Defect 6 of issue 8: Ubuntu 24.04 has no awscli package, so `apt-get install awscli` fails. The
    # boot script takes the image's CLI or snap's; AWS's installer is the bundle's, for a CLI too old
    # for the artifact cache (tests/boot/test_boot_fleet.py), since the bundle comes by the CLI.
    host = make_host(1, missing=("aws",))
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(hf_token_secret="hf")),
                       STUB_SNAP_FAIL="1")
    assert result.returncode != 0
    reason = "neuron-serving: failed in step bundle: no AWS CLI, and snap could not install one\n"
    assert host.path("/dev/console").read_text() == reason
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed bundle\n"
    assert host.calls("snap") == [["install", "aws-cli", "--classic"]]
    assert host.calls("apt-get") == [] and host.calls("curl") == []


def test_a_host_of_an_older_launch_template_version_installs_its_own_bundle_whatever_the_stacks_metadata_holds(
        make_host: MakeHost) -> None:
    # Defect 8 of issue 37: a host launched from an older launch template version while the stack updates
    # read the bundle the stack's current metadata named, and failed its user data's digest.
    plan = make_plan("inf2.24xlarge", 4)
    older, newer = boot_of(plan), boot_of(plan, BootOptions(hf_token_secret=SECRET_ARN))
    assert older.digest != newer.digest
    host = make_host(plan.instance.devices)
    first = host.publish_bundle(older)
    host.publish_bundle(newer)
    # The stack updated: the launch template's metadata is the newer synth's.
    host.put_metadata(HOST_STACK, host_resource(older), deployed_metadata(newer))
    done = host.boot(first)
    assert done.returncode == 0, done.stdout
    [download] = [c for c in host.calls("aws", bundle=True) if c[:2] == ["s3", "cp"] and c[-1] == "z"]
    assert f"/{older.digest}.zip" in " ".join(download)
    assert host.path(BUNDLE_ENV).read_text() == older.files[BUNDLE_ENV]
