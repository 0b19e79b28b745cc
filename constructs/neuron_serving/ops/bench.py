"""``neuron-serving bench``: drive a deployed endpoint with a synthetic LLM workload (prompt and
output token counts drawn from given distributions) at the synchronous, constant-rate and
maximum-throughput profiles, and report, per profile, completed requests per second, time to first
token, inter-token latency and end-to-end latency percentiles, output tokens per second and errors,
in the units of the published inf2 tables; beside each, the performance model's prediction for the
same workload, layout and load, when the layout is known: each percentile from the discrete-event
model of the replicas and router (:func:`neuron_serving.plan.queueing.simulate`) at the rate the
profile measured, and at the throughput profile the requests and tokens per second at saturation.

The load generator is guidellm 0.8 (:mod:`neuron_serving.ops.guidellm`), run as a program of its
own. The endpoint, its engine and key are :mod:`neuron_serving.ops.endpoint`'s: one GET reaches it
and checks the key before any load. Results go to a directory: ``bench.json`` (the report, as
``--output json`` prints it), ``bench.png`` (latency against load), and guidellm's own scenarios,
reports and log.

Exit status: 0 when some request completed, 1 when none did or the endpoint could not be reached,
2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..plan import performance, queueing
from ..plan.errors import ServingConfigError
from ..plan.layout import ServingPlan, ServingRequest, layout_document, plan_serving, request_from_layout
from . import guidellm
from .aws import EXIT_FAILURE, OpsError, run_aws
from .bench_plot import Point, plot
from .endpoint import API_KEY_ENV, Endpoint, endpoint_options, find_endpoint, reach
from .guidellm import ROUTES, Measured, Percentiles, Tokens, Workload
from .output import Printer, output_option, positive_seconds

SYNCHRONOUS, CONSTANT, THROUGHPUT = "synchronous", "constant", "throughput"
PROFILES = (SYNCHRONOUS, CONSTANT, THROUGHPUT)
"""guidellm's names (guidellm/benchmark/profiles): one request at a time; requests started at a
fixed rate; as many at once as the endpoint takes (up to guidellm's 512)."""

DEFAULT_INPUT_TOKENS = 512
DEFAULT_OUTPUT_TOKENS = 128
DEFAULT_RATE_STEPS = 3
DEFAULT_MAX_SECONDS = 60.0
DEFAULT_MAX_CONCURRENCY = 512
"""guidellm's own default for its sweep (guidellm/schemas/benchmark/profiles/sweep.py); its
throughput profile has none and must be given one (throughput.py)."""
PROBE_TIMEOUT = 30.0
"""Seconds the GET that reaches the endpoint may take."""

LAYOUT_OUTPUT = "ServingPlan"
"""The stack output holding the serving layout as JSON (:func:`~neuron_serving.plan.layout.layout_document`)."""

LAYOUT_FLAGS = ("model", "instance_type", "tensor_parallel")
"""With ``--url``, the flags that together make the layout known (batch size and sequence length
have the stack's defaults)."""


# --- the command -----------------------------------------------------------------------------------------


def register(commands: Any) -> None:
    """Add ``bench`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    bench = commands.add_parser(
        "bench", parents=[output_option()], help="measure the endpoint under a synthetic LLM workload",
        description="Drive the endpoint with synthetic requests (guidellm) at the synchronous, constant-rate and "
        "maximum-throughput profiles; report requests/s, TTFT, ITL and end-to-end latency percentiles, output "
        "tokens/s and errors per profile, beside the performance model's prediction when the layout is known. "
        "Writes bench.json and bench.png to --results-dir.")
    endpoint_options(bench)
    bench.add_argument("--api-key-env", default=API_KEY_ENV, metavar="NAME",
                       help=f"the environment variable holding the key when --api-key is not given "
                            f"(default: {API_KEY_ENV})")
    workload = bench.add_argument_group("workload")
    # guidellm asks for the output tokens with max_tokens and ignore_eos
    # (guidellm/backends/openai/request_handlers.py); vLLM 0.11.0 honours ignore_eos (protocol.py,
    # its sampling extras), TGI v3.3.5 has no such field (router/src/lib.rs, CompletionRequest and
    # ChatRequest, whose serde ignores unknown fields).
    for kind, default in (("input", DEFAULT_INPUT_TOKENS), ("output", DEFAULT_OUTPUT_TOKENS)):
        workload.add_argument(f"--{kind}-tokens", type=_positive, default=default, metavar="N",
                              help=f"mean {kind} tokens per request (default: {default})" + (
                                  "; vLLM generates them all (ignore_eos), TGI may stop at the model's end of "
                                  "sequence: the report counts what came" if kind == "output" else ""))
        workload.add_argument(f"--{kind}-stdev", type=_count, default=0, metavar="N",
                              help=f"standard deviation of the {kind} tokens (default: 0, all equal)")
        workload.add_argument(f"--{kind}-min", type=_positive, metavar="N", help=f"fewest {kind} tokens")
        workload.add_argument(f"--{kind}-max", type=_positive, metavar="N", help=f"most {kind} tokens")
    workload.add_argument("--prefix-tokens", type=_count, default=0, metavar="N",
                          help="tokens of a prefix the requests share, before each prompt's own tokens: the "
                               "workload a prefix cache (prefix_caching, engine nxdi) serves faster (default: 0)")
    workload.add_argument("--prefix-count", type=_positive, default=1, metavar="N",
                          help="distinct prefixes, one per request in turn (default: 1)")
    workload.add_argument("--acceptance", type=_acceptance, metavar="A",
                          help="with a draft (speculative_model, engine nxdi): the chance the model accepts each "
                               "drafted token, for the predictions beside the measurements; without it they leave "
                               "speculation out, as `plan` does")
    workload.add_argument("--route", choices=tuple(ROUTES), default="completions",
                          help="the OpenAI-compatible route: completions (/v1/completions, the default: the prompt "
                               "alone) or chat (/v1/chat/completions: the model's chat template adds its tokens)")
    workload.add_argument("--tokenizer", type=Path, metavar="DIR",
                          help="a local tokenizer directory (tokenizer.json, tokenizer_config.json) that makes "
                               "prompts of the asked token counts; give the served model's own for exact counts "
                               "(default: a word-level tokenizer shipped with this package, about one token per "
                               "word as Llama tokenizers count these words). Nothing is downloaded")
    load = bench.add_argument_group("load")
    load.add_argument("--profiles", type=_profiles, default=PROFILES, metavar="LIST",
                      help=f"comma-separated, of {', '.join(PROFILES)} (default: all)")
    load.add_argument("--rate", type=_rates, metavar="R[,R...]",
                      help="requests per second of the constant profile, one benchmark each (default: "
                           "--rate-steps rates spread between the synchronous and throughput profiles' rates)")
    load.add_argument("--rate-steps", type=_positive, default=DEFAULT_RATE_STEPS, metavar="N",
                      help=f"without --rate, how many constant rates (default: {DEFAULT_RATE_STEPS})")
    load.add_argument("--max-seconds", type=positive_seconds, default=DEFAULT_MAX_SECONDS, metavar="S",
                      help=f"each benchmark's time limit; requests in flight then count as incomplete "
                           f"(default: {DEFAULT_MAX_SECONDS:g})")
    load.add_argument("--max-requests", type=_positive, metavar="N", help="each benchmark's request limit")
    load.add_argument("--max-concurrency", type=_positive, default=DEFAULT_MAX_CONCURRENCY, metavar="N",
                      help=f"the most requests in flight at once, at constant rates and at throughput (default: "
                           f"{DEFAULT_MAX_CONCURRENCY})")
    layout = bench.add_argument_group("layout, for predictions with --url (the stack's ServingPlan output gives it "
                                      "with --stack)")
    layout.add_argument("--model", help="the served model's Hugging Face id")
    layout.add_argument("--instance-type")
    layout.add_argument("--tensor-parallel", type=_positive, metavar="N")
    layout.add_argument("--batch-size", type=_positive, metavar="N",
                        help=f"default: {ServingRequest.batch_size}")
    layout.add_argument("--sequence-length", type=_positive, metavar="N",
                        help=f"default: {ServingRequest.sequence_length}")
    layout.add_argument("--instances", type=_positive, metavar="N",
                        help="instances behind the endpoint, each with the layout's replicas, that the predictions "
                             "share the load between (default: 1; a stack's single instance is 1 whatever is given)")
    bench.add_argument("--results-dir", type=Path, metavar="DIR",
                       help="where bench.json, bench.png and guidellm's files go; new or empty (default: "
                            "bench-results/<UTC time>)")
    bench.add_argument("--guidellm", metavar="PATH",
                       help=f"the guidellm 0.8 executable (default: ${guidellm.GUIDELLM_ENV}, else guidellm on "
                            "PATH)")
    bench.set_defaults(run=command, usage_error=bench.error)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of at least 1")
    return value


def _acceptance(text: str) -> float:
    """``--acceptance``, checked as :class:`~neuron_serving.plan.performance.Workload` checks it."""
    try:
        acceptance = performance.Workload(1, 1, acceptance=float(text)).acceptance
    except (ValueError, ServingConfigError):
        acceptance = None
    if acceptance is None:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number between 0 and 1 (exclusive)")
    return acceptance


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of at least 0")
    return value


def _profiles(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROFILES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r} must be a comma-separated list of {', '.join(PROFILES)}")
    return tuple(p for p in PROFILES if p in names)


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(r) for r in text.split(","))
    except ValueError:
        rates = ()
    if not rates or not all(r > 0 for r in rates):
        raise argparse.ArgumentTypeError(f"{text!r} must be requests per second above 0, comma-separated")
    return tuple(sorted(set(rates)))


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options together, or None."""
    for kind in ("input", "output"):
        mean, low, high = (getattr(args, f"{kind}_{k}") for k in ("tokens", "min", "max"))
        if (low is not None and low > mean) or (high is not None and high < mean):
            return (f"--{kind}-min ({low}) <= --{kind}-tokens ({mean}) <= --{kind}-max ({high}) must hold"
                    .replace("(None)", "(none)"))
    if args.rate and CONSTANT not in args.profiles:
        return f"--rate is the constant profile's, which --profiles ({','.join(args.profiles)}) leaves out"
    if CONSTANT in args.profiles and not args.rate and not {SYNCHRONOUS, THROUGHPUT} <= set(args.profiles):
        return ("the constant profile needs --rate, or both the synchronous and throughput profiles in --profiles "
                "to spread its rates between")
    given = [f for f in (*LAYOUT_FLAGS, "batch_size", "sequence_length") if getattr(args, f) is not None]
    flags = ", ".join("--" + f.replace("_", "-") for f in given)
    if given and not args.url:
        return f"{flags} (the layout) go with --url: with --stack, the stack's {LAYOUT_OUTPUT} output gives the layout"
    missing = [f for f in LAYOUT_FLAGS if getattr(args, f) is None]
    if given and missing:
        return (f"{flags} need {', '.join('--' + f.replace('_', '-') for f in missing)} too: the layout is known "
                "with all three or none")
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer_config.json").is_file():
        return f"--tokenizer {str(args.tokenizer)!r} is not a tokenizer directory (it has no tokenizer_config.json)"
    if args.results_dir is not None and args.results_dir.exists() and (
            not args.results_dir.is_dir() or any(args.results_dir.iterdir())):
        return f"--results-dir {str(args.results_dir)!r} exists and is not an empty directory: name a new one"
    return None


def command(args: argparse.Namespace) -> int:
    """Run ``bench``; a usage error exits 2 (argparse's), every other failure a user can act on is
    one line on stderr (and a JSON document with ``--output json``) and exit status 1."""
    problem = _check(args)
    if problem:
        args.usage_error(problem)
    printer = Printer(args.output)
    key = args.api_key or os.environ.get(args.api_key_env) or None
    workload = Workload(Tokens(args.input_tokens, args.input_stdev, args.input_min, args.input_max),
                        Tokens(args.output_tokens, args.output_stdev, args.output_min, args.output_max),
                        args.prefix_tokens, args.prefix_count)

    def run() -> int:
        try:
            document = bench(args, workload, key)
        except OpsError as err:
            if printer.json:
                printer.document({"error": str(err)})
            raise
        _report(printer, document)
        if not any(p["requests"]["successful"] for p in document["profiles"]):
            first = next((p["first_error"] for p in document["profiles"] if p["first_error"]), "none recorded")
            print(f"neuron-serving: no request completed (first error: {first})", file=sys.stderr)
            return EXIT_FAILURE
        return 0

    return run_aws(run)


def bench(args: argparse.Namespace, workload: Workload, key: str | None) -> dict[str, Any]:
    """Measure the endpoint; the report's document (also written to ``bench.json``)."""
    endpoint = find_endpoint(args)
    executable = guidellm.find(args.guidellm)
    version = guidellm.check_version(executable)
    serving, probe = reach(endpoint, key, PROBE_TIMEOUT, "bench")
    model = serving.openai_model(probe)
    if model is None:
        raise OpsError(f"{endpoint.url} answered GET {serving.probe.path} without naming its model")
    plan, layout_source = _layout(args, endpoint)
    predictions = _layout_predictions(plan, workload, args.acceptance)
    fleet = _fleet(args, endpoint)
    results = args.results_dir or Path("bench-results") / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    results.mkdir(parents=True, exist_ok=True)
    measured: list[Measured] = []
    for name, what, profile in _runs(args):
        print(f"neuron-serving: bench: {what} against {endpoint.url}, each benchmark at most {args.max_seconds:g} s"
              + (f" and {args.max_requests} requests" if args.max_requests else "") + f" (log: {results}/guidellm.log)",
              file=sys.stderr)
        spec = guidellm.scenario(target=endpoint.url, model=model, route=args.route, workload=workload,
                                 profile=profile, max_seconds=args.max_seconds, max_requests=args.max_requests,
                                 tokenizer=args.tokenizer or guidellm.DEFAULT_TOKENIZER,
                                 report=(results / f"{name}.guidellm.json").resolve())
        measured += guidellm.run(executable, spec, name, results, key)
    measured.sort(key=lambda m: (PROFILES.index(m.profile), m.rate or 0.0))
    document: dict[str, Any] = {
        "url": endpoint.url, "engine": serving.name, "model": model, "route": ROUTES[args.route],
        "workload": {"input_tokens": asdict(workload.input), "output_tokens": asdict(workload.output),
                     "prefix_tokens": workload.prefix_tokens, "prefix_count": workload.prefix_count},
        "layout": {**layout_document(plan), "engine": serving.name} if plan else None, "layout_source": layout_source,
        "predictions": predictions, "instances": {"count": fleet.instances, "source": fleet.source},
        "profiles": [_profile_document(m, _predicted(m, plan, fleet.instances, args.max_concurrency,
                                                     workload.prefix_tokens, args.acceptance)) for m in measured],
        "results": {"json": str(results / "bench.json"), "png": str(results / "bench.png"),
                    "guidellm_log": str(results / "guidellm.log")},
        "guidellm": version,
    }
    (results / "bench.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    plot([_point(p) for p in document["profiles"] if p["ttft_s"] and p["itl_ms"]], _title(document),
         results / "bench.png")
    return document


def _runs(args: argparse.Namespace) -> list[tuple[str, str, dict[str, Any]]]:
    """The guidellm runs the profiles take, each a name, what it measures and guidellm's profile
    section. The synchronous and throughput profiles, with the constant rates spread between them,
    are one run of guidellm's sweep (guidellm/benchmark/profiles/sweep.py: synchronous, throughput,
    then ``sweep_size - 2`` constant rates evenly between their measured rates); given rates are a
    run of their own."""
    profiles = set(args.profiles)
    if {SYNCHRONOUS, THROUGHPUT} <= profiles and not args.rate:
        steps = args.rate_steps if CONSTANT in profiles else 0
        between = f" and {steps} constant rates between them" if steps else ""
        return [("sweep", f"synchronous, throughput{between}", {
            "kind": "sweep", "sweep_size": 2 + steps, "strategy_type": "constant",
            "max_concurrency": args.max_concurrency})]
    sections: dict[str, dict[str, Any]] = {
        SYNCHRONOUS: {"kind": SYNCHRONOUS},
        CONSTANT: {"kind": CONSTANT, "rate": list(args.rate or ()), "max_concurrency": args.max_concurrency},
        THROUGHPUT: {"kind": THROUGHPUT, "max_concurrency": args.max_concurrency},
    }
    what = {SYNCHRONOUS: SYNCHRONOUS, CONSTANT: f"constant at {', '.join(f'{r:g}' for r in args.rate or ())} "
                                                  "requests/s", THROUGHPUT: THROUGHPUT}
    return [(name, what[name], sections[name]) for name in PROFILES if name in profiles]


def _layout(args: argparse.Namespace, endpoint: Endpoint) -> tuple[ServingPlan | None, str]:
    """The endpoint's layout, planned as the stack plans it, and where it came from or why it is unknown."""
    if endpoint.stack is not None:
        text = endpoint.stack.output(LAYOUT_OUTPUT)
        source = f"stack {endpoint.stack.name}'s {LAYOUT_OUTPUT} output"
        if not text:
            return None, f"stack {endpoint.stack.name} has no {LAYOUT_OUTPUT} output (deployed by an older version)"
        try:
            return plan_serving(request_from_layout(json.loads(text))), source
        except (ValueError, TypeError) as err:  # ServingConfigError is a ValueError, as is bad JSON
            raise OpsError(f"{source} is not a layout this version of cdk-neuron-serving can read ({err}): "
                           "upgrade it") from None
    if args.model is None:
        return None, "not given (--model, --instance-type and --tensor-parallel)"
    request = ServingRequest(args.model, args.instance_type, tensor_parallel=args.tensor_parallel,
                             batch_size=args.batch_size or ServingRequest.batch_size,
                             sequence_length=args.sequence_length or ServingRequest.sequence_length)
    try:
        return plan_serving(request), "the command's flags"
    except ServingConfigError as err:
        raise OpsError(f"the layout flags do not make a layout: {err}") from None


@dataclass(frozen=True)
class Fleet:
    """The instances behind the endpoint that the predictions share the load between.

    :param instances: how many, each with the layout's replicas.
    :param source: where the count comes from, as the report says it.
    """

    instances: int
    source: str


def _fleet(args: argparse.Namespace, endpoint: Endpoint) -> Fleet:
    """``--instances``, else the stack's single instance (its ``InstanceId`` output), else one, assumed:
    a fleet's outputs name its Auto Scaling group, not how many instances serve."""
    stack = endpoint.stack
    if stack is not None and stack.output("InstanceId"):
        if args.instances not in (None, 1):
            raise OpsError(f"--instances {args.instances}: stack {stack.name} is a single instance (its InstanceId "
                           "output); leave --instances out")
        return Fleet(1, f"stack {stack.name}'s single instance (its InstanceId output)")
    if args.instances is not None:
        return Fleet(args.instances, "--instances")
    if stack is not None:
        return Fleet(1, f"assumed: stack {stack.name}'s outputs do not count its fleet's instances, give --instances")
    return Fleet(1, "assumed: give --instances for a fleet")


def _layout_predictions(plan: ServingPlan | None, workload: Workload,
                        acceptance: float | None = None) -> dict[str, float] | None:
    """The performance model's predictions (:func:`neuron_serving.plan.performance.predict`) for
    ``workload``'s mean token counts on ``plan``, per instance: ``ttft_s``, ``itl_batch1_s``,
    ``itl_full_batch_s``, ``output_tokens_per_second`` and ``requests_per_second`` (the last two at
    saturation). With a draft, ``acceptance`` counts it (``--acceptance``). None without a layout."""
    if plan is None:
        return None
    # The prefix is part of each prompt; a layout with a prefix cache prefills only the rest
    # (performance.cached_prefix_tokens). The first request of each distinct prefix finds none cached, which
    # the prediction, of a request whose prefix is, leaves out.
    inputs = round(workload.mean_input_tokens)
    mean = performance.Workload(inputs, round(workload.output.mean), min(workload.prefix_tokens, inputs), acceptance)
    try:
        prediction = performance.predict(plan, mean)
    except ServingConfigError as err:
        raise OpsError(f"the workload does not fit the endpoint's layout: {err}") from None
    return {"ttft_s": prediction.ttft_s, "itl_batch1_s": prediction.itl_batch1_s,
            "itl_full_batch_s": prediction.itl_full_batch_s,
            # A request alone on a replica: its first token, then one per step.
            "e2e_batch1_s": prediction.ttft_s + (mean.output_tokens - 1) * prediction.itl_batch1_s,
            "output_tokens_per_second": prediction.tokens_per_second_instance,
            "requests_per_second": prediction.requests_per_second_instance}


def _predicted(m: Measured, plan: ServingPlan | None, instances: int,
               max_concurrency: int = DEFAULT_MAX_CONCURRENCY, prefix_tokens: int = 0,
               acceptance: float | None = None) -> dict[str, Any] | None:
    """The predictions of a profile's measured figures, in their units, or None without a layout or
    a completed request. ``prefix_tokens`` of each measured prompt are the shared prefix, which a layout
    with a prefix cache does not prefill (:func:`~neuron_serving.plan.performance.replica_costs`).

    ``ttft_s``, ``itl_ms`` and ``e2e_s`` are percentiles (``p50``, ``p90``, ``p99``, nearest rank) of
    :func:`neuron_serving.plan.queueing.simulate` over ``instances`` times the layout's replicas, each
    of :func:`~neuron_serving.plan.performance.replica_costs`, the requests of the profile's measured
    mean input and output tokens. The synchronous profile sends one request at a time, so it is a
    request alone. The others replay as many requests as the benchmark sent: the constant profile's
    arriving evenly at its measured requests per second, as guidellm's constant profile starts
    requests at uniform intervals (guidellm 0.8, guidellm/scheduler/strategies.py,
    ``AsyncConstantStrategy.next_request_time``); the throughput profile's as a closed loop of
    ``max_concurrency`` clients, as guidellm's ``ThroughputStrategy`` schedules every request at
    once with at most ``max_concurrency`` in flight (same file, ``requests_limit`` and
    ``next_request_time``). A request's
    ITL is its mean over the tokens after the first, as guidellm measures it
    (guidellm/schemas/base/request_stats.py, ``inter_token_latency_ms``).

    Beside them: ``arrival_rate`` (None when synchronous), ``requests``, ``input_tokens``,
    ``output_tokens``, ``instances``, ``utilisation`` (the arrival rate over what the fleet completes
    at saturation), and at the throughput profile the fleet's ``output_tokens_per_second`` and
    ``requests_per_second`` at saturation
    (:func:`~neuron_serving.plan.performance.saturated_requests_per_second`, as
    :func:`~neuron_serving.plan.performance.predict` computes them per instance, for the measured tokens).
    """
    if plan is None or not m.successful or m.output_tokens < 1 or m.input_tokens < 1:
        return None
    input_tokens, output_tokens = max(1, round(m.input_tokens)), max(1, round(m.output_tokens))
    # As _layout_predictions: a layout with a prefix cache prefills what the shared prefix leaves.
    costs = performance.replica_costs(
        plan, workload=performance.Workload(input_tokens, output_tokens, min(prefix_tokens, input_tokens), acceptance))
    replicas = len(plan.replicas) * instances
    rate = None if m.profile == SYNCHRONOUS else m.requests_per_second
    if rate is not None and rate <= 0:
        return None
    count = m.successful + m.errored + m.incomplete
    if m.profile == THROUGHPUT:
        trace = [queueing.Call(0.0, input_tokens, output_tokens) for _ in range(max(1, count))]
        timings = queueing.simulate(costs, replicas, trace, clients=max_concurrency)
    else:
        trace = _trace(rate, count, input_tokens, output_tokens)
        timings = queueing.simulate(costs, replicas, trace)
    itl = [(t.e2e_s - t.ttft_s) / (output_tokens - 1) * 1e3 for t in timings] if output_tokens > 1 else []
    saturation = replicas * performance.saturated_requests_per_second(
        costs.batch_size, costs.prefill(input_tokens), costs.step(costs.batch_size), output_tokens)
    predicted: dict[str, Any] = {
        "ttft_s": _percentiles([t.ttft_s for t in timings]), "itl_ms": _percentiles(itl),
        "e2e_s": _percentiles([t.e2e_s for t in timings]), "arrival_rate": rate, "requests": len(trace),
        "input_tokens": input_tokens, "output_tokens": output_tokens, "instances": instances,
        "utilisation": None if rate is None else rate / saturation,
    }
    if m.profile == THROUGHPUT:
        predicted["output_tokens_per_second"] = saturation * output_tokens
        predicted["requests_per_second"] = saturation
    return predicted


def _trace(rate: float | None, count: int, input_tokens: int, output_tokens: int) -> list[queueing.Call]:
    """The requests a constant profile's prediction replays: ``count`` arriving evenly at ``rate`` per second,
    or with no rate (one request at a time) one request, which is each of them."""
    if rate is None:
        return [queueing.Call(0.0, input_tokens, output_tokens)]
    return [queueing.Call(k / rate, input_tokens, output_tokens) for k in range(max(1, count))]


def _percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """The p50, p90 and p99 of ``values`` (:func:`neuron_serving.plan.queueing.percentile`), None when empty."""
    if not values:
        return None
    return asdict(Percentiles(*(queueing.percentile(values, q) for q in (50, 90, 99))))


def _profile_document(m: Measured, predicted: dict[str, Any] | None) -> dict[str, Any]:
    def percentiles(p: Percentiles | None) -> dict[str, float] | None:
        return asdict(p) if p else None

    return {
        "profile": m.profile, "rate": m.rate, "duration_s": m.duration_s,
        "requests": {"successful": m.successful, "errored": m.errored, "incomplete": m.incomplete},
        "requests_per_second": m.requests_per_second, "output_tokens_per_second": m.output_tokens_per_second,
        "concurrency": m.concurrency, "input_tokens_mean": m.input_tokens, "output_tokens_mean": m.output_tokens,
        "output_tokens": m.output_tokens_total,
        "ttft_s": percentiles(m.ttft_s), "itl_ms": percentiles(m.itl_ms), "e2e_s": percentiles(m.e2e_s),
        "first_error": m.error, "predicted": predicted,
    }


def _point(profile: dict[str, Any]) -> Point:
    """A profile of the document, whose ``ttft_s`` and ``itl_ms`` were measured, on the plot."""
    predicted = profile["predicted"] or {}

    def pair(name: str, row: dict[str, Any]) -> tuple[float, float]:
        return row[name]["p50"], row[name]["p99"]

    return Point(_label(profile["profile"], profile["rate"]), profile["requests_per_second"],
                 pair("ttft_s", profile), pair("itl_ms", profile),
                 pair("ttft_s", predicted) if predicted.get("ttft_s") else None,
                 pair("itl_ms", predicted) if predicted.get("itl_ms") else None)


# --- the report ------------------------------------------------------------------------------------------


def _title(document: dict[str, Any]) -> str:
    workload = document["workload"]
    prefix = workload.get("prefix_tokens")
    shared = (f" after a shared prefix of {prefix} ({workload['prefix_count']} distinct)" if prefix else "")
    return (f"{document['engine']} at {document['url']}, {document['route']}: {_tokens(workload['input_tokens'])} "
            f"input{shared} and {_tokens(workload['output_tokens'])} output tokens")


def _tokens(tokens: dict[str, Any]) -> str:
    spread = f" ± {tokens['stdev']}" if tokens["stdev"] else ""
    bounds = (f" in [{tokens['minimum'] or 1}, {tokens['maximum'] or '∞'}]"
              if tokens["minimum"] or tokens["maximum"] else "")
    return f"{tokens['mean']}{spread}{bounds}"


def _label(profile: str, rate: float | None) -> str:
    return f"constant {_number(rate)}/s" if rate is not None else profile


def _number(value: float | None) -> str:
    """Three significant figures, without an exponent."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if abs(value) >= 0.001 else f"{value:.2e}"


def _cell(measured: float | Percentiles | None, predicted: float | Percentiles | None) -> str:
    """A measured figure or its percentiles, and the prediction beside it, percentile for percentile."""
    def text(value: float | Percentiles | None) -> str:
        if isinstance(value, Percentiles):
            return " / ".join(_number(v) for v in (value.p50, value.p90, value.p99))
        return _number(value)

    return text(measured) if predicted is None else f"{text(measured)} (pred {text(predicted)})"


def _report(printer: Printer, document: dict[str, Any]) -> None:
    if printer.json:
        printer.document(document)
        return
    rows = []
    for p in document["profiles"]:
        predicted = p["predicted"] or {}

        def percentiles(name: str, row: dict[str, Any]) -> Percentiles | None:
            return Percentiles(**row[name]) if row.get(name) else None

        rows.append([_label(p["profile"], p["rate"]), _cell(p["requests_per_second"], predicted.get(
            "requests_per_second")), *(_cell(percentiles(name, p), percentiles(name, predicted))
                                       for name in ("ttft_s", "itl_ms", "e2e_s")),
            _cell(p["output_tokens_per_second"], predicted.get("output_tokens_per_second")),
            f"{p['requests']['successful']}", str(p["requests"]["errored"])])
    printer.print(printer.table(
        ["profile", "req/s", "TTFT s p50 / p90 / p99", "ITL ms p50 / p90 / p99", "latency s p50 / p90 / p99",
         "output tok/s", "completed", "errors"], rows, title=_title(document)))
    layout = document["layout"]
    printer.print(f"layout: {_layout_text(layout)} ({document['layout_source']})" if layout
                  else f"layout: unknown, {document['layout_source']}: no prediction")
    if document["predictions"] is not None:
        instances = document["instances"]
        fleet = f"{instances['count']} instance{'s' if instances['count'] != 1 else ''} ({instances['source']})"
        printer.print(f"pred: the performance model's (neuron_serving.plan.performance) for {fleet}: each percentile "
                      "from its discrete-event model of the replicas and router (neuron_serving.plan.queueing) with "
                      "the row's measured mean tokens, synchronous a request alone, the other rows as many requests "
                      "as they sent, constant rows arriving evenly at their measured req/s, throughput from "
                      "--max-concurrency clients; throughput's req/s and output tok/s at saturation")
        for p in document["profiles"]:
            utilisation = (p["predicted"] or {}).get("utilisation")
            if utilisation is not None and utilisation >= 1:
                printer.print(f"{_label(p['profile'], p['rate'])}: {_number(p['requests_per_second'])} req/s is "
                              f"{utilisation:.0%} of what the model's fleet completes at saturation: its queue grows "
                              "for as long as the benchmark ran")
    for p in document["profiles"]:
        if p["first_error"]:
            printer.print(f"{_label(p['profile'], p['rate'])}: {p['requests']['errored']} errors, the first: "
                          f"{p['first_error']}")
    results = document["results"]
    printer.print(f"results: {results['json']}, {results['png']} (guidellm's reports and log beside them)")


def _layout_text(layout: dict[str, Any]) -> str:
    return (f"{layout['model_id']} on {layout['instance_type']}, degree {layout['tensor_parallel']}, batch "
            f"{layout['batch_size']}, sequence {layout['sequence_length']}, {layout['dtype']}, {layout['engine']}")
