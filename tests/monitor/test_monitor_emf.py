"""The publisher's output against the EMF specification and the metric catalog, the EMF checker
itself, and the constraints of a script that ships in the user data."""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
from emf_spec import check_event, metric_units, metrics_produced, problems
from monitorsim import (
    INSTANCE_ID,
    PUBLISHER,
    SERVICE,
    catalog_metrics,
    fixture,
    fixture_events,
    fixture_rounds,
    load_publisher,
    make_config,
    report,
)

from neuron_serving.plan.metrics import DEFAULT_NAMESPACE, METRICS, PUBLISHER_SOURCES

pm = load_publisher()


@pytest.fixture(scope="module")
def events() -> list[dict[str, Any]]:
    return fixture_events(make_config())


def test_every_event_is_valid_emf(events: list[dict[str, Any]]) -> None:
    assert events
    for event in events:
        check_event(event)
        # Each event is one line of the log.
        assert "\n" not in json.dumps(event, separators=(",", ":"))


def test_every_catalog_metric_is_produced_with_exactly_its_dimension_sets(events: list[dict[str, Any]]) -> None:
    # The catalog's other metric is api-keys sync's own (tests/cdk/test_monitoring_consistency.py).
    expected = {(DEFAULT_NAMESPACE, m.name, tuple(sorted(s))) for m in METRICS if m.source in PUBLISHER_SOURCES
                for s in m.dimension_sets}
    assert metrics_produced(events) == expected


def test_every_metric_has_its_catalog_unit(events: list[dict[str, Any]]) -> None:
    assert metric_units(events) == {m.name: {m.unit} for m in METRICS if m.source in PUBLISHER_SOURCES}


def test_metrics_with_the_same_dimension_values_share_an_event() -> None:
    _, second = fixture_rounds(make_config())
    keys = [tuple(sorted((k, v) for k, v in e.items() if isinstance(v, str))) for e in second]
    instance = (("InstanceId", INSTANCE_ID), ("Service", SERVICE))
    assert keys.count(instance) == 1
    for kind in ("generic", "numerical", "transient", "model", "runtime", "hardware"):
        assert keys.count(tuple(sorted((*instance, ("ErrorType", kind))))) == 1
    # Per replica: one event, and one more for each further 100 histogram values.
    replica_events = [e for e in second if e.get("Replica") == "replica-0"]
    assert len(replica_events) == 2
    assert {"QueueSize", "Requests", "ExecutionLatency", "RequestDuration"} <= set(replica_events[0])
    assert set(replica_events[1]) == {"_aws", "Service", "InstanceId", "Replica", "RequestDuration",
                                      "QueueDuration", "TimePerOutputToken"}


def test_no_metric_outside_the_config_is_published() -> None:
    wanted = {"QueueSize", "CpuUtilization", "ExecutionErrors"}
    config = make_config(metrics={k: v for k, v in catalog_metrics().items() if k in wanted})
    produced = metrics_produced(fixture_events(config))
    assert {name for _, name, _ in produced} == wanted


def test_the_configs_units_and_dimension_sets_are_the_ones_published() -> None:
    config = make_config(metrics={"QueueSize": {"unit": "None", "dimensions": [["Service"]]},
                                  "ExecutionErrors": {"unit": "Count", "dimensions": [["Service", "ErrorType"]]}})
    events = fixture_events(config)
    assert metrics_produced(events) == {(DEFAULT_NAMESPACE, "QueueSize", ("Service",)),
                                        (DEFAULT_NAMESPACE, "ExecutionErrors", ("ErrorType", "Service"))}
    assert metric_units(events) == {"QueueSize": {"None"}, "ExecutionErrors": {"Count"}}


def test_a_dimension_set_the_metric_cannot_have_is_left_out() -> None:
    config = make_config(metrics={"CpuUtilization": {"unit": "Percent",
                                                     "dimensions": [["Service"], ["Service", "Replica"]]}})
    assert metrics_produced(fixture_events(config)) == {(DEFAULT_NAMESPACE, "CpuUtilization", ("Service",))}


def test_the_namespace_is_the_configs() -> None:
    config = make_config()
    config["namespace"] = "Team/Serving"
    assert {ns for ns, _, _ in metrics_produced(fixture_events(config))} == {"Team/Serving"}


def test_a_metric_without_a_unit_in_the_config_is_refused() -> None:
    with pytest.raises(LookupError):
        pm.Publisher(make_config(metrics={"QueueSize": {"dimensions": [["Service"]]}}), SERVICE, INSTANCE_ID)


def test_values_are_rounded_to_six_significant_digits_and_integers_kept_whole() -> None:
    assert pm._round(0.123456789) == 0.123457
    assert pm._round(26113318912.0) == 26113318912
    assert isinstance(pm._round(3.0), int)


VALID: dict[str, Any] = {
    "_aws": {"Timestamp": 1_700_000_000_000, "CloudWatchMetrics": [{
        "Namespace": "NeuronServing", "Dimensions": [["Service"], ["Service", "Replica"]],
        "Metrics": [{"Name": "QueueSize", "Unit": "Count"}, {"Name": "RequestDuration", "Unit": "Seconds"}]}]},
    "Service": "svc", "Replica": "replica-0", "QueueSize": 3, "RequestDuration": [0.5, 1.25],
}


