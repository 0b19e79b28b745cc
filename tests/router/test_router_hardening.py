"""What an attack on the router found and the config now prevents (issue 23), each against the real
HAProxy builds of the router tests (conftest.py: Ubuntu 22.04's 2.4 and Debian 12's 2.6), for both
engines, API keys on: keys in query strings kept out of the log, only the API's headers forwarded,
exactly one ``Authorization: Bearer <key>``, connections closed after a 401, JSON errors in the
engine's style for everything the router answers itself, each route's own methods, no ``Server``
header, and no ``show errors`` on the runtime socket."""

from __future__ import annotations

import base64
import json
import re
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rawhttp import Message, RawConnection, request
from routersim import Router, bearer, generate, make_plan

from neuron_serving.plan.engines import Engine
from neuron_serving.render.router import (
    FORWARDED_HEADERS,
    HEALTH_UNAVAILABLE,
    ROUTER_ERRORS,
    UNAUTHORIZED,
    method_not_allowed_message,
    not_found_message,
    render_router_config,
)
from neuron_serving.userdata import api_keys

ALICE, BOB = api_keys.new_key(), api_keys.new_key()
AUTHORIZATION = f"Authorization: Bearer {ALICE}"



@pytest.fixture
def secure(secure_router: Callable[..., Router], serving: Engine) -> Callable[..., Router]:
    """``secure(**kwargs)``: a one-replica router of ``serving`` holding ALICE's key (conftest's
    ``secure_router``)."""

    def start(**kwargs: Any) -> Router:
        return secure_router(ALICE, serving=serving, **kwargs)

    return start


def generation(serving: Engine) -> tuple[str, bytes]:
    """A generation route of the engine and a small body for it."""
    route = "/generate" if "/generate" in serving.api_routes else "/v1/completions"
    body = generate() if route == "/generate" else {"prompt": "Hi", "max_tokens": 1}
    return route, json.dumps(body).encode()


def http(method: str, path: str, *headers: str, body: bytes = b"") -> bytes:
    """The bytes of one request (rawhttp.request), its headers written ``"Name: value"``."""
    return request(method, path, [(name, value) for name, _, value in (h.partition(": ") for h in headers)], body)


def answer(port: int, data: bytes, timeout: float = 5.0) -> tuple[Message, bool]:
    """The first response to ``data`` sent on a new connection, and whether the router closed the
    connection within a second after it."""
    with RawConnection(port, timeout) as conn:
        conn.send(data)
        got = conn.read(1, timeout)
        assert got.responses, got.leftover[:300]
        return got.responses[0], conn.is_closed_by_peer(timeout=1)


def assert_engine_error(serving: Engine, response: Message, status: int, message: str | None = None,
                        path: str | None = None) -> None:
    """``response`` is a ``status`` answered by the router, with a JSON body that carries ``message``
    (default: the router's message for that status): in the engine's style, or, given the request's
    ``path``, in the style the router answers there (OpenAI's on ``/v1/...``)."""
    assert response.status == status, response
    assert response.header("content-type") == ["application/json"], response.headers
    text = message or ROUTER_ERRORS[status]
    expected = serving.error_body(status, text) if path is None else serving.route_error_body(path, status, text)
    assert json.loads(response.body) == json.loads(expected)


# --- 1. a key in the query string never reaches the log -------------------------------------------------------


def test_a_key_in_the_query_string_is_refused_and_the_log_holds_the_path_without_its_query(secure, serving) -> None:
    router = secure()
    route, body = generation(serving)

    refused = router.request("POST", f"{route}?api_key={ALICE}&x=1", json.loads(body))
    served = router.request("POST", f"{route}?api_key={ALICE}", json.loads(body), headers=bearer(ALICE))
    absolute, _ = answer(router.port, http("POST", f"http://router{route}?key={ALICE}", body=body))
    line = f'"POST {route} HTTP/1.1"'
    router.wait_for_log(line, 3)
    router.stop()

    assert (refused.status, served.status, absolute.status) == (401, 200, 401)
    log = router.log_path.read_text()
    assert log.count(line) == 3, log
    assert ALICE not in log and "api_key" not in log and "?" not in log.replace("%3F", "")


