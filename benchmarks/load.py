"""The load client: streamed TGI generations over plain HTTP/1.1 on loopback (asyncio, standard
library), each measured from the moment its connection is opened.

A request is a :class:`Call`: when it starts (seconds after the run starts), its prompt and output
lengths. Runs are bounded in count (the calls given) and in time (``deadline``: whatever has not
finished by then is cut and counted as failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

PROMPT_WORD = "hi"
"""A prompt of n tokens is n of these, space-separated: the fake counts words as tokens, and the
body is about as long as a real prompt of that many tokens (3 bytes a token)."""


@dataclass(frozen=True)
class Call:
    """One request of a workload.

    :param start: seconds after the run starts.
    :param input_tokens: the prompt's length.
    :param output_tokens: tokens to generate (``max_new_tokens``).
    :param kind: the workload's name for its class of request (``chat``, ``long``...).
    """

    start: float
    input_tokens: int
    output_tokens: int
    kind: str = "chat"


@dataclass
class Outcome:
    """What the client saw of one call. Times are seconds from opening the connection."""

    call: Call
    sent: float = 0.0
    """When the connection was opened (``time.monotonic()``)."""
    status: int | None = None
    tokens: int = 0
    ttft: float | None = None
    end: float | None = None
    itls: list[float] = field(default_factory=list)
    error: str | None = None
    """Why it failed: ``None`` when every asked-for token arrived."""
    first_event: dict[str, object] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def body(call: Call) -> bytes:
    return json.dumps({"inputs": " ".join([PROMPT_WORD] * call.input_tokens),
                       "parameters": {"max_new_tokens": call.output_tokens}}).encode()


async def stream(port: int, call: Call, timeout: float, path: str = "/generate_stream") -> Outcome:
    """Send ``call`` to ``127.0.0.1:port`` and read its stream to the end, or for ``timeout`` s."""
    outcome = Outcome(call, sent=time.monotonic())
    try:
        await asyncio.wait_for(_exchange(port, path, call, outcome), timeout)
    except TimeoutError:
        outcome.error = "timeout"
    except (OSError, asyncio.IncompleteReadError, ValueError) as err:
        outcome.error = f"{type(err).__name__}: {err}"
    if outcome.error is None and outcome.tokens < call.output_tokens:
        outcome.error = f"{outcome.tokens} of {call.output_tokens} tokens"
    return outcome


async def _exchange(port: int, path: str, call: Call, outcome: Outcome) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        payload = body(call)
        writer.write(f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        outcome.status = int(head.split(" ", 2)[1])
        if "transfer-encoding: chunked" not in head:
            length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0]) if "content-length:" in head else 0
            data = await reader.readexactly(length)
            outcome.first_event = json.loads(data) if data.startswith(b"{") else {"body": data.decode()}
            outcome.error = f"status {outcome.status}"
            outcome.end = time.monotonic() - outcome.sent
            return
        last = 0.0
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return
            now = time.monotonic() - outcome.sent
            for event in chunk[:-2].split(b"\n\n"):
                if not event.startswith(b"data:"):
                    continue
                if outcome.tokens == 0 and outcome.first_event is None:
                    outcome.first_event = json.loads(event[5:])
                if b'"error"' in event:
                    outcome.error = "error event"
                    outcome.end = now
                    return
                outcome.tokens += 1
                if outcome.ttft is None:
                    outcome.ttft = now
                else:
                    outcome.itls.append(now - last)
                last = now
                outcome.end = now
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def open_loop(port: int, calls: Sequence[Call], deadline: float, path: str = "/generate_stream") -> list[Outcome]:
    """Each call at its start time, whatever the answers to the others (arrivals as users make
    them); everything is cut ``deadline`` seconds after the start."""
    begin = time.monotonic()

    async def one(call: Call) -> Outcome:
        await asyncio.sleep(max(0.0, begin + call.start - time.monotonic()))
        return await stream(port, call, max(0.1, begin + deadline - time.monotonic()), path)

    return list(await asyncio.gather(*(one(call) for call in calls)))


async def closed_loop(port: int, streams: int, calls: Iterable[Call], deadline: float,
                      stagger: float = 0.0) -> list[Outcome]:
    """``streams`` clients, each sending its next call as soon as the previous one ended, until
    ``calls`` run out or ``deadline`` seconds pass. Client k starts ``k * stagger / streams``
    seconds late, so that the first requests do not all arrive at once."""
    pending = iter(calls)
    outcomes: list[Outcome] = []
    stop = time.monotonic() + deadline

    async def client(k: int) -> None:
        await asyncio.sleep(k * stagger / streams)
        for call in pending:
            left = stop - time.monotonic()
            if left <= 0:
                return
            outcomes.append(await stream(port, call, left))

    await asyncio.gather(*(client(k) for k in range(streams)))
    return outcomes


async def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """A GET to ``127.0.0.1:port`` (the router's stats, a replica's health): status and body."""
    async def exchange() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if b"transfer-encoding: chunked" in head.lower():
            rest = _dechunk(rest)
        return status, rest

    return await asyncio.wait_for(exchange(), timeout)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2:]
    return bytes(out)
