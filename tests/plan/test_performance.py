"""The performance model: each published figure within 25%, the physics' directions, and the
objectives and constraints that pick a layout."""

import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest

from neuron_serving.plan import (
    DEFAULT_WORKLOAD,
    PUBLISHED,
    Constraints,
    ServingConfigError,
    ServingRequest,
    Workload,
    candidates,
    compare_instances,
    plan_serving,
    predict,
    recommend,
)
from neuron_serving.plan.performance import (
    CALIBRATION,
    LATENCY_TIE_FRACTION,
    STATIC_BATCHING,
    Goodput,
    LayoutSpace,
    PublishedFigure,
    layout_label,
    predict_load,
    predict_published,
)
from neuron_serving.plan.queueing import Call

LLAMA_8B = ServingRequest("meta-llama/Meta-Llama-3.1-8B-Instruct", "inf2.48xlarge")


def _at(degree: int, request: ServingRequest = LLAMA_8B, workload: Workload = DEFAULT_WORKLOAD):
    return predict(plan_serving(replace(request, tensor_parallel=degree)), workload)


# --- Published figures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("figure", PUBLISHED, ids=lambda figure: f"{figure.name} b{figure.batch} s{figure.sequence}")
def test_the_model_is_within_25_percent_of_each_published_figure(figure):
    predicted = predict_published(figure)
    error = predicted / figure.value - 1
    assert abs(error) <= 0.25, (
        f"{figure.name} (batch {figure.batch}, sequence {figure.sequence}, {figure.engine}; {figure.source}): "
        f"published {figure.value}, predicted {predicted:.4g}, off by {error:+.1%}"
    )


@pytest.mark.parametrize("figure", STATIC_BATCHING, ids=lambda figure: f"batch {figure.batch}")
def test_each_step_of_the_static_batching_table_is_within_15_percent(figure):
    predicted = predict_published(figure)
    error = predicted / figure.value - 1
    assert abs(error) <= 0.15, f"batch {figure.batch}: {figure.value} ms, predicted {predicted:.3g} ({error:+.1%})"


def test_the_step_grows_from_batch_1_to_the_largest_published_batch_within_25_percent_of_the_table():
    # Every table of full-batch steps the model is fitted on: today optimum-neuron's of Llama 3.1 8B.
    tables: dict[tuple[str, str, int, int], list[PublishedFigure]] = {}
    for figure in PUBLISHED:
        if figure.metric == "step_ms":
            tables.setdefault((figure.model, figure.instance, figure.degree, figure.sequence), []).append(figure)
    assert tables, "no table of steps by batch in PUBLISHED"
    for key, table in tables.items():
        first, last = min(table, key=lambda f: f.batch), max(table, key=lambda f: f.batch)
        assert first.batch == 1 and last.batch > 1, key
        published = last.value - first.value
        predicted = predict_published(last) - predict_published(first)
        assert abs(predicted / published - 1) <= 0.25, (
            f"{key}: batch 1 to {last.batch} grows {published} ms published, {predicted:.3g} ms predicted")


def test_every_published_figure_names_its_engine_and_source():
    for figure in PUBLISHED:
        assert figure.engine and figure.source and figure.url.startswith("https://"), figure.name


# --- The physics' directions ----------------------------------------------------------------------------------


def test_more_cores_per_replica_lower_the_inter_token_latency_at_batch_1():
    itl = [_at(degree).itl_batch1_s for degree in (2, 4, 8, 16)]
    assert itl == sorted(itl, reverse=True)
    assert itl[0] > 2 * itl[2]


def test_past_some_degree_the_collectives_cost_more_than_the_bandwidth_gained():
    assert _at(24).itl_batch1_s > _at(16).itl_batch1_s


def test_a_larger_batch_gives_more_throughput_and_a_higher_inter_token_latency():
    small, large = (_at(8, replace(LLAMA_8B, batch_size=batch)) for batch in (4, 16))
    assert large.tokens_per_second_instance > small.tokens_per_second_instance
    assert large.itl_full_batch_s > small.itl_full_batch_s


