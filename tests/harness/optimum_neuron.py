"""Runs a container's `optimum-cli export neuron ...` argv through optimum-neuron 0.3.0's real CLI, with a recorder.

Run it with the python of the tools venv that `requirements-optimum-neuron-0.3.0.txt` builds (it imports the real
optimum, optimum-neuron, transformers and torch), never with the project's venv:

    .tools/optimum-neuron-0.3.0/bin/python tests/harness/optimum_neuron.py \
        --neuron-devices 6 -- optimum-cli export neuron --model /m --task text-generation ... /out
    .tools/optimum-neuron-0.3.0/bin/python tests/harness/optimum_neuron.py --json '["optimum-cli", "export", ...]'

It prints one JSON object on stdout (see `Recording`); everything the real code prints goes to stderr and is also kept
in the JSON. Its own exit code is 0 whenever it could run the argv: the container's exit code is in `exit_code`.

What runs for real (huggingface/optimum-neuron, tag v0.3.0, identical to the optimum_neuron-0.3.0 wheel on PyPI):
- `optimum-cli` is `optimum.commands.optimum_cli:main` ([project.scripts] in pyproject.toml); it parses the argv
  with the parser of optimum/commands/export/neuronx.py (`parse_args_neuronx`), registered by
  optimum/commands/register/register_export.py only when `is_neuronx_available()`
  (optimum/neuron/utils/import_utils.py: `find_spec("torch_neuronx") is not None`).
- `NeuronxExportCommand.run` (optimum/commands/export/neuronx.py) does
  `subprocess.run(f"python3 -m optimum.exporters.neuron {' '.join(sys.argv[3:])}", shell=True, check=True)`.
  Here /bin/sh still parses that exact string (a shell function named python3 prints the words it gets), and the
  words are run in-process with `runpy.run_module("optimum.exporters.neuron", run_name="__main__")`; a non-zero exit
  becomes `CalledProcessError`, as `check=True` makes it.
- optimum/exporters/neuron/__main__.py `main()` parses again, infers the task (`infer_task`) and library, then
  `maybe_export_from_neuron_model_class` drops `tensor_parallel_size` (`kwargs.pop("tensor_parallel_size", None)`)
  and calls `<model class>.from_pretrained(model_id=..., export=True, load_weights=False, **kwargs)`; optimum 1.24's
  `OptimizedModel.from_pretrained` routes to `NeuronModelForCausalLM._export` (optimum/neuron/modeling_decoder.py),
  which turns `num_cores` into `tensor_parallel_size` of `get_neuron_config`, where `None` means
  `get_available_cores()` (optimum/neuron/utils/system.py: 2 x the /dev/neuron* devices), and the model class's
  `_get_neuron_config` (e.g. optimum/neuron/models/inference/llama/modeling_llama.py) builds the `NxDNeuronConfig`
  (optimum/neuron/models/inference/backend/config.py).

What is replaced (the lowest calls that need the Neuron SDK or hardware):
- `NxDModelForCausalLM.export` (optimum/neuron/models/inference/backend/modules/decoder/modeling_decoder.py), the
  classmethod that compiles (`NxDPreTrainedModel.compile` -> neuronx_distributed `ModelBuilder.trace`): the
  recorder keeps what it receives (model_id, config, the final `neuron_config`, load_weights, ...) and returns a
  model made by the real `NxDPreTrainedModel.__init__` with a placeholder traced model.
- `torch.jit.save` of that placeholder and `NxDPreTrainedModel.shard_checkpoint` (optimum/neuron/models/inference/
  backend/pretrained_model.py) are recorded, not run. The rest of `save_pretrained` is real, so the output dir gets
  the real config.json and neuron_config.json (and the tokenizer, when the model dir has one).
- The Neuron SDK modules (torch_neuronx, neuronx_distributed, neuronxcc, torch_xla, libneuronxla) are import
  stubs, so that the real model classes of optimum/neuron/models/inference/auto_models.py import; `torch_neuron`
  (inf1) is not stubbed, so `is_neuron_available()` stays False as in the neuronx image.
- `/dev` as seen by `get_available_cores` lists `--neuron-devices` devices (neuron0..), as `docker run --device`
  gives the container; its real code (and NEURON_RT_NUM_CORES / NEURON_RT_VISIBLE_CORES) is kept.

With `--compile-cache` the real `NxDModelForCausalLM.export` runs (the recorder only watches it), and with it the
real compile path and Hub cache of optimum-neuron 0.3.0: `NxDPreTrainedModel.compile`, its `neff_cache`
(optimum/neuron/models/inference/backend/cache.py), `hub_neuronx_cache`, `create_hub_compile_cache_proxy`,
`CompileCacheHfProxy` (optimum/neuron/cache/hub_cache.py), `get_hf_hub_cache_repo` and huggingface-hub's HfApi; what
lies below (NxD's ModelBuilder, torch-neuronx's compile, libneuronxla's caches) is imitated by
tests/harness/neuron_compile.py, whose header says from where, and recorded under `compile_cache`. `--local-cache`
stands for the container's /var/tmp/neuron-compile-cache, `--s3-root` holds the objects of an S3 compile cache.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import runpy
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tee import Tee

# The modules of the Neuron SDK that the neuronx image installs (TGI v3.3.5 Dockerfile.neuron) and the real
# optimum-neuron modeling code imports; torch_neuron (inf1) is deliberately absent.
STUB_ROOTS = ("torch_neuronx", "neuronx_distributed", "neuronxcc", "torch_xla", "libneuronxla")
# The versions TGI v3.3.5's Dockerfile.neuron pins, exposed as __version__ by the stubs.
STUB_VERSIONS = {
    "torch_neuronx": "2.7.0.2.8.6734+ac864f72",
    "neuronx_distributed": "0.13.14393+b8569585",
    "neuronxcc": "2.19.8089.0+8ab9f450",
    "libneuronxla": "2.2.4410.0+835a67fb",
    "torch_xla": "2.7.0",
}
EXPORTER_MODULE = "optimum.exporters.neuron"


# --------------------------------------------------------------------------------------------------------------------
# Import stubs for the Neuron SDK
# --------------------------------------------------------------------------------------------------------------------
class _StubMeta(type):
    """Metaclass of stub classes: any attribute is another stub class; a single function or class is passed through."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], types.FunctionType | type):
            return args[0]  # used as a bare decorator at import time
        return super().__call__(*args, **kwargs)


