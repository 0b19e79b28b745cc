"""An organisation's config file (``-c config=path/to/org.yaml`` or ``.json``): settings that apply
to every stack of a team, such as the VPC, the permissions boundary, tags and the alarm topic.
Its problems name the file and the key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..plan.errors import Problems
from .suggestions import unknown_problems
from .values import read

SUFFIXES = (".yaml", ".yml", ".json")


def read_config_file(path: str, known: Mapping[str, Any], problems: Problems) -> dict[str, Any]:
    """The settings of the file at ``path``, typed; each problem (recorded in ``problems``) starts
    with the file's path. ``known`` maps each setting's name to its definition."""
    file = Path(path)
    label = f"{path}: "
    if file.suffix.lower() not in SUFFIXES:
        problems.add("config", path, f"must be a {', '.join(SUFFIXES)} file")
        return {}
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        problems.add("config", path, f"cannot be read: {error.strerror or error}")
        return {}
    try:
        data = _parse(text, yaml=file.suffix.lower() != ".json")
    except ValueError as error:
        problems.add("config", path, f"is not valid {'JSON' if file.suffix.lower() == '.json' else 'YAML'}: {error}")
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        problems.add("config", path, "must hold a mapping of setting names to values")
        return {}
    unknown = [k for k in data if k not in known]
    problems.add_all(unknown_problems(unknown, data, known, label=label))
    return {key: read(known[key], value, problems, label=label)
            for key, value in data.items() if key in known and value is not None}


def _parse(text: str, *, yaml: bool) -> Any:
    if not yaml:
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"line {error.lineno}: {error.msg}") from error
    # PyYAML's safe loader builds plain values only (no Python objects from tags).
    import yaml as pyyaml

    try:
        return pyyaml.safe_load(text)
    except pyyaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ValueError(f"{where}{getattr(error, 'problem', None) or error}") from error