def test_a_longer_export_sequence_raises_the_time_to_first_token():
    short, long = (_at(8, replace(LLAMA_8B, sequence_length=s)) for s in (2048, 8192))
    assert long.ttft_s > 3 * short.ttft_s


def test_the_prompt_length_does_not_change_the_time_to_first_token_because_every_prompt_is_padded():
    assert _at(8, workload=Workload(100, 256)).ttft_s == _at(8, workload=Workload(3000, 256)).ttft_s


def test_a_lone_request_steps_faster_than_a_full_batch_by_the_other_slots_work_only():
    prediction = _at(8)
    busy = LLAMA_8B.batch_size - 1
    assert prediction.itl_full_batch_s - prediction.itl_batch1_s == pytest.approx(busy * CALIBRATION.slot_step_s)


def test_the_compiled_batch_costs_its_kv_cache_read_even_with_one_slot_busy():
    small, large = (_at(8, replace(LLAMA_8B, batch_size=batch)) for batch in (4, 32))
    assert large.itl_batch1_s > small.itl_batch1_s


def test_shorter_answers_give_fewer_tokens_per_second_because_prefills_interrupt_decoding():
    assert _at(8, workload=Workload(512, 32)).tokens_per_second_instance < _at(8).tokens_per_second_instance


def test_the_instance_serves_each_replica_s_tokens():
    prediction = _at(8)
    assert prediction.replicas == 3
    assert prediction.tokens_per_second_instance == pytest.approx(3 * prediction.tokens_per_second_replica)
    assert prediction.tokens_per_second_instance == pytest.approx(
        prediction.requests_per_second_instance * DEFAULT_WORKLOAD.output_tokens)


def test_the_cost_is_the_hourly_price_over_the_tokens_of_an_hour():
    prediction = _at(8)
    tokens_per_hour = prediction.tokens_per_second_instance * 3600
    assert prediction.usd_per_million_tokens == pytest.approx(12.98 / tokens_per_hour * 1e6)


# --- Workload -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [0, -5, True, 1.5])
def test_a_workload_needs_whole_positive_token_counts(tokens):
    with pytest.raises(ServingConfigError, match=r"input_tokens \(.*\) must be an integer of at least 1"):
        Workload(tokens, 10)


def test_a_workload_longer_than_the_sequence_is_refused_naming_both():
    with pytest.raises(ServingConfigError, match=r"output_tokens \(2000\) plus input_tokens \(3000\) must be at most "
                                                 r"sequence_length \(4096\)"):
        _at(8, workload=Workload(3000, 2000))


def test_with_a_draft_a_workload_must_end_the_speculation_length_before_the_sequence():
    # The plugin's scheduler stops a drafted request k tokens early (vllm_neuron/core/scheduler.py).
    drafted = plan_serving(replace(NXDI_8B, speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B",
                                   speculative_tokens=4))
    assert drafted.sequence_length == 4096
    predict(drafted, Workload(3000, 1092))
    said = (r"^output_tokens \(1093\) plus input_tokens \(3000\) must be at most sequence_length \(4096\) less "
            r"speculative_tokens \(4\), 4092: with a draft, a request ends that many tokens before the sequence's end$")
    with pytest.raises(ServingConfigError, match=said):
        predict(drafted, Workload(3000, 1093))
    predict(plan_serving(NXDI_8B), Workload(3000, 1096))


def test_a_prompt_longer_than_max_input_tokens_is_refused():
    with pytest.raises(ServingConfigError, match=r"input_tokens \(3500\) must be at most max_input_tokens \(3072\)"):
        recommend(LLAMA_8B, "latency", workload=Workload(3500, 100))


# --- Objectives -----------------------------------------------------------------------------------------------


def test_latency_and_cost_recommend_different_layouts_for_llama_8b_on_inf2_48xlarge():
    latency, cost = (recommend(LLAMA_8B, objective) for objective in ("latency", "cost"))
    assert latency.plan.degree != cost.plan.degree
    assert latency.prediction.itl_full_batch_s < cost.prediction.itl_full_batch_s
    assert cost.prediction.usd_per_million_tokens < latency.prediction.usd_per_million_tokens


