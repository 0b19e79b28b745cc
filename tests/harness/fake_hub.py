"""A small imitation of the Hugging Face Hub on 127.0.0.1, for the real ``huggingface-cli download``.

It implements what huggingface-hub 0.34.4 (the version in ``ghcr.io/huggingface/text-generation-inference:
3.3.5-neuron``, see ``requirements-hub.txt``) calls for ``huggingface-cli download REPO --revision R
--local-dir D --include ... --exclude ...``, and nothing else. Paths below are in
huggingface/huggingface_hub at tag v0.34.4, under ``src/huggingface_hub/``:

- ``commands/download.py``: with no file names the command calls ``snapshot_download`` with the include
  and exclude patterns as ``allow_patterns`` / ``ignore_patterns``.
- ``_snapshot_download.py``: one ``GET /api/models/{repo}/revision/{quote(rev, safe='')}``
  (``hf_api.py`` ``model_info``), which must answer ``sha`` and ``siblings[].rfilename``; the patterns are
  matched against those names on the client (``utils/_paths.py`` ``filter_repo_objects``), then every
  kept file is fetched *at the commit sha*, never at the branch name. A repo with no siblings is listed
  through ``GET /api/models/{repo}/tree/{rev}?recursive=True`` (``hf_api.py`` ``list_repo_tree``).
- ``file_download.py`` ``get_hf_file_metadata``: ``HEAD /{repo}/resolve/{sha}/{path}`` without following
  redirects to another host; it needs ``X-Repo-Commit``, an ETag (``X-Linked-Etag`` first, then ``ETag``)
  and a size (``X-Linked-Size`` first, then ``Content-Length``), else it fails with FileMetadataError.
  An LFS file answers 302 to a CDN on another host: the client then GETs that ``Location`` directly and
  drops its ``authorization`` header because the host differs (``_get_metadata_or_catch_error``).
- ``file_download.py`` ``http_get``: a plain GET, or with ``HF_HUB_ENABLE_HF_TRANSFER=1`` (set by the
  TGI neuron image) and a file over 50 MiB, the hf_transfer crate's parallel ``Range`` GETs.
- ``utils/_http.py`` ``hf_raise_for_status``: errors are told apart by the ``X-Error-Code`` header
  (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``) and, for a bad token, by
  ``X-Error-Message: Invalid credentials in Authorization header``. Its fallback that maps a bare 401 to
  RepositoryNotFoundError only matches ``https://`` URLs, so this server always sends ``X-Error-Code``.
- ``constants.py``: ``HF_ENDPOINT`` replaces ``https://huggingface.co`` (read once at import);
  ``utils/_auth.py``: ``HF_TOKEN`` becomes ``authorization: Bearer <token>``.

The same requests serve optimum-neuron's compile-cache proxy (``CompileCacheHfProxy``, optimum/neuron/cache/
hub_cache.py at v0.3.0 and v0.4.5, through huggingface-hub 0.34.4 in the TGI image and 0.36.2 in the vLLM image;
tests/harness/test_compile_cache.py), with nothing added: ``HfApi.repo_exists`` is ``repo_info`` (``GET
/api/models/{repo}``; ``RepositoryNotFoundError`` means False, ``GatedRepoError`` True, anything else raises);
``HfApi.file_exists`` is ``get_hf_file_metadata`` of ``/{repo}/resolve/main/{path}`` (a HEAD; ``EntryNotFound``
means False); ``HfApi.hf_hub_download`` of a cache file is that HEAD again, then a GET at the commit sha (or, for
an LFS file, at the CDN).

Access rules imitate huggingface.co: a gated repo's model info is public (the Hub lists a gated repo's
files to anyone) but its files answer 401 ``GatedRepo`` without a token and 403 ``GatedRepo`` to a token
that was not granted access; a private or unknown repo answers 401 ``RepoNotFound`` without a token and
404 with one; an unknown revision answers 404 ``RevisionNotFound``. Regular files carry their git blob
sha1 as ETag; LFS files (the patterns of the Hub's default ``.gitattributes``, or over 10 MiB) carry
their sha256. The Xet protocol is not imitated: without ``X-Xet-Hash`` headers the client downloads over
plain HTTP even with ``hf_xet`` installed.

Every request, to the Hub or to its CDN, is recorded with its headers and status.

:meth:`FakeHub.fail` makes the next requests fail as an unreliable network or Hub does: the connection reset
before any answer (a TCP RST: the client's ``requests`` raises ConnectionError), or an HTTP status such as 500.
The client does not retry either on the first call of a download: ``snapshot_download`` calls ``model_info``
(``hf_api.py``, a plain ``get_session().get``) once, and ``file_download.py`` ``_request_wrapper`` retries only
HTTP 429 (``http_backoff(..., retry_on_exceptions=(), retry_on_status_codes=(429,))``); only a transfer cut
mid-body is resumed inside one run (``http_get``, up to 5 times).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
    "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
    "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar.*", "*.tar", "*.tflite",
    "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*", "*.gguf",
)  # fmt: skip
"""Files the Hub's default ``.gitattributes`` for a new model repo stores in LFS."""

