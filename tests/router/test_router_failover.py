"""A replica dying under load and coming back, through the real HAProxy and fake TGI replicas."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from routersim import Router, generate

StartRouter = Callable[..., Router]


def stream_completes(router: Router, tokens: int) -> bool:
    """Whether a streamed generation of ``tokens`` tokens arrives whole through the router."""
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
    try:
        conn.request("POST", "/generate_stream", body=json.dumps(generate(tokens)),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        events = resp.read().count(b"data:")
        return resp.status == 200 and events == tokens
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_for_requests(router: Router, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while sum(len(fake.served) for fake in router.replicas.values()) < count:
        assert time.monotonic() < deadline, "the requests did not all reach a replica"
        time.sleep(0.01)


def test_a_killed_replica_loses_only_the_requests_in_flight_on_it(start_router: StartRouter) -> None:
    # Six 2-second streams, two on each replica; then replica-1 dies under them.
    router = start_router(replicas=3, token_delay=0.1)
    with ThreadPoolExecutor(max_workers=6) as pool:
        streams = [pool.submit(stream_completes, router, 20) for _ in range(6)]
        wait_for_requests(router, 6)
        in_flight = len(router.replicas["replica-1"].served)
        router.replicas["replica-1"].kill()

        later = [router.request("POST", "/generate", generate()).status for _ in range(6)]

        completed = [s.result(timeout=10) for s in streams]
    assert in_flight == 2
    assert completed.count(False) == in_flight
    assert later == [200] * 6


def test_a_restarted_replica_takes_traffic_within_two_fast_checks(start_router: StartRouter) -> None:
    # Checks every 5 s while up, every second while down or changing state (the production
    # intervals): back after 2 successful checks, well before one 5-second interval.
    router = start_router(replicas=3, health_check_interval_ms=5000)
    victim = router.replicas["replica-1"]
    victim.kill()
    statuses = [router.request("POST", "/generate", generate()).status for _ in range(3)]
    router.wait_for_states({"replica-1": "DOWN"}, timeout=1)
    served_before = len(victim.served)

    victim.start()
    restarted = time.monotonic()
    router.wait_for_states({"replica-1": "UP"}, timeout=4.5)
    back_after = time.monotonic() - restarted
    later = [router.request("POST", "/generate", generate()).replica for _ in range(6)]

    assert statuses == [200] * 3
    assert back_after < 3.0
    assert "replica-1" in later
    assert len(victim.served) > served_before
