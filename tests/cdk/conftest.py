"""Synthesize NeuronLlamaStack as `cdk synth` would: cdk.json's feature flags, context keys on
top, cdk-nag's AwsSolutions checks attached (an unacknowledged finding makes synthesis raise).
Each configuration is synthesized once per test session."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App, Stage, Validations
from aws_cdk.assertions import Template
from cdk_nag import AwsSolutionsChecks

from neuron_serving import NeuronLlamaStack, StackSettings

ROOT = Path(__file__).resolve().parents[2]
FEATURE_FLAGS = json.loads((ROOT / "cdk.json").read_text())["context"]

CERTIFICATE = "arn:aws:acm:us-east-1:111122223333:certificate/3f2a6c1e-8d4b-4e7a-9c2f-1b5d7e9a0c3d"

# The configurations whose templates are snapshotted and linted.
SNAPSHOT_CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "inf2_xlarge_one_replica": {"instance_type": "inf2.xlarge", "model_id": "meta-llama/Llama-3.2-1B-Instruct",
                                "hf_token_secret": "hf/token"},
    "trn1_32xlarge": {"instance_type": "trn1.32xlarge", "model_id": "meta-llama/Llama-3.1-8B-Instruct",
                      "tensor_parallel": "8", "batch_size": "32", "internet_facing": "true",
                      "allowed_cidrs": "203.0.113.0/24",
                      "certificate_arn": CERTIFICATE},
    "fleet": {"fleet": "asg", "min_capacity": "2", "max_capacity": "4"},
    "fleet_warm_pool_scheduled": {"fleet": "asg", "min_capacity": "1", "max_capacity": "3", "warm_pool": "true",
                                  "scale_down_schedule": "0 20 * * 1-5", "scale_up_schedule": "0 7 * * 1-5"},
    "fleet_capacity": {"fleet": "asg", "min_capacity": "1", "max_capacity": "3",
                       "instance_types": "inf2.24xlarge,inf2.8xlarge", "spot_percent": "50",
                       "capacity_reservations": "cr-0123456789abcdef0"},
    "vllm": {"engine": "vllm"},
    "nxdi": {"engine": "nxdi"},
    "vllm_fleet_trn1": {"engine": "vllm", "fleet": "asg", "min_capacity": "1", "max_capacity": "3",
                        "warm_pool": "true", "instance_type": "trn1.32xlarge",
                        "model_id": "meta-llama/Llama-3.1-8B-Instruct", "tensor_parallel": "8", "batch_size": "16"},
}

BLOCK = "cr-0123456789abcdef0"
RESERVATION_GROUP = "arn:aws:resource-groups:us-east-1:111122223333:group/neuron"
BLOCK_END = (dt.datetime.now(dt.UTC) + dt.timedelta(days=7)).replace(hour=11, minute=30, second=0, microsecond=0)
"""A Capacity Block's end a week ahead (settings refuse one that ends within the hour)."""

CAPACITY_CONFIGS: dict[str, dict[str, Any]] = {
    "capacity_block": {"fleet": "asg", "instance_type": "trn1.32xlarge", "model_id": "llama-3.1-8b",
                       "tensor_parallel": "8", "capacity_block": BLOCK, "capacity_block_zone": "us-east-1b",
                       "capacity_block_end": BLOCK_END.strftime("%Y-%m-%dT%H:%MZ"),
                       "availability_zones": "us-east-1a,us-east-1b"},
    "reservations_only": {"fleet": "asg", "capacity_reservation_preference": "capacity-reservations-only",
                          "capacity_reservations": f"{BLOCK},{RESERVATION_GROUP}"},
}
"""Where a fleet's hosts come from, beyond the snapshot set's fleet_capacity: linted and scanned, not
snapshotted (the block's end moves with the day)."""


class Synth:
    def __init__(self, stack: NeuronLlamaStack) -> None:
        self.stack = stack
        self.template = Template.from_stack(stack)
        self.json: dict[str, Any] = self.template.to_json()
        self.assembly = Path(Stage.of(stack).outdir)  # type: ignore[union-attr]
        """The cloud assembly, with the staged assets (``asset.<hash>``)."""

    def resources(self, resource_type: str) -> dict[str, Any]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == resource_type}

    def host_statements(self) -> list[dict[str, Any]]:
        """The statements of the host role's policies, in order."""
        return [s for p in self.resources("AWS::IAM::Policy").values()
                if any("Host" in r["Ref"] for r in p["Properties"]["Roles"])
                for s in p["Properties"]["PolicyDocument"]["Statement"]]

    def only(self, resource_type: str) -> dict[str, Any]:
        (resource,) = self.resources(resource_type).values()
        return resource["Properties"]


def synthesize(context: dict[str, Any]) -> Synth:
    app = App(context={**FEATURE_FLAGS, **context})
    stack = NeuronLlamaStack(app, "NeuronLlamaStack", settings=StackSettings.from_context(app.node.try_get_context))
    Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return Synth(stack)


_SYNTHESIZED: dict[str, Synth] = {}


def service_authorization_reference() -> dict[str, dict[str, Any]]:
    """Every service's actions (``"s3:GetObject"``) with their resource types and condition keys, in
    parliament 1.6.4's copy of AWS's Service Authorization Reference (``parliament/iam_definition.json``;
    a prefix some services share, such as ``ssmmessages``, merges them). The file is read, not
    imported: parliament's own module needs ``pkg_resources``, which setuptools 84 no longer has."""
    spec = importlib.util.find_spec("parliament")
    assert spec is not None and spec.submodule_search_locations is not None
    definitions = json.loads((Path(spec.submodule_search_locations[0]) / "iam_definition.json").read_text())
    return {f"{service['prefix']}:{p['privilege']}": p for service in definitions for p in service["privileges"]}


def synthesized(**context: Any) -> Synth:
    """``synthesize(context)``, once per configuration and test session (the boot tests boot
    some of the same templates). Callers only read the result."""
    key = json.dumps(context, sort_keys=True)
    if key not in _SYNTHESIZED:
        _SYNTHESIZED[key] = synthesize(context)
    return _SYNTHESIZED[key]


def assemblies() -> list[Path]:
    """The cloud assemblies of every configuration synthesized so far in this session."""
    return [synth.assembly for synth in _SYNTHESIZED.values()]


@pytest.fixture(scope="session")
def synth() -> Callable[..., Synth]:
    return synthesized
