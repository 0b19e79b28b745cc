"""The fake Docker Engine (dockerd.py) driven by the real docker CLI: what the CLI sends for each command the
boot scripts use, and that exit codes, output, pull failures, stop and concurrency behave as on a real host.

The CLI is ``$FAKE_DOCKERD_CLI`` when set (e.g. Debian bookworm's docker.io 20.10 client, to check an older
API version), else ``docker`` on ``PATH``; CI must have it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import dockerd
from tests.harness.dockerd import Bind, DockerdProcess, FakeDockerd

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/huggingface/neuronx-tgi:0.0.25"


@pytest.fixture(scope="module")
def docker_cli() -> str:
    path = os.environ.get("FAKE_DOCKERD_CLI") or shutil.which("docker")
    if path is None:
        message = "the docker CLI is required (Debian bookworm: the docker.io package ships /usr/bin/docker)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FakeDockerd]:
    with FakeDockerd(record_path=tmp_path / "docker.jsonl") as fake:
        yield fake


def cli_env(fake: FakeDockerd | DockerdProcess) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"), **fake.env}


def docker(cli: str, fake: FakeDockerd | DockerdProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([cli, *args], env=cli_env(fake), capture_output=True, text=True, timeout=20, check=False)


def docker_async(cli: str, fake: FakeDockerd | DockerdProcess, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([cli, *args], env=cli_env(fake), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def log(fake: FakeDockerd) -> Path:
    """The engine's record file."""
    assert fake.record_path is not None
    return fake.record_path


def started(fake: FakeDockerd) -> bool:
    """Whether a container has been started."""
    return any(r["kind"] == "request" and r["path"].endswith("/start") for r in fake.records)


def wait_for(predicate: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


_BOTH_RUNNING = threading.Barrier(2, timeout=5)


def meet_and_echo(create_body: dict[str, Any], binds: list[Bind]) -> tuple[int, bytes]:
    """A behaviour for the process engine (loaded as ``tests.harness.test_dockerd:meet_and_echo``): waits
    until a second container runs it too (so it fails unless two containers run at once), prints its command
    line."""
    _BOTH_RUNNING.wait()
    return 0, " ".join(dockerd.command(create_body)).encode() + b"\n"


def test_run_sends_what_the_command_line_says(docker_cli: str, engine: FakeDockerd, tmp_path: Path) -> None:
    exports = tmp_path / "exports"
    exports.mkdir()
    token_file = tmp_path / "hf-token.env"
    token_file.write_text("HF_TOKEN=hf_fake\n# a comment\n")
    seen: list[tuple[dict[str, Any], list[Bind]]] = []

    def compile_model(body: dict[str, Any], binds: list[Bind]) -> tuple[int, str]:
        seen.append((body, binds))
        out = dockerd.host_path(binds, "/exports/model", write=True)
        out.mkdir()
        (out / "model.neuron").write_text("compiled\n")
        with pytest.raises(PermissionError):
            dockerd.host_path(binds, "/ro/x", write=True)
        return 0, f"compiled with token {dockerd.environment(body)['HF_TOKEN']}\n"

    engine.behaviour = compile_model
    result = docker(docker_cli, engine, "run", "--rm", "--name", "replica-0",
                    "--device", "/dev/neuron0", "--device", "/dev/neuron1", "-p", "127.0.0.1:8081:80",
                    "-v", f"{exports}:/exports", "-v", f"{tmp_path}:/ro:ro", "--env-file", str(token_file),
                    "-e", "MAX_BATCH_SIZE=4", "--entrypoint", "optimum-cli",
                    "--log-driver", "awslogs", "--log-opt", "awslogs-group=replicas#1",
                    "--log-opt", "awslogs-stream=r0",
                    IMAGE, "export", "neuron", "--model", "/exports/ckpt", "/exports/model")
    assert (result.returncode, result.stdout, result.stderr) == (0, "compiled with token hf_fake\n", "")
    assert (exports / "model" / "model.neuron").read_text() == "compiled\n"

    [container] = dockerd.containers(log(engine))
    assert container["name"] == "replica-0"
    assert container["Image"] == IMAGE
    assert container["Entrypoint"] == ["optimum-cli"]
    assert container["Cmd"] == ["export", "neuron", "--model", "/exports/ckpt", "/exports/model"]
    assert container["Env"] == ["HF_TOKEN=hf_fake", "MAX_BATCH_SIZE=4"]  # the CLI read --env-file
    assert container["ExposedPorts"] == {"80/tcp": {}}
    host = container["HostConfig"]
    assert host["Devices"] == [{"PathOnHost": f"/dev/neuron{n}", "PathInContainer": f"/dev/neuron{n}",
                                "CgroupPermissions": "rwm"} for n in (0, 1)]
    assert host["PortBindings"] == {"80/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8081"}]}
    # The CLI collects -v in a Go map (docker/cli v28.2.2 cli/command/container/opts.go): any order.
    assert sorted(host["Binds"]) == sorted([f"{exports}:/exports", f"{tmp_path}:/ro:ro"])
    assert host["LogConfig"] == {"Type": "awslogs", "Config": {"awslogs-group": "replicas#1", "awslogs-stream": "r0"}}
    assert (host["AutoRemove"], host["Privileged"], host["CapAdd"]) == (True, False, None)
    assert sorted(container["binds"]) == sorted([[str(exports), "/exports", False], [str(tmp_path), "/ro", True]])
    assert sorted(seen[0][1]) == sorted([Bind(str(exports), "/exports", False), Bind(str(tmp_path), "/ro", True)])

    calls = [(r["method"], r["path"].split("/")[-1], r["status"]) for r in dockerd.requests(log(engine))]
    assert calls == [("HEAD", "_ping", 200), ("POST", "create", 201), ("POST", "attach", 101),
                     ("POST", "wait", 200), ("POST", "start", 204)]
    wait = dockerd.requests(log(engine), "POST")[2]
    assert wait["query"] == {"condition": "removed"} and wait["api_version"]
    assert dockerd.exits(log(engine))[0]["exit_code"] == 0


