"""The benchmark's scenarios, each the real router (its rendered config) in front of fake replicas
in a child process (:mod:`benchmarks.batching_replica`), driven by the load client
(:mod:`benchmarks.load`). Each returns what it measured; :mod:`benchmarks.report` turns that into
figures and targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from neuron_serving.plan import ServingPlan, ServingRequest, performance, plan_serving
from neuron_serving.plan.engines import engine
from neuron_serving.plan.queueing import ReplicaCosts, Timing, percentile, simulate

from .batching_replica import ReplicaHost, ReplicaSpec
from .load import Call, Outcome, closed_loop, open_loop, stream
from .router import Router, free_port_block, make_plan, round_robin, shipped_config
from .workload import PREFILL_SECONDS_PER_TOKEN, STEP_SECONDS, TIME_SCALE, Mix, capacity, mixed_trace, replica_costs

MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
"""The library's default model; on inf2.24xlarge the planner gives it 6 replicas of batch 4."""
INSTANCE_TYPE = "inf2.24xlarge"
BATCH_SIZE = 4
DEFAULT_PLAN = make_plan(MODEL, INSTANCE_TYPE, BATCH_SIZE, router_port=8080)

OVERHEAD_MODEL = "llama-3.2-1b"
OVERHEAD_INSTANCE_TYPE = "inf2.xlarge"
OVERHEAD_BATCH_SIZE = 64
"""The overhead scenario's single replica decodes every stream at once: no request ever waits,
in the router or in the replica, so the difference between the paths is the router's own."""
OVERHEAD_PROMPT_TOKENS = {1: 500, 64: 10}
"""Prompt length by number of streams. With 64 streams two or three requests join the batch at
each decode step, and their prefills stall it: with longer prompts the inter-token latency would
mostly measure those stalls, whose pattern changes from run to run with the order of arrivals,
and hide the router's share."""

SEED = 12
"""The mixed workload's trace by default: fixed, so that reruns compare like with like."""

FAILOVER_LOAD = 0.5
"""The failover scenario's arrival rate, as a fraction of the replicas' capacity."""

VICTIM = "replica-1"
"""The replica the failover scenario kills."""

LAYOUTS_LONG_INPUT_TOKENS = 3072
"""The layouts scenario's long prompts: the default layout's longest (its ``max_input_tokens``,
three quarters of its sequence length of 4096). The mixed scenario's 8192-token prompts fit no
layout of the planner's model: with static shapes every prompt is padded to the export's sequence
length, which must hold the prompt and its output, and 8192 is Llama 3 8B's whole context
(``max_position_embeddings`` 8192 in meta-llama/Meta-Llama-3-8B's ``config.json`` on the Hugging
Face Hub, as the library's catalog has it: ``neuron_serving/plan/models.py``), leaving no room for
an output. So the
default layout could not serve the mixed workload at all; with 3072-token long prompts it can, and
the comparison is of two layouts on one workload both hold."""

LAYOUTS_LOAD = 0.7
"""The layouts scenario's arrival rate, as a fraction of the default layout's capacity in the
planner's terms (:func:`layouts_capacity`)."""


