"""The inside of the serving image's containers on a simulated host: what huggingface-cli and
optimum-cli do, played by the fake Docker engine (tests/harness/dockerd.py) that the real docker
CLI talks to. Only this stays imitated, as no Neuron compiler or Hub can run here; what the
files are follows the upstream code named below. The argument parsing of the real tools is
tested in tests/harness (optimum-neuron 0.3.0's own parser, huggingface-cli 0.34.4 against a Hub on loopback).

Knobs, per boot (``Host.boot(**knobs)``): ``STUB_EXPORT_SECONDS`` makes the export slow,
``STUB_EXPORT_FAIL`` makes it fail half-way, ``STUB_HF_DOWNLOAD_FAIL`` makes a download fail as
the Hub does for an unknown revision.

What the tools write:

- A model's Hub repository (``CHECKPOINT``): what Meta's Llama 3 repositories hold, including
  Meta's own ``original/`` copy of the weights, which the export does not need.
- An export by optimum-neuron 0.3.0 (:func:`export_files`): ``NxDPreTrainedModel.save`` in
  optimum/neuron/models/inference/backend/pretrained_model.py writes ``config.json``,
  ``neuron_config.json`` (``NxDNeuronConfig``, optimum/neuron/models/inference/backend/config.py,
  ``torch_dtype`` as the dtype's name), the compiled ``model.pt`` and, only when exporting from a
  local checkpoint, ``checkpoint/weights/tp<rank>_sharded_checkpoint.safetensors`` per rank.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.harness.dockerd import BehaviourResult, Bind, command, environment, host_path
from tests.harness.fake_hub import CLIENT_ENV_REMOVE, FakeHub

CHECKPOINT = {
    "config.json": '{"model_type": "llama"}\n',
    "generation_config.json": "{}\n",
    "model-00001-of-00002.safetensors": "weights, first half\n",
    "model-00002-of-00002.safetensors": "weights, second half\n",
    "model.safetensors.index.json": "{}\n",
    "tokenizer.json": "{}\n",
    "tokenizer_config.json": "{}\n",
    "special_tokens_map.json": "{}\n",
    "original/consolidated.00.pth": "Meta's copy of the weights\n",
    "original/params.json": "{}\n",
    "LICENSE": "license\n",
}

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""The torch dtype names optimum-neuron records, kept apart from the library's own table
(neuron_serving.plan.engines.tgi.NEURON_DTYPES) so that a mistake there cannot confirm itself here."""


def export_files(argv: list[str], degree: int, weights: bool) -> dict[str, str]:
    """The files of an export made by ``optimum-cli export neuron`` with ``argv``, compiled for
    ``degree`` cores, holding the weights when ``weights``."""
    neuron_config = {
        "batch_size": int(_value(argv, "--batch_size") or 1),
        "sequence_length": int(_value(argv, "--sequence_length") or 0),
        "tp_degree": degree,
        "torch_dtype": DTYPES.get(_value(argv, "--auto_cast_type") or "", "float32"),
        "checkpoint_id": None if weights else _value(argv, "--model"),
    }
    files = {
        "config.json": '{"model_type": "llama"}\n',
        "neuron_config.json": json.dumps(neuron_config) + "\n",
        "model.pt": "compiled graph\n",
        "tokenizer.json": "{}\n",
        "tokenizer_config.json": "{}\n",
    }
    if weights:
        files.update({f"checkpoint/weights/tp{rank}_sharded_checkpoint.safetensors": f"rank {rank} weights\n"
                      for rank in range(degree)})
    return files


def _value(argv: list[str], flag: str) -> str | None:
    return next(iter(_values(argv, flag)), None)


def _values(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next option (argparse's ``nargs="*"``)."""
    if flag not in argv:
        return []
    rest = argv[argv.index(flag) + 1:]
    return rest[:next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))]


