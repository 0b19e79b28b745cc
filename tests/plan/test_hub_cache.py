"""Which layouts optimum-neuron's Hub cache holds, from its registry's files as plain values, and how
the objectives prefer a cached layout close to the best."""

from dataclasses import replace
from pathlib import Path

import pytest

from neuron_serving.plan.engines.tgi import TGI_3_3_5
from neuron_serving.plan.engines.vllm import OPTIMUM_NEURON_VLLM_0_4_5
from neuron_serving.plan.host import PUBLIC_HUB_CACHE
from neuron_serving.plan.hub_cache import (
    CachedLayout,
    HubCache,
    compiler_folder,
    entry_paths,
    parse_entry,
    registry_path,
)
from neuron_serving.plan.layout import ServingRequest
from neuron_serving.plan.performance import CACHED_MARGIN, Goodput, LayoutSpace, candidates, recommend

ENTRIES = Path(__file__).parent / "data" / "hub_cache"
LLAMA_8B = "meta-llama/Meta-Llama-3.1-8B-Instruct"
REQUEST = ServingRequest(LLAMA_8B, "inf2.48xlarge", batch_size=32, sequence_length=1024)
FIXED = LayoutSpace.fixed(REQUEST)


def _entry(name: str) -> str:
    return (ENTRIES / name).read_text()


def _cache(*layouts: CachedLayout) -> HubCache:
    return HubCache.of(TGI_3_3_5, PUBLIC_HUB_CACHE, layouts)


def _layout(degree: int, batch: int = 32, sequence: int = 1024, target: str | None = None) -> CachedLayout:
    return CachedLayout(LLAMA_8B, batch, sequence, degree, "bfloat16", target)


@pytest.mark.parametrize(("version", "target"), [("0.3.0", None), ("0.4.5", "trn1")])
def test_an_entry_written_by_optimum_neuron_gives_its_layout(version, target):
    assert parse_entry(_entry(f"{version}-llama-8b-tp2-b4-s4096.json")) == CachedLayout(
        LLAMA_8B, batch_size=4, sequence_length=4096, tp_degree=2, torch_dtype="bfloat16", target=target)


@pytest.mark.parametrize("version", ["0.3.0", "0.4.5"])
def test_entries_of_both_versions_serve_inf2_and_trn1_but_not_trn2(version):
    plan = next(p for p, _ in candidates(replace(REQUEST, batch_size=48), space=LayoutSpace((48,), (1024,)))
                if p.degree == 2)
    assert _cache(parse_entry(_entry(f"{version}-llama-8b-tp2-b48-s1024.json"))).holds(plan)
    assert not _cache(parse_entry(_entry(f"{version}-llama-8b-tp2-b48-s1024-trn2.json"))).holds(plan)


@pytest.mark.parametrize("text", [
    "not json",
    '{"_entry_class": "MultiModelCacheEntry", "_model_id": "m/m", "_task": "text-to-image", "neuron": {}}',
    '{"_entry_class": "SingleModelCacheEntry", "_model_id": "m/m", "_task": "feature-extraction", '
    '"neuron": {"batch_size": 1, "sequence_length": 128, "tp_degree": 1, "torch_dtype": "bfloat16"}}',
    '{"_entry_class": "SingleModelCacheEntry", "_model_id": "m/m", "_task": "text-generation", '
    '"neuron": {"batch_size": "4", "sequence_length": 128, "tp_degree": 1, "torch_dtype": "bfloat16"}}',
])
def test_an_entry_of_another_kind_or_format_gives_no_layout(text):
    assert parse_entry(text) is None


def test_the_compiler_folder_is_found_by_its_whole_release_whatever_its_label():
    names = ["0_REGISTRY", "neuronxcc-2.19.8089.01+aaaaaaaa", "neuronxcc-2.21.33363.0+82129205",
             "neuronxcc-2.19.8089.0+0badbeef"]
    assert compiler_folder(names, TGI_3_3_5.neuronx_cc) == "neuronxcc-2.19.8089.0+0badbeef"
    assert compiler_folder(names, OPTIMUM_NEURON_VLLM_0_4_5.neuronx_cc) == "neuronxcc-2.21.33363.0+82129205"
    assert compiler_folder(names, "2.20.1.0+1") is None


