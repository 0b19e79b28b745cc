"""Boots on simulated hosts whose ``aws`` is the real AWS CLI (v1, from PyPI) against moto's
server on loopback (S3, Secrets Manager) and a recorder (CloudFormation, Auto Scaling) that
checks every request against botocore's own service model (tests/harness/aws.py): every AWS call
the boot scripts make, made for real. The docker CLI is the real one too (tests/boot/conftest.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from bootsim import FAKE_HF_TOKEN, HOOK, SIGNAL, SMALL_MODEL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.render.boot import API_KEYS_UNIT, RUN_REPLICA, SIGNAL_ID_LIMIT, BootOptions, render_boot_script
from neuron_serving.render.router import KEYS_FILE
from neuron_serving.userdata import api_keys
from tests.harness.aws import AwsEmulator

MakeHost = Callable[..., Host]
CACHE = "s3://cache-bucket/exports"


def _ok(aws: AwsEmulator, operation: str) -> list[dict[str, object]]:
    calls = aws.recorder.calls(operation)
    assert all(c.valid and c.ok for c in calls), [(c.params, c.errors) for c in calls]
    return [c.params for c in calls]


def test_a_fleet_exports_once_publishes_to_s3_and_the_next_host_downloads_and_both_signal(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = render_boot_script(plan, BootOptions(artifact_cache=CACHE, signal=SIGNAL))
    first, second = aws_host(1), aws_host(1)
    assert first.boot(script).returncode == 0, first.path("/var/log/neuron-serving/boot.log").read_text()
    assert second.boot(script).returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    assert [len(h.exports()) for h in (first, second)] == [1, 0]
    key = TGI.export_key(plan, TGI_3_3_5)
    complete = aws.get_object("cache-bucket", f"exports/{key}/COMPLETE")
    assert complete == f"exports/{key}/{first.instance_id}\n".encode()
    uploaded = aws.list_objects("cache-bucket", f"exports/{key}/{first.instance_id}/")
    assert f"exports/{key}/{first.instance_id}/checkpoint/weights/tp0_sharded_checkpoint.safetensors" in uploaded
    signals = _ok(aws, "SignalResource")
    assert [(s["Status"], s["UniqueId"]) for s in signals] == [("SUCCESS", first.instance_id),
                                                              ("SUCCESS", second.instance_id)]
    assert {(s["StackName"], s["LogicalResourceId"]) for s in signals} == {(SIGNAL.stack_name, SIGNAL.logical_id)}


def test_of_two_racing_exporters_the_conditional_write_lets_exactly_one_publish(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = render_boot_script(plan, BootOptions(artifact_cache=CACHE))
    hosts = [aws_host(1), aws_host(1)]
    boots = [h.boot_async(script, STUB_EXPORT_SECONDS="2") for h in hosts]
    assert [b.wait(timeout=120) for b in boots] == [0, 0]
    key = TGI.export_key(plan, TGI_3_3_5)
    winner = aws.get_object("cache-bucket", f"exports/{key}/COMPLETE").decode().strip().rsplit("/", 1)[-1]
    prefixes = {k.split("/")[2] for k in aws.list_objects("cache-bucket", f"exports/{key}/")}
    assert prefixes == {"COMPLETE", winner}  # the loser's upload is removed
    loser = next(h for h in hosts if h.instance_id != winner)
    assert "PreconditionFailed" in loser.path("/var/log/neuron-serving/export.log").read_text()


def test_the_token_comes_from_secrets_manager_and_reaches_only_the_hub_download(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    arn = aws.create_secret("neuron-serving/hf-token", FAKE_HF_TOKEN)
    plan = make_plan("trn1.32xlarge", 8)
    host = aws_host(16)
    result = host.boot(render_boot_script(plan, BootOptions(hf_token_secret=arn)))
    assert result.returncode == 0, result.stdout
    assert host.path("/etc/neuron-serving/hf-token.env").read_text() == f"HF_TOKEN={FAKE_HF_TOKEN}\n"
    with_token = [c["Entrypoint"] for c in host.containers() if f"HF_TOKEN={FAKE_HF_TOKEN}" in c["Env"]]
    assert with_token == [["huggingface-cli"]]
    assert FAKE_HF_TOKEN not in result.stdout


def test_a_warm_pool_boot_records_heartbeats_then_completes_its_lifecycle_action(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    host = aws_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(render_boot_script(make_plan("inf2.xlarge", model_id=SMALL_MODEL), options),
                       STUB_LIFECYCLE_STATE="InService", STUB_EXPORT_SECONDS="3",
                       NEURON_SERVING_HEARTBEAT_SECONDS="1", STUB_SLEEP_MAX="1")
    assert result.returncode == 0, result.stdout
    beats = _ok(aws, "RecordLifecycleActionHeartbeat")
    assert len(beats) >= 1
    assert beats[0] == {"LifecycleHookName": HOOK.hook_name, "AutoScalingGroupName": HOOK.group_name,
                        "InstanceId": host.instance_id}
    assert [c["LifecycleActionResult"] for c in _ok(aws, "CompleteLifecycleAction")] == ["CONTINUE"]


def test_a_failure_signal_carries_its_reason_within_the_apis_limit(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    host = aws_host(1)
    result = host.boot(render_boot_script(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(signal=SIGNAL)),
                       STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    [signal] = _ok(aws, "SignalResource")
    assert signal["Status"] == "FAILURE"
    unique_id = str(signal["UniqueId"])
    assert unique_id.startswith(f"{host.instance_id} export-model: neuronx-cc: error")
    assert len(unique_id) <= SIGNAL_ID_LIMIT


def test_api_keys_reach_the_router_as_digests_and_no_secret_reaches_an_argument_a_log_or_a_replica(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    alice, bob = api_keys.new_key(), api_keys.new_key()
    keys = aws.create_secret("neuron-serving/api-keys", json.dumps({"alice": api_keys.stored(alice), "bob": bob}))
    token = aws.create_secret("neuron-serving/hf-token", FAKE_HF_TOKEN)
    aws.put_s3_uri("s3://assets/api_keys.py", Path(api_keys.__file__).read_bytes())
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    options = BootOptions(hf_token_secret=token, api_keys_secret=keys, api_keys_program="s3://assets/api_keys.py",
                          signal=SIGNAL)
    host = aws_host(1)

    result = host.boot(render_boot_script(plan, options))

    assert result.returncode == 0, result.stdout
    assert "api-keys: 2 key(s) in force: alice, bob" in result.stdout
    keys_file = host.path(KEYS_FILE)
    assert keys_file.read_text() == api_keys.keys_file_text([api_keys.digest(alice), api_keys.digest(bob)])
    assert keys_file.stat().st_mode & 0o777 == 0o600
    assert f"-f {KEYS_FILE}" in host.path("/etc/haproxy/haproxy.cfg").read_text()
    systemctl = host.calls("systemctl")
    assert ["enable", f"{API_KEYS_UNIT}.timer"] in systemctl
    assert systemctl.index(["start", f"{API_KEYS_UNIT}.timer"]) > systemctl.index(["restart", "haproxy"])
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    # Nothing secret in any argument, log, file the host wrote but the two that must hold them, or
    # a replica's environment.
    written = [p for p in host.root.rglob("*") if p.is_file() and p != host.path("/etc/neuron-serving/hf-token.env")]
    for secret in (alice, bob, FAKE_HF_TOKEN):
        assert secret not in result.stdout + host.calls_log.read_text()
        assert all(secret not in p.read_text(errors="replace") for p in written), secret
        replicas = [c for c in host.containers() if str(c.get("name")).startswith("replica-")]
        assert replicas and all(secret not in " ".join(c["Env"]) for c in replicas)
    assert all(key not in json.dumps(c) for c in host.containers() for key in (alice, bob))


def test_a_boot_whose_api_keys_cannot_be_read_fails_naming_the_step(
    aws_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    aws.put_s3_uri("s3://assets/api_keys.py", Path(api_keys.__file__).read_bytes())
    options = BootOptions(api_keys_secret="missing", api_keys_program="s3://assets/api_keys.py", signal=SIGNAL)
    host = aws_host(1)

    result = host.boot(render_boot_script(make_plan("inf2.xlarge", model_id=SMALL_MODEL), options))

    assert result.returncode != 0
    assert "could not read secret missing" in result.stdout
    [signal] = _ok(aws, "SignalResource")
    assert (signal["Status"], str(signal["UniqueId"]).split(":")[0]) == ("FAILURE", f"{host.instance_id} api-keys")
    assert not host.path(KEYS_FILE).exists()
