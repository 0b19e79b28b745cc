"""HTTP/1.1 at the byte level, for the attacks on the router: a client that sends exactly the bytes
a test gives it (malformed, ambiguous or pipelined requests that ``http.client`` would refuse to
write), and a strict framer that splits a byte stream into the messages it holds, so that a test can
count the requests a replica received and read each one's line, headers and body.

The framing is RFC 9112's (section 6.3): a request has a body only by ``Transfer-Encoding:
chunked`` (last coding) or ``Content-Length``; a response's body ends by its ``Content-Length``, by
the last chunk, or when the connection closes; 1xx, 204 and 304 responses have none.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

TIMEOUT = 5.0


class Incomplete(Exception):
    """The bytes end inside a message: more are needed to frame it."""


class Malformed(Exception):
    """The bytes are not an HTTP/1.1 message."""


@dataclass(frozen=True)
class Message:
    """One framed HTTP/1.1 request or response."""

    start_line: bytes
    headers: tuple[tuple[str, str], ...]
    """Names in lower case, values as sent, in order."""
    body: bytes

    @property
    def status(self) -> int:
        """A response's status code."""
        return int(self.start_line.split(b" ", 2)[1])

    @property
    def method(self) -> str:
        return self.start_line.split(b" ", 1)[0].decode()

    @property
    def target(self) -> str:
        """A request's target, as the line holds it."""
        return self.start_line.split(b" ", 2)[1].decode(errors="replace")

    def header(self, name: str) -> list[str]:
        """Every value of the header ``name`` (case-insensitive), in order."""
        return [v for k, v in self.headers if k == name.lower()]


def split_messages(data: bytes, responses: bool = False, eof: bool = True) -> tuple[list[Message], bytes]:
    """The complete messages at the start of ``data``, and the bytes after them.

    With ``eof`` (the connection was closed after ``data``) a response without a length ends with
    the data; otherwise an unfinished message is left in the remainder. Raises :class:`Malformed`
    for bytes that cannot be framed.
    """
    messages: list[Message] = []
    rest = data
    while rest:
        try:
            message, rest = _one(rest, responses, eof)
        except Incomplete:
            break
        messages.append(message)
    return messages, rest


def _one(data: bytes, responses: bool, eof: bool) -> tuple[Message, bytes]:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        raise Incomplete
    start_line, *lines = data[:end].split(b"\r\n")
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise Malformed(f"bad header line {line!r} in {data[:end]!r}")
        headers.append((name.decode().lower(), value.strip().decode(errors="replace")))
    rest = data[end + 4:]
    codings = [c.strip().lower() for k, v in headers if k == "transfer-encoding" for c in v.split(",")]
    lengths = {v for k, v in headers if k == "content-length"}
    try:
        status = int(start_line.split(b" ", 2)[1]) if responses else 0
    except (IndexError, ValueError) as error:
        raise Malformed(f"bad status line {start_line!r}") from error
    if responses and (100 <= status < 200 or status in (204, 304)):
        body = b""
    elif codings:
        if codings[-1] != "chunked":
            raise Malformed(f"transfer codings {codings} do not end with chunked")
        body, rest = _dechunk(rest)
    elif lengths:
        if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
            raise Malformed(f"content lengths {sorted(lengths)}")
        length = int(next(iter(lengths)))
        if len(rest) < length:
            raise Incomplete
        body, rest = rest[:length], rest[length:]
    elif responses:
        if not eof:
            raise Incomplete
        body, rest = rest, b""
    else:
        body = b""
    return Message(start_line, tuple(headers), body), rest


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    """A chunked body at the start of ``data`` (RFC 9112 section 7.1), and the bytes after it."""
    body = b""
    while True:
        end = data.find(b"\r\n")
        if end < 0:
            raise Incomplete
        size_text = data[:end].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError as error:
            raise Malformed(f"bad chunk size {data[:end]!r}") from error
        data = data[end + 2:]
        if size == 0:
            break
        if len(data) < size + 2:
            raise Incomplete
        if data[size:size + 2] != b"\r\n":
            raise Malformed(f"chunk of {size} bytes not followed by CRLF: {data[:size + 2]!r}")
        body, data = body + data[:size], data[size + 2:]
    # The trailer section: field lines, then an empty line.
    while True:
        end = data.find(b"\r\n")
        if end < 0:
            raise Incomplete
        line, data = data[:end], data[end + 2:]
        if not line:
            return body, data


@dataclass
class Exchange:
    """What came back on one raw connection."""

    responses: list[Message]
    closed: bool
    """The router closed the connection (end of file) before the read ended."""
    leftover: bytes
    """Bytes after the last complete response: an unfinished one, or something not HTTP/1.1."""

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.responses]


