"""``neuron-serving plan --model M --instance-type T``: every tensor-parallel degree the instance
accepts, with the replicas it gives, whether the model fits, and the performance model's predictions
(:mod:`neuron_serving.plan.performance`); ``--objective latency|throughput|cost`` and limits recommend
a layout, and ``--output json`` prints the same as one JSON document (see :func:`plan_document`).
Each layout shown says whether optimum-neuron's Hub cache holds it for the engine's image
(:mod:`neuron_serving.ops.hub_cache`), and the objectives prefer a cached layout close to the best;
offline, or with ``--no-hub-cache``, ``plan`` says so and plans without it.

Pure Python on the plan layer and, for the cache only, the Hub: no AWS call, no CDK.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..plan.engines import DEFAULT_ENGINE, ENGINES, engine, feature_problem, quantization_problem
from ..plan.engines.base import release
from ..plan.errors import Problems, ServingConfigError
from ..plan.hub_cache import HubCache
from ..plan.instances import INSTANCES
from ..plan.layout import (
    DEFAULT_SPECULATIVE_TOKENS,
    GIB,
    QUANTIZATIONS,
    DegreeOption,
    ServingPlan,
    ServingRequest,
    compile_memory_problem,
    degree_options,
    plan_serving,
)
from ..plan.models import resolve_model
from ..plan.performance import (
    BATCH_SIZES,
    DEFAULT_WORKLOAD,
    LOAD_REQUESTS,
    OBJECTIVES,
    Constraints,
    Goodput,
    LayoutSpace,
    LoadPrediction,
    Prediction,
    Recommendation,
    Workload,
    candidates,
    compare_instances,
    recommend,
)
from ..plan.queueing import Call, poisson_trace
from ..plan.time_to_serve import (
    CACHE_HIT,
    FIRST_DEPLOY,
    FIRST_DEPLOY_COMPILING,
    PHASE_TITLES,
    SCENARIOS,
    WARM_POOL,
    time_to_serve_document,
)
from ..plan.volume import volume_performance
from ..settings import DEFAULT_INSTANCE_TYPE, DEFAULT_MODEL_ID
from .output import Printer, output_option

EXIT_BAD_INPUT = 2
"""``plan``'s exit status for input it refuses, as argparse's own for a bad option."""

ANY_INSTANCE = "any"
"""``--instance-type any``: recommend across every instance type of the catalog."""


def register(commands: Any) -> None:
    """Add ``plan`` to the CLI's subcommands (``commands``, from ``add_subparsers``)."""
    plan = commands.add_parser(
        "plan", parents=[output_option()], help="show every valid tensor-parallel degree for a model and instance",
        description="Every tensor-parallel degree the instance accepts, with its replicas, memory and predicted "
                    "latency, throughput and cost; an objective recommends one. With --output json, one document "
                    "described in neuron_serving.ops.plan.plan_document.")
    plan.add_argument("--model", default=DEFAULT_MODEL_ID, help="Hugging Face model id or catalog name")
    plan.add_argument("--instance-type", default=DEFAULT_INSTANCE_TYPE,
                      help=f"a Neuron instance type, or {ANY_INSTANCE!r} with --objective to compare them all")
    plan.add_argument("--batch-size", type=int, default=None,
                      help=f"static batch size (default: {ServingRequest.batch_size}; with --objective, the "
                           f"objective chooses it unless given)")
    plan.add_argument("--sequence-length", type=int, default=None,
                      help=f"static sequence length (default: {ServingRequest.sequence_length}; with --objective, "
                           "the objective chooses it up to this length unless given)")
    plan.add_argument("--max-input-tokens", type=int, default=None)
    plan.add_argument("--dtype", default=ServingRequest.dtype)
    plan.add_argument("--model-config", default=None, help="path to config.json for a model outside the catalog")
    plan.add_argument("--objective", choices=OBJECTIVES, default=None,
                      help="recommend the layout with the lowest inter-token latency, the most tokens per second, "
                           "the lowest cost per token, or (goodput) the cheapest fleet that serves --rate within "
                           "the p99 targets (default: the smallest degree that fits)")
    plan.add_argument("--max-itl-ms", type=float, default=None,
                      help="with --objective: highest inter-token latency at full batch, milliseconds")
    plan.add_argument("--max-ttft-ms", type=float, default=None,
                      help="with --objective: highest time to first token, milliseconds")
    plan.add_argument("--min-tokens-per-second", type=float, default=None,
                      help="with --objective: fewest output tokens per second of the instance at saturation")
    plan.add_argument("--rate", type=float, default=None,
                      help="with --objective goodput: requests per second the fleet must serve")
    plan.add_argument("--p99-ttft-ms", type=float, default=None,
                      help="with --objective goodput: highest p99 time to first token at the rate, milliseconds")
    plan.add_argument("--p99-itl-ms", type=float, default=None,
                      help="with --objective goodput: highest p99 inter-token latency at the rate, milliseconds")
    plan.add_argument("--trace", type=Path, default=None, metavar="FILE",
                      help="with --objective goodput: the requests to serve instead of --input-tokens and "
                           "--output-tokens, one JSON object per line with input_tokens, output_tokens and, to replay "
                           "its own arrivals instead of --rate's, start (seconds)")
    plan.add_argument("--input-tokens", type=int, default=DEFAULT_WORKLOAD.input_tokens,
                      help="prompt tokens per request of the workload the predictions are for")
    plan.add_argument("--output-tokens", type=int, default=DEFAULT_WORKLOAD.output_tokens,
                      help="generated tokens per request of the workload the predictions are for")
    plan.add_argument("--prefix-cache-block-size", type=int, metavar="TOKENS",
                      help="a prefix cache of blocks of this many tokens (engine nxdi, as its stacks keep by "
                           "default with 32), whose blocks for the batch at full length the memory counts")
    plan.add_argument("--prefix-tokens", type=int, default=0,
                      help="with --prefix-cache-block-size: of each request's prompt tokens, those of a prefix an "
                           "earlier request sent, which the cache keeps, so they are not prefilled (default: 0)")
    plan.add_argument("--acceptance", type=float,
                      help="with --speculative-model: the chance the model accepts each draft token (0 to 1), for "
                           "the predictions; without it they leave speculation out")
    plan.add_argument("--engine", choices=tuple(ENGINES), default=DEFAULT_ENGINE,
                      help="the serving engine whose image's optimum-neuron and neuronx-cc versions the Hub cache "
                           f"is looked up for (default: {DEFAULT_ENGINE}); nxdi's compiles have no Hub cache")
    plan.add_argument("--quantization", choices=("none", *QUANTIZATIONS), default="none",
                      help="the weights' quantization, made by the export (engine nxdi): int8 takes about half "
                           "the weights' device memory")
    plan.add_argument("--speculative-model", metavar="HUB_ID",
                      help="an EAGLE draft of the model (engine nxdi), whose weights and KV cache every core holds "
                           "beside the model's")
    plan.add_argument("--speculative-model-config", metavar="PATH",
                      help="the draft's config.json, for a draft outside the catalog")
    plan.add_argument("--speculative-tokens", type=int, default=DEFAULT_SPECULATIVE_TOKENS,
                      help="the speculation length: the most tokens a step yields, of which the draft proposes "
                           f"all but one (default: {DEFAULT_SPECULATIVE_TOKENS})")
    plan.add_argument("--no-hub-cache", dest="hub_cache", action="store_false",
                      help="do not ask the Hugging Face Hub which layouts optimum-neuron's cache holds")
    plan.set_defaults(run=command)


