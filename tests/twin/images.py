"""What runs inside the twin's containers: the recording engine's behaviour for a twin.

The twin's docker CLI names paths of the twin (``-v /var/lib/neuron-serving/exports:/data``); the
engine runs outside it, so every bind is read through the twin's root. The export and the downloads
are the serving image's tools as tests/boot/inside.py plays them (optimum-neuron's files, the real
huggingface-cli against the loopback Hub). A replica container (one with a published port, which only
``run-replica`` gives) runs the serving engine's server checks on what it was given, then serves:

- TGI (text-generation-inference v3.3.5 neuron image): the launcher reads ``MODEL_ID``; the Neuron
  backend's settings are ``HF_NUM_CORES``, ``HF_AUTO_CAST_TYPE``, ``MAX_BATCH_SIZE``, ``MAX_TOTAL_TOKENS``,
  ``MAX_INPUT_TOKENS`` and ``MAX_BATCH_PREFILL_TOKENS`` (backends/neuron/server/text_generation_server/
  tgi_env.py, ``tgi_env_vars``), and it serves the export's ``neuron_config.json`` only when
  ``check_env_and_neuron_config_compatibility`` accepts it (:meth:`TwinImage._tgi_problem`). Then
  :class:`FakeTgi` on the published host port, in the twin's namespace.
- vLLM (optimum-neuron 0.4.5 image): ``optimum-cli neuron serve``'s checks as inside.py's
  :class:`VllmImage` makes them, then :class:`FakeVllm`.
- vLLM on NxD Inference (AWS's Deep Learning Container): ``vllm serve`` loads the export as inside.py's
  :class:`NxdiImage` plays the vllm-neuron plugin (a replica that finds no finished compile fails on the
  read-only export), then :class:`FakeVllm`, vLLM's server, as the served model.

Knobs (:attr:`TwinImage.knobs`): ``TWIN_REPLICA_CRASH=<container name>`` makes that replica fail to load
its model as a Neuron runtime error does (exit 1 before it listens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
for _dir in ("tests/router", "tests/boot"):
    if str(REPO / _dir) not in sys.path:
        sys.path.insert(0, str(REPO / _dir))

from fake_tgi import FakeTgi  # noqa: E402
from fake_vllm import FakeVllm  # noqa: E402
from inside import (  # noqa: E402
    CHECKPOINT,
    EAGLE_DRAFT,
    NXDI_IMAGE,
    VLLM_IMAGE,
    NxdiImage,
    ServingImage,
    VllmImage,
    _value,
)
from test_boot_export import HUB_CLIS  # noqa: E402

from tests.harness.dockerd import BehaviourResult, Bind, command, container_name, emit, environment, host_path, sleep  # noqa: E402

__all__ = ["CHECKPOINT", "EAGLE_DRAFT", "HUB_CLIS", "TwinImage"]

TGI_REQUIRED = ("MODEL_ID", "HF_NUM_CORES", "HF_AUTO_CAST_TYPE", "MAX_BATCH_SIZE", "MAX_TOTAL_TOKENS",
                "MAX_INPUT_TOKENS", "MAX_BATCH_PREFILL_TOKENS")


class TwinImage:
    """The engine's behaviour for one twin whose root is ``root``."""

    def __init__(self, root: Path, inner: ServingImage | None = None) -> None:
        self.root = root
        self.inner = inner or ServingImage()
        self.knobs: dict[str, str] = {}
        self.serving: dict[str, FakeTgi] = {}
        """The replicas serving now, by container name."""

    def __call__(self, body: dict[str, Any], binds: list[Bind]) -> BehaviourResult:
        binds = [Bind(str(self.root / b.host.lstrip("/")), b.container, b.read_only) for b in binds]
        ports = (body.get("HostConfig") or {}).get("PortBindings") or {}
        if not ports:
            self.inner.knobs = self.knobs
            return self.inner(body, binds)
        (binding,) = [b for bs in ports.values() for b in bs]
        port = int(binding["HostPort"])
        devices = len((body.get("HostConfig") or {}).get("Devices") or [])
        env = environment(body)
        image = body.get("Image", "")
        container = container_name() or "replica"
        if self.knobs.get("TWIN_REPLICA_CRASH") == container:
            return 1, "", "RuntimeError: nrt_load failed: NRT_RESOURCE (the replica could not load its model)\n"
        if image.startswith(VLLM_IMAGE):
            code, out, *err = VllmImage(self.knobs).run(command(body), binds, devices, env)
            if code != 0:
                return code, out, *err
            served = _value(VllmImage.entry_point(command(body), env), "--served_model_name")
            server: FakeTgi = FakeVllm(container, port, served_model=served or "")
        elif image.startswith(NXDI_IMAGE):
            # `vllm serve <export> --served-model-name <id> ...` (Nxdi.replica_command), loaded, not compiled.
            argv = command(body)
            code, out, *err = NxdiImage(self.knobs).run(argv, binds, devices, env)
            if code != 0:
                return code, out, *err
            server = FakeVllm(container, port, served_model=_value(argv, "--served-model-name") or "")
        else:
            problem = self._tgi_problem(env, binds, devices)
            if problem:
                return 1, "", problem + "\n"
            server = FakeTgi(container, port)
        server.start()
        self.serving[container] = server
        emit(f"{container}: serving on port {port}\n")
        try:
            while sleep(3600):
                pass
        finally:
            server.stop()
            self.serving.pop(container, None)
        return 0, ""

    @staticmethod
    def _tgi_problem(env: dict[str, str], binds: list[Bind], devices: int) -> str | None:
        # The boot gives every setting (TGI itself would guess the missing ones from the Hub cache and
        # pick wrong: TGI #3299), so a missing one is refused here.
        missing = [k for k in TGI_REQUIRED if not env.get(k)]
        if missing:
            return f"tgi_env: {', '.join(missing)} not set"
        try:
            config = json.loads((host_path(binds, env["MODEL_ID"]) / "neuron_config.json").read_text())
        except (OSError, ValueError) as error:
            return f"No compatible neuron model found for {env['MODEL_ID']}: {error}"
        # text-generation-inference v3.3.5 backends/neuron/server/text_generation_server/tgi_env.py,
        # check_env_and_neuron_config_compatibility: the export's degree within the cores available
        # (2 per /dev/neuronN, optimum-neuron's get_available_cores), its batch and sequence at least
        # the settings', its degree at least HF_NUM_CORES, the same dtype, and a longer sequence than
        # MAX_INPUT_TOKENS. The compiler version is checked only for Hub-cached exports.
        dtypes = {"bf16": "bfloat16", "fp16": "float16"}
        checks = {
            "tp_degree within the available cores": config.get("tp_degree", 0) <= 2 * devices,
            "batch_size >= MAX_BATCH_SIZE": config.get("batch_size", 0) >= int(env["MAX_BATCH_SIZE"]),
            "sequence_length >= MAX_TOTAL_TOKENS": config.get("sequence_length", 0) >= int(env["MAX_TOTAL_TOKENS"]),
            "tp_degree >= HF_NUM_CORES": config.get("tp_degree", 0) >= int(env["HF_NUM_CORES"]),
            "dtype is HF_AUTO_CAST_TYPE": dtypes.get(config.get("torch_dtype", ""), config.get("torch_dtype"))
            == dtypes.get(env["HF_AUTO_CAST_TYPE"], env["HF_AUTO_CAST_TYPE"]),
            "sequence_length > MAX_INPUT_TOKENS": config.get("sequence_length", 0) > int(env["MAX_INPUT_TOKENS"]),
        }
        failed = [name for name, ok in checks.items() if not ok]
        if failed:
            return f"No compatible neuron model in {env['MODEL_ID']} ({', '.join(failed)}): {config}"
        return None