def test_exit_code_and_output_pass_through(docker_cli: str, engine: FakeDockerd) -> None:
    def failing(body: dict[str, Any], binds: list[Bind]) -> tuple[int, bytes, bytes]:
        dockerd.emit("started\n")
        return 7, b"x" * 100_000 + b"\n", b"neuronx-cc: error: compilation failed\n"

    engine.behaviour = failing
    result = docker(docker_cli, engine, "run", "--rm", IMAGE)
    assert result.returncode == 7
    assert result.stdout == "started\n" + "x" * 100_000 + "\n"
    assert result.stderr == "neuronx-cc: error: compilation failed\n"

    engine.behaviour = lambda body, binds: 1 // 0  # type: ignore[assignment,return-value]
    result = docker(docker_cli, engine, "run", "--rm", IMAGE)
    assert result.returncode == 1 and "ZeroDivisionError" in result.stderr
    assert [e["reason"] for e in dockerd.exits(log(engine))] == ["exited", "failed"]


def test_round_trip_time(docker_cli: str, engine: FakeDockerd, record_property: Any) -> None:
    times = []
    for _ in range(5):
        start = time.perf_counter()
        assert docker(docker_cli, engine, "run", "--rm", IMAGE).returncode == 0
        times.append(time.perf_counter() - start)
    record_property("docker_run_round_trip_s", statistics.median(times))
    assert statistics.median(times) < 1.0, times


def test_pull_fails_the_first_n_times(docker_cli: str, engine: FakeDockerd) -> None:
    engine.pull_failures = 2
    results = [docker(docker_cli, engine, "pull", IMAGE) for _ in range(3)]
    for failed in results[:2]:
        assert failed.returncode == 1
        assert failed.stderr == ('Error response from daemon: Get "https://ghcr.io/v2/": '
                                 "net/http: TLS handshake timeout\n")
    assert results[2].returncode == 0
    assert "Status: Downloaded newer image for ghcr.io/huggingface/neuronx-tgi:0.0.25" in results[2].stdout
    assert dockerd.pulls(log(engine)) == [{"image": IMAGE, "status": s} for s in (500, 500, 200)]
    assert dockerd.requests(log(engine), "POST")[0]["query"] == {
        "fromImage": "ghcr.io/huggingface/neuronx-tgi", "tag": "0.0.25"}


