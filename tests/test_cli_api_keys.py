"""``neuron-serving api-key``: create, rotate, revoke and list the endpoint's API keys in their Secrets Manager
secret, found through the stack's ``ApiKeysSecretArn`` output.

Every AWS call goes to moto's server on loopback (``tests/harness/aws.py``): Secrets Manager, and CloudFormation
for ``DescribeStacks`` of a stack created in moto with that output. The CLI runs in this process (``main``)
with the emulator's environment, which botocore reads (``AWS_ENDPOINT_URL_*``, fake credentials); once, as the
installed console script under bash.

Two failures moto cannot produce are injected with a botocore ``before-call`` / ``after-call`` hook on the
CLI's clients (:func:`hooks`), each named as such: Secrets Manager's ``AccessDeniedException`` (moto enforces
IAM only when asked, and then answers denied JSON-protocol calls with a body botocore reads as ``"403"``;
CloudFormation's ``AccessDenied`` comes from moto's real IAM enforcement) and a second operator's write
landing between the CLI's read and its write.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from neuron_serving.cli import main
from neuron_serving.userdata.api_keys import digest, parse_secret, stored
from tests.harness.aws import REGION, TOOLS, AwsEmulator

if not (TOOLS / "bin" / "python").exists() and importlib.util.find_spec("moto") is None:
    if os.environ.get("CI"):
        pytest.fail("CI needs moto: pip install -r tests/harness/requirements-aws.txt", pytrace=False)
    pytest.skip("pip install -r tests/harness/requirements-aws.txt (no moto)", allow_module_level=True)

STACK = "NeuronLlamaStack"
SECRET = "NeuronLlamaStack-api-keys"
OTHER_DIGEST = "sha256:" + "ab" * 32
RAW_KEY = "raw-key-made-elsewhere-0123456789abcdef"


@pytest.fixture
def emulator(aws_for: Callable[..., AwsEmulator]) -> AwsEmulator:
    """moto for Secrets Manager and CloudFormation; this process's environment reaches it and nothing else."""
    return aws_for("s3", "secretsmanager", "cloudformation")


def create_stack(emulator: AwsEmulator, outputs: dict[str, str], name: str = STACK) -> None:
    template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    emulator.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


@pytest.fixture
def secret(emulator: AwsEmulator) -> str:
    """The stack's secret, with one key already in it; its ARN."""
    arn = emulator.create_secret(SECRET, json.dumps({"existing": OTHER_DIGEST}))
    create_stack(emulator, {"ApiKeysSecretArn": arn, "EndpointUrl": "http://example.invalid"})
    return arn


def secret_text(emulator: AwsEmulator, secret_id: str = SECRET) -> str:
    return str(emulator.client("secretsmanager").get_secret_value(SecretId=secret_id)["SecretString"])


def entries(emulator: AwsEmulator, secret_id: str = SECRET) -> dict[str, str]:
    value: dict[str, str] = json.loads(secret_text(emulator, secret_id))
    return value


def run(capsys: pytest.CaptureFixture[str], *argv: str, region: str | None = REGION) -> tuple[int, str, str]:
    """``neuron-serving api-key ARGV...``: exit status, stdout, stderr."""
    code = main(["api-key", *argv, *(["--region", region] if region else [])])
    out, err = capsys.readouterr()
    return code, out, err


def error_answer(status: int, code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    """What a ``before-call`` handler returns to answer the call itself, as botocore's ``Stubber`` does."""
    return (AWSResponse("https://stub.invalid", status, {}, None),
            {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}})


# --- create ----------------------------------------------------------------------------------------------------


def test_create_prints_only_the_key_on_stdout_and_stores_its_digest(emulator, secret, capsys):
    code, out, err = run(capsys, "create", "ci")
    assert code == 0, err
    key = out.removesuffix("\n")
    assert out == key + "\n" and key.startswith("nsk-") and len(key) == 4 + 43
    assert entries(emulator) == {"existing": OTHER_DIGEST, "ci": stored(key)}
    assert key not in err and key not in secret_text(emulator)
    assert "shown this once" in err
    assert "Authorization: Bearer <key>" in err
    assert "within about 2 minutes" in err
    assert secret in err


