"""Boots that read what AWS was asked. Every simulated host's ``aws`` is the real AWS CLI v2 (2.36.7, as the
hosts run it) against moto's server on loopback (S3, Secrets Manager, EC2, CloudWatch) and a recorder
(CloudFormation, Auto Scaling) that checks every request against the CLI's own service models
(tests/harness/aws.py); these tests look at moto's objects and tags and at the recorder's checks. The
docker CLI is the real one too (tests/boot/conftest.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bootsim import FAKE_HF_TOKEN, HOOK, MARKER, MONITORING, SIGNAL, SMALL_MODEL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.metrics import DEFAULT_NAMESPACE, EXPORT_PUBLISH_FAILURES
from neuron_serving.plan.phases import (
    BOOT_PHASE_METRIC,
    DETAIL_TAG,
    FAILED,
    PHASE_DIMENSION,
    PHASE_TAG,
    PUBLISH_TAG,
    READY,
    SECONDS_TAG,
    SINCE_TAG,
    WARMED,
    parse_seconds,
)
from neuron_serving.render.boot import API_KEYS_UNIT, RUN_REPLICA, SIGNAL_ID_LIMIT
from neuron_serving.render.boot_options import BootOptions
from neuron_serving.render.router import KEYS_FILE
from neuron_serving.userdata import api_keys
from tests.harness.aws import AwsEmulator
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
CACHE = "s3://cache-bucket/exports"


BUCKET = "cache-bucket"


def _manifest_of_objects(aws: AwsEmulator, prefix: str) -> list[str]:
    """What a manifest of the objects below ``prefix`` lists: ``sha256sum``'s line for each,
    key relative to ``prefix``, sorted."""
    return sorted(f"{hashlib.sha256(aws.get_object(BUCKET, key) or b'').hexdigest()}  {key.removeprefix(prefix)}"
                  for key in aws.list_objects(BUCKET, prefix))


def _published(aws: AwsEmulator, key: str) -> tuple[str, list[str]]:
    """The upload ``exports/<key>/COMPLETE`` names, and its manifest."""
    complete = aws.get_object(BUCKET, f"exports/{key}/COMPLETE")
    assert complete is not None
    upload, *manifest = complete.decode().splitlines()
    return upload, manifest


def _ok(aws: AwsEmulator, operation: str) -> list[dict[str, object]]:
    calls = aws.recorder.calls(operation)
    assert all(c.valid and c.ok for c in calls), [(c.params, c.errors) for c in calls]
    return [c.params for c in calls]


# trn1.2xlarge: a network of 12.5 Gbps, whose transfer config AWS CLI v2 once refused (issue 37, defect 1).
@pytest.mark.parametrize("instance_type", ["inf2.xlarge", "trn1.2xlarge"])
def test_a_fleet_exports_once_publishes_to_s3_and_the_next_host_downloads_and_both_signal(
    make_host: Callable[[int], Host], aws: AwsEmulator, instance_type: str,
) -> None:
    plan = make_plan(instance_type, model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE, signal=SIGNAL))
    first, second = make_host(1), make_host(1)
    assert first.boot(script).returncode == 0, first.path("/var/log/neuron-serving/boot.log").read_text()
    assert second.boot(script).returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    assert [len(h.exports()) for h in (first, second)] == [1, 0]
    key = TGI.export_key(plan, TGI_3_3_5)
    # COMPLETE names the first host's upload and lists every object of it with its SHA-256.
    upload, manifest = _published(aws, key)
    assert upload == f"exports/{key}/{first.instance_id}"
    assert manifest == _manifest_of_objects(aws, f"{upload}/")
    assert any(line.endswith("  checkpoint/weights/tp0_sharded_checkpoint.safetensors") for line in manifest)
    assert second.path(f"/var/lib/neuron-serving/exports/{key}/{MARKER}").read_text().startswith(
        f"downloaded from s3://cache-bucket/{upload}/ at ")
    signals = _ok(aws, "SignalResource")
    assert [(s["Status"], s["UniqueId"]) for s in signals] == [("SUCCESS", first.instance_id),
                                                              ("SUCCESS", second.instance_id)]
    assert {(s["StackName"], s["LogicalResourceId"]) for s in signals} == {(SIGNAL.stack_name, SIGNAL.logical_id)}


def test_of_two_racing_exporters_the_conditional_write_lets_exactly_one_publish(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    hosts = [make_host(1), make_host(1)]
    boots = [h.boot_async(script, STUB_EXPORT_SECONDS="5") for h in hosts]
    assert [b.wait(timeout=120) for b in boots] == [0, 0]
    key = TGI.export_key(plan, TGI_3_3_5)
    upload, manifest = _published(aws, key)
    winner = upload.rsplit("/", 1)[-1]
    prefixes = {k.split("/")[2] for k in aws.list_objects("cache-bucket", f"exports/{key}/")}
    assert prefixes == {"COMPLETE", winner}  # the loser's upload is removed
    assert manifest == _manifest_of_objects(aws, f"{upload}/")
    loser = next(h for h in hosts if h.instance_id != winner)
    assert "PreconditionFailed" in loser.path("/var/log/neuron-serving/export.log").read_text()


def test_the_token_comes_from_secrets_manager_and_reaches_only_the_hub_download(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    arn = aws.create_secret("team/hf-token", FAKE_HF_TOKEN)
    plan = make_plan("trn1.32xlarge", 8)
    host = make_host(16)
    result = host.boot(boot_of(plan, BootOptions(hf_token_secret=arn)))
    assert result.returncode == 0, result.stdout
    assert host.path("/etc/neuron-serving/hf-token.env").read_text() == f"HF_TOKEN={FAKE_HF_TOKEN}\n"
    with_token = [c["Entrypoint"] for c in host.containers() if f"HF_TOKEN={FAKE_HF_TOKEN}" in c["Env"]]
    assert with_token == [["huggingface-cli"]]
    assert FAKE_HF_TOKEN not in result.stdout


def test_a_warm_pool_boot_records_heartbeats_then_completes_its_lifecycle_action(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), options),
                       STUB_LIFECYCLE_STATE="InService", STUB_EXPORT_SECONDS="3",
                       NEURON_SERVING_HEARTBEAT_SECONDS="1", STUB_SLEEP_MAX="1")
    assert result.returncode == 0, result.stdout
    beats = _ok(aws, "RecordLifecycleActionHeartbeat")
    assert len(beats) >= 1
    assert beats[0] == {"LifecycleHookName": HOOK.hook_name, "AutoScalingGroupName": HOOK.group_name,
                        "InstanceId": host.instance_id}
    assert [c["LifecycleActionResult"] for c in _ok(aws, "CompleteLifecycleAction")] == ["CONTINUE"]


def test_a_failure_signal_carries_its_reason_within_the_apis_limit(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(signal=SIGNAL)),
                       STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    [signal] = _ok(aws, "SignalResource")
    assert signal["Status"] == "FAILURE"
    unique_id = str(signal["UniqueId"])
    assert unique_id.startswith(f"{host.instance_id} export-model: neuronx-cc: error")
    assert len(unique_id) <= SIGNAL_ID_LIMIT


TAMPERING = {
    # What a rogue host may still do to a published upload (its role may put and delete objects
    # below exports/, though never COMPLETE), each followed by the lines of the comparison that
    # name the file: the manifest's line, or (indented) the download's.
    # The compiled graph: check-export requires it but cannot judge its bytes.
    "changed": ("model.pt", lambda aws, upload: aws.put_object(BUCKET, f"{upload}/model.pt", b"poisoned graph"),
                {"manifest", "download"}),
    "added": ("sitecustomize.py", lambda aws, upload: aws.put_object(BUCKET, f"{upload}/sitecustomize.py",
                                                                     "import os\n"),
              {"download"}),
    "removed": ("tokenizer.json", lambda aws, upload: aws.client("s3").delete_object(
        Bucket=BUCKET, Key=f"{upload}/tokenizer.json"), {"manifest"}),
}


@pytest.mark.parametrize("tampering", TAMPERING)
def test_an_upload_altered_after_publication_is_refused_naming_the_file_and_the_host_exports_itself(
    make_host: Callable[[int], Host], aws: AwsEmulator, tampering: str,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    first, second = make_host(1), make_host(1)
    assert first.boot(script).returncode == 0, first.path("/var/log/neuron-serving/boot.log").read_text()
    key = TGI.export_key(plan, TGI_3_3_5)
    complete = aws.get_object(BUCKET, f"exports/{key}/COMPLETE")
    upload, manifest = _published(aws, key)
    name, tamper, columns = TAMPERING[tampering]
    tamper(aws, upload)
    result = second.boot(script)
    assert result.returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    # Never served: the second host exported for itself, and said which file differs.
    assert len(second.exports()) == 1
    assert second.path(f"/var/lib/neuron-serving/exports/{key}/{MARKER}").read_text().startswith("exported at ")
    log = second.path("/var/log/neuron-serving/export.log").read_text()
    assert f"s3://{BUCKET}/{upload}/ differs from the manifest in COMPLETE" in log
    named = [line for line in log.splitlines() if line.endswith(f"  {name}")]
    assert {"download" if line.startswith("\t") else "manifest" for line in named} == columns
    assert f"s3://{BUCKET}/{upload}/ differs from the manifest in COMPLETE; exporting here" in result.stdout
    # COMPLETE still names the first upload (the second host could not publish), and versioning
    # kept whatever was overwritten or deleted.
    assert aws.get_object(BUCKET, f"exports/{key}/COMPLETE") == complete
    assert "PreconditionFailed" in log
    assert aws.list_objects(BUCKET, f"exports/{key}/{second.instance_id}/") == []
    if tampering != "added":
        original = next(line for line in manifest if line.endswith(f"  {name}")).split()[0]
        assert hashlib.sha256(aws.versions(BUCKET, f"{upload}/{name}")[-1]).hexdigest() == original


def test_an_object_added_outside_the_upload_directory_makes_the_next_host_export_not_fail(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    # The real CLI will not write "<upload>/../x" outside the download's directory: it skips
    # the object and exits 2. The host refuses the upload and serves its own export.
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    first, second = make_host(1), make_host(1)
    assert first.boot(script).returncode == 0
    upload, _ = _published(aws, TGI.export_key(plan, TGI_3_3_5))
    aws.put_object(BUCKET, f"{upload}/../../escape.sh", "echo poisoned\n")
    result = second.boot(script)
    assert result.returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    assert len(second.exports()) == 1
    assert f"s3://{BUCKET}/{upload}/ could not be downloaded" in result.stdout
    assert "File references a parent directory" in second.path("/var/log/neuron-serving/export.log").read_text()
    assert not any(p.name == "escape.sh" for p in second.root.parent.rglob("*"))


def _aws_cli(aws: AwsEmulator, *args: str) -> subprocess.CompletedProcess[str]:
    """The real AWS CLI, as a host runs it, against this test's emulator."""
    env = {**os.environ, **aws.env, "AWS_DEFAULT_REGION": aws.region}
    return subprocess.run([aws.aws_executable(), *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_published_marker_cannot_be_replaced_by_another_conditional_write(
    make_host: Callable[[int], Host], aws: AwsEmulator, tmp_path: Path,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    first = make_host(1)
    assert first.boot(boot_of(plan, BootOptions(artifact_cache=CACHE))).returncode == 0
    key = TGI.export_key(plan, TGI_3_3_5)
    complete = aws.get_object(BUCKET, f"exports/{key}/COMPLETE")
    forged = tmp_path / "COMPLETE"
    forged.write_text(f"exports/{key}/i-0rogue0000000000\n")
    # The write a host's role allows on a marker (NeuronArtifactCache.grant_cache denies any other).
    result = _aws_cli(aws, "s3api", "put-object", "--bucket", BUCKET, "--key", f"exports/{key}/COMPLETE",
                      "--body", str(forged), "--if-none-match", "*")
    assert result.returncode != 0
    assert "PreconditionFailed" in result.stderr
    assert aws.versions(BUCKET, f"exports/{key}/COMPLETE") == [complete]


def test_deleting_a_key_lets_the_next_host_export_and_publish_it_again(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    # The recovery an administrator runs (hosts may not delete markers): in a versioned bucket
    # the deletes leave delete markers, and a conditional write succeeds over one.
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE))
    first, second = make_host(1), make_host(1)
    assert first.boot(script).returncode == 0
    key = TGI.export_key(plan, TGI_3_3_5)
    for stale in aws.list_objects(BUCKET, f"exports/{key}/"):
        aws.client("s3").delete_object(Bucket=BUCKET, Key=stale)
    assert second.boot(script).returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    assert len(second.exports()) == 1
    upload, manifest = _published(aws, key)
    assert upload == f"exports/{key}/{second.instance_id}"
    assert manifest == _manifest_of_objects(aws, f"{upload}/")
    assert len(aws.versions(BUCKET, f"exports/{key}/COMPLETE")) == 2


def test_api_keys_reach_the_router_as_digests_and_no_secret_reaches_an_argument_a_log_or_a_replica(
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    alice, bob = api_keys.new_key(), api_keys.new_key()
    keys = aws.create_secret("neuron-serving/api-keys", json.dumps({"alice": api_keys.stored(alice), "bob": bob}))
    token = aws.create_secret("team/hf-token", FAKE_HF_TOKEN)
    aws.put_s3_uri("s3://assets/api_keys.py", Path(api_keys.__file__).read_bytes())
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    options = BootOptions(hf_token_secret=token, api_keys_secret=keys, signal=SIGNAL)
    host = make_host(1)

    result = host.boot(boot_of(plan, options))

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
    make_host: Callable[[int], Host], aws: AwsEmulator,
) -> None:
    aws.put_s3_uri("s3://assets/api_keys.py", Path(api_keys.__file__).read_bytes())
    options = BootOptions(api_keys_secret="missing", signal=SIGNAL)
    host = make_host(1)

    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), options))

    assert result.returncode != 0
    assert "could not read secret missing" in result.stdout
    [signal] = _ok(aws, "SignalResource")
    assert (signal["Status"], str(signal["UniqueId"]).split(":")[0]) == ("FAILURE", f"{host.instance_id} api-keys")
    assert not host.path(KEYS_FILE).exists()


