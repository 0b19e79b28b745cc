"""Reading settings' values from text and JSON: ``-c key=value`` gives strings, cdk.json and an
organisation's config file give JSON (or YAML) types; both become the types a
:class:`~.fields.Setting` declares, or a problem naming the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ..plan.errors import Problems
from .fields import Setting

_UNPARSED = object()


def read(definition: Setting, value: Any, problems: Problems, *, label: str = "") -> Any:
    """``value`` as ``definition`` types it; on a problem, recorded under ``label + name``,
    returns the default."""
    key = label + definition.name
    parsed = _READERS[definition.kind](value)
    if parsed is _UNPARSED:
        problems.add(key, value, _EXPECTED[definition.kind])
        return definition.default
    return parsed


def _text(value: Any) -> Any:
    return value.strip() if isinstance(value, str) and value.strip() else _UNPARSED


def _integer(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return _UNPARSED


def _degree(value: Any) -> Any:
    return None if isinstance(value, str) and value.strip().lower() == "auto" else _integer(value)


def _number(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else _UNPARSED
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return _UNPARSED
        return number if math.isfinite(number) else _UNPARSED
    return _UNPARSED


def _boolean(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return _UNPARSED


def _list(value: Any) -> Any:
    items: Any = value
    if isinstance(value, str):
        text = value.strip()
        try:
            items = json.loads(text) if text.startswith("[") else text.split(",")
        except json.JSONDecodeError:
            return _UNPARSED
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return _UNPARSED
    return tuple(i.strip() for i in items if i.strip())


def _mapping(value: Any) -> Any:
    items: Any = value
    if isinstance(value, str):
        try:
            items = json.loads(value)
        except json.JSONDecodeError:
            return _UNPARSED
    if not isinstance(items, Mapping) or not all(isinstance(k, str) and isinstance(v, str | int | float | bool)
                                                 for k, v in items.items()):
        return _UNPARSED
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in items.items()}


_READERS = {"text": _text, "integer": _integer, "degree": _degree, "number": _number, "boolean": _boolean,
            "list": _list, "mapping": _mapping}
_EXPECTED = {
    "text": "must be a string",
    "integer": "must be a whole number",
    "degree": "must be a whole number or auto",
    "number": "must be a number",
    "boolean": "must be true or false",
    "list": "must be a list of strings or a comma-separated string",
    "mapping": "must be a mapping of names to values (a JSON object on the command line)",
}
