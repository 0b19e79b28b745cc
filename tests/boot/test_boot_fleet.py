"""The boot script's fleet side, run on simulated hosts: the S3 artifact cache, prebuilt exports,
readiness and CloudFormation signals, and the Auto Scaling warm pool."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import (
    BOOT_LOG,
    CACHE,
    FAKE_HF_TOKEN,
    HOOK,
    MARKER,
    SIGNAL,
    SMALL_MODEL,
    Host,
    complete_marker,
    make_plan,
    write_export,
)

from neuron_serving.plan import ServingPlan
from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.host import resolve_host
from neuron_serving.render.boot import (
    CHECK_EXPORT,
    COMPLETE_LIFECYCLE,
    EXPORT_MODEL,
    RUN_REPLICA,
    SIGNAL_ID_LIMIT,
    render_boot_script,
)
from neuron_serving.render.boot_options import BootOptions
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]



def small_plan() -> ServingPlan:
    return make_plan("inf2.xlarge", model_id=SMALL_MODEL)


def local_export(host: Host, plan: ServingPlan) -> Path:
    return host.path(f"/var/lib/neuron-serving/exports/{TGI.export_key(plan, TGI_3_3_5)}")


def cached(plan: ServingPlan) -> str:
    """``<cache>/<export key>``, the prefix of ``plan``'s export in the artifact cache."""
    return f"{CACHE}/{TGI.export_key(plan, TGI_3_3_5)}"


def downloads(host: Host) -> list[list[str]]:
    """``aws s3 sync`` calls from S3 to the host."""
    return [a for a in host.aws("s3", "sync") if a[-2].startswith("s3://")]


def has_working_export(host: Host, plan: ServingPlan) -> bool:
    final = local_export(host, plan)
    return (final / MARKER).is_file() and host_runs_check(host, final)


def host_runs_check(host: Host, export: Path) -> bool:
    """Whether the host's check-export accepts ``export``."""
    return host.run(CHECK_EXPORT, str(export)).returncode == 0


def signals(host: Host) -> list[dict[str, str]]:
    return [dict(zip(a[2::2], a[3::2], strict=True)) for a in host.aws("cloudformation", "signal-resource")]


def lifecycle_actions(host: Host) -> list[dict[str, str]]:
    return [dict(zip(a[2::2], a[3::2], strict=True)) for a in host.aws("autoscaling", "complete-lifecycle-action")]


def probes(host: Host) -> list[str]:
    """The loopback URLs curl was asked for, in order."""
    return [a[-1] for a in host.calls("curl") if a[-1].startswith("http://127.0.0.1:")]


def position(host: Host, match: Callable[[str, list[str]], bool]) -> list[int]:
    return [n for n, (cmd, argv) in enumerate(host.entries()) if match(cmd, argv)]


def test_three_hosts_booting_in_turn_export_once_and_download_twice(make_host: MakeHost) -> None:
    plan = small_plan()
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    hosts = [make_host(1) for _ in range(3)]
    for host in hosts:
        result = host.boot(script)
        assert result.returncode == 0, result.stdout
    assert [len(h.exports()) for h in hosts] == [1, 0, 0]
    assert [len(downloads(h)) for h in hosts] == [0, 1, 1]
    assert all(has_working_export(h, plan) for h in hosts)
    published = f"exports/{TGI.export_key(plan, TGI_3_3_5)}/{hosts[0].instance_id}"
    # COMPLETE names the upload and lists every file of it with its SHA-256.
    upload = hosts[0].download_tree(f"{cached(plan)}/{hosts[0].instance_id}")
    assert hosts[0].s3_object(f"{cached(plan)}/COMPLETE") == complete_marker(published, upload).encode()
    assert downloads(hosts[1])[0][-2] == f"s3://cache-bucket/{published}/"