@dataclass(frozen=True)
class Scale:
    """How much each scenario does. :data:`FULL` is the benchmark; :data:`TINY` only checks that
    the scenarios still run.

    :param overhead_rounds: rounds of the overhead scenario, each one block of requests straight
        to the replica and one through the router, alternating so that both paths see the same
        machine.
    :param overhead_single_requests: sequential requests per block, with one stream.
    :param overhead_parallel_requests: requests per stream per block, with 64 streams.
    :param overhead_output_tokens: tokens each overhead request generates, by number of streams.
        With one stream, short requests give a hundred first tokens in the time a few long ones
        would take: a p99 of fewer than a hundred values is their largest, one scheduling hiccup.
    :param mix: the mixed workload.
    :param mixed_requests: requests of each mixed trace, replayed against each router.
    :param failover_seconds: how long the failover scenario's load lasts. The replica is killed
        at the first health check it answers after a quarter of it (or at half of it without one).
    :param down_seconds: how long the killed replica stays dead.
    :param overload_requests: requests per route while every replica answers overloaded.
    :param layouts_requests: requests of the layouts scenario's trace, replayed against each layout.
    :param mixed_seeds: the mixed traces, one per seed. The p99 of a few hundred requests at 70%
        of capacity moves a lot from one trace to another: its tail is a handful of requests
        caught in the rare bursts of arrivals. Several traces, pooled, give a steadier figure.
    """

    overhead_rounds: int
    overhead_single_requests: int
    overhead_parallel_requests: int
    overhead_output_tokens: dict[int, int]
    mix: Mix
    mixed_requests: int
    failover_seconds: float
    down_seconds: float
    overload_requests: int
    layouts_requests: int
    mixed_seeds: tuple[int, ...] = (SEED,)


FULL = Scale(overhead_rounds=3, overhead_single_requests=34, overhead_parallel_requests=2,
             overhead_output_tokens={1: 8, 64: 32},
             mix=Mix(), mixed_requests=450, failover_seconds=24.0, down_seconds=8.0, overload_requests=12,
             layouts_requests=350)
TINY = Scale(overhead_rounds=1, overhead_single_requests=2, overhead_parallel_requests=1,
             overhead_output_tokens={1: 4, 64: 4},
             mix=Mix(output_tokens=(5, 20)), mixed_requests=10, failover_seconds=4.0, down_seconds=1.0,
             overload_requests=2, layouts_requests=10)


@dataclass(frozen=True)
class Replicas:
    """A plan's fake replicas: the mixed workload's costs, on the benchmark's clock."""

    plan: ServingPlan
    metrics_port: int

    @classmethod
    def default(cls) -> Replicas:
        """The default plan's replicas on free ports: the router's, the replicas', then the
        metrics port."""
        base = free_port_block(len(DEFAULT_PLAN.replicas) + 2)
        plan = make_plan(MODEL, INSTANCE_TYPE, BATCH_SIZE, base)
        return cls(plan, base + len(plan.replicas) + 1)

    @property
    def costs(self) -> ReplicaCosts:
        """What each replica's operations cost, on the benchmark's clock."""
        return replica_costs(self.plan.batch_size, TIME_SCALE)

    @property
    def shipped_limit(self) -> int:
        """Requests the shipped router sends one replica at once: its ``maxconn``, by default the
        batch size within the engine's own limit (``render_router_config``'s
        ``max_concurrent_per_replica``)."""
        return min(self.plan.batch_size, engine("tgi").max_concurrent_requests)

    def specs(self) -> list[ReplicaSpec]:
        return [ReplicaSpec(r.name, r.port, self.costs) for r in self.plan.replicas]


@contextlib.asynccontextmanager
async def serving(config: str, specs: list[ReplicaSpec], workdir: Path,
                  metrics_port: int) -> AsyncIterator[tuple[ReplicaHost, Router]]:
    """The fakes, and HAProxy running ``config`` in front of them, until the block ends."""
    host = ReplicaHost(specs)
    router = Router(config, workdir, metrics_port)
    try:
        await host.start()
        await router.start()
        yield host, router
    finally:
        router.stop()
        await host.stop()


@dataclass
class OverheadResult:
    """Per number of streams, per path (``direct`` or ``router``), every request's outcome."""

    outcomes: dict[int, dict[str, list[Outcome]]] = field(default_factory=dict)


