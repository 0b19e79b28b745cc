"""Fixtures of the simulated host (see bootsim.py) and of shellcheck."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bootsim import (
    FAKE_HF_TOKEN,
    HF_SECRETS,
    HOST_AWS,
    MODEL,
    ROOT_MOUNT,
    SECRET_ARN,
    STUBS,
    Host,
    SigningKeys,
    make_plan,
    require,
)
from inside import ServingImage

from neuron_serving.plan import ServingPlan
from neuron_serving.render.boot_options import BootOptions
from tests.harness.aws import MOTO_SERVICES, TOOLS, AwsEmulator, MotoServer
from tests.harness.awscli_fork import AwsCliServer
from tests.harness.dockerd import FakeDockerd
from tests.harness.userdata import boot_of


@pytest.fixture(scope="session")
def host_aws_cli() -> Iterator[AwsCliServer]:
    """The real AWS CLI v2 of every simulated host, started once (tests/harness/awscli_fork.py)."""
    python = TOOLS / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{TOOLS} is missing: scripts/test makes that venv of the AWS CLI and moto")
    with AwsCliServer(python) as server:
        yield server


@pytest.fixture
def make_host(tmp_path: Path, aws: AwsEmulator, host_aws_cli: AwsCliServer) -> Iterator[Callable[..., Host]]:
    """``make_host(devices, missing=(), images=None)``: a fresh simulated host with ``/dev/neuron0..N-1``.

    ``missing`` names tools the host lacks (stubs, or ``aws``); such a host's ``PATH`` is the remaining
    stubs and ``/usr/bin:/bin`` only, so that the test machine's own tools cannot stand in for them.
    ``images``: the images its Docker engine holds before any pull (default: every image, so
    that ``docker run`` never pulls).
    Its ``aws`` is the real AWS CLI v2 (``host_aws.py``, which records each call in the host's calls log
    first) against this test's AWS (:func:`aws`), which the hosts of one test share, as the instances of
    one fleet share the artifact cache; each host is an instance in that AWS's EC2 (its instance metadata
    gives the id).
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
        if "aws" not in missing:
            cli = base / "aws-bin"
            cli.mkdir()
            (cli / "aws").symlink_to(HOST_AWS)
            path.insert(0, str(cli))
        calls_log = base / "calls.jsonl"
        inside = ServingImage()
        engine = FakeDockerd(record_path=base / "docker.jsonl", behaviour=inside, images=images,
                             device_root=root).start()
        engines.append(engine)
        env = {
            **aws.env,
            "PATH": os.pathsep.join(path),
            "HOME": str(base),
            "LANG": "C.UTF-8",
            "NEURON_SERVING_ROOT": str(root),
            "STUB_CALLS": str(calls_log),
            "STUB_STATE": str(state),
            "STUB_INSTANCE_ID": aws.run_instance(),
            "STUB_AWS_CLI": str(HOST_AWS),
            "AWSCLI_FORK_SOCKET": str(host_aws_cli.socket_path),
            "REAL_DOCKER": real_docker,
            **engine.env,
        }
        host = Host(root, calls_log, env, engine, inside, aws)
        if "aws" not in missing:
            assert shutil.which("aws", path=env["PATH"]) == str(cli / "aws")
        return host

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture
def booted(make_host: Callable[..., Host], aws: AwsEmulator) -> Callable[..., tuple[Host, ServingPlan, str]]:
    """``booted(instance_type, tensor_parallel, secret, model_id)``: a host with the catalog's
    device count after one successful boot, with its plan and the script it ran. ``secret`` may be
    :data:`bootsim.SECRET_ARN`: a secret of that name in that region, holding :data:`bootsim.FAKE_HF_TOKEN`
    (moto picks the ARN's suffix)."""

    def boot(instance_type: str, tensor_parallel: int | None = None, secret: str | None = None,
             model_id: str = MODEL) -> tuple[Host, ServingPlan, str]:
        if secret == SECRET_ARN:
            region, name = SECRET_ARN.split(":")[3], SECRET_ARN.split(":")[-1].rsplit("-", 1)[0]
            secret = aws.create_secret(name, FAKE_HF_TOKEN, region)
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
    Scaling). ``cache-bucket`` is versioned, as the stack's artifact cache is; the secrets
    :data:`bootsim.HF_SECRETS` hold :data:`bootsim.FAKE_HF_TOKEN`."""
    with AwsEmulator(tmp_path / "aws", moto_server, region=AWS_REGION,
                     moto_services=(*MOTO_SERVICES, "ec2", "cloudwatch")) as emulator:
        emulator.create_bucket("cache-bucket", versioned=True)
        for name in HF_SECRETS:
            emulator.create_secret(name, FAKE_HF_TOKEN)
        yield emulator
