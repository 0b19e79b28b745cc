"""Latency under load: a discrete-event model of replicas that batch continuously behind the
on-host router, on a virtual clock.

One model serves two masters. The planner replays a trace of requests through it to predict the
percentiles of time to first token and end-to-end latency a layout gives at a request rate
(:func:`simulate`); the serving-path benchmark's fake replicas (``benchmarks/batching_replica.py``)
take their scheduling decisions from the same :class:`BatchSchedule` and their costs from the same
:class:`ReplicaCosts` in real time, so that a prediction and a measurement of one trace differ only
by what the model leaves out: the router's own delay, the network and the event loops.

What it models:

- **A replica** (:class:`BatchSchedule`) runs one operation at a time. Before each decode step it
  prefills the waiting requests the batch has free slots for, while the batch waits; each joining
  request's first token comes out at the prefill's end. Then one step gives every request in the
  batch a token. This is TGI's batching (text-generation-inference v3.3.5,
  backends/v2/src/backend.rs ``batching_task``; the Neuron generator pauses the active slots
  during a prefill: backends/neuron/server/text_generation_server/generator.py,
  ``NeuronGenerator.prefill``); optimum-neuron's vLLM pauses decoding for a prefill too.
- **The router** (:func:`simulate`) sends each request to the replica with the fewest requests in
  flight among those below their limit (HAProxy ``balance leastconn`` with ``maxconn`` per server,
  ``userdata/haproxy.cfg.j2``; ties go to the replica that has waited longest, as HAProxy's
  leastconn tree requeues a server behind its equals once it is used). When every replica is at
  its limit, requests wait in one queue, first come first served, and the first replica to finish
  a request takes the head of the queue (HAProxy's ``process_srv_queue`` when a connection slot is
  released).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from .errors import Problems, ServingConfigError, problem


class Request(Protocol):
    """A request as the model needs it."""

    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...


class Arrival(Request, Protocol):
    """A request of a trace: when it arrives, seconds from the trace's start."""

    @property
    def start(self) -> float: ...


