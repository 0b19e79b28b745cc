"""Pure planning: catalogs, the layout planner, the performance model and the serving engines. Imports nothing
from CDK."""

from .errors import ServingConfigError
from .instances import DEVICES, INSTANCES, DeviceSpec, InstanceSpec, instance_spec
from .layout import (
    DegreeOption,
    MemoryEstimate,
    Replica,
    ServingPlan,
    ServingRequest,
    degree_options,
    layout_document,
    plan_serving,
    request_from_layout,
)
from .models import MODELS, ModelSpec, resolve_model
from .performance import (
    DEFAULT_WORKLOAD,
    OBJECTIVES,
    PUBLISHED,
    Constraints,
    InstanceComparison,
    Prediction,
    PublishedFigure,
    Recommendation,
    Workload,
    candidates,
    compare_instances,
    predict,
    prediction_document,
    recommend,
)

__all__ = [
    "DEFAULT_WORKLOAD",
    "DEVICES",
    "INSTANCES",
    "MODELS",
    "OBJECTIVES",
    "PUBLISHED",
    "Constraints",
    "DegreeOption",
    "DeviceSpec",
    "InstanceComparison",
    "InstanceSpec",
    "MemoryEstimate",
    "ModelSpec",
    "Prediction",
    "PublishedFigure",
    "Recommendation",
    "Replica",
    "ServingConfigError",
    "ServingPlan",
    "ServingRequest",
    "Workload",
    "candidates",
    "compare_instances",
    "degree_options",
    "instance_spec",
    "layout_document",
    "plan_serving",
    "predict",
    "prediction_document",
    "recommend",
    "request_from_layout",
    "resolve_model",
]
