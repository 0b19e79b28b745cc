"""AWS on loopback for simulated hosts: the REAL AWS CLI (v2) talks to moto's server and to a recorder.

- :class:`MotoServer`: moto's server (``moto[server]``, pinned in ``requirements-aws.txt``) in a child
  process on 127.0.0.1 and a free port. It serves S3 and Secrets Manager (and whatever else moto
  implements) to any number of ``aws`` processes started from bash. A child process keeps moto's
  module-global state out of the test process (where ``moto.mock_aws`` may be in use) and the serving
  threads off the test's GIL. Its requests are handled one at a time (a lock around moto's WSGI app),
  because moto 5.2.5 checks ``If-None-Match: *`` and then stores the object without a lock
  (``moto/s3/responses.py``, ``S3Response.put_object``), a window in which two racing writers could
  both win (not seen in 30 races of 12 boto3 writers, but not excluded). S3 lets exactly one of racing
  conditional writers win, and so does this server. Each request is a few milliseconds.
- :class:`Recorder`: an HTTP server for the query-protocol calls moto lacks (moto 5.2.5 answers
  ``cloudformation signal-resource``, ``autoscaling complete-lifecycle-action`` and
  ``autoscaling record-lifecycle-action-heartbeat`` with HTTP 500: it implements none of them), and
  ``cloudformation describe-stack-resource`` for the resources :meth:`Recorder.put_metadata` deploys. It
  reads each request as botocore's ``QuerySerializer`` (``botocore/serialize.py``) writes it, checks it
  against the operation's input shape in the service model the CLI itself carries, records it as a
  JSON line, and answers as the service would: an empty ``<OperationResponse>`` (DescribeStackResource's
  holds the resource and its metadata), or AWS's query-protocol
  ``<ErrorResponse>`` (HTTP 400 ``ValidationError`` for a constraint violation). Knobs
  (:meth:`Recorder.fail`) make an operation fail as the real service does when nothing awaits it.
- :class:`AwsEmulator`: one per test, shared by the test's simulated hosts. :attr:`AwsEmulator.env` is
  the environment that sends a plain ``aws ...`` to them and nowhere else; helpers set up and read
  moto's state through boto3.

Models: the AWS CLI v2 ships its own copy of botocore (``awscli.botocore``, versioned ``2.0.0dev155``
in the 2.36.7 wheel; aws/aws-cli 2.36.7, awscli/botocore/__init__.py), separate from the ``botocore``
boto3 uses (as v1 1.x did too). The recorder validates against the CLI's copy
(``awscli/botocore/data/cloudformation/2010-05-15/service-2.json`` and
``awscli/botocore/data/autoscaling/2011-01-01/service-2.json``), and falls back to ``botocore``'s
when the CLI has none.

Endpoints: botocore's ``ConfiguredEndpointProvider`` (``botocore/configprovider.py``) reads
``AWS_ENDPOINT_URL_<SERVICE ID>`` (the service id upper-cased, spaces and hyphens as ``_``:
``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL_SECRETS_MANAGER``, ``AWS_ENDPOINT_URL_CLOUDFORMATION``,
``AWS_ENDPOINT_URL_AUTO_SCALING``), then ``AWS_ENDPOINT_URL``; ``--region`` on the command line still
picks the region (the recorder sees it in the SigV4 credential scope). S3 uses path-style addressing
against an IP-address endpoint (botocore's S3 endpoint rules), so ``127.0.0.1`` needs no DNS.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import functools
import http.server
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from xml.sax.saxutils import escape

import boto3

TOOLS = Path(os.environ.get("NEURON_SERVING_AWS_TOOLS") or Path(__file__).resolve().parents[2] / ".tools" / "aws")
"""A venv of ``requirements-aws.txt`` apart from the project's (``python3 -m venv .tools/aws && .tools/aws/bin/pip
install -r tests/harness/requirements-aws.txt``). When it exists, its ``aws`` and its Python (for moto) are
used; otherwise those of the test's own venv."""

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]
REGION = "eu-west-1"
ACCOUNT_ID = "123456789012"
"""moto's default account: ARNs moto makes (secrets) carry it."""

FAKE_ACCESS_KEY = "AKIAHARNESSFAKEKEY01"
FAKE_SECRET_KEY = "harness/fake/secret/key/never/valid/0000"

MOTO_SERVICES = ("s3", "secretsmanager", "ecr")
"""Services sent to moto by default (ECR for ``aws ecr get-login-password``, moto 5.2.5
``moto/ecr/responses.py`` get_authorization_token); every other service goes to the recorder."""

RECORDED_SERVICES = ("cloudformation", "autoscaling")
"""botocore service names the recorder answers."""

