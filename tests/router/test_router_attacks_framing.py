"""The second attack on the router (issue 37, part 3), kept as tests beside the first
(test_router_attacks.py): the real HAProxy builds (conftest.py: Ubuntu 22.04's 2.4 and Debian 12's
2.6) with the config rendered for each engine, API keys on, and a recording relay in front of the
replica, so that each test asserts what the router answered AND, from the bytes the replica
received, that nothing the attack carried reached it.

Found: trailer fields after the last chunk skipped the header allowlist; ``Transfer-Encoding:
chunked,`` was forwarded as sent; userinfo in an absolute-form target reached the replica's request
line; a body of any size passed; an obs-fold continuation landed inside an allowed header's value;
and connections held without a key (after ``/health``, or idle) took every connection slot, so
that the load balancer's health check, authorised requests and the metrics endpoint timed out."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from rawhttp import Message, RawConnection, exchange, request
from routersim import Router, http_request

# The first attack's request, keys and helpers, so that both suites attack alike.
from test_router_attacks import BODY, KEY, OTHER, auth, recorder, route

from neuron_serving.plan.engines import Engine
from neuron_serving.plan.engines.base import openai_error_body
from neuron_serving.render.router import (
    FOLDED_HEADER,
    LENGTH_REQUIRED,
    USERINFO,
    body_too_large_message,
    max_request_body_bytes,
)


@pytest.fixture
def router(secure_router: Callable[..., Router], serving: Engine) -> Router:
    """One replica behind a recording relay; ``KEY`` and ``OTHER`` are the keys in force."""
    return secure_router(KEY, OTHER, serving=serving, record=True)


def received(router: Router) -> bytes:
    """Every byte the replica received, health checks included."""
    return b"".join(recorder(router).received())


def assert_refused(serving: Engine, response: Message, status: int, message: str) -> None:
    """``response`` is the router's own ``status``, a JSON error in the engine's shape carrying
    ``message``, on a connection the router closes after it."""
    assert response.status == status, response
    assert response.header("content-type") == ["application/json"], response.headers
    assert json.loads(response.body) == json.loads(serving.error_body(status, message))
    assert response.header("connection") == ["close"], response.headers


def answer_and_close(port: int, data: bytes) -> tuple[Message, bool]:
    """The first response to ``data`` on a new connection, and whether the router then closed it."""
    with RawConnection(port) as conn:
        conn.send(data)
        got = conn.read(1, timeout=5)
        assert got.responses, got.leftover[:300]
        return got.responses[0], conn.is_closed_by_peer(timeout=1)


# --- 1. trailer fields, and chunked request bodies --------------------------------------------------------------

TRAILER = (f"0\r\nAuthorization: Bearer {OTHER}\r\nCookie: AWSELBAuthSessionCookie-0=stolen\r\n"
           f"X-Api-Key: trailer-key\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n").encode()


def chunked(serving: Engine, coding: str = "chunked", trailer: bytes = b"0\r\n\r\n") -> bytes:
    """An authorised request whose ``BODY`` is sent in one chunk, then ``trailer``."""
    head = request("POST", route(serving), [*auth(), ("Transfer-Encoding", coding)], length=False)
    return head + f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n" + trailer


def test_trailer_fields_after_the_last_chunk_never_reach_a_replica(router: Router, serving: Engine) -> None:
    # uvicorn with httptools (vLLM's server) hands trailer fields to the app as request headers
    # and takes a trailer's X-Forwarded-For as the client (issue 37).
    exchange(router.port, chunked(serving, trailer=TRAILER), timeout=2)

    got = received(router)
    leaked = [field for field in (OTHER.encode(), b"stolen", b"trailer-key", b"6.6.6.6") if field in got]
    assert leaked == [], got
    assert recorder(router).forwarded() == []


def test_a_chunked_request_body_is_411_in_the_engines_shape_and_the_connection_closed(
    router: Router, serving: Engine,
) -> None:
    response, closed = answer_and_close(router.port, chunked(serving))

    assert_refused(serving, response, 411, LENGTH_REQUIRED)
    assert closed
    assert recorder(router).forwarded() == []


def test_a_chunked_coding_with_a_trailing_comma_is_refused_and_never_reaches_a_replica(
    router: Router, serving: Engine,
) -> None:
    response, closed = answer_and_close(router.port, chunked(serving, coding="chunked,"))

    assert_refused(serving, response, 411, LENGTH_REQUIRED)
    assert closed
    assert b"chunked," not in received(router)
    assert recorder(router).forwarded() == []


# --- 4. userinfo, body size, obs-fold ---------------------------------------------------------------------------


@pytest.mark.parametrize("userinfo", ["user:pass@", "user@", ":@", "%75ser:p%40ss@"])
def test_userinfo_in_an_absolute_form_target_is_400_and_never_reaches_a_replica(
    router: Router, serving: Engine, userinfo: str,
) -> None:
    target = f"http://{userinfo}router{route(serving)}"

    response, closed = answer_and_close(router.port, request("POST", target, auth(), BODY))

    assert_refused(serving, response, 400, USERINFO)
    assert closed
    assert recorder(router).forwarded() == []


def test_an_absolute_form_target_without_userinfo_still_reaches_the_replica(router: Router, serving: Engine) -> None:
    # The refusal is of userinfo, not of the absolute form HTTP/1.1 servers must accept
    # (RFC 9112 section 3.2.2).
    target = f"http://router{route(serving)}"

    exchange(router.port, request("POST", target, auth(), BODY))

    # As sent: the fakes, unlike the engines' servers, route only an origin-form target, so their
    # answer is not asserted.
    assert [m.target for m in recorder(router).forwarded()] == [target]


def test_a_body_over_the_plans_limit_is_413_in_the_engines_shape_before_any_byte_of_it_is_read(
    router: Router, serving: Engine,
) -> None:
    limit = max_request_body_bytes(router.plan)
    head = request("POST", route(serving), [*auth(), ("Content-Length", str(limit + 1))], length=False)

    # Only the headers are sent: the router answers without waiting for the body.
    response, closed = answer_and_close(router.port, head)

    assert_refused(serving, response, 413, body_too_large_message(limit))
    assert closed
    assert recorder(router).forwarded() == []


@pytest.mark.parametrize("length", [64 << 20, (1 << 32) + 1, (1 << 31) + 1, 10 ** 15],
                         ids=["64 MiB", "2^32 + 1", "2^31 + 1", "10^15"])
def test_a_content_length_of_64_mib_or_past_what_an_int_holds_is_413_too(
    router: Router, serving: Engine, length: int,
) -> None:
    # 64 MiB passed before (issue 37); and a value that wraps in a 32-bit conversion must not pass
    # as a small one.
    head = request("POST", route(serving), [*auth(), ("Content-Length", str(length))], length=False)

    response, _ = answer_and_close(router.port, head)

    assert response.status == 413, response
    assert recorder(router).forwarded() == []


def test_a_body_of_exactly_the_limit_reaches_the_replica(router: Router, serving: Engine) -> None:
    limit = max_request_body_bytes(router.plan)
    body = BODY + b" " * (limit - len(BODY))  # trailing whitespace: still one JSON value

    answer = exchange(router.port, request("POST", route(serving), auth(), body), timeout=10)

    assert answer.statuses == [200]
    (only,) = recorder(router).forwarded()
    assert len(only.body) == limit


FOLDS = {
    "space": b"Content-Type: application/json\r\n X-Api-Key: folded-secret",
    "tab": b"Content-Type: application/json\r\n\tX-Api-Key: folded-secret",
    "accept": b"Accept: */*\r\n X-Api-Key: folded-secret",
    "after a bare LF": b"Content-Type: application/json\n X-Api-Key: folded-secret",
}


@pytest.mark.parametrize("fold", FOLDS.values(), ids=FOLDS.keys())
def test_an_obs_fold_in_an_allowed_header_is_400_and_its_text_never_reaches_a_replica(
    router: Router, serving: Engine, fold: bytes,
) -> None:
    head = (f"POST {route(serving)} HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(BODY)}\r\n").encode() + fold + b"\r\n\r\n"

    response, closed = answer_and_close(router.port, head + BODY)

    assert_refused(serving, response, 400, FOLDED_HEADER)
    assert closed
    assert b"folded-secret" not in received(router)


# --- the refusals on the OpenAI routes: in OpenAI's shape, whose message the OpenAI SDK shows (part 2) ----------

OPENAI_ROUTE = "/v1/completions"
"""An OpenAI route both engines serve (TGI v3.3.5's server.rs and vLLM 0.11.0's api_server.py)."""


def openai_refusals(limit: int) -> dict[str, tuple[bytes, int, str]]:
    """Each refusal before the key check, sent to :data:`OPENAI_ROUTE`: its bytes, status and message."""
    head = f"POST {OPENAI_ROUTE} HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {KEY}\r\n"
    return {
        "chunked": (request("POST", OPENAI_ROUTE, [*auth(), ("Transfer-Encoding", "chunked")], length=False)
                    + f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n0\r\n\r\n", 411, LENGTH_REQUIRED),
        "too large": (request("POST", OPENAI_ROUTE, [*auth(), ("Content-Length", str(limit + 1))], length=False),
                      413, body_too_large_message(limit)),
        "userinfo": (request("POST", f"http://user:pass@router{OPENAI_ROUTE}", auth(), BODY), 400, USERINFO),
        "obs-fold": ((head + f"Content-Length: {len(BODY)}\r\nAccept: */*\r\n X-Api-Key: folded\r\n\r\n").encode()
                     + BODY, 400, FOLDED_HEADER),
    }


@pytest.mark.parametrize("refusal", ["chunked", "too large", "userinfo", "obs-fold"])
def test_a_refusal_on_an_openai_route_is_in_openais_error_shape(router: Router, refusal: str) -> None:
    data, status, message = openai_refusals(max_request_body_bytes(router.plan))[refusal]

    response, closed = answer_and_close(router.port, data)

    assert response.status == status, response
    assert json.loads(response.body) == json.loads(openai_error_body(status, message))
    assert closed
    assert recorder(router).forwarded() == []


# --- 2. connections held without a key ----------------------------------------------------------------------------

HELD = 4300
"""Connections an attacker holds without a key: the issue's count, above the 4,096 the router
took in all before."""

SERVED_WITHIN = 3.0
"""Seconds each of the load balancer's check, an authorised request and a scrape may take."""


