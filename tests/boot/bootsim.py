"""The simulated host the boot scripts run on (fixtures in conftest.py).

A temporary directory is the filesystem root (``NEURON_SERVING_ROOT``) with fake ``/dev/neuronN``
nodes; ``tests/boot/stubs`` comes first on ``PATH`` with stand-ins for what a test machine lacks
(docker, the AWS CLI, systemd, apt, snap, the instance metadata service, neuron-ls, haproxy) and
for ``sleep``, so that retries take no time. Each stub records its argv in a calls log.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from neuron_serving.plan import ServingPlan, ServingRequest, plan_serving

STUBS = Path(__file__).parent / "stubs"


def _stub_constant(name: str) -> str:
    spec = importlib.util.spec_from_file_location("boot_stub_common", STUBS / "_stub.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(getattr(module, name))


FAKE_HF_TOKEN = _stub_constant("FAKE_HF_TOKEN")
"""The token the aws stub hands out as the secret's value."""

SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:neuron-serving/hf-token-AbCdEf"
"""A realistic (long) secret id: the size checks use it because it is the worst case."""


MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SMALL_MODEL = "meta-llama/Llama-3.2-1B-Instruct"
"""For inf2.xlarge and trn1.2xlarge, whose host memory is too small to export an 8B model."""


def make_plan(instance_type: str, tensor_parallel: int | None = None, model_id: str = MODEL) -> ServingPlan:
    return plan_serving(ServingRequest(model_id, instance_type, tensor_parallel=tensor_parallel))


@dataclass
class Host:
    """One simulated instance: its root directory, its stubs' calls, and ways to run scripts."""

    root: Path
    calls_log: Path
    env: dict[str, str]

    def path(self, host_path: str) -> Path:
        """Where ``host_path`` (an absolute path on the instance) lives under the test root."""
        return self.root / host_path.lstrip("/")

    def boot(self, script: str, **knobs: str) -> subprocess.CompletedProcess[str]:
        """Run ``script`` as cloud-init would run user data (as a file, under bash)."""
        user_data = self.path("/var/lib/cloud/instance/user-data.txt")
        user_data.parent.mkdir(parents=True, exist_ok=True)
        user_data.write_text(script)
        return self._run(["bash", str(user_data)], knobs)

    def run(self, host_path: str, *args: str, **knobs: str) -> subprocess.CompletedProcess[str]:
        """Run a script the boot wrote, as systemd would (its path on the instance)."""
        return self._run([str(self.path(host_path)), *args], knobs)

    def start(self, host_path: str, *args: str, **knobs: str) -> subprocess.Popen[str]:
        return subprocess.Popen([str(self.path(host_path)), *args], env={**self.env, **knobs},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def _run(self, argv: list[str], knobs: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env={**self.env, **knobs}, capture_output=True, text=True,
                              timeout=60, check=False)

    def calls(self, cmd: str | None = None) -> list[list[str]]:
        """The argv of every stub call so far (of ``cmd`` only, when given), in order."""
        if not self.calls_log.exists():
            return []
        entries = [json.loads(line) for line in self.calls_log.read_text().splitlines()]
        return [e["argv"] for e in entries if cmd is None or e["cmd"] == cmd]

    def exports(self) -> list[list[str]]:
        """The ``docker run`` calls that compiled the model (not the ``--help`` probes)."""
        return [a for a in self.calls("docker")
                if a[0] == "run" and "optimum-cli" in a and "export" in a and "--help" not in a]

    def started_units(self) -> list[str]:
        return [a[-1] for a in self.calls("systemctl") if a[:2] == ["enable", "--now"]]