def test_run_pulls_a_missing_image(docker_cli: str, tmp_path: Path) -> None:
    with FakeDockerd(record_path=tmp_path / "docker.jsonl", images=["debian:12"]) as fake:
        assert docker(docker_cli, fake, "run", "--rm", "debian:12").returncode == 0
        result = docker(docker_cli, fake, "run", "--rm", IMAGE)
        assert result.returncode == 0
        assert f"Unable to find image '{IMAGE}' locally" in result.stderr
        assert docker(docker_cli, fake, "run", "--rm", IMAGE).returncode == 0
    creates = [r["status"] for r in dockerd.requests(tmp_path / "docker.jsonl", "POST", "/containers/create")]
    assert creates == [201, 404, 201, 201]
    assert [p["image"] for p in dockerd.pulls(tmp_path / "docker.jsonl")] == [IMAGE]


def test_a_reference_with_a_tag_and_a_digest_is_pulled_and_run_by_the_digest(docker_cli: str, tmp_path: Path) -> None:
    digest = "sha256:" + "0123456789abcdef" * 4
    pinned, other = f"{IMAGE}@{digest}", f"{IMAGE}@sha256:{'f' * 64}"
    record = tmp_path / "docker.jsonl"
    with FakeDockerd(record_path=record, images=[IMAGE]) as fake:
        pull = docker(docker_cli, fake, "pull", pinned)
        assert pull.returncode == 0, pull.stderr
        assert f"Digest: {digest}" in pull.stdout
        assert docker(docker_cli, fake, "run", "--rm", pinned).returncode == 0
        # The tag's image is present, but not this digest's: run pulls it, by its digest.
        assert docker(docker_cli, fake, "run", "--rm", other).returncode == 0
    # docker/cli v28.2.2 vendor/github.com/docker/docker/client/image_pull.go: the name, and the digest as the
    # tag; the reference's own tag is not sent.
    assert [r["query"] for r in dockerd.requests(record, "POST", "/images/create")] == [
        {"fromImage": "ghcr.io/huggingface/neuronx-tgi", "tag": d} for d in (digest, "sha256:" + "f" * 64)]
    creates = dockerd.requests(record, "POST", "/containers/create")
    assert [(r["body"]["Image"], r["status"]) for r in creates] == [(pinned, 201), (other, 404), (other, 201)]


def test_rm_f_of_a_missing_container(docker_cli: str, engine: FakeDockerd) -> None:
    result = docker(docker_cli, engine, "rm", "-f", "replica-0")
    # docker/cli v28.2.2 cli/command/container/rm.go: with -f, "not found" is printed but is no failure
    # (28.x prints "Error response from daemon: No such container: ...", 20.10 "Error: No such container: ...").
    assert result.returncode == 0
    assert result.stderr.startswith("Error") and result.stderr.endswith("No such container: replica-0\n")
    [request] = dockerd.requests(log(engine), "DELETE")
    assert (request["path"], request["query"], request["status"]) == ("/containers/replica-0", {"force": "1"}, 404)
    result = docker(docker_cli, engine, "stop", "-t", "30", "replica-0")
    assert (result.returncode, result.stderr) == (1, "Error response from daemon: No such container: replica-0\n")


def test_stop_ends_a_foreground_run(docker_cli: str, engine: FakeDockerd) -> None:
    def serve(body: dict[str, Any], binds: list[Bind]) -> tuple[int, str]:
        dockerd.emit("Connected\n")
        dockerd.sleep(30)
        return 0, "never printed: the container was stopped\n"

    engine.behaviour = serve
    run = docker_async(docker_cli, engine, "run", "--rm", "--name", "replica-1", IMAGE)
    wait_for(lambda: started(engine))
    clash = docker(docker_cli, engine, "run", "--rm", "--name", "replica-1", IMAGE)
    assert clash.returncode == 125 and 'The container name "/replica-1" is already in use' in clash.stderr

    start = time.monotonic()
    stop = docker(docker_cli, engine, "stop", "-t", "30", "replica-1")
    assert (stop.returncode, stop.stdout) == (0, "replica-1\n")
    stdout, stderr = run.communicate(timeout=10)
    assert time.monotonic() - start < 2
    assert (run.returncode, stdout, stderr) == (143, "Connected\n", "")
    [request] = dockerd.requests(log(engine), "POST", "/containers/replica-1/stop")
    assert request["query"] == {"t": "30"}
    # --rm: gone once stopped; a second rm -f finds nothing.
    assert docker(docker_cli, engine, "rm", "-f", "replica-1").stderr.endswith("No such container: replica-1\n")


