#!/usr/bin/env python3
"""A fake Docker Engine on a unix socket, so that tests run the *real* docker CLI on a simulated host.

No engine runs on test machines, and none may: this module answers the Engine API requests the docker CLI
makes for ``docker pull``, ``docker image inspect``, ``docker run`` (attached, in the foreground), ``docker rm
-f`` and ``docker stop``, records every request as one JSON line, and "plays" what runs inside a container
with a *behaviour*: a
Python callable that sees the create body and the bind mounts, may read and write files through the mounts,
and returns the container's exit code and output. Any other request is answered 501 in the engine's error
shape (``{"message": ...}``), which the CLI prints as ``Error response from daemon: ...``, so that an
unexpected call fails loudly. Python standard library only.

What it imitates, and where that is written down:

- Docker Engine API v1.50, as served by docker 28.2 (moby/moby tag v28.2.2: ``api/common.go`` has
  ``DefaultVersion = "1.50"`` and ``MinSupportedAPIVersion = "1.24"``; the endpoints are in
  ``api/swagger.yaml`` and their handlers in ``api/server/router/{system,container,image}/*_routes.go``).
- The client side it was checked against: docker/cli tag v28.2.2 (``cli/command/container/run.go``,
  ``create.go``, ``rm.go``), and Debian bookworm's docker.io 20.10.24 CLI, which negotiates API 1.41.

Two ways to run it:

- in-process (threads): ``with FakeDockerd(behaviour=my_callable) as engine: subprocess.run(["docker", ...],
  env={**os.environ, **engine.env})``; a behaviour may then be any callable, a closure included;
- as a process, for hosts that outlive a test's thread or for a behaviour named by ``module:function``:
  ``python tests/harness/dockerd.py --socket PATH --record FILE --behaviour tests/x.py:func`` or
  :class:`DockerdProcess`, which starts that and waits until the socket answers.

Either way the CLI finds it through ``DOCKER_HOST=unix://...`` (see ``.env``); the server is threaded, so
concurrent CLI processes and slow behaviours do not block one another.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import queue
import re
import select
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

API_VERSION = "1.50"
"""The API version it announces (``Api-Version`` header of every response), as docker 28.2 does."""

MIN_API_VERSION = "1.24"
"""The oldest version a request may name in its ``/v1.xx`` prefix (moby v28.2.2 ``api/common.go``)."""

ENGINE_VERSION = "28.2.2"
"""The engine release it poses as (``Server`` header, ``GET /version``)."""

STOP_EXIT_CODE = 143
"""Exit code of a container that ``docker stop`` ended: 128 + SIGTERM, as for a process that dies of it."""

KILL_EXIT_CODE = 137
"""Exit code of a container that ``docker rm -f`` ended: 128 + SIGKILL."""

_TERMINATING_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGKILL, signal.SIGQUIT, signal.SIGHUP}
"""Signals (from ``POST /containers/{id}/kill``) that end a container; others are delivered and ignored."""

_NAME_PATTERN = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
"""Valid container names (moby v28.2.2 ``daemon/names/names.go`` RestrictedNamePattern)."""

_VERSIONED_PATH = re.compile(r"^/v(\d+\.\d+)(/.*)$")

_FRAME = struct.Struct(">BxxxL")
"""The stdcopy frame header of a non-TTY attach stream: stream (1 stdout, 2 stderr), 3 zero bytes, size
(big-endian uint32) - moby ``api/swagger.yaml`` v1.50, ``/containers/{id}/attach``, "Stream format"."""

_MAX_FRAME = 32 * 1024


# --------------------------------------------------------------------------------------------------
# Behaviours: what runs inside a container


class Bind(NamedTuple):
    """One bind mount of a container: a host directory or file seen at ``container`` inside it."""

    host: str
    container: str
    read_only: bool


BehaviourResult = tuple[int, bytes | str] | tuple[int, bytes | str, bytes | str]
"""``(exit_code, stdout)`` or ``(exit_code, stdout, stderr)``."""

Behaviour = Callable[[dict[str, Any], list[Bind]], BehaviourResult]
"""What runs inside a container: called with a copy of the ``POST /containers/create`` body (its ``Env``
is the list the engine sees: the CLI has already read ``--env-file``) and the container's bind mounts, on
its own thread when the container starts; returns the exit code and output. An exception makes the
container exit 1 with the traceback on stderr. :func:`emit` writes output before the end, :func:`sleep`
waits in a way ``docker stop`` interrupts."""


def default_behaviour(create_body: dict[str, Any], binds: list[Bind]) -> BehaviourResult:
    """Print nothing, exit 0."""
    return 0, b""


def command(create_body: Mapping[str, Any]) -> list[str]:
    """The container's command line as the create body gives it: ``Entrypoint`` then ``Cmd`` (an image's
    own defaults are unknown to the fake engine)."""
    return [*(create_body.get("Entrypoint") or []), *(create_body.get("Cmd") or [])]


def environment(create_body: Mapping[str, Any]) -> dict[str, str]:
    """The container's ``Env`` list as a dict."""
    return dict(item.partition("=")[::2] for item in create_body.get("Env") or [])


