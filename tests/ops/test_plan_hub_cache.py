"""``neuron-serving plan`` reads optimum-neuron's Hub cache registry through huggingface_hub, here
from the fake Hub on loopback (tests/harness/fake_hub.py), and says per layout whether it is
cached; offline or unreachable, it says why and plans as without it."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.fake_hub import CLIENT_ENV_REMOVE, FakeHub, HubRepo

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = ROOT / "tests" / "plan" / "data" / "hub_cache"
TGI_CC = "neuronxcc-2.19.8089.0+8ab9f450"
VLLM_CC = "neuronxcc-2.21.33363.0+82129205"
LLAMA = "llama/meta-llama/Meta-Llama-3.1-8B-Instruct"
PLAN = ["plan", "--model", "meta-llama/Meta-Llama-3.1-8B-Instruct", "--instance-type", "inf2.48xlarge"]
SHAPES = ["--batch-size", "32", "--sequence-length", "1024"]


def _file(version: str, name: str) -> tuple[str, bytes]:
    """An entry's file name (``ModelCacheEntry.hash``: sha512 of the serialized entry, 20 hex digits) and content."""
    text = (ENTRIES / f"{version}-{name}.json").read_text()
    return hashlib.sha512(text.rstrip("\n").encode()).hexdigest()[:20] + ".json", text.encode()


def _registry() -> dict[str, bytes]:
    files: dict[str, bytes] = {"README.md": b"# optimum-neuron cache\n"}

    def put(folder: str, version: str, name: str, model: str = LLAMA, written_by: str | None = None) -> None:
        file, content = _file(written_by or version, name)
        files[f"{folder}/0_REGISTRY/{version}/{model}/{file}"] = content

    # TGI 3.3.5: optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0.
    for name in ("llama-8b-tp2-b4-s4096", "llama-8b-tp8-b32-s1024", "llama-8b-tp2-b48-s1024-trn2"):
        put(TGI_CC, "0.3.0", name)
    put(TGI_CC, "0.3.0", "other-model-tp2-b48-s1024", "llama/unsloth/Llama-3.1-8B")
    put(TGI_CC, "0.2.0", "llama-8b-tp2-b48-s1024", written_by="0.3.0")  # another optimum-neuron version
    put(VLLM_CC, "0.3.0", "llama-8b-tp2-b48-s1024")  # another compiler
    # vLLM: optimum-neuron 0.4.5 and neuronx-cc 2.21.33363.0, each entry also under its architecture's digest.
    for name in ("llama-8b-tp2-b48-s1024", "llama-8b-tp8-b32-s1024"):
        put(VLLM_CC, "0.4.5", name)
        file, content = _file("0.4.5", name)
        files[f"{VLLM_CC}/0_REGISTRY/0.4.5/{hashlib.sha256(b'arch').hexdigest()}/{file}"] = content
    put(TGI_CC, "0.4.5", "llama-8b-tp2-b4-s4096")  # another compiler, for vLLM
    return files


@pytest.fixture
def hub():
    repo = HubRepo("aws-neuron/optimum-neuron-cache")
    repo.commit(_registry())
    with FakeHub([repo]) as running:
        yield running


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_REMOVE and k != "CUSTOM_CACHE_REPO"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "constructs"), str(ROOT)]), **extra)
    return env


def _plan(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; from neuron_serving.cli import main; sys.exit(main({[*PLAN, *arguments]!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def _json(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_plan_lists_the_cached_layouts_of_the_images_versions_only(hub, tmp_path):
    document = _json(_plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), *SHAPES, "--output", "json"))
    cache = document["hub_cache"]
    assert (cache["read"], cache["repo"], cache["optimum_neuron"], cache["neuronx_cc"]) == (
        True, "aws-neuron/optimum-neuron-cache", "0.3.0", "2.19.8089.0+8ab9f450")
    # Its own model's three entries; not the other model's, nor those of another version or compiler.
    assert sorted((e["degree"], e["batch_size"], e["sequence_length"], e["target"]) for e in cache["layouts"]) == [
        (2, 4, 4096, None), (2, 48, 1024, "trn2"), (8, 32, 1024, None)]
    # The table's batch 32, sequence 1024: degree 8 only (the trn2 entry serves no inf2).
    assert [d["degree"] for d in document["degrees"] if d["cached"]] == [8]
    assert all(d["cached"] is False for d in document["degrees"] if d["degree"] != 8)
    assert document["recommendation"]["cached"] is False


def test_the_text_has_a_cached_column_and_says_what_the_cache_holds(hub, tmp_path):
    result = _plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), *SHAPES)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = {int(line.split()[0]): line.split() for line in lines if line.split()[0].isdigit()}
    assert lines[2].split()[-1] == "cached"
    assert {degree: row[-1] for degree, row in rows.items()} == {d: "yes" if d == 8 else "no" for d in rows}
    assert ("hub cache: aws-neuron/optimum-neuron-cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0 holds 3 "
            "layouts of the model: degree 2, batch 4, sequence 4096, bfloat16; degree 2, batch 48, sequence 1024, "
            "bfloat16; degree 8, batch 32, sequence 1024, bfloat16") in lines


def test_the_latency_objective_prefers_the_cached_layout_within_the_margin(hub, tmp_path):
    env = _env(tmp_path, HF_ENDPOINT=hub.endpoint)
    document = _json(_plan(env, *SHAPES, "--objective", "latency", "--output", "json"))
    chosen = document["recommendation"]
    assert (chosen["degree"], chosen["cached"]) == (8, True)
    assert chosen["reason"].startswith("in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0, and ")
    assert "behind the best layout for the latency objective" in chosen["reason"]
    offline = _json(_plan({**env, "HF_HUB_OFFLINE": "1"}, *SHAPES, "--objective", "latency", "--output", "json"))
    assert offline["recommendation"]["degree"] != 8
    assert f"at degree {offline['recommendation']['degree']}, batch 32, sequence 1024, which is not cached" in (
        chosen["reason"])


def test_the_throughput_objective_keeps_the_best_when_the_cached_layout_is_beyond_the_margin(hub, tmp_path):
    document = _json(_plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), *SHAPES, "--objective", "throughput",
                           "--output", "json"))
    chosen = document["recommendation"]
    assert (chosen["degree"], chosen["cached"]) == (2, False)
    assert "The best layout in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0, degree 8" in (
        chosen["reason"])
    assert "beyond the 10% margin" in chosen["reason"]


