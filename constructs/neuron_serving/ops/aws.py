"""AWS calls whose failures become sentences a user can act on, never tracebacks.

Every command that talks to AWS runs inside :func:`run_aws`, which turns boto3's own failures
(no credentials, no region, an unreachable endpoint) into one line on stderr and exit status 1,
and makes its calls through :meth:`Aws.call`, which turns an API's refusal into an
:class:`OpsError` naming the IAM action that was refused, or saying what was not found.
boto3 is imported only here and only when a command runs: ``plan`` and the constructs never
need it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

EXIT_FAILURE = 1
"""What a command returns when it cannot do its job (and prints why)."""

CREDENTIAL_CODES = frozenset({
    "ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException",
    "SignatureDoesNotMatch", "InvalidSignatureException", "IncompleteSignature", "AuthFailure",
})
"""Error codes with which AWS refuses the credentials themselves rather than an action."""

ACCESS_DENIED_CODES = frozenset({
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthorizationError", "ForbiddenException",
})
"""Error codes with which AWS refuses an action to the caller (EC2 says UnauthorizedOperation; Resource
Groups ForbiddenException, "The caller isn't authorized to make the request", botocore 1.44.5
data/resource-groups/2017-11-27/service-2.json)."""

CREDENTIALS_HELP = ("configure them (`aws configure`, `aws sso login`, AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY)")


REGION_HELP = "AWS region (default: AWS_DEFAULT_REGION or the profile's; botocore reads no AWS_REGION)"
"""The ``--region`` option's help, wherever a command takes it."""


class OpsError(Exception):
    """A failure the user can act on; its message says what to do. Never holds a secret."""


Explainer = Callable[[str, str], str | None]
"""Given an error's code and message, a sentence for the cases a caller knows better, else None."""


class Aws:
    """One region's boto3 clients, whose failures are :class:`OpsError`."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._clients: dict[str, Any] = {}
        self._region_checked = False

    @classmethod
    def connect(cls, region: str | None) -> Aws:
        """A session in ``region``, or in boto3's default one: AWS_DEFAULT_REGION or the profile's
        (botocore 1.44's configprovider.py reads no AWS_REGION)."""
        import boto3

        return cls(boto3.session.Session(region_name=region))

    @property
    def region(self) -> str:
        """The session's region; raises :class:`OpsError` when there is none, or when boto3 knows no
        such region (a misspelt one: botocore would retry an endpoint that does not resolve, then
        say only that it cannot connect)."""
        region = self.session.region_name
        if not region:
            raise OpsError("no AWS region: pass --region, or set AWS_DEFAULT_REGION or the profile's region")
        if not self._region_checked:
            known = {r for partition in self.session.get_available_partitions()
                     for r in self.session.get_available_regions("ec2", partition_name=partition)}
            if known and region not in known:
                raise OpsError(f"region {region!r} is not one boto3 knows ({', '.join(sorted(known)[:4])}, ...): "
                               "check --region or AWS_DEFAULT_REGION, or upgrade boto3 if the region is new")
            self._region_checked = True
        return str(region)

    def client(self, service: str) -> Any:
        if service not in self._clients:
            self._clients[service] = self.session.client(service, region_name=self.region)
        return self._clients[service]

    def call(self, service: str, operation: str, resource: str, *, explain: Explainer | None = None,
             **params: Any) -> Any:
        """``client(service).operation(**params)``; a refusal becomes an :class:`OpsError` about
        ``resource`` (what the call was about, for the message), worded by ``explain`` when it
        knows the case."""
        from botocore.exceptions import ClientError

        client = self.client(service)
        try:
            return getattr(client, operation)(**params)
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))
            message = str(err.response.get("Error", {}).get("Message", ""))
            action = f"{client.meta.service_model.signing_name}:{client.meta.method_to_api_mapping[operation]}"
            said = explain(code, message) if explain is not None else None
            raise OpsError(said or explain_refusal(code, message, action, resource, self.region)) from None

    def pages(self, service: str, operation: str, resource: str, key: str, *, explain: Explainer | None = None,
              token_name: str = "NextToken", **params: Any) -> list[Any]:
        """Every item under ``key`` across the pages of an operation paginated by ``token_name``."""
        items: list[Any] = []
        token = None
        while True:
            page = self.call(service, operation, resource, explain=explain,
                             **params, **({token_name: token} if token else {}))
            items.extend(page.get(key, []))
            token = page.get(token_name)
            if not token:
                return items


def explain_refusal(code: str, message: str, action: str, resource: str, region: str) -> str:
    """The generic sentence for an API's refusal of ``action`` on ``resource``."""
    if code in ACCESS_DENIED_CODES:
        return f"access denied: your AWS identity needs {action} on {resource} (AWS: {message})"
    if code in CREDENTIAL_CODES:
        return f"AWS refused the credentials ({code}: {message}): refresh or replace them"
    if code in ("OptInRequired", "UnrecognizedRegion") or "not enabled" in message.lower():
        return f"region {region} is not enabled for this account ({code}: {message}): pick another with --region"
    return f"{action} on {resource} failed: {code}: {message}"


def stack_not_found(stack: str, region: str) -> Explainer:
    """An explainer for CloudFormation's "Stack with id X does not exist"."""

    def explain(code: str, message: str) -> str | None:
        if code == "ValidationError" and "does not exist" in message:
            return f"stack {stack} not found in {region}: name it with --stack, its region with --region"
        return None

    return explain


def run_aws(command: Callable[[], int]) -> int:
    """Run ``command``; every failure a user can act on is one line on stderr and exit status 1."""
    from botocore.exceptions import (
        BotoCoreError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
        PartialCredentialsError,
    )

    try:
        return command()
    except OpsError as err:
        problem = str(err)
    except (NoCredentialsError, PartialCredentialsError):
        problem = f"no AWS credentials found: {CREDENTIALS_HELP}"
    except NoRegionError:
        problem = "no AWS region: pass --region, or set AWS_DEFAULT_REGION or the profile's region"
    except EndpointConnectionError as err:
        problem = (f"cannot reach AWS at {err.kwargs.get('endpoint_url', 'its endpoint')}: check the region "
                   "(--region) and this machine's network or proxy")
    except BotoCoreError as err:
        problem = f"AWS call failed: {err}"
    print(f"neuron-serving: {problem}", file=sys.stderr)
    return EXIT_FAILURE