def binds_of(host_config: Mapping[str, Any] | None) -> list[Bind]:
    """The bind mounts of a ``HostConfig``: its ``Binds`` (``host:container[:options]``, what ``-v`` gives)
    and its ``Mounts`` of type ``bind`` (what ``--mount`` gives). Named volumes are left out."""
    binds: list[Bind] = []
    for spec in (host_config or {}).get("Binds") or []:
        host, _, rest = spec.partition(":")
        target, _, options = rest.partition(":")
        if host.startswith("/"):
            binds.append(Bind(host, target, "ro" in options.split(",")))
    for mount in (host_config or {}).get("Mounts") or []:
        if mount.get("Type") == "bind":
            binds.append(Bind(mount["Source"], mount["Target"], bool(mount.get("ReadOnly"))))
    return binds


def host_path(binds: Iterable[Bind], container_path: str, *, write: bool = False) -> Path:
    """Where ``container_path`` (absolute, inside the container) lives on the host, through the deepest
    bind mount that holds it. Raises ``FileNotFoundError`` when no bind holds it (the file would be in the
    container's own, throwaway layer) and ``PermissionError`` for ``write`` through a read-only bind."""
    best: Bind | None = None
    for bind in binds:
        mount = bind.container.rstrip("/") or "/"
        inside = container_path == mount or container_path.startswith(mount.rstrip("/") + "/")
        if inside and (best is None or len(mount) > len(best.container.rstrip("/"))):
            best = bind
    if best is None:
        raise FileNotFoundError(f"{container_path} is not under any bind mount")
    if write and best.read_only:
        raise PermissionError(f"{container_path} is on a read-only bind mount ({best.container})")
    rest = container_path[len(best.container.rstrip("/")):].lstrip("/")
    return Path(best.host) / rest if rest else Path(best.host)


_THREAD_ATTRIBUTE = "fake_dockerd_container"
"""The attribute of a behaviour's thread naming its container: an attribute of the thread, not a module
global, so that the helpers work even when this file is loaded twice (as ``__main__`` and as a module)."""


def _current_container() -> _Container | None:
    return getattr(threading.current_thread(), _THREAD_ATTRIBUTE, None)


def emit(data: bytes | str, *, stderr: bool = False) -> None:
    """From inside a behaviour: write ``data`` to the container's stdout (or stderr) now, as a process
    that prints before it ends. Outside a container thread it does nothing."""
    container = _current_container()
    if container is not None and container.engine is not None:
        container.engine.output(container, 2 if stderr else 1, _as_bytes(data))


def sleep(seconds: float) -> bool:
    """From inside a behaviour: sleep, but wake when the container is stopped or killed. True if it slept
    the whole time, False if interrupted (the behaviour's result is then ignored)."""
    container = _current_container()
    if container is None:
        time.sleep(seconds)
        return True
    return not container.ended.wait(seconds)


def container_name() -> str | None:
    """From inside a behaviour: the name of its container (``docker run --name``)."""
    container = _current_container()
    return None if container is None else container.name


def stopped() -> bool:
    """From inside a behaviour: whether ``docker stop``/``kill``/``rm -f`` has ended this container."""
    container = _current_container()
    return container is not None and container.ended.is_set()


def load_behaviour(spec: str) -> Behaviour:
    """The callable named by ``module.path:function`` or ``path/to/file.py:function``."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"behaviour {spec!r} is not module:function")
    if target.endswith(".py") or "/" in target:
        path = Path(target).resolve()
        module_spec = importlib.util.spec_from_file_location(f"_dockerd_behaviour_{path.stem}", path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    behaviour = getattr(module, name)
    if not callable(behaviour):
        raise TypeError(f"{spec} is not callable")
    return behaviour  # type: ignore[no-any-return]


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


# --------------------------------------------------------------------------------------------------
# Images


def normalize_image(ref: str) -> str:
    """A reference in full, as the engine stores it: ``alpine`` -> ``docker.io/library/alpine:latest``,
    ``ghcr.io/org/x:1`` unchanged (the distribution/reference rules: the first component is a registry if it
    has a ``.`` or ``:`` or is ``localhost``). A reference with a tag and a digest is the digest's:
    ``ghcr.io/org/x:1@sha256:...`` -> ``ghcr.io/org/x@sha256:...`` (moby v28.2.2 ``reference/store.go``,
    ``Get``: "If reference contains both tag and digest, only lookup by digest")."""
    name, at, digest = ref.partition("@")
    if at:
        head, slash, last = name.rpartition("/")
        name = head + slash + last.partition(":")[0]
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = "docker.io", name
    if domain == "index.docker.io":
        domain = "docker.io"
    if domain == "docker.io" and "/" not in path:
        path = "library/" + path
    if at:
        return f"{domain}/{path}@{digest}"
    if ":" not in path.rsplit("/", 1)[-1]:
        path += ":latest"
    return f"{domain}/{path}"


def familiar_image(ref: str) -> str:
    """A full reference as the engine prints it: ``docker.io/library/alpine:latest`` -> ``alpine:latest``."""
    full = normalize_image(ref)
    for prefix in ("docker.io/library/", "docker.io/"):
        if full.startswith(prefix):
            return full[len(prefix):]
    return full


# --------------------------------------------------------------------------------------------------
# Records


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record so far, in the order written (a request's when its answer's status line goes out, so a
    ``wait`` is recorded before the exit it waits for).

    A request: ``kind`` ``"request"``, ``time``, ``method``, ``path`` (without the ``/v1.xx`` prefix),
    ``api_version`` (``"1.50"``; None for an unversioned path such as the CLI's first ``HEAD /_ping``),
    ``query`` (a value per key, a list for a repeated key), ``body`` (parsed JSON, or None), ``status``,
    ``user_agent`` (``Docker-Client/28.2.2 (linux)``); and ``container`` (see :func:`containers`) for a
    create answered 201, ``image`` (normalized) for a pull, ``container_name`` for the container endpoints.
    An exit: ``kind`` ``"exit"``, ``time``, ``name``, ``id``, ``exit_code``, ``reason``."""
    file = Path(path)
    if not file.exists():
        return []
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]