_MOTO_MAIN = r"""
import datetime, fnmatch, http.client, io, ipaddress, json, re, sys, threading, urllib.parse, uuid
from xml.sax.saxutils import escape
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import make_server

host, cert_path, key_path = sys.argv[1:4]
# A self-signed certificate for the loopback address, which the CLI is told to trust (AWS_CA_BUNDLE).
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "moto on loopback (test harness)")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
with open(cert_path, "wb") as f:
    f.write(cert.public_bytes(serialization.Encoding.PEM))
with open(key_path, "wb") as f:
    f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))

app = DomainDispatcherApplication(create_backend_app)
lock = threading.Lock()
faults = []  # dicts of Fault's fields and "hits", in the order given (see MotoServer.fail)
SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/[^/,]+/([^/,]+)/aws4_request")

def operation_of(environ):
    # The operation a query/EC2 form (Action) or a JSON request (X-Amz-Target) names; '' for REST.
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:
        return target.rsplit(".", 1)[-1]
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
        size = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(size)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        return urllib.parse.parse_qs(body.decode()).get("Action", [""])[0]
    return ""

def matching_fault(environ):
    scope = SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
    service = scope.group(1) if scope else ""
    path = urllib.parse.unquote(environ.get("PATH_INFO", ""))
    query = environ.get("QUERY_STRING", "")
    operation = None
    for fault in faults:
        if fault["times"] is not None and fault["hits"] >= fault["times"]:
            continue
        if fault["service"] != service or (fault["method"] and fault["method"] != environ["REQUEST_METHOD"]):
            continue
        if not fnmatch.fnmatchcase(path, fault["path"]) or fault["query"] not in query:
            continue
        if fault["operation"]:
            if operation is None:
                operation = operation_of(environ)
            if operation != fault["operation"]:
                continue
        fault["hits"] += 1
        return fault
    return None

def error_response(fault, environ, start_response):
    # The error in the protocol's own shape: S3's REST-XML <Error>, EC2's <Response><Errors>, or AWS
    # JSON's {"__type", "message"} with the query-compatible code header (x-amzn-query-error).
    code, message, request_id = fault["code"], fault["message"], str(uuid.uuid4())
    headers = [("x-amz-request-id", request_id)]
    if fault["protocol"] == "json":
        body = json.dumps({"__type": code, "message": message}).encode()
        headers += [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-query-error", f"{code};Sender")]
    elif fault["protocol"] == "ec2":
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
                f'<Message>{escape(message)}</Message></Error></Errors><RequestID>{request_id}</RequestID>'
                '</Response>').encode()
        headers.append(("Content-Type", "text/xml;charset=UTF-8"))
    else:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code><Message>'
                f'{escape(message)}</Message>{fault["extra"]}<RequestId>{request_id}</RequestId></Error>').encode()
        headers.append(("Content-Type", "application/xml"))
    if environ["REQUEST_METHOD"] == "HEAD":
        body = b""
    # Drain the request's body first (S3 reads it before answering): botocore sends PutObject's chunked
    # (aws-chunked, a checksum trailer) after 100 Continue, and werkzeug ends a chunked input itself.
    if environ.get("wsgi.input_terminated"):
        environ["wsgi.input"].read()
    elif int(environ.get("CONTENT_LENGTH") or 0):
        environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
    start_response(f"{fault['status']} {http.client.responses.get(fault['status'], 'Error')}",
                   headers + [("Content-Length", str(len(body)))])
    return [body]

def harness(environ, start_response):
    # /_harness/faults: GET lists, POST adds one (JSON), DELETE clears; a moto reset clears them too.
    method = environ["REQUEST_METHOD"]
    if method == "POST":
        size = int(environ.get("CONTENT_LENGTH") or 0)
        faults.append({**json.loads(environ["wsgi.input"].read(size)), "hits": 0})
    elif method == "DELETE":
        faults.clear()
    body = json.dumps(faults).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]

def one_at_a_time(environ, start_response):
    with lock:
        if environ.get("PATH_INFO") == "/_harness/faults":
            return harness(environ, start_response)
        if environ.get("PATH_INFO") == "/moto-api/reset":
            faults.clear()
        fault = matching_fault(environ)
        if fault is not None:
            return error_response(fault, environ, start_response)
        result = app(environ, start_response)
        try:
            return [b"".join(result)]
        finally:
            getattr(result, "close", lambda: None)()

servers = [make_server(host, 0, one_at_a_time, threaded=True, request_handler=MotoRequestHandler),
           make_server(host, 0, one_at_a_time, threaded=True, request_handler=MotoRequestHandler,
                       ssl_context=(cert_path, key_path))]
print(" ".join(str(s.server_address[1]) for s in servers), flush=True)
for server in servers:
    threading.Thread(target=server.serve_forever, daemon=True).start()
sys.stdin.read()  # until the parent closes our stdin, or dies
"""


def endpoint_env_var(service_id: str) -> str:
    """The variable botocore reads for one service's endpoint (``ConfiguredEndpointProvider``).

    ``service_id`` is the model's ``serviceId`` ("S3", "Secrets Manager", "Auto Scaling")."""
    return "AWS_ENDPOINT_URL_" + re.sub(r"[ -]", "_", service_id).upper()


@dataclass(frozen=True)
class Fault:
    """An error moto's server answers instead of moto (:meth:`MotoServer.fail`), in the protocol's own shape,
    so that the real CLI reads it as it reads AWS's. Matches requests signed for ``service`` (the SigV4
    signing name: ``s3``, ``ec2``, ``monitoring`` for CloudWatch, ``secretsmanager``), with ``method`` (any
    when empty), a path matching the glob ``path`` (percent-decoded: ``/bucket/key``), ``query`` in the query
    string, and ``operation`` (the form's ``Action`` or the JSON ``X-Amz-Target``'s, any when empty); only
    the first ``times`` such requests when ``times`` is set. Build it with :meth:`s3`, :meth:`ec2` or
    :meth:`json`."""

    service: str
    protocol: str
    status: int
    code: str
    message: str
    method: str = ""
    path: str = "*"
    query: str = ""
    operation: str = ""
    times: int | None = None
    extra: str = ""
    """S3 only: more elements of the ``<Error>`` (a modeled field, such as ``<Condition>``)."""

    @classmethod
    def s3(cls, status: int, code: str, message: str, *, method: str = "", path: str = "*", query: str = "",
           times: int | None = None, extra: str = "") -> Fault:
        """S3's REST-XML ``<Error>`` (S3 API reference, "Error responses")."""
        return cls("s3", "rest-xml", status, code, message, method, path, query, "", times, extra)

    @classmethod
    def ec2(cls, operation: str, status: int, code: str, message: str, *, times: int | None = None) -> Fault:
        """EC2's ``<Response><Errors><Error>`` (EC2 API reference, "Error codes")."""
        return cls("ec2", "ec2", status, code, message, "POST", "*", "", operation, times)

    @classmethod
    def json(cls, service: str, operation: str, status: int, code: str, message: str, *,
             times: int | None = None) -> Fault:
        """AWS JSON 1.0's ``{"__type", "message"}`` with ``x-amzn-query-error: CODE;Sender``, as a service that
        moved from the query protocol answers (CloudWatch; botocore reads the header's code,
        ``awsQueryCompatible``)."""
        return cls(service, "json", status, code, message, "POST", "*", "", operation, times)