def command(args: argparse.Namespace) -> int:
    """Run ``plan``: the table as text, or the JSON document of :func:`plan_document`; bad input, and an
    objective that can recommend nothing, are one line on stderr and exit status :data:`EXIT_BAD_INPUT`."""
    printer = Printer(args.output)
    try:
        request, workload, constraints, goodput, space = _plan_inputs(args)
        trace, replayed = None, False
        if args.trace is not None:
            trace, workload, goodput = _trace_inputs(args)
            replayed = args.rate is None
        # An engine whose export toolchain has no Hub cache (nxdi) is not looked up: optimum-neuron's
        # cache holds nothing it can load.
        consults = args.hub_cache and engine(args.engine).default_image.export.hub_cache_variable is not None
        cached, unreadable = _read_cache(args, request) if consults else (None, None)
        document = plan_document(request, workload, args.objective, constraints, goodput=goodput, space=space,
                                 trace=trace, replayed=replayed, cached=cached, cache_unreadable=unreadable)
    except ServingConfigError as err:
        print(f"neuron-serving: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if printer.json:
        printer.document(document)
    else:
        printer.plain(_plan_text(request, workload, document))
    return 0


def cache_model_ids(request: ServingRequest) -> tuple[str, tuple[str, ...]]:
    """The ``model_type`` and the Hub ids whose registry entries count for ``request``'s model: a Hub
    id as the catalog spells it (the Hub's paths are case-sensitive), or every Hub id of a catalog
    name (``llama-3.1-8b``)."""
    spec = resolve_model(request.model_id, request.model_config)
    if "/" not in request.model_id:
        return spec.model_type, spec.hub_ids
    same = [hub_id for hub_id in spec.hub_ids if hub_id.lower() == request.model_id.lower()]
    return spec.model_type, (same[0] if same else request.model_id,)


def _read_cache(args: argparse.Namespace, request: ServingRequest) -> tuple[HubCache | None, str | None]:
    """The Hub cache's layouts of the model for ``--engine``'s image, or why they could not be read."""
    from .hub_cache import CacheUnreadable, read_hub_cache  # huggingface_hub, only when the cache is read

    model_type, model_ids = cache_model_ids(request)
    try:
        return read_hub_cache(engine(args.engine).default_image, model_type, model_ids), None
    except CacheUnreadable as err:
        return None, str(err)


def _table(rows: Sequence[Sequence[str]]) -> str:
    # Right-aligned columns split by spaces, not Printer.table's: rich draws rules between the columns,
    # and readers of this table (people pasting it, scripts) split its rows on whitespace.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)


_COLUMNS = ("degree", "replicas", "idle cores", "GiB/core", "of", "fits",
            "TTFT s", "ITL1 ms", "ITL ms", "tok/s", "$/Mtok", "cached")


def _prediction_cells(prediction: Prediction | None) -> list[str]:
    if prediction is None:
        return ["-"] * 5
    return [
        f"{prediction.ttft_s:.2f}",
        f"{prediction.itl_batch1_s * 1e3:.1f}",
        f"{prediction.itl_full_batch_s * 1e3:.1f}",
        f"{prediction.tokens_per_second_instance:.0f}",
        f"{prediction.usd_per_million_tokens:.2f}",
    ]


def _replicas(count: int) -> str:
    return f"{count} replica" + ("" if count == 1 else "s")


def _trace_inputs(args: argparse.Namespace) -> tuple[list[Call], Workload, Goodput]:
    """``--trace``'s requests, the workload of its largest (for the shapes) and the goodput: at its
    own arrivals' rate when every request has a ``start`` (``--rate`` is then refused), else at
    ``--rate``, :data:`~neuron_serving.plan.performance.LOAD_REQUESTS` Poisson arrivals taking the
    file's requests in turn."""
    path: Path = args.trace
    where = f"trace ('{path}')"
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as err:
        raise ServingConfigError([f"{where} cannot be read: {err.strerror or err}"]) from None
    requests: list[tuple[float | None, int, int]] = []
    problems = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            problems.append(f"{where} line {number} is not JSON")
            continue
        tokens = [entry.get(key) if isinstance(entry, dict) else None for key in ("input_tokens", "output_tokens")]
        start = entry.get("start") if isinstance(entry, dict) else None
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tokens):
            problems.append(f"{where} line {number} needs input_tokens and output_tokens, integers of at least 1")
        elif start is not None and (isinstance(start, bool) or not isinstance(start, int | float) or start < 0):
            problems.append(f"{where} line {number}: start must be a number of seconds of at least 0")
        else:
            requests.append((None if start is None else float(start), int(entry["input_tokens"]),
                             int(entry["output_tokens"])))
    if problems:
        raise ServingConfigError(problems[:5])
    if not requests:
        raise ServingConfigError([f"{where} holds no request"])
    timed = [start is not None for start, _, _ in requests]
    if any(timed) and not all(timed):
        raise ServingConfigError([f"{where} gives start on some lines only: on every line (its own arrivals) or none "
                                  "(arrivals at --rate)"])
    if all(timed):
        if args.rate is not None:
            raise ServingConfigError([f"rate ({args.rate}) cannot be combined with a {where} of its own arrivals"])
        trace = sorted((Call(start or 0.0, i, o) for start, i, o in requests), key=lambda c: c.start)
        span = trace[-1].start - trace[0].start
        if len(trace) < 2 or span <= 0:
            raise ServingConfigError([f"{where}'s arrivals span no time: give two or more starts, or --rate"])
        rate = (len(trace) - 1) / span
    else:
        if args.rate is None:
            raise ServingConfigError(["rate (None) is needed by --objective goodput with a trace without starts"])
        rate = args.rate
        arrivals = poisson_trace(rate, LOAD_REQUESTS, 1, 1)
        trace = [Call(a.start, *requests[k % len(requests)][1:]) for k, a in enumerate(arrivals)]
    longest = max(c.input_tokens for c in trace)
    # The trace's largest request, with the prefix (at most that prompt) and the acceptance the flags give.
    largest = Workload(longest, max(c.output_tokens for c in trace), min(args.prefix_tokens, longest), args.acceptance)
    return trace, largest, Goodput(rate, args.p99_ttft_ms, args.p99_itl_ms)


