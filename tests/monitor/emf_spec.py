"""A checker of CloudWatch embedded metric format (EMF) events, written from the specification
(Amazon CloudWatch User Guide, "Specification: Embedded metric format", and its JSON schema), and
the metrics such events produce.

Rules checked, per event (one JSON object, one log line):

- The event is a JSON object of at most 256 KB (a CloudWatch Logs event).
- ``_aws`` is an object with only ``Timestamp`` (an integer: milliseconds since the epoch) and
  ``CloudWatchMetrics`` (an array of MetricDirectives).
- A MetricDirective has exactly ``Namespace`` (1 to 255 characters; CloudWatch reserves ``AWS/``),
  ``Dimensions`` (at least one DimensionSet) and ``Metrics`` (at most 100 MetricDefinitions).
- A DimensionSet is an array of at most 30 keys; each key names a root member whose value is a
  string, a valid CloudWatch dimension value (1 to 1024 ASCII characters, not only spaces, no
  control characters).
- A MetricDefinition has ``Name`` (1 to 255 characters, unique in its directive, not a dimension
  key), optionally ``Unit`` (a CloudWatch unit) and ``StorageResolution`` (1 or 60), nothing
  else. ``Name`` names a root member whose value is a number or an array of 1 to 100 numbers,
  each finite and within CloudWatch's range (|v| <= 2^360).

Standard library only, so that any test can use it: ``sys.path.insert(0, str(<repo>/"tests"/"monitor"))``
then ``import emf_spec`` (see :func:`metrics_produced`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

UNITS = frozenset({
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
})
"""The units a MetricDefinition may name (the specification's JSON schema)."""

MAX_EVENT_BYTES = 256 * 1024
MAX_METRICS_PER_DIRECTIVE = 100
MAX_KEYS_PER_DIMENSION_SET = 30
MAX_VALUES_PER_METRIC = 100
MAX_ABS_VALUE = 2.0 ** 360

MetricId = tuple[str, str, tuple[str, ...]]
"""(namespace, metric name, sorted dimension keys): one CloudWatch metric, whatever its dimension values."""


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and abs(value) <= MAX_ABS_VALUE)


def _dimension_value_problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"is {type(value).__name__}, not a string"
    if not 1 <= len(value) <= 1024:
        return f"has {len(value)} characters, not 1 to 1024"
    if not value.isascii() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "has non-ASCII or control characters"
    if not value.strip():
        return "is only whitespace"
    return None


def _name_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= 255:
        return f"{value!r} is not a string of 1 to 255 characters"
    return None


def problems(event: Any) -> list[str]:
    """Every way ``event`` breaks the EMF specification; empty when it is valid."""
    if not isinstance(event, dict):
        return [f"the event is {type(event).__name__}, not a JSON object"]
    found = []
    size = len(json.dumps(event, separators=(",", ":")).encode())
    if size > MAX_EVENT_BYTES:
        found.append(f"the event has {size} bytes, more than {MAX_EVENT_BYTES}")
    meta = event.get("_aws")
    if not isinstance(meta, dict):
        return [*found, "_aws is missing or not an object"]
    extra = sorted(set(meta) - {"Timestamp", "CloudWatchMetrics"})
    if extra:
        found.append(f"_aws has members the specification does not define: {extra}")
    stamp = meta.get("Timestamp")
    if not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
        found.append(f"_aws.Timestamp {stamp!r} is not milliseconds since the epoch (an integer)")
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list):
        return [*found, "_aws.CloudWatchMetrics is missing or not an array"]
    for i, directive in enumerate(directives):
        found += [f"CloudWatchMetrics[{i}]: {p}" for p in _directive_problems(event, directive)]
    return found