LFS_SIZE = 10 * 1024 * 1024
"""The Hub refuses regular git files over 10 MiB: larger ones are LFS whatever their name."""

_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha1(content: bytes) -> str:
    """The git object id of a blob: what the Hub sends as ETag for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass(frozen=True)
class HubFile:
    """One file of a commit. ``lfs`` None means: decided as the Hub would (name pattern or size)."""

    path: str
    content: bytes
    lfs: bool | None = None

    @property
    def is_lfs(self) -> bool:
        if self.lfs is not None:
            return self.lfs
        name = self.path.rsplit("/", 1)[-1]
        return len(self.content) > LFS_SIZE or any(fnmatch.fnmatchcase(name, p) for p in LFS_PATTERNS)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def etag(self) -> str:
        """sha256 for LFS files, git blob sha1 otherwise, as the Hub's resolve endpoint answers."""
        return self.sha256 if self.is_lfs else git_blob_sha1(self.content)


@dataclass(frozen=True)
class HubCommit:
    """A commit: its sha and its full file tree."""

    sha: str
    files: Mapping[str, HubFile]


@dataclass
class HubRepo:
    """A model repo: commits, and refs (branches and tags) naming them.

    :param repo_id: ``org/name`` (or a bare name).
    :param gated: files need a token the repo granted (``granted``; None grants every token the hub knows).
    :param private: the repo is invisible without such a token.
    """

    repo_id: str
    gated: bool = False
    private: bool = False
    granted: frozenset[str] | None = None
    commits: dict[str, HubCommit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)

    def commit(
        self,
        files: Mapping[str, bytes | HubFile],
        *,
        branch: str = "main",
        sha: str | None = None,
    ) -> str:
        """Add a commit holding exactly ``files`` (path to content), move ``branch`` to it, return its sha.

        Without ``sha`` one is derived from the parent and the tree, so a test's repo is deterministic.
        """
        tree = {p: f if isinstance(f, HubFile) else HubFile(p, f) for p, f in files.items()}
        if sha is None:
            digest = hashlib.sha1(self.refs.get(branch, "").encode())
            for path in sorted(tree):
                digest.update(f"{path}\0{tree[path].etag}\0".encode())
            sha = digest.hexdigest()
        if not _COMMIT_SHA.match(sha):
            raise ValueError(f"sha ({sha!r}) must be 40 lowercase hex digits")
        self.commits[sha] = HubCommit(sha, tree)
        self.refs[branch] = sha
        return sha

    def tag(self, name: str, sha: str) -> None:
        """Point ref ``name`` (a tag or another branch) at an existing commit."""
        if sha not in self.commits:
            raise ValueError(f"sha ({sha}) is not a commit of {self.repo_id}")
        self.refs[name] = sha

    def resolve(self, revision: str) -> HubCommit | None:
        """A full commit sha or a ref name, as the Hub resolves them; None when unknown."""
        if revision in self.commits:
            return self.commits[revision]
        sha = self.refs.get(revision)
        return self.commits[sha] if sha is not None else None


@dataclass(frozen=True)
class HubRequest:
    """One request either server answered. ``headers`` keys are lower case."""

    server: str  # "hub" or "cdn"
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    status: int
    """The HTTP status answered, or :data:`RESET` for a connection reset unanswered."""
    file: str | None = None
    """The repo file this request was about (resolve and CDN requests), else None."""

    @property
    def token(self) -> str | None:
        auth = self.headers.get("authorization", "")
        return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None


RESET = 0
"""The ``status`` :meth:`FakeHub.fail` takes and :class:`HubRequest` records for a connection reset unanswered."""


@dataclass
class _Failures:
    """What :meth:`FakeHub.fail` asked: fail ``left`` more requests (about ``file`` only, when given)."""

    left: int
    status: int
    file: str | None


