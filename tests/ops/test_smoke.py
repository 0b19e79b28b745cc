"""``neuron-serving smoke`` against the REAL router (HAProxy with the rendered config) in front of the fake
TGI replicas and fake vLLM servers of tests/router, and, with ``--stack``, a stack created in moto's
CloudFormation (tests/harness/aws.py) whose outputs point at that router. The CLI runs in this process
(``main``), as a user runs it."""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from neuron_serving.cli import main
from neuron_serving.ops import smoke
from neuron_serving.plan.engines import ENGINES, engine
from neuron_serving.userdata import api_keys
from tests.harness.aws import REGION, AwsEmulator

sys.path.insert(0, str(Path(__file__).parents[1] / "router"))
from routersim import MISSING_HAPROXY, Router, find_haproxy, router_launcher

KEY, OTHER = api_keys.new_key(), api_keys.new_key()
TOKEN_DELAY = 0.01
STACK = "SmokeStack"
INSTANCE = "i-0123456789abcdef0"


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """``start_router(name, *keys)``: the real router of engine ``name`` with one fake replica; with keys,
    API keys are required and those are the keys in force."""
    haproxy = find_haproxy()
    if haproxy is None:
        if os.environ.get("CI"):
            pytest.fail(MISSING_HAPROXY)
        pytest.skip(MISSING_HAPROXY)
    numbers = itertools.count()

    with router_launcher(haproxy, tmp_path) as launch:
        def start(name: str, *keys: str) -> Router:
            number = next(numbers)
            options: dict[str, Any] = {}
            if keys:
                keys_file = tmp_path / f"keys-{number}"
                keys_file.write_text(api_keys.keys_file_text([api_keys.digest(k) for k in keys]))
                options = {"api_keys": True, "keys_file": str(keys_file),
                           "runtime_socket": str(tmp_path / f"admin-{number}.sock")}
            return launch(1, TOKEN_DELAY, serving=engine(name), **options)

        yield start


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["smoke", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, *args, "--output", "json")
    return code, json.loads(out), err


def served(router: Router) -> list[str]:
    return [s.path for fake in router.replicas.values() for s in fake.served]


@pytest.fixture(autouse=True)
def no_key_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(smoke.API_KEY_ENV, raising=False)


# --- through the real router ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_route_of_the_engine_passes_with_ttft_below_latency_and_tokens_counted(start_router, capsys, name):
    router = start_router(name)

    code, report, err = run_json(capsys, "--url", f"http://127.0.0.1:{router.port}", "--engine", name)

    assert code == 0, err
    assert report["passed"] is True and report["engine"] == name
    routes = report["routes"]
    assert [(r["label"], r["route"]) for r in routes] == [
        (r.label, r.path) for r in engine(name).smoke_requests(smoke.PROMPT, smoke.MAX_TOKENS)]
    for route in routes:
        assert route["passed"] and route["status"] == 200, route
        assert route["tokens"] == smoke.MAX_TOKENS, route
        assert route["answer"].startswith("tok0 tok1"), route
    (streamed,) = [r for r in routes if r["ttft"] is not None]
    assert 0 < streamed["ttft"] < streamed["latency"]
    # The tokens came 10 ms apart: the first well before the last.
    assert streamed["latency"] - streamed["ttft"] >= (smoke.MAX_TOKENS - 1) * TOKEN_DELAY * 0.8
    assert len(served(router)) == 3


@pytest.mark.parametrize("name", list(ENGINES))
def test_without_engine_one_get_tells_the_engine(start_router, capsys, name):
    # vllm and nxdi both run vLLM's OpenAI server, which no GET through the router tells apart: such an
    # endpoint is named by the first engine of that API, whose requests are the other's (docs/deploying.md).
    router = start_router(name)
    first_alike = next(e.name for e in ENGINES.values() if e.probe == ENGINES[name].probe)

    code, report, _ = run_json(capsys, "--url", f"http://127.0.0.1:{router.port}/")

    assert (code, report["engine"], report["passed"]) == (0, first_alike, True)
    assert ENGINES[first_alike].smoke_requests("x", 4) == ENGINES[name].smoke_requests("x", 4)
    assert first_alike == name or (name, first_alike) == ("nxdi", "vllm")


def test_the_text_report_shows_each_route_and_the_verdict(start_router, capsys):
    router = start_router("tgi")

    code, out, _ = run(capsys, "--url", f"http://127.0.0.1:{router.port}")

    assert code == 0
    for route in ("/generate ", "/generate_stream", "/v1/chat/completions", "tok0 tok1 tok2", "all routes passed"):
        assert route in out, out


