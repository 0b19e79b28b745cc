"""Stack settings: each defined once (:class:`StackSettings`' fields), given in code, in context
(cdk.json or ``-c key=value``), by a preset or by an organisation's config file, and validated in
one pass."""

from .fields import Setting
from .limits import LOG_RETENTION_DAYS, RATE_LIMIT_RANGE
from .presets import PRESETS, Preset
from .stack_settings import (
    CONSTRAINT_KEYS,
    DEFAULT_INSTANCE_TYPE,
    DEFAULT_MODEL_ID,
    FLEET_KINDS,
    FLEET_ONLY_KEYS,
    OIDC_KEYS,
    SETTING_NAMES,
    SETTINGS,
    StackSettings,
    settings_docstring,
)

__all__ = [
    "CONSTRAINT_KEYS",
    "DEFAULT_INSTANCE_TYPE",
    "DEFAULT_MODEL_ID",
    "FLEET_KINDS",
    "FLEET_ONLY_KEYS",
    "LOG_RETENTION_DAYS",
    "OIDC_KEYS",
    "PRESETS",
    "RATE_LIMIT_RANGE",
    "SETTINGS",
    "SETTING_NAMES",
    "Preset",
    "Setting",
    "StackSettings",
    "settings_docstring",
]
