"""``neuron-serving smoke``: one request to each of a deployed endpoint's generation routes (the
engine's own, :meth:`~neuron_serving.plan.engines.Engine.smoke_requests`), each reported with its
status, end-to-end latency, time to first token when streamed, tokens received and the answer's
first words. Exit status 0 when every route passed, 1 otherwise.

The endpoint comes from the stack's outputs (``EndpointUrl``, ``Engine``, and ``ApiKeysSecretArn``
when keys are required) or from ``--url``, whose engine ``--engine`` names or one GET tells
(:attr:`~neuron_serving.plan.engines.Engine.probe`). That GET is sent first in every case: it
reaches the endpoint and checks the key without generating anything, so an unreachable endpoint
or a refused key is reported before a token is spent. HTTP is the standard library's; HTTPS
verifies the load balancer's certificate as any client would.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from ..plan.engines import ENGINES, Engine, SmokeRequest, engine
from ..plan.engines.base import JsonPath
from ..plan.phases import READY
from ..render.boot import API_KEYS_SYNC_MINUTES as SYNC_MINUTES
from .aws import EXIT_FAILURE, REGION_HELP, Aws, OpsError, run_aws
from .output import Printer, output_option, positive_seconds
from .stack import DEFAULT_STACK, StackInfo, describe_stack, find_hosts

API_KEY_ENV = "NEURON_SERVING_API_KEY"
"""The environment variable read for the key when ``--api-key`` is not given."""

PROMPT = "In one sentence, what is the capital of France?"
MAX_TOKENS = 24
"""Enough tokens for a sentence, few enough to answer in seconds on any layout."""

DEFAULT_TIMEOUT = 60.0
"""Seconds each request may take: a cold replica's first generation can take tens of seconds."""

CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a connection (or ``--timeout`` when shorter). The DNS name of an internal
load balancer resolves everywhere, to its nodes' private addresses (Elastic Load Balancing API
reference, CreateLoadBalancer ``Scheme``: "publicly resolvable to the private IP addresses of the
nodes"), so from outside its VPC the usual symptom is a connection that never comes, not a name
that fails; a load balancer that is reachable connects in milliseconds."""

LOCAL_PORT = 8080
"""The local port of the Session Manager forwarding the unreachable-endpoint message proposes."""

ANSWER_WORDS = 8
"""How many words of each answer the report shows."""



class SmokeError(OpsError):
    """A reason no generation request was sent (no key, a refused key, an unreachable endpoint)."""


class Unreachable(Exception):
    """The endpoint's host did not resolve or took no connection; its message says which."""


@dataclass(frozen=True)
class Endpoint:
    """Where the smoke requests go, and what is known of it.

    :param keys_required: True or False when the stack says; None with ``--url``.
    :param stack: the stack, with ``--stack``; None with ``--url``.
    """

    url: str
    engine: Engine | None
    keys_required: bool | None
    stack: StackInfo | None
    region: str | None


@dataclass(frozen=True)
class Outcome:
    """One route's result. Times are seconds; ``ttft`` only for a streamed route."""

    label: str
    route: str
    passed: bool
    status: int | None
    latency: float | None
    ttft: float | None
    tokens: int | None
    answer: str
    problem: str | None = None


@dataclass(frozen=True)
class Answer:
    """What came back for one request; ``latency`` from before connecting to the body's end."""

    status: int
    body: bytes
    latency: float
    events: tuple[tuple[Any, float], ...] = ()
    """Streamed: each JSON event and when it arrived (seconds since the request started)."""


