"""A platform team's template: the organisation's defaults in one place, a stack per team built on
NeuronLlamaStack. Teams import ``llm_endpoint`` and choose only their model and layout."""

from __future__ import annotations

from typing import Any

from aws_cdk import Environment

from constructs import Construct
from neuron_serving import NeuronLlamaStack, StackSettings

ORGANISATION = StackSettings(
    # Every role under the team's path and boundary, every resource tagged, every alarm to on-call.
    permissions_boundary="ml-platform-boundary",
    role_path="/ml-platform/",
    tags={"cost-center": "4711", "owner": "ml-platform"},
    name_prefix="ml-",
    alarm_topic_arn="arn:aws:sns:us-east-1:111122223333:ml-on-call",
    log_retention_days=90,
    # The shared VPC, imported without a lookup so synthesis needs no credentials.
    vpc_id="vpc-0a1b2c3d4e5f60718",
    availability_zones=("us-east-1a", "us-east-1b"),
    private_subnet_ids=("subnet-0a1b2c3d4e5f60719", "subnet-0a1b2c3d4e5f6071a"),
    allowed_cidrs=("10.40.0.0/16",),
)
"""What every endpoint of the organisation shares; a team's settings override any of it."""

ENVIRONMENT = Environment(account="111122223333", region="us-east-1")


def llm_endpoint(scope: Construct, team: str, *, preset: str | None = None, **settings: Any) -> NeuronLlamaStack:
    """A team's endpoint: the organisation's settings, then the preset, then the team's own."""
    if preset is not None:
        chosen = StackSettings.from_preset(preset, **{**_organisation(), **settings})
    else:
        chosen = ORGANISATION.replace(**settings)
    return NeuronLlamaStack(scope, f"{team}-llm", settings=chosen, env=ENVIRONMENT,
                            description=f"{team}'s LLM endpoint (ml-platform template)")


def _organisation() -> dict[str, Any]:
    """The organisation's settings that differ from the library's defaults."""
    defaults = StackSettings()
    return {name: value for name, value in vars(ORGANISATION).items()
            if not name.startswith("_") and value != getattr(defaults, name)}