def test_two_racing_exporters_leave_one_complete_marker_naming_one_complete_artifact(make_host: MakeHost) -> None:
    plan = small_plan()
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    hosts = [make_host(1), make_host(1)]
    # A slow compiler: both hosts find no COMPLETE and export; both then try to publish.
    boots = [h.boot_async(script, STUB_EXPORT_SECONDS="5") for h in hosts]
    outputs = [b.communicate(timeout=240)[0] for b in boots]
    assert [b.returncode for b in boots] == [0, 0]
    assert [len(h.exports()) for h in hosts] == [1, 1]
    assert all(has_working_export(h, plan) for h in hosts)
    cache = cached(plan)
    complete = (hosts[0].s3_object(f"{cache}/COMPLETE") or b"").decode()
    named = complete.splitlines()[0]
    winner = named.rsplit("/", 1)[-1]
    assert winner in {h.instance_id for h in hosts}
    # The winner's artifact is complete, and its manifest is the winner's; the loser's upload is gone.
    assert sorted({k.split("/")[0] for k in hosts[0].s3_keys(cache)}) == ["COMPLETE", winner]
    artifact = hosts[0].download_tree(f"{cache}/{winner}")
    assert host_runs_check(hosts[0], artifact)
    assert complete == complete_marker(named, artifact)
    loser = next(h for h in hosts if h.instance_id != winner)
    assert "PreconditionFailed" in loser.path("/var/log/neuron-serving/export.log").read_text()
    assert "export-model: not published: another host published first" in outputs[hosts.index(loser)]


def test_an_artifact_without_its_complete_marker_is_not_used(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    host.publish(f"{cached(plan)}/i-0interrupted00000/config.json", '{"model_type": "llama"}\n')
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert len(host.exports()) == 1
    assert downloads(host) == []
    assert (host.s3_object(f"{cached(plan)}/COMPLETE") or b"").decode().splitlines()[0].endswith(
        f"/{host.instance_id}")


def test_a_prebuilt_s3_export_is_downloaded_and_optimum_cli_never_runs(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    prebuilt = host.staging("llama-neuron")
    write_export(prebuilt, plan)
    host.publish_tree("s3://models/llama-neuron", prebuilt)
    spec = resolve_host(plan, prebuilt_export="s3://models/llama-neuron")
    result = host.boot(render_boot_script(plan, spec, BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert [a for a in host.calls("docker") if "optimum-cli" in a] == []
    assert [a[-2:] for a in downloads(host)] == [["s3://models/llama-neuron/", f"{local_export(host, plan)}.tmp"]]
    assert has_working_export(host, plan)
    assert (local_export(host, plan) / MARKER).read_text().startswith("downloaded from s3://models/llama-neuron/ at ")
    assert host.aws("s3api", "put-object") == []  # nothing published


def test_a_prebuilt_hf_export_is_downloaded_in_the_serving_image_and_optimum_cli_never_runs(
    make_host: MakeHost,
) -> None:
    plan = make_plan("inf2.48xlarge", 8)
    host = make_host(12)
    spec = resolve_host(plan, prebuilt_export="hf://aws-neuron/Llama-3.1-8B-neuron")
    result = host.boot(render_boot_script(plan, spec, BootOptions(hf_token_secret="hf")))
    assert result.returncode == 0, result.stdout
    [download] = [a for a in host.calls("docker") if a[0] == "run" and "--name" not in a]
    assert download[download.index("--entrypoint") + 1] == "huggingface-cli"
    assert download[download.index("--env-file") + 1] == str(host.path("/etc/neuron-serving/hf-token.env"))
    key = TGI.export_key(plan, TGI_3_3_5)
    assert download[download.index(TGI_3_3_5.reference) + 1:] == [
        "download", "--max-workers", "16", "aws-neuron/Llama-3.1-8B-neuron", "--local-dir", f"/models/{key}.tmp"]
    assert has_working_export(host, plan)
    assert FAKE_HF_TOKEN not in host.calls_log.read_text()


def test_success_is_signalled_only_after_every_replica_generated_and_the_router_answered(
    make_host: MakeHost,
) -> None:
    plan = make_plan("inf2.48xlarge", 8)
    host = make_host(12)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)), STUB_READY_AFTER="2")
    assert result.returncode == 0, result.stdout
    [signal] = signals(host)
    assert signal == {"--region": "us-east-2", "--stack-name": "NeuronLlamaStack",
                      "--logical-resource-id": "NeuronServingFleet", "--status": "SUCCESS",
                      "--unique-id": host.instance_id}
    [signalled] = position(host, lambda cmd, argv: argv[:2] == ["cloudformation", "signal-resource"])
    replicas = [f"http://127.0.0.1:{r.port}" for r in plan.replicas]
    router = f"http://127.0.0.1:{plan.router_port}/health"
    # Each replica in turn: 503 twice, then 200, then a one-token generation; then the router.
    assert probes(host) == [*(u for r in replicas for u in [f"{r}/health"] * 3 + [f"{r}/generate"]),
                            router, router, router]
    assert position(host, lambda cmd, argv: cmd == "curl")[-1] < signalled
    assert host.calls("sleep").count(["10"]) == 2 * (len(replicas) + 1)


def test_a_replica_that_never_serves_fails_the_boot_with_a_failure_signal_naming_it(make_host: MakeHost) -> None:
    plan = make_plan("inf2.48xlarge", 8)
    host = make_host(12)
    stuck = plan.replicas[1]
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)),
                       STUB_NEVER_READY=str(stuck.port), NEURON_SERVING_READY_SECONDS="4")
    assert result.returncode != 0
    [signal] = signals(host)
    assert signal["--status"] == "FAILURE"
    # The limit is real time while the stub sleep returns at once: long enough that a loaded
    # machine still reaches replica-1 (and polls it) within it.
    reason = f"replica-1 not ready in 4s (port {stuck.port})"
    assert signal["--unique-id"] == f"{host.instance_id} wait-ready: {reason}"[:SIGNAL_ID_LIMIT]
    assert f"failed in step wait-ready: {reason}" in host.path(BOOT_LOG).read_text()
    assert ["10"] in host.calls("sleep")  # it polled before giving up
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed wait-ready\n"


