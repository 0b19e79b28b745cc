"""Writes ``vllm-first.txt`` and ``vllm-second.txt``: one vLLM 0.11.0 server's ``/metrics`` page (as
optimum-neuron 0.4.5's image serves it), and the same page one interval (60 s) later.

The pages are rendered by the real ``prometheus_client`` (the library vLLM exposes its metrics
with), so the text format, suffixes (``_total``, ``_created``, ``_bucket``, ``_sum``, ``_count``)
and label order are the library's own. What is registered follows vLLM 0.11.0's PyPI wheel:

- ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``): the ``vllm:`` families below, their
  help texts, label names (``model_name``, ``engine``; ``finished_reason`` on
  ``vllm:request_success``) and bucket boundaries.
- ``vllm/entrypoints/openai/api_server.py`` (``mount_metrics``): prometheus-fastapi-instrumentator's
  default metrics, of which ``http_requests_total`` (``handler``, ``method``, ``status`` grouped as
  ``2xx``/``4xx``/``5xx``; prometheus_fastapi_instrumentator/metrics.py at 7.1.0) and
  ``http_request_duration_seconds`` are kept; the summaries of request and response sizes are left
  out. Health checks and scrapes are excluded handlers, so they are not counted.
- Not prometheus_client's default process, platform and garbage-collector collectors: their values
  change from run to run, and the publisher reads none of them.

The image resolves ``prometheus_client>=0.18`` when it is built; the pages were made with 0.23.1,
whose format is the same as later releases' (only the content type's version differs).

The traffic is simulated from a fixed seed, so the pages are the same on every run. Between the
two pages, :data:`SECOND_REQUESTS` completions arrive, of which one is refused (400, prompt too
long) and one fails (500); queue and batch gauges move from 0/2 to 3/4.

Run it with a Python that has prometheus_client, from the repository root:
``python3 -m venv /tmp/p && /tmp/p/bin/pip install prometheus_client==0.23.1 &&
/tmp/p/bin/python tests/monitor/monitor_fixtures/make_vllm_metrics.py``.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

for _collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
    REGISTRY.unregister(_collector)

HERE = Path(__file__).resolve().parent
MODEL = "NousResearch/Meta-Llama-3-8B-Instruct"
MAX_MODEL_LEN = 4096
LABELS = {"model_name": MODEL, "engine": "0"}

FIRST_REQUESTS, SECOND_REQUESTS = 1200, 150
FIRST_FAILURES, SECOND_FAILURES = {"4xx": 3, "5xx": 1}, {"4xx": 1, "5xx": 1}

# vllm/v1/metrics/loggers.py (0.11.0): bucket boundaries.
TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]
ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0]
# prometheus_fastapi_instrumentator/metrics.py (7.1.0), latency(): its default buckets.
HTTP_LATENCY = [0.1, 0.5, 1.0]

NAMES = ["model_name", "engine"]
running = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", NAMES)
waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", NAMES)
kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", NAMES)
preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", NAMES)
prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", NAMES)
generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", NAMES)
success = Counter("vllm:request_success", "Count of successfully processed requests.",
                  [*NAMES, "finished_reason"])
ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", NAMES,
                 buckets=TTFT)
itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", NAMES,
                buckets=ITL)
tpot = Histogram("vllm:request_time_per_output_token_seconds",
                 "Histogram of time_per_output_token_seconds per request.", NAMES, buckets=ITL)
e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", NAMES,
                buckets=LATENCY)
queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
                       NAMES, buckets=LATENCY)
inference_time = Histogram("vllm:request_inference_time_seconds",
                           "Histogram of time spent in RUNNING phase for request.", NAMES, buckets=LATENCY)
http_requests = Counter("http_requests_total", "Total number of requests by method, status and handler.",
                        ["method", "status", "handler"])
http_latency = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler. Made to be "
                         "only used if aggregation by handler is important. ", ["method", "handler"],
                         buckets=HTTP_LATENCY)


def completion(rng: random.Random, status: str = "2xx") -> None:
    """One request to a generation route: counted by the HTTP server, and by the engine if it ran."""
    handler = "/v1/chat/completions" if rng.random() < 0.7 else "/v1/completions"
    http_requests.labels("POST", status, handler).inc()
    if status == "4xx":  # refused before the engine (prompt too long)
        http_latency.labels("POST", handler).observe(rng.uniform(0.001, 0.01))
        return
    prompt, generated = rng.randint(20, 3000), rng.randint(1, 512)
    queued, first, per_token = rng.expovariate(1 / 0.4), rng.uniform(0.05, 1.5), rng.uniform(0.02, 0.06)
    latency = queued + first + per_token * (generated - 1)
    for metric, value in ((ttft, first), (tpot, per_token), (e2e, latency), (queue_time, queued),
                          (inference_time, latency - queued)):
        metric.labels(**LABELS).observe(value)
    for _ in range(min(generated - 1, 40)):
        itl.labels(**LABELS).observe(rng.gauss(per_token, 0.005))
    prompt_tokens.labels(**LABELS).inc(prompt)
    generation_tokens.labels(**LABELS).inc(generated)
    if status == "2xx":
        success.labels(**LABELS, finished_reason="length" if generated == 512 else "stop").inc()
    else:
        success.labels(**LABELS, finished_reason="abort").inc()
    http_latency.labels("POST", handler).observe(latency)


def traffic(rng: random.Random, requests: int, failures: dict[str, int]) -> None:
    statuses = ["2xx"] * (requests - sum(failures.values())) + [s for s, n in failures.items() for _ in range(n)]
    rng.shuffle(statuses)
    for status in statuses:
        completion(rng, status)


def page() -> str:
    # The _created timestamps change with every run: fixed, so that the pages are reproducible.
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 1.7795e+09", generate_latest(REGISTRY).decode())


def main() -> None:
    rng = random.Random(20260211)
    # vLLM creates the three finished_reason series at start (loggers.py), all at 0.
    for reason in ("stop", "length", "abort"):
        success.labels(**LABELS, finished_reason=reason)
    kv_usage.labels(**LABELS).set(0.0)  # always 0 on optimum-neuron's platform (no KV cache blocks)
    preemptions.labels(**LABELS)
    traffic(rng, FIRST_REQUESTS, FIRST_FAILURES)
    running.labels(**LABELS).set(2)
    waiting.labels(**LABELS).set(0)
    (HERE / "vllm-first.txt").write_text(page())
    traffic(rng, SECOND_REQUESTS, SECOND_FAILURES)
    running.labels(**LABELS).set(4)
    waiting.labels(**LABELS).set(3)
    (HERE / "vllm-second.txt").write_text(page())


if __name__ == "__main__":
    main()
