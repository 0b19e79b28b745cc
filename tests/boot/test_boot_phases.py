"""Boot progress on simulated hosts: the phases a boot reports as tags on its own instance
(``report-phase``, one ``aws ec2 create-tags`` each), read back from the calls of the hosts' `aws`. The real
AWS CLI's calls, landing on a moto instance, are in test_boot_real_aws.py."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bootsim import BOOT_LOG, CACHE, HOOK, MONITORING, SIGNAL, SMALL_MODEL, Host, make_plan, write_export
from test_boot_render import embedded_files

from neuron_serving.plan.host import resolve_host
from neuron_serving.plan.metrics import DEFAULT_NAMESPACE
from neuron_serving.plan.phases import (
    BOOT_PHASE_METRIC,
    FAILED,
    PHASE_NAMES,
    PHASE_TAG,
    PHASE_TAGS,
    PHASES_FILE,
    READY,
    SECONDS_TAG,
    TAG_VALUE_LIMIT,
    WARMED,
    format_seconds,
    parse_seconds,
)
from neuron_serving.render.boot import EXPORT_MODEL, REPORT_PHASE, RUN_REPLICA
from neuron_serving.render.boot_options import BootOptions, reports_phases
from tests.harness.userdata import boot_of

MakeHost = Callable[..., Host]
SMALL = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
STEPS_BEFORE_EXPORT = ["check-devices", "install-tools", "pull-image"]
EXPORT_STEPS = [("export-model", ""), ("download-checkpoint", SMALL_MODEL), ("export-model", "compiling")]
"""What an export on the host reports: the step, the checkpoint's download, then the compiler's run."""


def phase_names(host: Host) -> list[str]:
    return [phase for phase, _ in host.phases()]


def test_every_step_the_boot_runs_is_a_phase_the_status_command_knows() -> None:
    # boot-steps.sh.j2 puts together one fragment of userdata/boot/ per step.
    fragments = (Path(__file__).resolve().parents[2] / "userdata" / "boot").glob("*.sh.j2")
    steps = [step for f in fragments for step in re.findall(r"^run_step (\S+)$", f.read_text(), re.MULTILINE)]
    assert len(steps) >= 10
    assert set(steps) <= set(PHASE_NAMES)


def test_a_signalled_boot_reports_each_step_then_each_replica_then_ready(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)))
    assert result.returncode == 0, result.stdout
    replicas = len(plan.replicas)
    assert host.phases() == [
        *((step, "") for step in STEPS_BEFORE_EXPORT),
        ("export-model", ""), ("download-checkpoint", plan.model_id), ("export-model", "compiling"),
        *((step, "") for step in ["start-replicas", "router", "wait-ready"]),
        *(("wait-ready", f"{n} of {replicas} ready") for n in range(1, replicas + 1)),
        (READY, f"{replicas} of {replicas} ready"),
    ]
    # The metadata step runs before host.env exists: logged, not reported.
    assert "report-phase: metadata not reported: no host.env yet" in host.path(BOOT_LOG).read_text()


def test_each_report_is_one_create_tags_call_on_the_instance_itself_with_the_four_keys(make_host: MakeHost) -> None:
    host = make_host(1)
    before = datetime.now(UTC).replace(microsecond=0)
    assert host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL))).returncode == 0
    calls = host.aws("ec2", "create-tags")
    assert calls
    for argv in calls:
        assert argv[argv.index("--region") + 1] == "us-east-2"
        assert argv[argv.index("--resources") + 1] == host.instance_id
        tags = json.loads(argv[argv.index("--tags") + 1])
        assert [t["Key"] for t in tags] == list(PHASE_TAGS)
        since = datetime.strptime(tags[1]["Value"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        assert before <= since <= datetime.now(UTC)


def test_the_export_becomes_download_export_once_the_cache_holds_it(make_host: MakeHost) -> None:
    first, second = make_host(1), make_host(1)
    script = boot_of(SMALL, BootOptions(artifact_cache=CACHE, signal=SIGNAL))
    assert first.boot(script).returncode == 0
    assert second.boot(script).returncode == 0, second.path(BOOT_LOG).read_text()
    assert "download-export" not in phase_names(first)
    [(_, source)] = [p for p in second.phases() if p[0] == "download-export"]
    assert source.startswith(f"{CACHE}/") and source.endswith(f"/{first.instance_id}/")
    names = phase_names(second)
    assert names.index("export-model") + 1 == names.index("download-export") < names.index("start-replicas")


def test_a_prebuilt_export_is_reported_as_downloaded_from_its_source(make_host: MakeHost) -> None:
    host = make_host(1)
    source = host.staging("llama")
    write_export(source, SMALL)
    host.publish_tree("s3://models/llama", source)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL), prebuilt_export="s3://models/llama"))
    assert result.returncode == 0, result.stdout
    assert ("download-export", "s3://models/llama/") in host.phases()


def test_a_failed_step_ends_in_failed_with_the_step_and_its_reason(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL)), STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    phase, detail = host.phases()[-1]
    assert (phase, detail) == (FAILED, "export-model: neuronx-cc: error: compilation failed")
    assert phase_names(host)[-2] == "export-model"
    # The status file keeps its format.
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed export-model\n"


def test_a_failure_without_a_signal_is_reported_too(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(artifact_cache=CACHE)), STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    assert host.phases()[-1][0] == FAILED
    assert host.phases()[-1][1].startswith("export-model: ")


def test_a_replica_that_never_serves_is_reported_failed_once_naming_it(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    stuck = plan.replicas[1]
    result = host.boot(boot_of(plan, BootOptions(signal=SIGNAL)),
                       STUB_NEVER_READY=str(stuck.port), NEURON_SERVING_READY_SECONDS="4")
    assert result.returncode != 0
    assert host.phases()[-2:] == [("wait-ready", f"1 of {len(plan.replicas)} ready"),
                                  (FAILED, f"wait-ready: replica-1 not ready in 4s port {stuck.port}")]


def test_a_refused_report_is_logged_and_the_boot_goes_on(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL)), STUB_TAGS_FAIL="1")
    assert result.returncode == 0, result.stdout
    assert host.path("/var/log/neuron-serving/status").read_text() == "done\n"
    log = host.path(BOOT_LOG).read_text()
    assert "UnauthorizedOperation" in log
    assert "report-phase: ready not reported (exit 254)" in log


def test_a_boot_without_a_readiness_check_never_claims_ready(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(artifact_cache=CACHE)))
    assert result.returncode == 0, result.stdout
    assert READY not in phase_names(host)
    assert host.phases()[-1] == ("router", "boot complete: readiness not checked")


def test_a_host_that_calls_no_aws_api_reports_nothing(make_host: MakeHost) -> None:
    assert not reports_phases(resolve_host(SMALL), BootOptions())
    host = make_host(1)
    script = boot_of(SMALL)
    assert not any("report-phase" in text for text in script.files.values())
    assert host.boot(script).returncode == 0
    assert host.calls("aws") == [] and not host.path(REPORT_PHASE).exists()


def test_the_detail_keeps_only_tag_characters_and_at_most_the_tag_value_limit(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL))).returncode == 0
    host.forget_calls()
    messy = "neuronx-cc: error; \"quoted\" {json}\n\tnext line é " + "x" * 215 + " " + "y" * 400
    assert host.run(REPORT_PHASE, FAILED, messy).returncode == 0
    [(phase, detail)] = host.phases()
    assert phase == FAILED
    assert detail.startswith("neuronx-cc: error quoted json next line xxx")
    assert len(detail) == TAG_VALUE_LIMIT - 1  # the last character, a space, goes
    assert re.fullmatch(r"[A-Za-z0-9 +\-=._:/@]*", detail)


def test_report_phase_only_logs_before_the_metadata_step(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL))).returncode == 0
    host.path("/etc/neuron-serving/host.env").unlink()
    host.forget_calls()
    result = host.run(REPORT_PHASE, READY)
    assert result.returncode == 0
    assert "report-phase: ready not reported: no host.env yet" in result.stderr
    assert host.calls("aws") == []


def test_a_warm_pool_host_ends_warmed_and_its_start_ends_ready(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    options = BootOptions(artifact_cache=CACHE, signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="Warmed:Stopped")
    assert result.returncode == 0, result.stdout
    assert phase_names(host)[-3:] == ["start-replicas", "router", WARMED]
    # Reported before the lifecycle action completes: the group then stops the instance.
    entries = host.entries()
    warmed = next(i for i, (cmd, argv) in enumerate(entries) if cmd == "aws" and WARMED in " ".join(argv))
    completed = next(i for i, (_, argv) in enumerate(entries)
                     if argv[:2] == ["autoscaling", "complete-lifecycle-action"])
    assert warmed < completed
    host.forget_calls()
    # The start from the pool: no user data, systemd starts the units and the ready service.
    for replica in plan.replicas:
        assert host.run(EXPORT_MODEL).returncode == 0
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    assert host.run_unit("neuron-serving-ready.service", STUB_LIFECYCLE_STATE="InService") == 0
    replicas = len(plan.replicas)
    assert host.phases() == [("wait-ready", f"{n} of {replicas} ready") for n in range(replicas + 1)] + [
        (READY, f"{replicas} of {replicas} ready")]


def test_a_warm_start_whose_replicas_never_serve_is_reported_failed(make_host: MakeHost) -> None:
    plan = make_plan("inf2.24xlarge", 4)
    host = make_host(6)
    options = BootOptions(artifact_cache=CACHE, signal=SIGNAL, warm_pool_hook=HOOK)
    assert host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="Warmed:Stopped").returncode == 0
    host.forget_calls()
    stuck = plan.replicas[0]
    assert host.run_unit("neuron-serving-ready.service", STUB_NEVER_READY=str(stuck.port),
                         NEURON_SERVING_READY_SECONDS="2") != 0
    # Parentheses are no tag characters.
    assert host.phases()[-1] == (FAILED, f"wait-ready: replica-0 not ready in 2s port {stuck.port}")
    assert host.aws("autoscaling", "complete-lifecycle-action") == []


def test_the_tag_keys_are_those_of_plan_phases() -> None:
    script = boot_of(SMALL, BootOptions(signal=SIGNAL))
    report = embedded_files(script)[REPORT_PHASE]
    for key in PHASE_TAGS:
        assert len(re.findall(rf"\s{re.escape(key)}\s", report)) == 1, key


# --- the phases' times: recorded on the host, tagged, put as metrics at the boot's end ------------------------------

def _summed(lines: list[tuple[str, str, str, int]]) -> dict[str, int]:
    seconds: dict[str, int] = {}
    for name, _, _, count in lines:
        seconds[name] = seconds.get(name, 0) + count
    return seconds


def test_the_host_records_each_phase_it_finished_from_its_start_to_the_next_ones(make_host: MakeHost) -> None:
    host = make_host(1)
    # The replica answers its third health check: wait-ready sleeps twice, a second each.
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL)), STUB_READY_AFTER="2", STUB_SLEEP_MAX="1")
    assert result.returncode == 0, result.stdout
    lines = host.phase_lines()
    assert [name for name, *_ in lines] == ["metadata", *STEPS_BEFORE_EXPORT, *(p for p, _ in EXPORT_STEPS),
                                            "start-replicas", "router", "wait-ready"]
    # Each phase ends when the next begins.
    assert all(a[2] == b[1] for a, b in itertools.pairwise(lines))
    assert all(a[1] <= a[2] for a in lines)
    assert lines[-1][3] >= 2
    # Nothing is left running once ready.
    assert not host.path(f"{PHASES_FILE}.running").exists()
    # The tag says the same, each phase's times added up, updated with every report.
    reports = host.tag_reports()
    assert reports[-1][PHASE_TAG] == READY
    assert reports[-1][SECONDS_TAG] == format_seconds(_summed(lines))
    assert [list(parse_seconds(r[SECONDS_TAG])) for r in reports[:2]] == [["metadata"], ["metadata", "check-devices"]]


def test_a_boot_without_monitoring_puts_no_metric(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL))).returncode == 0
    assert host.phase_lines() and host.metric_data() == []


def _data(lines: list[tuple[str, str, str, int]]) -> list[dict[str, object]]:
    """The metric data that report ``lines``, as PutMetricData takes them: one per phase, its seconds
    added up (export-model is entered twice), timed when it last ended."""
    ends = {name: end for name, _, end, _ in lines}
    return [{"MetricName": BOOT_PHASE_METRIC, "Unit": "Seconds", "Value": seconds, "Timestamp": ends[name],
             "Dimensions": [{"Name": "Service", "Value": MONITORING.service}, {"Name": "Phase", "Value": name}]}
            for name, seconds in _summed(lines).items()]


def test_a_monitored_boot_puts_every_phase_as_a_metric_once_it_is_ready(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL, monitoring=MONITORING)))
    assert result.returncode == 0, result.stdout
    assert host.metric_data() == [(DEFAULT_NAMESPACE, _data(host.phase_lines()))]
    [put] = host.aws("cloudwatch", "put-metric-data")
    assert put[put.index("--region") + 1] == "us-east-2"
    # After the ready report, before the signal.
    calls = host.calls("aws")
    ready = max(i for i, argv in enumerate(calls) if argv[:2] == ["ec2", "create-tags"])
    assert ready < calls.index(put) < next(i for i, argv in enumerate(calls) if "signal-resource" in argv)


def test_a_refused_metric_is_logged_and_the_boot_goes_on(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL, monitoring=MONITORING)), STUB_METRICS_FAIL="1")
    assert result.returncode == 0, result.stdout
    assert host.path("/var/log/neuron-serving/status").read_text() == "done\n"
    assert "report-phase: the boot's phase times not put as metrics (exit 254)" in host.path(BOOT_LOG).read_text()
    assert [s[:2] for s in host.aws("cloudformation", "signal-resource")] == [["cloudformation", "signal-resource"]]


def test_a_failed_boot_puts_the_phases_it_went_through_with_the_failed_one(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL, monitoring=MONITORING)), STUB_EXPORT_FAIL="1")
    assert result.returncode != 0
    lines = host.phase_lines()
    assert [name for name, *_ in lines][-3:] == [p for p, _ in EXPORT_STEPS]
    assert host.metric_data() == [(DEFAULT_NAMESPACE, _data(lines))]


def test_a_boot_that_checks_no_readiness_ends_its_last_phase_when_it_ends(make_host: MakeHost) -> None:
    host = make_host(1)
    result = host.boot(boot_of(SMALL, BootOptions(artifact_cache=CACHE, monitoring=MONITORING)))
    assert result.returncode == 0, result.stdout
    lines = host.phase_lines()
    assert lines[-1][0] == "router"
    # The end tags the phases' seconds alone: the phase stays router.
    assert host.tag_reports()[-1] == {SECONDS_TAG: format_seconds(_summed(lines))}
    assert host.phases()[-1] == ("router", "boot complete: readiness not checked")
    assert host.metric_data() == [(DEFAULT_NAMESPACE, _data(lines))]


def test_a_warm_pool_host_puts_its_times_before_it_stops_and_its_wait_after_its_start(make_host: MakeHost) -> None:
    host = make_host(1)
    options = BootOptions(signal=SIGNAL, warm_pool_hook=HOOK, monitoring=MONITORING)
    assert host.boot(boot_of(SMALL, options), STUB_LIFECYCLE_STATE="Warmed:Stopped").returncode == 0
    prepared = host.phase_lines()
    assert prepared[-1][0] == "router"
    assert host.metric_data() == [(DEFAULT_NAMESPACE, _data(prepared))]
    calls = host.calls("aws")
    put = next(i for i, argv in enumerate(calls) if argv[:2] == ["cloudwatch", "put-metric-data"])
    assert put < next(i for i, argv in enumerate(calls) if argv[:2] == ["autoscaling", "complete-lifecycle-action"])
    host.forget_calls()
    for replica in SMALL.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
    assert host.run_unit("neuron-serving-ready.service", STUB_LIFECYCLE_STATE="InService") == 0
    lines = host.phase_lines()
    assert lines[:-1] == prepared and lines[-1][0] == "wait-ready"
    assert host.metric_data() == [(DEFAULT_NAMESPACE, _data(lines[-1:]))]
    # The tag keeps the prepared phases' times beside the wait's.
    assert host.tag_reports()[-1][SECONDS_TAG] == format_seconds(_summed(lines))


def test_a_phase_begun_before_the_instance_restarted_is_not_measured(make_host: MakeHost) -> None:
    host = make_host(1)
    assert host.boot(boot_of(SMALL, BootOptions(signal=SIGNAL))).returncode == 0
    before = host.phase_lines()
    host.path(f"{PHASES_FILE}.running").write_text("wait-ready\t2026-01-01T00:00:00Z\t100\tanother-boot-id\n")
    assert host.run(REPORT_PHASE, READY).returncode == 0
    assert host.phase_lines() == before
    assert not host.path(f"{PHASES_FILE}.running").exists()