class ServingImage:
    """A Docker engine behaviour: the serving image's tools, steered by per-boot knobs.

    With :meth:`use_hub`, ``huggingface-cli download`` is the real client (the serving image's
    huggingface-hub version, from ``.tools/hub``) against a Hub on loopback
    (tests/harness/fake_hub.py), with the container's arguments and environment.
    """

    def __init__(self) -> None:
        self.knobs: dict[str, str] = {}
        self._hub: tuple[FakeHub, Path, Path] | None = None

    def use_hub(self, hub: FakeHub, cli: Path, home: Path) -> None:
        """Run downloads with the real ``cli`` against ``hub``, with ``home`` as ``HF_HOME``."""
        self._hub = (hub, cli, home)

    def __call__(self, body: dict[str, Any], binds: list[Bind]) -> BehaviourResult:
        argv = command(body)
        if argv[:2] == ["huggingface-cli", "download"] and self._hub is not None:
            return self._real_download(argv, binds, environment(body))
        if argv[:2] == ["huggingface-cli", "download"]:
            return self._download(argv, binds)
        if argv[:3] == ["optimum-cli", "export", "neuron"]:
            devices = len((body.get("HostConfig") or {}).get("Devices") or [])
            return self._export(argv, binds, devices)
        return 0, ""  # a replica: TGI itself is played by the curl stub on loopback

    def _download(self, argv: list[str], binds: list[Bind]) -> BehaviourResult:
        # huggingface-hub 0.34.4 src/huggingface_hub/commands/download.py: only the files that match
        # an --include pattern and no --exclude pattern (fnmatch, src/huggingface_hub/utils/_paths.py).
        repo = argv[2]
        if self.knobs.get("STUB_HF_DOWNLOAD_FAIL"):
            return 1, "", f"huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. Invalid rev id for {repo}\n"
        out = host_path(binds, _values(argv, "--local-dir")[0], write=True)
        include, exclude = _values(argv, "--include") or ["*"], _values(argv, "--exclude")
        files = CHECKPOINT if not repo.endswith("-neuron") else export_files(
            ["--batch_size", "4", "--sequence_length", "4096", "--auto_cast_type", "bf16"], 8, weights=True)
        for name, text in files.items():
            if any(fnmatch.fnmatch(name, p) for p in include) and not any(fnmatch.fnmatch(name, p) for p in exclude):
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                (out / name).write_text(text)
        return 0, f"Fetching files of {repo}\n"

    def _real_download(self, argv: list[str], binds: list[Bind], env: dict[str, str]) -> BehaviourResult:
        assert self._hub is not None
        hub, cli, home = self._hub
        words = list(argv[1:])
        local_dir = words.index("--local-dir") + 1
        words[local_dir] = str(host_path(binds, words[local_dir], write=True))
        clean = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_REMOVE}
        # The image sets HF_HUB_ENABLE_HF_TRANSFER=1 (TGI v3.3.5 Dockerfile.neuron).
        client = {**clean, **hub.client_env(home, token=env.get("HF_TOKEN"), hf_transfer=True)}
        done = subprocess.run([str(cli), *words], env=client, capture_output=True, text=True, timeout=120,
                              check=False)
        return done.returncode, done.stdout, done.stderr

    def _export(self, argv: list[str], binds: list[Bind], devices: int) -> BehaviourResult:
        model = _values(argv, "--model")[0]
        if model.startswith("/") and not (host_path(binds, model) / "config.json").is_file():
            return 1, "", f"OSError: {model} does not appear to have a file named config.json\n"
        out = host_path(binds, argv[-1], write=True)
        out.mkdir(parents=True, exist_ok=True)
        said = f"compiling {model} into {argv[-1]}\n"
        time.sleep(float(self.knobs.get("STUB_EXPORT_SECONDS", "0")))
        (out / "model.pt").write_text("compiled graph\n")
        if self.knobs.get("STUB_EXPORT_FAIL"):
            return 1, said, "neuronx-cc: error: compilation failed\n"
        # optimum-neuron 0.3.0: only --num_cores reaches the exporter; without it, every core the
        # container sees (optimum/neuron/utils/system.py get_available_cores: 2 per /dev/neuronN).
        cores = _values(argv, "--num_cores")
        degree = int(cores[0]) if cores else 2 * devices
        for name, text in export_files(argv, degree, weights=model.startswith("/")).items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        return 0, said