# --- the command -----------------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add ``smoke`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    smoke = commands.add_parser(
        "smoke", parents=[output_option()], help="send one request to each generation route of the endpoint",
        description="Send one request to each of the endpoint's generation routes (the engine's own and the "
        "OpenAI-compatible one, one of them streamed) and report status, latency, time to first token, tokens "
        "and the answer's first words. Exit status 0 when every route passed.")
    where = smoke.add_mutually_exclusive_group()
    where.add_argument("--stack", help=f"the deployed stack, whose outputs give the URL, engine and whether keys are "
                                       f"required (default: {DEFAULT_STACK})")
    where.add_argument("--url", help="the endpoint's base URL instead (e.g. http://localhost:8080 through Session "
                                     "Manager port forwarding); no AWS call is made")
    smoke.add_argument("--region", help=REGION_HELP)
    smoke.add_argument("--api-key", help=f"the key sent as Authorization: Bearer <key> (default: ${API_KEY_ENV}, "
                       "which is better: other users of this machine can see a command line)")
    smoke.add_argument("--engine", choices=tuple(ENGINES), help="the endpoint's engine with --url (default: asked "
                                                                 "of the endpoint with one GET)")
    smoke.add_argument("--timeout", type=positive_seconds, default=DEFAULT_TIMEOUT,
                       help=f"seconds each request may take (default: {DEFAULT_TIMEOUT:g})")
    smoke.set_defaults(run=command)


def command(args: argparse.Namespace) -> int:
    """Run ``smoke``; every failure a user can act on is one line on stderr (and a JSON document
    with ``--output json``) and exit status 1, never a traceback."""
    printer = Printer(args.output)
    key = args.api_key or os.environ.get(API_KEY_ENV) or None

    def run() -> int:
        try:
            endpoint = _endpoint(args)
            serving, outcomes = smoke(endpoint, key, args.timeout)
        except OpsError as err:
            if printer.json:
                printer.document({"passed": False, "error": str(err)})
            raise
        _report(printer, endpoint.url, serving, outcomes)
        return 0 if all(o.passed for o in outcomes) else EXIT_FAILURE

    return run_aws(run)


def _endpoint(args: argparse.Namespace) -> Endpoint:
    if args.url:
        url = args.url.rstrip("/")
        parsed = urllib.parse.urlsplit(url)
        try:
            valid = parsed.scheme in ("http", "https") and bool(parsed.hostname) and parsed.port != 0
        except ValueError:  # a port that is no number, or beyond 65535
            valid = False
        if not valid:
            raise SmokeError(f"--url {args.url!r} is not an http:// or https:// URL (such as http://localhost:8080)")
        return Endpoint(url, engine(args.engine) if args.engine else None, None, None, args.region)
    if args.engine:
        raise SmokeError("--engine goes with --url: with --stack the engine is the stack's Engine output")
    aws = Aws.connect(args.region)
    info = describe_stack(aws, args.stack or DEFAULT_STACK)
    url = info.require("EndpointUrl", "the endpoint's URL").rstrip("/")
    name = info.require("Engine", "the serving engine")
    if name not in ENGINES:
        raise SmokeError(f"stack {info.name} serves engine {name!r}, which this version of cdk-neuron-serving does "
                         f"not know ({', '.join(ENGINES)}): upgrade it")
    return Endpoint(url, ENGINES[name], bool(info.output("ApiKeysSecretArn")), info, aws.region)


def smoke(endpoint: Endpoint, key: str | None, timeout: float) -> tuple[Engine, list[Outcome]]:
    """The endpoint's engine and the outcome of each of its smoke requests; :class:`SmokeError`
    when none can be sent."""
    if endpoint.keys_required and not key:
        raise SmokeError(_no_key(endpoint))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        serving = _identify(endpoint, headers, key, timeout)
        return serving, [_run(endpoint.url, request, headers, timeout)
                         for request in serving.smoke_requests(PROMPT, MAX_TOKENS)]
    except Unreachable as err:
        raise SmokeError(_unreachable(endpoint, str(err))) from None