def _plan_inputs(args: argparse.Namespace) -> tuple[ServingRequest, Workload, Constraints, Goodput | None,
                                                    LayoutSpace]:
    request = ServingRequest(
        model_id=args.model,
        instance_type=args.instance_type,
        batch_size=ServingRequest.batch_size if args.batch_size is None else args.batch_size,
        sequence_length=ServingRequest.sequence_length if args.sequence_length is None else args.sequence_length,
        max_input_tokens=args.max_input_tokens,
        dtype=args.dtype,
        model_config=args.model_config,
        quantization=None if args.quantization == "none" else args.quantization,
        prefix_cache_block_size=args.prefix_cache_block_size,
        speculative_model=args.speculative_model,
        speculative_model_config=args.speculative_model_config,
        speculative_tokens=args.speculative_tokens,
    )
    workload = Workload(args.input_tokens, args.output_tokens, args.prefix_tokens, args.acceptance)
    constraints = Constraints(args.max_itl_ms, args.max_ttft_ms, args.min_tokens_per_second)
    problems = Problems()
    if said := quantization_problem(engine(args.engine), request.quantization):
        problems.add("quantization", request.quantization, said)
    serving = engine(args.engine)
    if request.speculative_model is not None and (said := feature_problem(serving, "speculative_decoding")):
        problems.add("speculative_model", request.speculative_model, said)
    if request.prefix_cache_block_size is not None and (said := feature_problem(serving, "prefix_caching")):
        problems.add("prefix_cache_block_size", request.prefix_cache_block_size, said)
    if workload.prefix_tokens and request.prefix_cache_block_size is None:
        problems.add("prefix_tokens", workload.prefix_tokens, "applies only with --prefix-cache-block-size")
    if workload.acceptance is not None and request.speculative_model is None:
        problems.add("acceptance", workload.acceptance, "applies only with --speculative-model")
    if args.objective != "goodput":
        for name in ("p99_ttft_ms", "p99_itl_ms"):
            if getattr(args, name) is not None:
                problems.add(name, getattr(args, name), "applies only with --objective goodput")
    problems.raise_if_any()
    goodput = None
    if args.trace is not None and args.objective != "goodput":
        problems.add("trace", str(args.trace), "applies only with --objective goodput")
        problems.raise_if_any()
    if (args.objective == "goodput" or args.rate is not None) and args.trace is None:
        if args.rate is None:
            raise ServingConfigError(["rate (None) is needed by --objective goodput: the requests per second the "
                                      "fleet must serve"])
        goodput = Goodput(args.rate, args.p99_ttft_ms, args.p99_itl_ms)
    # The batch sizes the engine serves (vLLM's continuous batching: 2 and above).
    least = engine(args.engine).min_batch_size
    if args.batch_size is not None and args.batch_size < least:
        raise ServingConfigError([f"batch_size ({args.batch_size}) must be at least {least} with --engine "
                                  f"{args.engine}"])
    space = LayoutSpace(tuple(b for b in BATCH_SIZES if b >= least) if args.batch_size is None else (args.batch_size,),
                        None if args.sequence_length is None else (args.sequence_length,))
    return request, workload, constraints, goodput, space