def test_latency_picks_the_shortest_first_token_among_the_lowest_inter_token_latencies():
    chosen = recommend(LLAMA_8B, "latency")
    lowest = min(p.itl_full_batch_s for _, p in chosen.candidates)
    tied = [p for _, p in chosen.candidates if p.itl_full_batch_s <= lowest * (1 + LATENCY_TIE_FRACTION)]
    assert chosen.prediction.ttft_s == min(p.ttft_s for p in tied)
    assert "within 5% of the lowest" in chosen.reason


def test_throughput_picks_the_most_tokens_per_second():
    chosen = recommend(LLAMA_8B, "throughput")
    assert chosen.prediction.tokens_per_second_instance == max(
        p.tokens_per_second_instance for _, p in chosen.candidates)


def test_cost_picks_the_lowest_price_per_token_and_says_throughput_agrees_on_one_instance_type():
    chosen = recommend(LLAMA_8B, "cost")
    assert chosen.prediction.usd_per_million_tokens == min(p.usd_per_million_tokens for _, p in chosen.candidates)
    assert chosen.plan.degree == recommend(LLAMA_8B, "throughput").plan.degree
    assert "the throughput objective picks the same" in chosen.reason


def test_a_recommendation_predicts_every_fitting_degree_and_rejects_the_others_by_memory():
    request = ServingRequest("llama-3.1-70b", "inf2.48xlarge")
    chosen = recommend(request, "throughput", space=LayoutSpace.fixed(request))
    assert [plan.degree for plan, _ in chosen.candidates] == list(range(12, 25, 2))
    assert [label for label, _ in chosen.rejected] == [f"degree {d}" for d in range(2, 11, 2)]
    assert chosen.rejected[0][1].startswith("does not fit: needs ")


def test_a_recommendation_ignores_the_requested_degree():
    fixed = LayoutSpace.fixed(LLAMA_8B)
    assert recommend(replace(LLAMA_8B, tensor_parallel=8), "cost", space=fixed).plan.degree == 2


def test_an_unknown_objective_is_refused_naming_the_allowed_ones():
    allowed = "latency, throughput, cost, goodput"
    with pytest.raises(ServingConfigError, match=rf"objective \('fast'\) must be one of {allowed}"):
        recommend(LLAMA_8B, "fast")


def test_a_model_that_fits_nowhere_gets_the_planner_s_error():
    with pytest.raises(ServingConfigError, match=r"fits at no tensor_parallel degree on inf2.8xlarge"):
        request = ServingRequest("llama-3-8b", "inf2.8xlarge", batch_size=64, sequence_length=8192)
        recommend(request, "latency", space=LayoutSpace.fixed(request))


# --- Constraints ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "20"])
def test_a_limit_must_be_a_positive_number(value):
    with pytest.raises(ServingConfigError, match=r"max_itl_ms \(.*\) must be a positive number"):
        Constraints(max_itl_ms=value)


def test_a_latency_limit_rules_out_the_slow_layouts_before_the_cost_objective_picks():
    chosen = recommend(LLAMA_8B, "cost", Constraints(max_itl_ms=25))
    slow = sorted(layout_label(plan) for plan, p in chosen.candidates if p.itl_full_batch_s > 0.025)
    assert slow and layout_label(chosen.plan) not in slow
    assert sorted(label for label, why in chosen.rejected if why.startswith("misses max_itl_ms (25): ")) == slow
    assert chosen.prediction.usd_per_million_tokens == min(
        p.usd_per_million_tokens for plan, p in chosen.candidates if layout_label(plan) not in slow)
    assert chosen.reason.endswith(f"Ruled out by the limits: {len(slow)} layouts.")


