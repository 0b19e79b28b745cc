"""A fake TGI Neuron replica that batches continuously, for the serving-path benchmarks: asyncio and
the standard library only, on 127.0.0.1 only.

What it imitates, from text-generation-inference v3.3.5 (huggingface/text-generation-inference, tag
v3.3.5), is what decides latency behind the router:

- Batching. The Neuron image runs ``text-generation-router-v2`` (Dockerfile.neuron), whose batching
  task (backends/v2/src/backend.rs, ``batching_task``) queues requests and, before each decode step,
  prefills the waiting requests the batch has free slots for. With the launcher's default
  ``waiting_served_ratio`` of 0.3 (launcher/src/main.rs) and batches of at most 4, a waiting request
  joins at the next step whenever a slot is free. The prefill stalls the decoding of the running
  batch, and the joining requests' first tokens come out at its end. The running requests get no
  token from it: the Neuron generator pauses their slots and generates only for the prefilled ones
  (backends/neuron/server/text_generation_server/generator.py, ``NeuronGenerator.prefill``:
  ``slot.pause()`` on the active slots, then ``_generate_token(prefill_slots, ...)``). Each decode
  step gives every request in the batch one token.

  These decisions are not made here: they come from the planner's own model,
  :class:`neuron_serving.plan.queueing.BatchSchedule`, and what each operation costs from its
  :class:`~neuron_serving.plan.queueing.ReplicaCosts` (``ReplicaSpec.costs``), so that the planner's
  prediction of a trace and this fake's measurement of it differ only by what the model leaves out
  (the router's own delay, the network, the event loops). The fake runs each operation for its
  modelled seconds on its device clock and sends the tokens it gives.
- Abandoned requests. A request whose client has gone leaves the batch, or the queue, at the end
  of the operation under way (:meth:`BatchSchedule.drop`), as TGI drops it when the response
  channel is closed (backends/v2/src/queue.rs, ``State::next_batch``: queued entries whose
  ``response_tx`` is closed are skipped; backends/v2/src/backend.rs, ``send_responses`` returns
  "stopped" for an entry whose channel is closed and ``filter_send_generations`` removes it).
- ``POST /generate_stream``: response headers at once, then one Server-Sent Event per token, each a
  ``StreamResponse`` (``index``, ``token``, ``generated_text`` on the last; router/src/server.rs,
  ``generate_stream_internal``, and router/src/lib.rs). ``POST /generate``: one JSON
  ``{"generated_text": ...}`` at the end.
- Overload. Each request takes one of ``MAX_CONCURRENT_REQUESTS`` permits, or fails with
  ``InferError::Overloaded``, whose text is "Model is overloaded" and type "overloaded"
  (router/src/infer/mod.rs, ``generate_stream``). ``/generate`` answers it with status 429 and the
  ``ErrorResponse`` JSON ``{"error", "error_type"}`` (router/src/server.rs, ``From<InferError> for
  (StatusCode, Json<ErrorResponse>)``); ``/generate_stream`` has already answered 200 and sends the
  same ``ErrorResponse`` as its only event (``From<InferError> for Event``). A replica can also be
  told to answer every request so.
- ``GET /health``: 200 with an empty body while it serves (router/src/server.rs, ``health``).
- Death and restart: :meth:`BatchingReplica.kill` closes the port and cuts every open connection, as
  a crashed container does; :meth:`BatchingReplica.restart` opens it again with an empty batch.

Input tokens are counted as the whitespace-separated words of ``inputs``; output tokens are
``parameters.max_new_tokens``.

Run as ``python -m benchmarks.batching_replica '<JSON list of ReplicaSpec fields>'`` it serves
those replicas in one process and obeys one command per line on stdin (:class:`ReplicaHost`
drives it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from neuron_serving.plan.queueing import BatchSchedule, Operation, ReplicaCosts

MAX_CONCURRENT_REQUESTS = 128
"""TGI's default ``MAX_CONCURRENT_REQUESTS`` (launcher/src/main.rs at v3.3.5)."""

OVERLOADED = {"error": "Model is overloaded", "error_type": "overloaded"}
"""TGI's ``ErrorResponse`` for ``InferError::Overloaded``."""

HEADER_LIMIT = 64 * 1024


@dataclass(frozen=True)
class ReplicaSpec:
    """One fake replica.

    :param name: echoed in the ``X-Replica`` response header.
    :param port: its loopback port.
    :param costs: its batch size (TGI ``MAX_BATCH_SIZE``) and what its prefills and decode steps
        cost, on the clock it runs (the planner's model, :class:`ReplicaCosts`).
    :param max_concurrent_requests: requests queued or in the batch beyond which it answers
        overloaded. Default: TGI's 128.
    """

    name: str
    port: int
    costs: ReplicaCosts
    max_concurrent_requests: int = MAX_CONCURRENT_REQUESTS

    def to_json(self) -> dict[str, Any]:
        """Its fields as JSON values (``costs`` as a dict of its fields)."""
        return asdict(self)

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> ReplicaSpec:
        """The spec :meth:`to_json` gave ``fields`` for."""
        return cls(**{**fields, "costs": ReplicaCosts(**fields["costs"])})