# --- 2. only the API's headers reach a replica, X-Forwarded-For from the load balancer ------------------------


CREDENTIALS = {
    "Cookie": "AWSELBAuthSessionCookie-0=session; other=1",
    "Proxy-Authorization": "Basic c2VjcmV0",
    "X-Api-Key": "stolen-1", "Api-Key": "stolen-2",
    "Forwarded": "for=6.6.6.6", "X-Real-IP": "6.6.6.6",
    "X-Amzn-Oidc-Data": "header.payload.signature", "X-Amzn-Oidc-Accesstoken": "oidc-access",
    "X-Amzn-Oidc-Identity": "user-1", "User-Agent": "attacker/1.0", "Traceparent": "00-abc-def-01",
}


@pytest.mark.parametrize(("forwarded_for", "client"), [
    ("6.6.6.6, 10.1.2.3", "10.1.2.3"),  # what the client claimed, then what the load balancer saw
    (None, "127.0.0.1"),  # no load balancer in front: the peer
    ("6.6.6.6, not-an-address", "127.0.0.1"),  # a last entry that is no address: the peer
], ids=["appended by the load balancer", "absent", "garbage"])
def test_a_replica_gets_only_the_apis_headers_and_the_client_the_load_balancer_saw(
    secure, serving, forwarded_for: str | None, client: str,
) -> None:
    router = secure(record=True)
    route, body = generation(serving)
    headers = [f"{name}: {value}" for name, value in CREDENTIALS.items()]
    headers += [AUTHORIZATION, "Accept: application/json", "Content-Type: application/json", "Connection: close"]
    headers += [f"X-Forwarded-For: {forwarded_for}"] if forwarded_for else []

    response, _ = answer(router.port, http("POST", route, *headers, body=body))

    assert response.status == 200, response
    # Every byte the replica received: the request line, these headers, the body; nothing else.
    (received,) = router.recorders["replica-0"].forwarded()
    assert received.start_line == f"POST {route} HTTP/1.1".encode() and received.body == body
    names = [name for name, _ in received.headers]
    assert sorted(names) == sorted(["host", "content-length", "content-type", "accept", "x-forwarded-for"]), names
    assert set(names) <= {*FORWARDED_HEADERS, "x-forwarded-for"}
    assert received.header("x-forwarded-for") == [client]
    raw = b"".join(router.recorders["replica-0"].received())
    secrets = (ALICE, "stolen", "session", "6.6.6.6", "oidc-access", "header.payload", "user-1", "attacker",
               "c2VjcmV0", "00-abc")
    assert not any(value.encode() in raw for value in secrets)


# --- 3. exactly one Authorization header, of exactly "Bearer <key>" -------------------------------------------


@pytest.mark.parametrize(("lines", "status"), [
    ([f"Authorization: Bearer {ALICE}"], 200),
    ([f"Authorization: bEaReR {ALICE}"], 200),  # the scheme is case-insensitive (RFC 9110, 11.1)
    ([f"Authorization: Basic {ALICE}", "Authorization: Bearer junk"], 401),
    (["Authorization: Bearer junk", f"Authorization: Basic {ALICE}"], 401),
    ([f"Authorization: Bearer {ALICE}", f"Authorization: Bearer {ALICE}"], 401),
    ([f"Authorization: Bearer {ALICE} junk"], 401),
    ([f"Authorization: Bearer {ALICE}, Bearer {BOB}"], 401),
    ([f"Authorization: Bearer  {ALICE}"], 401),
    ([f"Authorization: Bearer\t{ALICE}"], 401),
    ([f"Authorization: Token {ALICE}"], 401),
], ids=["bearer", "scheme in any case", "basic then bearer", "bearer then basic", "twice", "trailing word",
        "two credentials", "two spaces", "tab", "another scheme"])
