"""Draining the router for a Spot interruption (neuron_serving/userdata/watch_interruption.py), through
the real HAProxy and fake TGI replicas: the health check fails at once, nothing in flight or arriving
is refused, and the watcher counts the requests in flight through the runtime API."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from routersim import Router, generate
from test_router_failover import stream_completes, wait_for_requests

from neuron_serving.userdata import watch_interruption

StartRouter = Callable[..., Router]


def draining_router(start_router: StartRouter, tmp_path: Path, **kwargs: object) -> tuple[Router, str]:
    drain_file = tmp_path / "draining.acl"
    drain_file.write_text(watch_interruption.DRAIN_FILE_TEXT)
    sock = str(tmp_path / "admin.sock")
    router = start_router(drain=True, drain_file=str(drain_file), runtime_socket=sock, **kwargs)
    return router, sock


def test_a_drained_router_fails_its_health_check_within_two_seconds_and_serves_every_request(
        start_router: StartRouter, tmp_path: Path) -> None:
    router, sock = draining_router(start_router, tmp_path, replicas=1, token_delay=0.1)
    assert router.request("GET", "/health").status == 200
    assert watch_interruption.in_flight(sock) == (0, 0)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # A 4-second streamed generation, in flight when the drain begins.
        long = pool.submit(stream_completes, router, 40)
        wait_for_requests(router, 1)
        assert watch_interruption.in_flight(sock) == (1, 0)
        began = time.monotonic()
        watch_interruption.drain_router(sock, str(tmp_path / "draining.acl"))
        health = router.request("GET", "/health")
        took = time.monotonic() - began
        assert health.status == 503, health
        assert b"draining" in health.body
        assert took < 2.0
        # A request that still arrives (the load balancer has not yet deregistered the host) is served.
        later = router.request("POST", "/generate", generate(3))
        assert later.status == 200, later
        assert long.result(timeout=15), "the generation in flight did not complete"
    assert router.request("GET", "/health").status == 503, "the drain does not last"
    assert router.request("HEAD", "/health").status == 503
    # HAProxy ends a stream's session just after its client has the last byte, as it writes the
    # request's log line then (routersim.Router.wait_for_log): the count may lag by a moment.
    deadline = time.monotonic() + 2
    while (counts := watch_interruption.in_flight(sock)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counts == (0, 0)
    router.check_alive()


def test_the_drain_file_holds_no_pattern_so_a_router_starts_serving(start_router: StartRouter,
                                                                    tmp_path: Path) -> None:
    router, sock = draining_router(start_router, tmp_path, replicas=3)
    assert router.request("GET", "/health").status == 200
    # The running router's copy is the one the watcher changes; the file on disk stays as shipped.
    answer = watch_interruption.runtime(sock, f"show acl {tmp_path / 'draining.acl'}")
    assert answer.strip() == "", answer
    watch_interruption.drain_router(sock, str(tmp_path / "draining.acl"))
    assert (tmp_path / "draining.acl").read_text() == watch_interruption.DRAIN_FILE_TEXT
    assert router.request("GET", "/health").status == 503
    statuses = [router.request("POST", "/generate", generate()).status for _ in range(6)]
    assert statuses == [200] * 6


def test_only_a_router_rendered_to_drain_has_the_drain_rule_and_the_runtime_socket() -> None:
    from routersim import make_plan

    from neuron_serving.render.router import render_router_config

    plain = render_router_config(make_plan(1))
    assert "draining" not in plain and "stats socket" not in plain
    drained = render_router_config(make_plan(1), drain=True)
    assert f"-f {watch_interruption.DRAIN_FILE} }}" in drained
    assert f"stats socket {watch_interruption.RUNTIME_SOCKET} mode 600 level user" in drained
