"""The boot overhead benchmark's reading of a boot (``python -m benchmarks.boot_overhead``), on a run it
recorded (samples/boot-overhead-run.json): the benchmark itself boots a twin three times and is not run
here."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.boot_overhead import LIMIT, BootRun, figures, parse, phases, report

SAMPLE = Path(__file__).parent / "samples" / "boot-overhead-run.json"

STEPS = ["metadata", "check-devices", "install-tools", "monitoring", "pull-image", "export-model",
         "start-replicas", "router", "wait-ready"]


@pytest.fixture
def inputs() -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(SAMPLE.read_text())
    return recorded


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def test_the_overhead_runs_from_cloud_inits_init_local_line_to_the_recorders_signal(inputs: dict[str, Any]) -> None:
    run = parse(inputs)
    assert run.start == at("2026-11-27 09:01:26.423")
    assert [name for name, _ in run.stages] == ["init-local", "init", "modules:config", "modules:final"]
    assert run.status == "SUCCESS"
    assert run.overhead == pytest.approx(inputs["signal"]["received"] - run.start.timestamp())
    assert run.overhead == pytest.approx(36.4, abs=0.05)


def test_the_split_follows_the_user_datas_start_and_each_step_and_adds_up_to_the_overhead(
        inputs: dict[str, Any]) -> None:
    run = parse(inputs)
    segments = run.segments()
    assert [s.name for s in segments] == ["cloud-init until the user data",
                                          "user data until the first step (stack values, bundle)",
                                          *(f"step {step}" for step in STEPS)]
    # cloud-init's scripts_user module began the user data.
    assert segments[1].start == at("2026-11-27 09:01:29.162")
    assert dict((s.name, s.seconds) for s in segments)["step export-model"] == 7.0
    assert sum(s.seconds for s in segments) == pytest.approx(run.overhead)


def test_the_replicas_serving_times_come_from_the_journal(inputs: dict[str, Any]) -> None:
    run = parse(inputs)
    assert sorted(run.serving) == [f"replica-{i}" for i in range(6)]
    assert run.serving["replica-5"] == at("2026-11-27 09:01:49.615962")


def test_phases_tsv_gives_each_phase_and_its_seconds() -> None:
    # The host's phases.tsv (branch issue26-boottime, userdata/report-phase.sh.j2): phase, start, end,
    # seconds, tab-separated.
    tsv = "metadata\t2026-11-27T09:01:31Z\t2026-11-27T09:01:31Z\t0\nexport-model\t2026-11-27T09:01:38Z\t" \
          "2026-11-27T09:01:45Z\t7\n"
    assert [(p.name, p.seconds) for p in phases(tsv)] == [("metadata", 0), ("export-model", 7)]


def test_the_report_gives_each_run_its_split_the_median_and_the_verdict(inputs: dict[str, Any]) -> None:
    run = parse(inputs)
    slower = dataclasses.replace(run, signal=run.start + dt.timedelta(seconds=LIMIT + 10))
    data = figures([run, run, slower])
    assert data["median_seconds"] == pytest.approx(36.4, abs=0.05)
    assert data["verdict"] == "PASS"
    text = report(data)
    assert text.count("from cloud-init's start to the SUCCESS signal") == 3
    assert "   7.0 s  step export-model" in text
    assert text.endswith("median of 3: 36.4 s (target: at most 60 s): PASS")


def test_a_median_over_the_limit_or_a_failed_boot_fails_the_target(inputs: dict[str, Any]) -> None:
    run = parse(inputs)
    slow = dataclasses.replace(run, signal=run.start + dt.timedelta(seconds=LIMIT + 0.5))
    failed: BootRun = dataclasses.replace(run, status="FAILURE")
    assert figures([slow, slow, run])["verdict"] == "FAIL"
    assert figures([run, run, failed])["verdict"] == "FAIL"


def test_a_log_without_cloud_inits_first_stage_is_refused(inputs: dict[str, Any]) -> None:
    inputs["cloud_init_log"] = "\n".join(line for line in inputs["cloud_init_log"].splitlines()
                                         if "'init-local'" not in line)
    with pytest.raises(ValueError, match="no init-local stage"):
        parse(inputs)