async def overhead(scale: Scale, workdir: Path) -> OverheadResult:
    """The same requests straight to a replica and through the router, at 1 and 64 streams."""
    base = free_port_block(3)
    plan = make_plan(OVERHEAD_MODEL, OVERHEAD_INSTANCE_TYPE, OVERHEAD_BATCH_SIZE, base)
    (replica,) = plan.replicas
    spec = ReplicaSpec(replica.name, replica.port, replica_costs(OVERHEAD_BATCH_SIZE))
    result = OverheadResult()
    async with serving(shipped_config(plan, base + 2), [spec], workdir, base + 2):
        for streams, per_stream in ((1, scale.overhead_single_requests), (64, scale.overhead_parallel_requests)):
            call = Call(0.0, OVERHEAD_PROMPT_TOKENS[streams], scale.overhead_output_tokens[streams])
            # A request's length, to spread the streams' first requests over one of them.
            length = call.input_tokens * PREFILL_SECONDS_PER_TOKEN + call.output_tokens * STEP_SECONDS
            paths: dict[str, list[Outcome]] = {"direct": [], "router": []}
            for _ in range(scale.overhead_rounds):
                for path, port in (("direct", replica.port), ("router", plan.router_port)):
                    paths[path] += await closed_loop(port, streams, [call] * (streams * per_stream),
                                                     deadline=60.0, stagger=length)
            result.outcomes[streams] = paths
    return result


@dataclass
class MixedRun:
    """One mixed trace, each router's outcomes of it (``shipped`` and ``round_robin``), and the
    planner's prediction of it behind the shipped router (:func:`neuron_serving.plan.queueing.simulate`
    with the fakes' own costs, on the same clock), request by request in the trace's order."""

    seed: int
    trace: list[Call]
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    predicted: list[Timing] = field(default_factory=list)


@dataclass
class MixedResult:
    """The mixed traces, one per seed, each replayed against both routers."""

    rate: float
    capacity: float
    runs: list[MixedRun] = field(default_factory=list)

    @property
    def trace(self) -> list[Call]:
        """Every trace's calls, pooled."""
        return [call for run in self.runs for call in run.trace]

    @property
    def predicted(self) -> list[Timing]:
        """The planner's prediction of every trace, pooled."""
        return [timing for run in self.runs for timing in run.predicted]

    @property
    def outcomes(self) -> dict[str, list[Outcome]]:
        """Each router's outcomes of every trace, pooled."""
        pooled: dict[str, list[Outcome]] = {}
        for run in self.runs:
            for router, outcomes in run.outcomes.items():
                pooled.setdefault(router, []).extend(outcomes)
        return pooled


async def mixed(scale: Scale, workdir: Path) -> MixedResult:
    """For each of ``scale.mixed_seeds``, one trace of chat and long-prompt requests at
    ``scale.mix.load`` of the replicas' capacity, replayed against the shipped router and then
    against round robin, each with fresh replicas (the two replays of a trace follow each other,
    so that both see the machine in the same state); and the planner's prediction of each trace
    behind the shipped router, with the costs the fakes were given."""
    step, prefill = STEP_SECONDS / TIME_SCALE, PREFILL_SECONDS_PER_TOKEN / TIME_SCALE
    most = capacity(scale.mix, len(DEFAULT_PLAN.replicas), BATCH_SIZE, step, prefill)
    rate = scale.mix.load * most
    result = MixedResult(rate, most)
    configs: dict[str, Callable[[ServingPlan, int], str]] = {"shipped": shipped_config, "round_robin": round_robin}
    # Room for the last arrivals to be served, and for a backlog: ten of the longest requests.
    longest = scale.mix.long_input_tokens * prefill + scale.mix.output_tokens[1] * step
    for seed in scale.mixed_seeds:
        run = MixedRun(seed, mixed_trace(scale.mix, scale.mixed_requests, rate, seed))
        deadline = run.trace[-1].start + 10 * longest
        for name, config in configs.items():
            replicas = Replicas.default()
            if name == "shipped":
                run.predicted = simulate(replicas.costs, len(replicas.plan.replicas), run.trace,
                                         max_in_flight=replicas.shipped_limit)
            async with serving(config(replicas.plan, replicas.metrics_port), replicas.specs(), workdir,
                               replicas.metrics_port):
                run.outcomes[name] = await open_loop(replicas.plan.router_port, run.trace, deadline)
        result.runs.append(run)
    return result


