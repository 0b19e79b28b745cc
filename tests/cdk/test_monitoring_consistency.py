"""No widget, alarm or scaling policy without a producer.

For every snapshot configuration, every metric the synthesized dashboard, alarms and scaling
policies reference in our namespace (namespace, name, dimension set, and the dimension values we
know at synth) must be produced by the host's real publisher, run with the configuration the
boot script renders for that stack, on the recorded neuron-monitor reports, the engine's
/metrics pages and the HAProxy page, by the host's report-phase when a boot ends, or by its
report-publish when a publish to the artifact cache fails. Metrics in
AWS namespaces must be ones the load balancer and Auto Scaling publish, with their dimensions.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from neuron_serving.plan.metrics import DEFAULT_NAMESPACE, EXPORT_PUBLISH_FAILURES, METRICS
from neuron_serving.plan.phases import MEASURED, PHASES_FILE, PUBLISH_FAILED, READY
from neuron_serving.render.boot import REPORT_PHASE, REPORT_PUBLISH
from neuron_serving.render.monitoring import render_publisher_config
from neuron_serving.userdata import api_keys

from .conftest import SNAPSHOT_CONFIGS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "monitor"))
from emf_spec import check_event, metrics_produced
from monitorsim import fixture_events

AWS_METRICS = {
    ("AWS/ApplicationELB", "RequestCount", ("LoadBalancer",)),
    ("AWS/ApplicationELB", "TargetResponseTime", ("LoadBalancer",)),
    ("AWS/ApplicationELB", "HTTPCode_Target_4XX_Count", ("LoadBalancer",)),
    ("AWS/ApplicationELB", "HTTPCode_Target_5XX_Count", ("LoadBalancer",)),
    ("AWS/ApplicationELB", "HTTPCode_ELB_5XX_Count", ("LoadBalancer",)),
    ("AWS/ApplicationELB", "HealthyHostCount", ("LoadBalancer", "TargetGroup")),
    ("AWS/ApplicationELB", "UnHealthyHostCount", ("LoadBalancer", "TargetGroup")),
    ("AWS/AutoScaling", "GroupDesiredCapacity", ("AutoScalingGroupName",)),
    ("AWS/AutoScaling", "GroupInServiceCapacity", ("AutoScalingGroupName",)),
    ("AWS/AutoScaling", "GroupPendingCapacity", ("AutoScalingGroupName",)),
    ("AWS/EC2CapacityReservations", "UsedInstanceCount", ("CapacityReservationId",)),
}
"""What AWS publishes that we use, with its dimensions (ALB and Auto Scaling documentation)."""

Reference = tuple[str, str, tuple[str, ...], tuple[tuple[str, str], ...]]
"""(namespace, metric, sorted dimension keys, the dimension values known at synth)."""

_SEARCH = re.compile(r"SEARCH\('\{([^}]*)\} MetricName=\"(\w+)\"((?: \w+=\"[^\"]*\")*)'")


def _literal(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _reference(namespace: str, name: str, dimensions: dict[str, Any]) -> Reference:
    known = tuple(sorted((k, v) for k, v in dimensions.items() if _literal(v) is not None))
    return namespace, name, tuple(sorted(dimensions)), known


def _dashboard_references(body: Any) -> set[Reference]:
    parts = body["Fn::Join"][1] if isinstance(body, dict) else [body]
    widgets = json.loads("".join(p if isinstance(p, str) else "<token>" for p in parts))["widgets"]
    refs: set[Reference] = set()
    for widget in widgets:
        for entry in widget["properties"].get("metrics", []):
            if isinstance(entry[0], dict):  # an expression
                for match in _SEARCH.finditer(entry[0]["expression"]):
                    namespace, *keys = match.group(1).split(",")
                    values = dict(re.findall(r'(\w+)="([^"]*)"', match.group(3)))
                    refs.add((namespace, match.group(2), tuple(sorted(keys)), tuple(sorted(values.items()))))
                continue
            fields = [f for f in entry if not isinstance(f, dict)]
            assert "." not in fields[:2], "shorthand metric arrays are not expected from CDK"
            namespace, name, *pairs = fields
            refs.add(_reference(namespace, name, dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return refs


def _alarm_references(properties: dict[str, Any]) -> set[Reference]:
    stats = [q["MetricStat"]["Metric"] for q in properties.get("Metrics", []) if "MetricStat" in q]
    if "MetricName" in properties:
        stats.append(properties)
    return {_reference(m["Namespace"], m["MetricName"], {d["Name"]: d["Value"] for d in m.get("Dimensions", [])})
            for m in stats}


def _references(template: dict[str, Any]) -> set[Reference]:
    refs: set[Reference] = set()
    for resource in template["Resources"].values():
        properties = resource.get("Properties", {})
        if resource["Type"] == "AWS::CloudWatch::Dashboard":
            refs |= _dashboard_references(properties["DashboardBody"])
        elif resource["Type"] == "AWS::CloudWatch::Alarm":
            refs |= _alarm_references(properties)
        elif resource["Type"] == "AWS::AutoScaling::ScalingPolicy":
            custom = properties.get("TargetTrackingConfiguration", {}).get("CustomizedMetricSpecification")
            if custom:
                refs |= _alarm_references(custom)
    return refs


def _sync_failure_events(namespace: str, service: str, tmp_path: Path) -> list[dict[str, Any]]:
    """What ``api-keys sync --metrics`` writes when a run fails: the real sync, in this process,
    against a secret that cannot be read (no AWS CLI on the empty PATH)."""
    path = tmp_path / "api-keys.emf"
    metrics = api_keys.Metrics(str(path), namespace, service, "i-0123456789abcdef0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", str(tmp_path))
        assert api_keys.sync("keys", "us-east-1", str(tmp_path / "keys"), str(tmp_path / "sock"), metrics) == 1
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(events) == 1
    return events


def _put_references(stack, tmp_path: Path, script_path: str, *args: str) -> set[Reference]:
    """What a host of this stack puts with its rendered ``script_path`` run with ``args`` under bash, with an
    ``aws`` that records its arguments (AWS's stand-in), on a record of every phase that takes minutes, as
    references with the dimension values it put."""
    root, bin_dir, calls = tmp_path / "host", tmp_path / "bin", tmp_path / "aws-calls"
    options = stack.boot_script.options.monitoring
    script = root / script_path.lstrip("/")
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(stack.boot_script.boot.files[script_path])
    env_dir = root / "etc" / "neuron-serving"
    env_dir.mkdir(parents=True, exist_ok=True)
    (env_dir / "host.env").write_text("REGION=us-east-1\nINSTANCE_ID=i-0123456789abcdef0\n")
    (env_dir / "stack.env").write_text(f"SERVICE={shlex.quote(options.service)}\n"
                                       f"METRICS_NAMESPACE={shlex.quote(options.namespace)}\n")
    record = root / PHASES_FILE.lstrip("/")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("".join(f"{p.name}\t2026-11-23T10:00:00Z\t2026-11-23T10:05:00Z\t300\n" for p in MEASURED))
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "aws").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                 f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bin_dir / "aws").chmod(0o755)
    calls.unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NEURON_SERVING_ROOT": str(root)}
    subprocess.run(["bash", str(script), *args], env=env, check=True)
    refs: set[Reference] = set()
    for argv in map(json.loads, calls.read_text().splitlines()):
        if argv[:2] == ["cloudwatch", "put-metric-data"]:
            namespace = argv[argv.index("--namespace") + 1]
            for datum in json.loads(argv[argv.index("--metric-data") + 1]):
                dims = {d["Name"]: d["Value"] for d in datum["Dimensions"]}
                refs.add(_reference(namespace, datum["MetricName"], dims))
    return refs


def _boot_phase_references(stack, tmp_path: Path) -> set[Reference]:
    """What report-phase puts when a boot ends."""
    return _put_references(stack, tmp_path, REPORT_PHASE, READY)


def _export_publish_references(stack, tmp_path: Path) -> set[Reference]:
    """What report-publish puts when a host's publish failed, on a stack whose hosts publish; else nothing."""
    if REPORT_PUBLISH not in stack.boot_script.boot.files:
        return set()
    return _put_references(stack, tmp_path, REPORT_PUBLISH, PUBLISH_FAILED, "An error occurred (AccessDenied)")


def _produced(stack, tmp_path: Path) -> set[Reference]:
    """What the host publisher writes for this stack, run on the recorded inputs (two rounds, so
    counters have deltas), what report-phase puts when a boot ends, what report-publish puts when a publish
    fails, and with API keys what a failed key sync writes, as references with the dimension values they
    wrote."""
    options, engine = stack.boot_script.options.monitoring, stack.boot_script.engine
    events = fixture_events(json.loads(render_publisher_config(stack.plan, engine, options)),
                            service=options.service, engine=engine)
    if stack.boot_script.options.api_keys_secret is not None:
        events += _sync_failure_events(options.namespace, options.service, tmp_path)
    produced = _boot_phase_references(stack, tmp_path) | _export_publish_references(stack, tmp_path)
    for namespace, name, keys in metrics_produced(events):
        for event in events:
            if name in event and all(k in event for k in keys):
                produced.add((namespace, name, keys, tuple(sorted((k, event[k]) for k in keys))))
    return produced


def _matches(ref: Reference, produced: set[Reference]) -> bool:
    namespace, name, keys, known = ref
    return any(p[:3] == (namespace, name, keys) and set(known) <= set(p[3]) for p in produced)


@pytest.mark.parametrize("config", list(SNAPSHOT_CONFIGS))
def test_every_dashboard_alarm_and_scaling_metric_has_a_producer(config, synth, tmp_path):
    template = synth(**SNAPSHOT_CONFIGS[config])
    refs = _references(template.json)
    ours = {r for r in refs if r[0] == DEFAULT_NAMESPACE}
    aws = {r[:3] for r in refs if r[0] != DEFAULT_NAMESPACE}
    produced = _produced(template.stack, tmp_path)
    unproduced = sorted(r for r in ours if not _matches(r, produced))
    assert unproduced == []
    assert aws <= AWS_METRICS, sorted(aws - AWS_METRICS)
    # The test looks at something: every row of the dashboard, and both AWS services for a fleet.
    assert {r[1] for r in ours} >= {"InFlightRequests", "TimePerOutputToken", "NeuronCoreUtilization",
                                    "ExecutionErrors", "EccUncorrectedEvents", "DiskUtilization", "BootPhaseSeconds"}
    if _export_publish_references(template.stack, tmp_path / "publish"):
        assert EXPORT_PUBLISH_FAILURES in {r[1] for r in ours}
    if template.stack.fleet is not None:
        assert ("AWS/AutoScaling", "GroupDesiredCapacity", ("AutoScalingGroupName",)) in aws


def test_the_dashboard_shows_every_metric_of_the_catalog(synth):
    shown = {r[1] for r in _references(synth(api_keys="true").json) if r[0] == DEFAULT_NAMESPACE}
    assert shown == {m.name for m in METRICS}


def test_the_failed_key_sync_is_an_emf_event_the_specification_accepts_and_it_says_why_but_not_the_secret(tmp_path):
    (event,) = _sync_failure_events(DEFAULT_NAMESPACE, "NeuronLlamaStack", tmp_path)
    check_event(event)
    assert metrics_produced([event]) == {(DEFAULT_NAMESPACE, api_keys.FAILURE_METRIC, ("Service",)),
                                         (DEFAULT_NAMESPACE, api_keys.FAILURE_METRIC, ("InstanceId", "Service"))}
    assert event[api_keys.FAILURE_METRIC] == 1
    assert event["Reason"] == "could not read secret keys: no AWS CLI (aws) on PATH; the keys in force are unchanged"


def test_a_widget_without_a_producer_is_caught():
    template = {"Resources": {"D": {"Type": "AWS::CloudWatch::Dashboard", "Properties": {"DashboardBody": json.dumps(
        {"widgets": [{"type": "metric", "properties": {"metrics": [
            [DEFAULT_NAMESPACE, "QueueSize", "Service", "NeuronLlamaStack", {"stat": "Sum"}],
            [DEFAULT_NAMESPACE, "QueueSize", "Service", "OtherStack"],
            [DEFAULT_NAMESPACE, "TokensPerDollar", "Service", "NeuronLlamaStack"],
            [{"expression": f"SEARCH('{{{DEFAULT_NAMESPACE},Service,Replica}} MetricName=\"BatchSize\"', "
                            "'Average', 60)"}],
        ]}}]})}}}}
    refs = _references(template)
    produced = {(DEFAULT_NAMESPACE, "QueueSize", ("Service",), (("Service", "NeuronLlamaStack"),))}
    assert sorted(r[1:3] for r in refs if not _matches(r, produced)) == [
        ("BatchSize", ("Replica", "Service")), ("QueueSize", ("Service",)), ("TokensPerDollar", ("Service",))]