def requests(path: str | os.PathLike[str], method: str | None = None,
             prefix: str | None = None) -> list[dict[str, Any]]:
    """The request records, of ``method`` and with a path starting with ``prefix`` when given."""
    return [r for r in read_records(path) if r["kind"] == "request"
            and (method is None or r["method"] == method) and (prefix is None or r["path"].startswith(prefix))]


def containers(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The containers created (``POST /containers/create`` answered 201), in order: ``name``, ``id``,
    ``Image``, ``Entrypoint``, ``Cmd``, ``Env``, ``ExposedPorts``, ``HostConfig`` (``Devices``,
    ``PortBindings``, ``Binds``, ``Mounts``, ``LogConfig``, ``Privileged``, ``AutoRemove``, ``CapAdd``
    always; any other field only when set), ``binds`` (as :func:`binds_of`) and ``body`` (all of it)."""
    return [r["container"] for r in read_records(path) if r["kind"] == "request" and "container" in r]


def pulls(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``POST /images/create`` records: ``image`` (normalized) and ``status`` (500 for a failure)."""
    return [{"image": r["image"], "status": r["status"]} for r in requests(path, "POST", "/images/create")]


def exits(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The container exits: ``name``, ``id``, ``exit_code`` and ``reason`` (``exited``, ``stopped``,
    ``killed``, ``failed`` for a behaviour that raised)."""
    return [r for r in read_records(path) if r["kind"] == "exit"]


_HOST_CONFIG_KEYS = ("Devices", "PortBindings", "Binds", "Mounts", "LogConfig", "Privileged", "AutoRemove", "CapAdd")


def _container_record(name: str, cid: str, body: dict[str, Any]) -> dict[str, Any]:
    host_config = body.get("HostConfig") or {}
    summary = {k: host_config.get(k) for k in _HOST_CONFIG_KEYS}
    summary.update({k: v for k, v in host_config.items() if k not in summary and v not in (None, "", 0, False, [], {})})
    return {"name": name, "id": cid, "Image": body.get("Image"), "Entrypoint": body.get("Entrypoint"),
            "Cmd": body.get("Cmd"), "Env": body.get("Env") or [], "ExposedPorts": body.get("ExposedPorts"),
            "HostConfig": summary, "binds": [list(b) for b in binds_of(host_config)], "body": body}


class _Recorder:
    """Appends records to a JSON-lines file (locked, so that several engines may share one) and keeps them."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=False) + "\n"
        with self._lock:
            self.records.append(record)
            if self.path is not None:
                with open(self.path, "a", encoding="utf-8") as f:
                    fcntl.flock(f, fcntl.LOCK_EX)
                    f.write(line)


# --------------------------------------------------------------------------------------------------
# The engine's state


class EngineError(Exception):
    """An error the engine answers with ``status`` and ``{"message": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class _Container:
    id: str
    name: str
    body: dict[str, Any]
    binds: list[Bind]
    auto_remove: bool
    engine: _Engine | None = None
    state: str = "created"  # created, running, exited, removed
    exit_code: int = 0
    exits: int = 0
    ended: threading.Event = field(default_factory=threading.Event)
    attachments: list[queue.Queue[tuple[int, bytes] | None]] = field(default_factory=list)


class _Engine:
    """Images, containers and the knobs; every change under one condition variable."""

    def __init__(self, recorder: _Recorder, behaviour: Behaviour, images: Iterable[str] | None,
                 pull_failures: int, pull_error: str, device_root: str | None) -> None:
        self.recorder = recorder
        self.behaviour = behaviour
        self.images: set[str] | None = None if images is None else {normalize_image(i) for i in images}
        self.pull_failures = pull_failures
        self.pull_error = pull_error
        self.device_root = device_root
        self.cond = threading.Condition()
        self.containers: dict[str, _Container] = {}
        self.closing = False
        self._names = itertools.count(1)

    # -- lookups

    def find(self, ref: str) -> _Container:
        """By name (with or without its ``/``), full id, or unique id prefix, as the engine resolves them."""
        name = ref.removeprefix("/")
        for c in self.containers.values():
            if c.name == name or c.id == ref:
                return c
        matches = [c for c in self.containers.values() if c.id.startswith(ref)] if ref else []
        if len(matches) == 1:
            return matches[0]
        raise EngineError(404, f"No such container: {ref}")

    # -- images

    def pull(self, image: str) -> str | None:
        """Take one pull: the error message if this one is to fail, else None (the image is then present)."""
        with self.cond:
            if self.pull_failures > 0:
                self.pull_failures -= 1
                domain = normalize_image(image).split("/", 1)[0]
                registry = "registry-1.docker.io" if domain == "docker.io" else domain
                return self.pull_error.format(registry=registry, image=familiar_image(image))
            if self.images is not None:
                self.images.add(normalize_image(image))
            return None

    def has_image(self, image: str) -> bool:
        with self.cond:
            return self.images is None or image.startswith("sha256:") or normalize_image(image) in self.images

    # -- containers

    def create(self, name: str | None, body: dict[str, Any]) -> _Container:
        image = body.get("Image") or ""
        if not image:
            raise EngineError(400, "No image was specified")  # the CLI always names one
        with self.cond:
            if name:
                if not _NAME_PATTERN.match(name):
                    raise EngineError(400, f"Invalid container name ({name}), only "
                                      "[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed")
                name = name.removeprefix("/")
                for c in self.containers.values():
                    if c.name == name:
                        raise EngineError(409, f'Conflict. The container name "/{name}" is already in use by container '
                                          f'"{c.id}". You have to remove (or rename) that container to be able to '
                                          "reuse that name.")
            else:
                name = f"fake_container_{next(self._names)}"
            if not self.has_image(image):
                raise EngineError(404, f"No such image: {familiar_image(image)}")
            cid = hashlib.sha256(f"{name}{time.monotonic_ns()}{os.urandom(8).hex()}".encode()).hexdigest()
            host_config = body.get("HostConfig") or {}
            container = _Container(cid, name, body, binds_of(host_config), bool(host_config.get("AutoRemove")),
                                   engine=self)
            self.containers[cid] = container
            return container

    def start(self, container: _Container, started: Callable[[bool], None]) -> None:
        """Start ``container``'s behaviour on its own thread, after calling ``started`` (with False, and
        nothing more, if it was running already)."""
        with self.cond:
            if container.state == "running":
                started(False)
                return
            if container.state != "created":
                raise EngineError(409, "fake dockerd: restarting an exited container is not implemented")
            for device in (container.body.get("HostConfig") or {}).get("Devices") or []:
                on_host = device.get("PathOnHost", "")
                if self.device_root is not None and not (Path(self.device_root) / on_host.lstrip("/")).exists():
                    # moby v28.2.2 oci/devices_linux.go; the container is not started, --rm removes it.
                    container.exit_code = 128
                    if container.auto_remove:
                        self._remove(container)
                    raise EngineError(500, f"error gathering device information while adding custom device "
                                      f"{json.dumps(on_host)}: no such file or directory")
            container.state = "running"
            self.cond.notify_all()
        started(True)
        thread = threading.Thread(target=self._play, args=(container,), daemon=True,
                                  name=f"container-{container.name}")
        thread.start()

    def _play(self, container: _Container) -> None:
        setattr(threading.current_thread(), _THREAD_ATTRIBUTE, container)
        reason = "exited"
        try:
            result = self.behaviour(copy.deepcopy(container.body), list(container.binds))
            code, out, err = (*result, b"") if len(result) == 2 else result
        except Exception:
            code, out, err, reason = 1, b"", traceback.format_exc(), "failed"
        self.end(container, int(code), reason, _as_bytes(out), _as_bytes(err))

    def output(self, container: _Container, stream: int, data: bytes) -> None:
        with self.cond:
            if container.state != "running" or not data:
                return
            for q in container.attachments:
                q.put((stream, data))

    def end(self, container: _Container, code: int, reason: str, out: bytes = b"", err: bytes = b"") -> bool:
        """The container's process ends with ``code``; False if it was not running."""
        with self.cond:
            if container.state != "running":
                return False
            for q in container.attachments:
                if out:
                    q.put((1, out))
                if err:
                    q.put((2, err))
                q.put(None)
            container.attachments.clear()
            container.state = "exited"
            container.exit_code = code
            container.exits += 1
            container.ended.set()
            self.recorder.write({"kind": "exit", "time": time.time(), "name": container.name, "id": container.id,
                                 "exit_code": code, "reason": reason})
            if container.auto_remove:
                self._remove(container)
            self.cond.notify_all()
            return True

    def remove(self, container: _Container, force: bool) -> None:
        with self.cond:
            if container.state == "running":
                if not force:
                    raise EngineError(409, f'cannot remove container "/{container.name}": container is running: '
                                      "stop the container before removing or force remove")
                self.end(container, KILL_EXIT_CODE, "killed")
            if container.state != "removed":
                self._remove(container)

    def _remove(self, container: _Container) -> None:
        for q in container.attachments:
            q.put(None)
        container.attachments.clear()
        container.state = "removed"
        self.containers.pop(container.id, None)
        self.cond.notify_all()

    def attach(self, container: _Container) -> queue.Queue[tuple[int, bytes] | None]:
        q: queue.Queue[tuple[int, bytes] | None] = queue.Queue()
        with self.cond:
            if container.state in ("created", "running"):
                container.attachments.append(q)
            else:
                q.put(None)
        return q

    def close(self) -> None:
        """Wake every waiting request (for shutdown)."""
        with self.cond:
            self.closing = True
            for c in self.containers.values():
                c.ended.set()
                for q in c.attachments:
                    q.put(None)
                c.attachments.clear()
            self.cond.notify_all()


def _signal_number(name: str) -> int:
    """``KILL``, ``SIGKILL`` or ``9`` -> 9 (empty: SIGKILL, as for ``docker kill``)."""
    if not name:
        return int(signal.SIGKILL)
    if name.isdigit():
        return int(name)
    try:
        return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
    except KeyError:
        raise EngineError(400, f"Invalid signal: {name}") from None


# --------------------------------------------------------------------------------------------------
# HTTP


class _Handler(BaseHTTPRequestHandler):
    """One connection from the CLI; HTTP/1.1 keep-alive, as the Go client expects."""

    protocol_version = "HTTP/1.1"
    server: _Server

    # -- plumbing

    def version_string(self) -> str:
        return f"Docker/{ENGINE_VERSION} (linux)"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _api_headers(self) -> None:
        # moby v28.2.2 api/server/middleware/version.go: on every response.
        self.send_header("Api-Version", API_VERSION)
        self.send_header("Docker-Experimental", "false")
        self.send_header("Ostype", "linux")

    def _record(self, status: int, **extra: Any) -> None:
        self.server.recorder.write({
            "kind": "request", "time": time.time(), "method": self.command, "path": self.api_path,
            "api_version": self.api_version, "query": self.query, "body": self.body, "status": status,
            "user_agent": self.headers.get("User-Agent"), **extra,
        })

    def _send_json(self, status: int, payload: Any, **extra: Any) -> None:
        data = (json.dumps(payload) + "\n").encode()
        self._record(status, **extra)
        self.send_response(status)
        self._api_headers()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, error: EngineError, **extra: Any) -> None:
        # moby v28.2.2 api/types/error_response.go: {"message": ...}
        self._send_json(error.status, {"message": error.message}, **extra)

    def _send_empty(self, status: int, **extra: Any) -> None:
        self._record(status, **extra)
        self.send_response(status)
        self._api_headers()
        if status not in (204, 304):
            self.send_header("Content-Length", "0")
        self.end_headers()

    def _start_chunked(self, status: int, content_type: str, **extra: Any) -> None:
        self._record(status, **extra)
        self.send_response(status)
        self._api_headers()
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def _chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """Whether the CLI hung up. Not "the socket reads EOF": the CLI half-closes a hijacked attach
        connection when it has no stdin to send (docker/cli ``cli/command/container/hijack.go``) and goes on
        reading. A unix socket whose peer closed both ways polls POLLHUP (Linux ``net/unix/af_unix.c``)."""
        poller = select.poll()
        poller.register(self.connection, select.POLLHUP | select.POLLERR)
        try:
            return bool(poller.poll(0))
        except OSError:
            return True

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- dispatch

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        match = _VERSIONED_PATH.match(url.path)
        self.api_version = match.group(1) if match else None
        self.api_path = match.group(2) if match else url.path
        self.query = {k: v[0] if len(v) == 1 else v for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        raw = self._read_body()
        try:
            self.body = json.loads(raw) if raw.strip() else None
        except ValueError:
            self.body = raw.decode(errors="replace")
        engine = self.server.engine
        try:
            self._check_version()
            parts = self.api_path.strip("/").split("/")
            route = (self.command, *parts)
            if route in (("GET", "_ping"), ("HEAD", "_ping")):
                self._ping()
            elif route == ("GET", "version"):
                self._version()
            elif route == ("POST", "auth"):
                self._auth()
            elif route == ("POST", "images", "create"):
                self._images_create()
            elif route == ("POST", "containers", "create"):
                self._containers_create()
            elif self.command == "GET" and len(parts) >= 3 and parts[0] == "images" and parts[-1] == "json":
                # The name may hold slashes (a registry and a repository path) and is URL-encoded.
                self._images_inspect(unquote("/".join(parts[1:-1])))
            elif len(parts) == 3 and parts[0] == "containers" and self.command == "POST" and parts[2] in (
                    "start", "attach", "wait", "stop", "kill"):
                with engine.cond:
                    container = engine.find(parts[1])
                getattr(self, f"_containers_{parts[2]}")(container)
            elif len(parts) == 2 and parts[0] == "containers" and self.command == "DELETE":
                with engine.cond:
                    container = engine.find(parts[1])
                engine.remove(container, _true(self.query.get("force")))
                self._send_empty(204)
            else:
                raise EngineError(501, f"fake dockerd (tests/harness/dockerd.py) does not implement "
                                  f"{self.command} {self.api_path}")
        except EngineError as error:
            self._send_error(error)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _check_version(self) -> None:
        # moby v28.2.2 api/server/middleware/version.go
        if self.api_version is None:
            return
        v = tuple(int(p) for p in self.api_version.split("."))
        if v > tuple(int(p) for p in API_VERSION.split(".")):
            raise EngineError(400, f"client version {self.api_version} is too new. Maximum supported API version "
                              f"is {API_VERSION}")
        if v < tuple(int(p) for p in MIN_API_VERSION.split(".")):
            raise EngineError(400, f"client version {self.api_version} is too old. Minimum supported API version "
                              f"is {MIN_API_VERSION}, please upgrade your client to a newer version")

    # -- endpoints

    def _ping(self) -> None:
        """``GET|HEAD /_ping`` (swagger v1.50 ``/_ping``; moby ``api/server/router/system/system_routes.go``
        pingHandler): ``OK``, and the ``Api-Version`` header the CLI negotiates its version from (it then
        uses min(its own maximum, this))."""
        body = b"" if self.command == "HEAD" else b"OK"
        self._record(200)
        self.send_response(200)
        self._api_headers()
        self.send_header("Builder-Version", "1")
        self.send_header("Swarm", "inactive")
        self.send_header("Cache-Control", "no-cache, no-store, must-revalidate")
        self.send_header("Pragma", "no-cache")
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _auth(self) -> None:
        """``POST /auth`` (swagger v1.50 ``/auth``, SystemAuth; moby ``api/server/router/system/system_routes.go``
        postAuth), for ``docker login``: the engine checks the credentials with the registry and answers
        ``{"Status": "Login Succeeded"}`` (no identity token for a password login). This one checks only
        that there are a user name, a password and a registry, and records them."""
        body = self.body if isinstance(self.body, dict) else {}
        if not all(body.get(k) for k in ("username", "password", "serveraddress")):
            raise EngineError(400, "fake dockerd: a login needs username, password and serveraddress")
        self._send_json(200, {"Status": "Login Succeeded", "IdentityToken": ""})

    def _version(self) -> None:
        """``GET /version`` (swagger v1.50 ``/version``, SystemVersion), for ``docker version``."""
        self._send_json(200, {
            "Platform": {"Name": "fake dockerd (tests/harness/dockerd.py)"},
            "Components": [{"Name": "Engine", "Version": ENGINE_VERSION, "Details": {
                "ApiVersion": API_VERSION, "MinAPIVersion": MIN_API_VERSION, "GitCommit": "fake", "GoVersion": "none",
                "Os": "linux", "Arch": "amd64", "KernelVersion": os.uname().release, "Experimental": "false",
                "BuildTime": ""}}],
            "Version": ENGINE_VERSION, "ApiVersion": API_VERSION, "MinAPIVersion": MIN_API_VERSION,
            "GitCommit": "fake", "GoVersion": "none", "Os": "linux", "Arch": "amd64",
            "KernelVersion": os.uname().release, "BuildTime": "",
        })

    def _images_create(self) -> None:
        """``POST /images/create?fromImage=NAME&tag=TAG`` (swagger v1.50 ``/images/create``, ImageCreate; moby
        ``api/server/router/image/image_routes.go`` postImagesCreate): a failure before any progress is an
        HTTP error (``Error response from daemon: ...``); a pull streams JSON progress messages, each
        followed by ``\\r\\n`` (moby ``pkg/streamformatter``), ending with ``Status: ...``."""
        if "fromImage" not in self.query:
            raise EngineError(501, "fake dockerd: only pulls (fromImage) are implemented, not imports (fromSrc)")
        name, tag = str(self.query["fromImage"]), str(self.query.get("tag") or "")
        image = f"{name}@{tag}" if tag.startswith("sha256:") else f"{name}:{tag}" if tag else name
        full = normalize_image(image)
        engine = self.server.engine
        was_present = engine.images is not None and full in engine.images
        error = engine.pull(image)
        if error is not None:
            self._send_error(EngineError(500, error), image=full)
            return
        path_part = full.split("/", 1)[1].split("@")[0].rsplit(":", 1)[0]
        # A pull by digest gets that content; a pull by tag, whatever the tag points to.
        digest = tag if tag.startswith("sha256:") else "sha256:" + hashlib.sha256(full.encode()).hexdigest()
        layer = digest[7:19]
        done = "Image is up to date for" if was_present else "Downloaded newer image for"
        messages: list[dict[str, Any]] = [{"status": f"Pulling from {path_part}", "id": tag or "latest"}]
        if not was_present:
            messages += [{"status": "Pulling fs layer", "progressDetail": {}, "id": layer},
                         {"status": "Pull complete", "progressDetail": {}, "id": layer}]
        messages += [{"status": f"Digest: {digest}"}, {"status": f"Status: {done} {familiar_image(full)}"}]
        self._start_chunked(200, "application/json", image=full)
        for message in messages:
            self._chunk(json.dumps(message).encode() + b"\r\n")
        self._end_chunked()

    def _images_inspect(self, name: str) -> None:
        """``GET /images/{name}/json`` (swagger v1.50 ``/images/{name}/json``, ImageInspect; moby
        ``api/server/router/image/image_routes.go`` getImagesByName), for ``docker image inspect``: the image's
        identity when the engine holds it, else 404 ``No such image: NAME`` (moby ``errdefs.NotFound``, which
        the CLI prints as ``Error response from daemon: No such image: ...`` and exits 1). Only the fields
        a boot or a bake reads are filled in."""
        if not self.server.engine.has_image(name):
            raise EngineError(404, f"No such image: {name}")
        full = normalize_image(name)
        self._send_json(200, {"Id": "sha256:" + hashlib.sha256(full.encode()).hexdigest(),
                              "RepoTags": [familiar_image(full)], "RepoDigests": [], "Os": "linux",
                              "Architecture": "amd64", "Size": 0, "Config": {}, "RootFS": {"Type": "layers"}})

    def _containers_create(self) -> None:
        """``POST /containers/create?name=NAME`` (swagger v1.50 ``/containers/create``, ContainerCreate): 201
        ``{"Id", "Warnings": []}``; 404 ``No such image`` when the image is absent (the CLI then pulls and
        creates again: docker/cli ``cli/command/container/create.go``), 409 on a name in use."""
        if not isinstance(self.body, dict):
            raise EngineError(400, "invalid JSON: the create body is not an object")
        name = self.query.get("name")
        container = self.server.engine.create(str(name) if name else None, self.body)
        self._send_json(201, {"Id": container.id, "Warnings": []},
                        container=_container_record(container.name, container.id, self.body))

    def _containers_attach(self, container: _Container) -> None:
        """``POST /containers/{id}/attach?stream=1&stdout=1&stderr=1`` (swagger v1.50 ``/containers/{id}/attach``;
        moby ``container_routes.go`` postContainersAttach): with ``Upgrade: tcp`` the connection is hijacked
        with ``101 UPGRADED`` (content type ``application/vnd.docker.multiplexed-stream`` from API 1.42,
        ``raw-stream`` before), then carries stdcopy frames (no TTY) until the container exits, and closes."""
        engine = self.server.engine
        want = {1} if _true(self.query.get("stdout")) else set()
        if _true(self.query.get("stderr")):
            want.add(2)
        q = engine.attach(container)
        self.close_connection = True
        multiplexed = self.api_version is None or tuple(map(int, self.api_version.split("."))) >= (1, 42)
        content_type = "application/vnd.docker." + ("multiplexed-stream" if multiplexed else "raw-stream")
        self._record(101 if "Upgrade" in self.headers else 200, container_name=container.name)
        if "Upgrade" in self.headers:
            self.wfile.write(f"HTTP/1.1 101 UPGRADED\r\nContent-Type: {content_type}\r\nConnection: Upgrade\r\n"
                             "Upgrade: tcp\r\n\r\n".encode())
        else:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n")
        self.wfile.flush()
        while True:
            try:
                item = q.get(timeout=0.2)
            except queue.Empty:
                if engine.closing or self._client_gone():
                    break
                continue
            if item is None:
                break
            stream, data = item
            if stream in want:
                for i in range(0, len(data), _MAX_FRAME):
                    chunk = data[i:i + _MAX_FRAME]
                    self.wfile.write(_FRAME.pack(stream, len(chunk)) + chunk)
                self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)

    def _containers_wait(self, container: _Container) -> None:
        """``POST /containers/{id}/wait?condition=next-exit|not-running|removed`` (swagger v1.50
        ``/containers/{id}/wait``; moby ``container_routes.go`` postContainersWait): from API 1.30 the 200
        header goes out at once (the CLI sends ``start`` only after it has it), the body
        ``{"StatusCode": N}`` when the condition is met."""
        engine = self.server.engine
        condition = str(self.query.get("condition") or "not-running")
        if condition not in ("not-running", "next-exit", "removed"):
            raise EngineError(400, f'invalid condition: "{condition}"')
        with engine.cond:
            exits_before = container.exits

        def met() -> bool:
            if condition == "removed":
                return container.state == "removed"
            if condition == "next-exit":
                return container.exits > exits_before
            return container.state != "running"

        self._start_chunked(200, "application/json", container_name=container.name)
        with engine.cond:
            while not met():
                if engine.closing or self._client_gone():
                    self.close_connection = True
                    return
                engine.cond.wait(timeout=0.2)
            code = container.exit_code
        self._chunk(json.dumps({"StatusCode": code}).encode() + b"\n")
        self._end_chunked()

    def _containers_start(self, container: _Container) -> None:
        """``POST /containers/{id}/start`` (swagger v1.50 ``/containers/{id}/start``): 204, or 304 when already
        running; runs the behaviour on its own thread."""
        self.server.engine.start(
            container, lambda started: self._send_empty(204 if started else 304, container_name=container.name))

    def _containers_stop(self, container: _Container) -> None:
        """``POST /containers/{id}/stop?t=SECONDS`` (swagger v1.50 ``/containers/{id}/stop``): 204 once stopped
        (exit code 143, as a process ended by SIGTERM), 304 when it was not running."""
        stopped_now = self.server.engine.end(container, STOP_EXIT_CODE, "stopped")
        self._send_empty(204 if stopped_now else 304, container_name=container.name)

    def _containers_kill(self, container: _Container) -> None:
        """``POST /containers/{id}/kill?signal=SIG`` (swagger v1.50 ``/containers/{id}/kill``): what the CLI's
        signal proxy sends; 409 when not running. A terminating signal ends the container with 128+signal."""
        number = _signal_number(str(self.query.get("signal") or ""))
        engine = self.server.engine
        with engine.cond:
            if container.state != "running":
                raise EngineError(409, f"cannot kill container: {container.name}: container {container.id} is not "
                                  "running")
            if number in _TERMINATING_SIGNALS:
                engine.end(container, 128 + number, "killed")
        self._send_empty(204, container_name=container.name)


