"""``python -m benchmarks.boot_overhead [--runs N] [--output DIR]``: the boot's own overhead (issue 26).

The default stack (``NeuronLlamaStack`` with no context, synthesized as the twin tests synthesize it)
boots on the host twin (tests/twin/host.py: Ubuntu 22.04, systemd as PID 1, real cloud-init running
the user data) with every fake instant: ``docker pull`` answers at once and none fails (the recording
engine's defaults, tests/harness/dockerd.py: no pull failures), the export takes no time
(``STUB_EXPORT_SECONDS=0``, tests/boot/inside.py), the Hub and the artifact cache are on loopback and
fail nothing, and a replica serves as soon as its container runs (tests/twin/images.py). What is
left is the boot's own cost: from cloud-init's start to the SUCCESS signal.

- cloud-init's start: the time of its first line for the ``init-local`` stage in
  ``/var/log/cloud-init.log`` ("Cloud-init v. 26.1 running 'init-local' at ..."), which is what
  ``cloud-init analyze`` takes as the stage's start. cloud-init writes these times in UTC
  (cloudinit/log/loggers.py, ``configure_root_logger``: ``logging.Formatter.converter =
  time.gmtime``; the format ``%(asctime)s - %(filename)s[%(levelname)s]: %(message)s`` is
  /etc/cloud/cloud.cfg.d/05_logging.cfg; both read in the twin's cloud-init 26.1 rootfs).
- the signal: when the recorder took the SignalResource call (``Call.received``, tests/harness/aws.py),
  on the same clock: the twin's kernel is the host's.

The split: cloud-init's own stages until it runs the user data (its ``start:
modules-final/config-scripts_user`` event, the user data's scripts module), then the user data
until the bundle's first step (reading the stack's values, downloading and checking the bundle), then
each ``step:`` line of ``/var/log/neuron-serving/boot.log`` (``date -u +%FT%TZ``, whole seconds:
userdata/boot-steps.sh.j2 ``log``) until the next, the last until the signal. When the host
records ``/var/log/neuron-serving/phases.tsv`` (phase, start, end, seconds), its phases are shown too.

Each run's inputs (the two logs, phases.tsv, the signal's time, ``cloud-init analyze blame``) are kept
in ``--output`` (default ``benchmarks/results/boot-overhead``) with ``figures.json``. The twin needs
root, as the twin tests do; runs go one after another (the machine has 2 cores). Not run by pytest:
tests/benchmarks/test_boot_overhead.py checks the parsing and the report on a recorded run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LIMIT = 60.0
"""Issue 26: the boot's own overhead on the twin, cloud-init's start to the SUCCESS signal, for the
default stack, at most this many seconds."""

DEFAULT_OUTPUT = Path(__file__).parent / "results" / "boot-overhead"

CLOUD_INIT_LOG = "/var/log/cloud-init.log"
BOOT_LOG = "/var/log/neuron-serving/boot.log"
PHASES = "/var/log/neuron-serving/phases.tsv"

_CLOUD_INIT_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - (.*)$")
_STAGE = re.compile(r"Cloud-init v\. \S+ running '([^']+)' at ")
_SCRIPTS_USER = "start: modules-final/config-scripts_user"
_STEP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ) neuron-serving: step: (\S+)$")
# journalctl -o short-iso-precise: "2026-11-27T09:00:12.345678+00:00 host unit[pid]: message"
# (journalctl(1), --output); the message is the fake replica's own (tests/twin/images.py, emit).
_SERVING = re.compile(r"^(\S+) \S+ [^:]+: (replica-\d+): serving on port \d+$")


@dataclass(frozen=True)
class Segment:
    """One part of the overhead: from ``start`` until the next part's start."""

    name: str
    start: dt.datetime
    seconds: float


@dataclass(frozen=True)
class Phase:
    """One row of phases.tsv: a boot phase the host finished and its seconds, as it recorded them."""

    name: str
    seconds: float