# --- boot progress: the phase as tags on the host's own instance (report-phase) ---------------------------------

def _phase_tags(aws: AwsEmulator, host: Host) -> tuple[str, str, str]:
    """The host's phase, since and detail, as its moto instance carries them."""
    tags = aws.instance_tags(host.instance_id)
    return tags[PHASE_TAG], tags[SINCE_TAG], tags[DETAIL_TAG]


def test_a_boot_ends_ready_on_its_own_instance_after_reporting_each_phase(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host, other = make_host(1), make_host(1)
    started = datetime.now(UTC).replace(microsecond=0)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(signal=SIGNAL)))
    assert result.returncode == 0, result.stdout
    phase, since, detail = _phase_tags(aws, host)
    assert (phase, detail) == (READY, "1 of 1 ready")
    assert started <= datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) <= datetime.now(UTC)
    # Every report reached EC2 (none was refused), in the order of the boot.
    assert [p for p, _ in host.phases()] == ["check-devices", "install-tools", "pull-image", "export-model",
                                             "download-checkpoint", "export-model", "start-replicas", "router",
                                             "wait-ready", "wait-ready", READY]
    assert "not reported (exit" not in host.path("/var/log/neuron-serving/boot.log").read_text()
    # Only its own instance.
    assert aws.instance_tags(other.instance_id) == {}