class _Error(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: FakeHub
    role: str

    def handle_error(self, request: Any, client_address: Any) -> None:
        # hf_transfer and requests may close connections mid-body; that is not a test failure.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    _file: str | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def _dispatch(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        status = 500
        self._file = _about(self.server.role, url.path, query)
        try:
            failure = self.server.hub._take_failure(self._file)
            if failure == RESET:
                status = RESET
                self._reset()
            elif failure is not None:
                raise _Error(failure, None, "Internal Error - We're working hard to fix this as soon as possible!")
            elif self.server.role == "cdn":
                status = self._cdn(url.path, query, body=body)
            else:
                status = self._hub(url.path, query, body=body)
        except _Error as e:
            status = e.status
            headers = {"X-Error-Message": e.message, "Content-Type": "application/json"}
            if e.code is not None:
                headers["X-Error-Code"] = e.code
            if e.commit is not None:
                headers["X-Repo-Commit"] = e.commit
            self._send(e.status, headers, json.dumps({"error": e.message}).encode(), body=body)
        finally:
            self.server.hub._record(
                HubRequest(
                    server=self.server.role,
                    method=self.command,
                    path=unquote(url.path),
                    query=query,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    status=status,
                    file=self._file,
                )
            )

    def _reset(self) -> None:
        """Close the connection with a TCP RST (SO_LINGER on, timeout 0), before any answer."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True

    def _send(self, status: int, headers: Mapping[str, str], payload: bytes, *, body: bool) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", headers.get("Content-Length", str(len(payload))))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def _token(self) -> str | None:
        """The bearer token, checked: a token the hub does not know is refused outright, as the Hub does."""
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else ""
        if token not in self.server.hub.tokens:
            raise _Error(401, None, "Invalid credentials in Authorization header")
        return token

    def _repo(self, repo_id: str, token: str | None) -> HubRepo:
        repo = self.server.hub.repos.get(repo_id)
        if repo is None or (repo.private and not _granted(repo, token)):
            # The Hub answers 401 to anonymous callers and 404 to authenticated ones.
            raise _Error(404 if token else 401, "RepoNotFound", "Repository not found")
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> HubCommit:
        commit = repo.resolve(revision)
        if commit is None:
            raise _Error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _hub(self, path: str, query: dict[str, list[str]], *, body: bool) -> int:
        token = self._token()
        if path.startswith("/api/models/"):
            rest = path[len("/api/models/") :]
            if "/tree/" in rest:
                repo_id, _, tail = rest.partition("/tree/")
                revision, _, prefix = tail.partition("/")
                return self._tree(unquote(repo_id), unquote(revision), unquote(prefix), query, token, body=body)
            repo_id, _, revision = rest.partition("/revision/")
            return self._info(unquote(repo_id), unquote(revision) or "main", query, token, body=body)
        if "/resolve/" in path:
            repo_id, _, tail = path[1:].partition("/resolve/")
            revision, _, filename = tail.partition("/")
            return self._resolve(unquote(repo_id), unquote(revision), unquote(filename), token, body=body)
        raise _Error(404, None, "Not found")

    def _info(self, repo_id: str, revision: str, query: dict[str, list[str]], token: str | None, *, body: bool) -> int:
        """``GET /api/models/{repo}/revision/{rev}`` (hf_api.py ``model_info``)."""
        repo = self._repo(repo_id, token)
        commit = self._commit(repo, revision)
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings: list[dict[str, Any]] = []
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling.update(size=len(f.content), blobId=git_blob_sha1(f.content))
                if f.is_lfs:
                    sibling["lfs"] = {"size": len(f.content), "sha256": f.sha256, "pointerSize": 134}
            siblings.append(sibling)
        info = {
            "_id": hashlib.md5(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": commit.sha,
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body=body)
        return 200

    def _tree(
        self,
        repo_id: str,
        revision: str,
        prefix: str,
        query: dict[str, list[str]],
        token: str | None,
        *,
        body: bool,
    ) -> int:
        """``GET /api/models/{repo}/tree/{rev}/{path}`` (hf_api.py ``list_repo_tree``), one page. A ``path``
        that is no folder of the commit answers 404 ``EntryNotFound``, which the client raises as
        EntryNotFoundError (``utils/_http.py`` ``hf_raise_for_status``) and optimum-neuron's cache lookup
        catches (optimum/neuron/cache/hub_cache.py ``get_hub_cached_entries``, v0.4.5)."""
        repo = self._repo(repo_id, token)
        commit = self._commit(repo, revision)
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        base = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if base and not any(path.startswith(base) for path in commit.files):
            raise _Error(404, "EntryNotFound", f"{prefix} does not exist on \"{revision}\"", commit=commit.sha)
        entries: dict[str, dict[str, Any]] = {}
        for f in sorted(commit.files.values(), key=lambda f: f.path):
            if not f.path.startswith(base):
                continue
            parts = f.path[len(base) :].split("/")
            for depth in range(1, len(parts)):
                folder = base + "/".join(parts[:depth])
                entries.setdefault(folder, {"type": "directory", "oid": git_blob_sha1(folder.encode()), "path": folder})
                if not recursive:
                    break
            if recursive or len(parts) == 1:
                entry: dict[str, Any] = {
                    "type": "file",
                    "oid": git_blob_sha1(f.content),
                    "size": len(f.content),
                    "path": f.path,
                }
                if f.is_lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": len(f.content), "pointerSize": 134}
                entries[f.path] = entry
        self._send(200, {"Content-Type": "application/json"}, json.dumps(list(entries.values())).encode(), body=body)
        return 200

    def _resolve(self, repo_id: str, revision: str, filename: str, token: str | None, *, body: bool) -> int:
        """``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (file_download.py ``get_hf_file_metadata``, ``http_get``)."""
        repo = self._repo(repo_id, token)
        if repo.gated and not _granted(repo, token):
            if token is None:
                message = (
                    f"Access to model {repo.repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                raise _Error(401, "GatedRepo", message)
            message = f"Access to model {repo.repo_id} is restricted and you are not in the authorized list."
            raise _Error(403, "GatedRepo", message)
        commit = self._commit(repo, revision)
        f = commit.files.get(filename)
        if f is None:
            raise _Error(404, "EntryNotFound", "Entry not found", commit=commit.sha)
        headers = {"X-Repo-Commit": commit.sha, "Accept-Ranges": "bytes"}
        if f.is_lfs:
            cdn = self.server.hub.cdn_endpoint
            # Signed-URL stand-in: the CDN needs no token, and its host differs so the client drops it.
            location = f"{cdn}/lfs/{f.sha256}?X-Amz-Signature=fake&path={quote(filename, safe='')}"
            headers.update(
                {
                    "Location": location,
                    "ETag": f'"{git_blob_sha1(f.content)}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": str(len(f.content)),
                }
            )
            self._send(302, headers, b"", body=body)
            return 302
        headers["ETag"] = f'"{f.etag}"'
        return self._content(f.content, headers, body=body)

    def _cdn(self, path: str, query: dict[str, list[str]], *, body: bool) -> int:
        """The LFS CDN: ``/lfs/{sha256}``, no authentication, byte ranges."""
        sha = path.rsplit("/", 1)[-1]
        content = self.server.hub._blob(sha)
        if not path.startswith("/lfs/") or content is None:
            raise _Error(404, None, "Not found")
        return self._content(content, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, body=body)

    def _content(self, content: bytes, headers: dict[str, str], *, body: bool) -> int:
        """200 with the whole content, or 206 for a single ``Range: bytes=a-b`` (``a-``, ``-n``), as hf_transfer
        and the client's resume (file_download.py ``_adjust_range_header``) ask."""
        header = self.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip()) if header else None
        if header is None or match is None or match.groups() == ("", ""):
            self._send(200, headers, content, body=body)
            return 200
        size = len(content)
        first, last = match.groups()
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), min(int(last), size - 1) if last else size - 1
        if start >= size or start > end:
            raise _Error(416, None, "Requested range not satisfiable")
        headers = {**headers, "Content-Range": f"bytes {start}-{end}/{size}"}
        self._send(206, headers, content[start : end + 1], body=body)
        return 206