def layouts_mix(scale: Scale) -> Mix:
    """``scale.mix`` with :data:`LAYOUTS_LONG_INPUT_TOKENS`-token long prompts."""
    return replace(scale.mix, long_input_tokens=LAYOUTS_LONG_INPUT_TOKENS)


def mix_workload(mix: Mix) -> performance.Workload:
    """``mix``'s mean request, rounded: the workload of the planner's capacity."""
    chat = sum(mix.chat_input_tokens) / 2
    mean_input = (1 - mix.long_share) * chat + mix.long_share * mix.long_input_tokens
    return performance.Workload(round(mean_input), round(sum(mix.output_tokens) / 2))


def largest_request(mix: Mix) -> performance.Workload:
    """``mix``'s largest request: the workload a layout's shapes must hold."""
    return performance.Workload(max(mix.long_input_tokens, mix.chat_input_tokens[1]), mix.output_tokens[1])


def layouts_capacity(mix: Mix, plan: ServingPlan) -> float:
    """Requests per second ``plan``'s instance completes at saturation with ``mix``'s mean request,
    in real seconds: :func:`neuron_serving.plan.performance.predict`'s
    ``requests_per_second_instance``, every slot always busy and every prefill the whole sequence's
    (static shapes: so the mean prompt's length does not matter, the mean output's does)."""
    return performance.predict(plan, mix_workload(mix)).requests_per_second_instance


def with_ports(plan: ServingPlan, router_port: int) -> ServingPlan:
    """``plan``'s layout again, its router on ``router_port`` and its replicas on the ports after."""
    return plan_serving(replace(plan.request, router_port=router_port, first_replica_port=router_port + 1))


def goodput_layout(mix: Mix, rate: float, trace: list[Call], p99_ttft_ms: float) -> performance.Recommendation:
    """The layout the ``goodput`` objective picks on the default instance type for ``trace`` (real
    seconds) at ``rate``, within ``p99_ttft_ms``: the cheapest fleet, and among fleets of its price
    the lowest p99 TTFT. Raises :class:`RuntimeError` unless that fleet is one instance, the default
    layout's count: the scenario compares layouts of one instance."""
    request = ServingRequest(MODEL, INSTANCE_TYPE)
    recommendation = performance.recommend(request, "goodput", workload=largest_request(mix),
                                           goodput=performance.Goodput(rate, p99_ttft_ms=p99_ttft_ms), trace=trace)
    if recommendation.load is None or recommendation.load.instances != 1:
        instances = None if recommendation.load is None else recommendation.load.instances
        raise RuntimeError(f"the goodput objective picked {performance.layout_label(recommendation.plan)} on "
                           f"{instances} instances, not 1: the layouts scenario compares layouts of one instance")
    return recommendation


@dataclass
class LayoutRun:
    """One layout's replay of the layouts trace behind the shipped router: its plan, the fakes'
    costs (the planner's :func:`~neuron_serving.plan.performance.replica_costs` on the benchmark's
    clock), each request's outcome, and the planner's prediction of the same trace with the same
    costs (:func:`~neuron_serving.plan.queueing.simulate`), in the trace's order."""

    plan: ServingPlan
    costs: ReplicaCosts
    outcomes: list[Outcome] = field(default_factory=list)
    predicted: list[Timing] = field(default_factory=list)


@dataclass
class LayoutsResult:
    """The layouts scenario: its mix, the rate and the default layout's capacity (real seconds),
    the trace (on the benchmark's clock), the goodput objective's recommendation and its p99 TTFT
    target, and each layout's run (``default`` and ``goodput``)."""

    mix: Mix
    rate: float
    capacity: float
    trace: list[Call]
    recommendation: performance.Recommendation
    p99_ttft_target_ms: float
    runs: dict[str, LayoutRun] = field(default_factory=dict)