def test_a_failed_export_signals_failure_with_the_compiler_error_and_logs_the_whole_tail(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    console = host.path("/dev/console")
    console.touch()
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)), STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    [signal] = signals(host)
    assert signal["--status"] == "FAILURE"
    unique_id = signal["--unique-id"]
    assert unique_id.startswith(f"{host.instance_id} export-model: neuronx-cc: error: compilation")
    assert len(unique_id) <= SIGNAL_ID_LIMIT and re.fullmatch(r"[\w .:/()=,+-]+", unique_id)
    key = TGI.export_key(plan, TGI_3_3_5)
    reason = "neuron-serving: failed in step export-model: neuronx-cc: error: compilation failed\n"
    tail = f"compiling /models/{key}.src into /models/{key}.tmp\nneuronx-cc: error: compilation failed\n"
    assert reason in host.path(BOOT_LOG).read_text()
    assert console.read_text().startswith(reason)
    assert tail in console.read_text()


def test_a_signal_that_no_deployment_awaits_does_not_fail_the_boot(make_host: MakeHost) -> None:
    host = make_host(1)
    # A host the group launches later, to scale out: CloudFormation refuses the signal.
    result = host.boot(boot_of(small_plan(), BootOptions(signal=SIGNAL)), STUB_SIGNAL_FAIL="1")
    assert result.returncode == 0, result.stdout
    assert [s["--status"] for s in signals(host)] == ["SUCCESS"]
    assert "no SUCCESS signal taken" in result.stdout


