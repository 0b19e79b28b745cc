"""Runs a vLLM image container's ``optimum-cli`` argv through optimum-neuron 0.4.5's real CLI, with vLLM 0.11.0's
real argument parsing, and records what reaches the compiler and vLLM's server.

Run it with the python of the tools venv that ``requirements-optimum-neuron-0.4.5.txt`` builds, never with the
project's venv::

    .tools/optimum-neuron-0.4.5/bin/python tests/harness/optimum_neuron_045.py --devices 1 --instance inf2.24xlarge \\
        --json '["optimum-cli", "neuron", "serve", "--port", "8080", "--model", "/tmp/x", ...]'

It prints one JSON object: ``exit_code``, ``error`` (the last exception, if any), and what was recorded:
``compile`` (the ``NxDNeuronConfig`` that reached the compiler, its graphs and compiler arguments) and
``output_files`` for an export; ``run_server`` (the namespace vLLM's own ``make_arg_parser`` /
``validate_parsed_serve_args`` produced from serve's argv) and ``engine_config`` (the ``VllmConfig`` vLLM would
start its engine with, on optimum-neuron's platform plugin) for serve.

What runs for real (huggingface/optimum-neuron tag v0.4.5, whose PyPI wheel is the tag's ``optimum/`` tree; vLLM
0.11.0's PyPI wheel, whose compiled CUDA part fails to load here, which vLLM only logs):

- ``optimum-cli`` (``optimum.commands.optimum_cli:main``). ``export neuron`` runs
  ``python3 -m optimum.exporters.neuron ...`` (optimum/commands/export/neuronx.py), here in-process with the same
  words; the exporter builds the model class's ``NxDNeuronConfig`` and ``save_pretrained`` writes the real
  ``config.json`` and ``neuron_config.json``. ``neuron serve`` (optimum/commands/neuron/serve.py) reads the
  instance type and the export's ``neuron_config.json``, checks them, and builds vLLM's argv, which vLLM parses.
- optimum-neuron's vLLM platform plugin, found through its ``vllm.platform_plugins`` entry point.

What is replaced (the lowest calls that need the Neuron SDK, hardware or the network):

- ``NxDPreTrainedModel.compile`` (the trace and compile), ``torch.jit.save`` of its result and
  ``NxDPreTrainedModel.shard_checkpoint`` are recorded, not run (optimum/neuron/models/inference/backend/
  pretrained_model.py).
- ``hub_cache.get_hub_cached_entries`` (a Hub request) returns no entry.
- serve's ``run_server`` is recorded; after it, ``AsyncEngineArgs.from_cli_args(args).create_engine_config()``
  runs for real.
- The Neuron SDK modules are import stubs (tests/harness/optimum_neuron.py), with package metadata: 0.4.5's
  ``is_package_available`` also asks ``importlib.metadata`` (optimum/neuron/utils/import_utils.py). Versions are
  the ``[neuronx]`` extra's pins (torch_xla's is not pinned there: 2.8.1, unverified).
- The host, as optimum/neuron/utils/system.py reads it: ``/proc/devices`` with a ``neuron`` major, ``--devices``
  ``/dev/neuronN`` nodes of that major, and ``/sys/devices/virtual/dmi/id/product_name`` = ``--instance``; only
  that module's ``os`` and ``open`` see them, from right after it executes (``optimum/neuron/__init__.py``
  reads them at import).

With ``--compile-cache`` (and ``--local-cache``, ``--s3-root``: tests/harness/optimum_neuron.py) ``compile`` is the
real one, and with it NxD's ModelBuilder path into libneuronxla's cache as hub_neuronx_cache patches it
(optimum/neuron/models/inference/backend/pretrained_model.py ``_export``, optimum/neuron/cache/hub_cache.py); what
lies below optimum-neuron is imitated by tests/harness/neuron_compile.py and recorded under ``compile_cache``.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import optimum_neuron as harness_030

STUB_VERSIONS = {
    # optimum-neuron v0.4.5 pyproject.toml, extra neuronx.
    "torch_neuronx": "2.8.0.2.10.16998",
    "neuronx_distributed": "0.15.22404",
    "neuronxcc": "2.21.33363.0+82129205",
    "libneuronxla": "2.2.12677.0",
    "torch_xla": "2.8.1",
}
DISTRIBUTIONS = {"torch-neuronx": "torch_neuronx", "neuronx-distributed": "neuronx_distributed",
                 "neuronx-cc": "neuronxcc", "libneuronxla": "libneuronxla", "torch-xla": "torch_xla"}
NEURON_MAJOR = 245
"""The character device major /proc/devices gives the neuron driver here (any number not in use)."""
SERVE_FIELDS = ("model", "served_model_name", "task", "tensor_parallel_size", "max_num_seqs", "max_model_len",
                "port", "host", "dtype", "disable_uvicorn_access_log", "disable_fastapi_docs",
                "model_loader_extra_config")


class _Distribution(importlib.metadata.Distribution):
    def __init__(self, name: str, version: str) -> None:
        self._text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename: str) -> str | None:
        return self._text if filename in ("METADATA", "PKG-INFO") else None

    def locate_file(self, path: Any) -> Any:
        return None


class NeuronSdkStubFinder(harness_030.NeuronSdkStubFinder):
    """The 0.3.0 harness's stub modules, with 0.4.5's versions and package metadata."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = super().create_module(spec)
        if spec.name in STUB_VERSIONS:
            module.__version__ = STUB_VERSIONS[spec.name]  # type: ignore[attr-defined]
        return module

    def find_distributions(self, context: Any = None) -> Iterator[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        root = DISTRIBUTIONS.get(re.sub(r"[-_.]+", "-", name).lower()) if name else None
        return iter([_Distribution(name, STUB_VERSIONS[root])] if root else [])


class _HostOs(types.ModuleType):
    """``os`` for optimum/neuron/utils/system.py: ``devices`` /dev/neuronN of the neuron major."""

    def __init__(self, devices: int) -> None:
        super().__init__("os")
        self._devices = devices
        self.path = _HostPath()

    def walk(self, top: str, *args: Any, **kwargs: Any) -> Iterator[tuple[str, list[str], list[str]]]:
        if os.path.normpath(top) == "/dev":
            return iter([("/dev", [], [f"neuron{i}" for i in range(self._devices)])])
        return os.walk(top, *args, **kwargs)

    def stat(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        match = re.fullmatch(r"/dev/neuron(\d+)", str(path))
        if match and int(match.group(1)) < self._devices:
            return types.SimpleNamespace(st_rdev=os.makedev(NEURON_MAJOR, int(match.group(1))), st_mode=0o20666)
        return os.stat(path, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


class _HostPath(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("os.path")

    def exists(self, path: Any) -> bool:
        return path in ("/proc/devices", "/sys/devices/virtual/dmi/id/product_name") or os.path.exists(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(os.path, name)


def _host_open(instance: str) -> Callable[..., Any]:
    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if file == "/proc/devices":
            return io.StringIO(f"Character devices:\n  1 mem\n{NEURON_MAJOR} neuron\n\nBlock devices:\n")
        if file == "/sys/devices/virtual/dmi/id/product_name":
            return io.StringIO(instance + "\n")
        return builtins.open(file, mode, *args, **kwargs)
    return open_


class _AfterExec(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` right after module ``name`` has executed."""

    def __init__(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = next((s for f in sys.meta_path if f is not self and hasattr(f, "find_spec")
                     for s in [f.find_spec(fullname, path, target)] if s is not None), None)
        if spec is None or spec.loader is None:
            return None
        loader, callback = spec.loader, self.callback

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: types.ModuleType) -> None:
                loader.exec_module(module)
                callback(module)

        spec.loader = _Loader()
        return spec


def install(devices: int, instance: str) -> None:
    """The SDK stubs and the simulated host; before anything of optimum is imported."""
    sys.meta_path.insert(0, NeuronSdkStubFinder())

    def simulate(module: types.ModuleType) -> None:
        module.os = _HostOs(devices)  # type: ignore[attr-defined]
        module.open = _host_open(instance)  # type: ignore[attr-defined]
        for cached in ("get_neuron_major", "get_instance_name", "cores_per_device"):
            getattr(module, cached).cache_clear()

    sys.meta_path.insert(0, _AfterExec("optimum.neuron.utils.system", simulate))


class Traced:
    """Stands for the traced model ModelBuilder would return."""


def run(argv: list[str], compile_cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """``argv`` through the real ``optimum-cli``, with the recorders in place (``compile_cache``: see
    ``optimum_neuron.run``)."""
    record: dict[str, Any] = {"argv": argv}
    if compile_cache is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import neuron_compile

        record["compile_cache"] = neuron_compile.install(
            harness_030.stub_module, compile_through="neuron_xla_compile", traced=Traced, **compile_cache)
    import torch
    from optimum.commands import optimum_cli
    from optimum.commands.export import neuronx as cli_export
    from optimum.commands.neuron import serve as cli_serve
    from optimum.neuron.cache import hub_cache
    from optimum.neuron.models.inference.backend import pretrained_model

    class InProcess(types.ModuleType):
        """``subprocess`` for optimum/commands/export/neuronx.py: its ``python3 -m optimum.exporters.neuron``
        command, split as /bin/sh would, runs in this process."""

        CalledProcessError = subprocess.CalledProcessError

        def run(self, command: str, shell: bool = False, check: bool = False, **_: Any) -> Any:
            words = shlex.split(command)
            record["exporter_argv"] = words
            saved, code = sys.argv, 0
            sys.argv = [words[2], *words[3:]]
            try:
                runpy.run_module(words[2], run_name="__main__", alter_sys=False)
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
            finally:
                sys.argv = saved
            if check and code:
                raise subprocess.CalledProcessError(code, command)
            return subprocess.CompletedProcess(command, code)

    def compile_(neuron_config: Any, graph_builders: Any, compiler_args: str, debug: bool = False) -> Traced:
        record["compile"] = {"neuron_config": json.loads(neuron_config.to_json_string()),
                             "graphs": sorted(graph_builders), "compiler_args": compiler_args}
        return Traced()

    real_save = torch.jit.save

    def jit_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(obj, Traced):
            record["jit_save"] = str(f)
            return None
        return real_save(obj, f, *args, **kwargs)

    async def run_server(args: Any, **_: Any) -> None:
        record["run_server"] = {k: getattr(args, k, None) for k in SERVE_FIELDS}
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
        record["engine_config"] = {
            "platform": type(current_platform).__name__,
            "max_model_len": config.model_config.max_model_len,
            "dtype": str(config.model_config.dtype),
            "served_model_name": config.model_config.served_model_name,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "worker_cls": config.parallel_config.worker_cls,
        }

    cli_export.subprocess = InProcess("subprocess")  # type: ignore[assignment]
    if compile_cache is None:
        pretrained_model.NxDPreTrainedModel.compile = staticmethod(compile_)  # type: ignore[method-assign]
    pretrained_model.NxDPreTrainedModel.shard_checkpoint = (  # type: ignore[method-assign]
        lambda self, src_path, dest_path, debug=False: record.setdefault("shard_checkpoint", str(dest_path)))
    torch.jit.save = jit_save
    hub_cache.get_hub_cached_entries = lambda *args, **kwargs: []
    cli_serve.run_server = run_server  # type: ignore[attr-defined]

    saved, code, stderr = sys.argv, 0, io.StringIO()
    sys.argv = list(argv)
    try:
        with contextlib.redirect_stderr(harness_030.Tee(sys.stderr, stderr)):
            optimum_cli.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except Exception as error:  # the container's process would end with it
        code, record["error"] = 1, "".join(traceback.format_exception_only(error)).strip()
    finally:
        sys.argv = saved
    record["exit_code"] = code
    record["stderr_tail"] = stderr.getvalue().splitlines()[-5:]
    if argv[1:3] == ["export", "neuron"]:
        out = Path(argv[-1])
        record["output_files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return record


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", required=True, help="the container's argv, optimum-cli first, as a JSON list")
    parser.add_argument("--devices", type=int, default=1, help="the /dev/neuronN the container sees (default 1)")
    parser.add_argument("--instance", default="inf2.8xlarge", help="the host's instance type (default inf2.8xlarge)")
    parser.add_argument("--env", default="{}", help="the container's environment additions, as a JSON object")
    harness_030.add_compile_cache_arguments(parser)
    ns = parser.parse_args(args)
    # The JSON alone on stdout: everything else (vLLM's logger writes to stdout) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    argv = json.loads(ns.json)
    os.environ.update(json.loads(ns.env))
    # vLLM caches its inspection of model architectures; a fresh cache per run keeps runs independent.
    os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm-cache-")
    install(ns.devices, ns.instance)
    result = run([str(w) for w in argv], harness_030.compile_cache_options(ns))
    out.write(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