@dataclass(frozen=True)
class ReplicaCosts:
    """What a replica's operations cost, seconds.

    :param batch_size: slots of the batch.
    :param prefill_s: each joining request's prefill, whatever its prompt: with static shapes every
        prompt is padded to the export's sequence length.
    :param step_s: a decode step with no slot busy.
    :param prefill_per_token_s: each joining request's prefill per prompt token, on top of
        ``prefill_s``. Default: 0 (static shapes).
    :param step_per_slot_s: what each busy slot adds to a decode step. Default: 0.
    """

    batch_size: int
    prefill_s: float
    step_s: float
    prefill_per_token_s: float = 0.0
    step_per_slot_s: float = 0.0

    def __post_init__(self) -> None:
        problems = Problems()
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            problems.add("batch_size", self.batch_size, "must be an integer of at least 1")
        for name in ("prefill_s", "step_s", "prefill_per_token_s", "step_per_slot_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                problems.add(name, value, "must be a number of at least 0")
        if not problems and self.step_s + self.step_per_slot_s <= 0:
            problems.add("step_s", self.step_s, "and step_per_slot_s must not both be 0: a step takes time")
        problems.raise_if_any()

    def prefill(self, input_tokens: int) -> float:
        """Seconds of one request's prefill."""
        return self.prefill_s + self.prefill_per_token_s * input_tokens

    def step(self, busy: int) -> float:
        """Seconds of a decode step with ``busy`` slots busy."""
        return self.step_s + self.step_per_slot_s * busy

    def scaled(self, factor: float) -> ReplicaCosts:
        """Every cost divided by ``factor``: the same replica on a clock ``factor`` times faster."""
        return ReplicaCosts(self.batch_size, self.prefill_s / factor, self.step_s / factor,
                            self.prefill_per_token_s / factor, self.step_per_slot_s / factor)


R = TypeVar("R", bound=Request)


@dataclass(frozen=True)
class Operation(Generic[R]):
    """One operation of a replica: a ``prefill`` of the joining requests or a decode ``step`` of the
    batch; each of ``requests`` gets one token when it ends, ``seconds`` after it starts."""

    kind: str
    seconds: float
    requests: tuple[R, ...]


class BatchSchedule(Generic[R]):
    """One replica's batching decisions (see the module docstring), clock-free: the caller runs each
    :meth:`next` operation for its ``seconds`` and then calls :meth:`done`."""

    def __init__(self, costs: ReplicaCosts) -> None:
        self.costs = costs
        self.waiting: list[R] = []
        self.batch: list[R] = []
        self.produced: dict[int, int] = {}
        self._prefilled = False

    def add(self, request: R) -> None:
        """A request reaches the replica; it joins at the next prefill with a free slot."""
        self.waiting.append(request)
        self.produced[id(request)] = 0

    def in_flight(self) -> int:
        return len(self.waiting) + len(self.batch)

    def next(self) -> Operation[R] | None:
        """The next operation: the prefill of as many waiting requests as there are free slots (not
        twice in a row: the batch steps between two prefills), else a step of the batch, else none."""
        free = self.costs.batch_size - len(self.batch)
        if self.waiting and free > 0 and not (self._prefilled and self.batch):
            joining, self.waiting = self.waiting[:free], self.waiting[free:]
            self.batch.extend(joining)
            self._prefilled = True
            return Operation("prefill", sum(self.costs.prefill(r.input_tokens) for r in joining), tuple(joining))
        self._prefilled = False
        if self.batch:
            return Operation("step", self.costs.step(len(self.batch)), tuple(self.batch))
        return None

    def done(self, operation: Operation[R], repeat: int = 1) -> list[R]:
        """``operation`` ended (``repeat`` times in a row, for a step): ``repeat`` tokens to each of its
        requests; returns those that got their last token, which leave the batch."""
        finished = []
        for request in operation.requests:
            key = id(request)
            if key not in self.produced:
                continue  # dropped while the operation ran
            self.produced[key] += repeat
            if self.produced[key] >= request.output_tokens:
                finished.append(request)
        for request in finished:
            self.drop(request)
        return finished

    def steps_to_finish(self) -> int:
        """Steps until the first request of the batch gets its last token (the batch is not empty)."""
        return min(request.output_tokens - self.produced[id(request)] for request in self.batch)

    def tokens(self, request: R) -> int:
        """Tokens ``request`` has had so far."""
        return self.produced.get(id(request), 0)

    def drop(self, request: R) -> None:
        """``request`` leaves the replica (finished, or its client went away)."""
        self.produced.pop(id(request), None)
        if request in self.batch:
            self.batch.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)


@dataclass(frozen=True)
class Timing:
    """When one request of a trace got its first and its last token, seconds from its arrival.

    :param ttft_s: time to first token.
    :param e2e_s: end-to-end latency: until its last token.
    """

    ttft_s: float
    e2e_s: float


@dataclass(eq=False)
class _Job:
    arrival: Arrival
    first: float | None = None
    last: float | None = None

    @property
    def input_tokens(self) -> int:
        return self.arrival.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.arrival.output_tokens


@dataclass
class _Busy:
    """What a replica is doing: ``operation`` since ``start``, ``repeat`` times in a row, ending at
    the event numbered ``event``."""

    operation: Operation[_Job]
    start: float
    repeat: int
    event: int