class MotoServer:
    """moto's server in a child process on 127.0.0.1; reusable across tests with :meth:`reset`.

    It listens twice, on plain HTTP (:attr:`url`, for boto3 and the CDK CLI) and on HTTPS
    (:attr:`tls_url`, for the AWS CLI's S3 calls), both one moto. HTTPS because AWS CLI v2's CRT
    transfer client (``preferred_transfer_client = crt``, the hosts' transfer config) speaks TLS to any
    endpoint but an ``--endpoint-url`` whose scheme is ``http``: aws/aws-cli 2.36.7,
    awscli/customizations/s3/factory.py, ``_create_crt_client`` sets ``use_ssl=False`` only from the
    command line's ``endpoint_url``, never from ``AWS_ENDPOINT_URL_S3``; against a plain-HTTP server its
    TLS handshake ends in ``AWS_IO_SOCKET_CLOSED`` (tried). The CRT client trusts the CA bundle the CLI is
    configured with (``_resolve_verify``: ``ca_bundle``, i.e. ``AWS_CA_BUNDLE``), here
    :attr:`ca_bundle`, a self-signed certificate for 127.0.0.1 made at start."""

    def __init__(self, log_path: Path | None = None, python: str | None = None) -> None:
        self.log_path = log_path
        self.python = python or (str(TOOLS / "bin" / "python") if (TOOLS / "bin" / "python").exists()
                                 else sys.executable)
        self._process: subprocess.Popen[str] | None = None
        self._certs: Path | None = None
        self.port = 0
        self.tls_port = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def tls_url(self) -> str:
        return f"https://{LOOPBACK}:{self.tls_port}"

    @property
    def ca_bundle(self) -> Path:
        """The PEM certificate :attr:`tls_url` serves, for ``AWS_CA_BUNDLE``."""
        assert self._certs is not None, "start the server first"
        return self._certs / "moto-ca.pem"

    def start(self) -> Self:
        self._certs = Path(tempfile.mkdtemp(prefix="moto-tls-"))
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                [self.python, "-c", _MOTO_MAIN, LOOPBACK, str(self.ca_bundle), str(self._certs / "moto-key.pem")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        assert self._process.stdout is not None
        ports = self._process.stdout.readline().split()
        if len(ports) != 2 or not all(p.isdigit() for p in ports):
            self.stop()
            raise RuntimeError(f"moto's server did not start (see {self.log_path or 'its stderr'})")
        self.port, self.tls_port = (int(p) for p in ports)
        return self

    def reset(self) -> None:
        """Forget every bucket, object and secret (moto's ``POST /moto-api/reset``), and every fault."""
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def fail(self, fault: Fault) -> None:
        """From now on, answer the requests ``fault`` matches with its error instead of moto's answer (the
        first fault given that matches and is not spent wins)."""
        self._faults("POST", json.dumps(dataclasses.asdict(fault)).encode())

    def faults(self) -> list[dict[str, Any]]:
        """The faults given, each with ``hits``: how many requests it answered."""
        return list(self._faults("GET"))

    def clear_faults(self) -> None:
        self._faults("DELETE")

    def _faults(self, method: str, data: bytes | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}/_harness/faults", method=method, data=data,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    @contextmanager
    def iam_enforced(self) -> Iterator[None]:
        """Inside, moto checks every request's signature and IAM permissions, as AWS does: only access keys
        created in moto's IAM pass, and only for actions their policies allow (moto's ``POST
        /moto-api/reset-auth``, the server's ``INITIAL_NO_AUTH_ACTION_COUNT``, which is infinite by
        default: moto allows everything). Set up users, policies and resources before entering.

        moto 5.2.5 answers a denied query-protocol call (CloudFormation) as AWS does (``AccessDenied``), but
        a denied JSON-protocol call (Secrets Manager) with an XML body botocore reads as the code ``"403"``.
        """
        self._reset_auth("0")
        try:
            yield
        finally:
            self._reset_auth("inf")

    def _reset_auth(self, count: str) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset-auth", method="POST", data=count.encode(),
                                         headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    def stop(self) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._process = None
        if self._certs is not None:
            shutil.rmtree(self._certs, ignore_errors=True)
            self._certs = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------------------------
# The recorder


def _tools_models() -> Path | None:
    """The CLI's own model files in :data:`TOOLS`, if that venv exists."""
    found = sorted(TOOLS.glob("lib/python3*/site-packages/awscli/botocore/data"))
    return found[-1] if found else None


@functools.cache
def cli_session() -> Any:
    """A botocore session with the service models the ``aws`` command uses: the CLI's own copy of botocore
    when it is importable; else boto3's botocore reading the models of the CLI in :data:`TOOLS`; else
    boto3's botocore and its own models (the same for the operations used here). One per process: it is
    only read (its models), and loading them takes a tenth of a second."""
    try:
        from awscli.botocore.session import get_session  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from botocore.session import get_session

        session = get_session()
        models = _tools_models()
        if models is not None:
            session.get_component("data_loader").search_paths.insert(0, str(models))
        return session
    return get_session()


def model_source() -> str:
    """Which models the recorder checks against, with their version."""
    try:
        import awscli.botocore  # type: ignore[import-not-found,unused-ignore]

        return f"awscli.botocore {awscli.botocore.__version__} (awscli {importlib.metadata.version('awscli')})"
    except ImportError:
        import botocore

        models = _tools_models()
        return f"{models}" if models is not None else f"botocore {botocore.__version__}"


@dataclass(frozen=True)
class Call:
    """One request the recorder received: what was asked, and how it was answered."""

    service: str
    operation: str
    params: dict[str, Any]
    region: str | None
    errors: list[str]
    status: int
    error_code: str | None = None
    error_message: str | None = None
    received: float = field(default_factory=time.time)
    """When the recorder took the request, in seconds since the epoch (``time.time()``): the same clock
    as the twin's, whose kernel is the host's, so a boot's own logs can be set against it."""

    @property
    def valid(self) -> bool:
        """Whether the request passed the model's constraints (a failure knob may still refuse it)."""
        return not self.errors

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Failure:
    """A knob: answer ``operation`` with this error while ``when`` matches, at most ``times`` times."""

    operation: str
    message: str
    code: str = "ValidationError"
    status: int = 400
    when: dict[str, str] = field(default_factory=dict)
    times: int | None = None
    hits: int = 0

    def applies(self, operation: str, params: Mapping[str, Any]) -> bool:
        if operation != self.operation or (self.times is not None and self.hits >= self.times):
            return False
        return all(str(params.get(k)) == v for k, v in self.when.items())


class _Blank(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class _RecorderHandler(http.server.BaseHTTPRequestHandler):
    server: _RecorderHTTPServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        status, payload = self.server.recorder.handle(self.headers.get("Authorization", ""),
                                                      self.headers.get("X-Amz-Target"), body)
        data = payload.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _RecorderHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, recorder: Recorder) -> None:
        super().__init__((LOOPBACK, 0), _RecorderHandler)
        self.recorder = recorder


_CREDENTIAL = re.compile(r"Credential=[^/,]+/\d{8}/(?P<region>[^/,]+)/(?P<service>[^/,]+)/aws4_request")


class Recorder:
    """Answers query-protocol calls (CloudFormation, Auto Scaling) from their botocore model; records each one.

    Checks the constraints botocore's models carry (Smithy's ``@length`` as ``min``/``max`` for strings,
    blobs, lists and maps, ``@range`` as ``min``/``max`` for numbers, ``enum``, ``pattern``, ``required``),
    plus parameter names the model does not know and values that do not parse as the member's type. A
    pattern must match the whole value: Smithy leaves patterns unanchored, but these older (Coral) services
    match whole values, as their refusals show (CloudFormation refuses the stack name ``my_stack``: "Member
    must satisfy regular expression pattern: [a-zA-Z][-a-zA-Z0-9]*…"). A pattern Python's ``re`` cannot
    compile (a Unicode property class) is not checked; every pattern of the four models used here compiles.
    botocore's own ``ParamValidator`` (``botocore/validate.py``) checks required members, unknown names,
    types and minimums only, so a CLI call with a 65-character ``--unique-id`` or ``--status MAYBE``
    reaches the service, which refuses it; here too.

    Violations are answered as AWS's query services answer them: HTTP 400, code ``ValidationError``,
    ``"1 validation error detected: Value '…' at 'uniqueId' failed to satisfy constraint: Member must have
    length less than or equal to 64"``. Two things are stricter than AWS, to catch typos: an unknown
    parameter is refused (``ValidationError``, the harness's wording), and a type the value does not parse
    as is refused with the harness's wording too.
    """

    def __init__(self, log_path: Path, services: Iterable[str] = RECORDED_SERVICES) -> None:
        self.log_path = log_path
        session = cli_session()
        self.models: dict[str, Any] = {}
        for name in services:
            model = session.get_service_model(name)
            assert model.protocol == "query", f"{name}: the recorder speaks the query protocol only"
            self.models[model.signing_name] = model
        self.model_source = model_source()
        self.failures: list[Failure] = []
        self.stack_resources: dict[tuple[str, str], str] = {}
        """The metadata (a JSON string) DescribeStackResource returns, by stack name and logical id:
        the resources of deployed stacks, as far as hosts read them (:meth:`put_metadata`)."""
        self._calls: list[Call] = []
        self._lock = threading.Lock()
        self._server: _RecorderHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._server = _RecorderHTTPServer(self)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.01},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- knobs -------------------------------------------------------------------------------------------------

    def fail(self, operation: str, message: str, *, code: str = "ValidationError", status: int = 400,
             times: int | None = None, when: Mapping[str, str] | None = None) -> Failure:
        """Refuse ``operation`` (requests that pass validation) with ``code``/``message``.

        ``message`` may name request parameters in braces (``{InstanceId}``). ``when`` limits the knob to
        requests whose parameters have these values (one host of several); ``times`` to the first N
        matching requests (then the operation succeeds again), e.g. ``code="Throttling",
        message="Rate exceeded", times=2``, which the CLI retries by itself.
        """
        failure = Failure(operation, message, code, status, dict(when or {}), times)
        with self._lock:
            self.failures.append(failure)
        return failure

    def fail_signal(self, state: str = "CREATE_COMPLETE", times: int | None = None, **when: str) -> Failure:
        """SignalResource as CloudFormation refuses it when no create or update awaits the signal."""
        return self.fail("SignalResource", "Resource {LogicalResourceId} is in " + state
                         + " state and cannot be signaled", times=times, when=when)

    def fail_lifecycle(self, times: int | None = None, **when: str) -> list[Failure]:
        """CompleteLifecycleAction and RecordLifecycleActionHeartbeat as Auto Scaling refuses them when the
        instance has no pending lifecycle action (not in a warm pool transition, or the hook timed out)."""
        message = "No active Lifecycle Action found with instance ID {InstanceId}"
        return [self.fail(op, message, times=times, when=when)
                for op in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat")]

    def put_metadata(self, stack: str, logical_id: str, metadata: str) -> None:
        """Deploy ``stack``'s resource ``logical_id`` with ``metadata`` (JSON, as CloudFormation resolved
        the template's), which DescribeStackResource then returns."""
        with self._lock:
            self.stack_resources[(stack, logical_id)] = metadata

    def clear_failures(self) -> None:
        with self._lock:
            self.failures.clear()

    # --- records -----------------------------------------------------------------------------------------------

    def calls(self, operation: str | None = None) -> list[Call]:
        """Every request so far (of ``operation`` only, when given), in arrival order."""
        with self._lock:
            return [c for c in self._calls if operation is None or c.operation == operation]

    # --- the service -------------------------------------------------------------------------------------------

    def handle(self, authorization: str, target: str | None, body: str) -> tuple[int, str]:
        """One request: ``(HTTP status, XML body)``."""
        scope = _CREDENTIAL.search(authorization)
        region, signing_name = (scope["region"], scope["service"]) if scope else (None, None)
        form = dict(urllib.parse.parse_qsl(body, keep_blank_values=True))
        action = form.pop("Action", target or "")
        version = form.pop("Version", None)
        model = self.models.get(signing_name or "")
        namespace = model.metadata.get("xmlNamespace", "") if model else ""

        def refuse(status: int, code: str, message: str, errors: list[str], params: dict[str, Any]) -> tuple[int, str]:
            self._record(Call(signing_name or "?", action, params, region, errors, status, code, message))
            return status, _error_xml(namespace, code, message)

        if scope is None:
            return refuse(403, "MissingAuthenticationToken", "Request is missing Authentication Token",
                          ["unsigned"], form)
        if model is None:
            return refuse(400, "NotEmulated", f"The test harness does not emulate the service {signing_name!r} "
                          f"(routed here by AWS_ENDPOINT_URL)", ["service not emulated"], form)
        if action not in model.operation_names:
            return refuse(400, "InvalidAction", f"The action {action} is not valid for this web service.",
                          ["unknown action"], form)
        if version != model.api_version:
            return refuse(400, "ValidationError", f"Version {version!r} is not {model.api_version!r} "
                          "(test harness)", ["wrong version"], form)
        operation = model.operation_model(action)
        params, errors = parse_and_validate(operation.input_shape, form)
        if errors:
            message = f"{len(errors)} validation error{'s' if len(errors) > 1 else ''} detected: " + "; ".join(errors)
            return refuse(400, "ValidationError", message, errors, params)
        with self._lock:
            failure = next((f for f in self.failures if f.applies(action, params)), None)
            if failure is not None:
                failure.hits += 1
        if failure is not None:
            message = failure.message.format_map(_Blank(params))
            return refuse(failure.status, failure.code, message, [], params)
        result = ""
        if action == "DescribeStackResource":
            stack, logical_id = params.get("StackName"), params.get("LogicalResourceId")
            with self._lock:
                metadata = self.stack_resources.get((str(stack), str(logical_id)))
            if metadata is None:
                # CloudFormation's words for a resource the stack lacks (unverified: from memory).
                return refuse(400, "ValidationError", f"Resource {logical_id} does not exist for stack {stack}",
                              [], params)
            result = _stack_resource_detail(str(stack), str(logical_id), metadata, region or REGION)
        self._record(Call(signing_name or "?", action, params, region, [], 200))
        return 200, _success_xml(namespace, operation, result)

    def _record(self, call: Call) -> None:
        line = json.dumps({"service": call.service, "operation": call.operation, "params": call.params,
                           "region": call.region, "valid": call.valid, "errors": call.errors,
                           "status": call.status, "error_code": call.error_code,
                           "error_message": call.error_message, "received": call.received}, default=str)
        with self._lock:
            self._calls.append(call)
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(line + "\n")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _request_id() -> str:
    return str(uuid.uuid4())


def _stack_resource_detail(stack: str, logical_id: str, metadata: str, region: str) -> str:
    """DescribeStackResource's result: a ``StackResourceDetail`` with the members the API reference
    marks required, and ``Metadata``, the resource's metadata as a JSON string (AWS CloudFormation API
    Reference, StackResourceDetail). The stack id and the physical id are examples of their formats."""
    return ("<StackResourceDetail>"
            f"<StackName>{escape(stack)}</StackName>"
            f"<StackId>arn:aws:cloudformation:{region}:{ACCOUNT_ID}:stack/{escape(stack)}/"
            "5b8e7f40-cb5a-11f0-9a3e-0e1f3c7d9b21</StackId>"
            f"<LogicalResourceId>{escape(logical_id)}</LogicalResourceId>"
            "<PhysicalResourceId>lt-0a1b2c3d4e5f60718</PhysicalResourceId>"
            "<ResourceType>AWS::EC2::LaunchTemplate</ResourceType>"
            "<LastUpdatedTimestamp>2026-11-27T00:00:00.000Z</LastUpdatedTimestamp>"
            "<ResourceStatus>CREATE_COMPLETE</ResourceStatus>"
            f"<Metadata>{escape(metadata)}</Metadata>"
            "</StackResourceDetail>")


def _success_xml(namespace: str, operation: Any, result: str = "") -> str:
    """``<OpResponse>`` with the output's ``resultWrapper`` element (holding ``result``, empty by default)
    and ``ResponseMetadata``, as botocore's ``QueryParser`` (``botocore/parsers.py``) reads it."""
    name = operation.name
    wrapper = operation.output_shape.serialization.get("resultWrapper") if operation.output_shape else None
    result = (f"<{wrapper}>{result}</{wrapper}>" if result else f"<{wrapper}/>") if wrapper else ""
    return (f'<{name}Response xmlns="{namespace}">{result}'
            f"<ResponseMetadata><RequestId>{_request_id()}</RequestId></ResponseMetadata></{name}Response>")


def _error_xml(namespace: str, code: str, message: str) -> str:
    """AWS's query-protocol error body (``<ErrorResponse><Error><Type>Sender</Type><Code>…``)."""
    return (f'<ErrorResponse xmlns="{namespace}"><Error><Type>Sender</Type><Code>{escape(code)}</Code>'
            f"<Message>{escape(message)}</Message></Error><RequestId>{_request_id()}</RequestId></ErrorResponse>")


# ---------------------------------------------------------------------------------------------------------------
# Reading a query-protocol form against a botocore shape, and checking it


def parse_and_validate(input_shape: Any, form: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The operation's parameters read from ``form`` (the inverse of botocore's ``QuerySerializer``), and
    every constraint they break, each as AWS words it (``Value 'x' at 'uniqueId' failed to satisfy …``)."""
    used: set[str] = set()
    errors: list[str] = []
    params: dict[str, Any] = {}
    if input_shape is not None:
        _, value = _read(input_shape, form, "", used)
        params = value or {}
        _check(input_shape, params, "", errors)
    for key in sorted(set(form) - used):
        errors.append(f"Value '{form[key]}' at '{key}' failed to satisfy constraint: "
                      "Unknown parameter (test harness: not in the operation's input shape)")
    return params, errors


def _member_key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _has_prefix(form: Mapping[str, str], prefix: str) -> bool:
    return any(k == prefix or k.startswith(prefix + ".") for k in form)


def _read(shape: Any, form: Mapping[str, str], prefix: str, used: set[str]) -> tuple[bool, Any]:
    """``(present, value)`` of ``shape`` at ``prefix``; scalars stay strings until :func:`_check` types them."""
    kind = shape.type_name
    if kind == "structure":
        out: dict[str, Any] = {}
        for name, member in shape.members.items():
            present, value = _read(member, form, _member_key(prefix, member.serialization.get("name", name)), used)
            if present:
                out[name] = value
        return bool(out), out
    if kind == "list":
        if prefix in form and form[prefix] == "":  # botocore sends an empty list as "Prefix="
            used.add(prefix)
            return True, []
        if shape.serialization.get("flattened"):
            list_prefix = prefix
            if shape.member.serialization.get("name"):
                list_prefix = ".".join([*prefix.split(".")[:-1], shape.member.serialization["name"]])
        else:
            list_prefix = f"{prefix}.{shape.member.serialization.get('name', 'member')}"
        items: list[Any] = []
        while _has_prefix(form, f"{list_prefix}.{len(items) + 1}"):
            _, item = _read(shape.member, form, f"{list_prefix}.{len(items) + 1}", used)
            items.append(item)
        return bool(items), items
    if kind == "map":
        entry = prefix if shape.serialization.get("flattened") else f"{prefix}.entry"
        key_name = shape.key.serialization.get("name", "key")
        value_name = shape.value.serialization.get("name", "value")
        entries: dict[str, Any] = {}
        i = 1
        while _has_prefix(form, f"{entry}.{i}"):
            _, key = _read(shape.key, form, f"{entry}.{i}.{key_name}", used)
            _, value = _read(shape.value, form, f"{entry}.{i}.{value_name}", used)
            entries[str(key)] = value
            i += 1
        return bool(entries), entries
    if prefix in form:
        used.add(prefix)
        return True, form[prefix]
    return False, None


def _camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def _violation(value: Any, path: str, constraint: str) -> str:
    shown = "null" if value is None else f"'{value}'"
    return f"Value {shown} at '{path}' failed to satisfy constraint: Member must {constraint}"


_PATTERNS: dict[str, re.Pattern[str] | None] = {}


_SURROGATE_PAIR = re.compile(r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})", re.IGNORECASE)


def _astral(pair: re.Match[str]) -> str:
    high, low = int(pair[1], 16), int(pair[2], 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08X}"


def _pattern(source: str) -> re.Pattern[str] | None:
    """``source`` compiled; Java reads ``\\uD800\\uDC00`` as one code point (U+10000), as Python needs it spelt."""
    if source not in _PATTERNS:
        try:
            _PATTERNS[source] = re.compile(_SURROGATE_PAIR.sub(_astral, source))
        except re.error:  # a Java construct Python lacks (\\p{L}): not checked
            _PATTERNS[source] = None
    return _PATTERNS[source]


def _check(shape: Any, value: Any, path: str, errors: list[str]) -> Any:
    """Type ``value`` (in place for containers) and append each constraint it breaks to ``errors``."""
    kind, meta = shape.type_name, shape.metadata

    def bounds(size: float, what: str) -> None:
        if "min" in meta and size < meta["min"]:
            errors.append(_violation(value, path, f"have {what} greater than or equal to {meta['min']}"))
        if "max" in meta and size > meta["max"]:
            errors.append(_violation(value, path, f"have {what} less than or equal to {meta['max']}"))

    if kind == "structure":
        for name in shape.required_members:
            if name not in value:
                errors.append(_violation(None, _member_key(path, _camel(name)), "not be null"))
        for name, member_value in list(value.items()):
            value[name] = _check(shape.members[name], member_value, _member_key(path, _camel(name)), errors)
        return value
    if kind == "list":
        bounds(len(value), "length")
        return [_check(shape.member, item, f"{path}.{i}.member", errors) for i, item in enumerate(value, 1)]
    if kind == "map":
        bounds(len(value), "length")
        return {k: _check(shape.value, v, f"{path}.{k}", errors) for k, v in value.items()}
    if kind == "string":
        enum = meta.get("enum") or []
        if enum and value not in enum:
            errors.append(_violation(value, path, f"satisfy enum value set: [{', '.join(enum)}]"))
        bounds(len(value), "length")
        compiled = _pattern(meta["pattern"]) if "pattern" in meta else None
        if compiled is not None and not compiled.fullmatch(value):
            errors.append(_violation(value, path, f"satisfy regular expression pattern: {meta['pattern']}"))
        return value
    try:
        typed: Any = _typed(kind, value)
    except ValueError:
        errors.append(_violation(value, path, f"be of type {kind} (test harness)"))
        return value
    if kind in ("integer", "long", "float", "double"):
        bounds(typed, "value")
    elif kind == "blob":
        bounds(len(typed), "length")
    return typed


def _typed(kind: str, text: str) -> Any:
    """A query-protocol scalar as botocore's ``QuerySerializer`` writes it, parsed back."""
    if kind in ("integer", "long"):
        return int(text)
    if kind in ("float", "double"):
        number = float(text)
        if math.isnan(number) and text != "NaN":
            raise ValueError(text)
        return number
    if kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError(text)
        return text == "true"
    if kind == "timestamp":
        try:
            return dt.datetime.fromtimestamp(float(text), dt.UTC)
        except ValueError:
            return dt.datetime.fromisoformat(text)
    if kind == "blob":
        return base64.b64decode(text, validate=True)
    return text


# ---------------------------------------------------------------------------------------------------------------
# The emulator a test uses


_AMAZON_IMAGES: dict[str, str] = {}
"""An Amazon image of moto's in each region, by region (:meth:`AwsEmulator.run_instance`)."""


class AwsEmulator:
    """moto (S3, Secrets Manager) and the recorder (everything else) for the simulated hosts of one test.

    ``moto_services`` (botocore service names) replaces the services sent to moto; one the recorder would
    answer (``cloudformation``) then goes to moto instead, e.g. for ``DescribeStacks`` of a stack created in
    moto with ``Outputs``.

    Pass a session-wide :class:`MotoServer` to share one moto process between tests (it is reset when this
    emulator starts), or none to have this emulator run its own.
    """

    def __init__(self, workdir: Path, moto: MotoServer | None = None, *, region: str = REGION,
                 default_region: str | None = None, moto_services: Iterable[str] = MOTO_SERVICES) -> None:
        self.workdir = workdir
        self.region = region
        self.default_region = default_region
        self.moto_services = tuple(moto_services)
        self._own_moto = moto is None
        self.moto = moto or MotoServer(workdir / "moto.log")
        # A service given to moto is not also the recorder's, whose endpoint variable would win.
        self.recorder = Recorder(workdir / "aws-calls.jsonl",
                                 [s for s in RECORDED_SERVICES if s not in self.moto_services])
        self._clients: dict[tuple[str, str], Any] = {}

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self._own_moto:
            self.moto.start()
        else:
            self.moto.reset()
        self.recorder.start()
        return self

    def stop(self) -> None:
        self.recorder.stop()
        if self._own_moto:
            self.moto.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """What a simulated host's environment needs so that ``aws ...`` reaches moto and the recorder only.

        Static fake credentials (no credential chain, no IMDS: ``AWS_EC2_METADATA_DISABLED``), no shared
        config or credentials file (``/dev/null``), no proxy for loopback, and every endpoint on
        127.0.0.1: the services in ``moto_services`` to moto over HTTPS (:attr:`MotoServer.tls_url`, its
        certificate trusted through ``AWS_CA_BUNDLE``), everything else (``AWS_ENDPOINT_URL``) to the
        recorder, which answers services it does not emulate with a non-retryable 400. No default region
        unless ``default_region`` was given: like an EC2 instance, a host gets its region from
        ``--region``. Add to, do not replace, the host's ``PATH`` (``aws`` lives beside ``sys.executable``).
        """
        session = cli_session()
        env = {
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": self.recorder.url,
            "NO_PROXY": f"{LOOPBACK},localhost",
            "no_proxy": f"{LOOPBACK},localhost",
        }
        for name in self.moto_services:
            env[endpoint_env_var(session.get_service_model(name).service_id)] = self.moto.tls_url
        env["AWS_CA_BUNDLE"] = str(self.moto.ca_bundle)
        for model in self.recorder.models.values():
            env[endpoint_env_var(model.service_id)] = self.recorder.url
        if self.default_region:
            env["AWS_DEFAULT_REGION"] = self.default_region
        return env

    @staticmethod
    def aws_executable() -> str:
        """The real ``aws``: :data:`TOOLS`'s, else the one beside this Python."""
        found = shutil.which("aws", path=os.pathsep.join([str(TOOLS / "bin"), str(Path(sys.executable).parent)]))
        if found is None:
            raise RuntimeError("no `aws` command: pip install -r tests/harness/requirements-aws.txt")
        return found

    @classmethod
    def link_cli(cls, bin_dir: Path) -> Path:
        """Put the real ``aws`` (a symlink; its shebang names this venv's Python) in ``bin_dir``, a host's
        own ``PATH`` entry. Use it instead of putting the venv's ``bin`` on a host's ``PATH``: that
        directory has ``aws`` too, so a host meant to lack the CLI would find it there."""
        bin_dir.mkdir(parents=True, exist_ok=True)
        link = bin_dir / "aws"
        if not link.exists():
            link.symlink_to(cls.aws_executable())
        return link

    # --- moto's state, through boto3 -----------------------------------------------------------------------

    def client(self, service: str, region: str | None = None) -> Any:
        """A boto3 client of moto (region ``region``, by default :attr:`region`)."""
        key = (service, region or self.region)
        if key not in self._clients:
            self._clients[key] = boto3.client(service, endpoint_url=self.moto.url, region_name=key[1],
                                              aws_access_key_id=FAKE_ACCESS_KEY,
                                              aws_secret_access_key=FAKE_SECRET_KEY)
        return self._clients[key]

    def create_bucket(self, bucket: str, *, versioned: bool = False) -> None:
        """A bucket; ``versioned`` turns versioning on, which moto 5.2.5 implements as S3 does for what the
        boot scripts do: an overwrite or a delete keeps the earlier version (a delete adds a delete marker),
        and ``If-None-Match: *`` fails with 412 while the key has a current version and succeeds once a
        delete marker is current (tried with the real CLI against this server)."""
        s3 = self.client("s3")
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": self.region})
        if versioned:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def put_object(self, bucket: str, key: str, body: bytes | str) -> None:
        self.client("s3").put_object(Bucket=bucket, Key=key, Body=body.encode() if isinstance(body, str) else body)

    def get_object(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes, or ``None`` when there is no such key."""
        s3 = self.client("s3")
        try:
            return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except s3.exceptions.NoSuchKey:
            return None

    def versions(self, bucket: str, key: str) -> list[bytes]:
        """The bodies of every version of ``key`` (delete markers left out), newest first, as S3 lists them."""
        s3 = self.client("s3")
        listed = s3.list_object_versions(Bucket=bucket, Prefix=key).get("Versions", [])
        return [bytes(s3.get_object(Bucket=bucket, Key=key, VersionId=v["VersionId"])["Body"].read())
                for v in listed if v["Key"] == key]

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key under ``prefix``, sorted."""
        keys: list[str] = []
        for page in self.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            keys += [o["Key"] for o in page.get("Contents", [])]
        return sorted(keys)

    def bucket_names(self) -> set[str]:
        return {b["Name"] for b in self.client("s3").list_buckets().get("Buckets", [])}

    def put_s3_uri(self, uri: str, body: bytes | str) -> None:
        """``put_object`` by ``s3://bucket/key``, creating the bucket when it is new."""
        bucket, key = _split_uri(uri)
        if bucket not in self.bucket_names():
            self.create_bucket(bucket)
        self.put_object(bucket, key, body)

    def put_metadata(self, stack: str, logical_id: str, metadata: str) -> None:
        """The deployed ``stack``'s resource ``logical_id`` has ``metadata`` (a JSON string), which
        ``aws cloudformation describe-stack-resource`` returns (:meth:`Recorder.put_metadata`)."""
        self.recorder.put_metadata(stack, logical_id, metadata)

    def publish_assets(self, assembly: Path, stack: str, region: str) -> str:
        """``stack``'s assets in the cloud assembly ``assembly`` published as ``cdk deploy`` publishes them,
        to the bootstrap bucket (``cdk-hnb659fds-assets-<account>-<region>``, created here as ``cdk
        bootstrap`` would) in moto: the pinned CDK CLI's ``cdk publish-assets`` (package.json's aws-cdk;
        ``--unstable=publish-assets``: node_modules/aws-cdk/lib/cli/cli-config.js of aws-cdk 2.1148.1) zips each
        directory asset itself and uploads it. It finds no CDKToolkit stack in moto and publishes with
        the credentials it has ("Defaulting to allowing cross account asset publishing", tried). Returns
        the CLI's output; fails the test when it fails."""
        bucket = f"cdk-hnb659fds-assets-{ACCOUNT_ID}-{region}"
        if bucket not in self.bucket_names():
            self.create_bucket(bucket)
        # The CLI checks the bootstrap's version parameter first; 33 is the version of the bootstrap
        # template the pinned CLI carries (node_modules/aws-cdk/lib/api/bootstrap/bootstrap-template.yaml,
        # CdkBootstrapVersion).
        self.client("ssm", region).put_parameter(
            Name="/cdk-bootstrap/hnb659fds/version", Value="33", Type="String", Overwrite=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CDK_", "JSII_SILENCE"))}
        env.update({
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_KEY, "AWS_REGION": region,
            "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": self.moto.url,
            "CDK_DISABLE_CLI_TELEMETRY": "true",
            "NO_PROXY": f"{LOOPBACK},localhost", "no_proxy": f"{LOOPBACK},localhost",
        })
        result = subprocess.run(
            ["npx", "--no-install", "cdk", "publish-assets", stack, "--unstable=publish-assets",
             "--app", str(assembly)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout + result.stderr

    def run_instance(self, instance_type: str = "inf2.xlarge") -> str:
        """An EC2 instance in moto (from the first of moto's own Amazon images); returns its id. A simulated
        host whose instance metadata gives this id tags, in moto, the instance it would be (``ec2`` must be
        one of ``moto_services``). moto 5.2.5 implements RunInstances, CreateTags and DescribeInstances;
        it does not check that CreateTags names an instance that exists (tried)."""
        ec2 = self.client("ec2")
        # Listing Amazon's images takes moto 5.2.5 about a second; its images come from the same static
        # list after every reset (moto/ec2/resources/amis.json), so the first found is remembered.
        image = _AMAZON_IMAGES.get(self.region)
        if image is None:
            image = _AMAZON_IMAGES[self.region] = ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0][
                "ImageId"]
        reservation = ec2.run_instances(ImageId=image, InstanceType=instance_type, MinCount=1, MaxCount=1)
        return str(reservation["Instances"][0]["InstanceId"])

    def instance_tags(self, instance_id: str) -> dict[str, str]:
        """The instance's tags in moto, by key."""
        reservations = self.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"]
        return {t["Key"]: t["Value"] for t in reservations[0]["Instances"][0].get("Tags", [])}

    def create_secret(self, name: str, value: str, region: str | None = None) -> str:
        """A Secrets Manager secret (in ``region``, by default :attr:`region`); returns its full ARN (moto
        picks the 6-character suffix)."""
        return str(self.client("secretsmanager", region).create_secret(Name=name, SecretString=value)["ARN"])


def _split_uri(uri: str) -> tuple[str, str]:
    assert uri.startswith("s3://"), uri
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key