def test_a_boot_without_readiness_options_neither_waits_nor_signals(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(small_plan(), BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert probes(host) == []
    assert signals(host) == [] and lifecycle_actions(host) == []


def warm_pool_boot(make_host: MakeHost) -> tuple[Host, ServingPlan]:
    """A host launched into the warm pool with every fleet option, after its boot."""
    plan = make_plan("inf2.48xlarge", 8)
    host = make_host(12)
    options = BootOptions(artifact_cache=CACHE, signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="Warmed:Stopped")
    assert result.returncode == 0, result.stdout
    return host, plan


def test_a_launch_into_the_warm_pool_prepares_everything_and_completes_the_lifecycle_action_without_serving(
    make_host: MakeHost,
) -> None:
    host, plan = warm_pool_boot(make_host)
    assert len([a for a in host.calls("docker") if a[0] == "pull"]) == 1
    assert len(host.exports()) == 1
    units = [f"neuron-replica@{r.index}" for r in plan.replicas]
    assert ["enable", "neuron-serving-ready", *units] in host.calls("systemctl")
    assert [a for a in host.calls("systemctl") if a[0] in ("start", "restart") or "--now" in a] == [
        ["enable", "--now", "docker"]]
    assert host.path("/etc/haproxy/haproxy.cfg").is_file()
    assert lifecycle_actions(host) == [{
        "--region": "us-east-2", "--instance-id": host.instance_id,
        "--auto-scaling-group-name": HOOK.group_name, "--lifecycle-hook-name": HOOK.hook_name,
        "--lifecycle-action-result": "CONTINUE"}]
    assert signals(host) == [] and probes(host) == []


def test_a_start_from_the_warm_pool_pulls_and_exports_nothing_and_completes_the_lifecycle_action_once_ready(
    make_host: MakeHost,
) -> None:
    host, plan = warm_pool_boot(make_host)
    host.forget_calls()
    # The next boot: no user data; systemd starts the enabled units.
    for replica in plan.replicas:
        assert host.run(EXPORT_MODEL).returncode == 0  # ExecStartPre
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    assert host.run_unit("neuron-serving-ready.service", STUB_LIFECYCLE_STATE="InService") == 0
    assert [a for a in host.calls("docker") if a[0] == "pull" or "optimum-cli" in a] == []
    assert host.calls("aws")[-1][:2] == ["autoscaling", "complete-lifecycle-action"]
    assert [a["--lifecycle-action-result"] for a in lifecycle_actions(host)] == ["CONTINUE"]
    assert len(host.aws("s3", "sync")) + len(host.aws("s3", "cp")) == 0
    assert probes(host)[-1] == f"http://127.0.0.1:{plan.router_port}/health"
    assert signals(host) == []


def test_a_launch_straight_into_service_signals_success_then_completes_the_lifecycle_action(
    make_host: MakeHost,
) -> None:
    plan = small_plan()
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="InService")
    assert result.returncode == 0, result.stdout
    assert ["start", "neuron-replica@0"] in host.calls("systemctl")
    assert [a[:2] for a in host.calls("aws") if a[0] != "ec2"] == [["cloudformation", "signal-resource"],
                                                  ["autoscaling", "complete-lifecycle-action"]]
    assert signals(host)[0]["--status"] == "SUCCESS"
    assert lifecycle_actions(host)[0]["--lifecycle-action-result"] == "CONTINUE"


def test_a_failed_boot_in_the_warm_pool_abandons_the_lifecycle_action_and_signals_nothing(
    make_host: MakeHost,
) -> None:
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(small_plan(), options),
                       STUB_LIFECYCLE_STATE="Warmed:Stopped", STUB_DOCKER_PULL_FAILURES="5")
    assert result.returncode != 0
    assert [a["--lifecycle-action-result"] for a in lifecycle_actions(host)] == ["ABANDON"]
    assert signals(host) == []


def test_completing_a_lifecycle_action_that_none_awaits_is_tolerated(make_host: MakeHost) -> None:
    host = make_host(1)
    options = BootOptions(warm_pool_hook=HOOK)
    assert host.boot(boot_of(small_plan(), options), STUB_LIFECYCLE_STATE="InService").returncode == 0
    # A reboot in service: neuron-serving-ready runs again, and no action is pending.
    result = host.run(COMPLETE_LIFECYCLE, "CONTINUE", STUB_LIFECYCLE_FAIL="1")
    assert result.returncode == 0
    assert "No active Lifecycle Action" in result.stderr
    assert "complete-lifecycle: CONTINUE not taken" in result.stdout


REVISION = "5f0b02c75b57c5855da9ae460ce51323ea669d8a"


def test_a_pinned_revision_is_downloaded_then_exported_from_disk_under_its_own_key(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE), model_revision=REVISION))
    assert result.returncode == 0, result.stdout
    key = TGI.export_key(plan, TGI_3_3_5, REVISION)
    assert key != TGI.export_key(plan, TGI_3_3_5)
    runs = [a for a in host.calls("docker") if a[0] == "run" and "--name" not in a and "--help" not in a]
    download, export = runs
    assert download[download.index(TGI_3_3_5.reference) + 1:download.index("--include")] == [
        "download", "--max-workers", "16", plan.model_id, "--revision", REVISION, "--local-dir", f"/models/{key}.src"]
    assert export[export.index("--model") + 1] == f"/models/{key}.src"
    final = host.path(f"/var/lib/neuron-serving/exports/{key}")
    assert (final / MARKER).is_file()
    assert not host.path(f"/var/lib/neuron-serving/exports/{key}.src").exists()  # the checkpoint is not kept
    assert host.s3_object(f"{CACHE}/{key}/COMPLETE") is not None  # published under the pinned key


