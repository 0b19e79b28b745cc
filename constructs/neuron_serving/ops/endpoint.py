"""A deployed endpoint as the commands that send it requests (``smoke``, ``bench``) see it: where it
is, which engine serves it, whether it needs an API key, and, before anything is generated, one GET
that reaches it and checks the key. An unreachable endpoint is a sentence that says how to forward
a port to it with Session Manager.

The endpoint comes from the stack's outputs (``EndpointUrl``, ``Engine``, and ``ApiKeysSecretArn``
when keys are required) or from ``--url``, whose engine ``--engine`` names or the GET tells
(:attr:`~neuron_serving.plan.engines.Engine.probe`). HTTP is the standard library's; HTTPS
verifies the load balancer's certificate as any client would.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..plan.engines import ENGINES, Engine, engine
from ..plan.engines.base import JsonPath
from ..plan.phases import READY
from ..render.boot import API_KEYS_SYNC_MINUTES as SYNC_MINUTES
from .aws import REGION_HELP, Aws, OpsError
from .stack import DEFAULT_STACK, StackInfo, describe_stack, find_hosts

API_KEY_ENV = "NEURON_SERVING_API_KEY"
"""The environment variable read for the key when ``--api-key`` is not given."""

CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a connection (or the request's timeout when shorter). The DNS name of an
internal load balancer resolves everywhere, to its nodes' private addresses (Elastic Load Balancing
API reference, CreateLoadBalancer ``Scheme``: "publicly resolvable to the private IP addresses of
the nodes"), so from outside its VPC the usual symptom is a connection that never comes, not a name
that fails; a load balancer that is reachable connects in milliseconds."""

LOCAL_PORT = 8080
"""The local port of the Session Manager forwarding the unreachable-endpoint message proposes."""


class EndpointError(OpsError):
    """A reason no generation request was sent (no key, a refused key, an unreachable endpoint)."""


class Unreachable(Exception):
    """The endpoint's host did not resolve or took no connection; its message says which."""


@dataclass(frozen=True)
class Endpoint:
    """Where the requests go, and what is known of it.

    :param keys_required: True or False when the stack says; None with ``--url``.
    :param stack: the stack, with ``--stack``; None with ``--url``.
    """

    url: str
    engine: Engine | None
    keys_required: bool | None
    stack: StackInfo | None
    region: str | None


@dataclass(frozen=True)
class Answer:
    """What came back for one request; ``latency`` from before connecting to the body's end."""

    status: int
    body: bytes
    latency: float
    events: tuple[tuple[Any, float], ...] = ()
    """Streamed: each JSON event and when it arrived (seconds since the request started)."""


