"""The export's compiled graphs and optimum-neuron's Hub compile cache, through the real code of optimum-neuron 0.3.0
(TGI image) and 0.4.5 (vLLM image): the runners' ``--compile-cache`` mode (tests/harness/optimum_neuron.py,
optimum_neuron_045.py) runs the real export, ``hub_neuronx_cache``, ``CompileCacheHfProxy`` and huggingface-hub's
HfApi against a Hub on loopback (tests/harness/fake_hub.py), over the imitated compile path of
tests/harness/neuron_compile.py (libneuronxla is not public), which records each lookup, fetch and compiler run.

Each scenario is one runner invocation per version (module-scoped fixtures), asserted on by several tests. The cache
entries are made as a real cache repo is (``optimum-cli neuron cache synchronize`` uploads the local compile cache,
optimum/neuron/cache/hub_cache.py ``synchronize_hub_cache``): the seed scenario compiles into its local cache, whose
``neuronxcc-*/MODULE_*`` folders the other scenarios' repos and S3 cache hold.

The export argv is the engines' (neuron_serving.plan.engines, ``export_arguments``) without ``-e HF_HUB_OFFLINE=1``:
the Hub reached through ``HF_ENDPOINT``, the token through ``HF_TOKEN`` (what ``--env-file`` gives the container).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fake_hub import CLIENT_ENV_REMOVE, FakeHub, HubRepo, HubRequest
from tests.harness.test_optimum_neuron import TINY_LLAMA

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "harness"
PUBLIC = "aws-neuron/optimum-neuron-cache"  # optimum/neuron/utils/cache_utils.py HF_HUB_CACHE_REPOS (v0.3.0, v0.4.5)
PRIVATE = "org/private"
TOKEN = "hf_cachetest"
S3_CACHE = "s3://neuron-cache/compile"


@dataclass(frozen=True)
class Version:
    python: Path
    runner: Path
    devices: tuple[str, ...]
    cores_flag: str


VERSIONS = {
    # The TGI image's optimum-neuron (the engine passes --num_cores) and the vLLM image's (--tensor_parallel_size).
    "0.3.0": Version(ROOT / ".tools" / "optimum-neuron-0.3.0" / "bin" / "python", HARNESS / "optimum_neuron.py",
                     ("--neuron-devices", "1"), "--num_cores"),
    "0.4.5": Version(ROOT / ".tools" / "optimum-neuron-0.4.5" / "bin" / "python", HARNESS / "optimum_neuron_045.py",
                     ("--devices", "1"), "--tensor_parallel_size"),
}


@dataclass(frozen=True)
class Scenario:
    result: dict[str, Any]
    requests: list[HubRequest]
    local_cache: Path

    @property
    def cache(self) -> dict[str, Any]:
        record: dict[str, Any] = self.result["compile_cache"]
        return record

    def graph(self, part: str) -> str:
        """The name of the graph whose model key contains ``part`` (0.3.0 ``context_encoding_model``, 0.4.5
        ``context_encoding``)."""
        (name,) = {lookup["graph"] for lookup in self.cache["lookups"] if part in lookup["graph"]}
        return name

    def path(self, graph: str) -> str:
        """The NEFF's path in the cache (relative to its root), as looked up."""
        (path,) = {lookup["path"] for lookup in self.cache["lookups"] if lookup["graph"] == graph}
        return path

    def compiled(self) -> list[str]:
        return [c["graph"] for c in self.cache["compilations"]]


def tools(name: str) -> Version:
    version = VERSIONS[name]
    if not version.python.is_file():
        message = f"{version.python} is missing: scripts/test makes it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return version


