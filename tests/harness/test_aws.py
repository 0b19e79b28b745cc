"""The REAL AWS CLI v2 (2.36.7, the wheel ``tests/harness/requirements-aws.txt`` installs) against the loopback
emulator of ``tests/harness/aws.py``: moto's server for S3 and Secrets Manager, the recorder for
CloudFormation and Auto Scaling. Each call is one the boot scripts make, run as they run it (bash).

Needs ``tests/harness/requirements-aws.txt`` installed: in the venv ``.tools/aws`` (then the test venv needs
boto3 only), or in the test venv itself. Without it these tests skip, or fail when ``CI`` is set, so CI cannot
pass by not running them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

_TOOLS = Path(os.environ.get("NEURON_SERVING_AWS_TOOLS") or Path(__file__).resolve().parents[2] / ".tools" / "aws")
_MISSING = [m for m in ("boto3",) + (() if (_TOOLS / "bin" / "aws").exists() else ("awscli", "moto", "flask"))
            if importlib.util.find_spec(m) is None]
if _MISSING:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs {_MISSING}: pip install -r tests/harness/requirements-aws.txt", pytrace=False)
    pytest.skip(f"pip install -r tests/harness/requirements-aws.txt (missing {_MISSING})", allow_module_level=True)

import botocore.config  # noqa: E402
import botocore.exceptions  # noqa: E402

from neuron_serving.plan.instances import INSTANCES  # noqa: E402
from neuron_serving.plan.transfer import NETWORK_GBPS  # noqa: E402
from tests.harness import awscli_fork  # noqa: E402
from tests.harness.aws import (  # noqa: E402
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    REGION,
    AwsEmulator,
    Fault,
    MotoServer,
    cli_session,
)
from tests.harness.awscli_fork import AwsCliServer  # noqa: E402

BUCKET = "cache-bucket"
STACK, LOGICAL_ID = "NeuronLlamaStack", "NeuronServingFleet"
HOOK, GROUP = "neuron-serving-launch", "NeuronLlamaStack-NeuronServingFleet"
INSTANCE = "i-00000000000000001"

# AWS CLI v2's exit statuses (aws/aws-cli 2.36.7, awscli/constants.py; v1 exits 255 for all three and 2
# for a usage error): an error the service returned, a configuration the CLI cannot use, and a command
# line the CLI refuses before any request.
CLIENT_ERROR_RC = 254
CONFIGURATION_ERROR_RC = 253
PARAM_VALIDATION_ERROR_RC = 252


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto process for the session; each test's emulator resets it."""
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def emulator(tmp_path: Path, moto_server: MotoServer) -> Iterator[AwsEmulator]:
    with AwsEmulator(tmp_path / "aws", moto_server) as emulator:
        emulator.create_bucket(BUCKET)
        yield emulator


