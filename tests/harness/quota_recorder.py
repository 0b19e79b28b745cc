"""A RECORDER (not an emulator) for the two things moto 5.2.5 lacks that ``neuron-serving preflight`` calls:

- Service Quotas for service code ``ec2``: moto 5.2.5's servicequotas backend knows only the ``vpc`` defaults
  (``moto/servicequotas/resources/default_quotas/vpc.json``), and implements neither GetServiceQuota
  nor anything for ``ec2``. Answered here: ``GetServiceQuota`` and ``GetAWSDefaultServiceQuota`` (JSON
  protocol, ``X-Amz-Target: ServiceQuotasV20190624.<Operation>``), from values a test sets.
- EC2 ``DescribeCapacityReservations``: moto 5.2.5 has no capacity reservations (nothing in
  ``moto/ec2/responses``). Answered here from reservations a test sets, filtered by the request's
  ``CapacityReservationIds`` (an unknown one is refused with ``InvalidCapacityReservationId.NotFound``,
  as EC2 refuses it) and its ``instance-type`` and ``state`` filters (any other filter name is refused,
  so a filter the recorder would silently ignore cannot pass).
- Resource Groups ``ListGroupResources``: moto 5.2.5's ``moto/resourcegroups/responses.py`` raises
  NotImplementedError for it. Answered here (REST-JSON, ``POST /list-group-resources``) from the groups a
  test sets, in the output shape of awscli 1.46.3's botocore 1.44.5 model
  (``botocore/data/resource-groups/2017-11-27/service-2.json``: ``ListGroupResourcesOutput``, whose
  ``Resources`` items hold ``Identifier.ResourceArn`` and ``Identifier.ResourceType``); an unknown group is
  refused with ``NotFoundException`` (HTTP 404), one of the operation's errors in that model.

Every other EC2 request is forwarded unchanged (its Host header kept, so a SigV4 signature still verifies
when moto enforces IAM) to moto's server: point ``AWS_ENDPOINT_URL_EC2`` and
``AWS_ENDPOINT_URL_SERVICE_QUOTAS`` here, everything else at moto.

Each answered request is validated against botocore's own service model (the input shape's members,
required members, types, enums, lengths and patterns, with :func:`tests.harness.aws._check`); an invalid one
is refused with HTTP 400 and recorded with its errors. EC2 requests are read as botocore's ``EC2Serializer``
(``botocore/serialize.py``) writes them: lists flattened as ``Name.N``, members named by ``queryName`` or the
capitalised ``locationName``.
"""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Self
from xml.sax.saxutils import escape

import botocore.session

from tests.harness.aws import LOOPBACK, _check

EC2_NAMESPACE = "http://ec2.amazonaws.com/doc/2016-11-15/"
QUOTAS_TARGET = "ServiceQuotasV20190624."


@dataclass
class Recorded:
    service: str
    operation: str
    params: dict[str, Any]
    errors: list[str]
    status: int