async def layouts(scale: Scale, workdir: Path) -> LayoutsResult:
    """Today's default layout against the one the ``goodput`` objective picks for the same load,
    on one instance each: one trace of :func:`layouts_mix` at :data:`LAYOUTS_LOAD` of the default
    layout's capacity (:func:`layouts_capacity`), replayed through the shipped router in front of
    each layout's fake replicas, whose costs are the planner's for that layout. The goodput
    objective's target is the default layout's own predicted p99 TTFT on this trace: the cheapest
    layout doing at least as well, and among those of that price the lowest p99 TTFT."""
    mix = layouts_mix(scale)
    most = layouts_capacity(mix, DEFAULT_PLAN)
    rate = LAYOUTS_LOAD * most
    real = mixed_trace(mix, scale.layouts_requests, rate, SEED)
    default_alone = simulate(performance.replica_costs(DEFAULT_PLAN), len(DEFAULT_PLAN.replicas), real)
    target_ms = percentile([t.ttft_s for t in default_alone], 99) * 1e3
    recommendation = goodput_layout(mix, rate, real, target_ms)
    result = LayoutsResult(mix, rate, most, [replace(c, start=c.start / TIME_SCALE) for c in real],
                           recommendation, target_ms)
    for name, plan in (("default", DEFAULT_PLAN), ("goodput", recommendation.plan)):
        base = free_port_block(len(plan.replicas) + 2)
        ported = with_ports(plan, base)
        metrics_port = base + len(ported.replicas) + 1
        run = LayoutRun(ported, performance.replica_costs(ported).scaled(TIME_SCALE))
        limit = min(ported.batch_size, engine("tgi").max_concurrent_requests)  # the shipped maxconn
        run.predicted = simulate(run.costs, len(ported.replicas), result.trace, max_in_flight=limit)
        # Room for the last arrivals, and for a backlog: ten of the longest requests.
        longest = run.costs.prefill(mix.long_input_tokens) + mix.output_tokens[1] * run.costs.step(ported.batch_size)
        specs = [ReplicaSpec(r.name, r.port, run.costs) for r in ported.replicas]
        async with serving(shipped_config(ported, metrics_port), specs, workdir, metrics_port):
            run.outcomes = await open_loop(ported.router_port, result.trace, result.trace[-1].start + 10 * longest)
        result.runs[name] = run
    return result


@dataclass
class FailoverResult:
    """What happened when one replica was killed under load and restarted."""

    outcomes: list[Outcome]
    killed_at: float
    restarted_at: float
    in_flight_on_killed: int
    marked_down_at: float | None
    first_request_after_restart: float | None
    tried_killed: int
    """New requests sent to the killed replica after its death, each then redispatched."""
    retries: int
    redispatches: int
    states: list[tuple[float, str]]
    """The killed replica's state in HAProxy, each time it changed."""