def _true(value: Any) -> bool:
    """Moby's httputils.BoolValue: anything but empty, ``0``, ``no``, ``false`` and ``none`` is true."""
    return str(value or "").strip().lower() not in ("", "0", "no", "false", "none")


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False
    engine: _Engine
    recorder: _Recorder

    def __init__(self, path: str, engine: _Engine, recorder: _Recorder) -> None:
        self.engine = engine
        self.recorder = recorder
        self.connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(path, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A CLI that hangs up (it exits as soon as it has its answer) is no error; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self._connections_lock:
            for connection in list(self.connections):
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)


# --------------------------------------------------------------------------------------------------
# Public: in-process and as a process


DEFAULT_PULL_ERROR = 'Get "https://{registry}/v2/": net/http: TLS handshake timeout'
"""What a failing pull answers (500), as a registry that does not answer in time makes the engine say.
``{registry}`` and ``{image}`` are filled in."""


def _private_dir() -> Path:
    # Short: a unix socket's path must fit in 108 bytes, which pytest's tmp_path may not.
    return Path(tempfile.mkdtemp(prefix="fakedockerd-", dir="/tmp" if os.path.isdir("/tmp") else None))


class FakeDockerd:
    """The fake engine in this process, on threads.

    ``socket_path``: where to listen (default: a new short path under /tmp). ``record_path``: the JSON-lines
    record (default: none; ``.records`` keeps them in memory either way). ``behaviour``: a callable or a
    ``module:function`` / ``file.py:function`` spec (default: :func:`default_behaviour`). ``images``: the
    images present before any pull (default None: every image is, so ``docker run`` never pulls).
    ``pull_failures``: how many pulls fail (with ``pull_error``) before pulls succeed; also settable later.
    ``device_root``: when given, ``--device /dev/X`` must exist as ``device_root/dev/X`` or start fails as
    the engine's does for a missing device.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None,
                 record_path: str | os.PathLike[str] | None = None,
                 behaviour: Behaviour | str | None = None, *, images: Iterable[str] | None = None,
                 pull_failures: int = 0, pull_error: str = DEFAULT_PULL_ERROR,
                 device_root: str | os.PathLike[str] | None = None) -> None:
        self._dir = _private_dir()
        self.socket_path = str(socket_path) if socket_path is not None else str(self._dir / "docker.sock")
        if len(os.fsencode(self.socket_path)) > 107:
            raise ValueError(f"unix socket path too long (108 bytes at most): {self.socket_path}")
        self.record_path = Path(record_path) if record_path is not None else None
        if isinstance(behaviour, str):
            behaviour = load_behaviour(behaviour)
        self._recorder = _Recorder(self.record_path)
        self._engine = _Engine(self._recorder, behaviour or default_behaviour, images, pull_failures, pull_error,
                               None if device_root is None else str(device_root))
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a CLI process needs to talk to this engine: ``DOCKER_HOST``, and a private, empty
        ``DOCKER_CONFIG`` (no credential helpers or contexts from the machine's ``~/.docker``)."""
        return {"DOCKER_HOST": f"unix://{self.socket_path}", "DOCKER_CONFIG": str(self._dir / "config")}

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records so far (as :func:`read_records` gives them)."""
        return list(self._recorder.records)

    @property
    def pull_failures(self) -> int:
        """How many of the next pulls fail."""
        return self._engine.pull_failures

    @pull_failures.setter
    def pull_failures(self, value: int) -> None:
        with self._engine.cond:
            self._engine.pull_failures = value

    @property
    def behaviour(self) -> Behaviour:
        return self._engine.behaviour

    @behaviour.setter
    def behaviour(self, value: Behaviour | str) -> None:
        self._engine.behaviour = load_behaviour(value) if isinstance(value, str) else value

    def start(self) -> FakeDockerd:
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        (self._dir / "config").mkdir(exist_ok=True)
        self._server = _Server(self.socket_path, self._engine, self._recorder)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01},
                                        daemon=True, name="fake-dockerd")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end waiting requests, remove the socket (and the private directory)."""
        if self._server is not None:
            self._engine.close()
            self._server.shutdown()
            self._server.close_connections()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> FakeDockerd:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class DockerdProcess:
    """The fake engine as a child process (``python tests/harness/dockerd.py ...``), same knobs as
    :class:`FakeDockerd` but ``behaviour`` must be a ``module:function`` or ``file.py:function`` spec and
    ``pythonpath`` lists folders to import it from. ``start()`` returns once the socket answers."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None,
                 record_path: str | os.PathLike[str] | None = None, behaviour: str | None = None, *,
                 images: Iterable[str] | None = None, pull_failures: int = 0, pull_error: str = DEFAULT_PULL_ERROR,
                 device_root: str | os.PathLike[str] | None = None, pythonpath: Iterable[str] = (),
                 log_path: str | os.PathLike[str] | None = None) -> None:
        self._dir = _private_dir()
        self.socket_path = str(socket_path) if socket_path is not None else str(self._dir / "docker.sock")
        self.record_path = Path(record_path) if record_path is not None else None
        self._log_path = Path(log_path) if log_path is not None else self._dir / "dockerd.log"
        argv = [sys.executable, str(Path(__file__).resolve()), "--socket", self.socket_path,
                "--pull-failures", str(pull_failures), "--pull-error", pull_error]
        if record_path is not None:
            argv += ["--record", str(record_path)]
        if behaviour is not None:
            argv += ["--behaviour", behaviour]
        if images is not None:
            argv += ["--strict-images", *itertools.chain.from_iterable(("--image", i) for i in images)]
        if device_root is not None:
            argv += ["--device-root", str(device_root)]
        for folder in pythonpath:
            argv += ["--pythonpath", folder]
        self.argv = argv
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """As :attr:`FakeDockerd.env`."""
        return {"DOCKER_HOST": f"unix://{self.socket_path}", "DOCKER_CONFIG": str(self._dir / "config")}

    def start(self, timeout: float = 10) -> DockerdProcess:
        (self._dir / "config").mkdir(exist_ok=True)
        with open(self._log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"fake dockerd exited {self.process.returncode}: "
                                   f"{self._log_path.read_text(errors='replace')}")
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(self.socket_path)
                    return self
                except OSError:
                    time.sleep(0.01)
        self.stop()
        raise TimeoutError(f"fake dockerd did not listen on {self.socket_path} within {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> DockerdProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True, help="unix socket to listen on")
    parser.add_argument("--record", help="JSON-lines file to append a record per request to")
    parser.add_argument("--behaviour", help="module:function or file.py:function playing containers")
    parser.add_argument("--pythonpath", action="append", default=[], help="folder to import behaviours from")
    parser.add_argument("--pull-failures", type=int, default=0, help="fail this many pulls first")
    parser.add_argument("--pull-error", default=DEFAULT_PULL_ERROR, help="message of a failing pull")
    parser.add_argument("--image", action="append", default=[], help="an image present before any pull")
    parser.add_argument("--strict-images", action="store_true",
                        help="only --image and pulled images are present (default: every image is)")
    parser.add_argument("--device-root", help="--device paths must exist under this folder")
    args = parser.parse_args(argv)
    sys.path[:0] = args.pythonpath
    engine = FakeDockerd(args.socket, args.record, args.behaviour,
                         images=args.image if args.strict_images or args.image else None,
                         pull_failures=args.pull_failures, pull_error=args.pull_error, device_root=args.device_root)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    engine.start()
    try:
        done.wait()
    finally:
        engine.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
