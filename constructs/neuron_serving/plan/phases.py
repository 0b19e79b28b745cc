"""The phases of a host's boot: what the host reports and what ``neuron-serving status`` reads.

A host reports each phase it enters as tags on its own EC2 instance (CreateTags, which its
role may call on that instance only and for these keys only), so that the operator sees the boot
without logging in, with nothing but ec2:DescribeInstances:

- :data:`PHASE_TAG`: the phase's :attr:`Phase.name`;
- :data:`SINCE_TAG`: when the host entered it, UTC, ``YYYY-MM-DDTHH:MM:SSZ``;
- :data:`DETAIL_TAG`: words about it (``3 of 6 ready``; a failure's reason), possibly empty;
- :data:`SECONDS_TAG`: how long each phase it has finished took, ``install-tools=41 pull-image=212``
  (:func:`format_seconds`, :func:`parse_seconds`).

The host measures each phase from its start to the start of the next (``/proc/uptime``, which no
clock adjustment moves), keeps them in :data:`PHASES_FILE`, and when its boot ends (:data:`ENDS`,
or the boot script's end) puts each phase it finished as the CloudWatch metric
:data:`BOOT_PHASE_METRIC` with the dimensions ``Service`` and :data:`PHASE_DIMENSION`.

EC2 tag values hold at most :data:`TAG_VALUE_LIMIT` characters of letters, digits, spaces and
``+-=._:/@`` (EC2 user guide, "Tag restrictions"): the host drops any other character.

Each phase's estimate (:func:`phase_minutes`) is a prediction of
:mod:`~neuron_serving.plan.time_to_serve`, the expected time, so that ``status`` tells a slow phase
from a normal one; the timeouts the stack waits for are the ceilings of
:mod:`~neuron_serving.plan.timing`, which stay above them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import ServingPlan
from .time_to_serve import time_to_serve

TAG_PREFIX = "neuron-serving:"
PHASE_TAG = f"{TAG_PREFIX}phase"
SINCE_TAG = f"{TAG_PREFIX}phase-since"
DETAIL_TAG = f"{TAG_PREFIX}detail"
SECONDS_TAG = f"{TAG_PREFIX}phase-seconds"
PHASE_TAGS = (PHASE_TAG, SINCE_TAG, DETAIL_TAG, SECONDS_TAG)
"""The tag keys of a phase report."""
PUBLISH_TAG = f"{TAG_PREFIX}export-publish"
"""What became of a host's publish of the export it compiled to the artifact cache, written once, after
the publish: :data:`PUBLISHED`, :data:`PUBLISH_RACED`, or :data:`PUBLISH_FAILED` with the reason
(``failed: <the AWS CLI's error>``). A separate tag, as the phase tags move on while the host serves."""
PUBLISHED = "published"
PUBLISH_RACED = "another host published first"
"""Not a failure: racing hosts publish one export (the conditional write of ``COMPLETE``), the others serve
their own."""
PUBLISH_FAILED = "failed"
"""The publish failed for another reason (refused, unreachable, a CLI error): the host serves its own
export, and every later host finds no export and compiles again."""
HOST_TAGS = (*PHASE_TAGS, PUBLISH_TAG)
"""Every tag key a host writes: its role may write these and no other."""

TAG_VALUE_LIMIT = 256
"""EC2's limit on a tag value's length."""

PHASES_FILE = "/var/log/neuron-serving/phases.tsv"
"""On the host, one line per finished phase: its name, start and end (UTC) and whole seconds, tab-separated."""

BOOT_PHASE_METRIC = "BootPhaseSeconds"
"""The CloudWatch metric of a finished phase's seconds, one value per host and phase."""
PHASE_DIMENSION = "Phase"
"""Its dimension beside ``Service``: the phase's :attr:`Phase.name`."""


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
DRAINING = "draining"
"""Not a boot's phase: a serving host that had a Spot interruption notice or a rebalance
recommendation (``userdata/watch_interruption.py``) and waits for its group to replace it."""

PHASES = (
    Phase("metadata", "reading the instance metadata"),
    Phase("check-devices", "checking the Neuron devices"),
    Phase("storage", "making the instance store's NVMe drives one volume for the exports"),
    Phase("install-tools", "installing docker, the AWS CLI and HAProxy", "install"),
    Phase("monitoring", "starting the CloudWatch agent and neuron-monitor"),
    Phase("hf-token", "reading the Hugging Face token"),
    Phase("pull-image", "pulling the serving image", "pull"),
    Phase("export-model", "exporting (compiling) the model", "compile"),
    Phase("download-checkpoint", "downloading the model's checkpoint to compile it", "checkpoint"),
    Phase("wait-export", "waiting for the builder instance's export in the artifact cache", "export"),
    Phase("download-export", "downloading the model's export", "download"),
    Phase("start-replicas", "starting the replicas"),
    Phase("api-keys", "loading the API keys"),
    Phase("router", "starting the router"),
    Phase("wait-ready", "loading the model onto the NeuronCores", "load"),
    Phase(WARMED, "prepared in the warm pool, stopped until the group needs it"),
    Phase(READY, "serving"),
    Phase(FAILED, "the boot failed"),
    Phase(DRAINING, "draining for a Spot interruption or its group's termination: no new requests from the "
          "load balancer, its group replaces it"),
)
"""Every phase, in the order a boot goes through them (a host skips those it has no use for), then
:data:`DRAINING`, which a serving host enters at the end of its life."""

PHASE_NAMES = tuple(phase.name for phase in PHASES)

ENDS = (READY, FAILED, WARMED)
"""The phases that end a boot: the host reports them and enters no other until its next start."""

MEASURED = tuple(phase for phase in PHASES if phase.estimate is not None)
"""The phases that take minutes, each with its estimate: the dashboard's."""


def find_phase(name: str) -> Phase | None:
    """The phase called ``name``, or None for a name this version does not know."""
    return next((phase for phase in PHASES if phase.name == name), None)


def format_seconds(seconds: dict[str, int]) -> str:
    """:data:`SECONDS_TAG`'s value for ``seconds`` (phase name to seconds): ``name=seconds`` pairs
    separated by spaces, as many as fit in :data:`TAG_VALUE_LIMIT` characters. The host writes it
    so (``userdata/report-phase.sh.j2``); tests use this to say what they expect."""
    value = ""
    for name, count in seconds.items():
        pair = f"{name}={count}"
        if len(value) + len(pair) + bool(value) > TAG_VALUE_LIMIT:
            break
        value += f" {pair}" if value else pair
    return value


def parse_seconds(value: str) -> dict[str, int]:
    """Each phase's seconds from a :data:`SECONDS_TAG` value, in its order; a pair that is not
    ``name=seconds`` is left out."""
    seconds: dict[str, int] = {}
    for pair in value.split():
        name, _, count = pair.partition("=")
        if name and count.isdigit():
            seconds[name] = int(count)
    return seconds


def phase_minutes(plan: ServingPlan, throughput: int) -> dict[str, int]:
    """Each phase's predicted minutes for ``plan`` on a root volume of ``throughput`` MiB/s
    (:func:`~neuron_serving.plan.time_to_serve.time_to_serve`), rounded up, by
    :attr:`Phase.estimate` key:

    - ``install``: installing docker, the AWS CLI and HAProxy;
    - ``pull``: pulling the serving image;
    - ``checkpoint``: downloading the checkpoint from the Hub (the first part of ``export``);
    - ``compile``: a full compile on the host (``export-model``, which the host enters again once
      it has the checkpoint);
    - ``compile-cached``: a compile that the public compile cache serves;
    - ``export``: the checkpoint and a full compile (a builder's, for ``wait-export``);
    - ``export-cached``: the checkpoint and a compile that the public compile cache serves;
    - ``download``: an export from the artifact cache;
    - ``load``: ``wait-ready``: reading the weights from the volume (a cold page cache, as after a
      warm-pool start), loading them onto the NeuronCores and warming up.

    ``status`` shows ``compile``, the longer of the two compiles: the host cannot tell which one it
    is in."""
    predicted = time_to_serve(plan, throughput)
    phases = predicted.phases

    def up(minutes: float) -> int:
        return math.ceil(round(minutes, 6))

    return {
        "install": up(phases["install"]),
        "pull": up(phases["pull"]),
        "checkpoint": up(phases["checkpoint"]),
        "compile": up(phases["compile"]),
        "compile-cached": up(phases["compile-cached"]),
        "export": up(phases["checkpoint"] + phases["compile"]),
        "export-cached": up(phases["checkpoint"] + phases["compile-cached"]),
        "download": up(phases["download"]),
        "load": up(predicted.warm_read + phases["load"] + phases["warm-up"]),
    }
