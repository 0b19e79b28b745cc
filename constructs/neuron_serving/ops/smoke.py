"""``neuron-serving smoke``: one request to each of a deployed endpoint's generation routes (the
engine's own, :meth:`~neuron_serving.plan.engines.Engine.smoke_requests`), each reported with its
status, end-to-end latency, time to first token when streamed, tokens received and the answer's
first words. Exit status 0 when every route passed, 1 otherwise.

The endpoint, and the GET sent first that reaches it and checks the key without generating
anything, are :mod:`neuron_serving.ops.endpoint`'s: an unreachable endpoint or a refused key is
reported before a token is spent.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from ..plan.engines import Engine, SmokeRequest
from .aws import EXIT_FAILURE, OpsError, run_aws
from .endpoint import (
    API_KEY_ENV,
    Answer,
    Endpoint,
    EndpointError,
    Unreachable,
    at,
    endpoint_options,
    find_endpoint,
    headers,
    parse_json,
    reach,
    send,
    unreachable,
)
from .output import Printer, output_option, positive_seconds

PROMPT = "In one sentence, what is the capital of France?"
MAX_TOKENS = 24
"""Enough tokens for a sentence, few enough to answer in seconds on any layout."""

DEFAULT_TIMEOUT = 60.0
"""Seconds each request may take: a cold replica's first generation can take tens of seconds."""

ANSWER_WORDS = 8
"""How many words of each answer the report shows."""


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


# --- the command -----------------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add ``smoke`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    smoke = commands.add_parser(
        "smoke", parents=[output_option()], help="send one request to each generation route of the endpoint",
        description="Send one request to each of the endpoint's generation routes (the engine's own and the "
        "OpenAI-compatible one, one of them streamed) and report status, latency, time to first token, tokens "
        "and the answer's first words. Exit status 0 when every route passed.")
    endpoint_options(smoke)
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
            endpoint = find_endpoint(args)
            serving, outcomes = smoke(endpoint, key, args.timeout)
        except OpsError as err:
            if printer.json:
                printer.document({"passed": False, "error": str(err)})
            raise
        _report(printer, endpoint.url, serving, outcomes)
        return 0 if all(o.passed for o in outcomes) else EXIT_FAILURE

    return run_aws(run)


def smoke(endpoint: Endpoint, key: str | None, timeout: float) -> tuple[Engine, list[Outcome]]:
    """The endpoint's engine and the outcome of each of its smoke requests;
    :class:`~neuron_serving.ops.endpoint.EndpointError` when none can be sent."""
    serving, _ = reach(endpoint, key, timeout, "smoke")
    try:
        return serving, [_run(endpoint.url, request, headers(key), timeout)
                         for request in serving.smoke_requests(PROMPT, MAX_TOKENS)]
    except Unreachable as err:
        raise EndpointError(unreachable(endpoint, str(err), "smoke")) from None


# --- one route -------------------------------------------------------------------------------------------


def _run(url: str, request: SmokeRequest, sent: dict[str, str], timeout: float) -> Outcome:
    def failed(problem: str, status: int | None = None, latency: float | None = None) -> Outcome:
        return Outcome(request.label, request.path, False, status, latency, None, None, "", problem)

    try:
        answer = send(url, "POST", request.path, request.body, sent, timeout, stream=request.stream)
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
    value = parse_json(answer.body)
    text = at(value, request.text)
    tokens = at(value, request.tokens)
    if not isinstance(text, str) or not text.strip():
        return failed("the answer holds no generated text", answer.status, answer.latency)
    return Outcome(request.label, request.path, True, answer.status, answer.latency, None,
                   tokens if isinstance(tokens, int) else None, _words(text))


def _streamed(request: SmokeRequest, answer: Answer) -> Outcome:
    texts: list[str] = []
    ttft = None
    counted = None
    for event, arrived in answer.events:
        text = at(event, request.text)
        if isinstance(text, str) and text:
            texts.append(text)
            ttft = arrived if ttft is None else ttft
        tokens = at(event, request.tokens)
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
    value = parse_json(body) if isinstance(body, bytes) else body
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
