"""The real ``huggingface-cli download`` of the TGI 3.3.5 neuron image (huggingface-hub 0.34.4) against the
fake hub: the download forms the boot script relies on, and the failures it must report.

The client runs as a subprocess from the tools venv ``.tools/hub`` (``tests/harness/requirements-hub.txt``).
Without it these tests skip, or fail when ``CI`` is set, so CI cannot pass by not running them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from neuron_serving.plan.engines import CHECKPOINT_FILES
from tests.harness.fake_hub import CLIENT_ENV_REMOVE, RESET, FakeHub, HubRepo, HubRequest

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".tools" / "hub" / "bin" / "huggingface-cli"
TOKEN = "hf_fake_token"
REPO_ID = "meta-llama/Tiny-Llama-Instruct"

INCLUDE = list(CHECKPOINT_FILES)
"""What the boot script's export step downloads (neuron_serving.plan.engines.CHECKPOINT_FILES)."""


@pytest.fixture
def cli() -> Path:
    if not CLI.is_file():
        message = (
            f"{CLI} is missing: python3 -m venv .tools/hub && "
            ".tools/hub/bin/pip install -r tests/harness/requirements-hub.txt"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CLI


def llama_files(tag: bytes = b"v1") -> dict[str, bytes]:
    """A Llama-3-style repo in miniature: sharded safetensors, tokenizer, and Meta's original/ checkpoint."""
    return {
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
        "LICENSE": b"license",
        "README.md": b"# Tiny",
        "config.json": b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}',
        "generation_config.json": b'{"eos_token_id": [1, 2]}',
        "model-00001-of-00002.safetensors": b"shard one " + tag,
        "model-00002-of-00002.safetensors": b"shard two " + tag,
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "special_tokens_map.json": b"{}",
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "original/consolidated.00.pth": b"meta checkpoint " + tag,
        "original/params.json": b"{}",
        "original/tokenizer.model": b"tiktoken",
    }