def plan_document(request: ServingRequest, workload: Workload, objective: str | None,
                  constraints: Constraints, *, goodput: Goodput | None = None,
                  space: LayoutSpace | None = None, trace: Sequence[Call] | None = None,
                  replayed: bool = False, cached: HubCache | None = None,
                  cache_unreadable: str | None = None) -> dict[str, Any]:
    """What ``neuron-serving plan --output json`` prints. Keys (times in seconds, memory in GiB):

    - ``request``: ``model_id``, ``instance_type`` (or ``"any"``), ``batch_size``,
      ``sequence_length``, ``max_input_tokens``, ``dtype``;
    - ``workload``: ``input_tokens``, ``output_tokens`` (with a trace, its largest request's), and
      ``trace``: ``requests`` and ``replayed`` (true: its own arrivals; false: Poisson at the
      rate), or null;
    - ``objective``: ``latency``, ``throughput``, ``cost``, ``goodput`` or null;
    - ``constraints``: ``max_itl_ms``, ``max_ttft_ms``, ``min_tokens_per_second`` (null: none);
    - ``goodput``: ``rate``, ``p99_ttft_ms``, ``p99_itl_ms``, ``max_instances``, or null;
    - ``degrees`` (one instance type): per degree the instance accepts, ``degree``, ``replicas``,
      ``idle_cores``, ``memory_gib`` (needed per core), ``available_gib``, ``fits``, and
      ``prediction`` (null when it does not fit);
    - ``instance_types`` (``any``): per instance type that can serve the model, its
      ``instance_type``, ``hourly_usd``, ``degree``, ``replicas`` and ``prediction``;
      ``ruled_out``: ``[{"instance_type", "why"}]`` for the others;
    - ``rejected``: ``[{"layout", "why"}]``, the layouts an objective's limits ruled out
      (``layout``: ``degree 8, batch 32, sequence 1024``);
    - ``recommendation``: ``instance_type``, ``hourly_usd``, ``degree``, ``batch_size``,
      ``sequence_length``, ``replicas``, ``instances``, ``layout``, ``reason``, ``prediction`` and
      ``load`` (with ``goodput``: :class:`~neuron_serving.plan.performance.LoadPrediction`'s
      fields, else null) of the recommended layout (without an objective: the smallest degree
      that fits), ``cannot_compile`` (why the host cannot compile it, or null) and
      ``time_to_serve`` (its predicted minutes to serve by scenario and phase, on the default
      root volume: :func:`~neuron_serving.plan.time_to_serve.time_to_serve_document`), or null
      when nothing fits;
    - ``no_layout``: why nothing fits, or null;
    - ``hub_cache``: null when the cache was not consulted, else ``read``: whether it could be read,
      ``why``: why not (null when read), and when read ``repo``, ``optimum_neuron``, ``neuronx_cc``
      and ``layouts``: the model's layouts in its registry for the image, each ``degree``,
      ``batch_size``, ``sequence_length``, ``torch_dtype``, ``target`` and ``model_id``. Each
      entry of ``degrees`` and ``instance_types`` and the ``recommendation`` then has ``cached``:
      whether the cache holds that layout (null when it could not be read or was not consulted).

    A ``prediction`` holds :class:`~neuron_serving.plan.performance.Prediction`'s fields: ``degree``,
    ``replicas``, ``ttft_s``, ``itl_batch1_s``, ``itl_full_batch_s``, ``tokens_per_second_replica``,
    ``tokens_per_second_instance``, ``requests_per_second_instance``, ``usd_per_million_tokens``.

    With an objective, the batch size and sequence length are chosen too, within ``space``
    (default: :class:`~neuron_serving.plan.performance.LayoutSpace` ``()``); ``degrees`` lists the
    request's own batch size and sequence length.

    Raises :class:`ServingConfigError` for bad input (limits or ``any`` without an objective among
    them), and when an objective can recommend nothing.
    """
    if objective is None:
        problems = Problems()
        for name, limit in constraints.limits():
            problems.add(name, limit, "needs --objective, which chooses among the layouts")
        if request.instance_type == ANY_INSTANCE:
            problems.add("instance_type", ANY_INSTANCE, "needs --objective, which chooses among the layouts")
        problems.raise_if_any()
    document: dict[str, Any] = {
        "request": {
            "model_id": request.model_id,
            "instance_type": request.instance_type,
            "batch_size": request.batch_size,
            "sequence_length": request.sequence_length,
            "max_input_tokens": request.effective_max_input_tokens,
            "dtype": request.dtype,
        },
        "workload": {"input_tokens": workload.input_tokens, "output_tokens": workload.output_tokens,
                     "prefix_tokens": workload.prefix_tokens, "acceptance": workload.acceptance,
                     "trace": None if trace is None else {"requests": len(trace), "replayed": replayed}},
        "objective": objective,
        "constraints": {name: getattr(constraints, name)
                        for name in ("max_itl_ms", "max_ttft_ms", "min_tokens_per_second")},
        "goodput": None if goodput is None else asdict(goodput),
        "hub_cache": _cache_entry(cached, cache_unreadable),
    }
    if request.instance_type == ANY_INSTANCE and objective is not None:
        compared = compare_instances(request, objective, constraints, workload, goodput=goodput, space=space,
                                     trace=trace, cached=cached)
        document["instance_types"] = [
            {"instance_type": r.plan.instance.name, "hourly_usd": r.plan.instance.hourly_usd,
             "degree": r.plan.degree, "batch_size": r.plan.batch_size, "sequence_length": r.plan.sequence_length,
             "replicas": len(r.plan.replicas), "instances": r.instances, "prediction": asdict(r.prediction),
             "cached": _holds(cached, r.plan)}
            for r in compared.per_instance
        ]
        document["ruled_out"] = [{"instance_type": name, "why": why} for name, why in compared.ruled_out]
        return _recommended(document, compared.best, cached)
    options = degree_options(request)
    workload.check_fits(request)
    laid_out = {plan.degree: (plan, prediction) for plan, prediction in candidates(request, workload)}
    document["degrees"] = [_degree_entry(option, laid_out.get(option.degree), cached) for option in options]
    if objective is not None:
        return _recommended(document, recommend(request, objective, constraints, workload, goodput=goodput,
                                                space=space, trace=trace, cached=cached), cached)
    try:
        default = plan_serving(request)
    except ServingConfigError as err:
        return {**document, "rejected": [], "recommendation": None, "no_layout": str(err)}
    chosen = _layout_entry(default, laid_out[default.degree][1], "the smallest degree that fits: the most replicas",
                           cached=cached)
    return {**document, "rejected": [], "recommendation": chosen, "no_layout": None}