async def failover(scale: Scale, workdir: Path) -> FailoverResult:
    """Chat requests at :data:`FAILOVER_LOAD` of the replicas' capacity; :data:`VICTIM` is killed
    and later restarted (see :attr:`Scale.failover_seconds`). The router runs its production
    health-check intervals, and the kill comes just after a health check that the replica
    passed: the moment when the checks alone take longest to notice."""
    replicas = Replicas.default()
    chat = Mix(long_share=0.0, chat_input_tokens=scale.mix.chat_input_tokens, output_tokens=scale.mix.output_tokens)
    step, prefill = STEP_SECONDS / TIME_SCALE, PREFILL_SECONDS_PER_TOKEN / TIME_SCALE
    rate = FAILOVER_LOAD * capacity(chat, len(replicas.plan.replicas), BATCH_SIZE, step, prefill)
    # Poisson arrivals until the load's end: twice the expected count, then the late ones dropped.
    trace = [call for call in mixed_trace(chat, 2 * int(rate * scale.failover_seconds) + 1, rate, SEED)
             if call.start < scale.failover_seconds]
    deadline = scale.failover_seconds + 10 * chat.output_tokens[1] * step
    async with serving(shipped_config(replicas.plan, replicas.metrics_port), replicas.specs(), workdir,
                       replicas.metrics_port) as (host, router):
        begin = time.monotonic()
        load = asyncio.create_task(open_loop(replicas.plan.router_port, trace, deadline))
        states: list[tuple[float, str]] = []
        done = asyncio.Event()
        watch = asyncio.create_task(_watch(router, states, done))
        await asyncio.sleep(scale.failover_seconds / 4)
        await _next_health_check(host, begin + scale.failover_seconds / 2)
        killed_at = time.monotonic()
        in_flight = await host.kill(VICTIM)
        await asyncio.sleep(scale.down_seconds)
        restarted_at = await host.restart(VICTIM)
        outcomes = await load
        done.set()
        await watch
        stats = await host.stats()
        rows = await router.stats()
    server = next(r for r in rows if r["pxname"] == "replicas" and r["svname"] == VICTIM)
    backend = next(r for r in rows if r["pxname"] == "replicas" and r["svname"] == "BACKEND")
    down = next((t for t, state in states if t >= killed_at and state.startswith("DOWN")), None)
    return FailoverResult(outcomes, killed_at, restarted_at, in_flight, down,
                          stats[VICTIM].first_request_after_restart, int(server["wredis"] or 0),
                          int(backend["wretr"] or 0), int(backend["wredis"] or 0), states)


async def _next_health_check(host: ReplicaHost, deadline: float) -> None:
    """Return when :data:`VICTIM` answers its next health check, or at ``deadline``."""
    checks = (await host.stats())[VICTIM].health_checks
    while time.monotonic() < deadline and (await host.stats())[VICTIM].health_checks == checks:
        await asyncio.sleep(0.02)


async def _watch(router: Router, states: list[tuple[float, str]], done: asyncio.Event) -> None:
    """Record :data:`VICTIM`'s state each time it changes, polling every 50 ms until ``done``.
    (Not stopped by cancelling it: Python 3.11's ``asyncio.wait_for`` can swallow a cancellation.)"""
    while not done.is_set():
        with contextlib.suppress(OSError, ValueError, TimeoutError):
            state = (await router.server_states())[VICTIM]
            if not states or states[-1][1] != state:
                states.append((time.monotonic(), state))
        await asyncio.sleep(0.05)


@dataclass
class OverloadResult:
    """What clients saw while every replica answered overloaded."""

    outcomes: dict[str, list[Outcome]]
    """By route: ``/generate`` and ``/generate_stream``."""
    states_after: dict[str, str]
    retries: int
    answered_by_replicas: int
    """Requests that reached a replica (each answered overloaded)."""


async def overload(scale: Scale, workdir: Path) -> OverloadResult:
    """``scale.overload_requests`` requests on each generation route while every replica answers
    TGI's overloaded error."""
    replicas = Replicas.default()
    call = Call(0.0, 100, 10)
    async with serving(shipped_config(replicas.plan, replicas.metrics_port), replicas.specs(), workdir,
                       replicas.metrics_port) as (host, router):
        for replica in replicas.plan.replicas:
            await host.overload(replica.name, True)
        outcomes = {}
        for route in ("/generate", "/generate_stream"):
            outcomes[route] = list(await asyncio.gather(*(
                stream(replicas.plan.router_port, call, 10.0, route) for _ in range(scale.overload_requests))))
        states = await router.server_states()
        backend = await router.backend()
        stats = await host.stats()
    return OverloadResult(outcomes, states, int(backend["wretr"] or 0), sum(s.overloaded for s in stats.values()))


def statuses(outcomes: list[Outcome]) -> dict[str, int]:
    """How many answers had each HTTP status (``none`` when no status arrived)."""
    return dict(Counter(str(o.status) if o.status is not None else "none" for o in outcomes))