def test_only_one_authorization_header_of_exactly_bearer_and_a_known_key_passes(
    secure, serving, lines: list[str], status: int,
) -> None:
    router = secure()
    route, body = generation(serving)

    response, _ = answer(router.port, http("POST", route, *lines, "Connection: close", body=body))

    assert response.status == status, response
    assert len(router.replicas["replica-0"].served) == (status == 200)


# --- 4. the connection is closed after a 401 -------------------------------------------------------------------


def test_an_unauthorised_connection_is_closed_after_its_401(secure, serving) -> None:
    router = secure()
    route, body = generation(serving)

    # Two requests, two answers asked for: the router answers the first and closes at once,
    # instead of after its 960 s, and never reads the second.
    with RawConnection(router.port) as conn:
        conn.send(http("POST", route, body=body) * 2)
        got = conn.read(2, timeout=5)
        closed = conn.is_closed_by_peer(timeout=1)

    assert closed and got.statuses == [401] and got.leftover == b"", got
    assert_engine_error(serving, got.responses[0], 401, UNAUTHORIZED)
    assert got.responses[0].header("connection") == ["close"]
    assert router.replicas["replica-0"].served == []


def test_an_authorised_connection_stays_open_for_the_next_request(secure, serving) -> None:
    router = secure()
    route, body = generation(serving)
    one = http("POST", route, AUTHORIZATION, body=body)

    with RawConnection(router.port) as conn:
        conn.send(one + one)
        got = conn.read(2)
        closed = conn.is_closed_by_peer(timeout=1)

    assert got.statuses == [200, 200] and not closed


# --- 5. every error the router answers itself is JSON in the engine's style -------------------------------------


EARLY_ERRORS_CONFIGURABLE = (3, 3)
"""The first HAProxy whose H1 multiplexer answers the errors it finds before a stream exists (a
request that is not HTTP, headers that are late or too large, an unsupported framing) with the
proxy's configured pages: haproxy commit d252ec2 ("BUG/MINOR: mux-h1: Use configured error files
if possible for early H1 errors", first in v3.3-dev10; issue #3032). Before it, src/mux_h1.c's
h1_send_error (v2.4.0 to v3.0.0) sends the built-in ``http_err_msgs`` HTML, whatever the config."""


def assert_early_error(serving: Engine, response: Message, status: int, version: tuple[int, int]) -> None:
    """``response`` is ``status`` from the H1 multiplexer: the JSON page where HAProxy can send it,
    else HAProxy's built-in page, and the connection closed."""
    assert response.status == status, response
    if version >= EARLY_ERRORS_CONFIGURABLE:
        assert_engine_error(serving, response, status)
    else:
        assert response.header("content-type") == ["text/html"], response
        assert response.body.startswith(f"<html><body><h1>{status} ".encode()), response
    assert response.header("connection") == ["close"]


def test_a_request_that_is_not_http_gets_a_400_and_the_connection_closed(secure, serving, haproxy_version) -> None:
    router = secure()

    response, closed = answer(router.port, f"NOT HTTP AT ALL {ALICE}\r\n\r\n".encode())

    assert_early_error(serving, response, 400, haproxy_version)
    assert closed


def test_a_transfer_encoding_other_than_chunked_is_refused_before_any_replica(secure, serving, haproxy_version) -> None:
    router = secure()
    route, _ = generation(serving)

    response, _ = answer(router.port, http("POST", route, AUTHORIZATION, "Transfer-Encoding: gzip", "Connection: close")
                         + b"0\r\n\r\n")

    # 400 from 2.4.30 and 2.6.12 here; 422 from the H1 multiplexer of later versions (src/mux_h1.c
    # at v2.8.0: "A 422-Unprocessable-Content is returned for an invalid request").
    assert response.status in (400, 422), response
    assert_early_error(serving, response, response.status, haproxy_version)
    assert router.replicas["replica-0"].served == []


