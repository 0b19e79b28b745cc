"""What the fake replicas cost and what the clients ask for: the modelled replica, the mixed
chat and long-prompt workload, and the benchmark's clock.

The replica is modelled on the published operating point of TGI Neuron where both costs were
measured together: Hugging Face's benchmark of TGI data parallelism on inf2.48xlarge (optimum-neuron
documentation, guides/benchmark: Llama-3.1-8B, batch 8, degree 8, synchronous requests of about
15.9k prompt tokens) gave 29.8 ms per output token and 1.59 s to the first token, hence 0.1 ms of
prefill per prompt token. The layout is the
library's default on inf2.24xlarge (6 replicas of batch 4), as issue 12 asks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from neuron_serving.plan.queueing import ReplicaCosts

from .load import Call

STEP_SECONDS = 0.0298
"""One decode step of a replica's batch (the blog's inter-token latency)."""

PREFILL_SECONDS_PER_TOKEN = 1.59 / 15_900
"""Prefill per prompt token (the blog's time to first token over its prompt length)."""

TIME_SCALE = 3.0
"""The mixed workload runs this many times faster than the modelled replicas (every cost and
every arrival time divided by it), so that enough requests fit in the benchmark's minutes. Its
figures are ratios between two routers on the same trace, which a uniform change of clock does not
move; the router's own delay (well under a millisecond a request) grows relatively by as much,
which favours neither of the two."""


def replica_costs(batch_size: int, time_scale: float = 1.0) -> ReplicaCosts:
    """The modelled replica's costs in the planner's terms, on a clock ``time_scale`` times faster:
    :data:`PREFILL_SECONDS_PER_TOKEN` per prompt token and :data:`STEP_SECONDS` a decode step, with
    neither a fixed prefill nor a per-slot step term (the blog gives one operating point only)."""
    costs = ReplicaCosts(batch_size, 0.0, STEP_SECONDS, prefill_per_token_s=PREFILL_SECONDS_PER_TOKEN)
    return costs.scaled(time_scale)


@dataclass(frozen=True)
class Mix:
    """A two-class workload: short chat requests and long prompts.

    :param long_share: the fraction of long prompts.
    :param long_input_tokens: a long prompt's length.
    :param chat_input_tokens: the range of a chat prompt's length (uniform).
    :param output_tokens: the range of every request's output length (uniform).
    :param load: the arrival rate as a fraction of the replicas' capacity (:func:`capacity`).
    """

    long_share: float = 0.2
    long_input_tokens: int = 8192
    chat_input_tokens: tuple[int, int] = (100, 1000)
    output_tokens: tuple[int, int] = (50, 250)
    load: float = 0.7

    def mean_service_seconds(self, batch_size: int, step: float, prefill_per_token: float) -> float:
        """A replica's busy time per request when its batch is always full: the request's own
        prefill, which stalls the batch and gives its first token, and its share of the decode
        steps that give the rest."""
        decode = step * (sum(self.output_tokens) / 2 - 1) / batch_size
        chat = prefill_per_token * sum(self.chat_input_tokens) / 2
        long = prefill_per_token * self.long_input_tokens
        return decode + (1 - self.long_share) * chat + self.long_share * long


def capacity(mix: Mix, replicas: int, batch_size: int, step: float, prefill_per_token: float) -> float:
    """Requests per second that ``replicas`` replicas complete with every batch always full: the
    most they can sustain."""
    return replicas / mix.mean_service_seconds(batch_size, step, prefill_per_token)


def mixed_trace(mix: Mix, count: int, rate: float, seed: int) -> list[Call]:
    """``count`` calls arriving as a Poisson process of ``rate`` per second, each a long prompt
    with probability ``mix.long_share``; the same ``seed`` gives the same trace."""
    rng = random.Random(seed)
    calls: list[Call] = []
    start = 0.0
    for _ in range(count):
        start += rng.expovariate(rate)
        long = rng.random() < mix.long_share
        calls.append(Call(start=start,
                          input_tokens=mix.long_input_tokens if long else rng.randint(*mix.chat_input_tokens),
                          output_tokens=rng.randint(*mix.output_tokens),
                          kind="long" if long else "chat"))
    return calls