def test_a_cache_hit_reports_download_export_and_ends_ready(make_host: Callable[..., Host], aws: AwsEmulator) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    script = boot_of(plan, BootOptions(artifact_cache=CACHE, signal=SIGNAL))
    first, second = make_host(1), make_host(1)
    assert first.boot(script).returncode == 0
    assert second.boot(script).returncode == 0, second.path("/var/log/neuron-serving/boot.log").read_text()
    upload, _ = _published(aws, TGI.export_key(plan, TGI_3_3_5))
    assert ("download-export", f"s3://{BUCKET}/{upload}/") in second.phases()
    assert "download-export" not in [p for p, _ in first.phases()]
    assert [_phase_tags(aws, h)[0] for h in (first, second)] == [READY, READY]


def test_a_failed_export_leaves_failed_and_the_compilers_error_on_the_instance(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(signal=SIGNAL)),
                       STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    phase, _, detail = _phase_tags(aws, host)
    assert (phase, detail) == (FAILED, "export-model: neuronx-cc: error: compilation failed")


def test_a_warm_pool_host_is_warmed_until_its_start_makes_it_ready(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    plan = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="Warmed:Stopped")
    assert result.returncode == 0, result.stdout
    assert _phase_tags(aws, host)[0] == WARMED
    # Started from the pool: no user data; systemd starts the units, then the ready service.
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    assert host.run_unit("neuron-serving-ready.service", STUB_LIFECYCLE_STATE="InService") == 0
    phase, _, detail = _phase_tags(aws, host)
    assert (phase, detail) == (READY, "1 of 1 ready")
    assert [c["LifecycleActionResult"] for c in _ok(aws, "CompleteLifecycleAction")] == ["CONTINUE", "CONTINUE"]


