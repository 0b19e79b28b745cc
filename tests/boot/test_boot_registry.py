"""The serving image from a private ECR registry, on simulated hosts whose ``aws`` is the real AWS CLI
against moto (ECR's GetAuthorizationToken) and whose docker is the real CLI against the recording
engine (tests/harness/dockerd.py): the host logs in with its role's token, then pulls the mirrored
reference, and runs it."""

from __future__ import annotations

import base64
from collections.abc import Callable

from bootsim import SMALL_MODEL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI_3_3_5
from neuron_serving.render.boot_options import BootOptions
from tests.harness.aws import AwsEmulator
from tests.harness.userdata import boot_of

REGISTRY = "111122223333.dkr.ecr.eu-west-1.amazonaws.com"
MIRRORED = f"{REGISTRY}/ghcr/huggingface/text-generation-inference:3.3.5-neuron"
SCRIPT = boot_of(make_plan("inf2.xlarge", model_id=SMALL_MODEL), BootOptions(artifact_cache="s3://cache-bucket/exports"),
                 image_registry=f"{REGISTRY}/ghcr")


def _requests(host: Host, path: str) -> list[dict[str, object]]:
    return [r for r in host.engine.records if r["kind"] == "request" and str(r["path"]).endswith(path)]


def test_the_host_logs_in_to_ecr_with_its_role_pulls_the_mirror_and_runs_it(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    result = host.boot(SCRIPT)
    assert result.returncode == 0, host.path("/var/log/neuron-serving/boot.log").read_text()
    assert host.aws("ecr", "get-login-password") == [["ecr", "get-login-password", "--region", "eu-west-1"]]
    (login,) = _requests(host, "/auth")
    body = login["body"]
    assert isinstance(body, dict)
    assert (body["username"], body["serveraddress"]) == ("AWS", REGISTRY)
    # The password is the token's second half (GetAuthorizationToken: base64 of "AWS:<password>").
    token = aws.client("ecr").get_authorization_token()["authorizationData"][0]["authorizationToken"]
    password = base64.b64decode(token).decode().split(":", 1)[1]
    assert body["password"] == password
    pulls = _requests(host, "/images/create")
    assert [(p["query"]["fromImage"], p["query"]["tag"]) for p in pulls] == [
        (f"{REGISTRY}/ghcr/huggingface/text-generation-inference", "3.3.5-neuron")]
    assert {c["Image"] for c in host.containers()} == {MIRRORED}
    # The token reaches docker on its standard input only: no argument list, no log.
    logs = "".join(p.read_text(errors="replace") for p in host.path("/var/log/neuron-serving").glob("*.log"))
    assert password not in logs and all(password not in " ".join(argv) for argv in host.calls())


def test_a_login_that_fails_is_retried_then_fails_the_pull_step(
    make_host: Callable[..., Host], aws: AwsEmulator,
) -> None:
    host = make_host(1)
    # ECR sent to the recorder, which refuses the services it does not emulate (HTTP 400).
    result = host.boot(SCRIPT, AWS_ENDPOINT_URL_ECR=aws.recorder.url)
    assert result.returncode != 0
    assert len(host.aws("ecr", "get-login-password")) == 5
    assert _requests(host, "/images/create") == []
    log = host.path("/var/log/neuron-serving/boot.log").read_text()
    assert f"could not pull {MIRRORED} after" in log
    assert TGI_3_3_5.reference not in [c["Image"] for c in host.containers()]