def test_a_throughput_limit_rules_out_the_degrees_with_fewer_tokens_per_second():
    chosen = recommend(LLAMA_8B, "latency", Constraints(min_tokens_per_second=400))
    assert {layout_label(plan) for plan, p in chosen.candidates if p.tokens_per_second_instance < 400} == {
        label for label, why in chosen.rejected}
    assert chosen.prediction.tokens_per_second_instance >= 400


def test_a_first_token_limit_is_checked_against_the_time_to_first_token():
    chosen = recommend(LLAMA_8B, "throughput", Constraints(max_ttft_ms=500), space=LayoutSpace.fixed(LLAMA_8B))
    assert chosen.prediction.ttft_s <= 0.5
    assert "degree 2, batch 4, sequence 4096" in {label for label, _ in chosen.rejected}


def test_a_limit_no_degree_meets_is_named_with_its_value_and_the_best_any_degree_achieves():
    with pytest.raises(ServingConfigError) as raised:
        recommend(LLAMA_8B, "latency", Constraints(max_itl_ms=5, max_ttft_ms=50), space=LayoutSpace.fixed(LLAMA_8B))
    itl, ttft = raised.value.problems
    found = candidates(LLAMA_8B)
    fastest_plan, fastest = min(found, key=lambda candidate: candidate[1].itl_full_batch_s)
    assert itl == (f"max_itl_ms (5) cannot be met on inf2.48xlarge: the best inter-token latency at full batch of any "
                   f"layout that fits is {fastest.itl_full_batch_s * 1e3:.1f} ms ({layout_label(fastest_plan)})")
    first_plan, first = min(found, key=lambda candidate: candidate[1].ttft_s)
    assert ttft == (f"max_ttft_ms (50) cannot be met on inf2.48xlarge: the best time to first token of any layout "
                    f"that fits is {first.ttft_s * 1e3:.1f} ms ({layout_label(first_plan)})")


def test_limits_each_met_by_some_degree_but_never_together_are_reported_as_such():
    with pytest.raises(ServingConfigError) as raised:
        recommend(LLAMA_8B, "latency", Constraints(max_itl_ms=25, min_tokens_per_second=600),
                  space=LayoutSpace.fixed(LLAMA_8B))
    *limits, summary = raised.value.problems
    assert all(limit.endswith("but not together with the other limits") for limit in limits)
    assert summary == "no single layout meets every limit: relax one of them"


# --- Across instance types ------------------------------------------------------------------------------------


def test_cost_across_instance_types_picks_the_cheapest_token_of_all_and_says_why_others_cannot_serve():
    compared = compare_instances(LLAMA_8B, "cost")
    cheapest = min(r.prediction.usd_per_million_tokens for r in compared.per_instance)
    assert compared.best.prediction.usd_per_million_tokens == cheapest
    assert compared.best.reason.startswith(f"the best of the {len(compared.per_instance)} instance types")
    # A host serves what it cannot compile (from a prebuilt export): every type can serve the 8B model.
    assert compared.ruled_out == ()
    assert compared.best.plan.instance.name == "inf2.xlarge"


def test_candidates_refuse_a_workload_that_does_not_fit_before_predicting():
    with pytest.raises(ServingConfigError, match="sequence_length"):
        candidates(replace(LLAMA_8B, sequence_length=512, max_input_tokens=None), DEFAULT_WORKLOAD)


# --- The whole layout -----------------------------------------------------------------------------------------


def test_the_search_covers_batch_sizes_and_the_sequence_lengths_the_workload_fits_in():
    requests = LayoutSpace().requests(LLAMA_8B, DEFAULT_WORKLOAD)  # 512 + 256 tokens: 1024 is the shortest
    assert sorted({r.sequence_length for r in requests}) == [1024, 2048, 4096]
    assert sorted({r.batch_size for r in requests}) == [1, 2, 4, 8, 16, 32, 48]
    assert all(r.effective_max_input_tokens >= DEFAULT_WORKLOAD.input_tokens for r in requests)


