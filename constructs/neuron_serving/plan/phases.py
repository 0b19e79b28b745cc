"""The phases of a host's boot: what the host reports and what ``neuron-serving status`` reads.

A host reports each phase it enters as three tags on its own EC2 instance (CreateTags, which its
role may call on that instance only and for these keys only), so that the operator sees the boot
without logging in, with nothing but ec2:DescribeInstances:

- :data:`PHASE_TAG`: the phase's :attr:`Phase.name`;
- :data:`SINCE_TAG`: when the host entered it, UTC, ``YYYY-MM-DDTHH:MM:SSZ``;
- :data:`DETAIL_TAG`: words about it (``3 of 6 ready``; a failure's reason), possibly empty.

EC2 tag values hold at most :data:`TAG_VALUE_LIMIT` characters of letters, digits, spaces and
``+-=._:/@`` (EC2 user guide, "Tag restrictions"): the host drops any other character.

Each phase's estimate (:func:`phase_minutes`) comes from the stated ceilings of
:mod:`~neuron_serving.plan.timing`, so that ``status`` shows the same figures that size the
stack's timeouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import ServingPlan
from .timing import (
    DOWNLOAD_BASE_MINUTES,
    DOWNLOAD_MINUTES_PER_BILLION,
    EXPORT_BASE_MINUTES,
    EXPORT_MINUTES_PER_BILLION,
    PULL_MINUTES,
    ready_minutes,
)

TAG_PREFIX = "neuron-serving:"
PHASE_TAG = f"{TAG_PREFIX}phase"
SINCE_TAG = f"{TAG_PREFIX}phase-since"
DETAIL_TAG = f"{TAG_PREFIX}detail"
PHASE_TAGS = (PHASE_TAG, SINCE_TAG, DETAIL_TAG)
"""Every tag key a host writes: its role may write these and no other."""

TAG_VALUE_LIMIT = 256
"""EC2's limit on a tag value's length."""


@dataclass(frozen=True)
class Phase:
    """One phase of the boot.

    :param name: the value of :data:`PHASE_TAG` (a boot step's name, or a final state).
    :param title: what the operator is told the host is doing.
    :param estimate: the key of :func:`phase_minutes` that estimates it, or None for a phase
        that takes seconds.
    """

    name: str
    title: str
    estimate: str | None = None


READY = "ready"
FAILED = "failed"
WARMED = "warmed"

PHASES = (
    Phase("metadata", "reading the instance metadata"),
    Phase("check-devices", "checking the Neuron devices"),
    Phase("install-tools", "installing docker, the AWS CLI and HAProxy", "pull"),
    Phase("monitoring", "starting the CloudWatch agent and neuron-monitor"),
    Phase("hf-token", "reading the Hugging Face token"),
    Phase("pull-image", "pulling the serving image", "pull"),
    Phase("export-model", "exporting (compiling) the model", "export"),
    Phase("wait-export", "waiting for the builder instance's export in the artifact cache", "export"),
    Phase("download-export", "downloading the model's export", "download"),
    Phase("start-replicas", "starting the replicas"),
    Phase("api-keys", "loading the API keys"),
    Phase("router", "starting the router"),
    Phase("wait-ready", "loading the model onto the NeuronCores", "load"),
    Phase(WARMED, "prepared in the warm pool, stopped until the group needs it"),
    Phase(READY, "serving"),
    Phase(FAILED, "the boot failed"),
)
"""Every phase, in the order a boot goes through them (a host skips those it has no use for)."""

PHASE_NAMES = tuple(phase.name for phase in PHASES)


def find_phase(name: str) -> Phase | None:
    """The phase called ``name``, or None for a name this version does not know."""
    return next((phase for phase in PHASES if phase.name == name), None)


def phase_minutes(plan: ServingPlan, throughput: int) -> dict[str, int]:
    """Each estimate's minutes for ``plan``, by :attr:`Phase.estimate` key: ``pull`` (tools and
    image), ``export`` (compiling on the host), ``download`` (an export from the artifact cache or
    a prebuilt one) and ``load`` (reading the weights from a root volume of ``throughput`` MiB/s,
    onto the NeuronCores, and the engine's warm-up: ``wait-ready``'s limit)."""
    billions = plan.model.parameter_count / 1e9
    return {
        "pull": PULL_MINUTES,
        "export": math.ceil(EXPORT_BASE_MINUTES + EXPORT_MINUTES_PER_BILLION * billions),
        "download": math.ceil(DOWNLOAD_BASE_MINUTES + DOWNLOAD_MINUTES_PER_BILLION * billions),
        "load": ready_minutes(plan, throughput),
    }
