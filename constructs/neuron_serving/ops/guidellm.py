"""guidellm 0.8 (github.com/vllm-project/guidellm), the load generator of ``neuron-serving bench``:
found, its version checked, handed a scenario file, run as a program of its own, and its JSON
report read back into one :class:`Measured` per benchmark.

It runs as its own program, in its own venv, rather than as a dependency of this package: guidellm
0.8.1 requires torch (its data loader, guidellm/data/loaders/torch.py) and transformers, and PyPI's
torch for Linux is the CUDA build, about 6 GB with its NVIDIA libraries, which an operator's CLI
should not pull in; apart, its own pins (pydantic, numpy, datasets...) never meet ours.

It runs offline: ``HF_HUB_OFFLINE=1``, with a tokenizer directory on disk
(:data:`DEFAULT_TOKENIZER` unless the user names the model's own), and synthetic prompts. The API
key reaches it in its environment (``GUIDELLM__SPEC__BACKEND__API_KEY``: the scenario is a
pydantic-settings model with prefix ``GUIDELLM__`` and delimiter ``__``,
guidellm/schemas/benchmark/entrypoints.py ``BenchmarkScenario``), never in a file; its report
shows no key.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .aws import OpsError

GUIDELLM_ENV = "NEURON_SERVING_GUIDELLM"
"""The environment variable naming the guidellm executable when ``--guidellm`` is not given."""

SUPPORTED_VERSION = re.compile(r"0\.8\.\d+")
"""The versions whose scenario format (``kind`` discriminated sections) and report layout this
module is written against; tested with 0.8.1."""

INSTALL = ("install it in a venv of its own: python3 -m venv ~/.guidellm && ~/.guidellm/bin/pip install "
           "guidellm==0.8.1 (on Linux, install PyTorch's CPU-only build into that venv first, or pip takes "
           "the 6 GB CUDA build), then pass --guidellm ~/.guidellm/bin/guidellm or set $" + GUIDELLM_ENV)

DEFAULT_TOKENIZER = Path(__file__).parent / "bench_tokenizer"
"""A word-level tokenizer (lower-cased; one token per word, punctuation mark or digit) whose
vocabulary is what guidellm's synthetic prompts are made of: Faker's English lorem words
(faker/providers/lorem/en_US, which guidellm/data/deserializers/synthetic.py draws its text from),
punctuation, and the digits and letters of the counter guidellm puts before each prompt so that no
two are alike (``f"{iteration} {sample} m{turn} "``, same file). Its decoding keeps a space between
tokens (``clean_up_tokenization_spaces`` false), so a prompt of N tokens is N words. Common English
words like these are mostly one token each to the Llama tokenizers, so prompt lengths come out
close to the model's count; the model's own tokenizer gives them exactly."""

PERCENTILES = ("p50", "p90", "p99")

ROUTES = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
"""The OpenAI-compatible routes both engines serve, by ``--route`` value."""


@dataclass(frozen=True)
class Tokens:
    """A distribution of token counts: a mean, and optionally a standard deviation and bounds.

    :param stdev: standard deviation. Default: 0, every request the mean.
    :param minimum: the fewest. Default: none.
    :param maximum: the most. Default: none.
    """

    mean: int
    stdev: int = 0
    minimum: int | None = None
    maximum: int | None = None

    def fields(self, prefix: str) -> dict[str, int]:
        """guidellm's ``synthetic_text`` fields for this distribution (``prompt_tokens``,
        ``prompt_tokens_stdev``...; guidellm/schemas/data/deserializers/synthetic.py)."""
        optional = {"_stdev": self.stdev or None, "_min": self.minimum, "_max": self.maximum}
        return {prefix: self.mean, **{prefix + k: v for k, v in optional.items() if v is not None}}


@dataclass(frozen=True)
class Workload:
    """The synthetic requests: prompt and output token counts.

    :param prefix_tokens: tokens of a prefix that requests share, put before each prompt: guidellm
        0.8.1 makes ``prefix_count`` prefixes of that many tokens and gives each request one of them
        (guidellm/schemas/data/deserializers/synthetic.py, ``SyntheticTextDataArgs.prefix_tokens`` and
        ``prefix_count``; guidellm/data/deserializers/synthetic.py, ``_create_prefix_iter``), before
        its own prompt, joined by a space on the completions route and as the system message on the
        chat route (guidellm/backends/openai/request_handlers.py). What a prefix cache serves.
        Default: 0, no prefix.
    :param prefix_count: how many distinct prefixes. Default: 1.
    """

    input: Tokens
    output: Tokens
    prefix_tokens: int = 0
    prefix_count: int = 1

    @property
    def mean_input_tokens(self) -> float:
        """A request's mean prompt tokens, its prefix included."""
        return self.input.mean + self.prefix_tokens