def _identify(endpoint: Endpoint, headers: dict[str, str], key: str | None, timeout: float) -> Engine:
    """The endpoint's engine, after one GET of its probe that reaches the endpoint and checks the key."""
    # TGI first: its /info is TGI's alone, while TGI serves vLLM's /v1/models too.
    candidates = [endpoint.engine] if endpoint.engine else list(ENGINES.values())
    for candidate in candidates:
        try:
            answer = _send(endpoint.url, "GET", candidate.probe.path, None, headers, timeout)
        except ssl.SSLCertVerificationError as err:
            raise SmokeError(f"{endpoint.url}'s TLS certificate is not trusted here ({err.verify_message}): "
                             "check the URL's host name against the certificate") from None
        except TimeoutError:
            raise SmokeError(f"{endpoint.url} took a connection but did not answer GET {candidate.probe.path} "
                             f"within {timeout:g} s (--timeout)") from None
        except (OSError, http.client.HTTPException) as err:
            raise SmokeError(f"{endpoint.url} failed to answer GET {candidate.probe.path}: {err}") from None
        if answer.status == 401:
            raise SmokeError(_refused(endpoint, key))
        if answer.status == 200 and candidate.probe.field in (_json(answer.body) or {}):
            return candidate
        if endpoint.engine is not None:
            others = [n for n in ENGINES if n != candidate.name]
            raise SmokeError(f"{endpoint.url} answered GET {candidate.probe.path} with {answer.status}, which a "
                             f"{candidate.title} endpoint answers with 200: is it a {candidate.title} endpoint? "
                             f"Try --engine {' or '.join(others)}, or leave --engine out to ask the endpoint")
    raise SmokeError(f"{endpoint.url} is not a neuron-serving endpoint this command knows: it answered none of "
                     + ", ".join(f"GET {e.probe.path} ({e.title})" for e in ENGINES.values())
                     + " with 200; check the URL, or name the engine with --engine")


def _no_key(endpoint: Endpoint) -> str:
    stack = endpoint.stack.name if endpoint.stack else "NAME"
    return (f"the endpoint requires an API key and none was given: create one with `neuron-serving api-key create "
            f"smoke --stack {stack}` (it prints the key once; a new key takes about {SYNC_MINUTES} minutes to reach "
            f"the hosts), then pass it with --api-key or ${API_KEY_ENV}. No request was sent")


def _refused(endpoint: Endpoint, key: str | None) -> str:
    stack = endpoint.stack.name if endpoint.stack else "NAME"
    create = f"`neuron-serving api-key create smoke --stack {stack}`"
    if not key:
        return (f"{endpoint.url} requires an API key (it answered 401) and none was given: create one with {create} "
                f"(a new key takes about {SYNC_MINUTES} minutes to reach the hosts), then pass it with --api-key or "
                f"${API_KEY_ENV}. No generation request was sent")
    return (f"{endpoint.url} refused the API key (401): it is not one of the stack's keys, or it is new and has not "
            f"reached the hosts yet (about {SYNC_MINUTES} minutes after `api-key create` or `rotate`). "
            f"`neuron-serving api-key list --stack {stack}` shows the keys' names; create one with {create}. "
            "No generation request was sent")


def _unreachable(endpoint: Endpoint, why: str) -> str:
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
            f"  neuron-serving smoke --url http://localhost:{LOCAL_PORT}{engine_flag}")


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


def _send(url: str, method: str, path: str, body: str | None, headers: dict[str, str], timeout: float,
          stream: bool = False) -> Answer:
    """One request on its own connection. :class:`Unreachable` when the connection cannot be made;
    a failure after it is an :class:`OSError` or :class:`http.client.HTTPException`."""
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
        sent = {**({"Content-Type": "application/json"} if body is not None else {}),
                "Accept": "text/event-stream" if stream else "application/json", **headers}
        conn.request(method, prefix + path, body=body.encode() if body is not None else None, headers=sent)
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
        value = _json(data.encode())
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


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _at(value: Any, path: JsonPath) -> Any:
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and -len(value) <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, dict):
            value = value.get(step)
        else:
            return None
    return value


