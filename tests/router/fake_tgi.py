"""A fake TGI replica for the router tests: the routes and failure modes the router relies on, on
127.0.0.1 only, with the Python standard library.

- ``GET /health``: 200, or 503 while ``healthy`` is false (TGI's answer when it is unhealthy).
- ``POST /generate``: one JSON answer after ``max_new_tokens`` token delays.
- ``POST /generate_stream``: one Server-Sent Event per token, each flushed as its own HTTP chunk
  when it is "generated", ``token_delay`` seconds apart, like TGI's SSE stream.
- With ``parameters.details``, both say how many tokens they generated (``details.generated_tokens``;
  streamed, in the last event), as TGI's ``GenerateResponse`` and ``StreamResponse`` do
  (text-generation-inference v3.3.5 router/src/lib.rs).
- ``POST /v1/chat/completions`` (unstreamed): TGI's ``ChatCompletion`` with the message's content
  and ``usage`` (router/src/lib.rs at v3.3.5).
- ``POST /v1/completions`` and ``/v1/chat/completions`` with ``"stream": true``, as TGI v3.3.5
  streams them (router/src/server.rs ``completions`` and ``chat_completions``, router/src/chat.rs
  ``ChatState::push``, the types in router/src/lib.rs): one ``data: <json>`` event per token, then
  ``data: [DONE]``. Completions: a ``text_completion`` ``Chunk`` per token, the last one a
  ``CompletionFinal`` with ``finish_reason`` and ``usage`` (always). Chat: a
  ``chat.completion.chunk`` per token with ``delta {role, content}`` and ``usage: null``, the last
  with ``finish_reason``; with ``stream_options.include_usage``, one more chunk with no choices and
  the ``usage``. Other request fields (``ignore_eos``, ``stream_options.continuous_usage_stats``)
  are ignored, as TGI's serde structs ignore unknown fields. ``usage.prompt_tokens`` counts the
  prompt's whitespace-separated words, standing in for the model's tokenizer. Unstreamed,
  ``/v1/completions`` answers one ``CompletionFinal`` (``object: text_completion``, one choice with
  ``text`` and ``finish_reason``, ``usage``; server.rs ``completions``, lib.rs ``Completion``).
- ``POST /``: TGI's ``compat_generate`` (server.rs, lib.rs ``CompatGenerateRequest``: ``inputs``,
  ``parameters``, ``stream`` false by default), where huggingface_hub's InferenceClient sends
  ``text_generation``: unstreamed, /generate's answer wrapped in a list of one ("to match
  api-inference"); with ``"stream": true``, /generate_stream's events.
- ``GET /info``: TGI's ``Info`` (its ``model_id`` and a few other fields; router/src/lib.rs).
- ``GET /v1/models``: ``openai_get_model_info`` (server.rs): a ``ModelsInfo`` ``{object: "list",
  data}`` of one ``ModelInfo`` ``{id, object: "model", created: 0, owned_by}``, id and owner the
  ``Info.model_id`` (lib.rs).
- A route in ``failing`` answers 424 with TGI's ``ErrorResponse``, as TGI answers a generation
  error (router/src/server.rs at v3.3.5: ``InferError::GenerationError`` is FAILED_DEPENDENCY).
  Streamed on an OpenAI route, the error is an event of the 200 stream instead, then ``[DONE]``
  (server.rs: ``Err(err) => yield Ok(err.into_openai_event())``; router/src/infer/mod.rs
  ``OpenaiErrorEvent {error: {message, http_status_code: 422}}``).

Every answer names the replica in an ``X-Replica`` header, and every generation request is
recorded, so tests can count the traffic each replica served, and the tokens it generated.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SERVED_MODEL = "meta-llama/Llama-3.2-1B-Instruct"

OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions")

FINGERPRINT = "3.3.5-native"
"""TGI's ``system_fingerprint``: its version and docker label (server.rs)."""

GENERATION_ERROR = "Request failed during generation: Server error: device lost"

MAX_TOKENS = 50
"""Upper bound on the tokens one fake request generates, so no test can make a replica busy for
long by mistake."""


@dataclass(frozen=True)
class Served:
    """One request a fake replica answered."""

    method: str
    path: str
    started: float
    headers: tuple[tuple[str, str], ...] = ()
    """The request's headers as the replica received them (names in lower case)."""
    prompt: str | None = None
    """The OpenAI completion's ``prompt``, where a fake records it (tests/router/fake_vllm.py)."""


