"""Synthesized stacks booted on the host twin (tests/twin/host.py): real cloud-init runs the launch
template's user data on Ubuntu 22.04 with systemd as PID 1, and each host must signal SUCCESS (or, for
a fault, the failure a user would want to read) and answer a completion through its router."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tests.cdk.conftest import assemblies
from tests.harness.userdata import bundle_uri, publish_bundle
from tests.twin.conftest import World, failure_report, request

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "boot"))
from test_boot_synthesized import Launch, launch_user_data, user_data

FLEET = {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"}
SECURE = {"internet_facing": "true", "allowed_cidrs": "203.0.113.0/24", "api_keys": "true",
          "certificate_arn": "arn:aws:acm:us-east-2:123456789012:certificate/0a1b2c3d-aaaa-bbbb-cccc-000000000000"}


def stage(world: World, launch: Launch) -> None:
    """What CloudFormation and the CDK's asset publishing make before an instance boots: the launch
    template with the stack's values in its metadata, the artifact cache bucket and the boot bundle
    the user data downloads."""
    launch.deploy(world.aws)
    cache = launch.value("CACHE_BUCKET")
    if cache is not None and cache not in world.aws.bucket_names():
        world.aws.create_bucket(cache, versioned=True)
    publish_bundle(world.aws, launch.script, *assemblies())


def completion(port: int, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """A chat completion through the router (no model named: each engine's fake serves its own)."""
    status, body = request(f"http://127.0.0.1:{port}/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "The twin says"}], "max_tokens": 4},
                           headers=headers)
    return status, json.loads(body or b"{}")


def serves(port: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    status, answer = completion(port, headers)
    assert status == 200, answer
    assert answer["choices"], answer
    return answer


def signals(world: World) -> list[tuple[str, str]]:
    return [(c.params["Status"], str(c.params["UniqueId"])) for c in world.aws.recorder.calls("SignalResource")]


def boot(world: World, launch: Launch, plan: Any, **kwargs: Any) -> Any:
    twin, imds, image = world.twin(launch.script, plan, **kwargs)
    twin.start()
    return twin, imds, image


def boots_and_serves(world: World, context: dict[str, str]) -> tuple[Any, Any, float]:
    launch, _, plan = user_data(context)
    stage(world, launch)
    started = time.monotonic()
    twin, _, image = boot(world, launch, plan)
    status = twin.wait_boot_script(timeout=300)
    took = time.monotonic() - started
    assert status == "done", failure_report(twin)
    assert signals(world)[-1] == ("SUCCESS", twin.instance_id)
    assert sorted(image.serving) == [f"replica-{r.index}" for r in plan.replicas]
    serves(plan.router_port)
    return twin, plan, took


def test_the_default_stack_boots_signals_success_and_serves_within_three_minutes(world: World) -> None:
    twin, _, took = boots_and_serves(world, {})
    # systemd's own view: every unit the boot enabled is active, none failed.
    jobs = twin.run("systemctl", "list-jobs", "--no-legend").stdout
    assert twin.wait_system(timeout=60) == "running", jobs + twin.run("systemctl", "--failed", "--no-legend").stdout
    assert took < 180, f"the twin boot of the default stack took {took:.0f} s (budget: 180 s)"
    # The metrics publisher runs the DLAMI's neuron-monitor (the stand-in of aws-neuronx-tools).
    assert twin.run("systemctl", "is-active", "neuron-serving-metrics").stdout.strip() == "active"
    commands = twin.run("sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
    assert "/opt/aws/neuron/bin/neuron-monitor -c" in commands, commands


def test_a_vllm_stack_boots_and_serves(world: World) -> None:
    boots_and_serves(world, {"engine": "vllm"})


def test_an_internet_facing_nxdi_stack_boots_and_serves_a_key_holder_with_vllm_as_each_replicas_pid_1(
        world: World) -> None:
    # The nxdi stack's defaults: the SDK 2.28 image, whose driver bound (below 2.29) the twin's aws-neuronx-dkms
    # 2.27.4.0 meets, a prefix cache, and each replica's container started with `--entrypoint vllm`; API keys on.
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_13_0, NXDI
    from neuron_serving.userdata import api_keys

    launch, _, plan = user_data({**SECURE, "engine": "nxdi"})
    stage(world, launch)
    key = api_keys.new_key()
    world.aws.create_secret(launch.value("API_KEYS_SECRET"), json.dumps({"alice": api_keys.stored(key)}))
    twin, _, image = boot(world, launch, plan)
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    assert signals(world)[-1] == ("SUCCESS", twin.instance_id)
    assert sorted(image.serving) == [r.name for r in plan.replicas]
    assert completion(plan.router_port)[0] == 401
    assert serves(plan.router_port, {"Authorization": f"Bearer {key}"})["model"] == plan.model_id
    created = {r["container"]["name"]: r["container"] for r in world.engines[0].records if "container" in r}
    for replica in plan.replicas:
        container = created[replica.name]
        assert container["Entrypoint"] == ["vllm"]
        assert container["Cmd"][:2] == ["serve", f"/models/{NXDI.export_key(plan, DLC_VLLM_0_13_0)}"]
        assert "--enable-prefix-caching" in container["Cmd"]


def test_an_nxdi_stack_with_an_eagle_draft_converts_it_in_the_image_compiles_it_in_and_serves(world: World) -> None:
    # Speculative decoding needs a contiguous KV cache (Nxdi.check_plan): prefix_caching=false. The draft comes from
    # the world's Hub and is converted by userdata/eagle-draft.py in the image's Python (tests/boot/inside.py).
    from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_13_0, NXDI

    twin, plan, _ = boots_and_serves(world, {"engine": "nxdi", "prefix_caching": "false",
                                             "speculative_model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"})
    key = NXDI.export_key(plan, DLC_VLLM_0_13_0)
    log = twin.run("cat", "/var/log/neuron-serving/export.log").stdout
    assert "eagle-draft: 3 tensors of " in log and ", with the LM head of " in log
    assert twin.run("ls", f"/var/lib/neuron-serving/exports/{key}/eagle-draft").stdout.split() == ["config.json"]
    created = {r["container"]["name"]: r["container"] for r in world.engines[0].records if "container" in r}
    for replica in plan.replicas:
        command = created[replica.name]["Cmd"]
        assert json.loads(command[command.index("--speculative-config") + 1]) == {
            "method": "eagle", "model": f"/models/{key}/eagle-draft", "num_speculative_tokens": 5}
        assert "--no-enable-prefix-caching" in command


def test_a_fleet_host_publishes_its_export_and_the_next_host_downloads_it_without_compiling(world: World) -> None:
    launch, _, plan = user_data(FLEET)
    stage(world, launch)
    first, _, _ = boot(world, launch, plan)
    assert first.wait_boot_script(timeout=300) == "done", failure_report(first)
    serves(plan.router_port)
    first.poweroff()
    second, _, _image = boot(world, launch, plan)
    assert second.wait_boot_script(timeout=300) == "done", failure_report(second)
    serves(plan.router_port)
    assert [s for s, _ in signals(world)] == ["SUCCESS", "SUCCESS"]
    assert "downloading s3://" in second.path("/var/log/neuron-serving/boot.log").read_text()
    compiled = [r for r in world.engines[1].records if r.get("kind") == "request"
                and "optimum-cli" in json.dumps((r.get("body") or {}).get("Entrypoint"))]
    assert compiled == []


def test_the_builder_exports_for_a_host_too_small_to_compile_which_then_serves(world: World) -> None:
    launches, plan = launch_user_data({"instance_type": "inf2.xlarge"})
    [builder_launch] = [s for name, s in launches.items() if "Builder" in name]
    [host_launch] = [s for name, s in launches.items() if "Builder" not in name]
    stage(world, builder_launch)
    builder, _, _ = world.twin(builder_launch.script, plan, instance_type="inf2.8xlarge", devices=1)
    builder.start()
    assert builder.wait_boot_script(timeout=300) == "done", failure_report(builder)
    [left] = world.aws.recorder.calls("TerminateInstanceInAutoScalingGroup")
    assert left.params["ShouldDecrementDesiredCapacity"] in (True, "true")
    builder.poweroff()
    stage(world, host_launch)
    host, _, _image = boot(world, host_launch, plan)
    assert host.wait_boot_script(timeout=300) == "done", failure_report(host)
    assert "waiting for the builder's export" in host.path("/var/log/neuron-serving/boot.log").read_text()
    serves(plan.router_port)


def test_a_reboot_brings_the_host_back_serving_without_rerunning_the_user_data(world: World) -> None:
    twin, plan, _ = boots_and_serves(world, {})
    twin.reboot()
    twin.wait_system()
    deadline = time.monotonic() + 120
    while completion(plan.router_port)[0] != 200 and time.monotonic() < deadline:
        time.sleep(2)
    serves(plan.router_port)
    log = twin.path("/var/log/neuron-serving/boot.log").read_text()
    assert log.count("step: metadata") == 1, "cloud-init ran the user data again"
    assert len(signals(world)) == 1


def test_a_replica_that_crashes_at_load_fails_the_boot_naming_it(world: World) -> None:
    launch, _, plan = user_data({})
    stage(world, launch)
    twin, _, image = world.twin(launch.script, plan, environment={"NEURON_SERVING_READY_SECONDS": "30"})
    image.knobs["TWIN_REPLICA_CRASH"] = "replica-1"
    twin.start()
    assert twin.wait_boot_script(timeout=300) == "failed wait-ready", failure_report(twin)
    [(status, reason)] = signals(world)
    assert status == "FAILURE"
    assert reason.startswith(f"{twin.instance_id} wait-ready: replica-1 not ready"), reason


def test_with_s3_unreachable_the_boot_fails_at_once_saying_why(world: World) -> None:
    # The host's files are the boot bundle, in the stack's assets bucket: without S3 there is no boot,
    # and the stack hears why within seconds rather than at the signal's timeout.
    launch, _, plan = user_data({})
    launch.deploy(world.aws)
    twin, _, _ = world.twin(launch.script, plan, environment={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"})
    twin.start()
    assert twin.wait_boot_script(timeout=300) == "failed bundle", failure_report(twin)
    [(status, reason)] = signals(world)
    assert status == "FAILURE"
    assert reason.startswith(f"{twin.instance_id} bundle: cannot download the boot bundle"), reason
    log = twin.path("/var/log/neuron-serving/boot.log").read_text()
    assert f"failed in step bundle: cannot download the boot bundle {bundle_uri(launch.script)}" in log


def test_an_internet_facing_stack_serves_api_keys_added_rotated_and_revoked_and_keeps_them_on_a_broken_secret(
        world: World) -> None:
    from neuron_serving.userdata import api_keys

    launch, _, plan = user_data(SECURE)
    stage(world, launch)
    alice, bob = api_keys.new_key(), api_keys.new_key()
    secret = launch.value("API_KEYS_SECRET")
    assert secret is not None
    world.aws.create_secret(secret, json.dumps({"alice": api_keys.stored(alice)}))
    twin, _, _ = boot(world, launch, plan)
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    port = plan.router_port

    def sync() -> None:
        # What neuron-serving-api-keys.timer does every minute.
        done = twin.run("systemctl", "start", "neuron-serving-api-keys.service")
        assert done.returncode == 0, done.stderr + twin.run("journalctl", "-u", "neuron-serving-api-keys",
                                                            "--no-pager").stdout

    def status(key: str) -> int:
        return completion(port, {"Authorization": f"Bearer {key}"})[0]

    assert (status(alice), status(bob), completion(port)[0]) == (200, 401, 401)
    world.aws.client("secretsmanager").put_secret_value(
        SecretId=secret, SecretString=json.dumps({"alice": api_keys.stored(alice), "bob": api_keys.stored(bob)}))
    sync()
    assert (status(alice), status(bob)) == (200, 200)
    rotated = api_keys.new_key()
    world.aws.client("secretsmanager").put_secret_value(
        SecretId=secret, SecretString=json.dumps({"alice": api_keys.stored(rotated), "bob": api_keys.stored(bob)}))
    sync()
    assert (status(alice), status(rotated), status(bob)) == (401, 200, 200)
    world.aws.client("secretsmanager").put_secret_value(
        SecretId=secret, SecretString=json.dumps({"alice": api_keys.stored(rotated)}))
    sync()
    assert (status(rotated), status(bob)) == (200, 401)
    assert twin.run("systemctl", "is-active", "neuron-serving-api-keys.timer").stdout.strip() == "active"
    # A secret that is not JSON: the keys in force stay, the unit fails, and the failure is counted
    # in the file the CloudWatch agent ships as metrics (the ApiKeySync alarm's; tests/cdk).
    world.aws.client("secretsmanager").put_secret_value(SecretId=secret, SecretString="not json")
    failed = twin.run("systemctl", "start", "neuron-serving-api-keys.service")
    assert failed.returncode != 0
    assert twin.run("systemctl", "is-failed", "neuron-serving-api-keys.service").stdout.strip() == "failed"
    assert (status(rotated), status(bob)) == (200, 401)
    journal = twin.run("journalctl", "-u", "neuron-serving-api-keys", "--no-pager").stdout
    assert "the secret is not JSON" in journal, journal
    [event] = [json.loads(line) for line in twin.path(api_keys.METRICS_FILE).read_text().splitlines()]
    assert event[api_keys.FAILURE_METRIC] == 1 and event["InstanceId"] == twin.instance_id
    shipped = json.loads(twin.path("/etc/neuron-serving/cloudwatch-agent.json").read_text())
    assert api_keys.METRICS_FILE in json.dumps(shipped)


def test_a_full_disk_fails_the_boot_saying_so_in_the_signal(world: World) -> None:
    launch, _, plan = user_data({})
    stage(world, launch)
    twin, _, _ = world.twin(launch.script, plan)
    # Room for the checkpoint's download (its files and huggingface-cli's metadata, a 4 KiB page each on
    # tmpfs), not for the export beside it: the compile fails, which is not retried.
    twin.limit_disk("/var/lib/neuron-serving", "72k")
    twin.start()
    assert twin.wait_boot_script(timeout=300) == "failed export-model", failure_report(twin)
    [(status, reason)] = signals(world)
    assert status == "FAILURE"
    # The signal keeps 64 characters (SignalResource UniqueId).
    assert reason.startswith(f"{twin.instance_id} export-model: disk full: /var/lib/neuron-"), reason


def test_a_warm_pool_host_is_prepared_stopped_and_started_and_then_serves(world: World) -> None:
    launch, _, plan = user_data({**FLEET, "warm_pool": "true"})
    stage(world, launch)
    twin, imds, image = world.twin(launch.script, plan)
    imds.set("autoscaling/target-lifecycle-state", "Warmed:Stopped")
    twin.start()
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    [prepared] = world.aws.recorder.calls("CompleteLifecycleAction")
    assert prepared.params["LifecycleActionResult"] == "CONTINUE"
    assert image.serving == {}, "a host in the warm pool serves nothing"
    assert signals(world) == []
    # The group stops it; a scale-out starts it again (cloud-init runs no user data then).
    twin.poweroff()
    imds.set("autoscaling/target-lifecycle-state", "InService")
    twin.start()
    deadline = time.monotonic() + 180
    while len(world.aws.recorder.calls("CompleteLifecycleAction")) < 2 and time.monotonic() < deadline:
        time.sleep(2)
    assert [c.params["LifecycleActionResult"] for c in world.aws.recorder.calls("CompleteLifecycleAction")] == [
        "CONTINUE", "CONTINUE"], failure_report(twin)
    assert sorted(image.serving) == [f"replica-{r.index}" for r in plan.replicas]
    serves(plan.router_port)
    assert twin.path("/var/log/neuron-serving/boot.log").read_text().count("step: metadata") == 1


def test_a_hub_that_fails_twice_then_answers_delays_the_boot_but_does_not_fail_it(world: World) -> None:
    from tests.harness.fake_hub import RESET

    launch, _, plan = user_data({})
    stage(world, launch)
    twin, _, _ = world.twin(launch.script, plan)
    # Two connections reset before any answer, as a flaky network does: the client retries neither
    # (tests/harness/fake_hub.py), the boot's export step does.
    world.hub.fail(2, status=RESET)
    twin.start()
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    assert signals(world) == [("SUCCESS", twin.instance_id)]
    export_log = twin.path("/var/log/neuron-serving/export.log").read_text()
    assert "download failed (attempt 1 of" in export_log and "download failed (attempt 2 of" in export_log
    assert sum(r.status == RESET for r in world.hub.requests) == 2
    serves(plan.router_port)