@dataclass(frozen=True)
class Percentiles:
    """The 50th, 90th and 99th percentiles of one latency."""

    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class Measured:
    """What guidellm measured in one benchmark (one profile, or one rate of the constant profile).

    Latencies are None when no request succeeded, in the units of the published inf2 tables
    (optimum-neuron's benchmark pages, the Hugging Face blog on TGI data parallelism on inf2):
    time to first token and end-to-end latency in seconds, inter-token latency in milliseconds, per
    output token after the first. ``requests_per_second`` and ``output_tokens_per_second`` are
    guidellm's means over the benchmark, of completed requests and their tokens.
    """

    profile: str
    rate: float | None
    duration_s: float
    successful: int
    errored: int
    incomplete: int
    requests_per_second: float
    output_tokens_per_second: float
    concurrency: float
    input_tokens: float
    output_tokens: float
    output_tokens_total: int
    ttft_s: Percentiles | None
    itl_ms: Percentiles | None
    e2e_s: Percentiles | None
    error: str | None
    """The first error guidellm recorded, if any (its first line)."""


def find(option: str | None) -> str:
    """The guidellm executable: ``option`` (``--guidellm``), else :data:`GUIDELLM_ENV`'s, else the
    one on ``PATH``; :class:`OpsError` saying how to install it when there is none."""
    named = option or os.environ.get(GUIDELLM_ENV)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            source = "--guidellm" if option else f"${GUIDELLM_ENV}"
            raise OpsError(f"{source} {named!r} is not an executable file: {INSTALL}")
        return named
    found = shutil.which("guidellm")
    if found is None:
        raise OpsError(f"guidellm, the load generator bench drives, is not on PATH: {INSTALL}")
    return found


def check_version(executable: str) -> str:
    """guidellm's version (``guidellm --version`` prints ``guidellm version: 0.8.1``);
    :class:`OpsError` when it is not one this module knows."""
    try:
        printed = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=60,
                                 check=False).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise OpsError(f"{executable} --version failed ({err}): {INSTALL}") from None
    version = printed.strip().rpartition(" ")[2]
    if not SUPPORTED_VERSION.fullmatch(version):
        raise OpsError(f"{executable} is guidellm {version or '(no version printed)'}; bench needs 0.8.x, whose "
                       f"scenario and report it reads: {INSTALL}")
    return version


