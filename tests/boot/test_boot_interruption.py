"""Spot interruption handling on the simulated host (bootsim.py): the boot installs and starts the watcher,
which then runs for real (userdata/watch_interruption.py) against the twin's metadata service
(tests/twin/imds.py, here on a loopback port), the real HAProxy with the boot's router config options
(tests/router/routersim.py, fake TGI replicas) and the stubs' AWS CLI.

The host twin (tests/twin/test_twin_interruption.py) shows the interruption notice on a booted host;
here, the rebalance recommendation (logged only), the group's termination through its lifecycle hook, the
notice that follows one, and failures that must not stop a drain."""

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
from neuron_serving.render.boot_options import TerminationHook
from neuron_serving.userdata.watch_interruption import DRAIN_FILE
from tests.harness.userdata import spec_and_options
from tests.twin.imds import Imds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from routersim import MISSING_HAPROXY, Router, find_haproxy, generate, router_launcher

UNIT = "neuron-serving-interruption.service"
NOTICE = "2026-05-01T12:02:00Z"
HOOK = TerminationHook(hook_name="neuron-serving-termination", group_name="Stack-Fleet", heartbeat_timeout_seconds=30)
HOOKED = {"termination_hook": HOOK}
"""A host of a group with a termination lifecycle hook, as ``NeuronLlamaStack`` makes a Spot fleet."""


@pytest.fixture
def drained_host(make_host: Callable[..., Host], tmp_path: Path,
                 request: pytest.FixtureRequest) -> Iterator[tuple[Host, Router, Imds]]:
    """A simulated host booted with interruptions (and the options the test's parameter adds, if any), the
    real HAProxy serving its router options (its runtime socket and drain file under the host's root, where
    the watcher looks) and a metadata service on loopback."""
    haproxy = find_haproxy()
    if haproxy is None:
        pytest.fail(MISSING_HAPROXY)
    plan = make_plan("inf2.24xlarge", 4)
    more = getattr(request, "param", {})
    boot = render_boot_script(plan, *spec_and_options(plan, {"signal": SIGNAL, "interruptions": True, **more}))
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
    """The unit's command, as systemd runs it (its environment files in its environment), asking ``imds``."""
    unit = host.path(f"/etc/systemd/system/{UNIT}").read_text()
    [command] = [line.removeprefix("ExecStart=") for line in unit.splitlines() if line.startswith("ExecStart=")]
    _env, python, program, *args = shlex.split(command)
    env: dict[str, str] = {}
    for path in [line.removeprefix("EnvironmentFile=") for line in unit.splitlines()
                 if line.startswith("EnvironmentFile=")]:
        # NAME=value lines, the value shell-quoted (render.boot._env_file), as systemd reads them.
        env.update(dict(word.split("=", 1) for word in shlex.split(host.path(path).read_text())))
    # The runtime socket where the router has it (see drained_host); everything else under the host's root.
    sock = router.log_path.parent / "socket-path"
    host.steer(knobs)  # what AWS answers the watcher's calls
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