@dataclass
class QuotaRecorder:
    """The recorder; ``quotas`` maps a quota code to the account's applied value (absent: none applied),
    ``defaults`` to AWS's default; ``reservations`` are DescribeCapacityReservations items (botocore's
    output member names); ``deny`` names operations answered with AccessDeniedException."""

    moto_url: str
    quotas: dict[str, float] = field(default_factory=dict)
    defaults: dict[str, float] = field(default_factory=dict)
    reservations: list[dict[str, Any]] = field(default_factory=list)
    groups: dict[str, list[str]] = field(default_factory=dict)
    deny: set[str] = field(default_factory=set)
    calls: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        session = botocore.session.get_session()
        self.quotas_model = session.get_service_model("service-quotas")
        self.ec2_model = session.get_service_model("ec2")
        self.groups_model = session.get_service_model("resource-groups")
        self._server: http.server.ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status, headers, answer = recorder.handle(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def operations(self) -> list[str]:
        with self._lock:
            return [c.operation for c in self.calls]

    def _record(self, call: Recorded) -> None:
        with self._lock:
            self.calls.append(call)

    # --- dispatch ----------------------------------------------------------------------------------------------

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        target = next((v for k, v in headers.items() if k.lower() == "x-amz-target"), "")
        if target.startswith(QUOTAS_TARGET):
            return self._quotas(target.removeprefix(QUOTAS_TARGET), body)
        if path.split("?")[0] == "/list-group-resources":
            return self._group_resources(body)
        form = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
        if form.get("Action") == "DescribeCapacityReservations":
            return self._reservations(form)
        return self._forward(path, headers, body)

    def _forward(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.moto_url + path, data=body, method="POST")
        for name, value in headers.items():
            if name.lower() not in ("content-length", "connection"):
                request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, {"Content-Type": response.headers.get("Content-Type", "text/xml")}, \
                    response.read()
        except urllib.error.HTTPError as err:
            return err.code, {"Content-Type": err.headers.get("Content-Type", "text/xml")}, err.read()

    # --- Service Quotas (JSON protocol) ------------------------------------------------------------------------

    def _quotas(self, operation: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        def answer(status: int, document: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
            return status, {"Content-Type": "application/x-amz-json-1.1"}, json.dumps(document).encode()

        def error(code: str, message: str, errors: list[str] | None = None) -> tuple[int, dict[str, str], bytes]:
            self._record(Recorded("service-quotas", operation, params, errors or [], 400))
            return answer(400, {"__type": code, "Message": message})

        params: dict[str, Any] = {}
        if operation not in ("GetServiceQuota", "GetAWSDefaultServiceQuota"):
            return error("UnknownOperationException", f"{operation}: not answered by this recorder")
        params = json.loads(body or b"{}")
        errors: list[str] = []
        _check(self.quotas_model.operation_model(operation).input_shape, params, "", errors)
        if errors:
            return error("ValidationException", "; ".join(errors), errors)
        if operation in self.deny:
            return error("AccessDeniedException", f"not authorized to perform servicequotas:{operation}")
        code = params["QuotaCode"]
        values = self.quotas if operation == "GetServiceQuota" else self.defaults
        if params["ServiceCode"] != "ec2" or code not in values:
            return error("NoSuchResourceException", f"The request failed because the specified quota {code} "
                         "does not exist" if operation == "GetServiceQuota" else f"No default for {code}")
        self._record(Recorded("service-quotas", operation, params, [], 200))
        return answer(200, {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": values[code],
                                      "Unit": "None", "Adjustable": True, "GlobalQuota": False}})

    # --- EC2 DescribeCapacityReservations (ec2 protocol) -------------------------------------------------------

    def _reservations(self, form: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        operation = "DescribeCapacityReservations"
        form = {k: v for k, v in form.items() if k not in ("Action", "Version")}
        shape = self.ec2_model.operation_model(operation).input_shape
        used: set[str] = set()
        params = _read_ec2(shape, form, "", used)
        errors = [f"unknown parameter {k}" for k in form if k not in used]
        _check(shape, params, "", errors)
        filters = {f.get("Name"): f.get("Values", []) for f in params.get("Filters", [])}
        errors += [f"filter {name!r} is not answered by this recorder" for name in filters
                   if name not in ("instance-type", "state")]
        ids = params.get("CapacityReservationIds", [])
        known = {str(r.get("CapacityReservationId")) for r in self.reservations}
        unknown = [i for i in ids if i not in known]
        if errors or operation in self.deny or unknown:
            self._record(Recorded("ec2", operation, params, errors, 400))
            code, message = (("InvalidParameterValue", "; ".join(errors)) if errors else
                             ("UnauthorizedOperation", "You are not authorized to perform this operation.")
                             if operation in self.deny else
                             ("InvalidCapacityReservationId.NotFound",
                              f"The capacity reservation ID '{', '.join(unknown)}' does not exist"))
            xml = (f"<Response><Errors><Error><Code>{code}</Code><Message>{escape(message)}</Message></Error>"
                   f"</Errors><RequestID>{uuid.uuid4()}</RequestID></Response>")
            return 400, {"Content-Type": "text/xml"}, xml.encode()
        self._record(Recorded("ec2", operation, params, [], 200))
        items = [r for r in self.reservations
                 if (not ids or r.get("CapacityReservationId") in ids)
                 and all(not values or str(r.get(_FILTER_FIELDS[name])) in values for name, values in filters.items())]
        output = self.ec2_model.operation_model(operation).output_shape.members["CapacityReservations"].member
        body = "".join(f"<item>{_xml_members(output, item)}</item>" for item in items)
        xml = (f'<DescribeCapacityReservationsResponse xmlns="{EC2_NAMESPACE}"><requestId>{uuid.uuid4()}</requestId>'
               f"<capacityReservationSet>{body}</capacityReservationSet></DescribeCapacityReservationsResponse>")
        return 200, {"Content-Type": "text/xml"}, xml.encode()


    # --- Resource Groups ListGroupResources (rest-json protocol) -------------------------------------------------

    def _group_resources(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        operation = "ListGroupResources"
        params = json.loads(body or b"{}")
        errors: list[str] = []
        _check(self.groups_model.operation_model(operation).input_shape, params, "", errors)
        group = str(params.get("Group", ""))

        def refuse(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
            self._record(Recorded("resource-groups", operation, params, errors, status))
            return status, {"Content-Type": "application/json", "X-Amzn-ErrorType": code}, \
                json.dumps({"Message": message}).encode()

        if errors:
            return refuse(400, "BadRequestException", "; ".join(errors))
        if operation in self.deny:
            return refuse(403, "ForbiddenException", f"not authorized to perform resource-groups:{operation}")
        if group not in self.groups:
            return refuse(404, "NotFoundException", f"Cannot find group {group}.")
        self._record(Recorded("resource-groups", operation, params, [], 200))
        document = {"Resources": [{"Identifier": {"ResourceArn": arn, "ResourceType": arn_type(arn)}}
                                  for arn in self.groups[group]], "QueryErrors": []}
        return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()


def arn_type(arn: str) -> str:
    """The CloudFormation-style resource type Resource Groups names a member by (``AWS::EC2::CapacityReservation``
    for ``arn:aws:ec2:...:capacity-reservation/cr-...``)."""
    kind = arn.split(":")[5].split("/")[0]
    return {"capacity-reservation": "AWS::EC2::CapacityReservation", "instance": "AWS::EC2::Instance"}.get(
        kind, f"AWS::EC2::{kind}")


_FILTER_FIELDS = {"instance-type": "InstanceType", "state": "State"}


def _ec2_key(name: str, member: Any) -> str:
    serialization = member.serialization
    if serialization.get("queryName"):
        return str(serialization["queryName"])
    location = serialization.get("name") or name
    return str(location[0].upper() + location[1:])


def _read_ec2(shape: Any, form: dict[str, str], prefix: str, used: set[str]) -> Any:
    """The value of ``shape`` at ``prefix`` in an EC2-protocol form."""
    if shape.type_name == "structure":
        value: dict[str, Any] = {}
        for name, member in shape.members.items():
            key = f"{prefix}{_ec2_key(name, member)}"
            if key in form or any(k.startswith(key + ".") for k in form):
                value[name] = _read_ec2(member, form, key, used)
        return value
    if shape.type_name == "list":
        items = []
        index = 1
        while f"{prefix}.{index}" in form or any(k.startswith(f"{prefix}.{index}.") for k in form):
            member = shape.member
            sub = f"{prefix}.{index}" + ("." if member.type_name == "structure" else "")
            items.append(_read_ec2(member, form, sub, used))
            index += 1
        return items
    used.add(prefix)
    text = form[prefix]
    if shape.type_name in ("integer", "long"):
        return int(text)
    if shape.type_name == "boolean":
        return text == "true"
    return text


def _xml_members(shape: Any, item: dict[str, Any]) -> str:
    """An output structure as EC2 writes it: each member under its ``locationName``."""
    parts = []
    for name, value in item.items():
        member = shape.members[name]
        tag = member.serialization.get("name") or name[0].lower() + name[1:]
        parts.append(f"<{tag}>{escape(str(value).lower() if isinstance(value, bool) else str(value))}</{tag}>")
    return "".join(parts)