def test_the_vllm_engine_looks_up_its_own_versions_and_ignores_the_digest_copies(hub, tmp_path):
    document = _json(_plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), "--engine", "vllm", "--objective", "throughput",
                           "--output", "json"))
    cache = document["hub_cache"]
    assert (cache["optimum_neuron"], cache["neuronx_cc"]) == ("0.4.5", "2.21.33363.0+82129205")
    assert sorted((e["degree"], e["batch_size"], e["target"]) for e in cache["layouts"]) == [
        (2, 48, "trn1"), (8, 32, "trn1")]
    chosen = document["recommendation"]
    assert (chosen["degree"], chosen["batch_size"], chosen["sequence_length"], chosen["cached"]) == (2, 48, 1024, True)
    assert chosen["reason"].endswith(" It is in the public cache for optimum-neuron 0.4.5 and neuronx-cc 2.21.33363.0.")


def test_the_nxdi_engine_whose_compiles_have_no_hub_cache_does_not_ask_the_hub(hub, tmp_path):
    document = _json(_plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), "--engine", "nxdi", "--output", "json"))
    assert document["hub_cache"] is None
    assert {d["cached"] for d in document["degrees"]} == {None}
    assert hub.requests == []


def test_custom_cache_repo_names_the_cache_read(hub, tmp_path):
    hub.add(HubRepo("me/cache")).commit({"README.md": b"empty\n"})
    document = _json(_plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint, CUSTOM_CACHE_REPO="me/cache"), "--output", "json"))
    assert (document["hub_cache"]["repo"], document["hub_cache"]["layouts"]) == ("me/cache", [])
    assert {d["cached"] for d in document["degrees"]} == {False}


def test_offline_plan_says_the_cache_could_not_be_read_and_plans_as_without_it(hub, tmp_path):
    env = _env(tmp_path, HF_ENDPOINT=hub.endpoint, HF_HUB_OFFLINE="1")
    result = _plan(env, *SHAPES, "--objective", "latency")
    assert result.returncode == 0, result.stderr
    assert "hub cache: could not be read (offline mode is on: HF_HUB_OFFLINE); planned without it (cached: -)" in (
        result.stdout.splitlines())
    assert hub.requests == []
    without = _plan(_env(tmp_path, HF_ENDPOINT=hub.endpoint), *SHAPES, "--objective", "latency", "--no-hub-cache")
    assert without.stdout.splitlines()[-2] == result.stdout.splitlines()[-2]
    assert "hub cache" not in without.stdout and hub.requests == []


def test_an_unreachable_hub_is_one_line_and_the_plan_goes_on(tmp_path):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"  # bound, never listening: refused
        document = _json(_plan(_env(tmp_path, HF_ENDPOINT=endpoint), "--objective", "cost", "--output", "json"))
    assert document["hub_cache"] == {"read": False, "why": f"cannot reach {endpoint}: ConnectionError"}
    assert document["recommendation"]["cached"] is None
    assert "public cache" not in document["recommendation"]["reason"]


def test_a_hub_that_never_answers_times_out(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from neuron_serving.ops.hub_cache import CacheUnreadable, read_hub_cache
    from neuron_serving.plan.engines.tgi import TGI_3_3_5

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake; nobody ever reads or answers
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        started = time.monotonic()
        with pytest.raises(CacheUnreadable, match=rf"^{endpoint} did not answer within 0.5 s$"):
            read_hub_cache(TGI_3_3_5, "llama", ["meta-llama/Meta-Llama-3.1-8B-Instruct"], timeout=0.5)
    assert time.monotonic() - started < 5