def download(
    hub: FakeHub,
    tmp_path: Path,
    *args: str,
    token: str | None = None,
    hf_transfer: bool = False,
) -> subprocess.CompletedProcess[str]:
    """``huggingface-cli download *args`` as the boot script runs it, with only the fake hub reachable."""
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_REMOVE}
    env.update(hub.client_env(tmp_path / "hf-home", token=token, hf_transfer=hf_transfer))
    return subprocess.run(
        [str(CLI), "download", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def files_under(directory: Path) -> set[str]:
    """Files of a --local-dir download, without the client's own bookkeeping in .cache/huggingface/."""
    return {
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not p.relative_to(directory).as_posix().startswith(".cache/")
    }


def test_include_patterns_fetch_only_matching_files(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID)
    files = llama_files()
    repo.commit(files)
    out = tmp_path / "model.src"
    with FakeHub([repo]) as hub:
        result = download(hub, tmp_path, REPO_ID, "--revision", "main", "--local-dir", str(out), "--include", *INCLUDE)
        requests = hub.requests

    assert result.returncode == 0, result.stderr
    wanted = {p for p in files if not p.startswith("original/") and p.endswith((".json", ".safetensors"))}
    wanted.discard(".gitattributes")
    assert files_under(out) == wanted
    for path in wanted:
        assert (out / path).read_bytes() == files[path]
    # Nothing outside the patterns was even asked for.
    assert not [r for r in requests if r.file is not None and r.file.startswith("original/")]


def test_broad_patterns_match_across_folders(cli: Path, tmp_path: Path) -> None:
    """fnmatch's ``*`` matches ``/`` (huggingface_hub utils/_paths.py): ``*.json`` also takes original/params.json,
    so ``--exclude 'original/*'`` is what keeps Meta's folder out when patterns are broad."""
    repo = HubRepo(REPO_ID)
    repo.commit(llama_files())
    with FakeHub([repo]) as hub:
        broad = download(hub, tmp_path, REPO_ID, "--local-dir", str(tmp_path / "broad"), "--include", "*.json")
        excluded = download(
            hub,
            tmp_path,
            REPO_ID,
            "--local-dir",
            str(tmp_path / "excluded"),
            "--include",
            "*.json",
            "*.safetensors",
            "--exclude",
            "original/*",
        )

    assert broad.returncode == 0, broad.stderr
    assert "original/params.json" in files_under(tmp_path / "broad")
    assert excluded.returncode == 0, excluded.stderr
    got = files_under(tmp_path / "excluded")
    assert not [p for p in got if p.startswith("original/")]
    assert "model-00002-of-00002.safetensors" in got


def test_revision_pins_a_commit(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID)
    first = repo.commit(llama_files(b"v1"))
    repo.tag("v1.0", first)
    second = repo.commit(llama_files(b"v2"))
    assert first != second
    with FakeHub([repo]) as hub:
        by_sha = download(
            hub, tmp_path, REPO_ID, "--revision", first, "--local-dir", str(tmp_path / "sha"), "--include", *INCLUDE
        )
        sha_requests = hub.requests
        hub.clear()
        by_tag = download(
            hub, tmp_path, REPO_ID, "--revision", "v1.0", "--local-dir", str(tmp_path / "tag"), "--include", *INCLUDE
        )
        tag_requests = hub.requests
        latest = download(hub, tmp_path, REPO_ID, "--local-dir", str(tmp_path / "main"), "--include", *INCLUDE)

    for result in (by_sha, by_tag, latest):
        assert result.returncode == 0, result.stderr
    shard = "model-00001-of-00002.safetensors"
    assert (tmp_path / "sha" / shard).read_bytes() == b"shard one v1"
    assert (tmp_path / "tag" / shard).read_bytes() == b"shard one v1"
    assert (tmp_path / "main" / shard).read_bytes() == b"shard one v2"
    # The client asks the repo info at the name it was given, then every file at the commit it resolved to.
    assert tag_requests[0].path == f"/api/models/{REPO_ID}/revision/v1.0"
    for requests in (sha_requests, tag_requests):
        resolves = [r for r in requests if r.server == "hub" and "/resolve/" in r.path]
        assert resolves
        assert all(f"/resolve/{first}/" in r.path for r in resolves)


def test_gated_repo_without_token_fails(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID, gated=True)
    repo.commit(llama_files())
    out = tmp_path / "model.src"
    with FakeHub([repo], tokens={TOKEN}) as hub:
        result = download(hub, tmp_path, REPO_ID, "--local-dir", str(out), "--include", *INCLUDE)
        requests = hub.requests

    assert result.returncode != 0
    assert "GatedRepoError" in result.stderr
    assert not out.exists() or not files_under(out)
    assert {r.status for r in requests if r.file is not None} == {401}


def test_gated_repo_with_hf_token_succeeds(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID, gated=True)
    repo.commit(llama_files())
    out = tmp_path / "model.src"
    with FakeHub([repo], tokens={TOKEN}) as hub:
        result = download(hub, tmp_path, REPO_ID, "--local-dir", str(out), "--include", *INCLUDE, token=TOKEN)
        requests = hub.requests

    assert result.returncode == 0, result.stderr
    assert "model-00002-of-00002.safetensors" in files_under(out)
    # HF_TOKEN goes to the Hub only; LFS content comes from the CDN, which gets no token.
    assert all(r.token == TOKEN for r in requests if r.server == "hub")
    cdn = [r for r in requests if r.server == "cdn"]
    assert cdn
    assert all(r.token is None for r in cdn)


def test_token_without_access_fails(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID, gated=True, granted=frozenset({"hf_other"}))
    repo.commit(llama_files())
    with FakeHub([repo], tokens={TOKEN, "hf_other"}) as hub:
        result = download(hub, tmp_path, REPO_ID, "--local-dir", str(tmp_path / "m"), token=TOKEN)

    assert result.returncode != 0
    assert "GatedRepoError" in result.stderr


def test_unknown_revision_fails(cli: Path, tmp_path: Path) -> None:
    repo = HubRepo(REPO_ID)
    repo.commit(llama_files())
    with FakeHub([repo]) as hub:
        result = download(hub, tmp_path, REPO_ID, "--revision", "no-such-branch", "--local-dir", str(tmp_path / "m"))
        requests = hub.requests

    assert result.returncode != 0
    assert "RevisionNotFoundError" in result.stderr
    assert [(r.path, r.status) for r in requests] == [(f"/api/models/{REPO_ID}/revision/no-such-branch", 404)]


def test_unknown_repo_fails(cli: Path, tmp_path: Path) -> None:
    with FakeHub([]) as hub:
        result = download(hub, tmp_path, "nobody/nothing", "--local-dir", str(tmp_path / "m"))

    assert result.returncode != 0
    assert "RepositoryNotFoundError" in result.stderr


def test_hf_transfer_downloads_large_files_in_ranges(cli: Path, tmp_path: Path) -> None:
    """The image sets HF_HUB_ENABLE_HF_TRANSFER=1: files over 50 MiB then go through hf_transfer's parallel
    Range GETs (huggingface_hub file_download.py ``http_get``), which the CDN must answer with 206."""
    block = hashlib.sha256(b"seed").digest() * 32
    big = block * (5 * 10 * 1024 * 1024 // len(block) + 1)
    repo = HubRepo(REPO_ID)
    repo.commit({"config.json": b"{}", "model.safetensors": big})
    out = tmp_path / "model.src"
    with FakeHub([repo]) as hub:
        result = download(hub, tmp_path, REPO_ID, "--local-dir", str(out), "--include", *INCLUDE, hf_transfer=True)
        requests = hub.requests

    assert result.returncode == 0, result.stderr
    assert (out / "model.safetensors").read_bytes() == big
    assert [r for r in requests if r.server == "cdn" and r.status == 206]


def content_sent(requests: list[HubRequest]) -> list[str]:
    """The repo files whose content was sent, once per time it was: GETs answered 200 or 206."""
    return sorted(r.file for r in requests if r.method == "GET" and r.status in (200, 206) and r.file is not None)


@pytest.mark.parametrize("status", [RESET, 500])
def test_a_hub_that_fails_the_first_call_fails_the_download_and_the_next_download_succeeds(
    cli: Path, tmp_path: Path, status: int,
) -> None:
    """The client does not retry the first call of a download (``model_info``, hf_api.py at v0.34.4): one reset
    connection or one 500 fails the whole ``huggingface-cli download``; that is the boot script's to retry."""
    repo = HubRepo(REPO_ID)
    repo.commit(llama_files())
    out = tmp_path / "model.src"
    args = (REPO_ID, "--local-dir", str(out), "--include", *INCLUDE)
    with FakeHub([repo]) as hub:
        hub.fail(2, status=status)
        first, second, third = (download(hub, tmp_path, *args) for _ in range(3))
        requests = hub.requests

    assert first.returncode != 0 and second.returncode != 0
    assert ("ConnectionError" if status == RESET else "500 Server Error") in first.stderr
    assert [r.status for r in requests[:2]] == [status, status]
    assert third.returncode == 0, third.stderr
    assert files_under(out) == {"config.json", "generation_config.json", "model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"}


def test_a_download_run_again_into_the_same_local_dir_fetches_only_the_files_it_lacks(
    cli: Path, tmp_path: Path,
) -> None:
    """What makes the boot script's retries resume: a run that failed on one file leaves the others complete
    in --local-dir with their metadata (.cache/huggingface/download/), and the next run into that directory
    HEADs each file and skips those whose etag matches (file_download.py ``_hf_hub_download_to_local_dir``)."""
    repo = HubRepo(REPO_ID)
    files = llama_files()
    repo.commit(files)
    out = tmp_path / "model.src"
    args = (REPO_ID, "--local-dir", str(out), "--include", *INCLUDE)
    broken = "model-00002-of-00002.safetensors"
    with FakeHub([repo]) as hub:
        hub.fail(1, file=broken)
        first = download(hub, tmp_path, *args)
        sent_first = content_sent(hub.requests)
        hub.clear()
        second = download(hub, tmp_path, *args)
        sent_second = content_sent(hub.requests)

    assert first.returncode != 0
    assert broken not in sent_first and "model-00001-of-00002.safetensors" in sent_first
    assert second.returncode == 0, second.stderr
    assert sent_second == [broken]
    assert (out / broken).read_bytes() == files[broken]
