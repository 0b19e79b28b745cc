"""The simulated host the boot scripts run on (fixtures in conftest.py).

A temporary directory is the filesystem root (``NEURON_SERVING_ROOT``) with fake ``/dev/neuronN``
nodes; ``tests/boot/stubs`` comes first on ``PATH`` with stand-ins for what a test machine lacks
(systemd, apt, snap, the instance metadata service, TGI and the router on loopback, neuron-ls,
haproxy) and for ``sleep``, so that retries take no time. Each stub records its argv in a calls log.
The ``docker`` stub hands the call to the real docker CLI against a recording engine, and ``aws`` is
the real AWS CLI v2 (``host_aws.py``, which records the call too) against the test's moto and recorder
(tests/harness/aws.py): hosts made by one test share that AWS, as the instances of one fleet share the
artifact cache; each is an instance of its EC2.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from inside import ServingImage, export_files

from neuron_serving.plan import ServingPlan, ServingRequest, plan_serving
from neuron_serving.plan.metrics import MonitoringOptions
from neuron_serving.plan.phases import DETAIL_TAG, PHASE_TAG, PHASES_FILE
from neuron_serving.render.boot import HostBoot
from neuron_serving.render.boot_options import ReadinessSignal, WarmPoolHook
from tests.harness.aws import AwsEmulator, Fault
from tests.harness.dockerd import FakeDockerd
from tests.harness.userdata import deployed_metadata, zipped_boot

STUBS = Path(__file__).parent / "stubs"
HOST_AWS = Path(__file__).parent / "host_aws.py"
"""A simulated host's ``aws``: records the call, then runs the real AWS CLI v2."""
ROOT_MOUNT = "/dev/nvme0n1p1 / ext4 rw,relatime 0 0\n"
"""The simulated host's ``/proc/self/mounts`` (proc_pid_mounts(5): source, mount point, type, options,
two zeros): the root volume, an EBS NVMe drive's first partition as on EC2's Ubuntu images."""


CLI_ATTEMPTS = 3
"""How many times AWS CLI v2 sends a request that fails with a retryable error (its default retry mode,
``standard``, makes 3 attempts: AWS SDKs and Tools reference guide, "Retry behavior")."""


def _secret_json(cloud: AwsEmulator, _: str) -> None:
    token = json.dumps({"HF_TOKEN": FAKE_HF_TOKEN})
    for name in HF_SECRETS:
        cloud.client("secretsmanager").put_secret_value(SecretId=name, SecretString=token)


AWS_KNOBS: dict[str, Callable[[AwsEmulator, str], object]] = {
    # CloudFormation refuses a signal no create or update awaits.
    "STUB_SIGNAL_FAIL": lambda cloud, _: cloud.recorder.fail_signal(),
    # Auto Scaling refuses a lifecycle action for an instance with none pending.
    "STUB_LIFECYCLE_FAIL": lambda cloud, _: cloud.recorder.fail_lifecycle(),
    # IAM refuses the calls a role may not make, as each service answers it.
    "STUB_TERMINATE_FAIL": lambda cloud, _: cloud.recorder.fail(
        "TerminateInstanceInAutoScalingGroup", "User is not authorized to perform: "
        "autoscaling:TerminateInstanceInAutoScalingGroup", code="AccessDenied", status=403),
    "STUB_TAGS_FAIL": lambda cloud, _: cloud.moto.fail(Fault.ec2(
        "CreateTags", 403, "UnauthorizedOperation", "You are not authorized to perform this operation.")),
    "STUB_METRICS_FAIL": lambda cloud, _: cloud.moto.fail(Fault.json(
        "monitoring", "PutMetricData", 403, "AccessDenied",
        "User is not authorized to perform: cloudwatch:PutMetricData")),
    # The publish's conditional write of COMPLETE, refused.
    "STUB_PUT_OBJECT_DENIED": lambda cloud, _: cloud.moto.fail(Fault.s3(
        403, "AccessDenied", "Access Denied", method="PUT", path="*/COMPLETE")),
    # Every upload of a publish's files (below exports/<key>/<instance id>/), refused.
    "STUB_S3_UPLOAD_DENIED": lambda cloud, _: cloud.moto.fail(Fault.s3(
        403, "AccessDenied", "Access Denied", method="PUT", path="/*/exports/*/i-*/*")),
    # The first N downloads of a tree (``aws s3 sync`` from S3) fail: S3 answers their listing with a 500,
    # which the CLI retries CLI_ATTEMPTS times in all before it gives up.
    "STUB_S3_SYNC_FAILURES": lambda cloud, n: cloud.moto.fail(Fault.s3(
        500, "InternalError", "We encountered an internal error. Please try again.", method="GET",
        query="list-type=2", times=int(n) * CLI_ATTEMPTS)),
    # The Hugging Face token stored as a JSON object ({"HF_TOKEN": ...}), as some teams store it.
    "STUB_SECRET_JSON": _secret_json,
}
"""The knobs a test hands a host's scripts that AWS answers (:meth:`Host.steer`): each makes the test's
moto or recorder answer as AWS would in that case, and the real CLI reads that answer."""


