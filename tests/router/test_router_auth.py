"""API keys at the router: the real HAProxy with the rendered config (``api_keys=True``) in front of
fake replicas, and the host's real ``api-keys sync`` (userdata/api_keys.py) reading the keys' secret
with the real AWS CLI from moto's Secrets Manager on loopback, then switching the running router's
keys through its runtime API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from routersim import bearer, generate, http_request, make_plan

from neuron_serving.plan.engines import engine
from neuron_serving.plan.metrics import LOG_KINDS, MonitoringOptions
from neuron_serving.render.monitoring import render_publisher_config
from neuron_serving.render.router import UNAUTHORIZED, not_found_message, render_router_config
from neuron_serving.userdata import api_keys, publish_metrics
from tests.harness.aws import AwsEmulator

SYNC = Path(api_keys.__file__)
ALICE, BOB = api_keys.new_key(), api_keys.new_key()


def test_a_request_without_a_key_gets_401_with_a_json_error_and_a_bearer_challenge(secure_router) -> None:
    router = secure_router(ALICE)

    resp = router.request("POST", "/generate", generate())

    assert resp.status == 401
    assert resp.headers["content-type"] == "application/json"
    assert resp.headers["www-authenticate"] == 'Bearer realm="neuron-serving"'
    assert json.loads(resp.body) == {"error": UNAUTHORIZED, "error_type": "unauthorized"}  # TGI's ErrorResponse
    assert resp.replica is None
    assert all(not fake.served for fake in router.replicas.values())


@pytest.mark.parametrize("authorization", [f"Bearer {BOB}", f"Basic {ALICE}", ALICE, "Bearer ", f"Bearer {ALICE}x"],
                         ids=["unknown key", "basic scheme", "no scheme", "empty key", "key with a suffix"])
def test_a_wrong_key_or_scheme_gets_401(secure_router, authorization: str) -> None:
    router = secure_router(ALICE)

    resp = router.request("POST", "/generate", generate(), headers={"Authorization": authorization})

    assert resp.status == 401, resp
    assert all(not fake.served for fake in router.replicas.values())


def test_a_known_key_streams_tokens_and_the_replica_never_sees_the_key(secure_router) -> None:
    router = secure_router(ALICE, BOB)

    resp = router.request("POST", "/generate_stream", generate(4), headers={"Authorization": f"bearer {BOB}"})

    assert resp.status == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert resp.body.count(b"data:") == 4
    (served,) = router.replicas["replica-0"].served
    assert "authorization" not in dict(served.headers)


def test_health_is_public_and_every_non_api_route_is_404_even_with_a_key(secure_router) -> None:
    router = secure_router(ALICE)

    assert router.request("GET", "/health").status == 200
    for path in ("/metrics", "/docs", "/api-doc/openapi.json", "/tokenize", "/ping", "/generate/../metrics"):
        resp = router.request("GET", path, headers=bearer(ALICE))
        assert (path, resp.status, json.loads(resp.body)) == (
            path, 404, {"error": not_found_message(engine("tgi")), "error_type": "not_found"})
    # Under /v1/, the same 404 in OpenAI's shape, which OpenAI's clients read.
    for path in ("/v1/chat%2Fcompletions", "/v1/embeddings"):
        resp = router.request("GET", path, headers=bearer(ALICE))
        assert (path, resp.status, json.loads(resp.body)) == (path, 404, {"error": {
            "message": not_found_message(engine("tgi")), "type": "Not Found", "param": None, "code": 404}})
    # Without a key, the same paths say nothing about which routes exist.
    assert router.request("GET", "/metrics").status == 401


@pytest.mark.parametrize("name", ["tgi", "vllm"])
def test_every_api_route_of_the_engine_reaches_a_replica_with_a_key(secure_router, name: str) -> None:
    serving = engine(name)
    router = secure_router(ALICE, serving=serving)

    for route, methods in serving.api_routes.items():
        payload = {"prompt": "Hi", "max_tokens": 1, "inputs": "Hi"} if methods == ("POST",) else None
        resp = router.request(methods[0], route, payload, headers=bearer(ALICE))
        assert resp.replica == "replica-0", (route, resp)


def test_refused_requests_are_counted_in_the_router_frontend_denied_requests(secure_router) -> None:
    router = secure_router(ALICE)

    for headers in ({}, bearer(BOB), bearer(ALICE)):
        router.request("POST", "/generate", generate(), headers=headers)

    metrics = http_request(router.metrics_port, "GET", "/metrics").body.decode()
    assert 'haproxy_frontend_requests_denied_total{proxy="router"} 2' in metrics


def test_the_publisher_turns_the_routers_refusals_into_unauthorized_requests(secure_router) -> None:
    router = secure_router(ALICE)
    plan = make_plan(1)
    options = MonitoringOptions(service="s", log_groups=dict.fromkeys(LOG_KINDS, "g"))
    config = json.loads(render_publisher_config(plan, engine("tgi"), options))
    publisher = publish_metrics.Publisher(config, "s", "i-1")

    def scrape() -> list[float]:
        page = http_request(router.metrics_port, "GET", "/metrics").body.decode()
        events = publisher.collect(None, {}, page, None, 1_000)
        return [e["UnauthorizedRequests"] for e in events if "UnauthorizedRequests" in e]

    router.request("POST", "/generate", generate())
    assert scrape() == []  # a counter's first reading is the baseline
    for headers in ({}, bearer(BOB), bearer(ALICE), {}):
        router.request("POST", "/generate", generate(), headers=headers)
    assert scrape() == [3]


def test_no_key_appears_in_any_log_line_the_router_writes(secure_router) -> None:
    router = secure_router(ALICE)
    for key in (ALICE, BOB):
        router.request("POST", "/generate", generate(), headers=bearer(key))
        router.request("POST", "/generate_stream", generate(2), headers=bearer(key))
        router.request("GET", "/metrics", headers=bearer(key))
    # Each line is written as its stream ends, which may come after a later request's (wait_for_log).
    router.wait_for_log("GET /metrics ", 2)
    router.wait_for_log("POST /generate ", 2)
    router.wait_for_log("POST /generate_stream ", 2)
    router.stop()

    log = router.log_path.read_text()
    assert log.count("POST /generate ") == 2 and log.count("GET /metrics ") == 2, log
    assert ALICE not in log and BOB not in log
    assert api_keys.digest(ALICE) not in log


def test_with_load_balancer_authentication_a_signed_in_browser_passes_but_a_bad_key_does_not(secure_router) -> None:
    router = secure_router(ALICE, load_balancer_authentication=True)
    signed_in = {"x-amzn-oidc-identity": "user-1", "x-amzn-oidc-data": "header.payload.signature",
                 "x-amzn-oidc-accesstoken": "token"}

    assert router.request("POST", "/generate", generate(), headers=signed_in).status == 200
    assert router.request("POST", "/generate", generate(), headers={**signed_in, **bearer(BOB)}).status == 401
    assert router.request("POST", "/generate", generate(), headers={**signed_in, **bearer(ALICE)}).status == 200
    assert router.request("POST", "/generate", generate()).status == 401
    for served in router.replicas["replica-0"].served:
        assert not {"authorization", "x-amzn-oidc-data", "x-amzn-oidc-accesstoken"} & dict(served.headers).keys()


def test_the_router_refuses_load_balancer_authentication_without_api_keys() -> None:
    with pytest.raises(ValueError, match=r"load_balancer_authentication \(True\) applies only with api_keys"):
        render_router_config(make_plan(1), load_balancer_authentication=True)


# --- keys changed in the secret, while the router runs -----------------------------------------------------


@pytest.fixture
def aws(tmp_path: Path) -> Iterator[AwsEmulator]:
    with AwsEmulator(tmp_path / "aws") as emulator:
        yield emulator


def sync(aws: AwsEmulator, secret: str, keys_dir: Path, *metrics: str) -> subprocess.CompletedProcess[str]:
    """``api-keys sync`` as the host's timer runs it: the real AWS CLI, the router's socket; with
    ``metrics``, ``--metrics FILE`` and the environment the unit gives it."""
    bin_dir = keys_dir.parent / "aws-bin"
    AwsEmulator.link_cli(bin_dir)
    env = {**os.environ, **aws.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "METRICS_NAMESPACE": "NeuronServing", "SERVICE": "llama", "INSTANCE_ID": "i-0123456789abcdef0"}
    return subprocess.run([sys.executable, str(SYNC), "sync", "--secret", secret, "--region", aws.region,
                           "--keys-file", str(keys_dir / "api-keys.sha256"), "--socket", str(keys_dir / "admin.sock"),
                           *(["--metrics", *metrics] if metrics else [])],
                          env=env, capture_output=True, text=True, timeout=60, check=False)


def acl_digests(keys_dir: Path) -> list[str]:
    """The digests the running router holds for the key file, from its runtime API (``show acl``:
    one ``<pointer> <value>`` line per entry; HAProxy 2.4 management guide, section 9.3)."""
    answer = api_keys._runtime(str(keys_dir / "admin.sock"), f"show acl {keys_dir / 'api-keys.sha256'}")
    return sorted(line.split()[1] for line in answer.splitlines() if line.strip())


def put_keys(aws: AwsEmulator, secret: str, keys: dict[str, str]) -> None:
    aws.client("secretsmanager").put_secret_value(SecretId=secret, SecretString=json.dumps(keys))


def test_keys_added_revoked_and_rotated_in_the_secret_take_effect_without_restarting_the_router(
    secure_router, aws: AwsEmulator, keys_dir: Path,
) -> None:
    secret = aws.create_secret("neuron-serving/api-keys", json.dumps({"alice": api_keys.stored(ALICE)}))
    router = secure_router(ALICE)
    first = sync(aws, secret, keys_dir)
    assert (first.returncode, first.stdout) == (0, ""), first.stderr  # nothing changed
    pid = router.process.pid

    def status(key: str) -> int:
        return router.request("POST", "/generate", generate(), headers=bearer(key)).status

    assert (status(ALICE), status(BOB)) == (200, 401)
    put_keys(aws, secret, {"alice": api_keys.stored(ALICE), "bob": BOB})  # added, as the key itself
    added = sync(aws, secret, keys_dir)
    assert (added.returncode, added.stdout) == (0, "api-keys: 2 key(s) in force: alice, bob\n")
    assert (status(ALICE), status(BOB)) == (200, 200)
    rotated = api_keys.new_key()
    put_keys(aws, secret, {"alice": api_keys.stored(rotated), "bob": BOB})  # alice's key rotated
    assert sync(aws, secret, keys_dir).returncode == 0
    assert (status(ALICE), status(rotated), status(BOB)) == (401, 200, 200)
    put_keys(aws, secret, {"alice": api_keys.stored(rotated)})  # bob's key revoked
    assert sync(aws, secret, keys_dir).returncode == 0
    assert (status(rotated), status(BOB)) == (200, 401)
    assert router.process.pid == pid and router.process.poll() is None
    for run in (first, added):
        assert ALICE not in run.stdout + run.stderr and BOB not in run.stdout + run.stderr


def test_an_unreadable_secret_leaves_the_keys_in_force(secure_router, aws: AwsEmulator, keys_dir: Path) -> None:
    router = secure_router(ALICE)

    result = sync(aws, "no-such-secret", keys_dir)

    assert result.returncode == 1
    assert "could not read secret no-such-secret" in result.stderr
    assert "the keys in force are unchanged" in result.stderr
    assert router.request("POST", "/generate", generate(), headers=bearer(ALICE)).status == 200


@pytest.mark.parametrize(("text", "reason"), [
    ("not json", "the secret is not JSON"),
    ("[]", "the secret must be a JSON object"),
    ('{"a": "short"}', "no entry of the secret is a key"),
], ids=["not JSON", "an array", "no valid entry"])
def test_a_secret_that_cannot_be_used_leaves_the_router_and_the_key_file_as_they_are_and_fails(
    secure_router, aws: AwsEmulator, keys_dir: Path, text: str, reason: str,
) -> None:
    router = secure_router(ALICE, BOB)
    keys_file = keys_dir / "api-keys.sha256"
    before = keys_file.read_text()
    secret = aws.create_secret("keys", text)

    result = sync(aws, secret, keys_dir)

    assert result.returncode == 1, result
    assert reason in result.stderr and "the keys in force are unchanged" in result.stderr, result.stderr
    assert result.stdout == ""
    assert "short" not in result.stderr and "not json" not in result.stderr  # never the secret's text
    assert keys_file.read_text() == before
    # The running router's own copy of the keys, through its runtime API, and as clients see it.
    assert acl_digests(keys_dir) == sorted([api_keys.digest(ALICE), api_keys.digest(BOB)])
    assert {router.request("POST", "/generate", generate(), headers=bearer(k)).status for k in (ALICE, BOB)} == {200}


def test_with_metrics_each_failed_run_appends_one_emf_line_with_its_reason_and_a_good_run_none(
    secure_router, aws: AwsEmulator, keys_dir: Path,
) -> None:
    secure_router(ALICE)
    emf = keys_dir.parent / "log" / "api-keys.emf"
    secret = aws.create_secret("keys", "not json " + BOB)

    failed = [sync(aws, secret, keys_dir, str(emf)) for _ in range(2)]
    put_keys(aws, secret, {"alice": api_keys.stored(ALICE)})
    good = sync(aws, secret, keys_dir, str(emf))

    assert [r.returncode for r in [*failed, good]] == [1, 1, 0]
    lines = emf.read_text().splitlines()
    assert len(lines) == 2 and BOB not in emf.read_text()
    event = json.loads(lines[0])
    assert event["_aws"]["CloudWatchMetrics"] == [{
        "Namespace": "NeuronServing", "Dimensions": [["Service"], ["Service", "InstanceId"]],
        "Metrics": [{"Name": "ApiKeySyncFailures", "Unit": "Count"}]}]
    assert (event["Service"], event["InstanceId"], event["ApiKeySyncFailures"]) == ("llama", "i-0123456789abcdef0", 1)
    assert event["Reason"] == ("the secret is not JSON: it must be an object mapping key names to keys or their "
                               "digests; the keys in force are unchanged")


def test_an_empty_object_is_a_secret_with_no_key_and_every_request_is_refused(
    secure_router, aws: AwsEmulator, keys_dir: Path,
) -> None:
    router = secure_router(ALICE)
    secret = aws.create_secret("keys", "{}")

    result = sync(aws, secret, keys_dir)

    assert (result.returncode, result.stdout) == (0, "api-keys: 0 key(s) in force: none, so every request is refused\n")
    assert (keys_dir / "api-keys.sha256").read_text() == "" and acl_digests(keys_dir) == []
    assert router.request("POST", "/generate", generate(), headers=bearer(ALICE)).status == 401


def test_entries_that_are_not_keys_are_ignored_by_name_never_by_value_and_fail_the_run_once_the_keys_are_in_force(
    aws: AwsEmulator, keys_dir: Path,
) -> None:
    short = "too-short-to-be-a-key"
    secret = aws.create_secret("keys", json.dumps({"ok": api_keys.stored(ALICE), "short": short,
                                                   "bad digest": "sha256:XYZ", "number": 7}))

    result = sync(aws, secret, keys_dir)

    assert result.returncode == 1
    assert result.stdout == "api-keys: 1 key(s) in force: ok\n"
    assert result.stderr.endswith("api-keys: 3 of the secret's 4 entries ignored (above), its 1 key(s) in force: "
                                  "fix or remove the ignored entries\n")
    assert "key 'short' ignored" in result.stderr and "key 'bad digest' ignored" in result.stderr
    assert "key 'number' ignored: it must be a string" in result.stderr
    assert short not in result.stderr
    assert (keys_dir / "api-keys.sha256").read_text() == api_keys.digest(ALICE) + "\n"
    assert oct((keys_dir / "api-keys.sha256").stat().st_mode & 0o777) == "0o600"