def _directive_problems(event: dict[str, Any], directive: Any) -> list[str]:
    if not isinstance(directive, dict):
        return ["not an object"]
    found = []
    if set(directive) != {"Namespace", "Dimensions", "Metrics"}:
        found.append(f"has members {sorted(directive)}, not exactly Namespace, Dimensions and Metrics")
    namespace = directive.get("Namespace")
    if _name_problem(namespace):
        found.append(f"Namespace {_name_problem(namespace)}")
    elif str(namespace).startswith("AWS/"):
        found.append(f"Namespace {namespace!r} is reserved for AWS")
    sets = directive.get("Dimensions")
    keys: set[str] = set()
    if not isinstance(sets, list) or not sets:
        found.append("Dimensions is not an array of at least one dimension set")
        sets = []
    for dimension_set in sets:
        if not isinstance(dimension_set, list) or len(dimension_set) > MAX_KEYS_PER_DIMENSION_SET:
            found.append(f"dimension set {dimension_set!r} is not an array of at most "
                         f"{MAX_KEYS_PER_DIMENSION_SET} keys")
            continue
        for key in dimension_set:
            if _name_problem(key):
                found.append(f"dimension key {_name_problem(key)}")
            elif key not in event:
                found.append(f"dimension {key!r} has no root member")
            elif _dimension_value_problem(event[key]):
                found.append(f"dimension {key!r}'s value {event[key]!r} {_dimension_value_problem(event[key])}")
            else:
                keys.add(key)
    metrics = directive.get("Metrics")
    if not isinstance(metrics, list) or len(metrics) > MAX_METRICS_PER_DIRECTIVE:
        return [*found, f"Metrics is not an array of at most {MAX_METRICS_PER_DIRECTIVE} definitions"]
    names: list[Any] = []
    for definition in metrics:
        if not isinstance(definition, dict) or "Name" not in definition:
            found.append(f"metric definition {definition!r} is not an object with a Name")
            continue
        name = definition["Name"]
        names.append(name)
        if set(definition) - {"Name", "Unit", "StorageResolution"}:
            found.append(f"metric {name!r} has members the specification does not define")
        if "Unit" in definition and definition["Unit"] not in UNITS:
            found.append(f"metric {name!r} has unit {definition['Unit']!r}, not a CloudWatch unit")
        if "StorageResolution" in definition and definition["StorageResolution"] not in (1, 60):
            found.append(f"metric {name!r} has StorageResolution {definition['StorageResolution']!r}, not 1 or 60")
        if _name_problem(name):
            found.append(f"metric Name {_name_problem(name)}")
        elif name in keys:
            found.append(f"metric {name!r} is also a dimension")
        elif name not in event:
            found.append(f"metric {name!r} has no root member")
        else:
            found += [f"metric {name!r} {p}" for p in _value_problems(event[name])]
    duplicates = sorted({str(n) for n in names if names.count(n) > 1})
    if duplicates:
        found.append(f"metrics defined more than once: {duplicates}")
    return found


def _value_problems(value: Any) -> list[str]:
    if isinstance(value, list):
        if not 1 <= len(value) <= MAX_VALUES_PER_METRIC:
            return [f"has {len(value)} values, not 1 to {MAX_VALUES_PER_METRIC}"]
        bad = [v for v in value if not _is_number(v)]
        return [f"has values that are not finite numbers: {bad[:5]!r}"] if bad else []
    return [] if _is_number(value) else [f"value {value!r} is not a finite number or an array of them"]


def check_event(event: Any) -> None:
    """Raise ``AssertionError`` listing every problem of ``event``."""
    found = problems(event)
    assert not found, "invalid EMF event:\n  " + "\n  ".join(found) + f"\nevent: {json.dumps(event)[:2000]}"


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The events of an EMF log (one JSON object per line), each checked with :func:`check_event`."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            event = json.loads(line)
        except ValueError as error:
            raise AssertionError(f"line {number} is not JSON ({error}): {line[:200]!r}") from None
        check_event(event)
        events.append(event)
    return events


def metrics_produced(events: Iterable[dict[str, Any]]) -> set[MetricId]:
    """The CloudWatch metrics ``events`` produce: one ``(namespace, name, sorted dimension keys)``
    per metric definition and dimension set. Events are assumed valid (see :func:`check_event`).

    From ``tests/cdk``::

        import sys
        from pathlib import Path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "monitor"))
        from emf_spec import metrics_produced
    """
    produced: set[MetricId] = set()
    for event in events:
        for directive in event["_aws"]["CloudWatchMetrics"]:
            for dimension_set in directive["Dimensions"]:
                for definition in directive["Metrics"]:
                    produced.add((directive["Namespace"], definition["Name"], tuple(sorted(dimension_set))))
    return produced


def metric_units(events: Iterable[dict[str, Any]]) -> dict[str, set[str]]:
    """Each metric name's units across ``events`` (``None`` when a definition names no unit)."""
    units: dict[str, set[str]] = {}
    for event in events:
        for directive in event["_aws"]["CloudWatchMetrics"]:
            for definition in directive["Metrics"]:
                units.setdefault(definition["Name"], set()).add(definition.get("Unit", "None"))
    return units


def metric_values(events: Iterable[dict[str, Any]], name: str, **dimensions: str) -> list[float]:
    """The values CloudWatch receives for metric ``name`` with exactly ``dimensions`` (keys and
    values), in event order, whatever the namespace."""
    values: list[float] = []
    for event in events:
        for directive in event["_aws"]["CloudWatchMetrics"]:
            declared = any(d["Name"] == name for d in directive["Metrics"])
            matching = any(set(s) == set(dimensions) and all(event.get(k) == v for k, v in dimensions.items())
                           for s in directive["Dimensions"])
            if declared and matching:
                value = event[name]
                values += value if isinstance(value, list) else [value]
    return values
