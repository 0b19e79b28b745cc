"""What the stack tells the template scanners: checkov's per-resource skips, each with the reason a
security reviewer reads. (cdk-nag's acknowledgments are ``Validations.of(...).acknowledge``.)"""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnResource

from constructs import IConstruct

from ..plan.errors import ServingConfigError, problem

LOG_GROUP_KEY_REASON = (
    "CloudWatch Logs encrypts every log group at rest with a key it manages, and only this account's "
    "principals with logs:GetLogEvents read it; a customer managed key would add a key policy and its cost. The "
    "groups hold boot steps, rejected flows, request lines without headers, and the serving engines' own logs"
)
"""Why the stack's log groups have no customer managed KMS key (checkov CKV_AWS_158)."""


def skip_checkov(scope: IConstruct, check_id: str, reason: str) -> None:
    """Skip checkov's ``check_id`` on ``scope``'s resource (itself or its default child), with
    ``reason`` in the template metadata, where checkov reads it (``Metadata.checkov.skip``)."""
    resource = scope if isinstance(scope, CfnResource) else scope.node.default_child
    if not isinstance(resource, CfnResource):
        raise ServingConfigError([problem("skip_checkov", scope.node.path, "is not a CloudFormation resource")])
    existing: Any = resource.get_metadata("checkov") or {}
    skips = [s for s in existing.get("skip", []) if s["id"] != check_id]
    resource.add_metadata("checkov", {"skip": [*skips, {"id": check_id, "comment": reason}]})