@dataclass(eq=False)
class _Generation:
    input_tokens: int
    output_tokens: int
    writer: asyncio.StreamWriter
    stream: bool
    finished: asyncio.Future[None]
    arrived: float
    """When the request reached the replica (the event loop's clock)."""
    produced: int = 0
    """Tokens sent so far."""


@dataclass
class ReplicaStats:
    """What a replica saw, in ``time.monotonic()`` seconds (one clock for every process here)."""

    requests: int = 0
    """Generation requests accepted (not answered overloaded) since the replica was created."""
    overloaded: int = 0
    """Requests answered overloaded."""
    health_checks: int = 0
    """``GET /health`` requests answered."""
    first_request_after_restart: float | None = None
    """When the first generation request arrived after the last restart."""


class BatchingReplica:
    """One fake replica serving on ``127.0.0.1:spec.port`` once :meth:`start` ed."""

    def __init__(self, spec: ReplicaSpec) -> None:
        self.spec = spec
        self.stats = ReplicaStats()
        self.overloaded = False
        self._schedule = BatchSchedule[_Generation](spec.costs)
        self._wake = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._engine: asyncio.Task[None] | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.spec.port,
                                                  limit=HEADER_LIMIT, backlog=256)
        self._engine = asyncio.create_task(self._run())

    async def kill(self) -> int:
        """Close the port and cut every connection; return how many generation requests were in
        flight (queued or in the batch), which their clients lose."""
        lost = self.in_flight()
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._engine is not None:
            self._engine.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._engine
            self._engine = None
        for generation in self._schedule.waiting + self._schedule.batch:
            if not generation.finished.done():
                generation.finished.set_result(None)
        self._schedule = BatchSchedule[_Generation](self.spec.costs)
        for writer in list(self._connections):
            writer.transport.abort()
        # Let the cut connections' handlers see it and end.
        await asyncio.sleep(0)
        return lost

    async def restart(self) -> None:
        self.stats.first_request_after_restart = None
        await self.start()

    def in_flight(self) -> int:
        return self._schedule.in_flight()

    async def _run(self) -> None:
        """The batching loop: the schedule's next operation (a prefill of what joins, or a decode
        step), run for its modelled seconds, then its tokens; until nothing is left.

        The device keeps its own clock: each operation ends its modelled duration after the last
        one ended, not after the event loop got round to the last one's tokens. An event loop
        wakes late from every sleep (a fraction of a millisecond, more on a busy machine), and
        with steps of a few milliseconds those delays, added up, would make the replica slower
        than modelled and the benchmark's load higher than it says. Late tokens come out late
        and the next ones catch up, as a device's would behind a busy host."""
        loop = asyncio.get_running_loop()
        device = loop.time()
        while True:
            operation = self._schedule.next()
            if operation is None:
                self._wake.clear()
                await self._wake.wait()
                device = loop.time()
                continue
            if operation.kind == "prefill":
                # A request is not prefilled before it arrived, however late the loop runs.
                device = max(device, *(g.arrived for g in operation.requests))
            device += operation.seconds
            await _pause(device - loop.time())
            self._emit(operation)

    def _emit(self, operation: Operation[_Generation]) -> None:
        """``operation`` ended: the requests whose client has gone leave the replica, and each of the
        others that ``operation`` served gets one token; the finished leave the batch."""
        schedule = self._schedule
        for generation in schedule.waiting + schedule.batch:
            if generation.writer.is_closing():
                schedule.drop(generation)
                generation.finished.set_result(None)
        finished = set(schedule.done(operation))
        for generation in operation.requests:
            if generation.finished.done():
                continue  # abandoned
            generation.produced += 1
            last = generation in finished
            if generation.stream:
                _write_chunk(generation.writer, _event(generation.produced, last))
            if last:
                generation.finished.set_result(None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path, headers = _parse_head(head)
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                if method == "GET" and path == "/health":
                    self.stats.health_checks += 1
                    _respond(writer, 200, b"", "text/plain", self.spec.name)
                elif method == "POST" and path in ("/generate", "/generate_stream"):
                    await self._generate(writer, body, stream=path == "/generate_stream")
                else:
                    _respond(writer, 404, json.dumps({"error": f"no route {path}"}).encode(),
                             "application/json", self.spec.name)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass
        finally:
            self._connections.discard(writer)
            writer.transport.abort()

    async def _generate(self, writer: asyncio.StreamWriter, body: bytes, *, stream: bool) -> None:
        request = json.loads(body or b"{}")
        parameters = request.get("parameters") or {}
        output_tokens = max(1, int(parameters.get("max_new_tokens") or 1))
        input_tokens = max(1, len(str(request.get("inputs", "")).split()))
        if self.overloaded or self.in_flight() >= self.spec.max_concurrent_requests:
            self.stats.overloaded += 1
            if stream:
                _start_stream(writer, self.spec.name)
                _write_chunk(writer, b"data:" + json.dumps(OVERLOADED).encode() + b"\n\n")
                _write_chunk(writer, b"")
            else:
                _respond(writer, 429, json.dumps(OVERLOADED).encode(), "application/json", self.spec.name)
            return
        now = time.monotonic()
        self.stats.requests += 1
        if self.stats.first_request_after_restart is None:
            self.stats.first_request_after_restart = now
        if stream:
            _start_stream(writer, self.spec.name)
        loop = asyncio.get_running_loop()
        generation = _Generation(input_tokens, output_tokens, writer, stream, loop.create_future(), loop.time())
        self._schedule.add(generation)
        self._wake.set()
        await generation.finished
        if writer.is_closing() or generation.produced < output_tokens:
            raise ConnectionError("cut")
        if stream:
            _write_chunk(writer, b"")
        else:
            text = " ".join(["tok"] * output_tokens)
            _respond(writer, 200, json.dumps({"generated_text": text}).encode(), "application/json",
                     self.spec.name)


async def _pause(seconds: float) -> None:
    """Until the device's operation ends; at once when the event loop is already past its end."""
    await asyncio.sleep(max(0.0, seconds))


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, path, headers


def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, replica: str) -> None:
    reason = {200: "OK", 404: "Not Found", 429: "Too Many Requests"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                 f"X-Replica: {replica}\r\n\r\n".encode() + body)