@dataclass(frozen=True)
class BootRun:
    """What one boot recorded: cloud-init's stages and the user data's start, the boot script's steps,
    the signal, and the host's phases if it records them."""

    stages: list[tuple[str, dt.datetime]]
    """cloud-init's stages (``init-local``, ``init``, ``modules:config``, ``modules:final``) as they began."""
    user_data: dt.datetime | None
    """When cloud-init began running the user data (its scripts_user module)."""
    steps: list[tuple[str, dt.datetime]]
    signal: dt.datetime
    status: str
    phases: list[Phase] = field(default_factory=list)
    serving: dict[str, dt.datetime] = field(default_factory=dict)
    """When each replica's fake began serving (the twin's journal), if known."""

    @property
    def start(self) -> dt.datetime:
        """cloud-init's start: its ``init-local`` stage."""
        return self.stages[0][1]

    @property
    def overhead(self) -> float:
        """Seconds from cloud-init's start to the signal."""
        return (self.signal - self.start).total_seconds()

    def segments(self) -> list[Segment]:
        """The overhead split at the user data's start and each step, adding up to :attr:`overhead`."""
        marks = [("cloud-init until the user data", self.start)]
        if self.user_data is not None:
            marks.append(("user data until the first step (stack values, bundle)", self.user_data))
        marks += [(f"step {name}", at) for name, at in self.steps]
        ends = [at for _, at in marks[1:]] + [self.signal]
        return [Segment(name, at, (end - at).total_seconds()) for (name, at), end in zip(marks, ends, strict=True)]


def cloud_init_marks(log: str) -> tuple[list[tuple[str, dt.datetime]], dt.datetime | None]:
    """cloud-init's stages, each at its first "running" line, and the start of its scripts_user module,
    from /var/log/cloud-init.log. Of several boots (a reboot appends), the first."""
    stages: list[tuple[str, dt.datetime]] = []
    user_data = None
    for line in log.splitlines():
        found = _CLOUD_INIT_LINE.match(line)
        if not found:
            continue
        at = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.UTC)
        stage = _STAGE.search(found.group(2))
        if stage and stage.group(1) not in {name for name, _ in stages}:
            stages.append((stage.group(1), at))
        elif _SCRIPTS_USER in found.group(2) and user_data is None:
            user_data = at
    if not stages or stages[0][0] != "init-local":
        raise ValueError(f"no init-local stage in {CLOUD_INIT_LOG}: {[name for name, _ in stages]}")
    return stages, user_data


def boot_steps(log: str) -> list[tuple[str, dt.datetime]]:
    """Each ``step:`` line of boot.log: the step and when it began."""
    return [(m.group(2), dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC))
            for m in map(_STEP.match, log.splitlines()) if m]


def serving(journal: str) -> dict[str, dt.datetime]:
    """When each replica first said it serves, from the twin's journal."""
    found: dict[str, dt.datetime] = {}
    for m in map(_SERVING.match, journal.splitlines()):
        if m and m.group(2) not in found:
            found[m.group(2)] = dt.datetime.fromisoformat(m.group(1))
    return found


def phases(tsv: str) -> list[Phase]:
    """phases.tsv's rows: phase, start, end, seconds (tab-separated)."""
    rows = [line.split("\t") for line in tsv.splitlines() if line.strip()]
    return [Phase(row[0], float(row[3])) for row in rows if len(row) >= 4]


def parse(inputs: dict[str, Any]) -> BootRun:
    """A run from its recorded inputs (:func:`boot_once`'s): the two logs, phases.tsv (may be empty) and
    the signal's status and time (seconds since the epoch)."""
    stages, user_data = cloud_init_marks(inputs["cloud_init_log"])
    return BootRun(stages, user_data, boot_steps(inputs["boot_log"]),
                   dt.datetime.fromtimestamp(inputs["signal"]["received"], dt.UTC), inputs["signal"]["status"],
                   phases(inputs.get("phases_tsv") or ""), serving(inputs.get("journal") or ""))


def figures(runs: Sequence[BootRun]) -> dict[str, Any]:
    """Each run's overhead and split, the median overhead and the target's verdict."""
    median = statistics.median(r.overhead for r in runs)
    return {
        "limit_seconds": LIMIT,
        "median_seconds": round(median, 1),
        "verdict": "PASS" if median <= LIMIT and all(r.status == "SUCCESS" for r in runs) else "FAIL",
        "runs": [{
            "status": r.status,
            "overhead_seconds": round(r.overhead, 1),
            "segments": [{"name": s.name, "seconds": round(s.seconds, 1)} for s in r.segments()],
            "cloud_init_stages": {name: round((at - r.start).total_seconds(), 1) for name, at in r.stages},
            "phases": [{"name": p.name, "seconds": p.seconds} for p in r.phases],
            "all_serving_before_signal_seconds": (round((r.signal - max(r.serving.values())).total_seconds(), 1)
                                                  if r.serving else None),
        } for r in runs],
    }