@contextlib.contextmanager
def held_connections(port: int, count: int, health_every: int = 2) -> Iterator[list[socket.socket]]:
    """``count`` connections to ``port``: every ``health_every``-th sends ``GET /health`` (answered
    before any key is checked) and reads nothing more; the others send nothing. All are closed
    when the block ends."""
    sockets: list[socket.socket] = []
    try:
        for number in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sockets.append(sock)
            if number % health_every == 0:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: router\r\n\r\n")
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def timed(call: Callable[[], int]) -> tuple[int, float]:
    """``call``'s status (0 when it timed out or failed) and how long it took."""
    started = time.monotonic()
    try:
        status = call()
    except OSError:
        status = 0
    return status, time.monotonic() - started


def test_the_health_check_authorised_requests_and_metrics_are_served_while_thousands_of_connections_are_held(
    router: Router, serving: Engine,
) -> None:
    with held_connections(router.port, HELD):
        time.sleep(0.5)  # the router accepts what it can
        health = timed(lambda: http_request(router.port, "GET", "/health", timeout=SERVED_WITHIN).status)
        generation = timed(lambda: exchange(router.port, request("POST", route(serving), auth(), BODY),
                                            timeout=SERVED_WITHIN).statuses[0])
        scrape = timed(lambda: http_request(router.metrics_port, "GET", "/metrics", timeout=SERVED_WITHIN).status)

    print(f"\n{serving.name}, {HELD} held connections: health {health}, generation {generation}, metrics {scrape}")
    assert [health[0], generation[0], scrape[0]] == [200, 200, 200]


