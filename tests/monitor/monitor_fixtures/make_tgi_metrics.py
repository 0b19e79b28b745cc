"""Writes ``tgi-first.txt`` and ``tgi-second.txt``: one TGI 3.x Neuron replica's ``/metrics`` page, and
the same page one interval (60 s) later.

The pages are shaped as TGI's router renders them (huggingface/text-generation-inference
``router/src/server.rs``, through the ``metrics-exporter-prometheus`` crate): one family per
metric with ``# HELP`` when TGI describes it and ``# TYPE`` always, a blank line between
families, counters without a ``_total`` suffix, labels only where TGI sets them (``err``,
``method``, ``reason``), ``le`` last, floats written as Rust writes them. Buckets as TGI sets them:
35 geometric buckets 0.0001 x 1.5^k (k = 1..35) for every metric ending in ``duration``; 100
linear buckets up to the token limits for the token histograms; 1..1024 for
``tgi_batch_next_size``.

The traffic is simulated from a fixed seed, so the pages are the same on every run. Between the
two pages: :data:`SECOND_REQUESTS` requests arrive, of which 2 fail (one ``validation``, one
``generation``), and the rest succeed; queue and batch gauges move from 0/2 to 3/4.

Run ``.venv/bin/python tests/monitor/monitor_fixtures/make_tgi_metrics.py`` from the repository root.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

MAX_INPUT_TOKENS = 3072
MAX_TOTAL_TOKENS = 4096

FIRST_REQUESTS = 1200
"""Requests before the first page: successes, plus the failures below."""
FIRST_FAILURES = {"validation": 3, "overloaded": 1}
SECOND_REQUESTS = 150
"""Requests between the two pages."""
SECOND_FAILURES = {"validation": 1, "generation": 1}

DURATION_BUCKETS = [0.0001 * 1.5 ** k for k in range(1, 36)]
INPUT_BUCKETS = [MAX_INPUT_TOKENS / 100 * (x + 1) for x in range(100)]
TOKEN_BUCKETS = [MAX_TOTAL_TOKENS / 100 * (x + 1) for x in range(100)]
BATCH_BUCKETS = [float(x + 1) for x in range(1024)]

DESCRIPTIONS = {
    "tgi_request_success": "Number of successful requests",
    "tgi_request_count": "Total number of requests",
    "tgi_batch_inference_count": "Inference calls per method (prefill or decode)",
    "tgi_batch_inference_success": "Number of successful inference calls per method (prefill or decode)",
    "tgi_batch_current_size": "Current batch size",
    "tgi_queue_size": "Current queue size",
    "tgi_batch_current_max_tokens": "Maximum tokens for the current batch",
    "tgi_request_duration": "Request duration",
    "tgi_request_validation_duration": "Request validation duration",
    "tgi_request_queue_duration": "Request queue duration",
    "tgi_request_inference_duration": "Request inference duration",
    "tgi_request_mean_time_per_token_duration": "Mean time per token per request",
    "tgi_request_generated_tokens": "Generated tokens per request",
    "tgi_request_max_new_tokens": "Maximum new tokens per request",
    "tgi_request_input_length": "Input token length per request",
    "tgi_batch_inference_duration": "Batch inference duration",
    "tgi_batch_forward_duration": "Batch forward duration per method (prefill or decode)",
    "tgi_batch_filter_duration": "Time spent filtering batches and sending generated tokens per method "
                                 "(prefill or decode)",
    "tgi_batch_decode_duration": "Time spent decoding a batch per method (prefill or decode)",
    "tgi_batch_next_size": "Batch size of the next batch",
}


def rust(value: float) -> str:
    """``value`` as Rust's ``Display`` writes an ``f64``: shortest round-trip digits, no exponent."""
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    return f"{value:.20f}".rstrip("0")


