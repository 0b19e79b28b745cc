"""The serving-path benchmark (``python -m benchmarks``) run at its tiny scale, so that it cannot
rot unnoticed: its figures document has every figure, with values that make sense. The targets
are the benchmark's business, not these tests'."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import main
from benchmarks.router import MISSING_HAPROXY, find_haproxy
from benchmarks.run import run
from benchmarks.scenarios import TINY

SCALE = dataclasses.replace(TINY, mixed_seeds=(12, 13))
"""Two mixed traces, so that pooling them and the figures of each are run too."""

LATENCIES = {"requests", "failed", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        find_haproxy()
    except RuntimeError:
        if os.environ.get("CI"):
            pytest.fail(MISSING_HAPROXY)
        pytest.skip(MISSING_HAPROXY)
    directory = tmp_path_factory.mktemp("benchmarks")
    run(SCALE, directory)
    return directory


@pytest.fixture(scope="module")
def figures(output: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((output / "figures.json").read_text())
    return loaded


def test_the_run_writes_its_figures_and_three_plots(output: Path) -> None:
    assert (output / "figures.json").is_file()
    for plot in ("overhead.png", "mixed.png", "failover.png"):
        assert (output / plot).read_bytes().startswith(PNG), plot


def test_overhead_has_both_paths_and_four_ratios_at_1_and_64_streams(figures: dict[str, Any]) -> None:
    assert set(figures["overhead"]) == {"1_stream", "64_streams"}
    for group in figures["overhead"].values():
        assert set(group["direct"]) == set(group["router"]) == LATENCIES
        assert group["direct"]["failed"] == group["router"]["failed"] == 0
        assert set(group["ratios"]) == {"ttft_p50", "ttft_p99", "itl_p50", "itl_p99"}
        assert all(0.5 < value < 2 for value in group["ratios"].values()), group["ratios"]


def test_mixed_workload_is_served_whole_by_both_routers_with_ratios_per_class(figures: dict[str, Any]) -> None:
    mixed = figures["mixed"]
    for router in ("shipped", "round_robin"):
        assert set(mixed[router]) == {"all", "chat", "long"}
        assert mixed[router]["all"]["requests"] == TINY.mixed_requests * len(SCALE.mixed_seeds)
        assert mixed[router]["all"]["failed"] == 0
        assert set(mixed[router]["all"]) == LATENCIES
    assert 0 < mixed["rate_per_second"] < mixed["capacity_per_second"]
    assert set(mixed["ratios"]) == {f"{group}_{key}" for group in ("all", "chat", "long")
                                    for key in ("ttft_p99", "e2e_p99")}
    for key in ("all_ttft_p99", "all_e2e_p99"):
        assert math.isfinite(mixed["ratios"][key]) and mixed["ratios"][key] > 0


def test_each_mixed_trace_has_its_own_ratios_and_floor_beside_the_pooled_ones(figures: dict[str, Any]) -> None:
    mixed = figures["mixed"]
    assert figures["setup"]["mixed"]["seeds"] == [12, 13]
    assert [trace["seed"] for trace in mixed["traces"]] == [12, 13]
    for trace in mixed["traces"]:
        assert trace["requests"] == TINY.mixed_requests
        assert set(trace["ratios"]) == set(mixed["ratios"])
        assert set(trace["floor"]["ratios"]) == {"all_ttft_p99", "all_e2e_p99"}
        assert set(trace["to_floor"]) == {"shipped", "round_robin"}
        assert set(trace["planner"]) == {"ttft_p99", "e2e_p99", "measured", "ratios"}
    # The pooled floor is the p99 of both traces together: between the two traces' own.
    pooled = mixed["floor"]["ttft_p99"]
    assert min(t["floor"]["ttft_p99"] for t in mixed["traces"]) <= pooled <= max(t["floor"]["ttft_p99"]
                                                                               for t in mixed["traces"])


@pytest.mark.parametrize("option", [["--seeds", "12,x"], ["--seeds", "12,12"], ["--seeds", ""],
                                    ["--mixed-requests", "0"], ["--mixed-requests", "many"]])
def test_bad_options_are_refused_before_anything_runs(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--output", "/nonexistent/never-written", *option])
    assert exit_.value.code == 2
    assert option[1] in capsys.readouterr().err


def test_the_floor_is_each_request_alone_on_an_idle_replica_which_no_router_beats(figures: dict[str, Any]) -> None:
    floor, shipped = figures["mixed"]["floor"], figures["mixed"]["shipped"]["all"]
    for key in ("ttft_p99", "e2e_p99"):
        assert 0 < floor[key] <= shipped[key]
    # Each router's ratio to the floor is at least 1 (rounded to three places).
    for router, ratios in figures["mixed"]["to_floor"].items():
        for key in ("ttft_p99", "e2e_p99"):
            assert ratios[key] == round(figures["mixed"][router]["all"][key] / floor[key], 3) >= 1, (router, key)


def test_the_withdrawn_targets_are_reported_without_a_verdict(figures: dict[str, Any]) -> None:
    mixed = figures["mixed"]
    assert not [t for t in figures["targets"] if t["name"].startswith("mixed workload")]
    assert figures["withdrawn_targets"] == [
        {"name": "mixed workload, p99 TTFT vs round robin", "value": mixed["ratios"]["all_ttft_p99"],
         "former_target": "at most 0.3", "floor": mixed["floor"]["ratios"]["all_ttft_p99"]},
        {"name": "mixed workload, p99 end-to-end vs round robin", "value": mixed["ratios"]["all_e2e_p99"],
         "former_target": "at most 0.8", "floor": mixed["floor"]["ratios"]["all_e2e_p99"]},
    ]


def test_the_planner_predicts_each_trace_beside_the_shipped_routers_measurement(figures: dict[str, Any]) -> None:
    """The planner's p99s are of the same traces, on the same clock: positive, and their ratios
    are predicted over measured."""
    planner, shipped = figures["mixed"]["planner"], figures["mixed"]["shipped"]["all"]
    assert planner["measured"] == {"ttft_p99": shipped["ttft_p99"], "e2e_p99": shipped["e2e_p99"]}
    for key in ("ttft_p99", "e2e_p99"):
        assert planner[key] > 0
        assert planner["ratios"][key] == round(planner[key] / shipped[key], 3)
    # No prediction beats the floor: the model adds waiting to each request alone on a replica.
    assert planner["ttft_p99"] >= figures["mixed"]["floor"]["ttft_p99"] - 1e-4
    targets = {t["name"]: t for t in figures["targets"] if t["name"].startswith("planner")}
    assert [t["value"] for t in targets.values()] == [planner["ratios"]["ttft_p99"], planner["ratios"]["e2e_p99"]]
    assert all(t["target"] == "within 0.2 of 1" for t in targets.values())


def test_a_within_target_passes_on_either_side_of_1_and_misses_beyond() -> None:
    from benchmarks.report import Target

    assert [Target("t", value, 0.2, kind="within").passed for value in (0.8, 1.2, 0.79, 1.21, None)] == [
        True, True, False, False, False]


def test_a_floor_is_the_p99_of_prefill_and_decode_alone() -> None:
    from benchmarks.load import Call
    from benchmarks.report import floor_latencies
    from benchmarks.workload import PREFILL_SECONDS_PER_TOKEN, STEP_SECONDS, TIME_SCALE

    trace = [Call(0.0, 1000, 10), Call(0.0, 8000, 100)]
    assert floor_latencies(trace) == {
        "ttft_p99": round(8000 * PREFILL_SECONDS_PER_TOKEN / TIME_SCALE, 4),
        "e2e_p99": round((8000 * PREFILL_SECONDS_PER_TOKEN + 99 * STEP_SECONDS) / TIME_SCALE, 4),
    }


def test_failover_counts_the_lost_requests_and_times_the_killed_replica(figures: dict[str, Any]) -> None:
    failover = figures["failover"]
    assert failover["requests"] > 0
    assert 0 <= failover["lost"] <= failover["requests"]
    assert failover["lost_beyond_in_flight"] == max(0, failover["lost"] - failover["in_flight_on_killed"])
    assert failover["states"][0][1] == "UP"
    for key in ("seconds_until_marked_down", "seconds_until_restarted_takes_traffic"):
        assert failover[key] is None or failover[key] >= 0, key


def test_overload_shows_what_clients_get_from_each_route(figures: dict[str, Any]) -> None:
    routes = figures["overload"]["routes"]
    overloaded = {"error": "Model is overloaded", "error_type": "overloaded"}
    assert routes["/generate"]["statuses"] == {"429": TINY.overload_requests}
    assert routes["/generate_stream"]["statuses"] == {"200": TINY.overload_requests}
    assert routes["/generate"]["first_answer"] == routes["/generate_stream"]["first_answer"] == overloaded
    assert figures["overload"]["replicas_up_after"] == 6


def test_every_target_has_a_value_and_a_verdict(figures: dict[str, Any]) -> None:
    assert len(figures["targets"]) == 15
    assert {t["result"] for t in figures["targets"]} <= {"PASS", "MISS"}
    assert all(t["target"].startswith(("at most ", "within ", "below ")) for t in figures["targets"])


def test_both_layouts_serve_the_whole_trace_on_one_instance_and_differ(figures: dict[str, Any]) -> None:
    layouts = figures["layouts"]
    assert figures["setup"]["layouts"]["requests"] == TINY.layouts_requests
    assert figures["setup"]["layouts"]["long_input_tokens"] == 3072
    assert 0 < layouts["rate_per_second"] < layouts["capacity_per_second"]
    shapes = {}
    for name in ("default", "goodput"):
        layout = layouts[name]["layout"]
        assert set(layouts[name]["measured"]) == LATENCIES
        assert layouts[name]["measured"]["requests"] == TINY.layouts_requests
        assert layouts[name]["measured"]["failed"] == 0
        assert layout["costs_on_the_benchmark_clock"]["batch_size"] == layout["batch_size"]
        # One instance of inf2.24xlarge: 12 NeuronCores, the replicas' degrees filling them at most.
        assert layout["degree"] * layout["replicas"] <= 12
        shapes[name] = (layout["degree"], layout["batch_size"], layout["sequence_length"])
    assert shapes["default"] == (2, 4, 4096)
    assert shapes["goodput"] != shapes["default"]
    assert layouts["recommendation"]["instances"] == 1
    # The goodput objective's target is the default layout's own predicted p99 TTFT, on the real clock.
    recommendation = layouts["recommendation"]
    assert recommendation["real_ttft_p99"] * 1e3 <= recommendation["p99_ttft_ms_target"] + 0.1


def test_the_layouts_figures_are_predicted_over_measured_and_goodput_over_default(figures: dict[str, Any]) -> None:
    layouts = figures["layouts"]
    for name in ("default", "goodput"):
        planner, measured = layouts[name]["planner"], layouts[name]["measured"]
        assert planner["measured"] == {"ttft_p99": measured["ttft_p99"], "e2e_p99": measured["e2e_p99"]}
        for key in ("ttft_p99", "e2e_p99"):
            assert planner[key] > 0
            assert planner["ratios"][key] == round(planner[key] / measured[key], 3)
    for key in ("ttft_p99", "e2e_p99"):
        assert layouts["ratios"][key] == round(layouts["goodput"]["measured"][key]
                                               / layouts["default"]["measured"][key], 3)
    found = {t["name"]: t for t in figures["targets"] if t["name"].startswith("layouts")}
    assert [t["value"] for t in found.values()] == [layouts["ratios"]["ttft_p99"],
                                                    layouts["default"]["planner"]["ratios"]["ttft_p99"],
                                                    layouts["goodput"]["planner"]["ratios"]["ttft_p99"]]
    assert [t["target"] for t in found.values()] == ["below 1", "within 0.2 of 1", "within 0.2 of 1"]


def test_the_layouts_targets_follow_from_the_numbers_given() -> None:
    from benchmarks.report import layouts_targets

    def layouts(default_ttft: float, goodput_ttft: float, planner: tuple[float, float]) -> dict[str, Any]:
        return {"ratios": {"ttft_p99": round(goodput_ttft / default_ttft, 3)},
                "default": {"planner": {"ratios": {"ttft_p99": planner[0]}}},
                "goodput": {"planner": {"ratios": {"ttft_p99": planner[1]}}}}

    beaten = [t.passed for t in layouts_targets(layouts(2.0, 0.5, (1.1, 0.7)))]
    assert beaten == [True, True, False]
    assert [t.passed for t in layouts_targets(layouts(2.0, 2.0, (0.8, 1.2)))] == [False, True, True]
    assert layouts_targets(layouts(2.0, 0.5, (1.0, 1.0)))[0].value == 0.25


def test_the_layouts_mix_fits_the_default_layout_where_the_mixed_one_cannot() -> None:
    from benchmarks.scenarios import DEFAULT_PLAN, FULL, largest_request, layouts_capacity, layouts_mix, mix_workload
    from neuron_serving.plan import performance
    from neuron_serving.plan.errors import ServingConfigError

    mix = layouts_mix(FULL)
    assert (mix.long_share, mix.chat_input_tokens, mix.output_tokens) == (0.2, (100, 1000), (50, 250))
    largest_request(mix).check_fits(DEFAULT_PLAN.request)
    with pytest.raises(ServingConfigError):
        largest_request(FULL.mix).check_fits(DEFAULT_PLAN.request)
    # The capacity is the planner's saturated rate of the mean request:
    # 0.8 x 550 + 0.2 x 3072 = 1054 tokens in, 150 out.
    assert mix_workload(mix) == performance.Workload(1054, 150)
    assert layouts_capacity(mix, DEFAULT_PLAN) == performance.predict(
        DEFAULT_PLAN, performance.Workload(1054, 150)).requests_per_second_instance


def test_the_goodput_layout_must_be_one_instance() -> None:
    from benchmarks.scenarios import goodput_layout, layouts_mix, mixed_trace

    mix = layouts_mix(TINY)
    trace = mixed_trace(mix, 10, 2.0, 12)
    assert goodput_layout(mix, 2.0, trace, 5000.0).load.instances == 1  # type: ignore[union-attr]
    # Ten times the rate: more than any layout of one instance completes at saturation.
    with pytest.raises(RuntimeError, match="not 1: the layouts scenario compares layouts of one instance"):
        goodput_layout(mix, 20.0, mixed_trace(mix, 200, 20.0, 12), 5000.0)