@pytest.mark.parametrize("name", list(ENGINES))
def test_a_replica_answering_errors_fails_that_route_and_exits_1(start_router, capsys, name):
    router = start_router(name)
    for fake in router.replicas.values():
        fake.failing.add("/v1/chat/completions")

    code, report, _ = run_json(capsys, "--url", f"http://127.0.0.1:{router.port}", "--engine", name)

    assert code == 1 and report["passed"] is False
    (failed,) = [r for r in report["routes"] if not r["passed"]]
    assert failed["route"] == "/v1/chat/completions"
    assert failed["status"] in (424, 500)
    assert failed["problem"] in ("Request failed during generation: Server error: device lost",
                                 "EngineCore encountered an issue.")
    code, out, _ = run(capsys, "--url", f"http://127.0.0.1:{router.port}", "--engine", name)
    assert code == 1 and "1 of 3 routes failed" in out


@pytest.mark.parametrize("url", ["localhost:8080", "ftp://host", "http://host:port", "http://host:70000"])
def test_a_url_that_is_not_http_is_one_line(capsys, url):
    code, _, err = run(capsys, "--url", url)

    assert code == 1 and err.startswith(f"neuron-serving: --url {url!r} is not an http:// or https:// URL")


def test_a_wrong_engine_is_named_before_any_generation(start_router, capsys):
    router = start_router("vllm")

    code, _, err = run(capsys, "--url", f"http://127.0.0.1:{router.port}", "--engine", "tgi")

    assert code == 1
    assert "answered GET /info with 404" in err and "--engine vllm" in err
    assert served(router) == []


# --- API keys at the real router ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ENGINES))
def test_with_the_right_key_every_route_passes(start_router, capsys, monkeypatch, name):
    router = start_router(name, KEY)
    monkeypatch.setenv(smoke.API_KEY_ENV, KEY)

    code, report, err = run_json(capsys, "--url", f"http://127.0.0.1:{router.port}")

    assert (code, report["passed"]) == (0, True), err
    assert KEY not in json.dumps(report) + err


def test_without_a_key_the_endpoint_that_needs_one_gets_no_generation_request(start_router, capsys):
    router = start_router("tgi", KEY)

    code, out, err = run(capsys, "--url", f"http://127.0.0.1:{router.port}", "--engine", "tgi")

    assert (code, out) == (1, "")
    assert "requires an API key (it answered 401) and none was given" in err
    assert "neuron-serving api-key create smoke --stack" in err and "about 2 minutes" in err
    assert served(router) == []


def test_a_wrong_key_gets_the_401_message_and_no_generation_request(start_router, capsys):
    router = start_router("vllm", KEY)

    code, report, err = run_json(capsys, "--url", f"http://127.0.0.1:{router.port}", "--api-key", OTHER)

    assert code == 1 and report["passed"] is False
    assert "refused the API key (401)" in err and "refused the API key (401)" in report["error"]
    assert "neuron-serving api-key list" in err
    assert OTHER not in err
    assert served(router) == []


# --- unreachable endpoints ----------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_closed_port_gets_the_port_forwarding_message(capsys):
    code, out, err = run(capsys, "--url", f"http://127.0.0.1:{closed_port()}", "--engine", "vllm", "--region",
                         "eu-west-1")

    assert (code, out) == (1, "")
    assert "Connection refused" in err
    assert ("aws ssm start-session --region eu-west-1 --target <instance id> --document-name "
            "AWS-StartPortForwardingSession --parameters '{\"portNumber\":[\"<RouterPort output>\"],"
            "\"localPortNumber\":[\"8080\"]}'") in err
    assert "neuron-serving smoke --url http://localhost:8080 --engine vllm" in err
    assert "Traceback" not in err


def test_a_connection_that_never_comes_gets_the_port_forwarding_message(capsys):
    # A listener whose accept queue is full: Linux drops further SYNs, so a connect hangs as it does
    # towards an internal load balancer's private address from outside its VPC.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        waiting = []
        with contextlib.suppress(TimeoutError):
            for _ in range(8):  # until the queue is full: a connect times out
                waiting.append(socket.create_connection(("127.0.0.1", port), timeout=0.3))
        try:
            code, _, err = run(capsys, "--url", f"http://127.0.0.1:{port}", "--timeout", "0.5")
        finally:
            for sock in waiting:
                sock.close()

    assert code == 1
    assert "no connection within 0.5 s" in err
    assert "AWS-StartPortForwardingSession" in err and "neuron-serving smoke --url http://localhost:8080" in err