def stub_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"boot_stub_{name}", STUBS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stub_constant(name: str) -> str:
    return str(getattr(stub_module("_stub"), name))


def write_export(directory: Path, plan: ServingPlan, *, degree: int | None = None, weights: bool = True) -> None:
    """Write into ``directory`` what optimum-neuron 0.3.0 writes when it exports for ``plan``
    (compiled for ``degree`` cores, the plan's by default), as the stand-in of the serving image
    does (``inside.py``)."""
    argv = ["--model", plan.model_id, "--batch_size", str(plan.batch_size), "--sequence_length",
            str(plan.sequence_length), "--auto_cast_type", plan.dtype]
    for name, body in export_files(argv, degree or plan.degree, weights).items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(body)


def manifest(upload: Path) -> list[str]:
    """The manifest of an upload, as its publisher lists it in ``COMPLETE``: ``sha256sum``'s line
    (``<sha256>  <path>``) for each file, the path relative to ``upload``, lines sorted bytewise."""
    return sorted(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(upload).as_posix()}"
                  for f in upload.rglob("*") if f.is_file())


def complete_marker(prefix: str, upload: Path) -> str:
    """What a publisher writes to ``<key>/COMPLETE`` for the upload ``prefix`` (``exports/<key>/<instance
    id>``) whose files are those of ``upload``: the prefix, then the manifest."""
    return "\n".join([prefix, *manifest(upload)]) + "\n"


FAKE_HF_TOKEN = _stub_constant("FAKE_HF_TOKEN")
"""The token the test's Secrets Manager holds in the secrets :data:`HF_SECRETS` (conftest.py's ``aws``)."""

HF_SECRETS = ("hf", "neuron-serving/hf-token")

SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:neuron-serving/hf-token-AbCdEf"
"""A realistic (long) secret id: the size checks use it because it is the worst case."""


EXPORTS = "/var/lib/neuron-serving/exports"
MARKER = ".neuron-serving-complete"
BOOT_LOG = "/var/log/neuron-serving/boot.log"
"""Where a host keeps its exports, the name of an export's completion marker, and the boot's log."""

CACHE = "s3://cache-bucket/exports"
"""The artifact cache the fleet tests share (in the hosts' fake S3)."""

CACHE_TOKEN = "s3://${Token[TOKEN.123]}/exports"
"""The artifact cache as the stack passes it at synth: the bucket name an unresolved CDK token."""

SIGNAL = ReadinessSignal(stack_name="NeuronLlamaStack", logical_id="NeuronServingFleet")
HOOK = WarmPoolHook(hook_name="neuron-serving-launch", group_name="NeuronLlamaStack-NeuronServingFleet")
"""As the stack names them."""

LOG_GROUPS = {"boot": "NeuronLlamaStack-BootLogs#1", "replicas": "/neuron-serving/NeuronLlamaStack/replicas",
              "router": "/neuron-serving/NeuronLlamaStack/router",
              "metrics": "/neuron-serving/NeuronLlamaStack/metrics"}
