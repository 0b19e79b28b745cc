"""A fake vLLM server (OpenAI-compatible) for the router tests, with the Python standard library,
on 127.0.0.1 only: the routes and answers of vLLM 0.11.0's api_server that the router and its
clients rely on (vllm/entrypoints/openai/api_server.py, serving_completion.py, serving_chat.py and
protocol.py in vLLM 0.11.0's PyPI wheel).

- ``GET /health``: 200 with an empty body; 503 with an empty body once the engine died
  (``healthy`` false). Other methods on it: 405, as FastAPI answers a GET-only route.
- ``GET /v1/models``: the served model's card.
- ``POST /v1/completions`` and ``/v1/chat/completions``: ``max_tokens`` tokens (vLLM's default for
  completions is 16), ``token_delay`` seconds apart; with ``"stream": true`` one Server-Sent Event
  per token (``data: <json>``, each flushed as its own HTTP chunk), then ``data: [DONE]``. A model
  other than the served one: 404 with vLLM's error body. Streamed with
  ``stream_options.include_usage``, a last event before ``[DONE]`` has no choices and the ``usage``
  (serving_completion.py and serving_chat.py). ``usage.prompt_tokens`` counts the prompt's
  whitespace-separated words, standing in for the model's tokenizer.
- A route in ``failing`` answers 500 with vLLM's ``ErrorResponse`` (protocol.py), as vLLM answers
  an engine error.

Built on the fake TGI replica's server (fake_tgi.py): the same bookkeeping of requests in flight,
``X-Replica`` header and ``kill``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fake_tgi import MAX_TOKENS, SERVED_MODEL, FakeTgi, Served, _Handler, _piece, _token, _usage, received

GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")


class _VllmHandler(_Handler):
    def do_GET(self) -> None:
        replica = self.server.replica
        if self.path == "/health":
            replica.health_checks += 1
            self._send_empty(200 if replica.healthy else 503)
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": replica.served_model, "object": "model", "created": 0, "owned_by": "vllm", "root": "/models/x",
                 "parent": None, "max_model_len": 4096}]})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_OPTIONS(self) -> None:
        self._send_json(405, {"detail": "Method Not Allowed"})

    do_HEAD = do_OPTIONS

    def do_POST(self) -> None:
        replica = self.server.replica
        body = self._read_json()
        if self.path not in GENERATION_ROUTES:
            self._send_json(404, {"detail": "Not Found"})
            return
        if body.get("model") not in (None, "", replica.served_model):
            self._send_json(404, {"error": {"message": f"The model `{body['model']}` does not exist.",
                                            "type": "NotFoundError", "param": None, "code": 404}})
            return
        if self.path in replica.failing:
            self._send_json(500, {"error": {"message": "EngineCore encountered an issue.",
                                            "type": "InternalServerError", "param": None, "code": 500}})
            return
        chat = self.path == "/v1/chat/completions"
        # protocol.py: chat requests name max_completion_tokens, or the deprecated max_tokens.
        requested = body.get("max_completion_tokens", body.get("max_tokens", 16)) if chat else body.get(
            "max_tokens", 16)
        tokens = min(requested, MAX_TOKENS) if isinstance(requested, int) and requested > 0 else 16
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else None
        replica._begin(Served("POST", self.path, time.monotonic(), received(self.headers), prompt))
        if body.get("stream"):
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream_openai(tokens, replica.token_delay, chat, _usage(body, tokens) if usage else None)
            return
        time.sleep(tokens * replica.token_delay)
        replica._end(tokens)
        text = " ".join(_token(i) for i in range(tokens))
        choice = {"index": 0, "finish_reason": "length", "stop_reason": None,
                  **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
        self._send_json(200, {"id": "cmpl-0", "object": "chat.completion" if chat else "text_completion",
                              "created": int(time.time()), "model": replica.served_model, "choices": [choice],
                              "usage": _usage(body, tokens)})

    def _stream_openai(self, tokens: int, delay: float, chat: bool, usage: dict[str, int] | None) -> None:
        self._start_stream("text/event-stream; charset=utf-8")
        for i in range(tokens):
            time.sleep(delay)
            last = i == tokens - 1
            delta = {"delta": {"content": _piece(i)}} if chat else {"text": _piece(i)}
            chunk = {"id": "cmpl-0", "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": self.server.replica.served_model, "sent_at": time.monotonic(),
                     "choices": [{"index": 0, **delta, "finish_reason": "length" if last else None}]}
            if last:
                self.server.replica._end(tokens)
            self._write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())
        if usage:
            final = {"id": "cmpl-0", "object": "chat.completion.chunk" if chat else "text_completion",
                     "model": self.server.replica.served_model, "choices": [],
                     "usage": usage}
            self._write_chunk(f"data: {json.dumps(final)}\n\n".encode())
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _send_empty(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.send_header("X-Replica", self.server.replica.name)
        self.end_headers()


class FakeVllm(FakeTgi):
    """One fake vLLM server on ``127.0.0.1:port``; see :class:`FakeTgi`."""

    handler: Any = _VllmHandler

    def __init__(self, name: str, port: int, token_delay: float = 0.0, served_model: str = SERVED_MODEL) -> None:
        super().__init__(name, port, token_delay)
        self.served_model = served_model
        """The one model name it answers to (vLLM's ``--served-model-name``); others get 404."""

