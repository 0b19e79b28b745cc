"""The on-host router: an HAProxy config that spreads requests over the replicas of a plan.

HAProxy rather than nginx: open-source nginx has ``least_conn`` and ``max_conns`` but neither
active health checks nor a queue for requests beyond the limit (both are nginx Plus features),
and HAProxy's Debian and Ubuntu packages include a Prometheus exporter. The config is ``userdata/haproxy.cfg.j2``.
"""

from __future__ import annotations

from ..plan.engines import DEFAULT_ENGINE, Engine
from ..plan.engines import engine as find_engine
from ..plan.errors import Problems
from ..plan.layout import ServingPlan
from .templates import render

ROUTER_METRICS_PORT = 8404
"""Loopback port of the router's Prometheus endpoint (``/metrics``) and stats page (``/stats``)."""

HEALTH_CHECK_INTERVAL_MS = 5000
"""How often the router asks each replica's ``GET /health``. With ``fall 3`` and a confirming
interval of a fifth of this, a failed replica leaves the rotation in about 7 s; a replica that
finishes loading joins it in about 6 s."""

STREAM_TIMEOUT_SECONDS = 900
"""Longest silence the router accepts from a client or a replica during one request: a request
can wait in the replica's queue for a batch slot, then stream for minutes. The ALB idle timeout should
not exceed it."""

KEEP_ALIVE_MARGIN_SECONDS = 60
"""How much longer than :data:`STREAM_TIMEOUT_SECONDS` the router keeps an idle ALB connection,
so that the ALB (idle timeout at most the stream timeout) always closes it first."""

ROUTER_USER = "haproxy"
"""The unprivileged user and group the Debian/Ubuntu ``haproxy`` package creates."""

MIN_GLOBAL_MAXCONN = 4096
"""Floor of the router's connection limit, whatever the plan: ALB connections are cheap."""

TEMPLATE = "haproxy.cfg.j2"


def render_router_config(
    plan: ServingPlan,
    engine: Engine | None = None,
    *,
    max_concurrent_per_replica: int | None = None,
    health_check_interval_ms: int = HEALTH_CHECK_INTERVAL_MS,
    metrics_port: int = ROUTER_METRICS_PORT,
    user: str | None = ROUTER_USER,
) -> str:
    """The HAProxy config that fronts every replica of ``plan`` on ``plan.router_port``.

    :param plan: the validated layout; one server per replica, on ``127.0.0.1:<replica.port>``.
    :param engine: the replicas' serving engine, whose health route the router checks.
        Default: TGI.
    :param max_concurrent_per_replica: requests in flight per replica; further requests wait in
        the router's queue. Must not exceed what the replicas accept (TGI answers 429 beyond its
        ``MAX_CONCURRENT_REQUESTS``). Default: the engine's ``max_concurrent_requests``.
    :param health_check_interval_ms: interval of the ``GET /health`` checks. Shorter intervals
        notice failures sooner at the cost of more check traffic. Default: 5000.
    :param metrics_port: loopback port of ``/metrics`` and ``/stats``. Default: 8404.
    :param user: user and group HAProxy drops to after binding its ports, or ``None`` to keep
        the user it was started as (only for running it unprivileged, as in tests).
        Default: ``haproxy``.

    Raises :class:`~neuron_serving.plan.ServingConfigError` naming each bad argument.
    """
    engine = engine or find_engine(DEFAULT_ENGINE)
    if max_concurrent_per_replica is None:
        max_concurrent_per_replica = engine.max_concurrent_requests
    problems = Problems()
    if not _is_int(max_concurrent_per_replica) or max_concurrent_per_replica < 1:
        problems.add("max_concurrent_per_replica", max_concurrent_per_replica,
                     f"must be an integer of at least 1 ({engine.title}'s default is {engine.max_concurrent_requests})")
    if not _is_int(health_check_interval_ms) or health_check_interval_ms < 100:
        problems.add("health_check_interval_ms", health_check_interval_ms,
                     "must be an integer of at least 100")
    if not _is_int(metrics_port) or not 1 <= metrics_port <= 65535:
        problems.add("metrics_port", metrics_port, "must be a TCP port from 1 to 65535")
    elif metrics_port == plan.router_port or metrics_port in {r.port for r in plan.replicas}:
        problems.add("metrics_port", metrics_port, "must differ from the router and replica ports")
    if user is not None and (not user or not user.replace("-", "").replace("_", "").isalnum()):
        problems.add("user", user, "must be a plain user name such as 'haproxy', or None")
    problems.raise_if_any()

    in_flight = len(plan.replicas) * max_concurrent_per_replica
    return render(
        TEMPLATE,
        replicas=plan.replicas,
        engine=engine.title,
        health_path=engine.health_path,
        router_port=plan.router_port,
        metrics_port=metrics_port,
        max_concurrent_per_replica=max_concurrent_per_replica,
        global_maxconn=max(MIN_GLOBAL_MAXCONN, 2 * in_flight),
        check_inter_ms=health_check_interval_ms,
        check_fastinter_ms=health_check_interval_ms // 5,
        stream_timeout_s=STREAM_TIMEOUT_SECONDS,
        keep_alive_timeout_s=STREAM_TIMEOUT_SECONDS + KEEP_ALIVE_MARGIN_SECONDS,
        user=user,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
