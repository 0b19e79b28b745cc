"""Shared test settings. Sub-folders keep their own fixtures in their own conftest.py."""

import os
import time

# jsii warns on every process start that Node.js 20 (these machines') is past its end of life;
# the warning is about the machine, not this project.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")


# --- AWS for the operator's commands: boto3 in this process against moto's server on loopback ------------------

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness.aws import TOOLS, AwsEmulator, MotoServer
from tests.harness.processes import children_of

Hook = Callable[..., Any]


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One moto server for the whole run; each emulator resets it when it starts."""
    if not (TOOLS / "bin" / "aws").exists():
        pytest.fail(f"{TOOLS} is missing: scripts/test makes that venv of the AWS CLI and moto")
    with MotoServer(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def aws_for(tmp_path: Path, moto_server: MotoServer,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., AwsEmulator]]:
    """``aws_for(*services, default_region=None)`` starts an emulator in which moto answers ``services`` and
    points this process's AWS environment at it and nothing else (no profile, no instance metadata)."""
    with ExitStack() as stack:

        def start(*services: str, default_region: str | None = None) -> AwsEmulator:
            emulator = stack.enter_context(AwsEmulator(tmp_path / "aws", moto_server, default_region=default_region,
                                                       moto_services=services))
            for name in [n for n in os.environ if n.startswith("AWS_")]:
                monkeypatch.delenv(name)
            for name, value in emulator.env.items():
                monkeypatch.setenv(name, value)
            return emulator

        yield start


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> dict[str, Hook]:
    """botocore event handlers (event name -> handler) on every client the commands create, for the answers
    moto cannot give. The emulator's own clients name their endpoint and are left alone."""
    registered: dict[str, Hook] = {}
    original = boto3.session.Session.client

    def client(self: boto3.session.Session, *args: Any, **kwargs: Any) -> Any:
        made = original(self, *args, **kwargs)
        if "endpoint_url" not in kwargs:
            for event, handler in registered.items():
                made.meta.events.register(event, handler)
        return made

    monkeypatch.setattr(boto3.session.Session, "client", client)
    return registered


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The library's wheel, built once per session from the repository's sources."""
    from tests.harness.wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


# --- no test leaves a process behind ----------------------------------------------------------------------------


JSII_RUNTIME = "jsii-runtime"
"""aws-cdk-lib's Node.js kernel: jsii starts it at the first use of a construct in a process and
keeps it for the process's life, whichever test came first. (jsii 1.142.0, which aws-cdk-lib
2.275.0 installs: jsii/_kernel/providers/process.py runs ``node ... jsii-runtime.js``, from
``_jsii_runtime``, and stops it from ``atexit.register(self.stop)``.)"""


def _running_children() -> dict[int, str]:
    """This process's live child processes but jsii's kernel: pid and command line."""
    return {child.pid: child.command for child in children_of(os.getpid())
            if child.state != "Z" and JSII_RUNTIME not in child.command}


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """A test that starts a process (HAProxy, a fake server, a tool) stops it before it ends; one left
    running keeps serving health checks and taking CPU for the rest of the run, and after it.
    Processes of wider-scoped fixtures are already running when this looks, so they do not count."""
    before = set(_running_children())
    yield
    # A process told to stop may take a moment to exit: give it two seconds.
    deadline = time.monotonic() + 2
    while (left := {pid: command for pid, command in _running_children().items() if pid not in before}) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        pytest.fail("the test left these processes running: " + "; ".join(
            f"{pid}: {command[:200]}" for pid, command in sorted(left.items())), pytrace=False)


# --- Order: the host twin's boots first ------------------------------------------------------------------------


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The host twin's tests (tests/twin, up to three minutes each) run first: pytest-xdist hands out
    its first tests in turn to each worker (LoadScheduling), so the long ones are spread over both
    workers and overlap the many short ones, instead of ending the run on one worker."""
    twin = Path(__file__).parent / "twin"
    items.sort(key=lambda item: not item.path.is_relative_to(twin))
