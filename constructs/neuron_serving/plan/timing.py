"""How long things take on a Neuron host, as stated estimates that size load balancer timeouts.
Each is a ceiling to wait for, not a prediction."""

from __future__ import annotations

import math

from .layout import ServingPlan

SECONDS_PER_TOKEN_CEILING = 0.1
"""An upper bound on time per output token for a served model under full batch load (published
inf2 figures are 20 to 50 ms); it sizes how long one generation may run."""

QUEUE_ALLOWANCE_SECONDS = 60
"""Time a request may wait for a free batch slot before its generation starts."""


def longest_generation_seconds(plan: ServingPlan) -> int:
    """The longest a single request can run: every token the shapes allow after a one-token
    prompt, at :data:`SECONDS_PER_TOKEN_CEILING`, plus queueing."""
    return math.ceil((plan.sequence_length - 1) * SECONDS_PER_TOKEN_CEILING) + QUEUE_ALLOWANCE_SECONDS