def endpoint_options(parser: argparse.ArgumentParser) -> None:
    """Add the options that say where the endpoint is: ``--stack`` or ``--url`` (with ``--engine``),
    ``--region`` and ``--api-key``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--stack", help=f"the deployed stack, whose outputs give the URL, engine and whether keys are "
                                       f"required (default: {DEFAULT_STACK})")
    where.add_argument("--url", help="the endpoint's base URL instead (e.g. http://localhost:8080 through Session "
                                     "Manager port forwarding); no AWS call is made")
    parser.add_argument("--region", help=REGION_HELP)
    parser.add_argument("--api-key", help=f"the key sent as Authorization: Bearer <key> (default: ${API_KEY_ENV}, "
                        "which is better: other users of this machine can see a command line)")
    parser.add_argument("--engine", choices=tuple(ENGINES), help="the endpoint's engine with --url (default: asked "
                                                                  "of the endpoint with one GET)")


def find_endpoint(args: argparse.Namespace) -> Endpoint:
    """The endpoint :func:`endpoint_options` name: ``--url``'s, or the stack's (one
    cloudformation:DescribeStacks)."""
    if args.url:
        url = args.url.rstrip("/")
        parsed = urllib.parse.urlsplit(url)
        try:
            valid = parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
        except ValueError:  # a port that is no number, or beyond 65535
            valid = False
        if not valid:
            raise EndpointError(f"--url {args.url!r} is not an http:// or https:// URL (such as "
                                "http://localhost:8080)")
        return Endpoint(url, engine(args.engine) if args.engine else None, None, None, args.region)
    if args.engine:
        raise EndpointError("--engine goes with --url: with --stack the engine is the stack's Engine output")
    aws = Aws.connect(args.region)
    info = describe_stack(aws, args.stack or DEFAULT_STACK)
    url = info.require("EndpointUrl", "the endpoint's URL").rstrip("/")
    name = info.require("Engine", "the serving engine")
    if name not in ENGINES:
        raise EndpointError(f"stack {info.name} serves engine {name!r}, which this version of cdk-neuron-serving "
                            f"does not know ({', '.join(ENGINES)}): upgrade it")
    return Endpoint(url, ENGINES[name], bool(info.output("ApiKeysSecretArn")), info, aws.region)


def reach(endpoint: Endpoint, key: str | None, timeout: float, command: str) -> tuple[Engine, Any]:
    """The endpoint's engine and its answer to the engine's probe (parsed JSON), after one GET that
    reaches the endpoint and checks the key without generating anything. :class:`EndpointError`
    when no generation request should be sent; its advice names ``command`` (``smoke``, ``bench``)."""
    if endpoint.keys_required and not key:
        raise EndpointError(_no_key(endpoint, command))
    try:
        return _identify(endpoint, headers(key), key, timeout, command)
    except Unreachable as err:
        raise EndpointError(unreachable(endpoint, str(err), command)) from None


def headers(key: str | None) -> dict[str, str]:
    """The headers that carry ``key``, if any."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def _identify(endpoint: Endpoint, sent: dict[str, str], key: str | None, timeout: float,
              command: str) -> tuple[Engine, Any]:
    # TGI first: its /info is TGI's alone, while TGI serves vLLM's /v1/models too.
    candidates = [endpoint.engine] if endpoint.engine else list(ENGINES.values())
    for candidate in candidates:
        try:
            answer = send(endpoint.url, "GET", candidate.probe.path, None, sent, timeout)
        except ssl.SSLCertVerificationError as err:
            raise EndpointError(f"{endpoint.url}'s TLS certificate is not trusted here ({err.verify_message}): "
                                "check the URL's host name against the certificate") from None
        except TimeoutError:
            raise EndpointError(f"{endpoint.url} took a connection but did not answer GET {candidate.probe.path} "
                                f"within {timeout:g} s (--timeout)") from None
        except (OSError, http.client.HTTPException) as err:
            raise EndpointError(f"{endpoint.url} failed to answer GET {candidate.probe.path}: {err}") from None
        if answer.status == 401:
            raise EndpointError(_refused(endpoint, key, command))
        value = parse_json(answer.body)
        if answer.status == 200 and isinstance(value, dict) and candidate.probe.field in value:
            return candidate, value
        if endpoint.engine is not None:
            others = [n for n in ENGINES if n != candidate.name]
            raise EndpointError(f"{endpoint.url} answered GET {candidate.probe.path} with {answer.status}, which a "
                                f"{candidate.title} endpoint answers with 200: is it a {candidate.title} endpoint? "
                                f"Try --engine {' or '.join(others)}, or leave --engine out to ask the endpoint")
    raise EndpointError(f"{endpoint.url} is not a neuron-serving endpoint this command knows: it answered none of "
                        + ", ".join(f"GET {e.probe.path} ({e.title})" for e in ENGINES.values())
                        + " with 200; check the URL, or name the engine with --engine")


def _no_key(endpoint: Endpoint, command: str) -> str:
    stack = endpoint.stack.name if endpoint.stack else "NAME"
    return (f"the endpoint requires an API key and none was given: create one with `neuron-serving api-key create "
            f"{command} --stack {stack}` (it prints the key once; a new key takes about {SYNC_MINUTES} minutes to "
            f"reach the hosts), then pass it with --api-key or ${API_KEY_ENV}. No request was sent")


def _refused(endpoint: Endpoint, key: str | None, command: str) -> str:
    stack = endpoint.stack.name if endpoint.stack else "NAME"
    create = f"`neuron-serving api-key create {command} --stack {stack}`"
    if not key:
        return (f"{endpoint.url} requires an API key (it answered 401) and none was given: create one with {create} "
                f"(a new key takes about {SYNC_MINUTES} minutes to reach the hosts), then pass it with --api-key or "
                f"${API_KEY_ENV}. No generation request was sent")
    return (f"{endpoint.url} refused the API key (401): it is not one of the stack's keys, or it is new and has not "
            f"reached the hosts yet (about {SYNC_MINUTES} minutes after `api-key create` or `rotate`). "
            f"`neuron-serving api-key list --stack {stack}` shows the keys' names; create one with {create}. "
            "No generation request was sent")