def export(name: str, tmp: Path, env: dict[str, str], s3_root: Path | None = None,
           s3_denies_misses: bool = False) -> Scenario:
    """One export of the tiny llama, as the engine issues it (degree 2, batch 4, sequence 4096), in the runner's
    --compile-cache mode; ``env`` is the container's environment."""
    version = tools(name)
    src = tmp / "KEY.src"
    src.mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(TINY_LLAMA))
    argv = ["optimum-cli", "export", "neuron", "--model", str(src), "--task", "text-generation",
            "--batch_size", "4", "--sequence_length", "4096", version.cores_flag, "2",
            *(["--auto_cast_type", "bf16"] if name == "0.3.0" else []), str(tmp / "KEY.tmp")]
    local = tmp / "var-tmp-neuron-compile-cache"
    cmd = [str(version.python), str(version.runner), *version.devices, "--compile-cache", "--local-cache", str(local),
           "--scratch", str(tmp / "scratch"), *(["--s3-root", str(s3_root)] if s3_root else []),
           *(["--s3-denies-misses"] if s3_denies_misses else []),
           "--json", json.dumps(argv)]
    clean = {k: v for k, v in os.environ.items()
             if k not in CLIENT_ENV_REMOVE and not k.startswith(("HF_", "HUGGING", "NEURON_", "VLLM_"))
             and k not in ("CUSTOM_CACHE_REPO", "BASE_COMPILE_WORK_DIR")}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600,
                          env={**clean, "HOME": str(tmp), "HF_HOME": str(tmp / "hf-home"), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return Scenario(json.loads(done.stdout), [], local)


def run_against(hub: FakeHub, name: str, tmp: Path, *, token: str | None = None, s3_root: Path | None = None,
                s3_denies_misses: bool = False, **env: str) -> Scenario:
    scenario = export(name, tmp, {**hub.client_env(tmp / "hf-home", token=token), **env}, s3_root,
                      s3_denies_misses)
    return Scenario(scenario.result, hub.requests, scenario.local_cache)


def module_files(scenario: Scenario, graph: str) -> dict[str, bytes]:
    """The cache folder of ``graph`` in ``scenario``'s local cache, as repo path -> content."""
    folder = (scenario.local_cache / scenario.path(graph)).parent
    return {str(p.relative_to(scenario.local_cache)): p.read_bytes() for p in folder.iterdir()}


def hub_cache_repo(repo_id: str, *files: dict[str, bytes], private: bool = False) -> HubRepo:
    repo = HubRepo(repo_id, private=private)
    repo.commit({"README.md": b"optimum-neuron compile cache\n", **{k: v for f in files for k, v in f.items()}})
    return repo


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def version(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    tools(name)
    return name


@pytest.fixture(scope="module")
def seed(version: str, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The public cache repo holds nothing for this model: every graph is compiled into the local cache."""
    with FakeHub([hub_cache_repo(PUBLIC)]) as hub:
        scenario = run_against(hub, version, tmp_path_factory.mktemp(f"seed-{version}"))
    assert scenario.result["exit_code"] == 0, scenario.result.get("stderr", scenario.result.get("error"))
    return scenario


@pytest.fixture(scope="module")
def cached(version: str, seed: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """The public cache repo holds the context-encoding graph only."""
    repo = hub_cache_repo(PUBLIC, module_files(seed, seed.graph("context_encoding")))
    with FakeHub([repo]) as hub:
        scenario = run_against(hub, version, tmp_path_factory.mktemp(f"cached-{version}"))
    assert scenario.result["exit_code"] == 0, scenario.result.get("stderr", scenario.result.get("error"))
    return scenario


@pytest.fixture(scope="module")
def private_s3(version: str, seed: Scenario, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """CUSTOM_CACHE_REPO names a private repo holding the context-encoding graph, the S3 compile cache holds the
    token-generation graph, and the public repo holds both (it must not be asked)."""
    tmp = tmp_path_factory.mktemp(f"private-s3-{version}")
    s3_root = tmp / "s3"
    for path, content in module_files(seed, seed.graph("token_generation")).items():
        target = s3_root / S3_CACHE.removeprefix("s3://") / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    every = [module_files(seed, seed.graph(part)) for part in ("context_encoding", "token_generation")]
    repos = [hub_cache_repo(PRIVATE, every[0], private=True), hub_cache_repo(PUBLIC, *every)]
    with FakeHub(repos, tokens={TOKEN}) as hub:
        scenario = run_against(hub, version, tmp, token=TOKEN, s3_root=s3_root, CUSTOM_CACHE_REPO=PRIVATE,
                               NEURON_COMPILE_CACHE_URL=S3_CACHE)
    assert scenario.result["exit_code"] == 0, scenario.result.get("stderr", scenario.result.get("error"))
    return scenario


def repo_requests(scenario: Scenario, repo_id: str) -> list[HubRequest]:
    return [r for r in scenario.requests if r.path.startswith((f"/api/models/{repo_id}", f"/{repo_id}/"))]


def looked_up_on_the_hub(scenario: Scenario, repo_id: str, path: str) -> list[int]:
    """The statuses of the HEAD requests for ``path`` at ``main``: `HfApi.file_exists`'s (huggingface_hub hf_api.py
    ``file_exists``: ``get_hf_file_metadata``), then, when it is there, ``hf_hub_download``'s own (file_download.py
    ``_get_metadata_or_catch_error``)."""
    return [r.status for r in scenario.requests if r.method == "HEAD" and r.path == f"/{repo_id}/resolve/main/{path}"]


def downloaded_from_the_hub(scenario: Scenario, repo_id: str) -> list[str]:
    """The repo paths whose content ``repo_id`` sent (a GET of ``/resolve/<commit sha>/<path>`` answered 200)."""
    prefix = f"/{repo_id}/resolve/"
    return [r.path[len(prefix):].partition("/")[2] for r in scenario.requests
            if r.method == "GET" and r.status == 200 and r.path.startswith(prefix)]


def test_with_an_empty_hub_cache_every_graph_is_looked_up_in_the_cache_repo_then_compiled(seed: Scenario) -> None:
    graphs = sorted({lookup["graph"] for lookup in seed.cache["lookups"]})
    assert len(graphs) == 2  # context encoding and token generation, one bucket each
    assert [lookup["cache"] for lookup in seed.cache["lookups"]] == ["CompileCacheHfProxy"] * 2
    # The proxy checks the repository exists (HfApi.repo_exists: GET /api/models/<repo>), then each NEFF.
    assert ("GET", f"/api/models/{PUBLIC}", 200) in [(r.method, r.path, r.status) for r in seed.requests]
    for graph in graphs:
        assert looked_up_on_the_hub(seed, PUBLIC, seed.path(graph)) == [404]
        assert f"{seed.path(graph)} not found in {PUBLIC}: the corresponding graph will be recompiled." in " ".join(
            seed.cache["log"])
    assert sorted(seed.compiled()) == graphs
    assert [r for r in seed.requests if r.method == "GET" and "/resolve/" in r.path] == []


def test_a_graph_in_the_hub_cache_is_fetched_and_not_compiled(seed: Scenario, cached: Scenario) -> None:
    graph = cached.graph("context_encoding")
    path = cached.path(graph)
    assert path == seed.path(seed.graph("context_encoding"))  # the same graph, the same key, in another export
    assert [lk["found"] for lk in cached.cache["lookups"] if lk["graph"] == graph] == ["hub"]
    assert looked_up_on_the_hub(cached, PUBLIC, path) == [200, 200]
    assert downloaded_from_the_hub(cached, PUBLIC) == [path]
    [fetch] = [f for f in cached.cache["fetches"] if f["graph"] == graph]
    neff = (seed.local_cache / path).read_bytes()
    assert fetch == {"graph": graph, "path": path, "from": "hub", "sha256": hashlib.sha256(neff).hexdigest()}
    assert f"Fetched cached {path} from {PUBLIC}" in " ".join(cached.cache["log"])
    assert graph not in cached.compiled()


def test_a_graph_missing_from_the_hub_cache_is_compiled_and_only_that_one(cached: Scenario) -> None:
    graph = cached.graph("token_generation")
    assert [lk["found"] for lk in cached.cache["lookups"] if lk["graph"] == graph] == [None]
    assert cached.compiled() == [graph]
    # Into the default (local) cache only: the Hub cache is filled by `optimum-cli neuron cache synchronize`.
    assert {u["to"] for u in cached.cache["uploads"]} == {str(cached.local_cache)}
    assert [r for r in cached.requests if r.method not in ("GET", "HEAD")] == []


def test_a_custom_cache_repo_is_consulted_with_the_token_and_the_public_one_never(private_s3: Scenario) -> None:
    asked = repo_requests(private_s3, PRIVATE)
    assert ("GET", f"/api/models/{PRIVATE}", 200) in [(r.method, r.path, r.status) for r in asked]
    assert {r.token for r in asked} == {TOKEN}
    graph = private_s3.graph("context_encoding")
    assert looked_up_on_the_hub(private_s3, PRIVATE, private_s3.path(graph)) == [200, 200]
    assert downloaded_from_the_hub(private_s3, PRIVATE) == [private_s3.path(graph)]
    assert f"Fetched cached {private_s3.path(graph)} from {PRIVATE}" in " ".join(private_s3.cache["log"])
    assert repo_requests(private_s3, PUBLIC) == []


def test_an_s3_compile_cache_is_consulted_before_the_hub_and_its_graph_is_not_fetched_from_the_hub(
    private_s3: Scenario,
) -> None:
    cache = private_s3.cache
    assert {lk["default_cache"] for lk in cache["lookups"]} == {S3_CACHE}
    for graph in {lk["graph"] for lk in cache["lookups"]}:
        first = next(e for e in cache["events"] if e["graph"] == graph)
        neff = f"{S3_CACHE}/{private_s3.path(graph)}"
        assert (first["cache"], first["op"], first["target"]) == ("s3", "exists", neff)
    in_s3 = private_s3.graph("token_generation")
    assert [lk["found"] for lk in cache["lookups"] if lk["graph"] == in_s3] == ["default cache"]
    assert sorted((f["graph"], f["from"]) for f in cache["fetches"]) == sorted(
        [(private_s3.graph("context_encoding"), "hub"), (in_s3, "default cache")])
    # CompileCacheHfProxy.download_file asks the default cache again before downloading from it.
    s3_neff = f"{S3_CACHE}/{private_s3.path(in_s3)}"
    assert [(e["op"], e["target"], e.get("result")) for e in cache["events"] if e["graph"] == in_s3] == [
        ("exists", s3_neff, True), ("exists", s3_neff, True), ("download_file", s3_neff, None)]
    assert [r for r in private_s3.requests if private_s3.path(in_s3) in r.path] == []
    assert private_s3.compiled() == []


def test_an_error_from_the_s3_compile_caches_lookup_ends_the_export_before_any_graph_compiles(
    version: str, tmp_path: Path,
) -> None:
    # Neither optimum-neuron catches an error from its default cache's lookup (v0.3.0 and v0.4.5
    # optimum/neuron/cache/hub_cache.py CompileCacheHfProxy.exists, v0.3.0 backend/cache.py generate_neff_with_cache),
    # so if libneuronxla's S3 client lets a 403 through, the export ends: why the host may list the bucket, which
    # makes a miss a 404 (tests/cdk/test_compile_cache.py).
    with FakeHub([hub_cache_repo(PUBLIC)]) as hub:
        scenario = run_against(hub, version, tmp_path, s3_root=tmp_path / "s3", s3_denies_misses=True,
                               NEURON_COMPILE_CACHE_URL=S3_CACHE)
    assert scenario.result["exit_code"] != 0
    # The runners report the export's exception: 0.3.0's as optimum-cli's subprocess printed it, 0.4.5's in-process.
    assert scenario.result["exporter_error" if version == "0.3.0" else "error"] == (
        "neuron_compile.S3AccessDenied: An error occurred (403) when calling the HeadObject operation: Forbidden")
    (lookup,) = [e for e in scenario.cache["events"] if e["op"] == "exists"]
    assert (lookup["cache"], lookup["target"].startswith(f"{S3_CACHE}/"), lookup["result"]) == ("s3", True, 403)
    assert scenario.compiled() == []


def offline(name: str, tmp: Path) -> Scenario:
    """Today's export: `-e HF_HUB_OFFLINE=1`, no token; a hub on HF_ENDPOINT that would record any request."""
    with FakeHub([hub_cache_repo(PUBLIC)]) as hub:
        return run_against(hub, name, tmp, HF_HUB_OFFLINE="1")


def test_offline_optimum_neuron_030_fails_the_export_at_its_first_graph(tmp_path: Path) -> None:
    # optimum-neuron 0.3.0 compiles inside neff_cache (optimum/neuron/models/inference/backend/cache.py), which
    # creates the Hub proxy itself, with no fallback: the proxy's repo_exists raises OfflineModeIsEnabled, and the
    # export ends before any graph is compiled. (hub_neuronx_cache's "Bypassing Hub cache" fallback wraps only
    # libneuronxla's create_compile_cache, which NxD 0.13 does not call.)
    scenario = offline("0.3.0", tmp_path)
    assert scenario.result["exit_code"] != 0
    error = scenario.result["exporter_error"]
    assert error.startswith(f"ValueError: Error while accessing the {PUBLIC} cache repository: Cannot reach ")
    assert error.endswith(f"/api/models/{PUBLIC}: offline mode is enabled. To disable it, please unset the "
                          "`HF_HUB_OFFLINE` environment variable.")
    assert scenario.compiled() == [] and scenario.requests == []


def test_offline_optimum_neuron_045_bypasses_the_hub_cache_and_compiles_every_graph(tmp_path: Path) -> None:
    scenario = offline("0.4.5", tmp_path)
    assert scenario.result["exit_code"] == 0, scenario.result.get("error")
    log = scenario.cache["log"]
    bypassed = [line for line in log if "Bypassing Hub cache because of the following error" in line]
    assert len(bypassed) == 2 and "offline mode is enabled" in bypassed[0]
    assert {lk["cache"] for lk in scenario.cache["lookups"]} == {"CompileCacheFs"}
    assert sorted(scenario.compiled()) == sorted(lk["graph"] for lk in scenario.cache["lookups"])
    assert len(scenario.compiled()) == 2 and scenario.requests == []