def test_a_spot_interruption_notice_drains_the_host_at_once_and_asks_the_group_to_replace_it(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    host.forget_calls()
    watcher = start_watcher(host, router, imds)
    try:
        time.sleep(1.5)
        assert health(router) == 200 and watcher.poll() is None
        # A 3-second generation in flight when the notice comes.
        results: list[bool] = []
        long = threading.Thread(target=stream, args=(router, 30, results))
        long.start()
        wait_for(lambda: sum(len(f.served) for f in router.replicas.values()) == 1, 5)
        deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
        imds.set("spot/instance-action", json.dumps({"action": "terminate", "time": deadline}))
        took = wait_for(lambda: health(router) == 503, 5)
        assert took < 2.0 + 1.0, f"/health answered 503 {took:.1f} s after the notice"
        assert router.request("POST", "/generate", generate(2)).status == 200
        long.join(timeout=15)
        assert results == [True]
        output, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, output
    assert f"Spot interruption notice: terminate at {deadline}: draining" in output
    assert "no request in flight: drained" in output
    [terminate] = [c for c in host.calls("aws") if c[:2] == ["autoscaling", "terminate-instance-in-auto-scaling-group"]]
    assert terminate[terminate.index("--instance-id") + 1] == host.instance_id
    assert "--no-should-decrement-desired-capacity" in terminate
    [tags] = [json.loads(c[c.index("--tags") + 1]) for c in host.calls("aws") if c[:2] == ["ec2", "create-tags"]]
    assert {"Key": PHASE_TAG, "Value": DRAINING} in tags
    assert INTERRUPTION_LOG.startswith("/var/log/neuron-serving/")


def test_a_rebalance_recommendation_is_logged_and_neither_drains_the_host_nor_asks_the_group_to_replace_it(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    host.forget_calls()
    watcher = start_watcher(host, router, imds)
    try:
        time.sleep(1.5)
        imds.set("events/recommendations/rebalance", json.dumps({"noticeTime": NOTICE}))
        # Three of the watcher's polls.
        time.sleep(3.5)
        assert health(router) == 200
        assert watcher.poll() is None, "the watcher ended at a rebalance recommendation"
    finally:
        watcher.kill()
        output, _ = watcher.communicate(timeout=10)
    assert f"rebalance recommendation at {NOTICE}: serving on" in output
    assert "draining" not in output
    assert not [c for c in host.calls("aws") if c[:1] == ["autoscaling"]]
    assert not [c for c in host.calls("aws") if c[:2] == ["ec2", "create-tags"]]


@pytest.mark.parametrize("drained_host", [HOOKED], indirect=True)
def test_when_its_group_terminates_it_the_host_drains_waits_for_its_requests_then_completes_the_lifecycle_action(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    host.forget_calls()
    watcher = start_watcher(host, router, imds)
    try:
        time.sleep(1.5)
        results: list[bool] = []
        long = threading.Thread(target=stream, args=(router, 30, results))
        long.start()
        wait_for(lambda: sum(len(f.served) for f in router.replicas.values()) == 1, 5)
        imds.set("autoscaling/target-lifecycle-state", "Terminated")
        wait_for(lambda: health(router) == 503, 3)
        # Not before the generation in flight has finished.
        assert not [c for c in host.calls("aws") if c[:2] == ["autoscaling", "complete-lifecycle-action"]]
        long.join(timeout=15)
        assert results == [True]
        output, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, output
    assert "the Auto Scaling group Stack-Fleet terminates this host (lifecycle hook neuron-serving-termination)" \
        ": draining" in output
    assert output.index("no request in flight: drained") < output.index("completed the termination lifecycle action")
    [complete] = [c for c in host.calls("aws") if c[:2] == ["autoscaling", "complete-lifecycle-action"]]
    assert complete[complete.index("--instance-id") + 1] == host.instance_id
    assert complete[complete.index("--auto-scaling-group-name") + 1] == HOOK.group_name
    assert complete[complete.index("--lifecycle-hook-name") + 1] == HOOK.hook_name
    assert complete[complete.index("--lifecycle-action-result") + 1] == "CONTINUE"
    # The group is already terminating the host: it is not asked again.
    assert not [c for c in host.calls("aws") if c[:2] == ["autoscaling", "terminate-instance-in-auto-scaling-group"]]


@pytest.mark.parametrize("drained_host", [HOOKED], indirect=True)
def test_a_host_that_cannot_complete_the_lifecycle_action_asks_again_until_the_hooks_timeout(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    host.forget_calls()
    imds.set("autoscaling/target-lifecycle-state", "Terminated")
    began = time.monotonic()
    watcher = start_watcher(host, router, imds, STUB_LIFECYCLE_FAIL="1")
    try:
        output, _ = watcher.communicate(timeout=HOOK.heartbeat_timeout_seconds + 30)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, output
    tries = [c for c in host.calls("aws") if c[:2] == ["autoscaling", "complete-lifecycle-action"]]
    # Every 5 s for the hook's 30 s.
    assert 5 <= len(tries) <= 8, len(tries)
    assert time.monotonic() - began >= HOOK.heartbeat_timeout_seconds
    assert "gave up completing the lifecycle action" in output


@pytest.mark.parametrize("drained_host", [HOOKED], indirect=True)
def test_a_drain_goes_on_when_the_tags_and_the_lifecycle_action_are_refused_and_gives_up_at_a_notices_deadline(
        drained_host: tuple[Host, Router, Imds]) -> None:
    host, router, imds = drained_host
    results: list[bool] = []
    # A 5-second generation, longer than the notice leaves: the watcher stops waiting at the deadline less
    # its margin (10 s), 3 s on.
    long = threading.Thread(target=stream, args=(router, 50, results))
    long.start()
    wait_for(lambda: sum(len(f.served) for f in router.replicas.values()) == 1, 5)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 13))
    imds.set("autoscaling/target-lifecycle-state", "Terminated")
    watcher = start_watcher(host, router, imds, STUB_LIFECYCLE_FAIL="1", STUB_TAGS_FAIL="1")
    try:
        wait_for(lambda: health(router) == 503, 3)
        # The interruption notice comes while the group terminates the host: its deadline now bounds the wait.
        imds.set("spot/instance-action", json.dumps({"action": "terminate", "time": deadline}))
        output, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        long.join(timeout=30)
    assert watcher.returncode == 0, output
    assert "CreateTags operation: You are not authorized" in output
    assert f"Spot interruption notice: terminate at {deadline}: waiting for the requests in flight until then" \
        in output
    assert "gave up waiting at the deadline: requests still in flight: 1 at a replica and 0 queued" in output
    # The notice's time has come: the action is tried once, then left to the hook's timeout.
    assert "CompleteLifecycleAction operation: No active Lifecycle Action" in output
    assert "gave up completing the lifecycle action" in output
    assert health(router) == 503
    assert results == [True], "the drain cut the generation in flight"
