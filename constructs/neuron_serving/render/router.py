"""The on-host router: an HAProxy config that spreads requests over the replicas of a plan.

HAProxy rather than nginx: open-source nginx has ``least_conn`` and ``max_conns`` but neither
active health checks nor a queue for requests beyond the limit (both are nginx Plus features),
and HAProxy's Debian and Ubuntu packages include a Prometheus exporter. The config is ``userdata/haproxy.cfg.j2``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from ..plan.engines import DEFAULT_ENGINE, ENGINES, Engine
from ..plan.engines.base import OPENAI_ROUTES, openai_error_body
from ..plan.errors import Problems
from ..plan.layout import ServingPlan

# The key file the host's key sync writes and the runtime socket it talks to: its constants.
from ..userdata.api_keys import KEYS_FILE, RUNTIME_SOCKET
from ..userdata.watch_interruption import DRAIN_FILE, DRAIN_PATTERN
from .templates import render

ROUTER_METRICS_PORT = 8404
"""Loopback port of the router's Prometheus endpoint (``/metrics``) and stats page (``/stats``)."""

HEALTH_CHECK_INTERVAL_MS = 5000
"""How often the router asks each replica's ``GET /health`` while it is up. A fifth of it is the
interval while a change of state is being confirmed and while a replica is down: with ``fall 3``
a replica whose health route fails leaves the rotation in about 7 s, and with ``rise 2`` one that
opens its port joins it in about 2 s. A replica that refuses a connection leaves at once, without
waiting for its checks. TGI answers ``/health`` without generating while its last generation
succeeded, and with a one-token generation otherwise (text-generation-inference v3.3.5
backends/v2/src/backend.rs, ``health``: ``device_health``, else ``model_health``); vLLM answers it
from its engine's state."""

STREAM_TIMEOUT_SECONDS = 900
"""Longest silence the router accepts from a client or a replica during one request: a request
can wait for a batch slot, then stream for minutes. The ALB idle timeout should not exceed it."""

KEEP_ALIVE_MARGIN_SECONDS = 60
"""How much longer than :data:`STREAM_TIMEOUT_SECONDS` the router keeps an idle ALB connection,
so that the ALB (idle timeout at most the stream timeout) always closes it first."""

ROUTER_USER = "haproxy"
"""The unprivileged user and group the Debian/Ubuntu ``haproxy`` package creates."""

MIN_API_MAXCONN = 8192
"""Floor of the API frontend's connection limit, whatever the plan: above the ~4,300 connections
held without a key that took every slot of the former 4,096 (issue 37), at about 33 kB each at
most (HAProxy configuration manual 2.4, section 4.2, ``maxconn``): 270 MB."""

METRICS_MAXCONN = 64
"""The metrics frontend's own connections, beside the API frontend's: the monitoring agent's
scrapes and an operator's stats page."""

TEMPLATE = "haproxy.cfg.j2"

LOG_TARGET = "/dev/log"
"""journald's syslog socket on Ubuntu, which the Debian package's rsyslog rule writes to
/var/log/haproxy.log."""

REALM = "neuron-serving"
"""The realm of the ``WWW-Authenticate: Bearer`` challenge sent with a 401."""


HEADER_TIMEOUT_SECONDS = 30
"""How long a client has to send a request's headers (``timeout http-request``): the body is
streamed, never buffered, so only slow or stalled headers are cut, with a 408."""

FORWARDED_HEADERS = ("host", "content-length", "content-type", "transfer-encoding", "expect", "accept")
"""The only request headers a replica receives (with ``X-Forwarded-For``, which the router sets):
what both engines' API reads of a request, its framing, and ``Expect``, without which a client
waiting for ``100 Continue`` before a long prompt's body would wait its own timeout (curl: 1 s)."""

UNAUTHORIZED = "Missing or unknown API key: send one Authorization header, Bearer <key>"
HEALTH_UNAVAILABLE = "No replica of this host is serving"
HEALTH_DRAINING = "This host is draining: it will be interrupted or replaced"
LENGTH_REQUIRED = "Length required: send the request body with a Content-Length, not chunked"
USERINFO = "Bad request: a target with userinfo (user:password@)"
FOLDED_HEADER = "Bad request: a header line continued on the next line (obs-fold)"

