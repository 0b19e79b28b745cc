"""The figures of one benchmark run (a JSON document) and its targets, each PASS or MISS: issue 12's
router overhead and failover, the planner's prediction of the mixed traces against the fake
replicas' measurement (issue 25), and the goodput objective's layout against the default one on
one instance (issue 25, :func:`layouts_figures`). Issue 12's two mixed-workload targets are withdrawn (below what
any router can reach, see :func:`floor_latencies`) and reported without a verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from neuron_serving.plan import queueing
from neuron_serving.plan.queueing import Timing

from .load import Call, Outcome
from .scenarios import (
    BATCH_SIZE,
    FAILOVER_LOAD,
    LAYOUTS_LOAD,
    OVERHEAD_BATCH_SIZE,
    OVERHEAD_PROMPT_TOKENS,
    SEED,
    VICTIM,
    FailoverResult,
    LayoutRun,
    LayoutsResult,
    MixedResult,
    OverheadResult,
    OverloadResult,
    Scale,
    layouts_mix,
    statuses,
)
from .workload import PREFILL_SECONDS_PER_TOKEN, STEP_SECONDS, TIME_SCALE, replica_costs

OVERHEAD_LIMIT = 1.05
"""Router over direct, at most (issue 12), for each of TTFT and ITL at p50 and p99."""
TTFT_LIMIT = 0.3
"""Issue 12's shipped router over round robin, p99 time to first token of the mixed workload, at
most: WITHDRAWN, below the floor's own ratio (no router reaches it); reported, not judged."""
E2E_LIMIT = 0.8
"""Issue 12's shipped router over round robin, p99 end-to-end latency of the mixed workload, at
most: WITHDRAWN like :data:`TTFT_LIMIT`."""
PLANNER_TOLERANCE = 0.2
"""The planner's p99 TTFT and end-to-end latency of the mixed traces over the fake replicas'
measured ones behind the shipped router: within this of 1."""
MARK_DOWN_LIMIT = 2.0
"""Seconds from a replica's death until the router sends it no new request, at most."""


@dataclass(frozen=True)
class Target:
    """One of issue 12's targets and the value this run measured."""

    name: str
    value: float | None
    limit: float
    kind: str = "at most"
    """``at most`` (the value at most ``limit``), ``below`` (the value less than ``limit``) or
    ``within`` (the value within ``limit`` of 1)."""
    floor: float | None = None
    """The best value any router could reach (see :func:`floor_latencies`), where one is known."""

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        if self.kind == "within":
            return abs(self.value - 1) <= self.limit + 1e-9
        if self.kind == "below":
            return self.value < self.limit
        return self.value <= self.limit

    def to_json(self) -> dict[str, Any]:
        target = f"within {self.limit:g} of 1" if self.kind == "within" else f"{self.kind} {self.limit:g}"
        found = {"name": self.name, "value": self.value, "target": target,
                 "result": "PASS" if self.passed else "MISS"}
        return found if self.floor is None else {**found, "floor": self.floor}


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 100), or ``None`` without values."""
    return queueing.percentile(values, q) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def latencies(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Requests, failures, and p50 and p99 TTFT, ITL and end-to-end latency of the successful."""
    ok = [o for o in outcomes if o.ok]
    ttft = [o.ttft for o in ok if o.ttft is not None]
    e2e = [o.end for o in ok if o.end is not None]
    itl = [gap for o in ok for gap in o.itls]
    return {"requests": len(outcomes), "failed": len(outcomes) - len(ok),
            **{f"{name}_p{q}": _seconds(percentile(values, q))
               for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)) for q in (50, 99)}}


