"""The serving engines, each behind :class:`Engine`: ``tgi`` (the default), ``vllm`` and ``nxdi``."""

from __future__ import annotations

from ..errors import ServingConfigError, problem
from .base import (
    CHECKPOINT_EXCLUDED,
    CHECKPOINT_FILES,
    DRAFT_DIR,
    DRAFT_FILES,
    KEY_FORMAT,
    MODEL_MOUNT,
    Engine,
    EngineProbe,
    ExportToolchain,
    MetricSource,
    ReadinessProbe,
    ReplicaMetrics,
    ServingImage,
    SmokeRequest,
    check_dlami_parameter,
)
from .nxdi import NXDI
from .tgi import TGI
from .vllm import VLLM

ENGINES: dict[str, Engine] = {e.name: e for e in (TGI, VLLM, NXDI)}
"""Every engine, by the value of the ``engine`` setting."""

DEFAULT_ENGINE = TGI.name
"""TGI: the engine users asked for."""


def engine(name: str) -> Engine:
    """The engine called ``name``. Raises :class:`ServingConfigError` naming ``engine``."""
    found = ENGINES.get(name) if isinstance(name, str) else None
    if found is None:
        raise ServingConfigError([problem("engine", name, f"must be one of {', '.join(ENGINES)}")])
    return found


def feature_problem(serving: Engine, feature: str) -> str | None:
    """Why ``serving`` cannot serve ``feature``, the name of one of :class:`Engine`'s flags (``prefix_caching``,
    ``speculative_decoding``), naming the engines that serve it; None when it can."""
    if getattr(serving, feature):
        return None
    servers = ", ".join(e.name for e in ENGINES.values() if getattr(e, feature))
    return f"is not served by engine {serving.name}; {'engine ' + servers if servers else 'no engine'} serves it"


def quantization_problem(serving: Engine, quantization: str | None) -> str | None:
    """Why ``serving`` cannot serve weights of ``quantization`` (``ServingRequest.quantization``;
    None for weights in their dtype), naming the engines that make it; None when it can."""
    if quantization is None or quantization in serving.quantizations:
        return None
    makers = ", ".join(e.name for e in ENGINES.values() if quantization in e.quantizations)
    return f"is not made by engine {serving.name}; {'engine ' + makers if makers else 'no engine'} makes it"


__all__ = [
    "CHECKPOINT_EXCLUDED",
    "CHECKPOINT_FILES",
    "DEFAULT_ENGINE",
    "DRAFT_DIR",
    "DRAFT_FILES",
    "ENGINES",
    "KEY_FORMAT",
    "MODEL_MOUNT",
    "Engine",
    "EngineProbe",
    "ExportToolchain",
    "MetricSource",
    "ReadinessProbe",
    "ReplicaMetrics",
    "ServingImage",
    "SmokeRequest",
    "check_dlami_parameter",
    "engine",
    "feature_problem",
    "quantization_problem",
]