MONITORING = MonitoringOptions(service="NeuronLlamaStack", log_groups=LOG_GROUPS)
"""Monitoring as the stack configures it, its names resolved; one has a ``#``, which the shell
and systemd read only quoted."""

MONITORING_TOKENS = MonitoringOptions(
    service="${Token[TOKEN.200]}",
    log_groups={kind: f"${{Token[TOKEN.20{n}]}}" for n, kind in enumerate(LOG_GROUPS, start=1)},
)
"""Monitoring as the stack passes it at synth: the service and every log group name unresolved."""

PUBLISHER_SOURCE = Path(__file__).resolve().parents[2] / "userdata" / "publish_metrics.py"
"""The metrics publisher, which the boot bundle carries."""

BUNDLE_BUCKET = "cdk-assets"
BUNDLE_REGION = "us-east-2"
"""Where a rendered boot's bundle is published for a simulated host, as the CDK's asset publishing
would: the bootstrap bucket of the stack's region."""

HOST_STACK = "NeuronLlamaStack"
"""The stack whose resource's metadata holds a rendered boot's values for a simulated host."""


def host_resource(boot: HostBoot) -> str:
    """The logical id of the launch template whose metadata holds ``boot``'s values: one per bundle,
    as a stack's builder and serving hosts each have theirs, in the form of ``HostF593FDA4``."""
    return f"Host{boot.digest[:8].upper()}"

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL_MODEL = "meta-llama/Llama-3.2-1B-Instruct"
"""For inf2.xlarge and trn1.2xlarge, whose host memory is too small to export an 8B model."""


def make_plan(instance_type: str, tensor_parallel: int | None = None, model_id: str = MODEL) -> ServingPlan:
    return plan_serving(ServingRequest(model_id, instance_type, tensor_parallel=tensor_parallel))


def _boot_script_call(argv: list[str]) -> bool:
    """The boot script's own calls: the stack's values (its host resource's metadata), then the bundle."""
    return (argv[:2] == ["s3", "cp"] and any(a.startswith(f"s3://{BUNDLE_BUCKET}/") for a in argv)) or (
        argv[:2] == ["cloudformation", "describe-stack-resource"] and "--query" in argv)