def overhead_figures(result: OverheadResult) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for streams, paths in result.outcomes.items():
        direct, router = latencies(paths["direct"]), latencies(paths["router"])
        figures[f"{streams}_stream" + ("s" if streams > 1 else "")] = {
            "direct": direct, "router": router,
            "ratios": {key: ratio(router[key], direct[key]) for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")},
        }
    return figures


def mixed_figures(result: MixedResult) -> dict[str, Any]:
    """Both routers' latencies over every trace pooled, their ratios, the floor and each router's
    ratio to it, and the planner's prediction against the shipped router's measurement; with more
    than one trace, each trace's ratios, floor and prediction too (``traces``)."""
    figures: dict[str, Any] = {"rate_per_second": round(result.rate, 3),
                               "capacity_per_second": round(result.capacity, 3),
                               **_mixed_comparison(result.trace, result.outcomes, result.predicted)}
    if len(result.runs) > 1:
        figures["traces"] = [{"seed": run.seed, "requests": len(run.trace),
                              **{key: value
                                 for key, value in _mixed_comparison(run.trace, run.outcomes, run.predicted).items()
                                 if key in ("ratios", "floor", "to_floor", "planner")}}
                             for run in result.runs]
    return figures


def _mixed_comparison(trace: Sequence[Call], outcomes: dict[str, list[Outcome]],
                      predicted: Sequence[Timing]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for router, served in outcomes.items():
        by_kind = {kind: latencies([o for o in served if o.call.kind == kind]) for kind in ("chat", "long")}
        figures[router] = {"all": latencies(served), **by_kind}
    shipped, baseline = figures["shipped"], figures["round_robin"]
    figures["ratios"] = {f"{group}_{key}": ratio(shipped[group][key], baseline[group][key])
                         for group in ("all", "chat", "long") for key in ("ttft_p99", "e2e_p99")}
    floor = floor_latencies(trace)
    figures["floor"] = {**floor, "ratios": {f"all_{key}": ratio(floor[key], baseline["all"][key]) for key in floor}}
    figures["to_floor"] = {router: {key: ratio(figures[router]["all"][key], floor[key]) for key in floor}
                           for router in outcomes}
    figures["planner"] = planner_figures(predicted, shipped["all"])
    return figures


def planner_figures(predicted: Sequence[Timing], measured: dict[str, Any]) -> dict[str, Any]:
    """The planner's p99 TTFT and end-to-end latency of a trace (``predicted``, each request's
    timing), the shipped router's measured ones (``measured``, from :func:`latencies`), and
    predicted over measured."""
    figures: dict[str, Any] = {
        "ttft_p99": _seconds(percentile([t.ttft_s for t in predicted], 99)),
        "e2e_p99": _seconds(percentile([t.e2e_s for t in predicted], 99)),
    }
    figures["measured"] = {key: measured[key] for key in ("ttft_p99", "e2e_p99")}
    figures["ratios"] = {key: ratio(figures[key], measured[key]) for key in ("ttft_p99", "e2e_p99")}
    return figures


def layouts_figures(result: LayoutsResult) -> dict[str, Any]:
    """The layouts scenario: its load and the goodput objective's pick (real seconds); each layout's
    description, measured latencies and the planner's prediction of them (the benchmark's clock);
    and the goodput layout's measured p99s over the default layout's."""
    recommendation = result.recommendation
    assert recommendation.load is not None
    load = recommendation.load
    figures: dict[str, Any] = {
        "rate_per_second": round(result.rate, 3),
        "capacity_per_second": round(result.capacity, 3),
        # The goodput objective's pick, as it predicted it on the real clock (TIME_SCALE times the benchmark's).
        "recommendation": {"p99_ttft_ms_target": round(result.p99_ttft_target_ms, 1),
                           "instances": load.instances, "utilisation": round(load.utilisation, 3),
                           "real_ttft_p99": _seconds(load.ttft_p99_s), "real_e2e_p99": _seconds(load.e2e_p99_s),
                           "reason": recommendation.reason},
    }
    for name, run in result.runs.items():
        measured = latencies(run.outcomes)
        figures[name] = {"layout": _layout(run), "measured": measured,
                         "planner": planner_figures(run.predicted, measured)}
    default, goodput = figures["default"]["measured"], figures["goodput"]["measured"]
    figures["ratios"] = {key: ratio(goodput[key], default[key]) for key in ("ttft_p99", "e2e_p99")}
    return figures


def _layout(run: LayoutRun) -> dict[str, Any]:
    plan = run.plan
    return {"degree": plan.degree, "batch_size": plan.batch_size, "sequence_length": plan.sequence_length,
            "replicas": len(plan.replicas), "costs_on_the_benchmark_clock": asdict(run.costs)}


def floor_latencies(trace: Sequence[Call]) -> dict[str, float | None]:
    """The p99 TTFT and end-to-end latency no router can beat on ``trace``: each request alone on
    an idle replica, never queued and never stalled by another's prefill (its own prefill, which
    gives its first token, then a decode step for each further token, at the benchmark's clock). A
    router can only add to these; a ratio to round robin below the floor's is out of any router's
    reach."""
    step, prefill = STEP_SECONDS / TIME_SCALE, PREFILL_SECONDS_PER_TOKEN / TIME_SCALE
    ttft = [c.input_tokens * prefill for c in trace]
    e2e = [c.input_tokens * prefill + (c.output_tokens - 1) * step for c in trace]
    return {"ttft_p99": _seconds(percentile(ttft, 99)), "e2e_p99": _seconds(percentile(e2e, 99))}


def failover_figures(result: FailoverResult) -> dict[str, Any]:
    lost = sum(not o.ok for o in result.outcomes)
    return {
        "requests": len(result.outcomes),
        "lost": lost,
        "in_flight_on_killed": result.in_flight_on_killed,
        "lost_beyond_in_flight": max(0, lost - result.in_flight_on_killed),
        "seconds_until_marked_down": _seconds(None if result.marked_down_at is None
                                              else result.marked_down_at - result.killed_at),
        "new_requests_that_tried_killed": result.tried_killed,
        "retries": result.retries,
        "redispatches": result.redispatches,
        "seconds_until_restarted_takes_traffic": _seconds(
            None if result.first_request_after_restart is None
            else result.first_request_after_restart - result.restarted_at),
        "states": [[_seconds(t - result.killed_at), state] for t, state in result.states],
    }


def overload_figures(result: OverloadResult) -> dict[str, Any]:
    routes: dict[str, Any] = {}
    for route, outcomes in result.outcomes.items():
        ends = [o.end for o in outcomes if o.end is not None]
        routes[route] = {"statuses": statuses(outcomes), "first_answer": outcomes[0].first_event if outcomes else None,
                         "seconds_p50": _seconds(percentile(ends, 50))}
    return {"routes": routes, "answered_by_replicas": result.answered_by_replicas, "retries": result.retries,
            "replicas_up_after": sum(state == "UP" for state in result.states_after.values())}


def targets(figures: dict[str, Any]) -> list[Target]:
    found = [Target(f"router overhead, {streams.replace('_', ' ')}, {key.replace('_', ' ')}", value, OVERHEAD_LIMIT)
             for streams, group in figures["overhead"].items() for key, value in group["ratios"].items()]
    planner = figures["mixed"]["planner"]["ratios"]
    failover = figures["failover"]
    return [*found,
            Target("planner p99 TTFT within 20% of the fake replicas", planner["ttft_p99"], PLANNER_TOLERANCE,
                   kind="within"),
            Target("planner p99 end-to-end within 20% of the fake replicas", planner["e2e_p99"], PLANNER_TOLERANCE,
                   kind="within"),
            *layouts_targets(figures["layouts"]),
            Target("seconds until a killed replica is marked down", failover["seconds_until_marked_down"],
                   MARK_DOWN_LIMIT),
            Target("requests lost beyond those in flight on the killed replica", failover["lost_beyond_in_flight"], 0)]


def layouts_targets(layouts: dict[str, Any]) -> list[Target]:
    """The goodput layout's measured p99 TTFT over the default layout's, below 1; and for each
    layout, the planner's p99 TTFT over the fakes' measured one, within :data:`PLANNER_TOLERANCE`."""
    return [Target("layouts: goodput layout's p99 TTFT below the default layout's (same instance count)",
                   layouts["ratios"]["ttft_p99"], 1.0, kind="below"),
            *(Target(f"layouts: planner p99 TTFT within 20% of the fakes, {name} layout",
                     layouts[name]["planner"]["ratios"]["ttft_p99"], PLANNER_TOLERANCE, kind="within")
              for name in ("default", "goodput"))]


def withdrawn(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 12's two mixed-workload targets, withdrawn (each below the floor's own ratio, out of
    any router's reach): their values, former limits and floors, for the record."""
    mixed = figures["mixed"]
    return [{"name": f"mixed workload, p99 {label} vs round robin", "value": mixed["ratios"][f"all_{key}"],
             "former_target": f"at most {limit:g}", "floor": mixed["floor"]["ratios"][f"all_{key}"]}
            for label, key, limit in (("TTFT", "ttft_p99", TTFT_LIMIT), ("end-to-end", "e2e_p99", E2E_LIMIT))]


def setup(scale: Scale) -> dict[str, Any]:
    """What the run modelled, for readers of the figures."""
    mix, layouts = scale.mix, layouts_mix(scale)
    return {
        "replica": {"step_seconds": STEP_SECONDS, "prefill_seconds_per_token": PREFILL_SECONDS_PER_TOKEN,
                    "costs_on_the_mixed_clock": asdict(replica_costs(BATCH_SIZE, TIME_SCALE))},
        "time_scale": TIME_SCALE,
        "overhead": {"replicas": 1, "batch_size": OVERHEAD_BATCH_SIZE,
                     "prompt_tokens_by_streams": OVERHEAD_PROMPT_TOKENS,
                     "output_tokens_by_streams": scale.overhead_output_tokens,
                     "rounds": scale.overhead_rounds},
        "mixed": {"replicas": 6, "batch_size": 4, "long_share": mix.long_share,
                  "long_input_tokens": mix.long_input_tokens, "chat_input_tokens": list(mix.chat_input_tokens),
                  "output_tokens": list(mix.output_tokens), "load": mix.load, "requests": scale.mixed_requests,
                  "seeds": list(scale.mixed_seeds)},
        "failover": {"load": FAILOVER_LOAD, "seconds": scale.failover_seconds, "down_seconds": scale.down_seconds,
                     "killed": VICTIM},
        "overload": {"requests_per_route": scale.overload_requests},
        "layouts": {"long_share": layouts.long_share, "long_input_tokens": layouts.long_input_tokens,
                    "chat_input_tokens": list(layouts.chat_input_tokens),
                    "output_tokens": list(layouts.output_tokens), "load": LAYOUTS_LOAD,
                    "requests": scale.layouts_requests, "seed": SEED},
    }


def summary(figures: dict[str, Any]) -> str:
    """The targets, one line each, for the terminal; then the withdrawn ones, the ratios to the
    floor, and each layout's p99s measured and predicted."""
    lines = []
    for target in figures["targets"]:
        value = "none" if target["value"] is None else f"{target['value']:g}"
        floor = "" if "floor" not in target else f"; no router can go below {target['floor']:g}"
        lines.append(f"{target['result']:4}  {target['name']}: {value} (target: {target['target']}{floor})")
    for old in figures.get("withdrawn_targets", []):
        value = "none" if old["value"] is None else f"{old['value']:g}"
        floor = "none" if old["floor"] is None else f"{old['floor']:g}"
        lines.append(f"----  {old['name']}: {value} (withdrawn: {old['former_target']}; "
                     f"no router can go below {floor})")
    for router, ratios in figures["mixed"]["to_floor"].items():
        lines.append(f"      mixed workload, {router.replace('_', ' ')} over the floor: "
                     f"p99 TTFT {_show(ratios['ttft_p99'])}, p99 end-to-end {_show(ratios['e2e_p99'])}")
    layouts = figures["layouts"]
    for name in ("default", "goodput"):
        layout, measured, planner = layouts[name]["layout"], layouts[name]["measured"], layouts[name]["planner"]
        replicas = f"{layout['replicas']} replica" + ("" if layout["replicas"] == 1 else "s")
        lines.append(f"      layouts, {name}: degree {layout['degree']} ({replicas}), batch "
                     f"{layout['batch_size']}, sequence {layout['sequence_length']}: p99 TTFT "
                     f"{_show(measured['ttft_p99'])} s (planner {_show(planner['ttft_p99'])}), p99 end-to-end "
                     f"{_show(measured['e2e_p99'])} s (planner {_show(planner['e2e_p99'])})")
    return "\n".join(lines)


def _show(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"