class RawConnection:
    """One TCP connection to ``127.0.0.1:port`` that sends the bytes it is given as they are."""

    def __init__(self, port: int, timeout: float = TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self._pending = b""
        self._framed: list[Message] = []
        self._closed = False

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, count: int = 1, timeout: float = TIMEOUT) -> Exchange:
        """Read until ``count`` complete responses arrived, the router closed the connection, or
        ``timeout`` seconds passed; responses beyond ``count`` already received are kept for the
        next read."""
        deadline = time.monotonic() + timeout
        while True:
            found, self._pending = split_messages(self._pending, responses=True, eof=self._closed)
            self._framed += found
            if len(self._framed) >= count or self._closed:
                break
            remaining = deadline - time.monotonic()
            chunk = self._recv(remaining) if remaining > 0 else None
            if chunk is None:
                break
            self._pending += chunk
        responses, self._framed = self._framed[:count], self._framed[count:]
        return Exchange(responses, self._closed and not self._framed, self._pending)

    def receive(self, timeout: float = TIMEOUT) -> bytes:
        """Every byte that arrives until the router closes or ``timeout`` seconds pass, unframed:
        for answers that are not HTTP/1.1."""
        deadline = time.monotonic() + timeout
        data, self._pending = self._pending, b""
        while not self._closed and (remaining := deadline - time.monotonic()) > 0:
            chunk = self._recv(remaining)
            if chunk is None:
                break
            data += chunk
        return data

    def is_closed_by_peer(self, timeout: float = 1.0) -> bool:
        """Whether the router closes the connection within ``timeout`` seconds (bytes it sends
        meanwhile are kept for the next read)."""
        if not self._closed:
            self._pending += self._recv(timeout) or b""
        return self._closed

    def _recv(self, timeout: float) -> bytes | None:
        """What arrives within ``timeout`` seconds: ``None`` if nothing did, ``b""`` (and the
        connection marked closed) once the router closed or reset it."""
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            return None
        except ConnectionResetError:
            chunk = b""
        self._closed = self._closed or not chunk
        return chunk

    def close(self) -> None:
        self.sock.close()


def exchange(port: int, data: bytes, count: int = 1, timeout: float = TIMEOUT) -> Exchange:
    """Send ``data`` on a new connection and read up to ``count`` responses."""
    with RawConnection(port, timeout) as conn:
        conn.send(data)
        return conn.read(count, timeout)


def request(method: str, target: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"",
            length: bool = True, version: str = "HTTP/1.1") -> bytes:
    """The bytes of one request: ``Host: router`` first unless ``headers`` has one, then
    ``headers`` as given, then ``Content-Length`` of ``body`` when ``length`` and the body is not
    empty. Anything stranger is written out by the test itself."""
    headers = list(headers or [])
    if not any(k.lower() == "host" for k, _ in headers):
        headers.insert(0, ("Host", "router"))
    if length and body:
        headers.append(("Content-Length", str(len(body))))
    head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode() + body


# --- HTTP/2 with prior knowledge (RFC 9113 section 3.3), just enough for one request ----------------------

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_SETTINGS, _H2_HEADERS = 0x4, 0x1
_END_STREAM, _END_HEADERS = 0x1, 0x4


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_literal(name: str, value: str) -> bytes:
    """A literal field without indexing and with a literal name, neither Huffman-coded
    (RFC 7541 section 6.2.2); names and values under 127 bytes."""
    raw_name, raw_value = name.encode(), value.encode()
    assert len(raw_name) < 127 and len(raw_value) < 127
    return b"\x00" + bytes([len(raw_name)]) + raw_name + bytes([len(raw_value)]) + raw_value


def h2_request(method: str, path: str, headers: list[tuple[str, str]] | None = None) -> bytes:
    """The bytes of one HTTP/2 request without a body, with prior knowledge (RFC 9113 section
    3.3: the preface, an empty SETTINGS frame, then the request's HEADERS on stream 1)."""
    block = b"".join(_hpack_literal(k, v) for k, v in [
        (":method", method), (":scheme", "http"), (":authority", "router"), (":path", path), *(headers or [])])
    return (H2_PREFACE + _h2_frame(_H2_SETTINGS, 0, 0, b"")
            + _h2_frame(_H2_HEADERS, _END_STREAM | _END_HEADERS, 1, block))


def siege(port: int, data: bytes, count: int, concurrency: int, slow: int) -> dict[str, object]:
    """Open ``slow`` connections that trickle a request's headers (a line each every half second,
    never the end), then send ``data`` ``count`` times, each on a new connection, ``concurrency``
    at once. Returns how many answers had each status (``statuses``; 0: none, the connection
    closed or timed out first) and how many slow connections the router still held open at the end
    (``slow_open``). Meant to run in a process of its own (``python -c``), so that its threads do
    not slow down a client measuring the router from the test's process."""
    trickling = [RawConnection(port) for _ in range(slow)]
    for conn in trickling:
        conn.send(b"POST /metrics HTTP/1.1\r\n")
    stop = threading.Event()

    def trickle() -> None:
        line = 0
        while not stop.wait(0.5):
            line += 1
            for conn in trickling:
                # The router may cut a slow connection: the others keep trickling.
                with contextlib.suppress(OSError):
                    conn.send(f"X-Slow-{line}: {'a' * 10}\r\n".encode())

    def one(_: int) -> int:
        try:
            answer = exchange(port, data)
        except OSError:
            return 0
        return answer.statuses[0] if answer.statuses else 0

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            statuses = Counter(pool.map(one, range(count)))
    finally:
        stop.set()
        thread.join(timeout=5)
    slow_open = sum(not conn.is_closed_by_peer(timeout=0.01) for conn in trickling)
    for conn in trickling:
        conn.close()
    return {"statuses": dict(statuses), "slow_open": slow_open}


if __name__ == "__main__":
    # python rawhttp.py PORT REQUEST_HEX COUNT CONCURRENCY SLOW: siege's result as JSON.
    port_arg, data_arg, count_arg, concurrency_arg, slow_arg = sys.argv[1:]
    print(json.dumps(siege(int(port_arg), bytes.fromhex(data_arg), int(count_arg), int(concurrency_arg),
                           int(slow_arg))))