def _holds(cached: HubCache | None, plan: ServingPlan) -> bool | None:
    return None if cached is None else cached.holds(plan)


def _cache_entry(cached: HubCache | None, unreadable: str | None) -> dict[str, Any] | None:
    if unreadable is not None:
        return {"read": False, "why": unreadable}
    if cached is None:
        return None
    layouts = [{"degree": layout.tp_degree, "batch_size": layout.batch_size,
                "sequence_length": layout.sequence_length, "torch_dtype": layout.torch_dtype,
                "target": layout.target, "model_id": layout.model_id} for layout in cached.layouts]
    return {"read": True, "why": None, "repo": cached.repo, "optimum_neuron": cached.optimum_neuron,
            "neuronx_cc": cached.neuronx_cc, "layouts": layouts}


def _degree_entry(option: DegreeOption, laid_out: tuple[ServingPlan, Prediction] | None,
                  cached: HubCache | None) -> dict[str, Any]:
    prediction = None if laid_out is None else laid_out[1]
    return {
        "degree": option.degree,
        "replicas": option.replicas,
        "idle_cores": option.idle_cores,
        "memory_gib": round(option.memory.total / GIB, 2),
        "available_gib": round(option.memory.available / GIB, 2),
        "fits": option.memory.fits,
        "prediction": None if prediction is None else asdict(prediction),
        # A degree whose memory does not fit is laid out by no plan, and no cached entry can serve it here.
        "cached": None if cached is None else laid_out is not None and cached.holds(laid_out[0]),
    }


