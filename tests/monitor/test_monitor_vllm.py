"""Serving metrics from vLLM's /metrics pages (rendered by the real prometheus_client with vLLM
0.11.0's families: monitor_fixtures/make_vllm_metrics.py), under the same published names as TGI's."""

from __future__ import annotations

import re
from typing import Any

import pytest
from monitorsim import INSTANCE_ID, SERVICE, fixture, load_publisher, make_config, scrape, values
from monitorsim import REPLICA_DIMENSIONS as REPLICA

from neuron_serving.plan.engines.vllm import VLLM

pm = load_publisher()

HISTOGRAMS = {"RequestDuration": "vllm:e2e_request_latency_seconds", "QueueDuration": "vllm:request_queue_time_seconds",
              "TimePerOutputToken": "vllm:request_time_per_output_token_seconds"}
FIRST, SECOND = fixture("vllm-first.txt"), fixture("vllm-second.txt")


def recorded(page: str, name: str, **labels: str) -> float:
    """The sum of a family's samples with ``labels``, read straight from the page."""
    total = 0.0
    for sample_labels, value in re.findall(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", page, re.M):
        found = dict(re.findall(r'(\w+)="([^"]*)"', sample_labels))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture(scope="module")
def two_scrapes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pub = pm.Publisher(make_config(replicas={"replica-0": 8081}, engine=VLLM), SERVICE, INSTANCE_ID)
    return scrape(pub, FIRST), scrape(pub, SECOND, 61_000)


def test_waiting_and_running_requests_are_the_queue_and_the_batch(two_scrapes: Any) -> None:
    first, second = two_scrapes
    assert (values(first, "QueueSize"), values(first, "BatchSize"), values(first, "InFlightRequests")) == (
        [0], [2], [2])
    assert (values(second, "QueueSize"), values(second, "BatchSize"), values(second, "InFlightRequests")) == (
        [3], [4], [7])


def test_requests_and_failures_are_the_http_counts_of_the_generation_routes(two_scrapes: Any) -> None:
    _, second = two_scrapes
    assert values(second, "Requests") == [150]
    # One completion refused (400: prompt too long) and one failed (500).
    assert values(second, "RequestFailures") == [2]
    tokens = recorded(SECOND, "vllm:generation_tokens_total") - recorded(FIRST, "vllm:generation_tokens_total")
    assert tokens > 0 and values(second, "GeneratedTokens") == [tokens]


@pytest.mark.parametrize("metric", HISTOGRAMS)
def test_a_histogram_gives_one_value_per_request_the_engine_ran(two_scrapes: Any, metric: str) -> None:
    name = HISTOGRAMS[metric]
    new = recorded(SECOND, f"{name}_count") - recorded(FIRST, f"{name}_count")
    # The refused request never reached the engine: 149 of the 150.
    assert new == 149
    published = values(two_scrapes[1], metric)
    assert len(published) == new
    buckets = sorted(float(le) for le in re.findall(rf'^{re.escape(name)}_bucket\{{[^}}]*le="([^"]+)"', SECOND, re.M))
    assert all(0 < v <= buckets[-2] for v in published)


def test_the_engines_other_families_are_ignored(two_scrapes: Any) -> None:
    _, second = two_scrapes
    names = {k for event in second for k in event if not k.startswith("_")} - set(REPLICA)
    assert names == {"QueueSize", "BatchSize", "InFlightRequests", "Requests", "RequestFailures", "GeneratedTokens",
                     *HISTOGRAMS}