def test_cost_on_llama_8b_chooses_a_batch_above_4_and_beats_the_degree_alone():
    degree_only = recommend(LLAMA_8B, "cost", space=LayoutSpace.fixed(LLAMA_8B))
    whole = recommend(LLAMA_8B, "cost")
    assert whole.plan.batch_size > 4
    assert whole.prediction.usd_per_million_tokens < degree_only.prediction.usd_per_million_tokens
    assert whole.reason.startswith("the lowest price per million output tokens, $")


def test_latency_chooses_the_smallest_batch_because_a_busy_slot_costs_every_other_slot_time():
    assert recommend(LLAMA_8B, "latency").plan.batch_size == 1


# --- Goodput --------------------------------------------------------------------------------------------------


def test_goodput_serves_the_rate_within_its_targets_at_the_lowest_price_per_hour():
    goodput = Goodput(rate=4.0, p99_ttft_ms=1500, p99_itl_ms=60)
    chosen = recommend(LLAMA_8B, "goodput", goodput=goodput)
    load = chosen.load
    assert load is not None and load.rate == 4.0
    assert load.ttft_p99_s <= 1.5 and load.itl_p99_s <= 0.060 and load.utilisation < 1
    assert load.usd_per_hour == pytest.approx(load.instances * 12.98)
    assert chosen.instances == load.instances
    assert "predicted p99 TTFT" in chosen.reason and "utilisation" in chosen.reason
    # No layout of fewer instances meets the targets: one instance less is already too few for the best layout.
    if load.instances > 1:
        fewer = predict_load(chosen.plan, DEFAULT_WORKLOAD, 4.0, load.instances - 1)
        assert goodput.misses(fewer) or fewer.utilisation >= 1


def test_goodput_with_a_rate_twice_as_high_needs_a_fleet_at_least_as_dear():
    low, high = (recommend(LLAMA_8B, "goodput", goodput=Goodput(rate=rate, p99_ttft_ms=2000)) for rate in (2.0, 8.0))
    assert high.load is not None and low.load is not None
    assert high.load.usd_per_hour >= low.load.usd_per_hour


def test_goodput_says_plainly_when_no_layout_can_meet_the_targets():
    with pytest.raises(ServingConfigError, match=r"rate \(2\.0\) cannot be served as asked \(2 requests/s with p99 "
                                                 r"TTFT <= 10 ms\): no layout on inf2.48xlarge serves a request alone"):
        recommend(LLAMA_8B, "goodput", goodput=Goodput(rate=2.0, p99_ttft_ms=10))


def test_goodput_needs_a_rate_and_the_other_objectives_refuse_one():
    with pytest.raises(ServingConfigError, match=r"rate \(None\) is needed by the goodput objective"):
        recommend(LLAMA_8B, "goodput")
    with pytest.raises(ServingConfigError, match=r"rate \(1\.0\) applies only to the goodput objective, not cost"):
        recommend(LLAMA_8B, "cost", goodput=Goodput(rate=1.0))


@pytest.mark.parametrize(("field", "value"), [("rate", 0), ("p99_ttft_ms", -5.0), ("p99_itl_ms", math.inf)])
def test_goodput_targets_must_be_positive_numbers(field, value):
    with pytest.raises(ServingConfigError, match=rf"{field} \(.*\) must be a positive number"):
        Goodput(**{"rate": 1.0, field: value})


def test_goodput_across_instance_types_picks_the_cheapest_fleet_per_hour():
    compared = compare_instances(LLAMA_8B, "goodput", goodput=Goodput(rate=1.0, p99_ttft_ms=3000),
                                 instance_types=("inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge"))
    prices = [r.load.usd_per_hour for r in compared.per_instance if r.load is not None]
    assert prices == sorted(prices) and compared.best.load is not None
    assert compared.best.load.usd_per_hour == prices[0]