def test_the_cli_forwards_sigterm(docker_cli: str, engine: FakeDockerd) -> None:
    engine.behaviour = lambda body, binds: (0, b"slept\n" if dockerd.sleep(30) else b"")
    run = docker_async(docker_cli, engine, "run", "--name", "replica-2", IMAGE)
    wait_for(lambda: started(engine))
    run.terminate()  # as systemd stops the unit: the CLI proxies the signal to the container
    assert run.wait(timeout=10) == 143
    # The engine ends the container (which answers the CLI's wait, and the CLI exits) before it
    # records the kill request (dockerd.py, _containers_kill): under load the record comes a moment
    # after the exit (seen once in a full run).
    kills = lambda: [r for r in dockerd.requests(log(engine), "POST") if r["path"].endswith("/kill")]  # noqa: E731
    wait_for(lambda: bool(kills()))
    kill = kills()[0]
    assert kill["query"] == {"signal": "TERM"}
    assert docker(docker_cli, engine, "rm", "-f", "replica-2").returncode == 0  # no --rm: still there


def test_missing_device_fails_start_as_on_a_host(docker_cli: str, tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "neuron0").touch()
    with FakeDockerd(device_root=tmp_path) as fake:
        assert docker(docker_cli, fake, "run", "--rm", "--device", "/dev/neuron0", IMAGE).returncode == 0
        result = docker(docker_cli, fake, "run", "--rm", "--device", "/dev/neuron1", IMAGE)
    # docker/cli maps "no such file or directory" from the daemon to 127.
    assert result.returncode == 127
    assert 'adding custom device "/dev/neuron1": no such file or directory' in result.stderr


def test_unexpected_calls_fail_loudly(docker_cli: str, engine: FakeDockerd) -> None:
    result = docker(docker_cli, engine, "ps")
    assert result.returncode == 1
    assert "does not implement GET /containers/json" in result.stderr


def test_concurrent_runs_from_two_processes(docker_cli: str, tmp_path: Path) -> None:
    record = tmp_path / "docker.jsonl"
    with DockerdProcess(record_path=record, behaviour="tests.harness.test_dockerd:meet_and_echo",
                        pythonpath=[str(ROOT)]) as fake:
        runs = [docker_async(docker_cli, fake, "run", "--rm", "--name", f"job{n}", "--entrypoint", "job", IMAGE, str(n))
                for n in range(2)]
        outputs = [run.communicate(timeout=10) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert [out for out, _ in outputs] == ["job 0\n", "job 1\n"]
    assert sorted(c["name"] for c in dockerd.containers(record)) == ["job0", "job1"]
    assert sorted(e["name"] for e in dockerd.exits(record)) == ["job0", "job1"]


def test_host_path_maps_through_the_deepest_bind() -> None:
    binds = [Bind("/h/data", "/data", False), Bind("/h/models", "/data/models", True)]
    assert dockerd.host_path(binds, "/data/x/y") == Path("/h/data/x/y")
    assert dockerd.host_path(binds, "/data/models/m") == Path("/h/models/m")
    assert dockerd.host_path(binds, "/data") == Path("/h/data")
    with pytest.raises(FileNotFoundError):
        dockerd.host_path(binds, "/datax/y")
    with pytest.raises(PermissionError):
        dockerd.host_path(binds, "/data/models/m", write=True)
    assert dockerd.normalize_image("alpine") == "docker.io/library/alpine:latest"
    assert dockerd.familiar_image("docker.io/library/alpine:latest") == "alpine:latest"
    assert dockerd.normalize_image("localhost:5000/x@sha256:ab") == "localhost:5000/x@sha256:ab"
    assert dockerd.normalize_image("localhost:5000/x:1@sha256:ab") == "localhost:5000/x@sha256:ab"