def simulate(costs: ReplicaCosts, replicas: int, trace: Sequence[Arrival],
             max_in_flight: int | None = None, clients: int | None = None) -> list[Timing]:
    """Each request of ``trace`` served by ``replicas`` replicas of ``costs`` behind the router; their
    timings, in the trace's order.

    The decode steps between two changes of a batch run as one event: the steps until the batch's
    first request finishes, cut short at the boundary of the step under way when a new request
    reaches the replica. The timings are those of stepping one token at a time.

    :param max_in_flight: requests the router sends one replica at once. Default: its batch size
        (``maxconn`` in the shipped router).
    :param clients: a closed loop of this many clients, each sending its next request of the trace
        as soon as its last one ends (a load generator's concurrency limit): the first ``clients``
        requests arrive at their ``start``, each later one when a request ends, and its timings
        count from then. Default: none, every request arrives at its ``start``.
    """
    if clients is not None and (isinstance(clients, bool) or not isinstance(clients, int) or clients < 1):
        raise ServingConfigError([problem("clients", clients, "must be an integer of at least 1")])
    limit = costs.batch_size if max_in_flight is None else max_in_flight
    schedules = [BatchSchedule[_Job](costs) for _ in range(replicas)]
    busy: list[_Busy | None] = [None] * replicas
    used = [0] * replicas  # when each replica last took a request, for leastconn's ties
    jobs = [_Job(arrival) for arrival in trace]
    queue: deque[_Job] = deque()
    events: list[tuple[float, int, int, int]] = []  # time, number, replica (-1: an arrival), job
    count = 0

    def push(time: float, replica: int, job: int = -1) -> int:
        nonlocal count
        count += 1
        heapq.heappush(events, (time, count, replica, job))
        return count

    def start(replica: int, now: float) -> None:
        schedule = schedules[replica]
        operation = schedule.next()
        if operation is None:
            busy[replica] = None
            return
        # A step right after a prefill, with requests waiting for a free slot, is one step: they join after it.
        joins = schedule.waiting and len(schedule.batch) < costs.batch_size
        repeat = 1 if operation.kind == "prefill" or joins else schedule.steps_to_finish()
        busy[replica] = _Busy(operation, now, repeat, push(now + repeat * operation.seconds, replica))

    def send(replica: int, job: _Job, now: float) -> None:
        nonlocal count
        schedules[replica].add(job)
        count += 1
        used[replica] = count
        state = busy[replica]
        if state is None:
            start(replica, now)
        elif state.operation.kind == "step":
            # The job joins after the step under way: the run ends at that step's boundary.
            steps = max(1, math.ceil((now - state.start) / state.operation.seconds - 1e-9))
            if steps < state.repeat:
                state.repeat = steps
                state.event = push(state.start + steps * state.operation.seconds, replica)

    arrived = [job.arrival.start for job in jobs]
    opened = len(jobs) if clients is None else min(clients, len(jobs))
    for index in range(opened):
        push(arrived[index], -1, index)
    while events:
        now, number, replica, index = heapq.heappop(events)
        if replica < 0:
            job = jobs[index]
            free = [i for i in range(replicas) if schedules[i].in_flight() < limit]
            if free and not queue:
                send(min(free, key=lambda i: (schedules[i].in_flight(), used[i])), job, now)
            else:
                queue.append(job)
            continue
        state = busy[replica]
        if state is None or state.event != number:
            continue  # a run cut short ends at another event
        if state.operation.kind == "prefill":
            for job in state.operation.requests:
                job.first = now
        for job in schedules[replica].done(state.operation, state.repeat):
            job.last = now
            if opened < len(jobs):  # its client sends the next request
                arrived[opened] = now
                push(now, -1, opened)
                opened += 1
        busy[replica] = None
        while queue and schedules[replica].in_flight() < limit:
            schedules[replica].add(queue.popleft())
        start(replica, now)
    return [Timing(job.first - start, job.last - start)  # type: ignore[operator]
            for job, start in zip(jobs, arrived, strict=True)]


@dataclass(frozen=True)
class Call:
    """A request of a generated trace.

    :param start: when it arrives, seconds from the trace's start.
    :param input_tokens: its prompt's tokens.
    :param output_tokens: the tokens it generates.
    """

    start: float
    input_tokens: int
    output_tokens: int


def poisson_trace(rate: float, count: int, input_tokens: int, output_tokens: int, seed: int = 0) -> list[Call]:
    """``count`` requests of ``input_tokens`` and ``output_tokens`` arriving as a Poisson process of
    ``rate`` per second; the same ``seed`` gives the same trace."""
    rng = random.Random(seed)
    calls = []
    start = 0.0
    for _ in range(count):
        start += rng.expovariate(rate)
        calls.append(Call(start, input_tokens, output_tokens))
    return calls


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ``values``, which must not be empty."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]