@dataclass
class Histogram:
    bounds: list[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        prefix = labels + "," if labels else ""
        out = [f'{name}_bucket{{{prefix}le="{rust(b)}"}} {c}' for b, c in zip(self.bounds, self.counts, strict=True)]
        out.append(f'{name}_bucket{{{prefix}le="+Inf"}} {self.count}')
        suffix = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{suffix} {rust(self.total)}", f"{name}_count{suffix} {self.count}"]


@dataclass
class Replica:
    """The metrics a TGI replica keeps, fed by simulated requests."""

    rng: random.Random
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[str, Histogram]] = field(default_factory=dict)

    def count(self, name: str, labels: str = "", by: int = 1) -> None:
        family = self.counters.setdefault(name, {})
        family[labels] = family.get(labels, 0) + by

    def observe(self, name: str, value: float, labels: str = "") -> None:
        bounds = (INPUT_BUCKETS if name == "tgi_request_input_length"
                  else TOKEN_BUCKETS if name in ("tgi_request_generated_tokens", "tgi_request_max_new_tokens")
                  else BATCH_BUCKETS if name == "tgi_batch_next_size" else DURATION_BUCKETS)
        self.histograms.setdefault(name, {}).setdefault(labels, Histogram(bounds)).observe(value)

    def request(self, failure: str | None = None) -> None:
        rng = self.rng
        self.count("tgi_request_count")
        input_length = rng.randint(40, 1500)
        max_new = rng.choice([64, 128, 256, 512])
        validation = rng.uniform(0.0004, 0.003)
        self.observe("tgi_request_validation_duration", validation)
        if failure in ("validation", "overloaded"):
            self.count("tgi_request_failure", f'err="{failure}"')
            return
        self.observe("tgi_request_input_length", input_length)
        self.observe("tgi_request_max_new_tokens", max_new)
        queued = rng.expovariate(1 / 0.4)
        self.observe("tgi_request_queue_duration", queued)
        self.observe("tgi_batch_next_size", rng.randint(1, 8))
        prefill = 0.05 + input_length * 0.00012
        self.observe("tgi_batch_forward_duration", prefill * 0.9, 'method="prefill"')
        self.observe("tgi_batch_decode_duration", prefill * 0.05, 'method="prefill"')
        self.observe("tgi_batch_filter_duration", 0.0004, 'method="prefill"')
        self.observe("tgi_batch_inference_duration", prefill, 'method="prefill"')
        self.count("tgi_batch_inference_count", 'method="prefill"')
        self.count("tgi_batch_inference_success", 'method="prefill"')
        if failure == "generation":
            self.count("tgi_request_failure", 'err="generation"')
            return
        tokens = rng.randint(16, max_new)
        per_token = rng.uniform(0.018, 0.045)
        for _ in range(0, tokens, 32):  # a decode step every few tokens is enough for realistic counts
            self.observe("tgi_batch_forward_duration", per_token * 0.9, 'method="decode"')
            self.observe("tgi_batch_decode_duration", per_token * 0.05, 'method="decode"')
            self.observe("tgi_batch_filter_duration", 0.0003, 'method="decode"')
            self.observe("tgi_batch_inference_duration", per_token, 'method="decode"')
            self.count("tgi_batch_inference_count", 'method="decode"')
            self.count("tgi_batch_inference_success", 'method="decode"')
        inference = prefill + tokens * per_token
        self.observe("tgi_request_inference_duration", inference)
        self.observe("tgi_request_mean_time_per_token_duration", inference / tokens)
        self.observe("tgi_request_generated_tokens", tokens)
        self.observe("tgi_request_duration", validation + queued + inference)
        self.count("tgi_request_success")

    def page(self) -> str:
        families: list[list[str]] = []

        def header(name: str, kind: str) -> list[str]:
            described = [f"# HELP {name} {DESCRIPTIONS[name]}"] if name in DESCRIPTIONS else []
            return [*described, f"# TYPE {name} {kind}"]

        for name in sorted(self.counters):
            families.append(header(name, "counter") + [
                f"{name}{{{labels}}} {value}" if labels else f"{name} {value}"
                for labels, value in sorted(self.counters[name].items())])
        for name in sorted(self.gauges):
            families.append([*header(name, "gauge"), f"{name} {rust(self.gauges[name])}"])
        for name in sorted(self.histograms):
            lines = header(name, "histogram")
            for labels, histogram in sorted(self.histograms[name].items()):
                lines += histogram.lines(name, labels)
            families.append(lines)
        return "\n".join("\n".join(lines) + "\n" for lines in families)


def traffic(replica: Replica, requests: int, failures: dict[str, int]) -> None:
    kinds: list[str | None] = [kind for kind, n in failures.items() for _ in range(n)]
    kinds += [None] * (requests - len(kinds))
    replica.rng.shuffle(kinds)
    for kind in kinds:
        replica.request(kind)


def main() -> None:
    replica = Replica(random.Random(20250401))
    traffic(replica, FIRST_REQUESTS, FIRST_FAILURES)
    replica.gauges.update(tgi_queue_size=0, tgi_batch_current_size=2, tgi_batch_current_max_tokens=1024)
    (HERE / "tgi-first.txt").write_text(replica.page())
    traffic(replica, SECOND_REQUESTS, SECOND_FAILURES)
    replica.gauges.update(tgi_queue_size=3, tgi_batch_current_size=4, tgi_batch_current_max_tokens=2048)
    (HERE / "tgi-second.txt").write_text(replica.page())


if __name__ == "__main__":
    main()