def test_create_tags_refused_by_iam_does_not_fail_the_boot(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    # moto's IAM enforcement: the host's identity may describe instances but not tag them.
    iam = aws.client("iam")
    iam.create_user(UserName="host")
    iam.put_user_policy(UserName="host", PolicyName="no-tags", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["ec2:DescribeInstances", "s3:GetObject"], "Resource": "*"}]}))
    key = iam.create_access_key(UserName="host")["AccessKey"]
    host = make_host(1)
    host.env.update(AWS_ACCESS_KEY_ID=key["AccessKeyId"], AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
    # The stack's asset publishing, before the host's identity is the only one moto knows.
    script = host.publish_bundle(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(signal=SIGNAL)))
    with aws.moto.iam_enforced():
        result = host.boot(script)
    assert result.returncode == 0, result.stdout
    log = host.path("/var/log/neuron-serving/boot.log").read_text()
    assert "UnauthorizedOperation" in log or "AccessDenied" in log, log
    # AWS CLI v2 exits 254 for an error the service returned (aws/aws-cli 2.36.7, awscli/constants.py
    # CLIENT_ERROR_RC; v1 exits 255).
    assert "report-phase: ready not reported (exit 254)" in log
    assert [s["Status"] for s in _ok(aws, "SignalResource")] == ["SUCCESS"]
    assert aws.instance_tags(host.instance_id) == {}


