"""Checking a construct's props: plain values at once, token values when the app synthesizes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jsii
from aws_cdk import Stack, Token

from constructs import Construct, IValidation

Check = Callable[..., list[str]]
"""Takes the props' values in order; returns every problem, in the house wording."""


@jsii.implements(IValidation)
class _Deferred:
    def __init__(self, scope: Construct, values: Sequence[object], check: Check) -> None:
        self._scope, self._values, self._check = scope, values, check

    def validate(self) -> list[str]:
        resolved = [Stack.of(self._scope).resolve(v) for v in self._values]
        # A reference CloudFormation resolves at deploy (a parameter, an attribute) stays unknown
        # here: CloudFormation checks it then.
        if any(isinstance(v, dict | str) for v in resolved):
            return []
        return self._check(*resolved)


def check_props(scope: Construct, values: Sequence[object], check: Check) -> list[str]:
    """``check(*values)``'s problems now, when every value is plain; when one is a token, none now
    and the check runs as ``scope``'s validation at synth, on the values the tokens resolve to, as
    aws-cdk-lib defers its own checks (a token cannot be range-checked when it is given)."""
    if not any(Token.is_unresolved(v) for v in values):
        return check(*values)
    scope.node.add_validation(_Deferred(scope, values, check))
    return []
