"""One definition per setting: a :class:`StackSettings` field made with :func:`setting`, whose name is
the context key and the keyword argument, whose annotation is its type, and whose metadata holds
its documentation, its documented default and its shape check. Everything else (reading
``-c key=value``, checking types of values given in code, the docstrings, the configuration
table in docs/configuration.md) is derived from these fields.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..plan.identifiers import Check

METADATA_KEY = "neuron_serving.setting"


@dataclass(frozen=True)
class Setting:
    """What one setting is.

    :param name: the context key, keyword argument and field name.
    :param kind: how a value is read and checked: ``text``, ``integer``, ``number``, ``boolean``,
        ``degree`` (a whole number or ``auto``), ``list`` (of text) or ``mapping`` (text to text).
    :param optional: ``None`` is a valid value (the setting is unset).
    :param default: the value when the setting is not given.
    :param default_text: the default as documented (for defaults that depend on other settings).
    :param doc: what the setting does, in one paragraph of Markdown.
    :param check: the shape every given value (or each item of a list) must have.
    """

    name: str
    kind: str
    optional: bool
    default: Any
    default_text: str
    doc: str
    check: Check | None


@dataclass(frozen=True)
class _Meta:
    doc: str
    default_text: str | None
    check: Check | None
    kind: str | None


def setting(default: Any, doc: str, *, shown: str | None = None, check: Check | None = None,
            kind: str | None = None) -> Any:
    """A :class:`StackSettings` field: its default, its documentation (Markdown, one paragraph),
    the default as shown when it is not the value itself, its shape check and, when the
    annotation does not say it, how it is read (``kind="degree"``)."""
    metadata = {METADATA_KEY: _Meta(" ".join(doc.split()), shown, check, kind)}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_KINDS: dict[object, str] = {str: "text", int: "integer", float: "number", bool: "boolean"}


def definitions(cls: type) -> tuple[Setting, ...]:
    """Every setting of the dataclass ``cls``, in field order."""
    hints = typing.get_type_hints(cls)
    result = []
    for field in dataclasses.fields(cls):
        meta = field.metadata.get(METADATA_KEY)
        if not isinstance(meta, _Meta):
            continue
        kind, optional = _kind(hints[field.name])
        default = {} if field.default is dataclasses.MISSING else field.default
        result.append(Setting(field.name, meta.kind or kind, optional, default,
                              meta.default_text if meta.default_text is not None else show(default),
                              meta.doc, meta.check))
    return tuple(result)


def _kind(hint: object) -> tuple[str, bool]:
    args = typing.get_args(hint)
    optional = isinstance(hint, types.UnionType) and type(None) in args
    if optional:
        (hint,) = [a for a in args if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "list", optional
    if origin is not None and isinstance(origin, type) and issubclass(origin, Mapping):
        return "mapping", optional
    return _KINDS[hint], optional


def show(value: Any) -> str:
    """A value as the configuration table (docs/configuration.md) shows it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value in ((), {}):
        return "none"
    return f"`{value}`"


def type_problem(definition: Setting, value: Any) -> str | None:
    """What is wrong with the type of ``value`` given in code, or ``None``."""
    if value is None:
        return None if definition.optional else "must be given (it has no unset value)"
    kind = definition.kind
    if kind in ("integer", "degree"):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "must be a whole number"
    if kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return None if ok else "must be a number"
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "list":
        ok = isinstance(value, tuple | list) and all(isinstance(v, str) for v in value)
        return None if ok else "must be a list of strings"
    if kind == "mapping":
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return None if ok else "must be a mapping of strings to strings"
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"