def test_a_health_connection_is_closed_after_its_answer(router: Router) -> None:
    # The load balancer opens a connection for each check: one kept open after its answer only
    # holds a slot (for the keep-alive timeout, 960 s, before).
    for method in ("GET", "HEAD", "POST"):
        with RawConnection(router.port) as conn:
            conn.send(request(method, "/health"))
            got = conn.read(1, timeout=5)
            closed = conn.is_closed_by_peer(timeout=1)
        assert closed and len(got.responses) == 1, (method, got)
        assert got.responses[0].header("connection") == ["close"], (method, got.responses[0].headers)


def test_the_metrics_endpoint_keeps_its_own_connection_slots_when_the_api_frontend_is_full(
    secure_router: Callable[..., Router], serving: Engine,
) -> None:
    # Scaled down: the API frontend's limit is lowered so that a few hundred idle connections
    # fill it; the metrics frontend's slots are the rendered ones.
    router = secure_router(KEY, serving=serving, edit_config=scale_api_frontend(200))

    with held_connections(router.port, 260, health_every=10 ** 9):
        time.sleep(0.5)
        scrape = timed(lambda: http_request(router.metrics_port, "GET", "/metrics", timeout=SERVED_WITHIN).status)
        health = timed(lambda: http_request(router.port, "GET", "/health", timeout=1).status)

    assert health[0] == 0, health  # the API frontend was full: its check waited in the backlog
    assert scrape[0] == 200, scrape


def scale_api_frontend(maxconn: int) -> Callable[[str], str]:
    """An ``edit_config`` that lowers the API frontend's ``maxconn`` (and the process's by as
    much), keeping the metrics frontend's."""

    def edit(config: str) -> str:
        head, marker, rest = config.partition("frontend router\n")
        assert marker, config
        frontend, backend, tail = rest.partition("\nbackend ")
        lines = frontend.split("\n")
        (index,) = [i for i, line in enumerate(lines) if line.strip().startswith("maxconn ")]
        api = int(lines[index].split()[1])
        lines[index] = lines[index].replace(str(api), str(maxconn))
        glob = [line for line in head.split("\n") if line.strip().startswith("maxconn ")]
        (global_line,) = glob
        total = int(global_line.split()[1])
        head = head.replace(global_line, global_line.replace(str(total), str(total - api + maxconn)))
        return head + marker + "\n".join(lines) + backend + tail

    return edit