BYTES_PER_TOKEN = 128
"""The most bytes of JSON one prompt token is taken to need, for the request body limit (see
:func:`max_request_body_bytes`)."""

BODY_OVERHEAD_BYTES = 64 * 1024
"""Bytes of a request body besides its prompt: the generation parameters, stop sequences, the
roles of chat messages."""


def max_request_body_bytes(plan: ServingPlan) -> int:
    """The largest request body the router forwards for ``plan``: its longest prompt in bytes of
    JSON, plus room for the rest of the request.

    The longest prompt the plan allows is ``plan.max_input_tokens`` tokens. A token of the
    byte-level BPE vocabularies these models use is a few bytes of text (English averages about
    four); JSON writes a byte as at most six characters (``\\u00XX``, for control characters), and a
    prompt sent as token ids (vLLM's completions) takes at most eight bytes a token (six digits,
    a comma, a space). :data:`BYTES_PER_TOKEN`, 128, covers tokens of 21 escaped bytes or of 128
    plain ones; a chat message's own JSON (``{"role": "user", "content": ""}``, about 35 bytes)
    comes with at least four tokens of the chat template, under 10 bytes a token. So a body over
    ``max_input_tokens * 128 + 64 KiB`` holds more prompt than a replica accepts, and is refused
    before any of it is read. (A completions request that batches several prompts in one body
    counts them together: send them as separate requests, which the router spreads over the
    replicas.)
    """
    return plan.max_input_tokens * BYTES_PER_TOKEN + BODY_OVERHEAD_BYTES


def body_too_large_message(limit: int) -> str:
    """What the router answers, with a 413, a request whose ``Content-Length`` exceeds ``limit``."""
    return f"Payload too large: a request body may hold at most {limit} bytes, the longest prompt this server accepts"

ROUTER_ERRORS: dict[int, str] = {
    400: "Bad request: not a valid HTTP/1.1 request",
    408: f"Request timeout: the headers did not arrive within {HEADER_TIMEOUT_SECONDS} s",
    413: "Payload too large: an HTTP/1.0 GET, HEAD or DELETE with a body",
    422: "Unprocessable request: a Transfer-Encoding other than chunked",
    500: "Internal error in the router",
    501: "Not implemented: a protocol upgrade with a body",
    502: "Bad gateway: the replica closed the connection or answered with invalid HTTP",
    503: "Service unavailable: no replica is serving, or none freed a batch slot for 5 minutes",
    504: f"Gateway timeout: the replica sent nothing for {STREAM_TIMEOUT_SECONDS} s",
}
"""The message of each error HAProxy itself answers with this config (src/mux_h1.c, h1_handle_*_err,
and src/http_ana.c at v2.4.0 and v2.8.0: 400, 408, 500 and 501 from the request parser, 413 and
422 from 2.5's, 502, 503 and 504 from the backend). HAProxy's other built-in pages (403, 407,
425...) answer rules and features this config does not have."""

ERRORS_SINCE: dict[int, str] = {422: "2.5"}
"""Statuses HAProxy 2.4 has no page for (src/http.c, ``http_err_codes``, at v2.4.0 and v2.5.0):
their ``http-error`` stands in a ``.if version_atleast()`` block, so that Ubuntu 22.04's HAProxy
2.4 accepts the config."""


@dataclass(frozen=True)
class _ErrorPage:
    """One ``http-error``: the engine's own body, or, where it differs, OpenAI's on the OpenAI
    routes. HAProxy 2.4 and 2.6 choose an error page by status alone, so the choice is made when
    the page is sent, in a log-format string: ``txn.openai_route`` is set on the OpenAI routes only
    (an error before the frontend's rules gets the engine's body), ``concat`` of an absent variable
    adds nothing, and ``iif`` picks one of the two bodies (configuration manual 2.4, sections 7.3.1
    and 8.2.4: concat, length, bool, iif, b64dec). The bodies go base64-encoded, since a converter's
    arguments cannot hold JSON's commas and quotes; the comment above each line shows them."""

    status: int
    body: str
    openai: str
    since: str | None

    @property
    def per_route(self) -> bool:
        return self.body != self.openai

    @property
    def chooser(self) -> str:
        openai, native = (base64.b64encode(b.encode()).decode() for b in (self.openai, self.body))
        return f"%[str(),concat(,txn.openai_route,),length,bool,iif({openai},{native}),b64dec]"


