"""The instance metadata service, as the hypervisor serves it to an EC2 instance: IMDSv2 only.

Imitated from the EC2 user guide ("Use the Instance Metadata Service to access instance metadata",
"Instance metadata categories", "Retrieve security credentials from instance metadata", "Work with
instance tags using the instance metadata"), and checked against the two clients the boot uses, curl
and the AWS CLI v2 (its botocore's ``InstanceMetadataFetcher`` in ``awscli/botocore/utils.py`` at
aws/aws-cli 2.36.7, which takes the credentials from here; its CRT transfer client is handed the
same credentials, awscli/customizations/s3/factory.py ``_get_crt_credentials_provider``):

- ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to 21600) gives a token;
  without the header, 400. A PUT carrying ``X-Forwarded-For`` is refused (403), as the service refuses
  tokens through a proxy.
- ``GET /latest/meta-data/...`` and ``/latest/dynamic/...`` need ``X-aws-ec2-metadata-token`` with a
  live token (401 otherwise, as with ``HttpTokens: required``, which the stack's launch templates set);
  an unknown path is 404. A directory lists its entries, one a line, sub-directories with ``/``.
- Not imitated: the hop limit (the service drops token responses past the launch template's
  ``HttpPutResponseHopLimit``); on the twin's loopback no packet crosses a hop.

The test changes what it serves while the host runs (:meth:`Imds.set`): the Auto Scaling lifecycle
state, a Spot interruption notice.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.twin.netns import METADATA_ADDRESS

MAX_TTL = 21600


class Imds:
    """Serves ``meta`` (a tree of dicts and strings) on 169.254.169.254:80 of the namespace it is
    started in."""

    def __init__(self, *, instance_id: str, instance_type: str, region: str, zone: str, role: str,
                 credentials: dict[str, str], tags: dict[str, str] | None = None) -> None:
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 6 * 3600))
        self.meta: dict[str, Any] = {
            "ami-id": "ami-0twin0000000000001",
            "instance-id": instance_id,
            "instance-type": instance_type,
            "instance-life-cycle": "on-demand",
            "local-ipv4": "10.0.1.10",
            "placement": {"region": region, "availability-zone": zone},
            "iam": {"security-credentials": {role: json.dumps({
                "Code": "Success", "LastUpdated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "Type": "AWS-HMAC", "AccessKeyId": credentials["AccessKeyId"],
                "SecretAccessKey": credentials["SecretAccessKey"], "Token": credentials.get("Token", "twin"),
                "Expiration": expiry})}},
            "tags": {"instance": dict(tags or {})},
            "events": {"maintenance": {"scheduled": "[]"}},
        }
        self.identity = {"region": region, "availabilityZone": zone, "instanceId": instance_id,
                         "instanceType": instance_type, "accountId": "123456789012"}
        self.tokens: dict[str, float] = {}
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    def set(self, path: str, value: str | None) -> None:
        """Serve ``value`` at ``meta-data/<path>`` from now on (None: 404 there)."""
        *parents, leaf = path.split("/")
        with self._lock:
            node = self.meta
            for part in parents:
                node = node.setdefault(part, {})
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = value

    def lookup(self, path: str) -> str | None:
        with self._lock:
            if path.startswith("dynamic/instance-identity/document"):
                return json.dumps(self.identity)
            if not path.startswith("meta-data"):
                return None
            node: Any = self.meta
            for part in [p for p in path.removeprefix("meta-data").split("/") if p]:
                if not isinstance(node, dict) or part not in node:
                    return None
                node = node[part]
            if isinstance(node, dict):
                return "\n".join(f"{k}/" if isinstance(v, dict) else k for k, v in node.items())
            return str(node)

    def start(self, address: tuple[str, int] = (METADATA_ADDRESS, 80)) -> Imds:
        """Serves on ``address``: the metadata address of the namespace, or a loopback port for a
        program run outside a twin (given the service's URL, :attr:`url`)."""
        imds = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "EC2ws"
            sys_version = ""

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: str, headers: dict[str, str] | None = None) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                imds.requests.append(("PUT", self.path))
                if self.path != "/latest/api/token":
                    return self._send(404, "")
                if self.headers.get("X-Forwarded-For"):
                    return self._send(403, "")
                try:
                    ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
                except ValueError:
                    return self._send(400, "")
                if not 1 <= ttl <= MAX_TTL:
                    return self._send(400, "")
                token = secrets.token_urlsafe(40)
                imds.tokens[token] = time.time() + ttl
                self._send(200, token, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)})

            def do_GET(self) -> None:
                imds.requests.append(("GET", self.path))
                token = self.headers.get("X-aws-ec2-metadata-token", "")
                if imds.tokens.get(token, 0) < time.time():
                    return self._send(401, "")
                found = imds.lookup(self.path.removeprefix("/latest/").split("?")[0])
                if found is None:
                    return self._send(404, "")
                self._send(200, found)

        server = ThreadingHTTPServer(address, Handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="imds").start()
        return self

    @property
    def url(self) -> str:
        """``http://host:port/latest``, where it serves."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/latest"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
