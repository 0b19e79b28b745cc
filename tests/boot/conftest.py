"""Fixtures of the simulated host (see bootsim.py) and of shellcheck."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bootsim import MODEL, ROOT_MOUNT, STUBS, Host, SigningKeys, make_plan, require
from inside import ServingImage

from neuron_serving.plan import ServingPlan
from neuron_serving.render.boot_options import BootOptions
from tests.harness.aws import MOTO_SERVICES, AwsEmulator, MotoServer
from tests.harness.dockerd import FakeDockerd
from tests.harness.userdata import boot_of


@pytest.fixture
def make_host(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """``make_host(devices, missing=(), images=None)``: a fresh simulated host with ``/dev/neuron0..N-1``.

    ``missing`` names stubbed tools the host lacks; such a host's ``PATH`` is the remaining stubs
    and ``/usr/bin:/bin`` only, so that the test machine's own tools cannot stand in for them.
    ``images``: the images its Docker engine holds before any pull (default: every image, so
    that ``docker run`` never pulls).
    Hosts of one test share one fake S3; host N has the instance id ``i-<N in 17 digits>``.
    """
    count = 0
    engines: list[FakeDockerd] = []
    real_docker = shutil.which("docker", path=os.environ["PATH"].replace(str(STUBS), ""))
    if real_docker is None:
        pytest.fail("the docker CLI is required: install Debian's docker.io (the CLI only is used)")

    def make(devices: int, missing: tuple[str, ...] = (), images: tuple[str, ...] | None = None) -> Host:
        nonlocal count
        count += 1
        base = tmp_path / f"host{count}"
        root = base / "root"
        (root / "dev").mkdir(parents=True)
        # The kernel's mount table as the boot reads it (proc_pid_mounts(5)): the root volume only.
        (root / "proc/self").mkdir(parents=True)
        (root / "proc/self/mounts").write_text(ROOT_MOUNT)
        for n in range(devices):
            (root / "dev" / f"neuron{n}").touch()
        state = base / "stub-state"
        state.mkdir()
        path = [str(STUBS), os.path.dirname(sys.executable), os.environ["PATH"]]
        if missing:
            stubs = base / "stubs"
            stubs.mkdir()
            for stub in STUBS.iterdir():
                if stub.name not in missing:
                    (stubs / stub.name).symlink_to(stub)
            path = [str(stubs), os.path.dirname(sys.executable), "/usr/bin:/bin"]
        calls_log = base / "calls.jsonl"
        inside = ServingImage()
        engine = FakeDockerd(record_path=base / "docker.jsonl", behaviour=inside, images=images,
                             device_root=root).start()
        engines.append(engine)
        env = {
            "PATH": os.pathsep.join(path),
            "HOME": str(base),
            "LANG": "C.UTF-8",
            "NEURON_SERVING_ROOT": str(root),
            "STUB_CALLS": str(calls_log),
            "STUB_STATE": str(state),
            "STUB_S3": str(tmp_path / "s3"),
            "STUB_STACKS": str(tmp_path / "stacks"),
            "STUB_INSTANCE_ID": f"i-{count:017d}",
            "STUB_AWS_CLI": str(STUBS / "aws"),
            "REAL_DOCKER": real_docker,
            **engine.env,
        }
        return Host(root, calls_log, env, engine, inside)

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def booted(make_host: Callable[..., Host]) -> Callable[..., tuple[Host, ServingPlan, str]]:
    """``booted(instance_type, tensor_parallel, secret, model_id)``: a host with the catalog's
    device count after one successful boot, with its plan and the script it ran."""

    def boot(instance_type: str, tensor_parallel: int | None = None, secret: str | None = None,
             model_id: str = MODEL) -> tuple[Host, ServingPlan, str]:
        plan = make_plan(instance_type, tensor_parallel, model_id)
        script = boot_of(plan, BootOptions(hf_token_secret=secret))
        host = make_host(plan.instance.devices)
        result = host.boot(script)
        assert result.returncode == 0, result.stdout + result.stderr
        return host, plan, script

    return boot


@pytest.fixture(scope="session")
def agent_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SigningKeys]:
    """A test's stand-in for AWS's CloudWatch agent key, and another key (bootsim.SigningKeys)."""
    keys = SigningKeys(tmp_path_factory.mktemp("agent-keys") / "gnupg")
    yield keys
    keys.close()


@pytest.fixture
def shellcheck() -> Iterator[str]:
    path = require(shutil.which("shellcheck"), "install Debian's shellcheck")
    yield path


AWS_REGION = "us-east-2"
"""The region the instance metadata stand-in (stubs/curl) reports."""


@pytest.fixture
def aws(tmp_path: Path, moto_server: MotoServer) -> Iterator[AwsEmulator]:
    """This test's AWS: moto (S3, Secrets Manager, EC2, CloudWatch) and the recorder (CloudFormation, Auto
    Scaling). ``cache-bucket`` is versioned, as the stack's artifact cache is."""
    with AwsEmulator(tmp_path / "aws", moto_server, region=AWS_REGION,
                     moto_services=(*MOTO_SERVICES, "ec2", "cloudwatch")) as emulator:
        emulator.create_bucket("cache-bucket", versioned=True)
        yield emulator


RECORDING_CLI = """#!{python}
import json, os, sys
with open(os.environ["STUB_CALLS"], "a", encoding="utf-8") as calls:
    calls.write(json.dumps({{"cmd": "aws", "argv": sys.argv[1:]}}) + "\\n")
if sys.argv[1:3] == ["ec2", "create-tags"] and not {real_tags!r}:
    sys.exit(0)
os.execv({aws!r}, [{aws!r}, *sys.argv[1:]])
"""
"""The ``aws`` of a host with the real CLI: records its argv as a stub would, then becomes the CLI.
Without ``real_tags``, a boot phase report (``ec2 create-tags``) is only recorded and succeeds, as
EC2 would answer: a boot makes about ten, at half a second each with the real CLI, and the tests of
the reports themselves (``real_tags=True``) send theirs to moto."""


@pytest.fixture
def aws_host(make_host: Callable[..., Host], aws: AwsEmulator) -> Callable[..., Host]:
    """``aws_host(devices)``: a simulated host whose ``aws`` is the real AWS CLI, talking to this
    test's emulator, and whose instance is one in moto (its instance metadata gives that id). Its
    ``aws`` records each call in the host's calls log (as the stubs do, so ``Host.calls`` and
    ``Host.phases`` read them) before it runs the real CLI (see :data:`RECORDING_CLI` for
    ``real_tags``)."""

    def make(devices: int, *, real_tags: bool = False) -> Host:
        host = make_host(devices, missing=("aws",))
        bin_dir = host.root.parent / "aws-bin"
        bin_dir.mkdir(parents=True)
        recording = bin_dir / "aws"
        recording.write_text(RECORDING_CLI.format(python=sys.executable, aws=AwsEmulator.aws_executable(),
                                                 real_tags=real_tags))
        recording.chmod(0o755)
        host.env.update(aws.env)
        host.env["PATH"] = f"{bin_dir}{os.pathsep}{host.env['PATH']}"
        host.env["STUB_INSTANCE_ID"] = aws.run_instance()
        host.upload = aws.put_s3_uri
        host.deploy = aws.put_metadata
        assert shutil.which("aws", path=host.env["PATH"]) == str(recording)
        return host

    return make
