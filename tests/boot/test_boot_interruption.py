"""Spot interruption handling on the simulated host (bootsim.py): the boot installs and starts the watcher,
which then runs for real (userdata/watch_interruption.py) against the twin's metadata service
(tests/twin/imds.py, here on a loopback port), the real HAProxy with the boot's router config options
(tests/router/routersim.py, fake TGI replicas) and the stubs' AWS CLI.

The host twin (tests/twin/test_twin_interruption.py) shows the interruption notice on a booted host;
here, the rebalance recommendation, the notice that follows one, and failures that must not stop a drain."""

from __future__ import annotations

import http.client
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bootsim import SIGNAL, Host, make_plan

from neuron_serving.plan.phases import DRAINING, PHASE_TAG
from neuron_serving.render.boot import INTERRUPTION_LOG, render_boot_script
from neuron_serving.userdata.watch_interruption import DRAIN_FILE
from tests.harness.userdata import spec_and_options
from tests.twin.imds import Imds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from routersim import MISSING_HAPROXY, Router, find_haproxy, generate, router_launcher

UNIT = "neuron-serving-interruption.service"
NOTICE = "2026-05-01T12:02:00Z"


@pytest.fixture
def drained_host(make_host: Callable[..., Host], tmp_path: Path) -> Iterator[tuple[Host, Router, Imds]]:
    """A simulated host booted with interruptions, the real HAProxy serving its router options (its
    runtime socket and drain file under the host's root, where the watcher looks) and a metadata
    service on loopback."""
    haproxy = find_haproxy()
    if haproxy is None:
        pytest.fail(MISSING_HAPROXY)
    plan = make_plan("inf2.24xlarge", 4)
    boot = render_boot_script(plan, *spec_and_options(plan, {"signal": SIGNAL, "interruptions": True}))
    host = make_host(plan.instance.devices)
    done = host.boot(boot)
    assert done.returncode == 0, done.stdout
    # A socket's path has at most 97 characters for HAProxy (108 for sun_path): a short directory.
    short = Path(tempfile.mkdtemp(prefix="drain-", dir="/tmp"))
    imds = Imds(instance_id=host.instance_id, instance_type=plan.instance.name, region="us-east-2",
                zone="us-east-2a", role="HostRole", credentials={"AccessKeyId": "A", "SecretAccessKey": "S"})
    imds.start(("127.0.0.1", 0))
    with router_launcher(haproxy, tmp_path) as launch:
        router = launch(replicas=1, token_delay=0.1, drain=True, drain_file=str(host.path(DRAIN_FILE)),
                        runtime_socket=str(short / "admin.sock"))
        (router.log_path.parent / "socket-path").write_text(str(short / "admin.sock"))
        try:
            yield host, router, imds
        finally:
            imds.stop()
            shutil.rmtree(short, ignore_errors=True)


def start_watcher(host: Host, router: Router, imds: Imds, **knobs: str) -> subprocess.Popen[str]:
    """The unit's command, as systemd runs it (host.env in its environment), asking ``imds``."""
    unit = host.path(f"/etc/systemd/system/{UNIT}").read_text()
    [command] = [line.removeprefix("ExecStart=") for line in unit.splitlines() if line.startswith("ExecStart=")]
    _env, python, program, *args = shlex.split(command)
    env = dict(line.split("=", 1) for line in host.path("/etc/neuron-serving/host.env").read_text().split())
    # The runtime socket where the router has it (see drained_host); everything else under the host's root.
    sock = router.log_path.parent / "socket-path"
    return subprocess.Popen([python, str(host.path(program)), *args, "--imds", imds.url,
                             "--socket", sock.read_text()],
                            env={**host.env, **env, **knobs}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def health(router: Router) -> int:
    return router.request("GET", "/health", timeout=2).status


def wait_for(what: Callable[[], bool], timeout: float) -> float:
    began = time.monotonic()
    while not what():
        assert time.monotonic() - began < timeout
        time.sleep(0.05)
    return time.monotonic() - began


def stream(router: Router, tokens: int, results: list[bool]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
    conn.request("POST", "/generate_stream", body=json.dumps(generate(tokens)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    results.append(resp.status == 200 and resp.read().count(b"data:") == tokens)
    conn.close()


def test_the_boot_enables_the_watcher_with_the_router_and_starts_it_once_the_router_serves(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, _, _ = drained_host
    systemctl = host.calls("systemctl")
    assert ["enable", "haproxy", "neuron-serving-interruption"] in systemctl
    assert systemctl.index(["restart", "haproxy"]) < systemctl.index(["start", "neuron-serving-interruption"])


def test_a_rebalance_recommendation_drains_the_host_and_asks_the_group_to_replace_it(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    host.forget_calls()
    watcher = start_watcher(host, router, imds)
    try:
        time.sleep(1.5)
        assert health(router) == 200 and watcher.poll() is None
        # A 3-second generation in flight when the recommendation comes.
        results: list[bool] = []
        long = threading.Thread(target=stream, args=(router, 30, results))
        long.start()
        wait_for(lambda: sum(len(f.served) for f in router.replicas.values()) == 1, 5)
        imds.set("events/recommendations/rebalance", json.dumps({"noticeTime": NOTICE}))
        took = wait_for(lambda: health(router) == 503, 5)
        assert took < 2.0 + 1.0, f"/health answered 503 {took:.1f} s after the recommendation"
        assert router.request("POST", "/generate", generate(2)).status == 200
        long.join(timeout=15)
        assert results == [True]
        output, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, output
    assert f"rebalance recommendation at {NOTICE}: draining" in output
    assert "no request in flight: drained" in output
    [terminate] = [c for c in host.calls("aws") if c[:2] == ["autoscaling", "terminate-instance-in-auto-scaling-group"]]
    assert terminate[terminate.index("--instance-id") + 1] == host.instance_id
    assert "--no-should-decrement-desired-capacity" in terminate
    [tags] = [json.loads(c[c.index("--tags") + 1]) for c in host.calls("aws") if c[:2] == ["ec2", "create-tags"]]
    assert {"Key": PHASE_TAG, "Value": DRAINING} in tags
    assert INTERRUPTION_LOG.startswith("/var/log/neuron-serving/")


def test_a_drain_goes_on_when_the_group_and_the_tags_refuse_and_gives_up_at_the_notice_deadline(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    results: list[bool] = []
    # A 5-second generation, longer than the notice leaves: the watcher stops waiting at the deadline less
    # its margin (10 s), 3 s on.
    long = threading.Thread(target=stream, args=(router, 50, results))
    long.start()
    wait_for(lambda: sum(len(f.served) for f in router.replicas.values()) == 1, 5)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 13))
    imds.set("events/recommendations/rebalance", json.dumps({"noticeTime": NOTICE}))
    watcher = start_watcher(host, router, imds, STUB_TERMINATE_FAIL="1", STUB_TAGS_FAIL="1")
    try:
        wait_for(lambda: health(router) == 503, 3)
        # The interruption notice follows the recommendation: its deadline now bounds the wait.
        imds.set("spot/instance-action", json.dumps({"action": "terminate", "time": deadline}))
        output, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        long.join(timeout=30)
    assert watcher.returncode == 0, output
    assert "TerminateInstanceInAutoScalingGroup" in output and "failed (exit" in output
    assert f"Spot interruption notice: terminate at {deadline}" in output
    assert "gave up waiting at the deadline: requests still in flight: 1 at a replica and 0 queued" in output
    assert health(router) == 503
    assert results == [True], "the drain cut the generation in flight"