def mutated(path: list[Any], value: Any) -> dict[str, Any]:
    event = copy.deepcopy(VALID)
    target = event
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return event


DIRECTIVE = ["_aws", "CloudWatchMetrics", 0]


@pytest.mark.parametrize(("event", "problem"), [
    (mutated(["_aws"], KeyError), "_aws is missing"),
    (mutated(["_aws", "Timestamp"], 1.7e12), "Timestamp"),
    (mutated(["_aws", "Timestamp"], KeyError), "Timestamp"),
    (mutated(["_aws", "Extra"], 1), "does not define"),
    (mutated([*DIRECTIVE, "Namespace"], ""), "Namespace"),
    (mutated([*DIRECTIVE, "Namespace"], "AWS/EC2"), "reserved"),
    (mutated([*DIRECTIVE, "Dimensions"], []), "at least one dimension set"),
    (mutated([*DIRECTIVE, "Dimensions"], [[f"k{i}" for i in range(31)]]), "at most 30 keys"),
    (mutated([*DIRECTIVE, "Dimensions"], [["Missing"]]), "'Missing' has no root member"),
    (mutated(["Replica"], 7), "not a string"),
    (mutated(["Replica"], ""), "1 to 1024"),
    (mutated(["Replica"], "é"), "non-ASCII"),
    (mutated([*DIRECTIVE, "Metrics"], [{"Name": "QueueSize"}] * 101), "at most 100"),
    (mutated([*DIRECTIVE, "Metrics", 0, "Unit"], "Tokens"), "not a CloudWatch unit"),
    (mutated([*DIRECTIVE, "Metrics", 0, "StorageResolution"], 5), "not 1 or 60"),
    (mutated([*DIRECTIVE, "Metrics", 1], {"Name": "QueueSize"}), "more than once"),
    (mutated([*DIRECTIVE, "Metrics", 1], {"Name": "Service"}), "also a dimension"),
    (mutated(["QueueSize"], KeyError), "'QueueSize' has no root member"),
    (mutated(["QueueSize"], "3"), "not a finite number"),
    (mutated(["QueueSize"], True), "not a finite number"),
    (mutated(["QueueSize"], float("nan")), "not a finite number"),
    (mutated(["QueueSize"], 2.0 ** 361), "not a finite number"),
    (mutated(["RequestDuration"], [0.5] * 101), "not 1 to 100"),
    (mutated(["RequestDuration"], []), "not 1 to 100"),
    (mutated(["RequestDuration"], [0.5, None]), "not finite numbers"),
    (mutated(["Big"], "x" * 300_000), "more than 262144"),
])
def test_the_checker_finds_each_breach_of_the_specification(event: dict[str, Any], problem: str) -> None:
    assert problems(VALID) == []
    found = problems(event)
    assert any(problem in p for p in found), found


def test_the_publisher_parses_as_python_3_10_and_imports_only_the_standard_library() -> None:
    tree = ast.parse(PUBLISHER.read_text(), feature_version=(3, 10))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= sys.stdlib_module_names


RUN_ROUNDS = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("publish_metrics", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["publish_metrics"] = module
spec.loader.exec_module(module)
given = json.load(sys.stdin)
publisher = module.Publisher(given["config"], given["service"], given["instance"])
print(json.dumps([publisher.collect(*inputs) for inputs in given["rounds"]]))
"""


def other_pythons() -> list[str]:
    """Interpreters to run the publisher with besides this one: ``PUBLISHER_PYTHONS`` (separated by
    ``os.pathsep``), else the host's Python 3.10 (Ubuntu 22.04) and 3.12 (Ubuntu 24.04) if found."""
    named = os.environ.get("PUBLISHER_PYTHONS")
    candidates = named.split(os.pathsep) if named else [shutil.which(n) or n for n in ("python3.10", "python3.12")]
    working = []
    for python in candidates:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([python, "-c", ""], capture_output=True, timeout=10).returncode == 0:
                working.append(python)
    return working


@pytest.mark.parametrize("python", other_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no python3.10 or python3.12 to run the publisher with (set PUBLISHER_PYTHONS)"))])
def test_the_publisher_computes_the_same_under_the_hosts_pythons(python: str) -> None:
    config = make_config()
    rounds = [(report(which), dict.fromkeys(["replica-0", "replica-1"], fixture(page)), fixture("haproxy-metrics.txt"),
               [1, 3], 1_000) for which, page in (("first", "tgi-first.txt"), ("second", "tgi-second.txt"))]
    given = json.dumps({"config": config, "service": SERVICE, "instance": INSTANCE_ID, "rounds": rounds})
    result = subprocess.run([python, "-c", RUN_ROUNDS, str(PUBLISHER)], input=given, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    here = pm.Publisher(config, SERVICE, INSTANCE_ID)
    assert json.loads(result.stdout) == [here.collect(*inputs) for inputs in json.loads(given)["rounds"]]