# --- the phases' times as CloudWatch metrics (report-phase, PutMetricData) -----------------------------------------

def test_a_monitored_boot_puts_each_phase_it_went_through_in_cloudwatch(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL),
                               BootOptions(signal=SIGNAL, monitoring=MONITORING)), STUB_READY_AFTER="2",
                       STUB_SLEEP_MAX="1")
    assert result.returncode == 0, result.stdout
    lines = host.phase_lines()
    cloudwatch = aws.client("cloudwatch")
    listed = cloudwatch.list_metrics(Namespace=DEFAULT_NAMESPACE, MetricName=BOOT_PHASE_METRIC)["Metrics"]
    assert {tuple((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in listed} == {
        (("Service", MONITORING.service), (PHASE_DIMENSION, name)) for name, *_ in lines}
    ended = datetime.strptime(lines[-1][2], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    for name in ("install-tools", "export-model", "wait-ready"):
        [point] = cloudwatch.get_metric_statistics(
            Namespace=DEFAULT_NAMESPACE, MetricName=BOOT_PHASE_METRIC, Statistics=["Sum", "SampleCount"], Period=3600,
            Dimensions=[{"Name": "Service", "Value": MONITORING.service}, {"Name": PHASE_DIMENSION, "Value": name}],
            StartTime=ended - timedelta(hours=1), EndTime=ended + timedelta(hours=1))["Datapoints"]
        assert (point["Sum"], point["SampleCount"]) == (sum(s for n, _, _, s in lines if n == name), 1)
        assert point["Unit"] == "Seconds"
    # wait-ready slept twice, a second each, and the instance's tag carries every phase too.
    seconds = parse_seconds(aws.instance_tags(host.instance_id)[SECONDS_TAG])
    assert seconds["wait-ready"] >= 2
    assert list(seconds) == list(dict.fromkeys(n for n, *_ in lines))


def test_cloudwatch_out_of_reach_does_not_fail_the_boot(make_host: Callable[..., Host], aws: AwsEmulator) -> None:
    host = make_host(1)
    # Nothing listens on the discard port of loopback: every connection is refused.
    host.env["AWS_ENDPOINT_URL_CLOUDWATCH"] = "http://127.0.0.1:9"
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL),
                               BootOptions(signal=SIGNAL, monitoring=MONITORING)))
    assert result.returncode == 0, result.stdout
    log = host.path("/var/log/neuron-serving/boot.log").read_text()
    # AWS CLI v2 exits 255 when it cannot connect (aws/aws-cli 2.36.7, awscli/errorhandler.py: a
    # connection error is none of the errors it maps to 252-254, so GENERAL_ERROR_RC).
    assert "report-phase: the boot's phase times not put as metrics (exit 255)" in log
    assert [s["Status"] for s in _ok(aws, "SignalResource")] == ["SUCCESS"]


