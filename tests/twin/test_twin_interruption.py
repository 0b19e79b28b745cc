"""A Spot host of a synthesized fleet of two instance types (the ``fleet_capacity`` template: inf2.24xlarge
and inf2.8xlarge, ``spot_percent`` 50) booted on the host twin (tests/twin/host.py) as the second type: it
lays out that type's one replica, as its metadata service names the type. Then told by that service that
it will be interrupted: its router, the real HAProxy under systemd, fails the load balancer's health check
within 2 s (and the watcher's poll) while the generation in flight finishes; the host asks its group to
replace it, reports the phase ``draining`` and, drained, completes the group's termination lifecycle action
(Auto Scaling calls the termination hook on a Spot interruption notice). The rebalance recommendation and the
group's own termination are shown on the simulated host (tests/boot/test_boot_interruption.py). One boot shows
both, as each twin boot costs a minute and more."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from neuron_serving.plan.phases import DRAINING, PHASE_TAG
from tests.cdk.conftest import SNAPSHOT_CONFIGS
from tests.twin.conftest import World, failure_report, request
from tests.twin.test_twin_boot import boot, serves, signals, stage, user_data


def test_a_spot_host_of_the_second_type_serves_its_own_layout_then_drains_on_its_interruption(world: World) -> None:
    launch, _, plan = user_data(SNAPSHOT_CONFIGS["fleet_capacity"])
    # The template's layout is planned on its first type, inf2.24xlarge: six replicas.
    assert plan.instance.name == "inf2.24xlarge" and len(plan.replicas) == 6
    stage(world, launch)
    twin, imds, image = boot(world, launch, plan, instance_type="inf2.8xlarge", devices=1)
    assert twin.wait_boot_script(timeout=300) == "done", failure_report(twin)
    assert signals(world)[-1] == ("SUCCESS", twin.instance_id)
    # This host is an inf2.8xlarge: one replica on its one device, behind a router of one server.
    assert sorted(image.serving) == ["replica-0"]
    assert twin.path("/etc/haproxy/haproxy.cfg").read_text().count("    server replica-") == 1
    assert not twin.path("/etc/neuron-serving/layouts").exists()
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
    # The budget: the router stops taking new requests within 2 s of the notice (the watcher polls
    # every second, then one runtime API command).
    print(f"/health answered 503 {took:.2f} s after the notice")
    assert took < 2.0, f"/health answered 503 {took:.1f} s after the notice (budget: 2 s)"
    # A request that still arrives before the load balancer deregisters the host is served.
    serves(port)
    in_flight.join(timeout=60)
    [(status, _)] = result
    assert status == 200, result
    deadline = time.monotonic() + 60
    log = twin.path("/var/log/neuron-serving/interruption.log")
    while "completed the termination lifecycle action" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, (log.read_text() if log.exists() else "(no log)") + failure_report(twin)
        time.sleep(0.5)
    text = log.read_text()
    assert f"Spot interruption notice: terminate at {notice}: draining" in text, text
    [left] = world.aws.recorder.calls("TerminateInstanceInAutoScalingGroup")
    assert left.params["InstanceId"] == twin.instance_id
    assert left.params["ShouldDecrementDesiredCapacity"] in (False, "false")
    [done] = world.aws.recorder.calls("CompleteLifecycleAction")
    assert (done.params["InstanceId"], done.params["LifecycleActionResult"]) == (twin.instance_id, "CONTINUE")
    assert done.params["LifecycleHookName"] == "neuron-serving-termination"
    assert done.params["AutoScalingGroupName"] == "NeuronLlamaStack-NeuronServingFleet"
    assert text.index("no request in flight: drained") < text.index("completed the termination lifecycle action")
    # The instance's tags as moto keeps them, which `neuron-serving status` reads.
    tags = world.aws.client("ec2").describe_tags(Filters=[{"Name": "resource-id", "Values": [twin.instance_id]},
                                                          {"Name": "key", "Values": [PHASE_TAG]}])["Tags"]
    assert [t["Value"] for t in tags] == [DRAINING], tags
    assert request(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 503
    # Drained, the watcher has ended well: systemd does not start it again.
    assert twin.run("systemctl", "show", "-P", "Result", "neuron-serving-interruption").stdout.strip() == "success"