@dataclass(frozen=True)
class _Refusal:
    """A request the router refuses before the key check (framing, size, target, folded header),
    with the engine's own body, and OpenAI's on the OpenAI routes, where it differs: the rule is
    written once per shape, the OpenAI one first, as the 404's is."""

    status: int
    acl: str
    body: str
    openai: str

    @property
    def per_route(self) -> bool:
        return self.body != self.openai


@dataclass(frozen=True)
class _Route:
    path: str
    methods: tuple[str, ...]
    method_not_allowed: str

    @property
    def allow(self) -> str:
        return ", ".join(self.methods)


def not_found_message(engine: Engine) -> str:
    """What the router answers, with a 404, a path that is not one of ``engine``'s API routes."""
    return f"Not found: this endpoint serves {', '.join(engine.api_routes)}"


def method_not_allowed_message(path: str, methods: tuple[str, ...]) -> str:
    """What the router answers, with a 405, a method ``path`` is not served with."""
    return f"Method not allowed: {path} accepts {' and '.join(methods)}"


def error_pages(engine: Engine) -> dict[int, str]:
    """The body of each error HAProxy itself answers on ``engine``'s native routes, in its style."""
    return {status: engine.error_body(status, message) for status, message in ROUTER_ERRORS.items()}


def openai_error_pages() -> dict[int, str]:
    """The body of each error HAProxy itself answers on the OpenAI-compatible routes, whatever the
    engine: OpenAI's shape (:func:`~neuron_serving.plan.engines.base.openai_error_body`)."""
    return {status: openai_error_body(status, message) for status, message in ROUTER_ERRORS.items()}