# --- a failed publish to the artifact cache (report-publish: CreateTags, PutMetricData) ----------------------------

def test_a_publish_to_a_bucket_that_does_not_exist_is_tagged_failed_and_counted_in_cloudwatch(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    result = host.boot(boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL),
                               BootOptions(artifact_cache="s3://no-such-bucket/exports", signal=SIGNAL,
                                           monitoring=MONITORING)))
    assert result.returncode == 0, result.stdout  # it serves its own export
    tag = aws.instance_tags(host.instance_id)[PUBLISH_TAG]
    # The real CLI's error: s3 sync lists the destination first, in a bucket S3 (moto) does not have.
    assert tag == ("failed: fatal error: An error occurred NoSuchBucket when calling the ListObjectsV2 operation: "
                   "The specified bucket does not exist")
    cloudwatch = aws.client("cloudwatch")
    listed = cloudwatch.list_metrics(Namespace=DEFAULT_NAMESPACE, MetricName=EXPORT_PUBLISH_FAILURES)["Metrics"]
    service = ("Service", MONITORING.service)
    assert sorted(tuple((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in listed) == sorted([
        (service,), (service, ("InstanceId", host.instance_id))])
    now = datetime.now(UTC)
    # Per instance: moto 5.2.5 takes the dimensions asked for as a subset (moto/cloudwatch/models.py,
    # MetricDatumBase.filter), so asked for Service alone it would add the per-instance datum too, which
    # CloudWatch, matching the whole set, does not.
    [point] = cloudwatch.get_metric_statistics(
        Namespace=DEFAULT_NAMESPACE, MetricName=EXPORT_PUBLISH_FAILURES, Statistics=["Sum"], Period=3600,
        Dimensions=[{"Name": "Service", "Value": MONITORING.service},
                    {"Name": "InstanceId", "Value": host.instance_id}],
        StartTime=now - timedelta(hours=1), EndTime=now + timedelta(hours=1))["Datapoints"]
    assert (point["Sum"], point["Unit"]) == (1, "Count")
    assert "report-publish" not in host.path("/var/log/neuron-serving/boot.log").read_text()