@dataclass
class Host:
    """One simulated instance: its root directory, its stubs' calls, and ways to run scripts."""

    root: Path
    calls_log: Path
    env: dict[str, str]
    engine: FakeDockerd
    """This host's Docker engine, which the real docker CLI talks to."""
    inside: ServingImage
    """What runs inside its containers."""
    cloud: AwsEmulator
    """The test's AWS, which every host of the test shares: moto and the recorder."""
    faults: list[Fault] = field(default_factory=list)
    """Errors moto answers whenever this host's scripts run, beside those of their knobs (:meth:`steer`)."""

    def path(self, host_path: str) -> Path:
        """Where ``host_path`` (an absolute path on the instance) lives under the test root."""
        return self.root / host_path.lstrip("/")

    @property
    def instance_id(self) -> str:
        return self.env["STUB_INSTANCE_ID"]

    def boot(self, script: HostBoot | str, **knobs: str) -> subprocess.CompletedProcess[str]:
        """Run ``script`` as cloud-init would run user data (as a file, under bash): a rendered boot's
        user data, once its bundle is published (:meth:`publish_bundle`), or a synthesized one."""
        return self._run(["bash", str(self._user_data(script))], knobs)

    def publish(self, uri: str, body: bytes | str) -> None:
        """Put ``body`` at ``uri`` (``s3://bucket/key``) in the test's S3 (the bucket made when new)."""
        self.cloud.put_s3_uri(uri, body)

    def publish_tree(self, uri: str, directory: Path) -> None:
        """Put every file below ``directory`` under the prefix ``uri`` (``s3://bucket/prefix``), as ``aws s3
        sync`` would upload it."""
        for f in sorted(p for p in directory.rglob("*") if p.is_file()):
            self.publish(f"{uri.rstrip('/')}/{f.relative_to(directory).as_posix()}", f.read_bytes())

    def staging(self, name: str) -> Path:
        """A fresh directory of this test, outside the host, to write files in before publishing them."""
        directory = self.root.parent / "staging" / name
        directory.mkdir(parents=True)
        return directory

    def s3_object(self, uri: str) -> bytes | None:
        """The object at ``uri`` in the test's S3, or None."""
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        return self.cloud.get_object(bucket, key)

    def s3_keys(self, uri: str) -> list[str]:
        """Every key below the prefix ``uri``, relative to it, sorted."""
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        prefix = prefix.rstrip("/") + "/"
        return [k.removeprefix(prefix) for k in self.cloud.list_objects(bucket, prefix)]

    def download_tree(self, uri: str) -> Path:
        """The objects below the prefix ``uri`` copied into a fresh directory of this test, keys as paths."""
        directory = Path(tempfile.mkdtemp(prefix="download-", dir=self.root.parent))
        for key in self.s3_keys(uri):
            target = directory / key
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.s3_object(f"{uri.rstrip('/')}/{key}") or b"")
        return directory

    def put_metadata(self, stack: str, logical_id: str, metadata: str) -> None:
        """Deploy ``stack``'s resource ``logical_id`` with ``metadata`` (a JSON string) in the test's
        CloudFormation, which DescribeStackResource returns."""
        self.cloud.put_metadata(stack, logical_id, metadata)

    def publish_bundle(self, boot: HostBoot) -> str:
        """Publish ``boot``'s bundle as the stack's asset would be and deploy the metadata of its host
        resource (the stack's values) as CloudFormation would, and return its user data."""
        uri = f"s3://{BUNDLE_BUCKET}/{boot.digest}.zip"
        self.publish(uri, zipped_boot(boot, self.root.parent))
        self.put_metadata(HOST_STACK, host_resource(boot), deployed_metadata(boot))
        return boot.user_data(BUNDLE_REGION, HOST_STACK, host_resource(boot), uri)

    def boot_async(self, script: HostBoot | str, **knobs: str) -> subprocess.Popen[str]:
        """Start booting with ``script``; the caller waits."""
        self.steer(knobs)
        return subprocess.Popen(["bash", str(self._user_data(script))], env={**self.env, **knobs},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def steer(self, knobs: dict[str, str]) -> None:
        """Hand the knobs to what the environment does not reach: the Docker engine, the inside of its
        containers, and AWS (:data:`AWS_KNOBS`: from now on, until the test ends or another run of this
        host's scripts hands other knobs)."""
        self.inside.knobs = dict(knobs)
        self.engine.pull_failures = int(knobs.get("STUB_DOCKER_PULL_FAILURES", "0"))
        self.cloud.moto.clear_faults()
        self.cloud.recorder.clear_failures()
        for fault in self.faults:
            self.cloud.moto.fail(fault)
        for name, value in knobs.items():
            if name in AWS_KNOBS and value:
                AWS_KNOBS[name](self.cloud, value)

    def containers(self) -> list[dict[str, Any]]:
        """What the docker CLI asked the engine to create, in order (tests/harness/dockerd.py)."""
        return [r["container"] for r in self.engine.records if r["kind"] == "request" and "container" in r]

    def _user_data(self, script: HostBoot | str) -> Path:
        if isinstance(script, HostBoot):
            script = self.publish_bundle(script)
        user_data = self.path("/var/lib/cloud/instance/user-data.txt")
        user_data.parent.mkdir(parents=True, exist_ok=True)
        user_data.write_text(script)
        return user_data

    def run_unit(self, unit: str, **knobs: str) -> int:
        """Run ``unit``'s ExecStart lines in order, as systemd runs a oneshot service (a ``-``
        prefix ignores a failure); the exit status of the first that fails, else 0."""
        for line in self.path(f"/etc/systemd/system/{unit}").read_text().splitlines():
            if line.startswith("ExecStart="):
                command = line.removeprefix("ExecStart=")
                path, *args = command.lstrip("-").split()
                rc = self.run(path, *args, **knobs).returncode
                if rc and not command.startswith("-"):
                    return rc
        return 0

    def run_script(self, text: str, **knobs: str) -> subprocess.CompletedProcess[str]:
        """Run ``text`` as a bash script file as root would, as EC2 Image Builder's ``ExecuteBash`` runs a
        component's commands (the bake, userdata/bake.sh.j2)."""
        script = self.root.parent / "script.sh"
        script.write_text(text)
        return self._run(["bash", str(script)], knobs)

    def run(self, host_path: str, *args: str, **knobs: str) -> subprocess.CompletedProcess[str]:
        """Run a script the boot wrote, as systemd would (its path on the instance)."""
        return self._run([str(self.path(host_path)), *args], knobs)

    def start(self, host_path: str, *args: str, **knobs: str) -> subprocess.Popen[str]:
        self.steer(knobs)
        return subprocess.Popen([str(self.path(host_path)), *args], env={**self.env, **knobs},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def _run(self, argv: list[str], knobs: dict[str, str]) -> subprocess.CompletedProcess[str]:
        self.steer(knobs)
        return subprocess.run(argv, env={**self.env, **knobs}, capture_output=True, text=True,
                              timeout=240, check=False)

    def calls(self, cmd: str | None = None, *, bundle: bool = False) -> list[list[str]]:
        """The argv of every stub call so far (of ``cmd`` only, when given), in order; the boot
        script's reading of the stack's values and download of the bundle (:meth:`publish_bundle`),
        which every boot makes first, only with ``bundle``."""
        return [argv for name, argv in self.entries() if (cmd is None or name == cmd)
                and (bundle or not (name == "aws" and _boot_script_call(argv)))]

    def entries(self) -> list[tuple[str, list[str]]]:
        """Every stub call so far as ``(command, argv)``, in order."""
        if not self.calls_log.exists():
            return []
        entries = [json.loads(line) for line in self.calls_log.read_text().splitlines()]
        return [(e["cmd"], e["argv"]) for e in entries]

    def forget_calls(self) -> None:
        """Start a new calls log, as for a new boot of the same instance."""
        self.calls_log.unlink(missing_ok=True)

    def aws(self, service: str, action: str) -> list[list[str]]:
        """The ``aws SERVICE ACTION ...`` calls so far."""
        return [a for a in self.calls("aws") if a[:2] == [service, action]]

    def phases(self) -> list[tuple[str, str]]:
        """The ``(phase, detail)`` of each boot phase reported so far (``aws ec2 create-tags`` of
        ``report-phase``), in order."""
        return [(tags[PHASE_TAG], tags[DETAIL_TAG]) for tags in self.tag_reports() if PHASE_TAG in tags]

    def tag_reports(self) -> list[dict[str, str]]:
        """The tags of each ``aws ec2 create-tags`` call so far (``report-phase``), in order: a phase's
        four, or, when the boot ends with none of the phases that end it, the phases' seconds alone."""
        return [{t["Key"]: t["Value"] for t in json.loads(argv[argv.index("--tags") + 1])}
                for argv in self.aws("ec2", "create-tags")]

    def phase_lines(self) -> list[tuple[str, str, str, int]]:
        """The host's record of the phases it finished (``PHASES_FILE``): name, start, end, seconds."""
        path = self.path(PHASES_FILE)
        lines = path.read_text().splitlines() if path.exists() else []
        return [(name, start, end, int(seconds)) for name, start, end, seconds in (line.split("\t") for line in lines)]

    def metric_data(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """Each ``aws cloudwatch put-metric-data`` call so far: its namespace and its data."""
        return [(argv[argv.index("--namespace") + 1], json.loads(argv[argv.index("--metric-data") + 1]))
                for argv in self.aws("cloudwatch", "put-metric-data")]

    def exports(self) -> list[list[str]]:
        """The ``docker run`` calls that compiled the model (not the ``--help`` probes)."""
        return [a for a in self.calls("docker")
                if a[0] == "run" and "optimum-cli" in a and "export" in a and "--help" not in a]

    def started_units(self) -> list[str]:
        return [a[-1] for a in self.calls("systemctl") if a[:2] == ["enable", "--now"]]


AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
"""The CloudWatch agent's control script, which the apt-get stub installs from the agent's package."""

AGENT_DEB = "amazon-cloudwatch-agent.deb"
AGENT_KEY = "amazon-cloudwatch-agent.gpg"
"""The names of the CloudWatch agent's package and of AWS's key file, under which the curl stub
serves them (with the package's signature, ``.deb.sig``) from ``$STUB_AGENT_FILES``."""

Key = Literal["pinned", "other"]
"""One of :class:`SigningKeys`."""

FAKE_AGENT_PACKAGE = b"!<arch>\ndebian-binary   fake amazon-cloudwatch-agent package\n"


class SigningKeys:
    """Two throwaway OpenPGP keys (ed25519, no passphrase) the real gpg makes in a directory of
    their own: ``pinned`` stands for AWS's CloudWatch agent key (tests render its fingerprint as
    the one the host trusts), ``other`` for anyone else's. :meth:`close` stops the gpg-agent that
    signing started."""

    def __init__(self, home: Path) -> None:
        self.home = home
        home.mkdir(mode=0o700)
        self.pinned = self._new_key("Test CloudWatch Agent")
        self.other = self._new_key("Someone Else")

    def _gpg(self, *args: str) -> str:
        gpg = require(shutil.which("gpg"), "install Debian's gnupg")
        return subprocess.run([gpg, "--homedir", str(self.home), "--batch", "--quiet", *args],
                              capture_output=True, text=True, check=True).stdout

    def _new_key(self, name: str) -> str:
        status = self._gpg("--status-fd", "1", "--passphrase", "", "--quick-gen-key", name, "ed25519", "sign", "never")
        [fingerprint] = re.findall(r"^\[GNUPG:\] KEY_CREATED P ([0-9A-F]{40})$", status, re.MULTILINE)
        return fingerprint

    def fingerprint(self, key: Key) -> str:
        return self.pinned if key == "pinned" else self.other

    def agent_files(self, directory: Path, *, signer: Key | None = "pinned", key_file: tuple[Key, ...] = ("pinned",),
                    package: bytes = FAKE_AGENT_PACKAGE) -> dict[str, str]:
        """Write into ``directory`` what AWS's buckets hold: :data:`FAKE_AGENT_PACKAGE`, its
        detached signature by ``signer`` (``pinned`` or ``other``; None: no signature) and a key
        file holding the keys ``key_file`` names (armored, as gpg exports them); then replace the package with
        ``package``. Returns the knob that makes the curl stub serve them."""
        directory.mkdir(parents=True, exist_ok=True)
        deb = directory / AGENT_DEB
        deb.write_bytes(FAKE_AGENT_PACKAGE)
        if signer is not None:
            self._gpg("--yes", "--local-user", self.fingerprint(signer), "--output", f"{deb}.sig",
                      "--detach-sign", str(deb))
        (directory / AGENT_KEY).write_text(self._gpg("--armor", "--export", *map(self.fingerprint, key_file)))
        deb.write_bytes(package)
        return {"STUB_AGENT_FILES": str(directory)}

    def close(self) -> None:
        subprocess.run(["gpgconf", "--kill", "all"], env={**os.environ, "GNUPGHOME": str(self.home)}, check=False)


def install_agent(host: Host) -> None:
    """The CloudWatch agent as an image that ships it has it."""
    ctl = host.path(AGENT_CTL)
    ctl.parent.mkdir(parents=True)
    ctl.symlink_to(STUBS / "amazon-cloudwatch-agent-ctl")


def require(tool: str | Path | None, install: str) -> str:
    """``tool`` (a path, or None when it was not found) when it exists; otherwise fail in CI,
    which must have every tool, and skip elsewhere, saying how to get it (``install``)."""
    if tool is not None and Path(tool).exists():
        return str(tool)
    if os.environ.get("CI"):
        pytest.fail(f"{tool or 'a tool'} is required in CI: {install}")
    pytest.skip(f"{tool or 'a tool'} is missing: {install}")
