"""Serving metrics from TGI's /metrics pages: gauges, counter deltas, histograms as values."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from monitorsim import INSTANCE_ID, SERVICE, fixture, load_publisher, make_config, scrape, values
from monitorsim import REPLICA_DIMENSIONS as REPLICA

pm = load_publisher()

HISTOGRAMS = {"RequestDuration": "tgi_request_duration", "QueueDuration": "tgi_request_queue_duration",
              "TimePerOutputToken": "tgi_request_mean_time_per_token_duration"}


def publisher() -> Any:
    return pm.Publisher(make_config(replicas={"replica-0": 8081}), SERVICE, INSTANCE_ID)


def recorded_buckets(page: str, name: str) -> dict[float, int]:
    """Cumulative bucket counts read straight from a page, independently of the publisher."""
    pattern = re.compile(rf'^{name}_bucket\{{le="([^"]+)"\}} (\d+)$', re.M)
    return {float(le): int(count) for le, count in pattern.findall(page)}


def recorded(page: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", page, re.M)
    assert match, name
    return float(match.group(1))


FIRST, SECOND = fixture("tgi-first.txt"), fixture("tgi-second.txt")


@pytest.fixture(scope="module")
def two_scrapes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pub = publisher()
    return scrape(pub, FIRST), scrape(pub, SECOND, 61_000)


def test_gauges_are_published_from_every_scrape(two_scrapes: Any) -> None:
    first, second = two_scrapes
    assert (values(first, "QueueSize"), values(first, "BatchSize"), values(first, "InFlightRequests")) == (
        [0], [2], [2])
    assert (values(second, "QueueSize"), values(second, "BatchSize"), values(second, "InFlightRequests")) == (
        [3], [4], [7])


def test_in_flight_requests_add_each_replicas_share_of_the_router_queue() -> None:
    pub = pm.Publisher(make_config(replicas={"replica-0": 8081, "replica-1": 8082}), SERVICE, INSTANCE_ID)

    events = pub.collect(None, {"replica-0": SECOND, "replica-1": SECOND}, fixture("haproxy-metrics.txt"), None, 1_000)

    # Each page: 3 queued and 4 in the batch; the router holds 4 requests for the 2 replicas.
    assert values(events, "InFlightRequests") == [3 + 4 + 4 / 2]
    assert values(events, "QueueSize") == [3]


def test_counters_and_histograms_have_no_value_on_the_first_scrape(two_scrapes: Any) -> None:
    first, _ = two_scrapes
    for metric in ("Requests", "RequestFailures", "GeneratedTokens", *HISTOGRAMS):
        assert values(first, metric) == [], metric


def test_counters_are_published_as_deltas(two_scrapes: Any) -> None:
    _, second = two_scrapes
    assert values(second, "Requests") == [150]
    # Failures of every reason: one validation, one generation.
    assert values(second, "RequestFailures") == [2]
    tokens = recorded(SECOND, "tgi_request_generated_tokens_sum") - recorded(FIRST, "tgi_request_generated_tokens_sum")
    assert values(second, "GeneratedTokens") == [tokens]


@pytest.mark.parametrize("metric", HISTOGRAMS)
def test_a_histogram_gives_one_value_per_new_request(two_scrapes: Any, metric: str) -> None:
    name = HISTOGRAMS[metric]
    new = recorded(SECOND, f"{name}_count") - recorded(FIRST, f"{name}_count")
    assert new > 100
    assert len(values(two_scrapes[1], metric)) == new


@pytest.mark.parametrize("metric", HISTOGRAMS)
def test_each_value_lies_within_its_requests_bucket(two_scrapes: Any, metric: str) -> None:
    name = HISTOGRAMS[metric]
    before, after = recorded_buckets(FIRST, name), recorded_buckets(SECOND, name)
    bounds = sorted(after)
    expected = {b: after[b] - before[b] - (after[a] - before[a] if a is not None else 0)
                for a, b in zip([None, *bounds], bounds, strict=False)}
    got = dict.fromkeys(bounds, 0)
    for value in values(two_scrapes[1], metric):
        got[min(b for b in bounds if value <= b)] += 1
    assert got == expected


@pytest.mark.parametrize("metric", HISTOGRAMS)
def test_the_p99_of_the_values_falls_in_the_bucket_of_the_recorded_p99(two_scrapes: Any, metric: str) -> None:
    name = HISTOGRAMS[metric]
    before, after = recorded_buckets(FIRST, name), recorded_buckets(SECOND, name)
    bounds = sorted(after)
    new = after[math.inf] - before[math.inf]
    rank = math.ceil(0.99 * new)
    p99_bucket = next(b for b in bounds if after[b] - before[b] >= rank)
    lower = max([0.0, *(b for b in bounds if b < p99_bucket)])
    published = sorted(values(two_scrapes[1], metric))
    assert lower < published[rank - 1] <= p99_bucket


def test_values_in_the_inf_bucket_take_the_largest_finite_bound() -> None:
    previous = {0.5: 1.0, 1.0: 2.0, math.inf: 2.0}
    current = {0.5: 1.0, 1.0: 4.0, math.inf: 7.0}
    assert pm.histogram_values(previous, current) == [0.625, 0.875, 1.0, 1.0, 1.0]


def test_values_spread_evenly_within_each_bucket() -> None:
    assert pm.histogram_values({}, {1.0: 2.0, 3.0: 2.0, math.inf: 2.0}) == [0.25, 0.75]


def test_no_histogram_value_without_new_requests() -> None:
    pub = publisher()
    scrape(pub, FIRST)
    again = scrape(pub, FIRST, 61_000)
    for metric in HISTOGRAMS:
        assert values(again, metric) == []
    assert values(again, "Requests") == [0] and values(again, "RequestFailures") == [0]


def page(count: float, failures: dict[str, float], buckets: dict[str, float], suffix: str = "") -> str:
    lines = ["# TYPE tgi_request_count counter", f"tgi_request_count{suffix} {count}",
             "# TYPE tgi_request_failure counter"]
    lines += [f'tgi_request_failure{suffix}{{err="{err}"}} {n}' for err, n in failures.items()]
    lines += ["# TYPE tgi_request_duration histogram"]
    lines += [f'tgi_request_duration_bucket{{le="{le}"}} {n}' for le, n in buckets.items()]
    lines += [f"tgi_request_duration_count {buckets['+Inf']}", "tgi_queue_size 0", "tgi_batch_current_size 1"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("suffix", ["", "_total"])
def test_a_counter_that_drops_has_restarted_and_its_delta_is_the_new_value(suffix: str) -> None:
    pub = publisher()
    scrape(pub, page(100, {"validation": 5}, {"1": 90, "+Inf": 95}, suffix))
    after = scrape(pub, page(7, {"validation": 1}, {"1": 3, "+Inf": 4}, suffix), 61_000)
    assert values(after, "Requests") == [7]
    assert values(after, "RequestFailures") == [1]
    assert len(values(after, "RequestDuration")) == 4


def test_a_counter_that_appears_later_counted_from_zero() -> None:
    # TGI creates tgi_request_failure{err=...} at the first failure.
    pub = publisher()
    scrape(pub, page(10, {}, {"1": 10, "+Inf": 10}))
    after = scrape(pub, page(13, {"overloaded": 2, "validation": 1}, {"1": 10, "+Inf": 10}), 61_000)
    assert values(after, "RequestFailures") == [3]


def test_a_replica_that_does_not_answer_contributes_nothing_and_resumes_with_deltas() -> None:
    pub = publisher()
    scrape(pub, page(10, {}, {"1": 10, "+Inf": 10}))
    assert scrape(pub, None, 61_000) == []
    resumed = scrape(pub, page(25, {}, {"1": 22, "+Inf": 24}), 121_000)
    assert values(resumed, "Requests") == [15]
    assert len(values(resumed, "RequestDuration")) == 14


def test_a_page_that_is_not_prometheus_text_contributes_nothing() -> None:
    pub = publisher()
    assert scrape(pub, "<html>busy</html>") == []


def test_more_than_100_values_are_split_over_events_of_the_same_dimensions() -> None:
    pub = publisher()
    scrape(pub, page(0, {}, {"0.5": 0, "1": 0, "+Inf": 0}))
    events = scrape(pub, page(250, {}, {"0.5": 120, "1": 250, "+Inf": 250}), 61_000)
    assert len(events) == 3
    assert all({k: e[k] for k in REPLICA} == REPLICA for e in events)
    durations = values(events, "RequestDuration")
    assert len(durations) == 250
    assert sum(v <= 0.5 for v in durations) == 120
    assert values(events, "Requests") == [250]