def received(headers: Any) -> tuple[tuple[str, str], ...]:
    """A request's headers, names in lower case."""
    return tuple((k.lower(), v) for k, v in headers.items())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The router opens many connections at once in the spreading tests.
    request_queue_size = 64
    replica: FakeTgi

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Connections cut by ``FakeTgi.kill`` or by the router end handlers with socket errors;
        # they are expected, and a traceback per connection would bury real failures.
        pass


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 with explicit lengths or chunking, as TGI speaks it, so the router keeps
    # connections alive to the replica as it will in production.
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.replica._connection_opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.replica._connection_closed(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def parse_request(self) -> bool:
        # Both servers route on the path alone, whatever the query string: axum 0.7 matches
        # ``uri().path()`` (TGI v3.3.5's router), Starlette the ASGI scope's ``path``, which holds
        # no query (vLLM 0.11.0's FastAPI app). ``target`` keeps the request line's as sent.
        parsed = super().parse_request()
        self.target = self.path
        self.path = self.path.partition("?")[0]
        return parsed

    def do_GET(self) -> None:
        replica = self.server.replica
        if self.path == "/health":
            replica.health_checks += 1
            self._send_json(200 if replica.healthy else 503, {} if replica.healthy else {
                "error": "unhealthy", "error_type": "healthcheck"})
        elif self.path == "/info":
            self._send_json(200, {"model_id": SERVED_MODEL, "model_sha": None, "model_pipeline_tag": "text-generation",
                                  "max_concurrent_requests": 128, "max_input_tokens": 3072,
                                  "max_total_tokens": 4096, "router": "text-generation-router", "version": "3.3.5"})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": SERVED_MODEL, "object": "model", "created": 0, "owned_by": SERVED_MODEL}]})
        else:
            self._send_json(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        replica = self.server.replica
        body = self._read_json()
        tokens = _token_count(body)
        if self.path not in ("/", "/generate", "/generate_stream", *OPENAI_ROUTES):
            self._send_json(404, {"error": f"no route {self.path}"})
            return
        openai_stream = self.path in OPENAI_ROUTES and body.get("stream") is True
        if self.path in replica.failing:
            if openai_stream:
                self._start_stream("text/event-stream", ("Cache-Control", "no-cache"))
                error = {"error": {"message": GENERATION_ERROR, "http_status_code": 422}}
                self._write_chunk(f"data: {json.dumps(error)}\n\n".encode())
                self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")
                return
            self._send_json(424, {"error": GENERATION_ERROR, "error_type": "generation"})
            return
        replica._begin(Served("POST", self.path, time.monotonic(), received(self.headers)))
        parameters = body.get("parameters")
        details = isinstance(parameters, dict) and parameters.get("details") is True
        if self.path == "/generate_stream" or (self.path == "/" and body.get("stream") is True):
            self._stream(tokens, replica.token_delay, details)
            return
        if openai_stream:
            self._stream_openai(body, replica.token_delay)
            return
        if self.path in OPENAI_ROUTES:
            tokens = _chat_token_count(body)
        time.sleep(tokens * replica.token_delay)
        # Done generating before the answer leaves: once the router has it, it may send the
        # next request at once, and that must not count as overlapping this one.
        replica._end(tokens)
        text = " ".join(_token(i) for i in range(tokens))
        if self.path in ("/", "/generate"):
            generated = {"generated_text": text, **({"details": {
                "finish_reason": "length", "generated_tokens": tokens, "seed": None, "prefill": [],
                "tokens": []}} if details else {})}
            self._send_json(200, [generated] if self.path == "/" else generated)
        elif self.path == "/v1/completions":
            self._send_json(200, {"object": "text_completion", "id": "", "created": int(time.time()),
                                  "model": SERVED_MODEL, "system_fingerprint": FINGERPRINT,
                                  "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}],
                                  "usage": _usage(body, tokens)})
        else:
            self._send_json(200, {"object": "chat.completion", "id": "", "created": int(time.time()),
                                  "model": SERVED_MODEL, "system_fingerprint": FINGERPRINT,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                               "logprobs": None, "finish_reason": "length"}],
                                  "usage": _usage(body, tokens)})

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        try:
            value = json.loads(raw)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    def _send_json(self, status: int, payload: dict[str, Any] | list[Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Replica", self.server.replica.name)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _start_stream(self, content_type: str, *headers: tuple[str, str]) -> None:
        """A 200 with a chunked Server-Sent Events body, headers sent at once."""
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Replica", self.server.replica.name)
        self.end_headers()
        self.wfile.flush()

    def _stream(self, tokens: int, delay: float, details: bool = False) -> None:
        self._start_stream("text/event-stream", ("Cache-Control", "no-cache"))
        for i in range(tokens):
            time.sleep(delay)
            last = i == tokens - 1
            event = {
                "index": i + 1,
                "token": {"id": i, "text": _piece(i), "logprob": 0.0, "special": False},
                "generated_text": " ".join(_token(j) for j in range(tokens)) if last else None,
                "details": {"finish_reason": "length", "generated_tokens": tokens, "seed": None,
                            "input_length": 1} if last and details else None,
                "sent_at": time.monotonic(),
            }
            if last:
                self.server.replica._end(tokens)
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        self._write_chunk(b"")

    def _stream_openai(self, body: dict[str, Any], delay: float) -> None:
        chat = self.path == "/v1/chat/completions"
        tokens = _chat_token_count(body)
        usage = _usage(body, tokens)
        common = {"id": "", "created": int(time.time())}
        self._start_stream("text/event-stream", ("Cache-Control", "no-cache"))
        for i in range(tokens):
            time.sleep(delay)
            last = i == tokens - 1
            if chat:
                event: dict[str, Any] = {
                    "object": "chat.completion.chunk", **common, "model": SERVED_MODEL,
                    "system_fingerprint": FINGERPRINT,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": _piece(i)}, "logprobs": None,
                                 "finish_reason": "length" if last else None}],
                    "usage": None}
            elif last:
                event = {"object": "text_completion", **common, "model": SERVED_MODEL,
                         "system_fingerprint": FINGERPRINT,
                         "choices": [{"index": 0, "text": _piece(i), "logprobs": None, "finish_reason": "length"}],
                         "usage": usage}
            else:
                event = {"object": "text_completion", **common,
                         "choices": [{"index": 0, "text": _piece(i), "logprobs": None, "finish_reason": ""}],
                         "model": SERVED_MODEL, "system_fingerprint": FINGERPRINT}
            if last:
                self.server.replica._end(tokens)
            self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
        options = body.get("stream_options")
        if chat and isinstance(options, dict) and options.get("include_usage") is True:
            final = {"object": "chat.completion.chunk", **common, "model": SERVED_MODEL,
                     "system_fingerprint": FINGERPRINT, "choices": [], "usage": usage}
            self._write_chunk(f"data: {json.dumps(final)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _token_count(body: dict[str, Any]) -> int:
    parameters = body.get("parameters")
    requested = parameters.get("max_new_tokens", 1) if isinstance(parameters, dict) else 1
    if not isinstance(requested, int) or requested < 1:
        return 1
    return min(requested, MAX_TOKENS)


def _chat_token_count(body: dict[str, Any]) -> int:
    # router/src/lib.rs at v3.3.5: ChatRequest's max_tokens takes max_completion_tokens as an alias.
    requested = body.get("max_tokens", body.get("max_completion_tokens", 1))
    return min(requested, MAX_TOKENS) if isinstance(requested, int) and requested > 0 else 1


def _usage(body: dict[str, Any], tokens: int) -> dict[str, int]:
    """TGI's ``Usage`` of a generation of ``tokens`` tokens (router/src/lib.rs at v3.3.5)."""
    prompt = _prompt_words(body)
    return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}


