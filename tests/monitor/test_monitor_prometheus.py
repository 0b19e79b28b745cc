"""The publisher's reader of the Prometheus text format, on edge cases and on the recorded pages."""

from __future__ import annotations

import math

from monitorsim import fixture, load_publisher

pm = load_publisher()
Sample = pm.Sample


def test_help_type_and_blank_lines_are_skipped() -> None:
    text = "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\n\ntgi_queue_size 3\n"
    assert pm.parse_prometheus(text) == [Sample("tgi_queue_size", {}, 3.0)]


def test_labels_are_read_with_escapes_commas_and_braces_inside_values() -> None:
    text = r'm{a="x\"y",b="c\\d",c="line\nbreak",d="1,2}",e=""} 1' + "\n"
    assert pm.parse_prometheus(text) == [
        Sample("m", {"a": 'x"y', "b": "c\\d", "c": "line\nbreak", "d": "1,2}", "e": ""}, 1.0)]


def test_spaces_around_labels_and_a_trailing_comma_are_accepted() -> None:
    assert pm.parse_prometheus('m{ a = "1" , b="2", } 5\n') == [Sample("m", {"a": "1", "b": "2"}, 5.0)]
    assert pm.parse_prometheus("m{} 5\n") == [Sample("m", {}, 5.0)]


def test_special_values_are_floats() -> None:
    samples = pm.parse_prometheus('b{le="+Inf"} +Inf\nc -Inf\nd NaN\ne 1.5e+06\nf -0.25\n')
    values = {s.name: s.value for s in samples}
    assert values["b"] == math.inf and values["c"] == -math.inf and math.isnan(values["d"])
    assert values["e"] == 1_500_000 and values["f"] == -0.25
    assert samples[0].labels == {"le": "+Inf"}


def test_timestamps_are_ignored() -> None:
    assert pm.parse_prometheus("m 7 1712345678901\nn{a=\"b\"} 8 -1\n") == [
        Sample("m", {}, 7.0), Sample("n", {"a": "b"}, 8.0)]


def test_unreadable_lines_are_skipped_and_the_rest_is_read() -> None:
    text = "garbage\nm{a=\"unterminated} 1\n9metric 1\nm not-a-number\nok 1\n  # indented comment\n"
    assert pm.parse_prometheus(text) == [Sample("ok", {}, 1.0)]


def test_total_accepts_counters_with_or_without_the_total_suffix_and_filters_by_labels() -> None:
    samples = pm.parse_prometheus('f{err="a"} 2\nf_total{err="b"} 3\ng{x="1",y="2"} 4\ng{x="1",y="3"} 5\n')
    assert pm.total(samples, "f") == 5
    assert pm.total(samples, "f", err="b") == 3
    assert pm.total(samples, "g", x="1") == 9
    assert pm.total(samples, "g", y="3") == 5
    assert pm.total(samples, "missing") is None


def test_every_line_of_the_recorded_tgi_page_is_read() -> None:
    text = fixture("tgi-second.txt")
    samples = pm.parse_prometheus(text)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == len(lines)
    assert pm.total(samples, "tgi_request_count") == 1350
    assert pm.total(samples, "tgi_request_failure") == 6
    assert len(pm.buckets(samples, "tgi_request_duration")) == 36  # 35 bounds and +Inf


def test_every_line_of_the_recorded_haproxy_page_is_read() -> None:
    text = fixture("haproxy-metrics.txt")
    samples = pm.parse_prometheus(text)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == len(lines)
    assert pm.total(samples, "haproxy_backend_current_queue", proxy="replicas") == 4
    assert {s.labels["state"] for s in samples if s.name == "haproxy_server_status"} == {
        "UP", "DOWN", "MAINT", "DRAIN", "NOLB"}
