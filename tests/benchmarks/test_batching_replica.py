"""The benchmark's fake replica batches as TGI Neuron v3.3.5 does (its module header cites the
sources): a request joins the batch at the next step when a slot is free, its prefill stalls the
running requests without giving them a token, and each decode step gives every running request
one. The durations are long enough that the event loop's scheduling delays (which only ever add
time) cannot make a check pass that should fail."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from benchmarks import batching_replica
from benchmarks.batching_replica import MAX_CONCURRENT_REQUESTS, BatchingReplica, ReplicaSpec
from benchmarks.load import Call, Outcome, stream
from benchmarks.router import free_port_block
from neuron_serving.plan.queueing import ReplicaCosts, simulate

STEP = 0.05
PREFILL_PER_TOKEN = 0.0001
LONG_TOKENS = 3000
"""A prompt whose prefill (0.3 s) is six decode steps long."""


def served(batch_size: int, scenario: Callable[[int], Awaitable[list[Outcome]]],
           costs: ReplicaCosts | None = None) -> list[Outcome]:
    """``scenario`` run against one fake replica on a free port: by default of ``batch_size``, a
    step of :data:`STEP` and a prefill of :data:`PREFILL_PER_TOKEN` per prompt token."""
    costs = costs or ReplicaCosts(batch_size, 0.0, STEP, prefill_per_token_s=PREFILL_PER_TOKEN)

    async def main() -> list[Outcome]:
        port = free_port_block(1)
        replica = BatchingReplica(ReplicaSpec("replica-0", port, costs))
        await replica.start()
        try:
            return await scenario(port)
        finally:
            await replica.kill()

    return asyncio.run(main())


def test_a_prefill_stalls_the_running_requests_and_gives_them_no_token() -> None:
    async def scenario(port: int) -> list[Outcome]:
        running = asyncio.create_task(stream(port, Call(0, 1, 12), timeout=10))
        await asyncio.sleep(3 * STEP)
        joining = await stream(port, Call(0, LONG_TOKENS, 2), timeout=10)
        return [await running, joining]

    running, joining = served(4, scenario)
    assert running.ok and joining.ok, (running.error, joining.error)
    prefill = LONG_TOKENS * PREFILL_PER_TOKEN
    # The stalled gap is the prefill and the step after it: a token at the prefill's end (as if
    # the prefill decoded the running requests too) would split it in two. (Half a step of slack:
    # the token before the gap may have come out late, the device's clock running on regardless.)
    assert max(running.itls) >= prefill + STEP / 2, running.itls
    assert sum(gap >= prefill for gap in running.itls) == 1, running.itls
    assert joining.ttft is not None and joining.ttft >= prefill


def test_a_decode_step_gives_every_running_request_a_token() -> None:
    async def scenario(port: int) -> list[Outcome]:
        return list(await asyncio.gather(*(stream(port, Call(0, 1, 8), timeout=10) for _ in range(4))))

    outcomes = served(4, scenario)
    assert all(o.ok and o.tokens == 8 for o in outcomes)
    # One prefill for the four (they arrive together) and then seven shared steps: a batch of four
    # takes no longer than one request alone would.
    assert all(o.end is not None and 7 * STEP <= o.end < 14 * STEP for o in outcomes), [o.end for o in outcomes]


def test_a_request_beyond_the_batch_waits_for_a_free_slot() -> None:
    async def scenario(port: int) -> list[Outcome]:
        first = asyncio.create_task(stream(port, Call(0, 1, 6), timeout=10))
        await asyncio.sleep(STEP / 2)
        second = await stream(port, Call(0, 1, 1), timeout=10)
        return [await first, second]

    first, second = served(1, scenario)
    assert first.ok and second.ok
    # Sent during the first's first decode step, the second starts only once the first's five
    # steps are over: it waits at least four, where a free slot would have taken it at the next.
    assert second.ttft is not None and second.ttft >= 4 * STEP, second.ttft


def test_a_late_event_loop_does_not_slow_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each sleep here wakes 5 ms late, as on a busy machine; the replica's steps still average
    their modelled length, so the benchmark's load is the one it says."""
    late = 0.005
    pause = batching_replica._pause

    async def late_pause(seconds: float) -> None:
        await pause(seconds)
        await asyncio.sleep(late)

    monkeypatch.setattr(batching_replica, "_pause", late_pause)

    async def scenario(port: int) -> list[Outcome]:
        return [await stream(port, Call(0, 1, 40), timeout=10)]

    (outcome,) = served(1, scenario)
    assert outcome.ok
    # 39 steps of 50 ms and a prefill: 1.95 s on the device's clock. Were each late wake-up added
    # to the next step, it would take 40 x 5 ms = 0.2 s more.
    assert outcome.end is not None and outcome.end < 39 * STEP + 3 * late + 0.05, outcome.end


def test_a_replica_serves_a_small_trace_as_the_planner_predicts_it() -> None:
    """The fake takes its decisions from the planner's model: a request joining mid-step, one
    waiting for a free slot, a fixed prefill and a per-slot step term all come out at the times
    :func:`simulate` gives, within the event loop's slack."""
    costs = ReplicaCosts(2, 0.01, STEP, prefill_per_token_s=PREFILL_PER_TOKEN, step_per_slot_s=0.002)
    # The second arrives during the first's first step; the third finds both slots taken and waits
    # until the second finishes. Arrivals fall mid-operation, never at a boundary.
    trace = [Call(0.0, 100, 6), Call(0.045, 200, 3), Call(0.125, 100, 4)]
    predicted = simulate(costs, 1, trace, max_in_flight=MAX_CONCURRENT_REQUESTS)

    async def scenario(port: int) -> list[Outcome]:
        loop = asyncio.get_running_loop()
        begin = loop.time()

        async def one(call: Call) -> Outcome:
            await asyncio.sleep(begin + call.start - loop.time())
            return await stream(port, call, timeout=10)

        return list(await asyncio.gather(*(one(call) for call in trace)))

    outcomes = served(2, scenario, costs)
    slack = 0.015
    # The third waited: its first token came after the second's last, not one prefill after it arrived.
    assert predicted[2].ttft_s > trace[1].start + predicted[1].e2e_s - trace[2].start
    for outcome, timing in zip(outcomes, predicted, strict=True):
        assert outcome.ok, outcome.error
        assert outcome.ttft == pytest.approx(timing.ttft_s, abs=slack), (outcome.ttft, timing)
        assert outcome.end == pytest.approx(timing.e2e_s, abs=slack), (outcome.end, timing)


def test_a_spec_goes_through_json_whole() -> None:
    """:class:`ReplicaHost` hands the specs to its child process as JSON; the costs come back as
    :class:`ReplicaCosts`."""
    spec = ReplicaSpec("replica-3", 8084, ReplicaCosts(4, 0.5, 0.03, 0.0001, 0.002), max_concurrent_requests=16)
    assert ReplicaSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