def test_the_documented_table_is_the_model_s_own():
    # docs/performance-model.md carries scripts/fit_performance.py --table; a refit must refresh it.
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("fit_performance", root / "scripts" / "fit_performance.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.table() in (root / "docs" / "performance-model.md").read_text()


def test_a_load_prediction_of_a_trace_counts_its_mean_request_at_saturation():
    plan = plan_serving(replace(LLAMA_8B, tensor_parallel=8))
    trace = [Call(i * 0.5, 100 if i % 2 else 1000, 50 if i % 2 else 250) for i in range(200)]
    load = predict_load(plan, Workload(1000, 250), 2.0, trace=trace)
    mean = predict(plan, Workload(550, 150))
    assert load.utilisation == pytest.approx(2.0 / mean.requests_per_second_instance)
    assert load.usd_per_million_tokens == pytest.approx(12.98 / (2.0 * 150 * 3600) * 1e6)


# --- A prefix cache and a draft -------------------------------------------------------------------------------

NXDI_8B = ServingRequest("meta-llama/Meta-Llama-3-8B-Instruct", "inf2.24xlarge", tensor_parallel=2)


def test_a_cached_prefix_is_not_prefilled_in_whole_blocks_and_never_the_whole_prompt():
    from neuron_serving.plan.performance import cached_prefix_tokens, prefill_s

    cached = plan_serving(replace(NXDI_8B, prefix_cache_block_size=32))
    plain = plan_serving(NXDI_8B)
    workload = Workload(3072, 256, prefix_tokens=3000)
    # 3000 tokens hold 93 whole blocks of 32; without a prefix cache nothing is cached.
    assert (cached_prefix_tokens(cached, workload), cached_prefix_tokens(plain, workload)) == (2976, 0)
    # A prompt that is all prefix still computes its last token, so its last block (vLLM's get_computed_blocks).
    assert cached_prefix_tokens(cached, Workload(640, 10, prefix_tokens=640)) == 608
    # Only the uncached tokens are computed, each attending over the whole (padded) context.
    model, device = cached.model, cached.instance.device
    shape = (model, device, 2, 2)
    width = model.num_attention_heads * model.head_dim
    flops = 2 * model.parameter_count * 1120 + 2 * model.num_layers * 1120 * 4096 * width
    compute = flops / (2 * device.bf16_flops_per_core * CALIBRATION.prefill_compute_efficiency)
    assert prefill_s(*shape, tokens=4096, cached=2976, served=False) == pytest.approx(
        compute + 32 * 2 * 2 * CALIBRATION.allreduce_hop_s)
    with_cache, without = predict(cached, workload), predict(plain, workload)
    assert with_cache.ttft_s == pytest.approx(prefill_s(*shape, tokens=4096, cached=2976))
    assert 0.25 < with_cache.ttft_s / without.ttft_s < 0.3
    # Newcomers' shorter prefills leave more of the saturated replica to decoding.
    assert with_cache.tokens_per_second_instance > without.tokens_per_second_instance
    assert with_cache.itl_full_batch_s == without.itl_full_batch_s


def test_a_draft_whose_tokens_are_accepted_shortens_each_tokens_time_by_the_tokens_a_step_yields():
    from neuron_serving.plan.performance import Speculation, draft_step_s, speculation_of

    plan = plan_serving(replace(NXDI_8B, speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B", speculative_tokens=4))
    assert speculation_of(plan, DEFAULT_WORKLOAD) is None
    plain = predict(plan, DEFAULT_WORKLOAD)
    spec = speculation_of(plan, replace(DEFAULT_WORKLOAD, acceptance=0.5))
    assert spec is not None and spec.tokens == 4
    # k = 4: 3 candidates, (1 - 0.5**4) / (1 - 0.5) = 1.875 tokens a step (Leviathan et al., equation 1).
    assert spec.tokens_per_step == pytest.approx(1.875)
    assert Speculation(0.0, 2, 0.5).tokens_per_step == pytest.approx(1.5)
    d = draft_step_s(plan.draft, plan.instance.device, 2, 2, batch_size=4, sequence_length=4096)
    # A draft step reads its layer, LM head and fc (0.75 B parameters against the model's 8 B) and pays no server.
    assert spec.draft_step_s == d and 0.05 < d / plain.itl_batch1_s < 0.1
    drafted = predict(plan, replace(DEFAULT_WORKLOAD, acceptance=0.5))
    assert drafted.itl_batch1_s == pytest.approx((plain.itl_batch1_s + 4 * d) / 1.875)
    assert drafted.itl_full_batch_s == pytest.approx((plain.itl_full_batch_s + 4 * d) / 1.875)
    assert drafted.ttft_s == plain.ttft_s
    # A draft rarely right costs more than it saves.
    assert predict(plan, replace(DEFAULT_WORKLOAD, acceptance=0.05)).itl_batch1_s > plain.itl_batch1_s


def test_under_load_a_cached_prefix_and_an_accepted_draft_count_as_they_do_for_a_request_alone():
    from neuron_serving.plan.performance import replica_costs, speculation_of, step_costs

    cached = plan_serving(replace(NXDI_8B, prefix_cache_block_size=32))
    drafted = plan_serving(replace(NXDI_8B, speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B",
                                   speculative_tokens=4))
    workload = Workload(3072, 256, prefix_tokens=3000, acceptance=0.6)
    # A replica's costs: the prefill of what the cache leaves; each step the mean time of a token.
    assert replica_costs(cached, workload=workload).prefill_s == pytest.approx(predict(cached, workload).ttft_s)
    spec = speculation_of(drafted, workload)
    assert spec is not None
    steps = step_costs(drafted.model, drafted.instance.device, 2, 2, batch_size=drafted.batch_size,
                       sequence_length=drafted.sequence_length)
    costs = replica_costs(drafted, workload=workload)
    for busy in (1, drafted.batch_size):
        assert costs.step(busy) == pytest.approx(spec.per_token(steps.step(busy)))
    assert replica_costs(drafted, workload=replace(workload, acceptance=None)) == replica_costs(drafted)

    # At 0.01 requests a second over 6 replicas no two requests meet: each is a request alone.
    for plan in (cached, drafted):
        alone = predict(plan, workload)
        load = predict_load(plan, workload, 0.01)
        assert load.ttft_p50_s == pytest.approx(alone.ttft_s)
        assert load.itl_p99_s == pytest.approx(alone.itl_batch1_s)
        plain = predict_load(plan, replace(workload, prefix_tokens=0, acceptance=None), 0.01)
        assert load.utilisation < plain.utilisation
    assert predict_load(cached, workload, 0.01).ttft_p50_s < 0.3 * predict_load(
        cached, replace(workload, prefix_tokens=0), 0.01).ttft_p50_s
    assert predict_load(drafted, workload, 0.01).itl_p99_s < 0.75 * predict_load(
        drafted, replace(workload, acceptance=None), 0.01).itl_p99_s


def test_a_trace_s_load_prediction_keeps_the_workload_s_prefix_and_acceptance():
    plan = plan_serving(replace(NXDI_8B, prefix_cache_block_size=32))
    trace = [Call(i * 10.0, 3000 if i % 2 else 1000, 100) for i in range(50)]
    load = predict_load(plan, Workload(3000, 100, prefix_tokens=960), 0.1, trace=trace)
    # The mean request has 2000 prompt tokens, of which the 960-token prefix is cached.
    mean = predict(plan, Workload(2000, 100, prefix_tokens=960))
    assert load.utilisation == pytest.approx(0.1 / mean.requests_per_second_instance)
    assert load.ttft_p50_s == pytest.approx(mean.ttft_s)


@pytest.mark.parametrize(("workload", "said"), [
    (dict(prefix_tokens=600), r"^prefix_tokens \(600\) must be at most input_tokens \(512\): the prefix is part "),
    (dict(prefix_tokens=-1), r"^prefix_tokens \(-1\) must be an integer of at least 0$"),
    (dict(acceptance=1.0), r"^acceptance \(1.0\) must be a number between 0 and 1 \(exclusive\)$"),
])
def test_a_prefix_longer_than_the_prompt_or_an_acceptance_outside_0_to_1_is_refused(workload, said):
    with pytest.raises(ServingConfigError, match=said):
        Workload(512, 256, **workload)