def _layout_entry(plan: ServingPlan, prediction: Prediction, reason: str,
                  load: LoadPrediction | None = None, *, cached: HubCache | None) -> dict[str, Any]:
    return {
        "instance_type": plan.instance.name,
        "hourly_usd": plan.instance.hourly_usd,
        "degree": plan.degree,
        "batch_size": plan.batch_size,
        "sequence_length": plan.sequence_length,
        "replicas": len(plan.replicas),
        "instances": 1 if load is None else load.instances,
        "layout": plan.describe(),
        "reason": reason,
        "prediction": asdict(prediction),
        "load": None if load is None else asdict(load),
        # The host serves this layout, but compiles it only with enough memory: else a prebuilt export.
        "cannot_compile": compile_memory_problem(plan),
        "time_to_serve": _time_to_serve(plan),
        "cached": _holds(cached, plan),
    }


def _recommended(document: dict[str, Any], recommendation: Recommendation, cached: HubCache | None) -> dict[str, Any]:
    return {
        **document,
        # Degrees whose memory does not fit are in the listing already; these are the objective's.
        "rejected": [{"layout": layout, "why": why}
                     for layout, why in recommendation.rejected if not why.startswith("does not fit")],
        "recommendation": _layout_entry(recommendation.plan, recommendation.prediction, recommendation.reason,
                                        recommendation.load, cached=cached),
        "no_layout": None,
    }