def test_entry_paths_are_the_models_own_of_the_registry_of_one_optimum_neuron_version():
    registry = registry_path("neuronxcc-2.21.33363.0+82129205", "0.4.5")
    assert registry == "neuronxcc-2.21.33363.0+82129205/0_REGISTRY/0.4.5"
    mine = f"{registry}/llama/meta-llama/Meta-Llama-3.1-8B-Instruct/0123456789abcdef0123.json"
    paths = [
        mine,
        f"{registry}/3a190b454d043b6f076635603e46035a7dc84a914df743d96f14605e31900a17/0123456789abcdef0123.json",
        f"{registry}/llama/unsloth/Llama-3.1-8B/aaaa.json",
        f"{registry}/qwen2/meta-llama/Meta-Llama-3.1-8B-Instruct/bbbb.json",
        "neuronxcc-2.21.33363.0+82129205/0_REGISTRY/0.4.4/llama/meta-llama/Meta-Llama-3.1-8B-Instruct/cccc.json",
        f"{registry}/llama/meta-llama/Meta-Llama-3.1-8B-Instruct/README.md",
    ]
    assert entry_paths(paths, registry, "llama", ["META-LLAMA/meta-llama-3.1-8b-instruct"]) == [mine]


def test_the_cache_describes_itself_by_the_versions_the_registry_names():
    assert _cache().describe() == "in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0"
    assert HubCache.of(OPTIMUM_NEURON_VLLM_0_4_5, "me/cache", ()).describe() == (
        "in the cache me/cache for optimum-neuron 0.4.5 and neuronx-cc 2.21.33363.0")


def test_a_cached_layout_within_the_margin_of_the_best_is_recommended_saying_why():
    best = recommend(REQUEST, "latency", space=FIXED)
    itl = {p.degree: x.itl_full_batch_s for p, x in best.candidates}
    near = next(d for d in sorted(itl) if 0 < itl[d] / best.prediction.itl_full_batch_s - 1 <= CACHED_MARGIN)
    chosen = recommend(REQUEST, "latency", space=FIXED, cached=_cache(_layout(near)))
    assert chosen.plan.degree == near != best.plan.degree
    behind = itl[near] / best.prediction.itl_full_batch_s - 1
    assert chosen.reason.startswith(
        f"in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0, and {behind:.1%} behind the best "
        f"layout for the latency objective: {itl[near] * 1e3:.1f} ms inter-token latency at full batch against "
        f"{best.prediction.itl_full_batch_s * 1e3:.1f} ms inter-token latency at full batch at degree "
        f"{best.plan.degree}, batch 32, sequence 1024, which is not cached")


def test_a_cached_layout_beyond_the_margin_is_not_recommended_and_the_reason_says_how_far():
    best = recommend(REQUEST, "throughput", space=FIXED)
    tokens = {p.degree: x.tokens_per_second_instance for p, x in best.candidates}
    assert 1 - tokens[8] / tokens[best.plan.degree] > CACHED_MARGIN
    chosen = recommend(REQUEST, "throughput", space=FIXED, cached=_cache(_layout(8)))
    assert chosen.plan == best.plan
    assert chosen.reason.startswith(best.reason)
    assert chosen.reason.endswith(
        f" The best layout in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0, degree 8, batch "
        f"32, sequence 1024, is {1 - tokens[8] / tokens[best.plan.degree]:.1%} behind ({tokens[8]:.0f} tokens/s), "
        "beyond the 10% margin within which a cached layout is preferred.")


def test_a_best_layout_that_is_cached_is_recommended_saying_it_is_cached():
    best = recommend(REQUEST, "cost", space=FIXED)
    chosen = recommend(REQUEST, "cost", space=FIXED, cached=_cache(_layout(best.plan.degree), _layout(8)))
    assert chosen.plan == best.plan
    assert chosen.reason == best.reason + (" It is in the public cache for optimum-neuron 0.3.0 and neuronx-cc "
                                           "2.19.8089.0.")


def test_without_any_cached_layout_the_recommendation_is_todays_and_says_so():
    best = recommend(REQUEST, "throughput", space=FIXED)
    chosen = recommend(REQUEST, "throughput", space=FIXED, cached=_cache(_layout(2, target="trn2")))
    assert chosen.plan == best.plan
    assert chosen.reason == best.reason + (" No layout that fits is in the public cache for optimum-neuron 0.3.0 "
                                           "and neuronx-cc 2.19.8089.0.")


def test_goodput_prefers_the_cheapest_fleet_of_a_cached_layout_within_the_margin_of_its_price():
    goodput = Goodput(rate=2.0)
    best = recommend(REQUEST, "goodput", space=FIXED, goodput=goodput)
    assert best.load is not None
    preferred = []
    for degree in (4, 24):
        chosen = recommend(REQUEST, "goodput", space=FIXED, goodput=goodput, cached=_cache(_layout(degree)))
        assert chosen.load is not None
        more = chosen.load.usd_per_hour / best.load.usd_per_hour - 1
        if chosen.plan.degree == degree:
            assert more <= CACHED_MARGIN
            preferred.append(degree)
            assert chosen.reason.startswith("in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0, "
                                            "and the cheapest such fleet that serves 2 requests/s")
        else:
            assert chosen.plan == best.plan and "beyond the 10% margin" in chosen.reason
    assert preferred
