"""cdk-neuron-serving: serve LLMs on AWS Inferentia2 and Trainium with data-parallel TGI or vLLM replicas.

Layers, each importing only those below it: ``plan`` (catalogs, planner; pure Python) ->
``render`` (boot scripts and router config from userdata/ templates; pure Python) -> ``cdk``
(constructs and the stack). The CDK names load on first use, so the planner and the
``neuron-serving`` CLI never start jsii's Node.js process.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .plan import (
    INSTANCES,
    MODELS,
    Constraints,
    ServingConfigError,
    ServingPlan,
    ServingRequest,
    Workload,
    degree_options,
    plan_serving,
    predict,
    recommend,
)
from .plan.host import HostSpec, resolve_host
from .render.boot_options import ReadinessSignal, WarmPoolHook
from .settings import StackSettings

if TYPE_CHECKING:
    from .cdk.artifact_cache import NeuronArtifactCache
    from .cdk.boot_script import NeuronBootScript
    from .cdk.builder import NeuronExportBuilder
    from .cdk.endpoint import NeuronServingEndpoint
    from .cdk.fleet import NeuronServingFleet
    from .cdk.instance import NeuronServingInstance, NeuronServingLaunchTemplate
    from .cdk.machine_image import PinnedLinuxImage, neuron_dlami
    from .cdk.monitoring import AlarmThresholds, NeuronServingMonitoring
    from .cdk.serving_ami import NeuronServingAmi
    from .cdk.stack import NeuronLlamaStack

_CDK_EXPORTS = {
    "NeuronArtifactCache": ".cdk.artifact_cache",
    "NeuronBootScript": ".cdk.boot_script",
    "NeuronExportBuilder": ".cdk.builder",
    "NeuronServingFleet": ".cdk.fleet",
    "NeuronServingMonitoring": ".cdk.monitoring",
    "AlarmThresholds": ".cdk.monitoring",
    "NeuronServingEndpoint": ".cdk.endpoint",
    "NeuronServingInstance": ".cdk.instance",
    "NeuronServingLaunchTemplate": ".cdk.instance",
    "PinnedLinuxImage": ".cdk.machine_image",
    "neuron_dlami": ".cdk.machine_image",
    "NeuronServingAmi": ".cdk.serving_ami",
    "NeuronLlamaStack": ".cdk.stack",
}


def __getattr__(name: str) -> Any:
    module = _CDK_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(module, __name__), name)


__all__ = [
    "INSTANCES",
    "MODELS",
    "AlarmThresholds",
    "Constraints",
    "HostSpec",
    "NeuronArtifactCache",
    "NeuronBootScript",
    "NeuronExportBuilder",
    "NeuronLlamaStack",
    "NeuronServingAmi",
    "NeuronServingEndpoint",
    "NeuronServingFleet",
    "NeuronServingInstance",
    "NeuronServingLaunchTemplate",
    "NeuronServingMonitoring",
    "PinnedLinuxImage",
    "ReadinessSignal",
    "ServingConfigError",
    "ServingPlan",
    "ServingRequest",
    "StackSettings",
    "WarmPoolHook",
    "Workload",
    "degree_options",
    "neuron_dlami",
    "plan_serving",
    "predict",
    "recommend",
    "resolve_host",
]