def _plan_text(request: ServingRequest, workload: Workload, document: dict[str, Any]) -> str:
    where = "any instance type" if request.instance_type == ANY_INSTANCE else (
        f"{request.instance_type} (about ${INSTANCES[request.instance_type].hourly_usd:.2f}/h on demand)")
    lines = [
        f"{request.model_id} on {where}: batch {request.batch_size}, sequence {request.sequence_length}, "
        f"input <= {request.effective_max_input_tokens}, {request.dtype}"
        + ("" if request.quantization is None else f" with {request.quantization} weights")
        + ("" if request.speculative_model is None
           else f", drafted by {request.speculative_model} (up to {request.speculative_tokens} tokens a step)"),
        f"predicted for {workload.input_tokens} input and {workload.output_tokens} output tokens per request"
        + (f", {workload.prefix_tokens} of them a cached prefix" if request.prefix_cache_block_size and
           workload.prefix_tokens else "")
        + ("" if request.speculative_model is None else
           f", draft tokens accepted at {workload.acceptance}" if workload.acceptance is not None else
           ", speculation left out (no --acceptance)")
        + " (prompts are padded to the sequence length; tok/s and $/Mtok: output tokens, at saturation)",
    ]
    chosen = document["recommendation"]
    if chosen is not None and "degrees" in document and document["objective"] is not None and (
            chosen["batch_size"], chosen["sequence_length"]) != (request.batch_size, request.sequence_length):
        lines.append(f"(the table is batch {request.batch_size}, sequence {request.sequence_length}; the objective "
                     "chose among every batch size and sequence length that holds the workload)")
    if "instance_types" in document:
        rows = [["instance type", "$/h", "degree", "batch", "sequence", "replicas", "instances", *_COLUMNS[6:]]]
        for entry in document["instance_types"]:
            rows.append([entry["instance_type"], f"{entry['hourly_usd']:.2f}", str(entry["degree"]),
                         str(entry["batch_size"]), str(entry["sequence_length"]), str(entry["replicas"]),
                         str(entry["instances"]), *_prediction_cells(Prediction(**entry["prediction"])),
                         _cached_cell(entry["cached"])])
        lines.append(_table(rows))
        lines += [f"ruled out: {entry['instance_type']}: {entry['why']}" for entry in document["ruled_out"]]
    else:
        rows = [list(_COLUMNS)]
        for entry in document["degrees"]:
            prediction = entry["prediction"]
            rows.append([
                str(entry["degree"]), str(entry["replicas"]), str(entry["idle_cores"]),
                f"{entry['memory_gib']:.1f}", f"{entry['available_gib']:.0f}", "yes" if entry["fits"] else "no",
                *_prediction_cells(None if prediction is None else Prediction(**prediction)),
                _cached_cell(entry["cached"]),
            ])
        lines.append(_table(rows))
    lines += _cache_lines(document["hub_cache"])
    lines += [f"ruled out: {entry['layout']}: {entry['why']}" for entry in document["rejected"]]
    chosen = document["recommendation"]
    if chosen is None:
        lines.append(f"no layout: {document['no_layout']}")
    elif document["objective"] is None:
        lines.append(f"default (smallest degree that fits): {chosen['degree']} -> {chosen['layout']}")
    else:
        on = f"{chosen['instance_type']}, " if request.instance_type == ANY_INSTANCE else ""
        lines.append(f"recommended: {on}degree {chosen['degree']} ({_replicas(chosen['replicas'])}), batch "
                     f"{chosen['batch_size']}, sequence {chosen['sequence_length']}: {chosen['reason']}")
        lines.append(f"layout: {chosen['layout']}")
    if chosen is not None and chosen.get("cannot_compile"):
        lines.append(f"note: {chosen['cannot_compile']}")
    if chosen is not None:
        lines += _time_to_serve_lines(chosen["time_to_serve"])
    return "\n".join(lines)


