"""The discrete-event model of batching replicas behind the router (neuron_serving.plan.queueing):
its fast runs of decode steps against a one-token-at-a-time replay, and what the physics of
batching says it must show."""

import heapq
import math

import pytest

from neuron_serving.plan import ServingConfigError
from neuron_serving.plan.queueing import BatchSchedule, Call, ReplicaCosts, Timing, percentile, poisson_trace, simulate


def _one_token_at_a_time(costs: ReplicaCosts, replicas: int, trace: list[Call]) -> list[Timing]:
    """The same router and replicas, every operation its own event: the reference that
    :func:`simulate`'s runs of steps must reproduce."""
    schedules = [BatchSchedule(costs) for _ in range(replicas)]
    running: list = [None] * replicas
    used = [0] * replicas
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    waiting: list[int] = []
    events: list = []
    count = 0

    def push(time, replica, index=-1):
        nonlocal count
        count += 1
        heapq.heappush(events, (time, count, replica, index))

    def start(replica, now):
        running[replica] = schedules[replica].next()
        if running[replica] is not None:
            push(now + running[replica].seconds, replica)

    def send(replica, index, now):
        nonlocal count
        schedules[replica].add(trace[index])
        count += 1
        used[replica] = count
        if running[replica] is None:
            start(replica, now)

    for index, call in enumerate(trace):
        push(call.start, -1, index)
    position = {id(call): index for index, call in enumerate(trace)}
    while events:
        now, _, replica, index = heapq.heappop(events)
        if replica < 0:
            free = [i for i in range(replicas) if schedules[i].in_flight() < costs.batch_size]
            if free and not waiting:
                send(min(free, key=lambda i: (schedules[i].in_flight(), used[i])), index, now)
            else:
                waiting.append(index)
            continue
        operation = running[replica]
        if operation.kind == "prefill":
            for call in operation.requests:
                first[position[id(call)]] = now
        for call in schedules[replica].done(operation):
            last[position[id(call)]] = now
        running[replica] = None
        while waiting and schedules[replica].in_flight() < costs.batch_size:
            schedules[replica].add(trace[waiting.pop(0)])
        start(replica, now)
    return [Timing(first[i] - call.start, last[i] - call.start) for i, call in enumerate(trace)]


COSTS = ReplicaCosts(batch_size=4, prefill_s=0.3, step_s=0.02, step_per_slot_s=0.0005)


@pytest.mark.parametrize("rate", [0.5, 2.0, 3.0, 5.0])
def test_runs_of_steps_give_the_timings_of_one_token_at_a_time(rate):
    trace = poisson_trace(rate, 400, 512, 100, seed=3)
    fast, reference = simulate(COSTS, 3, trace), _one_token_at_a_time(COSTS, 3, trace)
    for got, expected in zip(fast, reference, strict=True):
        assert got.ttft_s == pytest.approx(expected.ttft_s, abs=1e-6)
        assert got.e2e_s == pytest.approx(expected.e2e_s, abs=1e-6)


def test_a_request_alone_waits_for_nothing_but_its_prefill_and_its_steps():
    (timing,) = simulate(COSTS, 2, [Call(0.0, 100, 10)])
    assert timing.ttft_s == pytest.approx(0.3)
    assert timing.e2e_s == pytest.approx(0.3 + 9 * COSTS.step(1))


def test_a_request_arriving_while_every_slot_is_busy_waits_for_the_first_to_finish():
    trace = [Call(0.0, 100, 50), Call(0.001, 100, 50)]
    one_slot = ReplicaCosts(batch_size=1, prefill_s=0.3, step_s=0.02)
    first, second = simulate(one_slot, 1, trace)
    assert second.ttft_s == pytest.approx(first.e2e_s - 0.001 + 0.3)


def test_more_load_lengthens_the_tail_of_the_time_to_first_token():
    p99 = [percentile([t.ttft_s for t in simulate(COSTS, 3, poisson_trace(rate, 2000, 512, 100, seed=1))], 99)
           for rate in (1.0, 4.0, 6.0)]
    assert p99 == sorted(p99) and p99[-1] > 2 * p99[0]


def test_the_router_spreads_requests_over_the_replicas_before_filling_one():
    # Two requests at once on two idle replicas: each prefilled at once, none waits for the other's prefill.
    first, second = simulate(COSTS, 2, [Call(0.0, 100, 5), Call(0.0, 100, 5)])
    assert first.ttft_s == second.ttft_s == pytest.approx(0.3)


@pytest.mark.parametrize(("name", "value"), [("batch_size", 0), ("prefill_s", -1.0), ("step_s", math.nan)])
def test_bad_costs_are_refused_naming_the_field(name, value):
    fields = {"batch_size": 4, "prefill_s": 0.3, "step_s": 0.02, name: value}
    with pytest.raises(ServingConfigError, match=rf"{name} \("):
        ReplicaCosts(**fields)


def test_a_closed_loop_keeps_its_clients_requests_in_flight_and_no_more():
    one_slot = ReplicaCosts(batch_size=1, prefill_s=0.3, step_s=0.02)
    trace = [Call(0.0, 100, 10) for _ in range(5)]
    timings = simulate(one_slot, 1, trace, clients=1)
    # One client: each request starts when the last ends, so none waits: every one takes a request's time alone.
    alone = 0.3 + 9 * 0.02
    assert [t.e2e_s for t in timings] == pytest.approx([alone] * 5)
    # Two clients on one slot: after the first two, each request waits for the other client's request.
    two = simulate(one_slot, 1, trace, clients=2)
    assert two[0].e2e_s == pytest.approx(alone) and two[1].e2e_s == pytest.approx(2 * alone)
    assert all(t.ttft_s == pytest.approx(alone + 0.3) for t in two[2:])


def test_a_closed_loop_needs_a_client():
    with pytest.raises(ServingConfigError, match=r"clients \(0\) must be an integer of at least 1"):
        simulate(COSTS, 1, [Call(0.0, 1, 1)], clients=0)
