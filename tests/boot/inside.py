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
  ``torch_dtype`` as the dtype's name; ``optimum_neuron_version`` and ``neuronxcc_version``, the
  compiler's ``__version__`` with its local label, optimum/neuron/configuration_utils.py
  ``to_dict``), the compiled ``model.pt`` and, only when exporting from a local checkpoint,
  ``checkpoint/weights/tp<rank>_sharded_checkpoint.safetensors`` per rank.
- The vLLM image, optimum-neuron 0.4.5 (:class:`VllmImage`): the same files, but the degree is
  ``--tensor_parallel_size`` (default 1, optimum/commands/export/neuronx.py), the dtype is the
  checkpoint's ``torch_dtype`` (optimum/neuron/models/inference/modeling_utils.py), and
  ``neuron_config.json`` also records ``target`` (``trn1`` on inf2 and trn1:
  optimum/neuron/utils/instance.py), ``continuous_batching`` (batch above 1:
  models/inference/llama/modeling_llama.py) and the image's own versions. A server container runs the image's entry
  point (docker/vllm/Dockerfile: ``--port 8080``, then ``--<name> <value>`` for each ``SM_ON_<NAME>``
  variable, then the command's words) and ``optimum-cli neuron serve``'s checks before vLLM starts
  (optimum/commands/neuron/serve.py ``run``; optimum/neuron/vllm/model_loader.py: no more cores
  than the container's devices give). The argument parsing itself is the real one in
  tests/harness.
- AWS's vLLM on NxD Inference image (:class:`NxdiImage`): its entry point runs its arguments; ``vllm
  run-batch`` and ``vllm serve`` build the engine, whose vllm-neuron plugin compiles into, or loads from,
  ``NEURON_COMPILED_ARTIFACTS`` (see the class).
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


def safetensors(tensors: dict[str, tuple[list[int], str]]) -> str:
    """A safetensors file of ``U8`` tensors (name: shape and bytes), as text: the format
    (huggingface/safetensors docs/source/index.mdx, "Format") is a little-endian u64 header size, the JSON
    header, which may end in spaces, and the bytes; here the header is padded to 256 bytes, a size whose
    bytes (0, 1, 0...) are text, as the tensors' are, so that real readers (safetensors' safe_open, in
    userdata/eagle-draft.py) read what a fake Hub serves."""
    header: dict[str, object] = {}
    offset = 0
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "U8", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    assert len(text) <= 256
    return "\x00\x01\x00\x00\x00\x00\x00\x00" + text.ljust(256) + "".join(data for _, data in tensors.values())


CHECKPOINT = {
    "config.json": '{"model_type": "llama", "torch_dtype": "bfloat16"}\n',
    "generation_config.json": "{}\n",
    # The LM head in the second shard, as in Meta's Llama 3 repositories: what eagle-draft copies into a draft.
    "model-00001-of-00002.safetensors": safetensors({"model.embed_tokens.weight": ([2, 4], "embedded")}),
    "model-00002-of-00002.safetensors": safetensors({"lm_head.weight": ([2, 4], "the head")}),
    "model.safetensors.index.json": json.dumps({"metadata": {}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}) + "\n",
    "tokenizer.json": "{}\n",
    "tokenizer_config.json": "{}\n",
    "special_tokens_map.json": "{}\n",
    "original/consolidated.00.pth": "Meta's copy of the weights\n",
    "original/params.json": "{}\n",
    "LICENSE": "license\n",
}

EAGLE_DRAFT = {
    # yuhuili/EAGLE-LLaMA3-Instruct-8B: its config (SafeAILab/EAGLE eagle/train/EAGLE-LLaMA3-Instruct-8B.json at
    # f872b7f) and weights without an LM head ("pretrained EAGLE model checkpoints don't include the LM head
    # weights", NxD Inference's feature guide at v2.28.0), here as safetensors.
    "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                               "num_hidden_layers": 1, "vocab_size": 128256, "torch_dtype": "float16"}) + "\n",
    "model.safetensors": safetensors({"fc.weight": ([2, 4], "fc fused"),
                                      "layers.0.mlp.up_proj.weight": ([1, 2], "up")}),
    "README.md": "an EAGLE draft\n",
}
"""An EAGLE draft's Hub repository; :meth:`ServingImage._download` serves it for a repository named EAGLE."""

DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
"""The torch dtype names optimum-neuron records, kept apart from the library's own table
(neuron_serving.plan.engines.base.TORCH_DTYPES) so that a mistake there cannot confirm itself here."""


TGI_OPTIMUM_NEURON = "0.3.0"
TGI_NEURONXCC = "2.19.8089.0+8ab9f450"
"""What TGI's image bundles, and an export records (optimum-neuron v0.3.0 optimum/neuron/
configuration_utils.py ``to_dict``: ``neuronxcc.__version__``): TGI v3.3.5 Dockerfile.neuron
installs optimum-neuron from its v0.3.0 sources and pins neuronx-cc==2.19.8089.0+8ab9f450."""


def export_files(argv: list[str], degree: int, weights: bool) -> dict[str, str]:
    """The files of an export made by ``optimum-cli export neuron`` with ``argv``, compiled for
    ``degree`` cores, holding the weights when ``weights``."""
    neuron_config = {
        "batch_size": int(_value(argv, "--batch_size") or 1),
        "sequence_length": int(_value(argv, "--sequence_length") or 0),
        "tp_degree": degree,
        "torch_dtype": DTYPES.get(_value(argv, "--auto_cast_type") or "", "float32"),
        "checkpoint_id": None if weights else _value(argv, "--model"),
        "optimum_neuron_version": TGI_OPTIMUM_NEURON,
        "neuronxcc_version": TGI_NEURONXCC,
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
        self._hf_transfer = True

    def use_hub(self, hub: FakeHub, cli: Path, home: Path, hf_transfer: bool = True) -> None:
        """Run downloads with the real ``cli`` against ``hub``, with ``home`` as ``HF_HOME``;
        ``hf_transfer`` as the TGI image sets it (``HF_HUB_ENABLE_HF_TRANSFER=1``, TGI v3.3.5
        Dockerfile.neuron); the vLLM image does not (optimum-neuron v0.4.5 docker/vllm/Dockerfile)."""
        self._hub = (hub, cli, home)
        self._hf_transfer = hf_transfer

    def __call__(self, body: dict[str, Any], binds: list[Bind]) -> BehaviourResult:
        argv = command(body)
        if argv[:2] == ["huggingface-cli", "download"] and self._hub is not None:
            return self._real_download(argv, binds, environment(body))
        if argv[:2] == ["huggingface-cli", "download"]:
            return self._download(argv, binds)
        devices = len((body.get("HostConfig") or {}).get("Devices") or [])
        if body.get("Image", "").startswith(VLLM_IMAGE):
            return VllmImage(self.knobs).run(argv, binds, devices, environment(body))
        if body.get("Image", "").startswith(NXDI_IMAGE):
            return NxdiImage(self.knobs).run(argv, binds, devices, environment(body))
        if argv[:3] == ["optimum-cli", "export", "neuron"]:
            return self._export(argv, binds, devices)
        return 0, ""  # a replica: TGI itself is played by the curl stub on loopback

    def _download(self, argv: list[str], binds: list[Bind]) -> BehaviourResult:
        # huggingface-hub 0.34.4 src/huggingface_hub/commands/download.py: only the files that match
        # an --include pattern and no --exclude pattern (fnmatch, src/huggingface_hub/utils/_paths.py).
        # The repository is the first positional word; an option before it takes one value (--max-workers N).
        words = argv[2:]
        while words and words[0].startswith("--"):
            words = words[2:]
        repo = words[0]
        if self.knobs.get("STUB_HF_DOWNLOAD_FAIL"):
            return 1, "", f"huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. Invalid rev id for {repo}\n"
        out = host_path(binds, _values(argv, "--local-dir")[0], write=True)
        include, exclude = _values(argv, "--include") or ["*"], _values(argv, "--exclude")
        files = CHECKPOINT if not repo.endswith("-neuron") else export_files(
            ["--batch_size", "4", "--sequence_length", "4096", "--auto_cast_type", "bf16"], 8, weights=True)
        files = EAGLE_DRAFT if "eagle" in repo.lower() else files
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
        client = {**clean, **hub.client_env(home, token=env.get("HF_TOKEN"), hf_transfer=self._hf_transfer)}
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


VLLM_IMAGE = "ghcr.io/huggingface/optimum-neuron-vllm:"
VLLM_OPTIMUM_NEURON = "0.4.5"
VLLM_NEURONXCC = "2.21.33363.0+82129205"
"""What the image's ``neuronxcc.__version__`` says, which an export records: optimum-neuron v0.4.5
pyproject.toml pins neuronx-cc==2.21.33363.0 and installs it from the Neuron pip repository, whose
builds carry a local label; optimum-neuron's own tests name this build (tests/decoder/
test_cache_cleanup.py, ``COMPILER_VERSION``, at 213224e6 on main, which pins the same compiler).
Kept apart from neuron_serving.plan.engines.vllm.NEURONXCC_VERSION, so that a mistake there cannot
confirm itself here."""


def vllm_export_files(argv: list[str], degree: int, torch_dtype: str) -> dict[str, str]:
    """The files of an export by optimum-neuron 0.4.5 made with ``argv``, compiled for ``degree``
    cores from a local checkpoint whose ``config.json`` says ``torch_dtype``."""
    batch = int(_value(argv, "--batch_size") or 1)
    neuron_config = {
        "batch_size": batch,
        "sequence_length": int(_value(argv, "--sequence_length") or 4096),
        "tp_degree": degree,
        "torch_dtype": torch_dtype,
        "continuous_batching": batch > 1,
        "target": "trn1",
        "optimum_neuron_version": VLLM_OPTIMUM_NEURON,
        "neuronxcc_version": VLLM_NEURONXCC,
        "checkpoint_id": None,
    }
    return {**export_files(argv, degree, weights=True), "neuron_config.json": json.dumps(neuron_config) + "\n"}


class VllmImage:
    """What optimum-neuron 0.4.5's vLLM image does with the commands the boot script gives it."""

    def __init__(self, knobs: dict[str, str]) -> None:
        self.knobs = knobs

    def run(self, argv: list[str], binds: list[Bind], devices: int, env: dict[str, str]) -> BehaviourResult:
        if argv[:3] == ["optimum-cli", "export", "neuron"]:
            return self._export(argv, binds, devices)
        if not argv or argv[0].startswith("-"):
            return self._serve(self.entry_point(argv, env), binds, devices)
        return 127, "", f"exec: {argv[0]}: not found in the simulated image\n"

    @staticmethod
    def entry_point(cmd: list[str], env: dict[str, str]) -> list[str]:
        """docker/vllm/Dockerfile at v0.4.5: ``optimum-cli neuron serve --port 8080``, then each
        ``SM_ON_`` variable as ``--<lower-case name>`` and its value (none when empty), then the
        command's words."""
        words = ["optimum-cli", "neuron", "serve", "--port", "8080"]
        for key, value in env.items():
            if key.startswith("SM_ON_"):
                words += [f"--{key.removeprefix('SM_ON_').lower()}", *([value] if value else [])]
        return words + cmd

    def _export(self, argv: list[str], binds: list[Bind], devices: int) -> BehaviourResult:
        model = _values(argv, "--model")[0]
        source = host_path(binds, model)
        if not (source / "config.json").is_file():
            return 1, "", f"OSError: {model} does not appear to have a file named config.json\n"
        out = host_path(binds, argv[-1], write=True)
        out.mkdir(parents=True, exist_ok=True)
        time.sleep(float(self.knobs.get("STUB_EXPORT_SECONDS", "0")))
        if self.knobs.get("STUB_EXPORT_FAIL"):
            return 1, "", "neuronx-cc: error: compilation failed\n"
        degree = int((_values(argv, "--tensor_parallel_size") or _values(argv, "--num_cores") or ["1"])[0])
        if degree > 2 * devices:
            return 1, "", f"ValueError: tensor_parallel_size {degree} exceeds the {2 * devices} cores available\n"
        dtype = json.loads((source / "config.json").read_text()).get("torch_dtype", "float32")
        for name, text in vllm_export_files(argv, degree, dtype).items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        return 0, f"compiling {model} into {argv[-1]}\n"

    def _serve(self, argv: list[str], binds: list[Bind], devices: int) -> BehaviourResult:
        """``optimum-cli neuron serve``'s checks of a local export, then vLLM's start (not run)."""
        model = _values(argv, "--model")[0]
        try:
            config = json.loads((host_path(binds, model) / "neuron_config.json").read_text())
        except (OSError, ValueError) as error:
            return 1, "", f"serve: cannot read the export: {error}\n"
        problems = [f"ValueError: The neuron model is compiled for {config.get('target')} and cannot run on a trn1 "
                    "instance."] if config.get("target") != "trn1" else []
        if config.get("optimum_neuron_version") != VLLM_OPTIMUM_NEURON:
            problems.append(f"ValueError: exported with optimum-neuron {config.get('optimum_neuron_version')}")
        # optimum-neuron v0.4.5 optimum/neuron/configuration_utils.py, NeuronConfig.from_dict (which
        # serve's NeuronConfig.from_pretrained calls): the whole version string, local label and all,
        # must equal the installed neuronxcc.__version__.
        if config.get("neuronxcc_version") != VLLM_NEURONXCC:
            problems.append("RuntimeError: This neuron configuration corresponds to a model exported using version "
                            f"{config.get('neuronxcc_version')} of the neuronxcc compiler, but {VLLM_NEURONXCC} is "
                            "installed.")
        for flag, key in (("--batch_size", "batch_size"), ("--sequence_length", "sequence_length"),
                          ("--tensor_parallel_size", "tp_degree")):
            given = _value(argv, flag)
            if given is not None and int(given) != config.get(key):
                problems.append(f"ValueError: {flag.strip('-')} {given} differs from the export's {config.get(key)}")
        if int(config.get("tp_degree", 0)) > 2 * devices:
            problems.append(f"ValueError: tensor parallel size {config.get('tp_degree')} exceeds the available "
                            f"{2 * devices} cores")
        if not config.get("continuous_batching"):
            problems.append("ValueError: the vLLM plugin supports continuous batching exports only")
        if problems:
            return 1, "", "\n".join(problems) + "\n"
        return 0, f"serving {_value(argv, '--served_model_name') or model} on port {_value(argv, '--port')}\n"


NXDI_IMAGE = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:"


class NxdiImage:
    """What AWS's vLLM on NxD Inference image does with the commands the boot script gives it.

    Imitated from: aws-neuron/deep-learning-containers common/vllm_entrypoint.py (the entry point runs
    its arguments) and vllm/inference/0.13.0/Dockerfile.neuronx (``vllm`` on PATH); vLLM 0.13.0
    vllm/entrypoints/openai/run_batch.py (``run-batch`` builds the engine, then reads its input, skipping
    empty lines); the vllm-neuron plugin at release-0.4.1 (read in the fork whn09/vllm-neuron at 4fac6b7),
    vllm_neuron/worker/neuronx_distributed_model_loader.py: ``_get_compiled_model_path`` (the directory
    ``NEURON_COMPILED_ARTIFACTS`` names, else ``<model>/neuron-compiled-artifacts/<hash>``), a load
    first, and on ``FileNotFoundError`` or ``ValueError`` "Unable to find precompiled artifacts from ...
    Recompiling..." into the same directory, whose first write (``neuron_config.json``) fails on a
    read-only mount; ``_get_default_neuron_config`` (``tp_degree``, ``batch_size`` = ``--max-num-seqs``,
    ``seq_len`` and ``max_context_length`` = ``--max-model-len``, ``is_continuous_batching`` above batch
    1, ``is_prefix_caching``, then ``override_neuron_config`` merged over them). NxD Inference at cd3abf3
    (SDK 2.28.0): models/config.py (``neuron_config.json`` is the model's configuration with the
    NeuronConfig under ``neuron_config``, a dtype as its name), models/application_base.py (``model.pt``;
    with ``save_sharded_checkpoint`` a load reads ``weights/tp{rank}_sharded_checkpoint.safetensors`` of
    every rank, else it shards the checkpoint named by ``_name_or_path``, or, quantized, the file
    ``quantized_checkpoints_path`` names, ``checkpoint_loader_fn``: "Quantized checkpoint file not
    found"; ``save_quantized_state_dict`` writes that file before a compile). The quantization fields'
    defaults are NeuronConfig's (models/config.py: ``quantized`` False, ``quantization_type``
    ``per_tensor_symmetric``, ``quantization_dtype`` ``int8``; "quantized_checkpoints_path is required"
    when quantized). Not imitated: what vLLM does once the engine is up (the curl stub plays the server on
    loopback).
    """

    def __init__(self, knobs: dict[str, str]) -> None:
        self.knobs = knobs

    def run(self, argv: list[str], binds: list[Bind], devices: int, env: dict[str, str]) -> BehaviourResult:
        if argv[:1] == ["python"] and len(argv) in (5, 6):
            return self._python(argv[1:], binds)
        if argv[:2] == ["vllm", "run-batch"]:
            return self._engine(argv[2:], _value(argv, "--model"), binds, devices, env, batch=True)
        if argv[:2] == ["vllm", "serve"] and len(argv) > 2:
            return self._engine(argv[3:], argv[2], binds, devices, env, batch=False)
        return 127, "", f"exec: {argv[:1]}: not found in the simulated image\n"

    def _engine(self, flags: list[str], model: str | None, binds: list[Bind], devices: int, env: dict[str, str],
                *, batch: bool) -> BehaviourResult:
        if model is None or not (host_path(binds, model) / "config.json").is_file():
            return 1, "", f"OSError: {model} does not appear to have a file named config.json\n"
        degree = int(_value(flags, "--tensor-parallel-size") or 1)
        if degree > 2 * devices:
            return 1, "", f"ValueError: tensor_parallel_size {degree} exceeds the {2 * devices} NeuronCores available\n"
        override = json.loads(_value(flags, "--additional-config") or "{}").get("override_neuron_config") or {}
        compiled = env.get("NEURON_COMPILED_ARTIFACTS") or f"{model}/neuron-compiled-artifacts/0123456789abcdef"
        try:
            where = host_path(binds, compiled)
        except FileNotFoundError:
            where = None
        if where is not None and (where / "neuron_config.json").is_file() and (where / "model.pt").is_file():
            if speculation := self._speculation(flags, binds, compiling=False):
                return 1, "", speculation
            return self._load(where, binds, degree, batch)
        said = f"Unable to find precompiled artifacts from {compiled}. Recompiling...\n"
        time.sleep(float(self.knobs.get("STUB_EXPORT_SECONDS", "0")))
        if self.knobs.get("STUB_EXPORT_FAIL"):
            return 1, "", "neuronx-cc: error: compilation failed\n"
        try:
            out = host_path(binds, compiled, write=True)
        except (FileNotFoundError, PermissionError):
            return 1, said, f"OSError: [Errno 30] Read-only file system: '{compiled}/neuron_config.json'\n"
        config = json.loads((host_path(binds, model) / "config.json").read_text())
        spec = json.loads(_value(flags, "--speculative-config") or "null")
        batch_size, seq_len = int(_value(flags, "--max-num-seqs") or 32), int(_value(flags, "--max-model-len") or 0)
        # vllm/config/cache.py (0.13.0): prefix caching is on unless turned off; the plugin's platform then
        # wants a block size, adds the null block to --num-gpu-blocks-override, and the loader checks the
        # user's count against the batch at full length (_validate_neuron_config).
        prefix = "--no-enable-prefix-caching" not in flags
        block, blocks = _value(flags, "--block-size"), int(_value(flags, "--num-gpu-blocks-override") or batch_size)
        if prefix and block is None:
            return 1, said, "AssertionError: When prefix caching is enabled, block_size must be set.\n"
        least = -(-seq_len // int(block)) * batch_size if prefix and block else 0
        if prefix and blocks < least:
            return 1, said, (f"AssertionError: At least {least} blocks are required for max_model_len {seq_len}, "
                             f"but only {blocks} blocks are available\n")
        if speculation := self._speculation(flags, binds, compiling=True):
            return 1, said, speculation
        quantized_path = override.get("quantized_checkpoints_path")
        if override.get("quantized") and quantized_path is None:
            return 1, said, "AssertionError: quantized_checkpoints_path is required\n"
        neuron_config = {
            "quantized": False,
            "quantized_checkpoints_path": None,
            "quantization_type": "per_tensor_symmetric",
            "quantization_dtype": "int8",
            "tp_degree": degree,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "max_context_length": seq_len,
            "torch_dtype": _value(flags, "--dtype") or "float32",
            "is_continuous_batching": batch_size > 1,
            "is_prefix_caching": prefix,
            "is_block_kv_layout": prefix,
            "pa_block_size": int(block) if prefix and block else seq_len,
            "pa_num_blocks": blocks + 1,
            "save_sharded_checkpoint": False,
            "enable_fused_speculation": spec is not None,
            "enable_eagle_speculation": spec is not None and spec.get("method") == "eagle",
            "speculation_length": spec["num_speculative_tokens"] if spec else 0,
            **override,
        }
        if neuron_config["quantized"]:
            # Written into the container's own writable layer unless the path is on a bind mount.
            try:
                target = host_path(binds, quantized_path, write=True)
            except FileNotFoundError:
                target = None
            except PermissionError:
                return 1, said, f"PermissionError: [Errno 13] Permission denied: '{quantized_path}'\n"
            if target is not None:
                target.write_text("quantized weights\n")
            said += f"Saving quantized state dict as torch pt file to: {quantized_path}\n"
        out.mkdir(parents=True, exist_ok=True)
        files = {"neuron_config.json": json.dumps({**config, "_name_or_path": model, "neuron_config": neuron_config}),
                 "model.pt": "compiled graph\n"}
        if neuron_config["save_sharded_checkpoint"]:
            files.update({f"weights/tp{rank}_sharded_checkpoint.safetensors": f"rank {rank} weights\n"
                          for rank in range(degree)})
        for name, text in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)
        said += f"compiled {model} into {compiled}\n"
        return (0, said + "batch of 0 requests done\n") if batch else (0, said + "serving\n")

    @staticmethod
    def _speculation(flags: list[str], binds: list[Bind], *, compiling: bool) -> str | None:
        """Why the draft of ``--speculative-config`` cannot be loaded, or None. Every load reads its
        ``config.json`` first (``_init_fused_spec_config``: "Cannot load draft model config from ..."); a
        compile reads its weights too (NxD Inference's ``checkpoint_loader_fn`` of the draft), whose LM head the
        fused model needs ("the draft model must include the LM head weights from the target model",
        feature-guide.rst at v2.28.0)."""
        spec = json.loads(_value(flags, "--speculative-config") or "null")
        if spec is None:
            return None
        draft = spec["model"]
        try:
            found = host_path(binds, draft)
        except FileNotFoundError:
            found = None
        if found is None or not (found / "config.json").is_file():
            return (f"ValueError: Cannot load draft model config from '{draft}'. Please ensure the path is correct "
                    f"and config.json exists. Error: {draft} does not appear to have a file named config.json\n")
        if compiling:
            weights = found / "model.safetensors"
            data = weights.read_bytes() if weights.is_file() else b"\x02\0\0\0\0\0\0\0{}"
            names = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
            if "lm_head.weight" not in names:
                return f"KeyError: 'lm_head.weight' is not in the draft's checkpoint at {draft}\n"
        return None

    @staticmethod
    def _python(argv: list[str], binds: list[Bind]) -> BehaviourResult:
        """The image's Python running export-model's draft conversion (``python /opt/neuron-serving/bin/eagle-draft
        TARGET DRAFT OUT [EXPECTED]``): the real script, with the torch and safetensors of .tools/vllm-0.13.0, on
        the bound directories."""
        python = Path(__file__).resolve().parents[2] / ".tools" / "vllm-0.13.0" / "bin" / "python"
        if not python.exists():
            return 127, "", f"{python} is missing: scripts/test makes it\n"
        script, target, draft, out, *expected = argv
        words = [str(host_path(binds, script)), str(host_path(binds, target)), str(host_path(binds, draft)),
                 str(host_path(binds, out, write=True)), *expected]
        done = subprocess.run([str(python), *words], capture_output=True, text=True, timeout=120, check=False)
        return done.returncode, done.stdout, done.stderr

    @staticmethod
    def _load(where: Path, binds: list[Bind], degree: int, batch: bool) -> BehaviourResult:
        saved = json.loads((where / "neuron_config.json").read_text())
        neuron_config = saved["neuron_config"]
        if neuron_config["tp_degree"] != degree:
            return 1, "", (f"RuntimeError: the compiled model is for tp_degree {neuron_config['tp_degree']}, "
                           f"not {degree}\n")
        if neuron_config.get("save_sharded_checkpoint"):
            missing = [f"weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(degree)
                       if not (where / f"weights/tp{rank}_sharded_checkpoint.safetensors").is_file()]
            if missing:
                return 1, "", f"FileNotFoundError: No such file or directory: '{where}/{missing[0]}'\n"
        elif neuron_config.get("quantized"):
            # A new container: the export's own writable layer, and what it quantized into, are gone.
            path = neuron_config["quantized_checkpoints_path"]
            try:
                found = host_path(binds, path).is_file()
            except FileNotFoundError:
                found = False
            if not found:
                return 1, "", f"FileNotFoundError: Quantized checkpoint file not found: {path}\n"
        else:
            checkpoint = saved.get("_name_or_path", "")
            try:
                weights = list(host_path(binds, checkpoint).glob("*.safetensors"))
            except FileNotFoundError:
                weights = []
            if not weights:
                return 1, "", f"FileNotFoundError: no checkpoint to shard at {checkpoint}\n"
        return 0, "Successfully loaded pre-compiled model artifacts\n" + (
            "batch of 0 requests done\n" if batch else "serving\n")