# -- time to serve -----------------------------------------------------------------------------------

_TIME_COLUMNS = (FIRST_DEPLOY, CACHE_HIT, WARM_POOL)
"""The scenarios shown as columns; the first deploy that compiles in full is a line of its own."""


def _time_to_serve(plan: ServingPlan) -> dict[str, Any]:
    """The layout's predicted time to serve (:func:`~neuron_serving.plan.time_to_serve.time_to_serve_document`)
    on the root volume the stack gives it by default."""
    return time_to_serve_document(plan, volume_performance(plan).throughput)


def _time_to_serve_lines(document: dict[str, Any]) -> list[str]:
    """The ``time to serve`` section: a phase per row, a scenario per column, then the totals and the
    first deploy's total when the public compile cache misses."""
    scenarios = document["scenarios"]
    rows = [["minutes", *(c.replace(" ", "-") for c in _TIME_COLUMNS)]]
    # Phase keys, not titles, label the rows: the table's readers split them on whitespace.
    for phase in PHASE_TITLES:
        if phase == "compile" or not any(phase in SCENARIOS[s] for s in _TIME_COLUMNS):
            continue
        cells = [f"{scenarios[s]['phases'][phase]:.1f}" if phase in SCENARIOS[s] else "-" for s in _TIME_COLUMNS]
        rows.append([phase, *cells])
    rows.append(["total", *(f"{scenarios[s]['total']:.1f}" for s in _TIME_COLUMNS)])
    compiling = scenarios[FIRST_DEPLOY_COMPILING]
    return [
        f"time to serve, predicted (root volume {document['throughput']} MiB/s):",
        _table(rows),
        f"first deploy when the public compile cache misses: {compiling['total']:.1f} (compile: "
        f"{compiling['phases']['compile']:.1f})",
        "phases: " + "; ".join(f"{key}: {title}" for key, title in PHASE_TITLES.items()),
        f"each figure and its source: {document['sources']}",
    ]


def _cached_cell(cached: bool | None) -> str:
    return "-" if cached is None else "yes" if cached else "no"


def _cache_lines(entry: dict[str, Any] | None) -> list[str]:
    """What the text says of the Hub cache: why it could not be read, or what it holds of the model."""
    if entry is None:
        return []
    if not entry["read"]:
        return [f"hub cache: could not be read ({entry['why']}); planned without it (cached: -)"]
    shapes = sorted({(e["degree"], e["batch_size"], e["sequence_length"], e["torch_dtype"]) for e in entry["layouts"]})
    held = "; ".join(f"degree {d}, batch {b}, sequence {s}, {t}" for d, b, s, t in shapes) or "none"
    return [f"hub cache: {entry['repo']} for optimum-neuron {entry['optimum_neuron']} and neuronx-cc "
            f"{release(entry['neuronx_cc'])} holds {len(shapes)} layout{'' if len(shapes) == 1 else 's'} of the "
            f"model: {held}"]