def test_an_upgrade_with_a_body_never_reaches_a_replica_as_an_upgrade(
    secure, serving, haproxy_version,
) -> None:
    router = secure()
    route, body = generation(serving)

    upgrade = ("Connection: Upgrade, close", "Upgrade: websocket")
    response, _ = answer(router.port, http("POST", route, AUTHORIZATION, *upgrade, body=body))

    # HAProxy 2.4.0 answered 501 (src/mux_h1.c at v2.4.0: "Reject Protocol upgrade request with
    # payload"); 2.4.30 and 2.6.12 forward the request, without the Upgrade the router removes.
    if response.status == 501:
        assert_early_error(serving, response, 501, haproxy_version)
        assert router.replicas["replica-0"].served == []
    else:
        assert response.status == 200, response
        (served,) = router.replicas["replica-0"].served
        assert not {"upgrade", "connection"} & dict(served.headers).keys()


def test_headers_that_do_not_arrive_in_time_get_a_408_and_the_connection_closed(
    secure, serving, haproxy_version,
) -> None:
    router = secure(edit_config=lambda config: config.replace("timeout http-request 30s", "timeout http-request 1s"))

    response, closed = answer(router.port, b"POST /generate HTTP/1.1\r\nHost: router\r\n", timeout=5)

    assert_early_error(serving, response, 408, haproxy_version)
    assert closed


def test_health_is_200_while_a_replica_serves_and_a_json_503_when_none_does(secure, serving) -> None:
    router = secure()
    route, body = generation(serving)
    healthy = router.request("GET", "/health")
    head = router.request("HEAD", "/health")

    router.replicas["replica-0"].kill()
    router.wait_for_states({"replica-0": "DOWN"})
    unhealthy, _ = answer(router.port, http("GET", "/health", "Connection: close"))
    refused, _ = answer(router.port, http("POST", route, AUTHORIZATION, "Connection: close", body=body))

    assert (healthy.status, healthy.body, head.status) == (200, b"", 200)
    assert_engine_error(serving, unhealthy, 503, HEALTH_UNAVAILABLE)
    assert_engine_error(serving, refused, 503)


class Misbehaving(socketserver.ThreadingTCPServer):
    """A replica that passes the router's health checks (``GET /health``: 200) and answers every
    other request with ``answer``: invalid HTTP, or nothing at all when it is ``None``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, answer: bytes | None) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.health_checks = 0
        super().__init__(("127.0.0.1", port), _MisbehavingHandler)


class _MisbehavingHandler(socketserver.StreamRequestHandler):
    server: Misbehaving

    def handle(self) -> None:
        while line := self.rfile.readline():
            request = line
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                request += header
            if request.startswith(b"GET /health "):
                self.server.health_checks += 1
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            elif self.server.answer is None:
                self.server.release.wait(30)
                return
            else:
                self.wfile.write(self.server.answer)
                return


@pytest.fixture
def misbehaving() -> Iterator[Callable[[int, bytes | None], Misbehaving]]:
    started: list[Misbehaving] = []

    def start(port: int, answer: bytes | None) -> Misbehaving:
        server = Misbehaving(port, answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.release.set()
        server.shutdown()
        server.server_close()


def replace_replica(router: Router, start: Callable[[int, bytes | None], Misbehaving], answer: bytes | None) -> None:
    """Replace the router's one fake replica by a misbehaving one on its port, and wait until the
    router's health checks passed against it."""
    router.replicas["replica-0"].stop()
    server = start(router.plan.replicas[0].port, answer)
    # Two checks passed (rise 2) bring back a replica a check found closed in between.
    deadline = time.monotonic() + 10
    while server.health_checks < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    router.wait_for_states({"replica-0": "UP"}, timeout=5)


def test_a_replica_answering_invalid_http_gets_the_client_a_json_502(secure, serving, misbehaving) -> None:
    router = secure()
    route, body = generation(serving)
    replace_replica(router, misbehaving, b"HTTP/1.1 ???\r\n\r\n")

    response, _ = answer(router.port, http("POST", route, AUTHORIZATION, "Connection: close", body=body))

    assert_engine_error(serving, response, 502)


def test_a_replica_that_stays_silent_gets_the_client_a_json_504(secure, serving, misbehaving) -> None:
    router = secure(edit_config=lambda config: config.replace("timeout server 900s", "timeout server 1s"))
    route, body = generation(serving)
    replace_replica(router, misbehaving, None)

    response, _ = answer(router.port, http("POST", route, AUTHORIZATION, "Connection: close", body=body))

    assert_engine_error(serving, response, 504)