def scenario(*, target: str, model: str, route: str, workload: Workload, profile: dict[str, Any],
             max_seconds: float, max_requests: int | None, tokenizer: Path, report: Path) -> dict[str, Any]:
    """A guidellm scenario (``guidellm run -c FILE``) of one profile against ``target``.

    :param model: the ``model`` the requests name (:meth:`~neuron_serving.plan.engines.Engine.openai_model`).
    :param route: ``completions`` or ``chat`` (:data:`ROUTES`).
    :param profile: guidellm's profile section (``{"kind": "synchronous"}``...).
    :param max_seconds: each benchmark's time limit; requests still in flight then are cut and
        counted as incomplete.
    :param max_requests: each benchmark's request limit. Default: none.
    :param report: where guidellm writes its JSON report.
    """
    constraints: list[dict[str, Any]] = [{"kind": "max_duration", "seconds": max_seconds}]
    if max_requests is not None:
        constraints.append({"kind": "max_requests", "count": max_requests})
    return {"spec": {
        # guidellm/schemas/backends/openai_http.py: TLS is not verified unless asked (verify False).
        "backend": {"kind": "openai_http", "target": target, "model": model, "request_format": ROUTES[route],
                    "verify": True},
        "profile": profile,
        "data": [{"kind": "synthetic_text", **workload.input.fields("prompt_tokens"),
                  **workload.output.fields("output_tokens"),
                  **({"prefix_tokens": workload.prefix_tokens, "prefix_count": workload.prefix_count}
                     if workload.prefix_tokens else {})}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "constraints": constraints,
        # sample_size 0 keeps every request's timings and counts but not its prompt and output
        # (guidellm/schemas/benchmark/entrypoints.py, GenerativeMetricsArgs): a report of long
        # prompts would otherwise hold each one.
        "metrics": {"kind": "generative", "sample_size": 0},
        "outputs": [{"kind": "json", "path": str(report)}],
    }}


def run(executable: str, spec: dict[str, Any], name: str, workdir: Path, key: str | None) -> list[Measured]:
    """Run guidellm on ``spec`` (written to ``workdir/<name>.scenario.json``), its output appended
    to ``workdir/guidellm.log``, and read its report (``spec``'s output path)."""
    path = workdir / f"{name}.scenario.json"
    path.write_text(json.dumps(spec, indent=2) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    if key:
        env["GUIDELLM__SPEC__BACKEND__API_KEY"] = key
    log = workdir / "guidellm.log"
    with log.open("a") as out:
        out.write(f"--- guidellm run -c {path}\n")
        out.flush()
        finished = subprocess.run([executable, "run", "-c", str(path), "--disable-console"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False)
    report = Path(spec["spec"]["outputs"][0]["path"])
    if finished.returncode != 0 or not report.is_file():
        lines = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise OpsError(f"guidellm failed (exit status {finished.returncode}) running {path.name}; the end of "
                       f"{log}:\n  " + "\n  ".join(lines))
    return read(json.loads(report.read_text()))


def read(report: dict[str, Any]) -> list[Measured]:
    """Each benchmark of a guidellm 0.8 JSON report (guidellm/benchmark/schemas: ``benchmarks[]``
    with ``config.strategy`` and ``metrics``, each metric a distribution per request status)."""
    return [_measured(benchmark) for benchmark in report["benchmarks"]]


def _measured(benchmark: dict[str, Any]) -> Measured:
    strategy = benchmark["config"]["strategy"]
    metrics = benchmark["metrics"]
    totals = metrics["request_totals"]

    def ok(name: str) -> dict[str, Any]:
        return dict(metrics[name]["successful"])

    def percentiles(name: str, scale: float = 1.0) -> Percentiles | None:
        completed = ok(name)
        if not completed["count"]:
            return None
        return Percentiles(*(float(completed["percentiles"][p]) * scale for p in PERCENTILES))

    errored = benchmark.get("requests", {}).get("errored") or []
    first = next((str(r["info"]["error"]) for r in errored if r.get("info", {}).get("error")), None)
    return Measured(
        profile=str(strategy["type_"]),
        rate=float(strategy["rate"]) if strategy.get("rate") is not None else None,
        duration_s=float(benchmark["duration"]),
        successful=int(totals["successful"]),
        errored=int(totals["errored"]),
        incomplete=int(totals["incomplete"]),
        requests_per_second=float(ok("requests_per_second")["mean"]),
        output_tokens_per_second=float(ok("output_tokens_per_second")["mean"]),
        concurrency=float(ok("request_concurrency")["mean"]),
        input_tokens=float(ok("prompt_token_count")["mean"]),
        output_tokens=float(ok("output_token_count")["mean"]),
        output_tokens_total=int(ok("output_token_count")["total_sum"]),
        ttft_s=percentiles("time_to_first_token_ms", 1e-3),
        itl_ms=percentiles("inter_token_latency_ms"),
        e2e_s=percentiles("request_latency"),
        error=first.splitlines()[0] if first else None,
    )