def sh(emulator: AwsEmulator, script: str, cwd: Path | None = None,
       **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under bash with the environment a simulated host has: ``aws`` is the real CLI."""
    home = emulator.workdir / "home"
    home.mkdir(exist_ok=True)
    bin_dir = AwsEmulator.link_cli(emulator.workdir / "bin").parent  # as a host has it: no venv on PATH
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **emulator.env, **extra}
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd or home, capture_output=True, text=True,
                          timeout=60, check=False)


# --- S3 ------------------------------------------------------------------------------------------------------


def test_s3_cp_downloads_one_object(emulator: AwsEmulator, tmp_path: Path) -> None:
    emulator.put_object(BUCKET, "assets/publish_metrics.py", "print('hi')\n")
    dest = tmp_path / "opt" / "publish_metrics.py"
    result = sh(emulator, f"aws s3 cp s3://{BUCKET}/assets/publish_metrics.py {dest} --region {REGION} "
                          "--only-show-errors")
    assert result.returncode == 0, result.stderr
    assert dest.read_text() == "print('hi')\n"


def test_s3_cp_of_a_missing_key_fails_with_404(emulator: AwsEmulator, tmp_path: Path) -> None:
    result = sh(emulator, f"aws s3 cp s3://{BUCKET}/nope {tmp_path / 'x'} --region {REGION}")
    assert result.returncode == 1
    assert 'An error occurred (404) when calling the HeadObject operation: Key "nope" does not exist' in result.stderr


def test_s3_sync_up_and_down_with_exclude(emulator: AwsEmulator, tmp_path: Path) -> None:
    local = tmp_path / "export"
    (local / "compiled").mkdir(parents=True)
    (local / "config.json").write_text("{}")
    (local / "compiled" / "model.neff").write_bytes(b"\0neff")
    (local / "export.lock").write_text("mine")
    up = sh(emulator, f"aws s3 sync {local} s3://{BUCKET}/exports/llama --exclude '*.lock' --region {REGION} "
                      "--only-show-errors")
    assert up.returncode == 0, up.stderr
    assert emulator.list_objects(BUCKET, "exports/") == ["exports/llama/compiled/model.neff",
                                                         "exports/llama/config.json"]

    down = tmp_path / "cache"
    result = sh(emulator, f"aws s3 sync s3://{BUCKET}/exports/llama {down} --exclude 'compiled/*' --region {REGION} "
                          "--only-show-errors")
    assert result.returncode == 0, result.stderr
    assert sorted(p.relative_to(down).as_posix() for p in down.rglob("*") if p.is_file()) == ["config.json"]
    result = sh(emulator, f"aws s3 sync s3://{BUCKET}/exports/llama {down} --region {REGION} --only-show-errors")
    assert result.returncode == 0, result.stderr
    assert (down / "compiled" / "model.neff").read_bytes() == b"\0neff"


def test_s3_rm_recursive_removes_the_prefix_only(emulator: AwsEmulator) -> None:
    for key in ("exports/a/1", "exports/a/2/3", "exports/ab", "other/a/1"):
        emulator.put_object(BUCKET, key, key)
    result = sh(emulator, f"aws s3 rm --recursive s3://{BUCKET}/exports/a/ --region {REGION} --only-show-errors")
    assert result.returncode == 0, result.stderr
    assert emulator.list_objects(BUCKET) == ["exports/ab", "other/a/1"]


def test_put_object_if_none_match_refuses_the_second_writer(emulator: AwsEmulator, tmp_path: Path) -> None:
    (tmp_path / "owner").write_text("i-1")
    put = (f"aws s3api put-object --bucket {BUCKET} --key exports/llama.lock --body {tmp_path / 'owner'} "
           f"--if-none-match '*' --region {REGION}")
    first = sh(emulator, put)
    assert first.returncode == 0, first.stderr
    assert '"ETag"' in first.stdout
    second = sh(emulator, put)
    assert second.returncode == CLIENT_ERROR_RC
    assert ("An error occurred (PreconditionFailed) when calling the PutObject operation: At least one of the "
            "pre-conditions you specified did not hold") in second.stderr
    head = sh(emulator, f"aws s3api head-object --bucket {BUCKET} --key exports/llama.lock --region {REGION}")
    assert head.returncode == 0 and '"ContentLength": 3' in head.stdout


def test_racing_conditional_writers_have_one_winner(emulator: AwsEmulator, tmp_path: Path) -> None:
    hosts = 6
    for n in range(hosts):
        (tmp_path / f"body{n}").write_text(f"i-{n}")
    script = "\n".join(
        f"(aws s3api put-object --bucket {BUCKET} --key race.lock --body {tmp_path / f'body{n}'} --if-none-match '*' "
        f"--region {REGION} >/dev/null 2>&1 && echo won {n}) &" for n in range(hosts)) + "\nwait"
    result = sh(emulator, script)
    winners = result.stdout.split()
    assert len(winners) == 2, result.stdout  # ["won", "<n>"]
    assert emulator.get_object(BUCKET, "race.lock") == f"i-{winners[1]}".encode()


def test_s3_needs_no_region(emulator: AwsEmulator, tmp_path: Path) -> None:
    """The CLI sends S3 calls without a region to us-east-1 (botocore's default for the global S3
    endpoint); moto serves an eu-west-1 bucket there, which real S3 would redirect."""
    emulator.put_object(BUCKET, "k", "v")
    result = sh(emulator, f"aws s3 cp s3://{BUCKET}/k {tmp_path / 'k'} --only-show-errors")
    assert result.returncode == 0, result.stderr


def test_list_objects_v2_query(emulator: AwsEmulator) -> None:
    emulator.put_object(BUCKET, "exports/x/config.json", "{}")
    result = sh(emulator, f"aws s3api list-objects-v2 --bucket {BUCKET} --prefix exports/ --query 'Contents[].Key' "
                          f"--output text --region {REGION}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["exports/x/config.json"]


# --- Secrets Manager -------------------------------------------------------------------------------------------


def test_get_secret_value_by_arn_as_text(emulator: AwsEmulator) -> None:
    arn = emulator.create_secret("neuron-serving/hf-token", "hf_FakeToken0123")
    assert arn.startswith(f"arn:aws:secretsmanager:{REGION}:123456789012:secret:neuron-serving/hf-token-")
    result = sh(emulator, f"aws secretsmanager get-secret-value --secret-id '{arn}' --query SecretString "
                          f"--output text --region {REGION}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hf_FakeToken0123\n"


def test_get_secret_value_of_a_json_secret(emulator: AwsEmulator) -> None:
    emulator.create_secret("hf", '{"HF_TOKEN": "hf_x"}')
    result = sh(emulator, f"aws secretsmanager get-secret-value --secret-id hf --query SecretString --output text "
                          f"--region {REGION}")
    assert result.stdout == '{"HF_TOKEN": "hf_x"}\n'


def test_get_secret_value_needs_a_region(emulator: AwsEmulator) -> None:
    emulator.create_secret("hf", "x")
    result = sh(emulator, "aws secretsmanager get-secret-value --secret-id hf --query SecretString --output text")
    assert result.returncode == CONFIGURATION_ERROR_RC
    assert "You must specify a region" in result.stderr


# --- CloudFormation and Auto Scaling, recorded ---------------------------------------------------------------


def signal(unique_id: str = INSTANCE, status: str = "SUCCESS", region: str = REGION) -> str:
    return (f"aws cloudformation signal-resource --stack-name {STACK} --logical-resource-id {LOGICAL_ID} "
            f"--unique-id {unique_id} --status {status} --region {region}")


def complete(instance: str = INSTANCE, result: str = "CONTINUE") -> str:
    return (f"aws autoscaling complete-lifecycle-action --lifecycle-hook-name {HOOK} --auto-scaling-group-name {GROUP} "
            f"--lifecycle-action-result {result} --instance-id {instance} --region {REGION}")


def test_signal_resource_is_recorded(emulator: AwsEmulator) -> None:
    result = sh(emulator, signal(), AWS_DEFAULT_REGION="us-east-1")  # --region wins over the environment
    assert result.returncode == 0, result.stderr
    [call] = emulator.recorder.calls("SignalResource")
    assert call.ok and call.valid and call.service == "cloudformation" and call.region == REGION
    assert call.params == {"StackName": STACK, "LogicalResourceId": LOGICAL_ID, "UniqueId": INSTANCE,
                           "Status": "SUCCESS"}
    log = (emulator.workdir / "aws-calls.jsonl").read_text()
    assert '"operation": "SignalResource"' in log


def test_each_call_is_recorded_with_the_wall_clock_time_it_arrived(emulator: AwsEmulator) -> None:
    before = time.time()
    assert sh(emulator, signal()).returncode == 0
    after = time.time()
    [call] = emulator.recorder.calls("SignalResource")
    assert before <= call.received <= after
    [line] = [json.loads(s) for s in (emulator.workdir / "aws-calls.jsonl").read_text().splitlines()]
    assert line["received"] == call.received


def test_signal_resource_unique_id_longer_than_the_model_allows_is_refused(emulator: AwsEmulator) -> None:
    shape = cli_session().get_service_model("cloudformation").operation_model("SignalResource").input_shape
    assert shape.members["UniqueId"].metadata["max"] == 64
    result = sh(emulator, signal(unique_id="i" * 65))
    assert result.returncode == CLIENT_ERROR_RC
    assert ("An error occurred (ValidationError) when calling the SignalResource operation: 1 validation error "
            f"detected: Value '{'i' * 65}' at 'uniqueId' failed to satisfy constraint: Member must have length less "
            "than or equal to 64") in result.stderr
    [call] = emulator.recorder.calls("SignalResource")
    assert not call.valid and call.status == 400 and call.error_code == "ValidationError"
    assert sh(emulator, signal(unique_id="i" * 64)).returncode == 0


def test_signal_resource_status_outside_the_enum_is_refused(emulator: AwsEmulator) -> None:
    result = sh(emulator, signal(status="DONE"))
    assert result.returncode == CLIENT_ERROR_RC
    assert "Member must satisfy enum value set: [SUCCESS, FAILURE]" in result.stderr


def test_stack_name_outside_the_pattern_is_refused(emulator: AwsEmulator) -> None:
    result = sh(emulator, signal().replace(STACK, "Neuron_Stack"))
    assert result.returncode == CLIENT_ERROR_RC
    assert "Value 'Neuron_Stack' at 'stackName' failed to satisfy constraint: Member must satisfy regular " in (
        result.stderr)


def test_missing_required_param_is_refused(emulator: AwsEmulator) -> None:
    # The CLI refuses it itself (argparse, from the same model), before any request.
    result = sh(emulator, f"aws cloudformation signal-resource --stack-name {STACK} --logical-resource-id "
                          f"{LOGICAL_ID} --status SUCCESS --region {REGION}")
    assert result.returncode == PARAM_VALIDATION_ERROR_RC
    assert "the following arguments are required: --unique-id" in result.stderr
    assert emulator.recorder.calls() == []
    # A client that does not check (botocore with parameter_validation off) reaches the recorder, which does.
    client = cli_session().create_client(
        "cloudformation", region_name=REGION, endpoint_url=emulator.recorder.url,
        aws_access_key_id=FAKE_ACCESS_KEY, aws_secret_access_key=FAKE_SECRET_KEY,
        config=botocore.config.Config(parameter_validation=False, retries={"max_attempts": 1}))
    with pytest.raises(Exception, match="Value null at 'uniqueId' failed to satisfy constraint: Member must not be"):
        client.signal_resource(StackName=STACK, LogicalResourceId=LOGICAL_ID, Status="SUCCESS")
    [call] = emulator.recorder.calls("SignalResource")
    assert call.errors == ["Value null at 'uniqueId' failed to satisfy constraint: Member must not be null"]


def test_unknown_param_is_refused(emulator: AwsEmulator) -> None:
    body = (f"Action=SignalResource&Version=2010-05-15&StackName={STACK}&LogicalResourceId={LOGICAL_ID}"
            f"&UniqueId={INSTANCE}&Status=SUCCESS&Reason=ready").encode()
    request = urllib.request.Request(emulator.recorder.url, data=body, method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded; charset=utf-8",
        "Authorization": f"AWS4-HMAC-SHA256 Credential={FAKE_ACCESS_KEY}/20250101/{REGION}/cloudformation/"
                         "aws4_request, SignedHeaders=host, Signature=0"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert b"<Code>ValidationError</Code>" in refused.value.read()
    [call] = emulator.recorder.calls()
    assert call.errors[0].startswith("Value 'ready' at 'Reason' failed to satisfy constraint: Unknown parameter")


def test_signal_resource_failure_knob(emulator: AwsEmulator) -> None:
    emulator.recorder.fail_signal()
    result = sh(emulator, signal())
    assert result.returncode == CLIENT_ERROR_RC
    assert ("An error occurred (ValidationError) when calling the SignalResource operation: Resource "
            f"{LOGICAL_ID} is in CREATE_COMPLETE state and cannot be signaled") in result.stderr
    [call] = emulator.recorder.calls()
    assert call.valid and not call.ok


def test_complete_lifecycle_action_and_heartbeat_are_recorded(emulator: AwsEmulator) -> None:
    heartbeat = (f"aws autoscaling record-lifecycle-action-heartbeat --lifecycle-hook-name {HOOK} "
                 f"--auto-scaling-group-name {GROUP} --instance-id {INSTANCE} --region {REGION}")
    result = sh(emulator, f"{heartbeat} && {complete()}")
    assert result.returncode == 0, result.stderr
    beat, done = emulator.recorder.calls()
    assert (beat.operation, done.operation) == ("RecordLifecycleActionHeartbeat", "CompleteLifecycleAction")
    assert done.service == "autoscaling" and done.region == REGION and done.ok
    assert done.params == {"LifecycleHookName": HOOK, "AutoScalingGroupName": GROUP,
                           "LifecycleActionResult": "CONTINUE", "InstanceId": INSTANCE}


def test_lifecycle_failure_knob_for_one_host(emulator: AwsEmulator) -> None:
    emulator.recorder.fail_lifecycle(InstanceId="i-00000000000000002")
    assert sh(emulator, complete()).returncode == 0
    result = sh(emulator, complete("i-00000000000000002"))
    assert result.returncode == CLIENT_ERROR_RC
    assert ("An error occurred (ValidationError) when calling the CompleteLifecycleAction operation: No active "
            "Lifecycle Action found with instance ID i-00000000000000002") in result.stderr


def test_instance_id_longer_than_19_is_refused(emulator: AwsEmulator) -> None:
    result = sh(emulator, complete("i-" + "0" * 18))
    assert result.returncode == CLIENT_ERROR_RC
    assert "at 'instanceId' failed to satisfy constraint: Member must have length less than or equal to 19" in (
        result.stderr)


def test_throttled_once_then_retried_by_the_cli(emulator: AwsEmulator) -> None:
    emulator.recorder.fail("SignalResource", "Rate exceeded", code="Throttling", times=1)
    result = sh(emulator, signal())
    assert result.returncode == 0, result.stderr
    assert [c.status for c in emulator.recorder.calls()] == [400, 200]


def test_services_not_emulated_fail_fast_and_are_recorded(emulator: AwsEmulator) -> None:
    result = sh(emulator, f"aws ec2 describe-tags --region {REGION}")
    assert result.returncode == CLIENT_ERROR_RC
    [call] = emulator.recorder.calls()
    assert (call.service, call.operation, call.error_code) == ("ec2", "DescribeTags", "NotEmulated")


def test_the_env_reaches_loopback_only(emulator: AwsEmulator) -> None:
    urls = {k: v for k, v in emulator.env.items() if k.startswith("AWS_ENDPOINT_URL")}
    assert set(urls) == {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SECRETS_MANAGER",
                         "AWS_ENDPOINT_URL_ECR", "AWS_ENDPOINT_URL_CLOUDFORMATION", "AWS_ENDPOINT_URL_AUTO_SCALING"}
    assert all(v.startswith(("http://127.0.0.1:", "https://127.0.0.1:")) for v in urls.values())
    assert urls["AWS_ENDPOINT_URL_S3"] == emulator.moto.tls_url
    assert emulator.env["AWS_CA_BUNDLE"] == str(emulator.moto.ca_bundle)
    with pytest.raises(botocore.exceptions.ClientError):  # moto holds no such bucket: reset between tests
        emulator.client("s3").head_bucket(Bucket="left-over-from-another-test")



def test_a_service_given_to_moto_reaches_moto_not_the_recorder(tmp_path: Path, moto_server: MotoServer) -> None:
    with AwsEmulator(tmp_path / "aws", moto_server,
                     moto_services=("s3", "secretsmanager", "cloudformation")) as emulator:
        assert emulator.env["AWS_ENDPOINT_URL_CLOUDFORMATION"] == moto_server.tls_url
        assert emulator.env["AWS_ENDPOINT_URL_AUTO_SCALING"] == emulator.recorder.url
        template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                    "Outputs": {"Answer": {"Value": "42"}}}
        emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))
        result = sh(emulator, f"aws cloudformation describe-stacks --stack-name {STACK} "
                              f"--query 'Stacks[0].Outputs[0].OutputValue' --output text --region {REGION}")
        assert result.returncode == 0, result.stderr
        assert result.stdout == "42\n"
        assert emulator.recorder.calls() == []

# --- the recorder's reading of query-protocol forms, without the CLI ---------------------------------------------


def test_forms_with_lists_maps_and_numbers_are_read_as_botocore_writes_them() -> None:
    from tests.harness.aws import parse_and_validate

    model = cli_session().get_service_model("autoscaling")
    shape = model.operation_model("SetDesiredCapacity").input_shape
    params, errors = parse_and_validate(shape, {"AutoScalingGroupName": GROUP, "DesiredCapacity": "2",
                                                "HonorCooldown": "true"})
    assert (params, errors) == ({"AutoScalingGroupName": GROUP, "DesiredCapacity": 2, "HonorCooldown": True}, [])
    _, errors = parse_and_validate(shape, {"AutoScalingGroupName": "a\x00", "DesiredCapacity": "two"})
    assert errors == [
        "Value 'a\x00' at 'autoScalingGroupName' failed to satisfy constraint: Member must satisfy regular "
        + "expression pattern: " + shape.members["AutoScalingGroupName"].metadata["pattern"],
        "Value 'two' at 'desiredCapacity' failed to satisfy constraint: Member must be of type integer (test harness)"]

    shape = model.operation_model("DescribeAutoScalingGroups").input_shape
    params, errors = parse_and_validate(shape, {
        "AutoScalingGroupNames.member.1": "a", "AutoScalingGroupNames.member.2": "b",
        "Filters.member.1.Name": "tag:k", "Filters.member.1.Values.member.1": "v", "MaxRecords": "101"})
    assert params == {"AutoScalingGroupNames": ["a", "b"], "Filters": [{"Name": "tag:k", "Values": ["v"]}],
                      "MaxRecords": 101}
    assert errors == []  # MaxRecords has no range in the model: the service's limit of 100 is its own

    shape = cli_session().get_service_model("cloudformation").operation_model("CreateStack").input_shape
    params, errors = parse_and_validate(shape, {"StackName": "s", "Parameters.member.1.ParameterKey": "K",
                                                "Parameters.member.1.ParameterValue": "V", "Tags": ""})
    assert params == {"StackName": "s", "Parameters": [{"ParameterKey": "K", "ParameterValue": "V"}], "Tags": []}
    assert errors == []


# --- AWS CLI v2's CRT transfer client, and the host's S3 transfer settings (neuron_serving.plan.transfer) -----------


def _parts(emulator: AwsEmulator, key: str) -> int:
    """How many parts the object ``key`` was uploaded in: S3's ETag of a multipart upload ends ``-<parts>``
    (moto 5.2.5 writes it so), a single PUT's has no suffix."""
    etag = emulator.client("s3").head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')
    return int(etag.rpartition("-")[2]) if "-" in etag else 1


def test_the_crt_client_uploads_and_downloads_a_multipart_object_through_the_harness(
    emulator: AwsEmulator, tmp_path: Path,
) -> None:
    # The client the hosts' transfer config picks; it speaks TLS to the harness's S3 (MotoServer).
    config = tmp_path / "crt.config"
    config.write_text("[default]\ns3 =\n  preferred_transfer_client = crt\n  multipart_chunksize = 8MB\n")
    big = tmp_path / "model.safetensors"
    big.write_bytes(os.urandom(40 * 1024**2))
    up = sh(emulator, f"aws s3 cp {big} s3://{BUCKET}/exports/k/model.safetensors --region {REGION} --debug",
            AWS_CONFIG_FILE=str(config))
    assert up.returncode == 0, up.stderr[-3000:]
    assert "Using CRT throughput target in gbps" in up.stderr  # the CRT client, not the classic one
    assert _parts(emulator, "exports/k/model.safetensors") == 5
    down = sh(emulator, f"aws s3 cp s3://{BUCKET}/exports/k/model.safetensors {tmp_path / 'back'} --region {REGION}",
              AWS_CONFIG_FILE=str(config))
    assert down.returncode == 0, down.stderr[-3000:]
    assert (tmp_path / "back").read_bytes() == big.read_bytes()


def _plan_config(tmp_path: Path, instance_type: str) -> Path:
    """The host's AWS CLI config file for a plan on ``instance_type``."""
    from neuron_serving.plan import ServingRequest, plan_serving
    from neuron_serving.plan.transfer import aws_cli_config

    config = tmp_path / f"{instance_type}.config"
    config.write_text(aws_cli_config(plan_serving(ServingRequest("llama-3.1-8b", instance_type))))
    return config


@pytest.mark.parametrize("instance_type", sorted(INSTANCES))
def test_the_cli_v2_takes_the_hosts_transfer_config_at_the_instances_bandwidth(
    emulator: AwsEmulator, tmp_path: Path, instance_type: str,
) -> None:
    # The CLI's own parser reads the file (awscli/customizations/s3/transferconfig.py at 2.36.7) and the
    # CRT client logs the throughput target it was given (awscli/s3transfer/crt.py,
    # _get_crt_throughput_target_gbps: bytes per second * 8 / 10**9).
    config = _plan_config(tmp_path, instance_type)
    small = tmp_path / "COMPLETE"
    small.write_text("done\n")
    result = sh(emulator, f"aws s3 cp {small} s3://{BUCKET}/exports/k/COMPLETE --region {REGION} --debug",
                AWS_CONFIG_FILE=str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    [logged] = [line.rpartition(": ")[2] for line in result.stderr.splitlines()
                if "Using CRT throughput target in gbps" in line]
    assert float(logged) == NETWORK_GBPS[instance_type]


def test_the_hosts_transfer_config_leaves_the_part_size_to_the_crt_client(
    emulator: AwsEmulator, tmp_path: Path,
) -> None:
    # Given no multipart_chunksize, AWS CLI v2 gives the CRT client no part size and the client picks
    # its own (aws/aws-cli 2.36.7, awscli/customizations/s3/factory.py, _create_crt_client): the
    # host's config must upload in as many parts as the CRT client's own choice.
    big = tmp_path / "model.safetensors"
    big.write_bytes(b"\1" * (40 * 1024**2))
    crt_only = tmp_path / "crt.config"
    crt_only.write_text("[default]\ns3 =\n  preferred_transfer_client = crt\n")
    for key, config in (("own", crt_only), ("host", _plan_config(tmp_path, "inf2.24xlarge"))):
        up = sh(emulator, f"aws s3 cp {big} s3://{BUCKET}/{key} --region {REGION}", AWS_CONFIG_FILE=str(config))
        assert up.returncode == 0, up.stderr[-3000:]
    assert _parts(emulator, "own") > 1
    assert _parts(emulator, "host") == _parts(emulator, "own")


# --- the fork server simulated hosts run the CLI in (tests/harness/awscli_fork.py) ----------------------------


@pytest.fixture(scope="module")
def fork_server() -> Iterator[AwsCliServer]:
    with AwsCliServer(_TOOLS / "bin" / "python") as server:
        yield server


def _both_ways(emulator: AwsEmulator, server: AwsCliServer, argv: list[str], cwd: Path, stdin: str = "",
               env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
    """``aws argv`` from the executable and through the fork server: exit status, stdout, stderr of each."""
    home = emulator.workdir / "home"
    home.mkdir(exist_ok=True)
    base = {"PATH": "/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8", **emulator.env, **(env or {}),
            "AWSCLI_FORK_SOCKET": str(server.socket_path)}
    runs = []
    for command in ([AwsEmulator.aws_executable()], [sys.executable, "-S", str(Path(awscli_fork.__file__))]):
        done = subprocess.run([*command, *argv], input=stdin, env=base, cwd=cwd, capture_output=True, text=True,
                              timeout=60, check=False)
        runs.append((done.returncode, done.stdout, done.stderr))
    return runs


@pytest.mark.parametrize(("argv", "stdin", "region"), [
    (["s3", "cp", "-", f"s3://{BUCKET}/up"], "from stdin\n", False),  # an upload of standard input
    (["s3", "cp", f"s3://{BUCKET}/there", "-"], "", False),  # a download to standard output
    (["s3", "cp", f"s3://{BUCKET}/there", "relative.txt", "--only-show-errors"], "", False),  # the caller's directory
    (["s3api", "head-object", "--bucket", BUCKET, "--key", "missing"], "", False),  # 404
    (["cloudformation", "signal-resource", "--stack-name", STACK, "--logical-resource-id", LOGICAL_ID,
      "--unique-id", INSTANCE, "--status", "SUCCESS"], "", False),  # no region: a configuration error
    (["cloudformation", "signal-resource", "--stack-name", STACK, "--logical-resource-id", LOGICAL_ID,
      "--unique-id", "x" * 65, "--status", "SUCCESS"], "", True),  # the service's refusal
    (["s3", "cp"], "", False),  # a usage error
    (["secretsmanager", "get-secret-value", "--secret-id", "hf", "--query", "SecretString", "--output", "text"],
     "", True),
])
def test_a_call_through_the_fork_server_is_the_calls_of_the_executable(
    emulator: AwsEmulator, fork_server: AwsCliServer, tmp_path: Path, argv: list[str], stdin: str, region: bool,
) -> None:
    emulator.put_object(BUCKET, "there", "downloaded\n")
    emulator.create_secret("hf", "hf_token")
    env = {"AWS_DEFAULT_REGION": REGION} if region else {}
    executable, forked = _both_ways(emulator, fork_server, argv, tmp_path, stdin, env)
    assert forked == executable
    if "relative.txt" in argv:
        assert (tmp_path / "relative.txt").read_text() == "downloaded\n"


def test_a_forked_cli_whose_server_closes_mid_upload_reports_the_broken_connection(
    emulator: AwsEmulator, fork_server: AwsCliServer, tmp_path: Path,
) -> None:
    # A Python process ignores SIGPIPE (CPython's start-up), so the real CLI gets EPIPE and reports it; a
    # child that restored SIGPIPE's default would die silently (exit 255, nothing printed).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer_and_close() -> None:
        try:
            while True:  # every attempt of the CLI's: the headers read, an answer, the connection closed
                conn, _ = listener.accept()
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                conn.close()
        except OSError:  # the listener closed: the test is over
            pass

    threading.Thread(target=answer_and_close, daemon=True).start()
    (tmp_path / "big").write_bytes(b"\0" * (8 << 20))
    env = {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{listener.getsockname()[1]}"}
    argv = ["s3api", "put-object", "--bucket", BUCKET, "--key", "big", "--body", "big"]
    home = emulator.workdir / "home"
    home.mkdir(exist_ok=True)
    try:
        done = subprocess.run([sys.executable, "-S", awscli_fork.__file__, *argv], cwd=tmp_path, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(home), **emulator.env, **env,
                                   "AWSCLI_FORK_SOCKET": str(fork_server.socket_path)},
                              capture_output=True, text=True, check=False)
    finally:
        listener.close()
    assert done.returncode != 0
    assert "aws: [ERROR]:" in done.stderr, (done.returncode, done.stderr)


# --- errors moto's server answers instead of moto (MotoServer.fail) -------------------------------------------


def test_s3_ec2_and_json_faults_are_read_by_the_cli_as_aws_errors(emulator: AwsEmulator, tmp_path: Path) -> None:
    moto = emulator.moto
    moto.fail(Fault.s3(403, "AccessDenied", "Access Denied", method="PUT", path="*/COMPLETE"))
    moto.fail(Fault.ec2("CreateTags", 403, "UnauthorizedOperation",
                        "You are not authorized to perform this operation."))
    moto.fail(Fault.json("monitoring", "PutMetricData", 403, "AccessDenied", "User is not authorized"))
    (tmp_path / "body").write_text("x\n")
    env = {"AWS_ENDPOINT_URL_EC2": moto.url, "AWS_ENDPOINT_URL_CLOUDWATCH": moto.url}
    put = sh(emulator, f"aws s3api put-object --bucket {BUCKET} --key a/COMPLETE --body {tmp_path / 'body'} "
                       "--if-none-match '*'", **env)
    other = sh(emulator, f"aws s3api put-object --bucket {BUCKET} --key a/other --body {tmp_path / 'body'}", **env)
    tags = sh(emulator, f"aws ec2 create-tags --region {REGION} --resources i-1 --tags Key=a,Value=b", **env)
    metric = sh(emulator, f"aws cloudwatch put-metric-data --region {REGION} --namespace N "
                          "--metric-data '[{\"MetricName\": \"m\", \"Value\": 1}]'", **env)
    assert (put.returncode, put.stderr.strip()) == (CLIENT_ERROR_RC, "aws: [ERROR]: An error occurred (AccessDenied) "
                                                    "when calling the PutObject operation: Access Denied")
    assert other.returncode == 0, other.stderr
    assert (tags.returncode, tags.stderr.strip()) == (CLIENT_ERROR_RC, "aws: [ERROR]: An error occurred "
        "(UnauthorizedOperation) when calling the CreateTags operation: You are not authorized to perform this "
        "operation.")
    assert (metric.returncode, metric.stderr.strip()) == (CLIENT_ERROR_RC, "aws: [ERROR]: An error occurred "
        "(AccessDenied) when calling the PutMetricData operation: User is not authorized")
    assert [f["hits"] for f in moto.faults()] == [1, 1, 1]


def test_a_fault_for_n_requests_is_spent_after_them_and_a_reset_clears_every_fault(emulator: AwsEmulator) -> None:
    emulator.put_object(BUCKET, "k", "v")
    # A 500 is retried: the CLI's standard mode makes 3 attempts.
    emulator.moto.fail(Fault.s3(500, "InternalError", "We encountered an internal error.", method="GET",
                                query="list-type=2", times=3))
    failed = sh(emulator, f"aws s3 ls s3://{BUCKET}/")
    listed = sh(emulator, f"aws s3 ls s3://{BUCKET}/")
    assert failed.returncode == CLIENT_ERROR_RC
    assert "(InternalError) when calling the ListObjectsV2 operation (reached max retries: 2)" in failed.stderr
    assert listed.returncode == 0 and " k\n" in listed.stdout
    emulator.moto.fail(Fault.s3(403, "AccessDenied", "Access Denied"))
    emulator.moto.reset()
    assert emulator.moto.faults() == []