def render_router_config(
    plan: ServingPlan,
    engine: Engine | None = None,
    *,
    max_concurrent_per_replica: int | None = None,
    health_check_interval_ms: int = HEALTH_CHECK_INTERVAL_MS,
    metrics_port: int = ROUTER_METRICS_PORT,
    user: str | None = ROUTER_USER,
    api_keys: bool = False,
    keys_file: str = KEYS_FILE,
    runtime_socket: str = RUNTIME_SOCKET,
    load_balancer_authentication: bool = False,
    log_target: str = LOG_TARGET,
    drain: bool = False,
    drain_file: str = DRAIN_FILE,
) -> str:
    """The HAProxy config that fronts every replica of ``plan`` on ``plan.router_port``.

    :param plan: the validated layout; one server per replica, on ``127.0.0.1:<replica.port>``.
    :param engine: the replicas' serving engine, whose health route the router checks.
        Default: TGI.
    :param max_concurrent_per_replica: requests in flight per replica; further requests wait in
        the router's queue, which gives each to the first replica with a free slot. At most the
        engine's ``max_concurrent_requests`` (TGI answers 429 beyond its
        ``MAX_CONCURRENT_REQUESTS``). Above the batch size, the excess waits in a replica's own
        queue behind its batch, however busy that batch is and however free the others are.
        Default: the plan's batch size (TGI's ``MAX_BATCH_SIZE``, vLLM's ``--max-num-seqs``), so
        that requests wait only in the router: on the benchmarks' mixed chat and long-prompt
        workload (``python -m benchmarks``) the p99 time to first token is about a fifth lower than
        with 128 per replica.
    :param health_check_interval_ms: interval of the ``GET /health`` checks. Shorter intervals
        notice failures sooner at the cost of more check traffic. Default: 5000.
    :param metrics_port: loopback port of ``/metrics`` and ``/stats``. Default: 8404.
    :param user: user and group HAProxy drops to after binding its ports, or ``None`` to keep
        the user it was started as (only for running it unprivileged, as in tests).
        Default: ``haproxy``.
    :param api_keys: refuse every request but the load balancer's ``GET /health`` unless it
        carries ``Authorization: Bearer <key>`` with a key whose SHA-256 digest is in
        ``keys_file``: 401 with a JSON error, counted in the router frontend's denied requests.
        Default: false (the API is open to whoever reaches the router).
    :param keys_file: the digests' file, which must exist when HAProxy starts; ``api-keys sync``
        changes the running router's copy through ``runtime_socket``. Default: :data:`KEYS_FILE`.
    :param runtime_socket: the runtime API's Unix socket, with ``api_keys``. Default:
        :data:`RUNTIME_SOCKET`.
    :param load_balancer_authentication: with ``api_keys``, also accept requests without an
        ``Authorization`` header that carry ``x-amzn-oidc-identity``: the load balancer signed
        their user in (OIDC or Cognito) and sends every request with ``Authorization: Bearer``
        here unauthenticated. Default: false.
    :param log_target: where HAProxy sends its log lines: a syslog socket, or ``stdout format
        raw`` (as in tests). Default: :data:`LOG_TARGET`.
    :param drain: the router can be drained without a reload (Spot interruptions,
        ``neuron_serving/userdata/watch_interruption.py``): once the pattern ``draining`` is added to
        its copy of ``drain_file`` through ``runtime_socket`` (``add acl``), ``/health`` answers 503
        while every other request is served as before. Default: false.
    :param drain_file: the drain's pattern file, which must exist when HAProxy starts and holds no
        pattern. Default: :data:`~neuron_serving.userdata.watch_interruption.DRAIN_FILE`.

    ``GET`` or ``HEAD /health`` is answered by the router itself (200, or 503 when no replica
    serves); every other request is answered 404 unless its path is one of the engine's
    ``api_routes``, and 405 unless its method is one that route is served with. Before the key
    check, a request with a ``Transfer-Encoding`` (a chunked body, whose trailer fields no header
    rule would see) is answered 411, one whose ``Content-Length`` exceeds
    :func:`max_request_body_bytes` 413, and one with userinfo in its target or a folded header
    line 400; the connection is closed after these answers, after a 401 and after ``/health``, so
    that connections without a key hold no slot for long. A replica receives
    only the :data:`FORWARDED_HEADERS` and an ``X-Forwarded-For`` of the client the load balancer
    saw; a client never sees a replica's ``Server`` header. Every error the router answers itself
    is a JSON error: in OpenAI's shape on the OpenAI-compatible routes (``/v1/...``), in the
    engine's own elsewhere (:meth:`Engine.route_error_body`). The request log holds no query
    string.

    Raises :class:`~neuron_serving.plan.ServingConfigError` naming each bad argument.
    """
    engine = engine or ENGINES[DEFAULT_ENGINE]
    if max_concurrent_per_replica is None:
        max_concurrent_per_replica = min(plan.batch_size, engine.max_concurrent_requests)
    problems = Problems()
    if (not _is_int(max_concurrent_per_replica)
            or not 1 <= max_concurrent_per_replica <= engine.max_concurrent_requests):
        problems.add("max_concurrent_per_replica", max_concurrent_per_replica,
                     f"must be an integer from 1 to {engine.max_concurrent_requests}, the most a {engine.title} "
                     f"replica accepts (default: the batch size, {plan.batch_size})")
    if not _is_int(health_check_interval_ms) or health_check_interval_ms < 100:
        problems.add("health_check_interval_ms", health_check_interval_ms,
                     "must be an integer of at least 100")
    if not _is_int(metrics_port) or not 1 <= metrics_port <= 65535:
        problems.add("metrics_port", metrics_port, "must be a TCP port from 1 to 65535")
    elif metrics_port == plan.router_port or metrics_port in {r.port for r in plan.replicas}:
        problems.add("metrics_port", metrics_port, "must differ from the router and replica ports")
    for name, path in (("keys_file", keys_file), ("runtime_socket", runtime_socket), ("drain_file", drain_file)):
        if not isinstance(path, str) or not path.startswith("/") or _has_space_or_quote(path):
            problems.add(name, path, "must be an absolute path without spaces or quotes")
    if not isinstance(log_target, str) or not log_target or "\n" in log_target:
        problems.add("log_target", log_target, "must be a syslog address or 'stdout format raw'")
    if load_balancer_authentication and not api_keys:
        problems.add("load_balancer_authentication", load_balancer_authentication,
                     "applies only with api_keys: without them the router checks nothing")
    if user is not None and (not user or not user.replace("-", "").replace("_", "").isalnum()):
        problems.add("user", user, "must be a plain user name such as 'haproxy', or None")
    problems.raise_if_any()

    in_flight = len(plan.replicas) * max_concurrent_per_replica
    return _single_quotable(render(
        TEMPLATE,
        replicas=plan.replicas,
        engine=engine.title,
        health_path=engine.health_path,
        router_port=plan.router_port,
        metrics_port=metrics_port,
        max_concurrent_per_replica=max_concurrent_per_replica,
        api_maxconn=max(MIN_API_MAXCONN, 2 * in_flight),
        api_maxconn_floor=MIN_API_MAXCONN,
        metrics_maxconn=METRICS_MAXCONN,
        max_body_bytes=max_request_body_bytes(plan),
        refusals=[_Refusal(status, acl, engine.error_body(status, message), openai_error_body(status, message))
                  for status, acl, message in (
                      (411, "chunked", LENGTH_REQUIRED),
                      (413, "body_too_large", body_too_large_message(max_request_body_bytes(plan))),
                      (400, "userinfo", USERINFO),
                      (400, "folded", FOLDED_HEADER))],
        check_inter_ms=health_check_interval_ms,
        check_fastinter_ms=health_check_interval_ms // 5,
        stream_timeout_s=STREAM_TIMEOUT_SECONDS,
        header_timeout_s=HEADER_TIMEOUT_SECONDS,
        keep_alive_timeout_s=STREAM_TIMEOUT_SECONDS + KEEP_ALIVE_MARGIN_SECONDS,
        user=user,
        api_keys=api_keys,
        keys_file=keys_file,
        runtime_socket=runtime_socket,
        drain=drain,
        drain_file=drain_file,
        drain_pattern=DRAIN_PATTERN,
        health_draining=engine.error_body(503, HEALTH_DRAINING),
        load_balancer_authentication=load_balancer_authentication,
        log_target=log_target,
        realm=REALM,
        errors=[_ErrorPage(status, body, openai_error_pages()[status], ERRORS_SINCE.get(status))
                for status, body in error_pages(engine).items()],
        openai_routes=OPENAI_ROUTES,
        unauthorized=engine.error_body(401, UNAUTHORIZED),
        unauthorized_openai=openai_error_body(401, UNAUTHORIZED),
        not_found=engine.error_body(404, not_found_message(engine)),
        not_found_openai=openai_error_body(404, not_found_message(engine)),
        health_unavailable=engine.error_body(503, HEALTH_UNAVAILABLE),
        health_method_not_allowed=engine.error_body(405, method_not_allowed_message("/health", ("GET", "HEAD"))),
        routes=[_Route(path, methods, engine.route_error_body(path, 405, method_not_allowed_message(path, methods)))
                for path, methods in engine.api_routes.items()],
        forwarded_headers=FORWARDED_HEADERS,
    ))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _has_space_or_quote(text: str) -> bool:
    return any(c.isspace() or c in "'\"" for c in text)


def _single_quotable(config: str) -> str:
    """``config``, whose single-quoted HAProxy arguments (the JSON bodies) hold no quote of their
    own: HAProxy has no escape inside single quotes (configuration manual 2.4, section 2.2)."""
    for number, line in enumerate(config.splitlines(), 1):
        if not line.lstrip().startswith("#") and line.count("'") % 2:
            raise ValueError(f"router config line {number} has an unpaired single quote: {line.strip()[:120]}")
    return config