def test_an_unknown_revision_fails_the_boot_with_a_failure_signal_naming_it(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    spec = resolve_host(plan, model_revision="no-such-branch")
    result = host.boot(render_boot_script(plan, spec, BootOptions(signal=SIGNAL)), STUB_HF_DOWNLOAD_FAIL="1")
    assert result.returncode != 0
    assert [a for a in host.calls("docker") if "optimum-cli" in a and "--help" not in a] == []
    (failure,) = [s for s in signals(host) if s["--status"] == "FAILURE"]
    assert f"could not download {plan.model_id} at revision no-such-branch" in host.path(BOOT_LOG).read_text()
    assert failure["--unique-id"].startswith(host.instance_id)


# `aws --version` of CLIs too old for put-object --if-none-match (S3 conditional writes came with AWS CLI 1.34.2
# and 2.17.34): the format of aws/aws-cli 1.34.1 (tried) and 2.9.19 awscli/clidriver.py (session.user_agent());
# 2.9.19 is Debian 12's awscli package. Python and Linux versions are examples.
OLD_CLIS = {
    "v1": "aws-cli/1.34.1 Python/3.11.7 Linux/6.5.0-1022-aws botocore/1.35.1",
    "v2": "aws-cli/2.9.19 Python/3.11.2 Linux/6.1.0-18-cloud-amd64 source/x86_64.debian.12 prompt/off",
}
SKELETON = ["s3api", "put-object", "--generate-cli-skeleton"]


@pytest.mark.parametrize("cli", OLD_CLIS)
def test_an_aws_cli_too_old_for_conditional_writes_is_replaced_and_the_export_is_published(
    make_host: MakeHost, cli: str,
) -> None:
    # Defect 6 of issue 22: an old CLI failed put-object --if-none-match, which the script took for
    # another host's win: the boot succeeded and the cache never filled.
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE)), STUB_AWS_VERSION=OLD_CLIS[cli])
    assert result.returncode == 0, result.stdout
    assert host.s3_object(f"{cached(plan)}/COMPLETE") is not None
    assert f"{OLD_CLIS[cli]} lacks --if-none-match: installing v2" in result.stdout
    assert "https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip" in [a[-1] for a in host.calls("curl")]


def test_a_host_that_publishes_nothing_keeps_an_old_aws_cli(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(small_plan()), STUB_AWS_VERSION=OLD_CLIS["v1"])
    assert result.returncode == 0, result.stdout
    assert SKELETON not in host.calls("aws")
    assert all("awscli" not in a[-1] for a in host.calls("curl"))


def test_an_aws_cli_new_enough_is_kept(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(small_plan(), BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert SKELETON in host.calls("aws")
    assert all("awscli" not in a[-1] for a in host.calls("curl"))


def test_a_cli_that_still_lacks_the_option_is_reported_and_not_taken_for_another_hosts_win(
    make_host: MakeHost,
) -> None:
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE)),
                       STUB_AWS_VERSION=OLD_CLIS["v1"], STUB_INSTALLED_AWS_VERSION=OLD_CLIS["v1"])
    assert result.returncode == 0, result.stdout  # the host serves its own export
    assert "export-model: not published: Unknown options: --if-none-match, *" in result.stdout
    assert "another host published first" not in result.stdout
    assert host.s3_object(f"{cached(plan)}/COMPLETE") is None


def test_a_put_object_failure_other_than_precondition_failed_is_reported_as_it_is(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan, BootOptions(artifact_cache=CACHE)), STUB_PUT_OBJECT_DENIED="1")
    assert result.returncode == 0, result.stdout  # the host serves its own export
    # The CLI's error line, as v2 writes it (aws/aws-cli 2.36.7, awscli/errorformat.py write_error), without
    # its "aws: [ERROR]: " prefix.
    assert ("export-model: not published: An error occurred (AccessDenied) when calling the PutObject "
            "operation: Access Denied") in result.stdout
    assert "another host published first" not in result.stdout
    assert host.s3_keys(cached(plan)) == []  # the upload without COMPLETE is gone