def _about(role: str, path: str, query: dict[str, list[str]]) -> str | None:
    """The repo file a request is about: a hub ``/resolve/`` path's file, the CDN's ``path`` parameter."""
    if role == "cdn":
        return query.get("path", [None])[0]
    if "/resolve/" in path:
        return unquote(path.partition("/resolve/")[2].partition("/")[2])
    return None


def _granted(repo: HubRepo, token: str | None) -> bool:
    return token is not None and (repo.granted is None or token in repo.granted)


class FakeHub:
    """The Hub on ``endpoint`` and its LFS CDN on ``cdn_endpoint`` (another port: another host to the client).

    Use as a context manager, or ``start()`` and ``stop()``::

        repo = HubRepo("meta-llama/Llama-3.2-1B", gated=True)
        sha = repo.commit({"config.json": b"{}", "model.safetensors": b"..."})
        with FakeHub([repo], tokens={"hf_test"}) as hub:
            env = hub.client_env(tmp_path, token="hf_test")
            ...  # run huggingface-cli with env
            hub.requests  # what the client asked

    :param repos: the repos it serves.
    :param tokens: the tokens it accepts; any other bearer token answers 401.
    """

    def __init__(self, repos: list[HubRepo] | None = None, *, tokens: set[str] | frozenset[str] = frozenset()) -> None:
        self.repos: dict[str, HubRepo] = {r.repo_id: r for r in repos or []}
        self.tokens = frozenset(tokens)
        self._requests: list[HubRequest] = []
        self._failures: _Failures | None = None
        self._lock = threading.Lock()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []

    def add(self, repo: HubRepo) -> HubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def start(self) -> FakeHub:
        for role in ("hub", "cdn"):
            server = _Server(("127.0.0.1", 0), _Handler)
            server.hub, server.role = self, role
            thread = threading.Thread(target=server.serve_forever, name=f"fake-hub-{role}", daemon=True)
            thread.start()
            self._servers.append(server)
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _port(self, index: int) -> int:
        if not self._servers:
            raise RuntimeError("FakeHub is not started")
        return int(self._servers[index].server_address[1])

    @property
    def endpoint(self) -> str:
        """The value for ``HF_ENDPOINT``."""
        return f"http://127.0.0.1:{self._port(0)}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port(1)}"

    def client_env(self, home: str | Any, *, token: str | None = None, hf_transfer: bool = False) -> dict[str, str]:
        """Environment variables that point huggingface-hub at this hub, to add to a subprocess's environment.

        ``home`` becomes ``HF_HOME`` (so no stored token or cache from the machine leaks in). The caller must
        also remove any ``HF_TOKEN``/``HUGGING_FACE_HUB_TOKEN``/``HF_HUB_OFFLINE`` it inherited:
        see ``CLIENT_ENV_REMOVE``. ``hf_transfer`` mirrors the TGI neuron image's ``HF_HUB_ENABLE_HF_TRANSFER=1``.
        """
        env = {
            "HF_ENDPOINT": self.endpoint,
            "HF_HOME": str(home),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_ENABLE_HF_TRANSFER": "1" if hf_transfer else "0",
            "HF_HUB_ETAG_TIMEOUT": "5",
            "HF_HUB_DOWNLOAD_TIMEOUT": "5",
        }
        if token is not None:
            env["HF_TOKEN"] = token
        return env

    def fail(self, times: int, *, status: int = RESET, file: str | None = None) -> None:
        """Fail the next ``times`` requests to the hub or its CDN (only those about repo path ``file``, when
        given): reset the connection unanswered (:data:`RESET`), or answer ``status`` (such as 500) with an
        error message, as the Hub does when it is down. Replaces what an earlier call asked."""
        if times < 0 or (status != RESET and not 400 <= status <= 599):
            raise ValueError(f"times ({times}) must be >= 0 and status ({status}) RESET or an HTTP error status")
        with self._lock:
            self._failures = _Failures(times, status, file)

    def _take_failure(self, file: str | None) -> int | None:
        """The status the request about ``file`` must fail with, counted; None: answer it."""
        with self._lock:
            failures = self._failures
            if failures is None or failures.left == 0 or (failures.file is not None and failures.file != file):
                return None
            failures.left -= 1
            return failures.status

    def _record(self, request: HubRequest) -> None:
        with self._lock:
            self._requests.append(request)

    @property
    def requests(self) -> list[HubRequest]:
        """A copy of every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()

    def downloads(self) -> list[str]:
        """Repo paths whose content was sent, in order, once each: a GET answered 200 or 206 by the hub's
        resolve endpoint (regular files) or by the CDN (LFS files; the hub answers those with a redirect)."""
        paths: list[str] = []
        for r in self.requests:
            if r.method == "GET" and r.status in (200, 206) and r.file is not None and r.file not in paths:
                paths.append(r.file)
        return paths

    def _blob(self, sha256: str) -> bytes | None:
        for f in self._files():
            if f.is_lfs and f.sha256 == sha256:
                return f.content
        return None

    def _files(self) -> Iterator[HubFile]:
        for repo in list(self.repos.values()):
            for commit in list(repo.commits.values()):
                yield from commit.files.values()


CLIENT_ENV_REMOVE = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ENDPOINT",
    "HF_HUB_ENABLE_HF_TRANSFER",
)
"""Variables a test must not inherit from the machine when it runs the client against the fake hub."""