def test_create_keeps_the_key_out_of_every_log_line_even_botocores_debug_log(emulator, secret, capsys, caplog):
    caplog.set_level(logging.DEBUG)
    code, out, err = run(capsys, "create", "ci")
    assert code == 0, err
    key = out.strip()
    assert digest(key) in caplog.text  # the debug log holds the request bodies: the check below means something
    assert key not in caplog.text and key not in err


def test_the_console_script_gives_the_key_alone_to_a_command_substitution(emulator, secret):
    script = Path(sys.executable).parent / "neuron-serving"
    result = subprocess.run(
        ["bash", "-c", f'KEY=$("{script}" api-key create ci --region {REGION}) && printf %s "$KEY" | sha256sum'],
        env={**os.environ, "PATH": f"{script.parent}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=60,
        check=False)
    assert result.returncode == 0, result.stderr
    assert entries(emulator)["ci"] == "sha256:" + result.stdout.split()[0]
    assert "shown this once" in result.stderr and "nsk-" not in result.stderr


def test_create_refuses_a_name_that_exists_and_points_to_rotate(emulator, secret, capsys):
    before = secret_text(emulator)
    code, out, err = run(capsys, "create", "existing")
    assert (code, out) == (1, "")
    assert "a key named 'existing' already exists" in err and "neuron-serving api-key rotate existing" in err
    assert secret_text(emulator) == before


@pytest.mark.parametrize("name", ["has space", ".leading-dot", "x" * 65, "naïve"])
def test_create_refuses_a_name_the_hosts_would_ignore_as_a_usage_error(emulator, secret, capsys, name):
    with pytest.raises(SystemExit) as exited:
        main(["api-key", "create", name, "--region", REGION])
    assert exited.value.code == 2
    assert "must be 1 to 64 letters, digits and ._@+- starting with a letter or digit" in capsys.readouterr().err
    assert entries(emulator) == {"existing": OTHER_DIGEST}


def test_create_sends_a_client_request_token_that_becomes_the_new_version(emulator, secret, capsys, hooks):
    sent: list[dict[str, Any]] = []
    hooks["provide-client-params.secrets-manager.PutSecretValue"] = lambda params, **_: sent.append(dict(params))
    assert run(capsys, "create", "ci")[0] == 0
    (params,) = sent  # before botocore would fill in a token of its own
    current = emulator.client("secretsmanager").get_secret_value(SecretId=SECRET)
    assert params["ClientRequestToken"] == current["VersionId"]


# --- rotate, revoke, list ----------------------------------------------------------------------------------------


def test_rotate_replaces_the_digest_and_prints_the_new_key_once(emulator, secret, capsys):
    first = run(capsys, "create", "ci")[1].strip()
    code, out, err = run(capsys, "rotate", "ci")
    assert code == 0, err
    second = out.strip()
    assert out == second + "\n" and second != first
    assert entries(emulator) == {"existing": OTHER_DIGEST, "ci": stored(second)}
    assert "the old key stops working within about 2 minutes" in err and second not in err


def test_rotate_of_an_absent_name_fails_and_points_to_create(emulator, secret, capsys):
    code, out, err = run(capsys, "rotate", "nobody")
    assert (code, out) == (1, "")
    assert "no key named 'nobody'" in err and "neuron-serving api-key create nobody" in err


def test_revoke_removes_only_that_key(emulator, secret, capsys):
    run(capsys, "create", "ci")
    code, out, err = run(capsys, "revoke", "ci")
    assert (code, out) == (0, "")
    assert entries(emulator) == {"existing": OTHER_DIGEST}
    assert "revoked API key 'ci'" in err and "refuse every request" not in err


def test_revoking_the_last_key_says_every_request_is_refused(emulator, secret, capsys):
    code, _, err = run(capsys, "revoke", "existing")
    assert code == 0
    assert entries(emulator) == {}
    assert "no usable key remains: the endpoint will refuse every request" in err


def test_revoke_of_an_absent_name_fails(emulator, secret, capsys):
    code, out, err = run(capsys, "revoke", "nobody")
    assert (code, out) == (1, "")
    assert "no key named 'nobody'" in err
    assert entries(emulator) == {"existing": OTHER_DIGEST}


def test_revoke_removes_an_entry_the_hosts_ignore(emulator, capsys):
    emulator.create_secret(SECRET, json.dumps({"bad name": RAW_KEY, "ok": OTHER_DIGEST}))
    assert run(capsys, "revoke", "bad name", "--secret", SECRET)[0] == 0
    assert entries(emulator) == {"ok": OTHER_DIGEST}


def test_revoke_that_would_leave_only_ignored_entries_is_refused_as_the_hosts_would_keep_the_key(emulator, capsys):
    emulator.create_secret(SECRET, json.dumps({"ci": OTHER_DIGEST, "short": "tooshort"}))
    code, out, err = run(capsys, "revoke", "ci", "--secret", SECRET)
    assert (code, out) == (1, "")
    assert "would leave" in err and "only entries the hosts ignore ('short')" in err
    assert "keep the keys they have, this one included: nothing was changed" in err
    assert entries(emulator) == {"ci": OTHER_DIGEST, "short": "tooshort"}
    assert "tooshort" not in err


def test_list_of_a_secret_with_only_ignored_entries_says_the_hosts_keep_their_keys(emulator, capsys):
    emulator.create_secret(SECRET, json.dumps({"short": "tooshort"}))
    code, out, err = run(capsys, "list", "--secret", SECRET)
    assert code == 0
    assert out.startswith("ignored by the hosts: key 'short' ignored")
    assert "0 key(s) in" in err and "the hosts ignore it and keep the keys they had" in err
    assert "refuses every request" not in err


def test_list_shows_names_and_how_each_is_stored_never_a_value(emulator, capsys):
    emulator.create_secret(SECRET, json.dumps({
        "ci": OTHER_DIGEST, "legacy": RAW_KEY, "short": "tooshort", "bad name": RAW_KEY, "number": 7}))
    create_stack(emulator, {"ApiKeysSecretArn": SECRET})
    code, out, err = run(capsys, "list")
    assert code == 0, err
    assert out.splitlines() == [
        "ci      digest",
        "legacy  key (hashed on the hosts; rotate it to store only its digest)",
        *(f"ignored by the hosts: {problem}" for problem in parse_secret(secret_text(emulator))[1]),
    ]
    assert "key 'short' ignored" in out and "key 'bad name' ignored" in out and "key 'number' ignored" in out
    assert "2 key(s) in arn:aws:secretsmanager:" in err
    for value in (OTHER_DIGEST[7:], RAW_KEY, "tooshort"):
        assert value not in out + err


def test_list_of_an_empty_secret_says_every_request_is_refused(emulator, capsys):
    emulator.create_secret(SECRET, "{}")
    code, out, err = run(capsys, "list", "--secret", SECRET)
    assert (code, out) == (0, "")
    assert "0 key(s) in" in err and "the endpoint refuses every request" in err


# --- finding the secret ------------------------------------------------------------------------------------------


def test_stack_resolution_reads_the_named_stacks_output(emulator, capsys):
    mine = emulator.create_secret("mine", "{}")
    emulator.create_secret("theirs", "{}")
    create_stack(emulator, {"ApiKeysSecretArn": mine}, name="MyServing")
    create_stack(emulator, {"ApiKeysSecretArn": "theirs"})
    assert run(capsys, "create", "ci", "--stack", "MyServing")[0] == 0
    assert list(entries(emulator, "mine")) == ["ci"] and entries(emulator, "theirs") == {}


@pytest.mark.parametrize("by", ["name", "arn"])
def test_secret_names_the_secret_without_any_stack(emulator, capsys, by):
    arn = emulator.create_secret("by-hand", "{}")
    code, out, err = run(capsys, "create", "ci", "--secret", "by-hand" if by == "name" else arn)
    assert code == 0, err
    assert entries(emulator, "by-hand") == {"ci": stored(out.strip())}


def test_the_region_comes_from_boto3s_default_resolution(emulator, secret, capsys, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    assert run(capsys, "list", region=None)[0] == 0
    code, _, err = run(capsys, "list", region="us-west-2")  # --region wins: the stack is not there
    assert code == 1 and f"stack {STACK} not found in us-west-2" in err


def test_stack_and_secret_together_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["api-key", "list", "--stack", STACK, "--secret", SECRET])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


# --- errors a user can act on: exit 1, one line on stderr, no traceback ---------------------------------------------


def assert_fails(capsys: pytest.CaptureFixture[str], *argv: str, says: str, region: str | None = REGION) -> str:
    code, out, err = run(capsys, *argv, region=region)
    assert (code, out) == (1, "")
    assert err.startswith("neuron-serving: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert says in err, err
    return err


def test_no_credentials(emulator, secret, capsys, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert_fails(capsys, "list", says="no AWS credentials found: configure them")


def test_no_region(emulator, secret, capsys):
    assert_fails(capsys, "list", says="no AWS region: pass --region", region=None)


def test_stack_not_found(emulator, capsys):
    assert_fails(capsys, "list", says=f"stack {STACK} not found in {REGION}: name it with --stack")


def test_stack_deployed_without_api_keys(emulator, capsys):
    create_stack(emulator, {"EndpointUrl": "http://example.invalid"})
    err = assert_fails(capsys, "create", "ci", says=f"stack {STACK} has no ApiKeysSecretArn output: it was "
                                                    "deployed without API keys")
    assert "-c api_keys=true" in err and "--secret" in err


def test_secret_not_found(emulator, capsys):
    assert_fails(capsys, "list", "--secret", "nowhere", says=f"secret nowhere not found in {REGION}")


def test_the_stacks_secret_was_deleted(emulator, secret, capsys):
    emulator.client("secretsmanager").delete_secret(SecretId=secret, ForceDeleteWithoutRecovery=True)
    assert_fails(capsys, "list", says=f"(named by stack {STACK}'s ApiKeysSecretArn output: was it deleted?)")


def test_a_secret_without_a_value(emulator, capsys):
    emulator.client("secretsmanager").create_secret(Name=SECRET)
    assert_fails(capsys, "create", "ci", "--secret", SECRET,
                 says=f"aws secretsmanager put-secret-value --secret-id {SECRET} --secret-string '{{}}'")


@pytest.mark.parametrize("value", ["hunter2-not-json-at-all", '["hunter2-in-a-list"]', '"hunter2-a-string"'])
def test_a_secret_that_is_not_a_json_object_is_refused_without_showing_it(emulator, capsys, value):
    emulator.create_secret(SECRET, value)
    err = assert_fails(capsys, "create", "ci", "--secret", SECRET,
                       says="is not a JSON object mapping key names to keys or their digests")
    assert "hunter2" not in err
    assert secret_text(emulator) == value


def test_a_binary_secret_is_not_a_json_object(emulator, capsys):
    emulator.client("secretsmanager").create_secret(Name=SECRET, SecretBinary=b"{}")
    assert_fails(capsys, "list", "--secret", SECRET, says="is not a JSON object")


def test_describe_stacks_denied_by_iam_names_the_action(emulator, secret, capsys, monkeypatch):
    """moto's own IAM enforcement (:meth:`MotoServer.iam_enforced`): a user allowed Secrets Manager only."""
    iam = emulator.client("iam")
    iam.create_user(UserName="operator")
    iam.put_user_policy(UserName="operator", PolicyName="secrets-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "secretsmanager:*", "Resource": "*"}]}))
    access_key = iam.create_access_key(UserName="operator")["AccessKey"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", access_key["SecretAccessKey"])
    with emulator.moto.iam_enforced():
        err = assert_fails(capsys, "list", says=f"access denied: your AWS identity needs "
                                                f"cloudformation:DescribeStacks on {STACK}")
    assert "user/operator is not authorized" in err  # AWS's own words follow


def test_put_secret_value_denied_names_the_action_and_prints_no_key(emulator, secret, capsys, hooks):
    """A ``before-call`` hook stands in for IAM: moto's enforcement answers Secrets Manager unreadably."""
    hooks["before-call.secrets-manager.PutSecretValue"] = lambda **_: error_answer(
        400, "AccessDeniedException", "User: arn:aws:iam::123456789012:user/reader is not authorized to perform: "
        "secretsmanager:PutSecretValue on resource: NeuronLlamaStack-api-keys because no identity-based policy "
        "allows the secretsmanager:PutSecretValue action")
    assert_fails(capsys, "create", "ci",
                 says=f"access denied: your AWS identity needs secretsmanager:PutSecretValue on {secret}")
    assert entries(emulator) == {"existing": OTHER_DIGEST}


def test_expired_credentials_say_so(emulator, secret, capsys, hooks):
    """A ``before-call`` hook answers as AWS does for an expired session token (moto never expires one)."""
    hooks["before-call.cloudformation.DescribeStacks"] = lambda **_: error_answer(
        403, "ExpiredToken", "The security token included in the request is expired")
    assert_fails(capsys, "list", says="AWS refused the credentials (ExpiredToken: The security token included in "
                                      "the request is expired): refresh or replace them")


def test_a_change_landing_between_read_and_write_is_not_overwritten(emulator, secret, capsys, hooks):
    """An ``after-call`` hook plays a second operator who writes just after the CLI's first read."""
    theirs = json.dumps({"existing": OTHER_DIGEST, "theirs": OTHER_DIGEST})
    writes = []

    def other_operator(**_: Any) -> None:
        if not writes:
            writes.append(emulator.client("secretsmanager").put_secret_value(SecretId=SECRET, SecretString=theirs))

    hooks["after-call.secrets-manager.GetSecretValue"] = other_operator
    assert_fails(capsys, "create", "ci", says="changed while this command ran (another operator?): nothing was "
                                              "written; run the command again")
    assert secret_text(emulator) == theirs
    code, out, _ = run(capsys, "create", "ci")  # run again: both changes are kept
    assert code == 0 and entries(emulator) == {"existing": OTHER_DIGEST, "theirs": OTHER_DIGEST,
                                               "ci": stored(out.strip())}


def test_help_documents_the_permissions_and_the_remaining_race(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["api-key", "create", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for words in ("secretsmanager:PutSecretValue", "cloudformation:DescribeStacks", "run it again",
                  "a change landing in the", "instant between that check and the write is overwritten"):
        assert words in text


# --- --output json -------------------------------------------------------------------------------------------------


def test_list_as_json_names_each_key_and_how_it_is_stored_never_a_value(emulator, capsys):
    arn = emulator.create_secret(SECRET, json.dumps({"ci": OTHER_DIGEST, "legacy": RAW_KEY, "short": "tooshort"}))
    code, out, err = run(capsys, "list", "--secret", SECRET, "--output", "json")
    assert code == 0, err
    assert json.loads(out) == {
        "secret": arn,
        "keys": [{"name": "ci", "stored": "digest"}, {"name": "legacy", "stored": "key"}],
        "ignored": parse_secret(secret_text(emulator))[1],
    }
    for value in (OTHER_DIGEST[7:], RAW_KEY, "tooshort"):
        assert value not in out + err


def test_create_as_json_holds_the_one_time_key_and_revoke_as_json_holds_none(emulator, secret, capsys):
    code, out, err = run(capsys, "create", "ci", "--output", "json")
    assert code == 0, err
    created = json.loads(out)
    key = created.pop("key")
    assert created == {"action": "create", "name": "ci", "secret": secret}
    assert entries(emulator) == {"existing": OTHER_DIGEST, "ci": stored(key)} and key not in err
    code, out, err = run(capsys, "revoke", "ci", "--output", "json")
    assert code == 0, err
    assert json.loads(out) == {"action": "revoke", "name": "ci", "secret": secret}
    assert entries(emulator) == {"existing": OTHER_DIGEST}
