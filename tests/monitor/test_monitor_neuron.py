"""Neuron, router and host metrics: from the recorded neuron-monitor reports, the recorded HAProxy
page and the file system."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
from emf_spec import check_event, metric_values
from monitorsim import INSTANCE_ID, SERVICE, fixture, fixture_rounds, load_publisher, make_config, report

pm = load_publisher()

INSTANCE = {"Service": SERVICE, "InstanceId": INSTANCE_ID}
ERROR_TYPES = ("generic", "numerical", "transient", "model", "runtime", "hardware")


def replica(name: str) -> dict[str, str]:
    return {**INSTANCE, "Replica": name}


@pytest.fixture(scope="module")
def rounds() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return fixture_rounds(make_config())


def collect(pub: Any, neuron_report: Any = None, router: str | None = None,
            disk: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = pub.collect(neuron_report, {}, router, disk, 1_000)
    for event in events:
        check_event(event)
    return events


def publisher() -> Any:
    return pm.Publisher(make_config(), SERVICE, INSTANCE_ID)


def test_neuroncore_utilization_has_one_value_per_core_in_use(rounds: Any) -> None:
    first, second = rounds
    # Runtime 5120's counters report an error, and runtime 5121 did not answer: neither counts.
    assert metric_values(first, "NeuronCoreUtilization", **INSTANCE) == [71.5, 68.25, 55.0, 60.5]
    assert metric_values(second, "NeuronCoreUtilization", **INSTANCE) == [80.0, 77.75, 40.25, 42.0]
    assert metric_values(second, "NeuronCoreUtilization", Service=SERVICE) == [80.0, 77.75, 40.25, 42.0]


def test_device_memory_is_summed_over_runtimes(rounds: Any) -> None:
    first, second = rounds
    assert metric_values(first, "NeuronDeviceMemoryUsed", **INSTANCE) == [2 * 12519788544 + 1073741824]
    assert metric_values(second, "NeuronDeviceMemoryUsed", **INSTANCE) == [2 * 12519788544]


def test_execution_errors_are_summed_over_runtimes_for_each_type_zeros_included(rounds: Any) -> None:
    first, second = rounds
    per_type = {t: metric_values(first, "ExecutionErrors", **INSTANCE, ErrorType=t) for t in ERROR_TYPES}
    assert per_type == {"generic": [1], "numerical": [3], "transient": [2], "model": [1], "runtime": [1],
                        "hardware": [0]}
    per_type = {t: metric_values(second, "ExecutionErrors", Service=SERVICE, ErrorType=t) for t in ERROR_TYPES}
    assert per_type == {t: [1 if t == "transient" else 0] for t in ERROR_TYPES}


def test_execution_latency_is_published_per_replica_and_skipped_when_null(rounds: Any) -> None:
    first, second = rounds
    assert metric_values(first, "ExecutionLatency", **replica("replica-0")) == [0.0231]
    assert metric_values(first, "ExecutionLatencyP99", **replica("replica-0")) == [0.0412]
    # replica-1 executed nothing in the first period: its latency_stats are null.
    assert metric_values(first, "ExecutionLatency", **replica("replica-1")) == []
    assert metric_values(second, "ExecutionLatency", **replica("replica-1")) == [0.0301]
    assert metric_values(second, "ExecutionLatencyP99", **replica("replica-1")) == [0.0555]


def test_runtimes_that_are_not_replicas_publish_no_latency(rounds: Any) -> None:
    first, _ = rounds
    # Runtime 5120 (tagged by its PID) has latencies of 0.7 s: they belong to no replica.
    assert sorted(metric_values(first, "ExecutionLatency", Service=SERVICE)) == [0.0231]
    assert all(e.get("Replica") in ("replica-0", "replica-1") for e in first if "Replica" in e)


def test_ecc_events_are_deltas_summed_over_devices(rounds: Any) -> None:
    first, second = rounds
    assert metric_values(first, "EccCorrectedEvents", **INSTANCE) == []
    assert metric_values(second, "EccCorrectedEvents", **INSTANCE) == [5]
    assert metric_values(second, "EccUncorrectedEvents", **INSTANCE) == [1]


def test_host_metrics(rounds: Any) -> None:
    first, second = rounds
    assert metric_values(first, "CpuUtilization", **INSTANCE) == [60.64]
    assert metric_values(second, "CpuUtilization", **INSTANCE) == [54.5]
    assert metric_values(first, "MemoryUtilization", **INSTANCE) == [25]
    assert metric_values(second, "MemoryUtilization", **INSTANCE) == [26.0417]
    assert metric_values(first, "DiskUtilization", **INSTANCE) == [30]


def test_router_metrics_from_the_recorded_haproxy_page(rounds: Any) -> None:
    first, _ = rounds
    # Recorded with replica-2 down and four requests waiting for a free replica.
    assert metric_values(first, "RouterQueue", **INSTANCE) == [4]
    assert metric_values(first, "ReplicasUp", **INSTANCE) == [2]
    assert metric_values(first, "ReplicasUp", Service=SERVICE) == [2]


def test_a_router_page_without_our_backend_publishes_nothing_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    events = collect(publisher(), router=fixture("haproxy-metrics.txt").replace('proxy="replicas"', 'proxy="other"'))
    assert events == []
    assert "no backend 'replicas'" in capsys.readouterr().err


@pytest.mark.parametrize(("group", "gone"), [
    ("memory_info", "MemoryUtilization"),
    ("vcpu_usage", "CpuUtilization"),
])
def test_a_system_group_with_an_error_is_skipped(group: str, gone: str) -> None:
    broken = report("first")
    broken["system_data"][group]["error"] = "collection failed"
    events = collect(publisher(), broken)
    assert metric_values(events, gone, **INSTANCE) == []
    assert metric_values(events, "NeuronCoreUtilization", **INSTANCE) != []


def test_hardware_counters_with_an_error_are_skipped_and_leave_the_deltas_alone() -> None:
    pub = publisher()
    collect(pub, report("first"))
    broken = report("second")
    broken["system_data"]["neuron_hw_counters"]["error"] = "collection failed"
    assert metric_values(collect(pub, broken), "EccCorrectedEvents", **INSTANCE) == []
    assert metric_values(collect(pub, report("second")), "EccCorrectedEvents", **INSTANCE) == [5]


def test_ecc_counters_that_drop_were_reset_and_count_from_zero() -> None:
    pub = publisher()
    collect(pub, report("second"))
    assert metric_values(collect(pub, report("first")), "EccCorrectedEvents", **INSTANCE) == [5 + 2 + 1]


def test_runtime_groups_with_an_error_are_skipped() -> None:
    broken = report("first")
    runtime = broken["neuron_runtime_data"][0]["report"]
    runtime["execution_stats"]["error"] = "collection failed"
    runtime["memory_used"]["error"] = "collection failed"
    events = collect(publisher(), broken)
    assert metric_values(events, "ExecutionLatency", **replica("replica-0")) == []
    assert metric_values(events, "ExecutionErrors", **INSTANCE, ErrorType="transient") == [0]
    assert metric_values(events, "NeuronDeviceMemoryUsed", **INSTANCE) == [12519788544 + 1073741824]
    assert metric_values(events, "NeuronCoreUtilization", **INSTANCE) == [71.5, 68.25, 55.0, 60.5]


def test_a_runtime_with_an_error_is_skipped_entirely() -> None:
    broken = report("first")
    broken["neuron_runtime_data"][0]["error"] = "not responding"
    events = collect(publisher(), broken)
    assert metric_values(events, "NeuronCoreUtilization", **INSTANCE) == [55.0, 60.5]
    assert metric_values(events, "ExecutionLatency", **replica("replica-0")) == []


def test_with_no_runtime_running_memory_and_errors_are_zero() -> None:
    idle = report("first")
    idle["neuron_runtime_data"] = []
    events = collect(publisher(), idle)
    assert metric_values(events, "NeuronDeviceMemoryUsed", **INSTANCE) == [0]
    assert [metric_values(events, "ExecutionErrors", **INSTANCE, ErrorType=t) for t in ERROR_TYPES] == [[0]] * 6
    assert metric_values(events, "NeuronCoreUtilization", **INSTANCE) == []


def test_without_a_report_there_are_no_neuron_or_cpu_metrics_but_the_disk_is_measured() -> None:
    events = collect(publisher(), None, disk=(1, 3))
    assert [e for e in events if set(e) - {"_aws", "Service", "InstanceId"} != {"DiskUtilization"}] == []
    assert metric_values(events, "DiskUtilization", **INSTANCE) == [25]


def test_a_malformed_report_is_logged_and_the_rest_published(capsys: pytest.CaptureFixture[str]) -> None:
    broken = copy.deepcopy(report("first"))
    broken["neuron_runtime_data"] = "garbage"
    broken["system_data"]["vcpu_usage"]["average_usage"] = None
    events = collect(publisher(), broken, router=fixture("haproxy-metrics.txt"))
    assert metric_values(events, "MemoryUtilization", **INSTANCE) == [25]
    assert metric_values(events, "RouterQueue", **INSTANCE) == [4]
    assert metric_values(events, "NeuronCoreUtilization", **INSTANCE) == []
    err = capsys.readouterr().err
    assert "skipped neuron-monitor's runtime data" in err and "skipped neuron-monitor's vCPU usage" in err


def test_disk_usage_counts_used_and_available_like_df(tmp_path: Any) -> None:
    used, available = pm.disk_usage(str(tmp_path))
    st = os.statvfs(tmp_path)
    assert used == (st.f_blocks - st.f_bfree) * st.f_frsize
    assert available == st.f_bavail * st.f_frsize
    assert pm.disk_usage(str(tmp_path / "missing")) is None
