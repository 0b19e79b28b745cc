"""The host's spec is resolved once per synth: the engine looked up once, the image resolved once,
and everything downstream (boot script, builder, router, monitoring, outputs) reads the spec."""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stack
from aws_cdk.assertions import Template

import neuron_serving.plan.host as host_module
from neuron_serving import (
    NeuronBootScript,
    NeuronExportBuilder,
    ServingConfigError,
    ServingRequest,
    plan_serving,
    resolve_host,
)
from neuron_serving.plan.engines import Engine
from neuron_serving.plan.layout import builder_plan

from .conftest import SNAPSHOT_CONFIGS, synthesize

PACKAGE = Path(__file__).resolve().parents[2] / "constructs" / "neuron_serving"


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts, from here on, each engine lookup by name (``plan.engines.engine``, which the host spec
    uses), each image resolution (``Engine.image``) and each check that an image serves a plan."""
    counts: Counter[str] = Counter()

    def counting(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return function(*args, **kwargs)
        return counted

    monkeypatch.setattr(host_module, "find_engine", counting("find_engine", host_module.find_engine))
    monkeypatch.setattr(Engine, "image", counting("image", Engine.image))
    monkeypatch.setattr(Engine, "check_serves", counting("check_serves", Engine.check_serves))
    yield counts


@pytest.mark.parametrize("config", ["default", "vllm_fleet_trn1", "builder"])
def test_a_synth_looks_the_engine_up_and_resolves_the_image_once(
        resolutions: Counter[str], config: str) -> None:
    context = {"instance_type": "inf2.xlarge"} if config == "builder" else SNAPSHOT_CONFIGS[config]
    stack = synthesize(context).stack
    # The settings look the engine up by name (the engine setting's check) and resolve the image once;
    # the spec takes both as found, so its own lookup by name never runs.
    assert resolutions == {"image": 1, "check_serves": 1}, resolutions
    spec = stack.boot_script.spec
    assert stack.boot_script.engine is spec.engine and stack.boot_script.serving_image is spec.image
    if config == "builder":
        assert stack.export_builder is not None
        assert stack.export_builder.boot_script.spec.image is spec.image


def test_a_boot_script_alone_resolves_its_default_spec_once(resolutions: Counter[str]) -> None:
    plan = plan_serving(ServingRequest("llama-3.2-1b", "inf2.xlarge"))
    NeuronBootScript(Stack(App(), "Own"), "Boot", plan=plan)
    assert resolutions == {"find_engine": 1, "image": 1, "check_serves": 1}


def test_a_builder_alone_derives_its_spec_from_the_hosts(resolutions: Counter[str]) -> None:
    from aws_cdk import aws_ec2 as ec2

    from neuron_serving import NeuronArtifactCache, neuron_dlami

    plan = plan_serving(ServingRequest("meta-llama/Llama-3.1-8B-Instruct", "inf2.xlarge", tensor_parallel=2))
    spec = resolve_host(plan, engine="vllm", model_revision="v1", export_role="wait")
    resolutions.clear()
    stack = Stack(App(), "Own")
    vpc = ec2.Vpc(stack, "Vpc", restrict_default_security_group=False)
    builder = NeuronExportBuilder(stack, "Builder", vpc=vpc, plan=builder_plan(plan, "inf2.8xlarge"),
                                  artifact_cache=NeuronArtifactCache(stack, "Cache"),
                                  machine_image=neuron_dlami("/p"), spec=spec)
    assert resolutions == {}
    assert builder.boot_script.spec.export_role == "build"
    assert (builder.boot_script.spec.engine, builder.boot_script.spec.image) == (spec.engine, spec.image)
    assert builder.boot_script.spec.model_revision == "v1"
    Template.from_stack(stack).has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"MaxSize": "1"})


def _name_lookups(path: Path) -> list[str]:
    """What in ``path`` turns an engine's name into an engine: ``ENGINES.get``/``ENGINES[...]`` and
    imports of ``plan.engines.engine``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("engines"):
            found += [f"import {a.name}" for a in node.names if a.name == "engine"]
        elif isinstance(node, ast.Attribute) and node.attr == "get" and getattr(node.value, "id", None) == "ENGINES":
            found.append("ENGINES.get")
        elif isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "ENGINES":
            found.append(f"ENGINES[{ast.unparse(node.slice)}]")
    return found


def test_only_the_settings_and_the_host_spec_look_an_engine_up_by_a_name_given() -> None:
    lookups = {str(p.relative_to(PACKAGE)): found for p in sorted(PACKAGE.rglob("*.py"))
               if (found := _name_lookups(p))}
    assert lookups == {
        # The lookup itself (find_engine).
        "plan/engines/__init__.py": ["ENGINES.get"],
        # The engine setting, once, as the settings check it.
        "settings/stack_settings.py": ["ENGINES.get"],
        # A spec made from a construct's props, not from settings.
        "plan/host.py": ["import engine"],
        # The CLI reads a deployed stack's Engine output.
        "ops/endpoint.py": ["import engine", "ENGINES[name]"],
        # neuron-serving plan --engine: the image whose optimum-neuron Hub cache is read.
        "ops/plan.py": ["import engine"],
        # The router and the monitoring used alone, without an engine: the default one, by its constant.
        "render/router.py": ["ENGINES[DEFAULT_ENGINE]"],
        "cdk/monitoring.py": ["ENGINES[DEFAULT_ENGINE]"],
    }, lookups


def test_pull_attempts_reach_the_hosts_and_the_builder_and_a_bad_count_is_named(
        resolutions: Counter[str]) -> None:
    stack = synthesize({"instance_type": "inf2.xlarge", "pull_attempts": "6"}).stack
    for boot in (stack.boot_script, stack.export_builder.boot_script):  # type: ignore[union-attr]
        assert boot.spec.pull_attempts == 6
        assert "for attempt in $(seq 6); do" in boot.boot.files["/opt/neuron-serving/bin/boot-steps"]
    with pytest.raises(ServingConfigError, match=r"pull_attempts \(7\) must be an integer from 1 to 6"):
        synthesize({"pull_attempts": "7"})
