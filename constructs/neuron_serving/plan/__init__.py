"""Pure planning: catalogs, the layout planner and the serving engines. Imports nothing from CDK."""

from .errors import ServingConfigError
from .instances import INSTANCES, InstanceSpec, instance_spec
from .layout import (
    DegreeOption,
    MemoryEstimate,
    Replica,
    ServingPlan,
    ServingRequest,
    degree_options,
    plan_serving,
)
from .models import MODELS, ModelSpec, resolve_model

__all__ = [
    "INSTANCES",
    "MODELS",
    "DegreeOption",
    "InstanceSpec",
    "MemoryEstimate",
    "ModelSpec",
    "Replica",
    "ServingConfigError",
    "ServingPlan",
    "ServingRequest",
    "degree_options",
    "instance_spec",
    "plan_serving",
    "resolve_model",
]