# --- one route -------------------------------------------------------------------------------------------


def _run(url: str, request: SmokeRequest, headers: dict[str, str], timeout: float) -> Outcome:
    def failed(problem: str, status: int | None = None, latency: float | None = None) -> Outcome:
        return Outcome(request.label, request.path, False, status, latency, None, None, "", problem)

    try:
        answer = _send(url, "POST", request.path, request.body, headers, timeout, stream=request.stream)
    except TimeoutError:
        return failed(f"no answer within {timeout:g} s (--timeout)")
    except (OSError, http.client.HTTPException) as err:
        return failed(f"the connection failed: {err}")
    if answer.status == 401:
        return failed("refused the API key (401)", answer.status, answer.latency)
    if answer.status != 200:
        return failed(_error_text(answer.body), answer.status, answer.latency)
    if request.stream:
        return _streamed(request, answer)
    value = _json(answer.body)
    text = _at(value, request.text)
    tokens = _at(value, request.tokens)
    if not isinstance(text, str) or not text.strip():
        return failed("the answer holds no generated text", answer.status, answer.latency)
    return Outcome(request.label, request.path, True, answer.status, answer.latency, None,
                   tokens if isinstance(tokens, int) else None, _words(text))


def _streamed(request: SmokeRequest, answer: Answer) -> Outcome:
    texts: list[str] = []
    ttft = None
    counted = None
    for event, arrived in answer.events:
        text = _at(event, request.text)
        if isinstance(text, str) and text:
            texts.append(text)
            ttft = arrived if ttft is None else ttft
        tokens = _at(event, request.tokens)
        if isinstance(tokens, int):
            counted = tokens
        if isinstance(event, dict) and "error" in event:
            return Outcome(request.label, request.path, False, answer.status, answer.latency, ttft, len(texts),
                           _words("".join(texts)), f"the stream ended with an error: {_error_text(event)}")
    if ttft is None:
        return Outcome(request.label, request.path, False, answer.status, answer.latency, None, 0, "",
                       "the stream carried no token")
    return Outcome(request.label, request.path, True, answer.status, answer.latency, ttft,
                   counted if counted is not None else len(texts), _words("".join(texts)))


def _error_text(body: Any) -> str:
    """What an error answer says: TGI's ``{"error": "..."}``, vLLM's and the router's
    ``{"error": {"message": ...}}``, FastAPI's ``{"detail": ...}``, else the start of the body."""
    value = _json(body) if isinstance(body, bytes) else body
    if isinstance(value, dict):
        error = value.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if error:
            return str(error)
        if value.get("detail"):
            return str(value["detail"])
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else json.dumps(body)
    return text.strip()[:200] or "(empty answer)"


def _words(text: str) -> str:
    words = text.split()
    return " ".join(words[:ANSWER_WORDS]) + (" ..." if len(words) > ANSWER_WORDS else "")


# --- the report ------------------------------------------------------------------------------------------


def _report(printer: Printer, url: str, serving: Engine, outcomes: list[Outcome]) -> None:
    passed = all(o.passed for o in outcomes)
    if printer.json:
        printer.document({"url": url, "engine": serving.name, "passed": passed,
                          "routes": [asdict(o) for o in outcomes]})
        return
    rows = [[o.label, o.route, "pass" if o.passed else "fail", str(o.status or "-"), _seconds(o.latency),
             _seconds(o.ttft), "-" if o.tokens is None else str(o.tokens), o.answer if o.passed else o.problem or ""]
            for o in outcomes]
    printer.print(printer.table(["request", "route", "result", "status", "latency", "TTFT", "tokens", "answer"],
                                rows, title=f"{serving.title} at {url}", outcome_column=2))
    failures = sum(not o.passed for o in outcomes)
    printer.print("all routes passed" if passed else f"{failures} of {len(outcomes)} routes failed")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