def test_an_https_endpoint_whose_certificate_is_not_trusted_is_refused(tmp_path, capsys):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code, _, err = run(capsys, "--url", f"https://localhost:{server.server_address[1]}", "--engine", "tgi")
    finally:
        server.shutdown()
        server.server_close()

    assert code == 1
    assert "TLS certificate is not trusted here (self-signed certificate)" in err
    assert "Traceback" not in err


# --- --stack: a stack in moto's CloudFormation ----------------------------------------------------------------


@pytest.fixture
def emulator(aws_for: Callable[..., AwsEmulator]) -> AwsEmulator:
    return aws_for("cloudformation", "autoscaling", "ec2", default_region=REGION)


def create_stack(emulator: AwsEmulator, outputs: dict[str, str]) -> None:
    template = {"Resources": {"Handle": {"Type": "AWS::CloudFormation::WaitConditionHandle"}},
                "Outputs": {key: {"Value": value} for key, value in outputs.items()}}
    emulator.client("cloudformation").create_stack(StackName=STACK, TemplateBody=json.dumps(template))


@pytest.mark.parametrize("name", list(ENGINES))
def test_with_stack_the_url_engine_and_key_come_from_its_outputs(start_router, emulator, capsys, name):
    router = start_router(name, KEY)
    create_stack(emulator, {"EndpointUrl": f"http://127.0.0.1:{router.port}", "Engine": name,
                            "ApiKeysSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:k",
                            "RouterPort": "8080", "InstanceId": INSTANCE})

    code, report, err = run_json(capsys, "--stack", STACK, "--api-key", KEY)

    assert (code, report["engine"], report["passed"]) == (0, name, True), err


def test_with_stack_requiring_keys_and_no_key_nothing_is_sent(start_router, emulator, capsys):
    router = start_router("tgi", KEY)
    create_stack(emulator, {"EndpointUrl": f"http://127.0.0.1:{router.port}", "Engine": "tgi",
                            "ApiKeysSecretArn": "arn:aws:secretsmanager:eu-west-1:123456789012:secret:k"})

    code, report, err = run_json(capsys, "--stack", STACK)

    assert code == 1
    assert f"`neuron-serving api-key create smoke --stack {STACK}`" in err and "about 2 minutes" in err
    assert "No request was sent" in report["error"]
    (frontend,) = [row for row in router.stats() if (row["pxname"], row["svname"]) == ("router", "FRONTEND")]
    assert frontend["stot"] == "0"


def test_with_stack_an_unresolvable_internal_url_gets_the_command_with_the_stacks_instance(emulator, capsys):
    create_stack(emulator, {"EndpointUrl": "http://internal-Neuron-Endpoint-123.eu-west-1.elb.invalid",
                            "Engine": "tgi", "RouterPort": "8080", "InstanceId": INSTANCE})

    code, _, err = run(capsys, "--stack", STACK, "--region", emulator.region)

    assert code == 1
    assert "its name does not resolve" in err
    assert (f"aws ssm start-session --region {emulator.region} --target {INSTANCE} --document-name "
            "AWS-StartPortForwardingSession --parameters '{\"portNumber\":[\"8080\"],\"localPortNumber\":[\"8080\"]}'"
            ) in err
    assert "neuron-serving smoke --url http://localhost:8080 --engine tgi" in err


def test_with_a_fleet_the_host_is_an_in_service_instance_of_its_group(emulator, capsys):
    ec2 = emulator.client("ec2")
    image = ec2.describe_images()["Images"][0]["ImageId"]
    autoscaling = emulator.client("autoscaling")
    autoscaling.create_launch_configuration(LaunchConfigurationName="lc", ImageId=image, InstanceType="inf2.xlarge")
    autoscaling.create_auto_scaling_group(AutoScalingGroupName="fleet", LaunchConfigurationName="lc", MinSize=1,
                                          MaxSize=1, AvailabilityZones=[f"{emulator.region}a"])
    (instance,) = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["fleet"])[
        "AutoScalingGroups"][0]["Instances"]
    create_stack(emulator, {"EndpointUrl": f"http://127.0.0.1:{closed_port()}", "Engine": "vllm",
                            "RouterPort": "8080", "AutoScalingGroupName": "fleet"})

    code, _, err = run(capsys, "--stack", STACK)

    assert code == 1
    assert f"--target {instance['InstanceId']} " in err
    assert "--engine vllm" in err


def test_a_missing_stack_is_one_line(emulator, capsys):
    code, out, err = run(capsys, "--stack", "NoSuchStack")

    assert (code, out) == (1, "")
    assert err.startswith("neuron-serving: stack NoSuchStack not found")
