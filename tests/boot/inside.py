"""The inside of the serving image's containers on a simulated host: what huggingface-cli and
optimum-cli do, played by the fake Docker engine (tests/harness/dockerd.py) that the real docker
CLI talks to. Only this stays imitated, as no Neuron compiler or Hub can run here; what the
files are follows ``stubs/_container.py``, and each behaviour names the upstream code it imitates.
The argument parsing of the real tools is tested in tests/harness (optimum-neuron 0.3.0's own
parser, huggingface-cli 0.34.4 against a Hub on loopback).

Knobs, per boot (``Host.boot(**knobs)``): ``STUB_EXPORT_SECONDS`` makes the export slow,
``STUB_EXPORT_FAIL`` makes it fail half-way, ``STUB_HF_DOWNLOAD_FAIL`` makes a download fail as
the Hub does for an unknown revision.
"""

from __future__ import annotations

import fnmatch
import time
from typing import Any

from bootsim import stub_module

from tests.harness.dockerd import BehaviourResult, Bind, command, host_path

_container = stub_module("_container")


def _values(argv: list[str], flag: str) -> list[str]:
    """The words after ``flag`` up to the next option (argparse's ``nargs="*"``)."""
    if flag not in argv:
        return []
    rest = argv[argv.index(flag) + 1:]
    return rest[:next((i for i, word in enumerate(rest) if word.startswith("--")), len(rest))]


class ServingImage:
    """A Docker engine behaviour: the serving image's tools, steered by per-boot knobs."""

    def __init__(self) -> None:
        self.knobs: dict[str, str] = {}

    def __call__(self, body: dict[str, Any], binds: list[Bind]) -> BehaviourResult:
        argv = command(body)
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
        files = _container.CHECKPOINT if not repo.endswith("-neuron") else _container.export_files(
            ["--batch_size", "4", "--sequence_length", "4096", "--auto_cast_type", "bf16"], 8, weights=True)
        for name, text in files.items():
            if any(fnmatch.fnmatch(name, p) for p in include) and not any(fnmatch.fnmatch(name, p) for p in exclude):
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                (out / name).write_text(text)
        return 0, f"Fetching files of {repo}\n"

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
        for name, text in _container.export_files(argv, degree, weights=model.startswith("/")).items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        return 0, said