class _Stub(metaclass=_StubMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stub_args = (args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator factory at import time
        return _Stub()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub()


def _stub_class(name: str) -> type:
    return _StubMeta(name.rsplit(".", 1)[-1], (_Stub,), {"__module__": "neuron_sdk_stub", "__qualname__": name})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class NeuronSdkStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves every module under `STUB_ROOTS` as a stub package."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in STUB_ROOTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        if spec.name in STUB_VERSIONS:
            module.__version__ = STUB_VERSIONS[spec.name]  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# --------------------------------------------------------------------------------------------------------------------
# The recording
# --------------------------------------------------------------------------------------------------------------------
class Recording:
    """What the real code did; `as_json` is the runner's output."""

    def __init__(self, argv: list[str], neuron_devices: int) -> None:
        self.argv = argv
        self.neuron_devices = neuron_devices
        self.exit_code: int | None = None
        self.error: str | None = None
        self.exporter_command: str | None = None
        self.exporter_argv: list[str] | None = None
        self.exporter_exit_code: int | None = None
        self.exporter_error: str | None = None
        self.stderr: io.StringIO = io.StringIO()
        self.model_class_lookups: list[dict[str, Any]] = []
        self.routed: dict[str, Any] | None = None
        self.export: dict[str, Any] | None = None
        self.save: dict[str, Any] | None = None
        self.not_written: list[str] = []
        self.output_dir: str | None = None

    def as_json(self, stdout: str, stderr: str) -> dict[str, Any]:
        files = None
        if self.output_dir is not None and os.path.isdir(self.output_dir):
            files = sorted(str(p.relative_to(self.output_dir)) for p in Path(self.output_dir).rglob("*") if p.is_file())
        return {
            "argv": self.argv,
            "neuron_devices": self.neuron_devices,
            "exit_code": self.exit_code,
            "error": self.error,
            "stdout": stdout,
            "stderr": stderr,
            "exporter_command": self.exporter_command,
            "exporter_argv": self.exporter_argv,
            "exporter_exit_code": self.exporter_exit_code,
            "exporter_error": self.exporter_error,
            "model_class_lookups": self.model_class_lookups,
            "routed": self.routed,
            "export": self.export,
            "save": self.save,
            "not_written": self.not_written,
            "output_dir": self.output_dir,
            "output_files": files,
        }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


class _TracedModelPlaceholder:
    """Stands for the torch.jit.ScriptModule that `NxDPreTrainedModel.compile` returns."""


class _DevProxy(types.ModuleType):
    """`os` for optimum/neuron/utils/system.py, whose `os.walk("/dev")` sees only the simulated neuron devices."""

    def __init__(self, devices: int) -> None:
        super().__init__("os")
        self._devices = devices

    def walk(self, top: str, *args: Any, **kwargs: Any) -> Iterator[tuple[str, list[str], list[str]]]:
        if os.path.normpath(top) == "/dev":
            return iter([("/dev", [], [f"neuron{i}" for i in range(self._devices)])])
        return os.walk(top, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def install_recorder(rec: Recording, *, real_export: bool = False) -> None:
    """Imports the real modules (with the SDK stubs) and patches the recorder in. Call once, before the CLI runs.

    With ``real_export`` the recorder records what `NxDModelForCausalLM.export` receives, then runs it."""
    import torch
    from optimum.commands.export import neuronx as cli_neuronx
    from optimum.neuron import modeling_decoder
    from optimum.neuron.models import auto_model
    from optimum.neuron.models.inference.backend import pretrained_model
    from optimum.neuron.models.inference.backend.modules.decoder import modeling_decoder as nxd_decoder
    from optimum.neuron.utils import system

    # /dev as the container sees it: `docker run --device /dev/neuronN` for each device.
    system.os = _DevProxy(rec.neuron_devices)  # type: ignore[attr-defined]
    system.get_neuron_major.cache_clear()

    # Which model class the exporter looks up, for which task (optimum/neuron/models/auto_model.py).
    real_get_class = auto_model.get_neuron_model_class

    def get_neuron_model_class(model_type: str, task: str, mode: str) -> Any:
        entry: dict[str, Any] = {"model_type": model_type, "task": task, "mode": mode}
        rec.model_class_lookups.append(entry)
        cls = real_get_class(model_type, task, mode)  # type: ignore[arg-type]
        entry["class"] = f"{cls.__module__}.{cls.__qualname__}"
        return cls

    auto_model.get_neuron_model_class = get_neuron_model_class  # type: ignore[assignment]
    modeling_decoder.get_neuron_model_class = get_neuron_model_class  # type: ignore[assignment]

    # Spy (pass-through) on the routing step: what `NeuronModelForCausalLM._export` receives.
    real_export_impl = modeling_decoder.NeuronModelForCausalLM.__dict__["_export"].__func__

    def spy_export(cls: type, *args: Any, **kwargs: Any) -> Any:
        rec.routed = {
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "args": _jsonable(list(args)),
            "kwargs": {k: _jsonable(v) for k, v in kwargs.items() if k != "config"},
            "available_cores": system.get_available_cores(),
        }
        return real_export_impl(cls, *args, **kwargs)

    modeling_decoder.NeuronModelForCausalLM._export = classmethod(spy_export)  # type: ignore[method-assign,assignment]

    # The recorder: replaces the classmethod that compiles (and would load weights).
    nxd_cls = nxd_decoder.NxDModelForCausalLM
    real_nxd_export = nxd_cls.__dict__["export"].__func__

    def record_export(
        cls: type,
        model_id: str,
        config: Any,
        neuron_config: Any,
        token: bool | str | None = None,
        revision: str | None = None,
        cache_dir: str | None = None,
        force_download: bool | None = False,
        subfolder: str | None = "",
        local_files_only: bool | None = False,
        trust_remote_code: bool | None = False,
        load_weights: bool = True,
        **kwargs: Any,
    ) -> Any:
        nc = neuron_config
        rec.export = {
            "class": f"{cls.__module__}.{cls.__qualname__}",
            "model_id": model_id,
            "model_id_is_local": os.path.exists(model_id),
            "model_type": getattr(config, "model_type", None),
            "neuron_config_class": type(nc).__name__,
            "tp_degree": nc.tp_degree,
            "batch_size": nc.batch_size,
            "sequence_length": nc.sequence_length,
            "torch_dtype": str(nc.torch_dtype).removeprefix("torch."),
            "checkpoint_id": nc.checkpoint_id,
            "checkpoint_revision": nc.checkpoint_revision,
            "continuous_batching": nc.continuous_batching,
            "neuron_config": json.loads(nc.to_json_string()),
            "compiler_args": cls.get_compiler_args(nc),
            "token": _jsonable(token),
            "revision": revision,
            "cache_dir": cache_dir,
            "force_download": force_download,
            "subfolder": subfolder,
            "local_files_only": local_files_only,
            "trust_remote_code": trust_remote_code,
            "load_weights": load_weights,
            "ignored_kwargs": _jsonable(kwargs),
        }
        if real_export:
            return real_nxd_export(cls, model_id, config, neuron_config, token=token, revision=revision,
                                   cache_dir=cache_dir, force_download=force_download, subfolder=subfolder,
                                   local_files_only=local_files_only, trust_remote_code=trust_remote_code,
                                   load_weights=load_weights, **kwargs)
        # As the real export: config.torch_dtype follows the neuron config; then the model object.
        config.torch_dtype = nc.torch_dtype
        model = cls.__new__(cls)
        pretrained_model.NxDPreTrainedModel.__init__(
            model, config=config, neuron_config=nc, traced_model=_TracedModelPlaceholder(), model_wrappers=[]
        )
        if load_weights:
            rec.not_written.append(f"load_weights({model_id})")
        return model

    nxd_cls.export = classmethod(record_export)  # type: ignore[method-assign,assignment]

    # What `save` would write but cannot here: the compiled model and the sharded checkpoint.
    real_jit_save = torch.jit.save

    def jit_save(m: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(m, _TracedModelPlaceholder):
            rec.not_written.append(os.fspath(f))
            return
        real_jit_save(m, f, *args, **kwargs)

    torch.jit.save = jit_save

    def shard_checkpoint(self: Any, src_path: str, dest_path: str, debug: bool = False) -> None:
        start = self.neuron_config.start_rank_id
        ranks = range(start, start + self.neuron_config.local_ranks_size)
        shards = pretrained_model.get_shards_path(dest_path)
        rec.not_written.extend(os.path.join(shards, f"tp{r}_sharded_checkpoint.safetensors") for r in ranks)
        if rec.save is not None:
            rec.save["shard_checkpoint"] = {"src_path": src_path, "dest_path": dest_path}

    pretrained_model.NxDPreTrainedModel.shard_checkpoint = shard_checkpoint  # type: ignore[method-assign]

    real_save = pretrained_model.NxDPreTrainedModel.save

    def save(self: Any, dest_path: str, weight_path: str | None = None) -> None:
        rec.save = {"dest_path": os.fspath(dest_path), "weight_path": weight_path, "shard_checkpoint": None}
        rec.output_dir = os.fspath(dest_path)
        real_save(self, dest_path, weight_path=weight_path)

    pretrained_model.NxDPreTrainedModel.save = save  # type: ignore[method-assign]

    # `python3 -m optimum.exporters.neuron ...` through the real shell, then in this process.
    cli_neuronx.subprocess = _SubprocessProxy(rec)  # type: ignore[attr-defined]


def _shell_words(command: str) -> list[str]:
    """The argv /bin/sh gives `python3` for `command` (a shell function prints its words, NUL-terminated)."""
    script = "python3() { printf '%s\\0' \"$@\"; }\n" + command
    out = subprocess.run(["/bin/sh", "-c", script], check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    return out.stdout.decode().split("\0")[:-1]


def run_exporter_module(argv: list[str]) -> int:
    """`python3 <argv>` where argv is `-m optimum.exporters.neuron ...`, in-process: its exit code."""
    if argv[:2] != ["-m", EXPORTER_MODULE]:
        raise RuntimeError(f"unexpected exporter command: python3 {argv}")
    saved = sys.argv
    sys.argv = [f"{EXPORTER_MODULE}/__main__.py", *argv[2:]]
    try:
        runpy.run_module(EXPORTER_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        return _exit_code(e)
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved
    return 0


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


class _SubprocessProxy(types.ModuleType):
    """`subprocess` for optimum/commands/export/neuronx.py: `run(cmd, shell=True, check=True)` runs in-process."""

    def __init__(self, rec: Recording) -> None:
        super().__init__("subprocess")
        self._rec = rec

    def run(self, command: str, shell: bool = False, check: bool = False, **kwargs: Any) -> Any:
        if not shell or not isinstance(command, str) or kwargs:
            raise RuntimeError(f"unexpected subprocess.run({command!r}, shell={shell}, {kwargs})")
        self._rec.exporter_command = command
        words = _shell_words(command)
        self._rec.exporter_argv = words
        start = self._rec.stderr.tell()
        code = run_exporter_module(words)
        self._rec.exporter_exit_code = code
        if code:
            self._rec.exporter_error = _last_line(self._rec.stderr.getvalue()[start:])
        if check and code != 0:
            raise subprocess.CalledProcessError(code, command)
        return subprocess.CompletedProcess(command, code)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def _console_script(name: str) -> Callable[[], Any]:
    """The function the `name` console script of the installed optimum-neuron calls."""
    from importlib.metadata import entry_points

    for ep in entry_points(group="console_scripts", name=name):
        if ep.dist is not None and ep.dist.name.replace("_", "-") == "optimum-neuron":
            return ep.load()  # type: ignore[no-any-return]
    raise RuntimeError(f"no {name} console script in the installed optimum-neuron")


def stub_module(name: str) -> types.ModuleType:
    """A stub package named ``name``, as `NeuronSdkStubFinder` makes them."""
    module = _StubModule(name)
    module.__path__ = []
    return module


def run(argv: list[str], neuron_devices: int, compile_cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs the container argv (`optimum-cli ...`) with the recorder; returns the recording as a dict.

    ``compile_cache`` (the keyword arguments of `neuron_compile.install` but the first) runs the real export on the
    imitated compile path; its recording is the result's ``compile_cache``."""
    if not argv or os.path.basename(argv[0]) != "optimum-cli":
        raise SystemExit(f"the argv must start with optimum-cli: {argv}")
    rec = Recording(argv, neuron_devices)
    cache_record: dict[str, Any] | None = None
    out, err = io.StringIO(), rec.stderr
    real_stderr = sys.stderr
    saved_argv = sys.argv
    with contextlib.redirect_stdout(Tee(out, real_stderr)), contextlib.redirect_stderr(Tee(err, real_stderr)):
        try:
            sys.meta_path.insert(0, NeuronSdkStubFinder())
            if compile_cache is not None:
                cache_record = _neuron_compile().install(
                    stub_module, compile_through="generate_neff", traced=_TracedModelPlaceholder, **compile_cache)
            install_recorder(rec, real_export=compile_cache is not None)
            main = _console_script("optimum-cli")
            sys.argv = [argv[0], *argv[1:]]
            try:
                main()
                rec.exit_code = 0
            except SystemExit as e:
                rec.exit_code = _exit_code(e)
            except BaseException:
                traceback.print_exc()
                rec.exit_code = 1
        finally:
            sys.argv = saved_argv
    if rec.exit_code:
        rec.error = _last_line(err.getvalue())
    if rec.output_dir is None and rec.exporter_argv:
        rec.output_dir = _positional_output(rec.exporter_argv)
    result = rec.as_json(out.getvalue(), err.getvalue())
    if cache_record is not None:
        result["compile_cache"] = cache_record
    return result


def _neuron_compile() -> types.ModuleType:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import neuron_compile

    return neuron_compile


def _last_line(text: str) -> str | None:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _positional_output(words: list[str]) -> str | None:
    """The output dir the exporter was given (its last word), for listing what was written there."""
    return words[-1] if len(words) > 2 and not words[-1].startswith("-") else None


# `docker run` options the boot script uses (the rest are refused, so that a new one is noticed).
# --network: this process already shares the (test) host's network, as `--network host` makes the export's container.
DOCKER_RUN_VALUE_OPTIONS = {"--entrypoint", "--device", "-e", "--env", "--env-file", "-v", "--volume", "--name",
                            "--network"}
DOCKER_RUN_FLAGS = {"--rm", "-i", "-t", "-it", "-d"}


def docker_run_to_container(docker_argv: list[str]) -> tuple[list[str], int, dict[str, str], list[tuple[str, str]]]:
    """Splits `docker run ...` (the words after `docker`) into what the container gets: its argv (entrypoint
    first), how many /dev/neuronN it sees, its environment additions, and the -v mounts (host, container)."""
    if docker_argv[:1] != ["run"]:
        raise ValueError(f"not a docker run: {docker_argv}")
    entrypoint: str | None = None
    devices = 0
    env: dict[str, str] = {}
    mounts: list[tuple[str, str]] = []
    i = 1
    while i < len(docker_argv) and docker_argv[i].startswith("-"):
        opt = docker_argv[i]
        if opt in DOCKER_RUN_FLAGS:
            i += 1
            continue
        if opt not in DOCKER_RUN_VALUE_OPTIONS or i + 1 >= len(docker_argv):
            raise ValueError(f"docker run option not handled: {opt}")
        value = docker_argv[i + 1]
        if opt == "--entrypoint":
            entrypoint = value
        elif opt == "--device":
            devices += 1 if value.split(":", 1)[0].startswith("/dev/neuron") else 0
        elif opt in ("-e", "--env"):
            key, _, val = value.partition("=")
            env[key] = val
        elif opt == "--env-file":
            for line in Path(value).read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                    key, _, val = line.partition("=")
                    env[key.strip()] = val
        elif opt in ("-v", "--volume"):
            host, container = value.split(":")[:2]
            mounts.append((host, container))
        i += 2
    if i >= len(docker_argv):
        raise ValueError(f"no image in {docker_argv}")
    command = docker_argv[i + 1 :]
    argv = [entrypoint, *command] if entrypoint is not None else command
    return argv, devices, env, mounts


def to_host_paths(argv: list[str], mounts: list[tuple[str, str]]) -> list[str]:
    """The argv with each container path under a -v mount replaced by its host path (this process has no mounts)."""
    out = []
    for word in argv:
        for host, container in mounts:
            if word == container or word.startswith(container.rstrip("/") + "/"):
                word = host.rstrip("/") + word[len(container.rstrip("/")) :]
                break
        out.append(word)
    return out


def add_compile_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--compile-cache`` mode's options, shared by both runners."""
    parser.add_argument("--compile-cache", action="store_true",
                        help="run the real export and Hub cache over the imitated compile path (neuron_compile.py)")
    parser.add_argument("--local-cache", help="the directory standing for /var/tmp/neuron-compile-cache")
    parser.add_argument("--s3-root", help="the directory holding the S3 compile cache's objects (s3://b/k is b/k)")
    parser.add_argument("--s3-denies-misses", action="store_true",
                        help="the S3 compile cache's lookup of a key it lacks raises HeadObject's 403")
    parser.add_argument("--scratch", help="the compiler's working files (default: a new temporary directory)")


def compile_cache_options(ns: argparse.Namespace) -> dict[str, Any] | None:
    if not ns.compile_cache:
        return None
    import tempfile

    if ns.local_cache:
        _neuron_compile().DEFAULT_CACHE_DIR = ns.local_cache
    return {"s3_root": ns.s3_root, "scratch": ns.scratch or tempfile.mkdtemp(prefix="nxd-scratch-"),
            "s3_denies_misses": ns.s3_denies_misses}


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", help="the container argv as a JSON list, instead of the words after --")
    parser.add_argument(
        "--neuron-devices", type=int, default=0, help="how many /dev/neuronN the container sees (default 0)"
    )
    parser.add_argument(
        "--docker-run",
        action="store_true",
        help="the argv is a whole `docker run ...` (without `docker`): --device, -e, --env-file and -v are applied",
    )
    add_compile_cache_arguments(parser)
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- optimum-cli export neuron ...")
    ns = parser.parse_args(args)
    words = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if ns.json is not None:
        if words:
            parser.error("give the argv either with --json or after --, not both")
        words = json.loads(ns.json)
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            parser.error("--json must be a JSON list of strings")
    devices = ns.neuron_devices
    extra: dict[str, Any] = {}
    if ns.docker_run:
        container_argv, devices, env, mounts = docker_run_to_container(words)
        os.environ.update(env)
        words = to_host_paths(container_argv, mounts)
        extra = {"container_argv": container_argv, "container_env": env, "mounts": [list(m) for m in mounts]}
    result = run([str(w) for w in words], devices, compile_cache_options(ns))
    result.update(extra)
    sys.stdout.write(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
