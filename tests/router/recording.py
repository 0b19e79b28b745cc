"""A recording replica for the attacks on the router: a loopback TCP relay on a replica's port, in
front of the engine's fake (fake_tgi.py, fake_vllm.py), that records every byte the router sends on
each connection before passing it on, and passes the fake's answers back unchanged.

It imitates no upstream behaviour itself: the fake behind it answers. What it adds is the exact
bytes, framed into requests by rawhttp.py's strict HTTP/1.1 framer, so a test can say what reached
a replica, as how many requests, without trusting the fake's own lenient parser (a smuggled request
is a second request in the byte stream whether or not the fake would have answered it).
"""

from __future__ import annotations

import contextlib
import functools
import socket
import threading

from rawhttp import Malformed, Message, split_messages


class RecordingRelay:
    """Listens on ``127.0.0.1:port`` and relays each connection to ``127.0.0.1:target_port``.

    :param port: the replica's port, where the router connects.
    :param target_port: the fake replica's port.
    :param health_path: the route of the router's health checks, whose requests
        :meth:`forwarded` leaves out.
    """

    def __init__(self, port: int, target_port: int, health_path: str = "/health") -> None:
        self.port = port
        self.target_port = target_port
        self.health_path = health_path
        self._lock = threading.Lock()
        self._received: list[bytearray] = []
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        self._listener = listener
        self._thread = threading.Thread(target=self._accept, args=(listener,), name=f"relay-{self.port}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listener and every relayed connection; safe to call more than once."""
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown wakes the accept() blocked in the relay's thread.
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def received(self) -> list[bytes]:
        """Every byte the router sent, one entry per connection, in the order they were opened."""
        with self._lock:
            return [bytes(b) for b in self._received]

    def forwarded(self) -> list[Message]:
        """The requests the router sent, health checks left out, framed strictly.

        Fails when a connection holds bytes that are not whole HTTP/1.1 requests: whatever reached
        the replica is then not what the router is meant to send.
        """
        requests: list[Message] = []
        for data in self.received():
            try:
                messages, rest = split_messages(data)
            except Malformed as error:
                raise AssertionError(f"the replica received bytes that are not HTTP/1.1 requests: {data!r}") from error
            assert not rest, f"the replica received an unfinished request: {rest!r} after {messages}"
            requests += [m for m in messages if not self._is_health_check(m)]
        return requests

    def _is_health_check(self, message: Message) -> bool:
        # The router's checks, as the config sends them: http-check send meth GET uri <health>
        # ver HTTP/1.1 hdr Host localhost.
        return message.start_line == f"GET {self.health_path} HTTP/1.1".encode() and message.header("host") == [
            "localhost"]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            record = bytearray()
            with self._lock:
                self._received.append(record)
                self._sockets.update((client, upstream))
            # Both directions ended: close both sockets.
            done = threading.Barrier(2, action=functools.partial(self._close, client, upstream))
            for source, sink, rec in ((client, upstream, record), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(source, sink, rec, done), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, record: bytearray | None,
              done: threading.Barrier) -> None:
        """Copy ``source`` to ``sink`` until end of file, recording it when ``record`` is given;
        then pass the end of file on."""
        try:
            while chunk := source.recv(65536):
                if record is not None:
                    with self._lock:
                        record += chunk
                sink.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with contextlib.suppress(threading.BrokenBarrierError):
            done.wait(timeout=3600)

    def _close(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(sockets)
        for sock in sockets:
            sock.close()
