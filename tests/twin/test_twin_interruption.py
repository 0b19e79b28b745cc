"""A Spot host of a synthesized stack (``spot_percent``) booted on the host twin (tests/twin/host.py) and
told by its metadata service that it will be interrupted: its router, the real HAProxy under systemd,
fails the load balancer's health check within 2 s (and the watcher's poll) while the generation in
flight finishes; the host asks its group to replace it and reports the phase ``draining``. The
rebalance recommendation is shown on the simulated host (tests/boot/test_boot_interruption.py)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from neuron_serving.plan.phases import DRAINING, PHASE_TAG
from tests.twin.conftest import World, failure_report, request
from tests.twin.test_twin_boot import FLEET, boot, serves, stage, user_data

SPOT = {**FLEET, "spot_percent": "50"}


def test_a_spot_host_told_of_its_interruption_drains_and_asks_its_group_to_replace_it(world: World) -> None:
    launch, _, plan = user_data(SPOT)
    stage(world, launch)
    twin, imds, image = boot(world, launch, plan)
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    port = plan.router_port
    serves(port)
    assert twin.run("systemctl", "is-active", "neuron-serving-interruption").stdout.strip() == "active"
    # Generations take 0.1 s a token from now on: a 40-token one is in flight for 4 s.
    for replica in image.serving.values():
        replica.token_delay = 0.1
    result: list[tuple[int, Any]] = []

    def long_generation() -> None:
        status, body = request(f"http://127.0.0.1:{port}/generate",
                               {"inputs": "The twin says", "parameters": {"max_new_tokens": 40}}, timeout=60)
        result.append((status, body))

    in_flight = threading.Thread(target=long_generation)
    in_flight.start()
    time.sleep(0.5)
    notice = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    imds.set("spot/instance-action", json.dumps({"action": "terminate", "time": notice}))
    noticed = time.monotonic()
    while request(f"http://127.0.0.1:{port}/health", timeout=2)[0] != 503:
        assert time.monotonic() - noticed < 10, failure_report(twin)
        time.sleep(0.05)
    took = time.monotonic() - noticed
    assert took < 2.0 + 1.0, f"/health answered 503 {took:.1f} s after the notice (budget: 2 s + the 1 s poll)"
    # A request that still arrives before the load balancer deregisters the host is served.
    serves(port)
    in_flight.join(timeout=60)
    [(status, _)] = result
    assert status == 200, result
    deadline = time.monotonic() + 60
    log = twin.path("/var/log/neuron-serving/interruption.log")
    while "no request in flight: drained" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, (log.read_text() if log.exists() else "(no log)") + failure_report(twin)
        time.sleep(0.5)
    text = log.read_text()
    assert f"Spot interruption notice: terminate at {notice}: draining" in text, text
    [left] = world.aws.recorder.calls("TerminateInstanceInAutoScalingGroup")
    assert left.params["InstanceId"] == twin.instance_id
    assert left.params["ShouldDecrementDesiredCapacity"] in (False, "false")
    # The instance's tags as moto keeps them, which `neuron-serving status` reads.
    tags = world.aws.client("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [twin.instance_id]},
                                                          {"Name": "key", "Values": [PHASE_TAG]}])["Tags"]
    assert [t["Value"] for t in tags] == [DRAINING], tags
    assert request(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 503
    # Drained, the watcher has ended well: systemd does not start it again.
    assert twin.run("systemctl", "show", "-P", "Result", "neuron-serving-interruption").stdout.strip() == "success"
