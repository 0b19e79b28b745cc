"""Where settings come from, lowest precedence first: their defaults, an organisation's config file
(``config``), a preset (``preset``), then each setting given in context (cdk.json or ``-c``) or in
code. Every problem, from every source, is reported at once; a problem with a value that came from
the config file or a preset says so."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..plan.errors import Problems, ServingConfigError
from .fields import Setting
from .org_config import read_config_file
from .presets import PRESETS
from .suggestions import OWN_CONTEXT_KEYS, is_cdk_key, unknown_problems
from .values import read


def preset_settings(name: str, problems: Problems) -> dict[str, Any]:
    """The settings of the preset ``name``, or a problem naming ``preset``."""
    preset = PRESETS.get(name)
    if preset is None:
        problems.add("preset", name, f"must be one of {', '.join(PRESETS)}")
        return {}
    return dict(preset.settings)


def layered(
    get: Callable[[str], Any],
    definitions: Mapping[str, Setting],
    build: Callable[..., Any],
    *,
    given: Iterable[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Any:
    """``build(**settings)`` from the context ``get`` reads: the config file, the preset, then each
    setting. ``given`` lists every context key present, to refuse the ones that name no setting;
    ``overrides`` are settings given in code, above all the rest."""
    problems = Problems()
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}
    config = get("config")
    if config not in (None, ""):
        if isinstance(config, str):
            for key, value in read_config_file(config, definitions, problems).items():
                values[key], sources[key] = value, f"{config}: "
        else:
            problems.add("config", config, "must be the path of a .yaml, .yml or .json file")
    preset = get("preset")
    if preset not in (None, ""):
        for key, value in preset_settings(str(preset), problems).items():
            values[key], sources[key] = value, f"preset {preset}: "
    for name, definition in definitions.items():
        raw = get(name)
        if raw is not None and raw != "":
            values[name] = read(definition, raw, problems)
            sources.pop(name, None)
    if given is not None:
        unknown = [k for k in given if k not in definitions and k not in OWN_CONTEXT_KEYS and not is_cdk_key(k)]
        problems.add_all(unknown_problems(unknown, {k: get(k) for k in unknown}, definitions))
    for name, value in (overrides or {}).items():
        values[name] = value
        sources.pop(name, None)
    try:
        result = build(**values)
    except ServingConfigError as error:
        problems.add_all(_attributed(error.problems, sources))
        result = None
    problems.raise_if_any()
    return result


def _attributed(problems: Iterable[str], sources: Mapping[str, str]) -> list[str]:
    """Each problem, prefixed with where its setting's value came from when not from context."""
    result = []
    for text in problems:
        key = text.split(" ", 1)[0]
        result.append(sources.get(key, "") + text)
    return result