def unreachable(endpoint: Endpoint, why: str, command: str) -> str:
    """What to do when ``endpoint`` cannot be reached (``why``): forward a local port to one host's
    router with Session Manager, then run ``command`` against it."""
    region = endpoint.region or "<region>"
    port = (endpoint.stack.output("RouterPort") if endpoint.stack else None) or "<RouterPort output>"
    host = _host(endpoint) or "<instance id>"
    engine_flag = f" --engine {endpoint.engine.name}" if endpoint.engine else ""
    # AWS Systems Manager user guide, "Start a session with a document by specifying the session
    # documents in IAM policies" (docs.aws.amazon.com/systems-manager/latest/userguide/
    # getting-started-specify-session-document.html): aws ssm start-session --target <id>
    # --document-name AWS-StartPortForwardingSession --parameters '{"portNumber":["80"],
    # "localPortNumber":["56789"]}'. The hosts' role allows Session Manager (the stack's
    # InstanceId output says so); the client needs the Session Manager plugin.
    parameters = json.dumps({"portNumber": [port], "localPortNumber": [str(LOCAL_PORT)]}, separators=(",", ":"))
    where = "" if endpoint.stack else " (run with --stack NAME instead of --url to have the host and port filled in)"
    return (f"cannot reach {endpoint.url} from here ({why}). An internal load balancer answers only inside its VPC; "
            f"from elsewhere, forward a local port to one host's router with Session Manager{where}:\n"
            f"  aws ssm start-session --region {region} --target {host} --document-name "
            f"AWS-StartPortForwardingSession --parameters '{parameters}'\n"
            f"then, in another terminal:\n"
            f"  neuron-serving {command} --url http://localhost:{LOCAL_PORT}{engine_flag}")


def _host(endpoint: Endpoint) -> str | None:
    """One host's instance id: the stack's InstanceId output, or of a fleet's hosts
    (:func:`~neuron_serving.ops.stack.find_hosts`) one that reported ``ready``, else one in service,
    else any running; None without a stack, or when none can be listed (the message then says
    ``<instance id>``)."""
    if endpoint.stack is None or endpoint.region is None:
        return None
    if endpoint.stack.output("InstanceId"):  # a single host: the output names it, no call needed
        return endpoint.stack.output("InstanceId")
    try:
        hosts = find_hosts(Aws.connect(endpoint.region), endpoint.stack)
    except OpsError:
        return None
    # A stopped warm-pool host has no router to forward to.
    running = [h for h in hosts if h.state == "running"]
    ranked = sorted(running, key=lambda h: (h.phase != READY, h.lifecycle_state not in (None, "InService")))
    return ranked[0].instance_id if ranked else None


# --- HTTP ------------------------------------------------------------------------------------------------


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parsed.hostname or "", parsed.port, timeout=timeout, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=timeout)
    return conn, parsed.path.rstrip("/")


def send(url: str, method: str, path: str, body: str | None, sent: dict[str, str], timeout: float,
         stream: bool = False) -> Answer:
    """One request on its own connection, with the headers ``sent``. :class:`Unreachable` when the
    connection cannot be made; a failure after it is an :class:`OSError` or
    :class:`http.client.HTTPException`."""
    connect_timeout = min(timeout, CONNECT_TIMEOUT)
    conn, prefix = _connection(url, connect_timeout)
    started = time.monotonic()
    try:
        try:
            conn.connect()
        except socket.gaierror as err:
            raise Unreachable(f"its name does not resolve: {err.strerror or err}") from None
        except TimeoutError:
            raise Unreachable(f"no connection within {connect_timeout:g} s") from None
        except ssl.SSLError:
            raise  # reached, but its certificate is refused: not a matter of reaching it
        except OSError as err:
            raise Unreachable(err.strerror or str(err)) from None
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        request_headers = {**({"Content-Type": "application/json"} if body is not None else {}),
                           "Accept": "text/event-stream" if stream else "application/json", **sent}
        conn.request(method, prefix + path, body=body.encode() if body is not None else None, headers=request_headers)
        response = conn.getresponse()
        if not stream or response.status != 200:
            data = response.read()
            return Answer(response.status, data, time.monotonic() - started)
        events = _read_events(response, started)
        return Answer(response.status, b"", time.monotonic() - started, events)
    finally:
        conn.close()


def _read_events(response: http.client.HTTPResponse, started: float) -> tuple[tuple[Any, float], ...]:
    """The JSON events of a Server-Sent Events stream, each with the seconds since ``started`` at
    which it arrived; data that is no JSON (vLLM's closing ``[DONE]``) is skipped."""
    events = []
    for data in _sse_data(response):
        value = parse_json(data.encode())
        if value is not None:
            events.append((value, time.monotonic() - started))
    return tuple(events)


def _sse_data(response: http.client.HTTPResponse) -> Iterator[str]:
    """Each event's data (its ``data:`` lines joined), as the stream delivers it (WHATWG HTML
    standard, "Server-sent events", interpreting an event stream)."""
    lines: list[str] = []
    while True:
        raw = response.readline()
        if not raw:
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
            lines = []
        elif line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    if lines:
        yield "\n".join(lines)


def parse_json(data: bytes) -> Any:
    """``data`` as JSON, or None when it is none."""
    try:
        return json.loads(data)
    except ValueError:
        return None


def at(value: Any, path: JsonPath) -> Any:
    """The value ``path`` leads to in ``value``, or None when it leads nowhere."""
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value