def _prompt_words(body: dict[str, Any]) -> int:
    """The words of an OpenAI request's prompt, or of its messages' contents: a string, or a list of
    ``{"type": "text", "text": ...}`` parts (TGI v3.3.5 router/src/lib.rs ``MessageContent``;
    vLLM's ``ChatCompletionContentPartTextParam``)."""
    prompt = body.get("prompt")
    contents = [prompt] if isinstance(prompt, str) else [
        m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
    texts = [t for c in contents for t in ([c] if isinstance(c, str) else [
        part.get("text") for part in c if isinstance(part, dict)] if isinstance(c, list) else [])]
    return sum(len(t.split()) for t in texts if isinstance(t, str))


def _token(i: int) -> str:
    return f"tok{i}"


def _piece(i: int) -> str:
    """What token ``i`` adds to the streamed text: after the first, with the space before it, as
    real tokens carry it (the generated text is the pieces joined)."""
    return _token(i) if i == 0 else f" {_token(i)}"


class FakeTgi:
    """One fake replica on ``127.0.0.1:port``; ``start`` it, then ``stop`` or ``kill`` it.

    :param name: the replica's name, echoed in ``X-Replica``.
    :param port: the loopback port to listen on.
    :param token_delay: seconds between two generated tokens.
    """

    handler: Any = _Handler
    """The request handler class: TGI's routes here, vLLM's in fake_vllm.py."""

    def __init__(self, name: str, port: int, token_delay: float = 0.0) -> None:
        self.name = name
        self.port = port
        self.token_delay = token_delay
        self.healthy = True
        self.failing: set[str] = set()
        """Routes answered with the engine's error instead of a generation."""
        self.health_checks = 0
        self._served: list[Served] = []
        self._generated_tokens = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def served(self) -> list[Served]:
        """The generation requests answered so far (health checks are not counted)."""
        with self._lock:
            return list(self._served)

    @property
    def generated_tokens(self) -> int:
        """The tokens of every generation finished so far."""
        with self._lock:
            return self._generated_tokens

    @property
    def max_in_flight(self) -> int:
        """The most generation requests this replica ever worked on at once."""
        with self._lock:
            return self._max_in_flight

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port), self.handler)
        server.replica = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                         name=f"fake-tgi-{self.name}", daemon=True)
        self._thread.start()

    def kill(self) -> None:
        """Stop as a crashed container does: the port closes and open connections are cut."""
        self._close_listener()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        """Release everything; safe to call more than once."""
        self.kill()

    def _close_listener(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _begin(self, served: Served) -> None:
        with self._lock:
            self._served.append(served)
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)

    def _end(self, tokens: int) -> None:
        with self._lock:
            self._in_flight -= 1
            self._generated_tokens += tokens

    def _connection_opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _connection_closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)