def _start_stream(writer: asyncio.StreamWriter, replica: str) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"X-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\nX-Replica: " + replica.encode() + b"\r\n\r\n")


def _write_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():
        writer.write(b"%x\r\n%b\r\n" % (len(data), data))


def _event(index: int, last: bool) -> bytes:
    """The ``StreamResponse`` of token ``index`` (from 1), as one SSE event."""
    token = {"id": index, "text": " tok", "logprob": 0.0, "special": False}
    payload = {"index": index, "token": token, "generated_text": "tok" * index if last else None,
               "details": None, "top_tokens": None}
    return b"data:" + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class ReplicaHost:
    """Fake replicas in a child process, so that their timing does not share an event loop with
    the load client; driven by one command per line (see :func:`_obey`)."""

    def __init__(self, specs: list[ReplicaSpec]) -> None:
        self.specs = specs
        self._process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self._process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.batching_replica", json.dumps([s.to_json() for s in self.specs]),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert self._process.stdout is not None
        ready = await asyncio.wait_for(self._process.stdout.readline(), timeout=30)
        if ready.strip() != b"ready":
            raise RuntimeError(f"the fake replicas did not start: {ready!r}")

    async def command(self, *words: str) -> Any:
        """Send one command, return its JSON answer."""
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        process.stdin.write((" ".join(words) + "\n").encode())
        await process.stdin.drain()
        return json.loads(await asyncio.wait_for(process.stdout.readline(), timeout=30))

    async def kill(self, name: str) -> int:
        """Kill replica ``name``; how many requests it had in flight."""
        answer: int = await self.command("kill", name)
        return answer

    async def restart(self, name: str) -> float:
        """Restart replica ``name``; when its port opened again."""
        answer: float = await self.command("restart", name)
        return answer

    async def overload(self, name: str, on: bool) -> None:
        await self.command("overload", name, "on" if on else "off")

    async def stats(self) -> dict[str, ReplicaStats]:
        answer: dict[str, dict[str, Any]] = await self.command("stats")
        return {name: ReplicaStats(**fields) for name, fields in answer.items()}

    async def stop(self) -> None:
        """Close the command pipe, which ends the process; kill it if it does not end in 10 s."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=10)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _obey(replicas: dict[str, BatchingReplica]) -> None:
    """Commands, one per line: ``kill NAME``, ``restart NAME``, ``overload NAME on|off``,
    ``stats``. Each is answered with one JSON line. Returns at the end of the input."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().split():
        verb, names = line[0], line[1:2]
        answer: Any = None
        if verb == "kill":
            answer = await replicas[names[0]].kill()
        elif verb == "restart":
            await replicas[names[0]].restart()
            answer = time.monotonic()
        elif verb == "overload":
            replicas[names[0]].overloaded = line[2] == "on"
        elif verb == "stats":
            answer = {name: asdict(replica.stats) for name, replica in replicas.items()}
        else:
            answer = {"error": f"unknown command {verb!r}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


async def _main(specs: list[ReplicaSpec]) -> None:
    replicas = {spec.name: BatchingReplica(spec) for spec in specs}
    for replica in replicas.values():
        await replica.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    await _obey(replicas)
    for replica in replicas.values():
        await replica.kill()


if __name__ == "__main__":
    asyncio.run(_main([ReplicaSpec.from_json(fields) for fields in json.loads(sys.argv[1])]))
