"""What the stack tells the template scanners: checkov's per-resource skips, each with the reason a
security reviewer reads. (cdk-nag's acknowledgments are ``Validations.of(...).acknowledge``.)"""

from __future__ import annotations

from typing import Any

from aws_cdk import Acknowledgment, CfnResource, Stack, Token, Validations

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


def acknowledge_any_resource(scope: IConstruct, reason: str) -> None:
    """Acknowledge cdk-nag's ``AwsSolutions-IAM5[Resource::*]`` on ``scope``'s stack for one more
    statement whose actions name no resource type, with ``reason``. cdk-nag has one finding for every
    such statement of the stack, and an acknowledgment of the same id replaces the one before: the
    reasons of them all are kept, joined, so that a reviewer reads each."""
    stack = Stack.of(scope)
    rule = "AwsSolutions-IAM5[Resource::*]"
    # The reasons so far are the stack's own acknowledgment (its metadata), never state kept beside it: a
    # process may synthesize many stacks of the same path (an app's tests do), each with its own grants.
    joined = next((str(value) for entry in reversed(stack.node.metadata)
                   if entry.type == "aws:cdk:acknowledged-rules" and isinstance(entry.data, dict)
                   for key, value in entry.data.items() if str(key).endswith(rule)), "")
    if reason in joined.split("; "):
        return
    Validations.of(stack).acknowledge(Acknowledgment(id=rule, reason=f"{joined}; {reason}" if joined else reason))


def nag_arn(stack: Stack, service: str, resource: str) -> str:
    """How cdk-nag writes an ARN of ``stack`` in its finding ids (``AwsSolutions-IAM5[Resource::...]``):
    the partition, region and account as the template has them, literal when the stack's environment
    (or the partition-literals feature flag) fixes them, else ``<AWS::Partition>`` and friends
    (cdk-nag 3.0.2 ``src/utils/flatten-cfn-reference.ts``: a ``Ref`` to a pseudo parameter becomes
    ``<Name>``). ``resource`` is what follows the account, such as ``instance/*``."""
    def shown(value: str, pseudo: str) -> str:
        return f"<AWS::{pseudo}>" if Token.is_unresolved(value) else value
    return (f"arn:{shown(stack.partition, 'Partition')}:{service}:{shown(stack.region, 'Region')}:"
            f"{shown(stack.account, 'AccountId')}:{resource}")