def report(data: dict[str, Any]) -> str:
    """The figures as text: each run, its split, the median and PASS or FAIL."""
    lines = []
    for n, run in enumerate(data["runs"], 1):
        lines.append(f"run {n}: {run['overhead_seconds']:.1f} s from cloud-init's start to the "
                     f"{run['status']} signal")
        stages = ", ".join(f"{name} +{s:.1f}" for name, s in run["cloud_init_stages"].items())
        lines.append(f"  cloud-init's stages (s after its start): {stages}")
        lines += [f"  {s['seconds']:6.1f} s  {s['name']}" for s in run["segments"]]
        if run["all_serving_before_signal_seconds"] is not None:
            lines.append(f"  every replica was serving {run['all_serving_before_signal_seconds']:.1f} s "
                         "before the signal")
        if run["phases"]:
            lines.append("  phases.tsv: " + ", ".join(f"{p['name']} {p['seconds']:g} s" for p in run["phases"]))
    lines.append(f"median of {len(data['runs'])}: {data['median_seconds']:.1f} s "
                 f"(target: at most {data['limit_seconds']:.0f} s): {data['verdict']}")
    return "\n".join(lines)


def boot_once(workdir: Path) -> dict[str, Any]:
    """One boot of the default stack on the twin with every fake instant; its recorded inputs."""
    # The twin tests' own machinery; tests/boot on the path for test_boot_synthesized's bootsim, as
    # tests/twin/test_twin_boot.py puts it there.
    boot_tests = str(Path(__file__).resolve().parents[1] / "tests" / "boot")
    if boot_tests not in sys.path:
        sys.path.insert(0, boot_tests)
    from tests.boot.test_boot_synthesized import user_data
    from tests.harness.aws import MOTO_SERVICES, AwsEmulator
    from tests.harness.fake_hub import FakeHub
    from tests.twin.cleanup import on_signal, on_signals, reap
    from tests.twin.conftest import REGION, World, failure_report
    from tests.twin.netns import NetNs
    from tests.twin.rootfs import rootfs
    from tests.twin.test_twin_boot import stage

    launch, _, plan = user_data({})
    workdir.mkdir(parents=True, exist_ok=True)
    reap()
    # The name tests/twin/cleanup.py's reap recognizes (twin<pid>-<n>), should this process be killed.
    netns = NetNs(f"twin{os.getpid()}-{workdir.name}").create()
    with on_signals():
        try:
            with on_signal(netns.delete), netns.entered():
                aws = AwsEmulator(workdir / "aws", region=REGION, moto_services=(*MOTO_SERVICES, "ec2")).start()
                world = World(workdir, netns, rootfs(), aws, FakeHub().start())
                try:
                    with on_signal(world.kill):
                        stage(world, launch)
                        twin, _, image = world.twin(launch.script, plan)
                        image.knobs["STUB_EXPORT_SECONDS"] = "0"
                        twin.start()
                        status = twin.wait_boot_script(timeout=600)
                        if status != "done":
                            raise RuntimeError(f"the boot ended {status!r}:\n{failure_report(twin)}")
                        [signal] = world.aws.recorder.calls("SignalResource")
                        blame = twin.run("cloud-init", "analyze", "blame").stdout
                        journal = twin.run("journalctl", "-o", "short-iso-precise", "--no-pager",
                                           "-u", "cloud-final.service", "-u", "neuron-replica@*").stdout
                        phases_file = twin.path(PHASES)
                        return {
                            "cloud_init_log": twin.path(CLOUD_INIT_LOG).read_text(errors="replace"),
                            "boot_log": twin.path(BOOT_LOG).read_text(errors="replace"),
                            "phases_tsv": phases_file.read_text() if phases_file.exists() else "",
                            "signal": {"status": signal.params["Status"], "received": signal.received},
                            "cloud_init_blame": blame,
                            "journal": journal,
                        }
                finally:
                    world.close()
        finally:
            netns.delete()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.boot_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, choices=range(1, 21), default=3, metavar="N",
                        help="boots, one after another (default: 3)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                        help=f"where each run's inputs and figures.json go (default: {DEFAULT_OUTPUT})")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in range(1, args.runs + 1):
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="boot-overhead-") as work:
            inputs = boot_once(Path(work) / str(n))
        (args.output / f"run{n}.json").write_text(json.dumps(inputs, indent=1) + "\n")
        runs.append(parse(inputs))
        print(f"run {n}: {runs[-1].overhead:.1f} s (the whole run {time.monotonic() - began:.0f} s)", flush=True)
    data = figures(runs)
    data["generated"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    (args.output / "figures.json").write_text(json.dumps(data, indent=2) + "\n")
    print(report(data))
    return 0 if data["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
