"""Fixtures of the host twin (tests/twin/host.py): :func:`twin_world` boots synthesized user data on a
twin with the metadata service, AWS and the Docker engine around it, all inside the twin's network
namespace."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from neuron_serving.plan import ServingPlan
from tests.harness.aws import MOTO_SERVICES, AwsEmulator
from tests.harness.dockerd import FakeDockerd
from tests.harness.fake_hub import FakeHub, HubRepo
from tests.twin.cleanup import on_signal, on_signals, reap
from tests.twin.host import Twin, copy_console_tail
from tests.twin.images import CHECKPOINT, EAGLE_DRAFT, HUB_CLIS, TwinImage
from tests.twin.imds import Imds
from tests.twin.netns import NetNs
from tests.twin.rootfs import TwinUnavailable, rootfs

REGION = "us-east-2"
ZONE = "us-east-2a"
ROLE = "NeuronLlamaStack-HostRole"

_names = count()

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def twin_session() -> Iterator[None]:
    """Once per process (each xdist worker is one): the namespaces and mounts of earlier runs that were
    killed are reaped; then, until the session ends, SIGTERM and SIGINT first kill this process's
    twins and take their mounts and namespaces away (tests/twin/cleanup.py)."""
    reap()
    with on_signals():
        yield


@pytest.fixture(scope="session")
def twin_rootfs() -> Path:
    """The cached Ubuntu 22.04 rootfs; a test that needs it fails (never skips) when it cannot be had."""
    try:
        return rootfs()
    except TwinUnavailable as error:
        pytest.fail(f"the host twin cannot be built: {error}")


@dataclass
class World:
    """Everything around the twins of one test, inside one network namespace."""

    workdir: Path
    netns: NetNs
    rootfs: Path
    aws: AwsEmulator
    hub: FakeHub
    twins: list[Twin] = field(default_factory=list)
    engines: list[FakeDockerd] = field(default_factory=list)
    imds: list[Imds] = field(default_factory=list)

    def twin(self, user_data: str, plan: ServingPlan, *, instance_type: str | None = None,
             devices: int | None = None, environment: dict[str, str] | None = None,
             tags: dict[str, str] | None = None) -> tuple[Twin, Imds, TwinImage]:
        """A twin prepared to boot ``user_data`` as a new instance of the plan's instance type (or
        ``instance_type`` with ``devices``; its id one of moto's instances), with its own Docker engine.
        The namespace has one metadata address, so the twins of a world take turns: the previous one
        must be powered off (a fleet's second host boots after the first, as a scale-out does)."""
        assert all(not t.running() for t in self.twins), "power off the previous twin first"
        instance_type = instance_type or plan.instance.name
        devices = plan.instance.devices if devices is None else devices
        model_id = plan.model_id
        n = len(self.twins) + 1
        instance_id = self.aws.run_instance(instance_type)
        if self.imds:
            self.imds.pop().stop()
        imds = Imds(instance_id=instance_id, instance_type=instance_type, region=REGION, zone=ZONE, role=ROLE,
                    credentials={"AccessKeyId": "ASIATWINFAKEKEY00001", "SecretAccessKey": "twin/fake/secret"},
                    tags=tags).start()
        self.imds.append(imds)
        workdir = self.workdir / f"twin{n}"
        engine_dir = Path(tempfile.mkdtemp(prefix="twin-engine-", dir="/tmp"))
        twin = Twin(workdir, self.rootfs, self.netns, devices=devices, engine_dir=engine_dir,
                    environment={**endpoints(self.aws), **(environment or {})})
        behaviour = TwinImage(twin.merged)
        # Downloads are the image's real huggingface-cli against the world's Hub, which holds the model.
        if model_id not in self.hub.repos:
            self.hub.add(HubRepo(model_id)).commit({name: text.encode() for name, text in CHECKPOINT.items()})
        draft = plan.request.speculative_model
        if draft is not None and draft not in self.hub.repos:
            self.hub.add(HubRepo(draft)).commit({name: text.encode() for name, text in EAGLE_DRAFT.items()})
        # The image's own huggingface-cli, and whether the image turns hf_transfer on (test_boot_export).
        path, hf_transfer = HUB_CLIS["vllm" if "optimum-neuron-vllm" in user_data else "tgi"]
        cli = REPO / path
        if not cli.exists():
            pytest.fail(f"{cli} is missing: scripts/test makes it")
        behaviour.inner.use_hub(self.hub, cli, workdir / "hf-home", hf_transfer=hf_transfer)
        engine = FakeDockerd(engine_dir / "docker.sock", workdir.parent / f"docker{n}.jsonl", behaviour,
                             device_root=twin.device_root).start()
        self.engines.append(engine)
        self.twins.append(twin)
        twin.prepare(user_data, instance_id)
        # The certificate of moto's HTTPS listener, which the twin's AWS CLI trusts (AWS_CA_BUNDLE).
        bundle = twin.path(TWIN_CA_BUNDLE)
        bundle.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.aws.moto.ca_bundle, bundle)
        return twin, imds, behaviour

    def kill(self) -> None:
        """The twins killed and unmounted at once, for a run being stopped by a signal."""
        for twin in self.twins:
            twin.kill()

    def close(self) -> None:
        for twin in self.twins:
            twin.destroy()
        for engine in self.engines:
            engine.stop()
            shutil.rmtree(Path(engine.socket_path).parent, ignore_errors=True)
        for imds in self.imds:
            imds.stop()
        self.hub.stop()
        self.aws.stop()


TWIN_CA_BUNDLE = "/usr/local/share/twin/moto-ca.pem"
"""Where the twin holds the certificate of moto's HTTPS listener (tests/harness/aws.py, MotoServer)."""


def endpoints(aws: AwsEmulator) -> dict[str, str]:
    """The emulator's endpoints, for the twin's default environment: no credentials (the CLI takes the
    instance role's from the metadata service, as on EC2), and the certificate moto serves S3 with, at
    the twin's own path."""
    return {**{k: v for k, v in aws.env.items() if k.startswith("AWS_ENDPOINT_URL") or k.lower() == "no_proxy"},
            "AWS_CA_BUNDLE": TWIN_CA_BUNDLE}


@pytest.fixture
def world(twin_session: None, tmp_path: Path, twin_rootfs: Path) -> Iterator[World]:
    """A network namespace of this test's own; the test's thread runs inside it for the whole test, so
    that the servers it starts (moto, the recorder, the metadata service, the replicas) listen there.
    ``twin_session`` comes first: when no earlier test has made pytest's temporary directory, the
    mounts of killed runs are then reaped before pytest removes those runs' directories."""
    netns = NetNs(f"twin{os.getpid()}-{next(_names)}").create()
    try:
        with on_signal(netns.delete), netns.entered():
            aws = AwsEmulator(tmp_path / "aws", region=REGION, moto_services=(*MOTO_SERVICES, "ec2")).start()
            world = World(tmp_path, netns, twin_rootfs, aws, FakeHub().start())
            try:
                with on_signal(world.kill):
                    yield world
            finally:
                world.close()
    finally:
        netns.delete()


def request(url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
            timeout: float = 30) -> tuple[int, bytes]:
    """One HTTP request from the test (inside the twin's namespace)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def failure_report(twin: Twin) -> str:
    """What a failing twin test shows: the boot log's end and the console's."""
    boot = twin.path("/var/log/neuron-serving/boot.log")
    text = boot.read_text(errors="replace") if boot.exists() else "(no boot log)"
    return "\n".join(text.splitlines()[-40:]) + "\n--- console ---\n" + copy_console_tail(twin)
