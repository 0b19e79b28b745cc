"""Keys that name no setting: an error naming the key and the closest known one, so a typo such as
``-c tensor_paralel=8`` stops synthesis instead of deploying the default."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ..plan.errors import problem

OWN_CONTEXT_KEYS = ("preset", "config")
"""Context keys that choose where settings come from rather than being settings."""


def is_cdk_key(key: str) -> bool:
    """Keys the CDK itself reads or writes: feature flags (``@aws-cdk/...``), the CLI's own keys
    (``aws:cdk:...``, ``aws-cdk:...``, ``cdk-...``) and cached lookups (``provider:account=...``). Each has
    a colon or starts with ``@``, which no setting does (aws-cdk-lib ``cx-api/lib/features.ts``,
    ``cx-api/lib/context/*``)."""
    return key.startswith("@") or ":" in key


def suggestion(key: str, known: Iterable[str]) -> str:
    """``; did you mean <closest>?`` when one known key is close to ``key``, else a pointer to the list."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return "see the configuration table in docs/configuration.md, or help(StackSettings), for the settings"


def unknown_problems(keys: Iterable[str], values: Mapping[str, Any], known: Iterable[str], *,
                     label: str = "") -> list[str]:
    """One problem per key of ``values`` that is not ``known``, each with the closest known key."""
    known = sorted(known)
    return [problem(label + key, values.get(key), f"is not a setting; {suggestion(key, known)}") for key in keys]