def test_every_built_in_error_page_is_the_engines_on_native_routes_and_openais_on_v1(serving) -> None:
    config = render_router_config(make_plan(1), serving, api_keys=True)

    for status, message in ROUTER_ERRORS.items():
        native, openai = serving.error_body(status, message), serving.route_error_body("/v1/models", status, message)
        (line,) = [line.strip() for line in config.splitlines()
                   if line.strip().startswith(f"http-error status {status} ")]
        chosen = re.fullmatch(r".* lf-string '%\[str\(\),concat\(,txn\.openai_route,\),length,bool,"
                              r"iif\(([A-Za-z0-9+/=]+),([A-Za-z0-9+/=]+)\),b64dec\]'", line)
        if native == openai:
            assert line == f"http-error status {status} content-type application/json string '{native}'"
        else:
            assert chosen, line
            assert [base64.b64decode(b).decode() for b in chosen.groups()] == [openai, native], status


# --- 6. each route's own methods -------------------------------------------------------------------------------


def test_each_route_answers_only_its_methods_and_405_with_allow_otherwise(secure, serving) -> None:
    router = secure()

    for path, methods in serving.api_routes.items():
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"):
            if method in methods:
                continue
            response, _ = answer(router.port, http(method, path, AUTHORIZATION, "Connection: close"))
            assert response.header("allow") == [", ".join(methods)], (method, path, response)
            assert_engine_error(serving, response, 405, method_not_allowed_message(path, methods), path)
    for method in ("POST", "PUT", "DELETE", "TRACE"):
        response, _ = answer(router.port, http(method, "/health", "Connection: close"))
        assert (response.status, response.header("allow")) == (405, ["GET, HEAD"]), (method, response)
    assert router.replicas["replica-0"].served == []


def test_without_a_key_a_wrong_method_is_401_and_says_nothing_of_the_routes(secure, serving) -> None:
    router = secure()

    for path in (*serving.api_routes, "/metrics"):
        response, _ = answer(router.port, http("TRACE", path, "Connection: close"))
        assert_engine_error(serving, response, 401, UNAUTHORIZED, path)


def test_a_path_outside_the_api_is_a_json_404_naming_the_routes(secure, serving) -> None:
    router = secure()

    response, _ = answer(router.port, http("GET", "/metrics", AUTHORIZATION, "Connection: close"))

    assert_engine_error(serving, response, 404, not_found_message(serving))


# --- 7. no Server header from a replica ----------------------------------------------------------------------------


def test_a_replicas_server_header_never_reaches_the_client(secure, serving) -> None:
    router = secure()
    route, body = generation(serving)

    response, _ = answer(router.port, http("POST", route, AUTHORIZATION, "Connection: close", body=body))

    assert response.status == 200 and response.header("server") == [], response.headers
    # The fake does send one, as TGI's and vLLM's servers do.
    direct, _ = answer(router.plan.replicas[0].port, http("POST", route, "Connection: close", body=body))
    assert direct.header("server"), direct.headers


# --- 8. the runtime socket cannot show the capture of a malformed request ----------------------------------------


def test_the_runtime_socket_refuses_show_errors_so_a_key_in_a_malformed_request_stays_unread(
    secure, serving, keys_dir: Path,
) -> None:
    router = secure()
    socket_path = str(keys_dir / "admin.sock")

    response, _ = answer(router.port, f"POST /generate HTTP/1.1\r\nHost: router\r\nAuthorization: Bearer {ALICE}\r\n"
                                      "Content-Length: 1\r\nContent-Length: 2\r\n\r\nxx".encode())
    shown = api_keys._runtime(socket_path, "show errors")

    assert response.status == 400
    assert ALICE not in shown and "Permission denied" in shown, shown
    # The level the socket has is enough for the key sync's commands.
    assert api_keys.digest(ALICE) in api_keys._runtime(socket_path, f"show acl {keys_dir / 'api-keys.sha256'}")
