"""Runs a vLLM container's ``vllm`` argv through that vLLM's real CLI on CPU, and records what would reach its engine
and its server: vLLM 0.13.0's or vLLM 0.16.0's, whichever venv's python runs it.

Run it with the python of a tools venv that ``requirements-vllm-0.13.0.txt`` or ``requirements-vllm-0.16.0.txt``
builds, never with the project's venv::

    .tools/vllm-0.13.0/bin/python tests/harness/vllm_cli.py \\
        --json '["vllm", "serve", "/models/x", "--port", "8080", "--tensor-parallel-size", "2", ...]'

It prints one JSON object: ``exit_code`` (argparse's refusal is 2, as the container's process would end),
``error`` (the last exception, or argparse's ``error:`` line), ``stderr_tail``, ``subcommand``, ``args`` (the
JSON-able fields of the namespace the subcommand's parser made, after its validate hook; the names of the others
under ``args_not_json``), ``engine_args`` (every field of the ``AsyncEngineArgs`` that ``from_cli_args`` made from
it) and, for ``run-batch``, ``run_batch`` (what the real batch runner did with a fake engine).

What runs for real (vLLM's PyPI wheel, without AWS's vllm-neuron platform plugin, which is not on PyPI; its compiled
CUDA part fails to load here, which vLLM only logs): vLLM 0.13.0, the version AWS's Deep Learning Container
pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04 bundles, or vLLM 0.16.0, which
pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04 bundles. The files named below are the
same in both wheels but where a version is named; 0.16.0's were read in its installed wheel.

- ``vllm`` itself: ``vllm.entrypoints.cli.main:main`` (the console script), with the real subparsers of every
  subcommand it registers. ``serve``: ``make_arg_parser`` (vllm/entrypoints/openai/cli_args.py: FrontendArgs and
  ``AsyncEngineArgs.add_cli_args``) and its validate hook ``validate_parsed_serve_args``; ``ServeSubcommand.cmd``
  (vllm/entrypoints/cli/serve.py), which moves the positional model tag into ``args.model`` and picks how to run.
  ``run-batch``: ``make_arg_parser`` of vllm/entrypoints/openai/run_batch.py (its own flags and
  ``AsyncEngineArgs.add_cli_args``: no FrontendArgs), ``RunBatchSubcommand.cmd`` (vllm/entrypoints/cli/run_batch.py)
  and run_batch.py's ``main``: ``validate_run_batch_args``, ``api_server.build_async_engine_client`` (whose
  ``AsyncEngineArgs.from_cli_args`` makes the engine's arguments) and ``run_batch``, which builds the OpenAI serving
  objects over the engine client (0.16.0: ``build_endpoint_registry``), reads ``--input-file``, runs each request
  and writes ``--output-file``.
- ``AsyncEngineArgs.from_cli_args(args)`` (vllm/engine/arg_utils.py), for ``serve`` in the replaced worker,
  for ``run-batch`` inside the real ``build_async_engine_client``.

What is replaced (only what would start an engine or a server):

- ``serve``: in vllm/entrypoints/openai/api_server.py, ``create_server_socket`` (which would bind the port; the
  address is recorded) and ``run_server_worker`` (which would start the engine, build the app and run uvicorn); in
  vllm/entrypoints/cli/serve.py, ``run_headless`` and ``run_multi_api_server`` (which start engine processes).
  ``run_server`` runs for real up to its worker: ``setup_server`` with ``validate_api_server_args`` (which refuses
  an unregistered ``--tool-call-parser`` or reasoning parser). Each replacement records which one was called and
  runs ``AsyncEngineArgs.from_cli_args(args)``; nothing after it (``create_engine_config`` needs the model's files
  and the Neuron platform) runs.
- ``run-batch``: ``build_async_engine_client_from_engine_args`` in vllm/entrypoints/openai/api_server.py (which would
  create the engine config and start ``AsyncLLM``) yields ``FakeEngineClient``: a Llama model config's few fields
  the serving objects read, and the tasks a generative model supports (``generate``). No request reaches it: with a
  request, ``run_batch`` would call its ``generate``, which it does not have.
  ``run_batch`` is wrapped (the real one runs inside) to record that it returned and the output's line count.
- ``prometheus_client.start_http_server`` (run-batch's ``--enable-metrics``) is recorded, not run.
- The platform: vllm-neuron's ``vllm.platform_plugins`` entry point is imitated by package metadata that names
  ``register`` here, whose ``NeuronPlatformStandIn`` has the class attributes of vllm-neuron's ``NeuronPlatform``
  (an out-of-tree platform of device type ``cpu``) and none of its methods. Without a platform vLLM cannot build its
  parsers (``DeviceConfig``'s default asks for the device type). vLLM 0.16.0 loads plugins the same way
  (vllm/platforms/__init__.py ``resolve_current_platform_cls_qualname``, vllm/plugins/__init__.py
  ``load_plugins_by_group``).

Versions: vllm 0.13.0 or 0.16.0 (PyPI), torch 2.13.0 CPU in place of the 2.9.0 or 2.9.1 they pin (this machine's
wheel), the rest as each requirements file says; Python 3.11 here, 3.12 in the images.

vLLM reads no model files on this path, but ``HF_HUB_OFFLINE=1`` (set unless ``--env`` says otherwise, as the
replicas run) makes ``EngineArgs.__post_init__`` look a model that is not an existing path up in the Hub's cache
(``get_model_path``): give the model as a folder that exists.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import importlib.abc
import importlib.metadata
import io
import json
import os
import re
import sys
import tempfile
import traceback
import types
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tee import Tee

# The engine's fields for reports (the whole dataclass is under engine_args) and the server's (FrontendArgs).
PLUGIN_DISTRIBUTION = "vllm-neuron-standin"
FRONTEND_FIELDS = ("port", "host", "disable_uvicorn_access_log", "disable_fastapi_docs", "lora_modules",
                   "enable_auto_tool_choice", "tool_call_parser", "headless", "api_server_count")


def jsonable(value: Any) -> Any:
    """``value`` as JSON: dataclasses and pydantic models by field, enums by value, anything else by repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return jsonable(value.model_dump())
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    return repr(value)


def is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class NeuronPlatformPlugin(importlib.abc.MetaPathFinder):
    """The package metadata of a stand-in for AWS's vllm-neuron: its ``vllm.platform_plugins`` entry point, which
    vLLM's ``resolve_current_platform_cls_qualname`` (vllm/platforms/__init__.py) loads and activates, as it would
    the real plugin's, before building the parsers (``DeviceConfig``'s default, a parser default, asks the platform
    for its device type: with no platform, vLLM 0.13.0 cannot even make its parser here, and vLLM 0.16.0's ``serve``
    ends with "RuntimeError: Failed to infer device type")."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        return None

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None or re.sub(r"[-_.]+", "-", name).lower() == PLUGIN_DISTRIBUTION:
            return iter([_PluginDistribution()])
        return iter([])


class _PluginDistribution(importlib.metadata.Distribution):
    def read_text(self, filename: str) -> str | None:
        if filename in ("METADATA", "PKG-INFO"):
            return f"Metadata-Version: 2.1\nName: {PLUGIN_DISTRIBUTION}\nVersion: 0\n"
        if filename == "entry_points.txt":
            return f"[vllm.platform_plugins]\nneuron = {Path(__file__).stem}:register\n"
        return None

    def locate_file(self, path: Any) -> Any:
        return None


def register() -> str:
    """The entry point: the stand-in platform's qualified name. Its class attributes are those of
    vllm_neuron/platform.py ``NeuronPlatform`` (vllm-project/vllm-neuron; the same at its 0.2.0 tag and in its main
    branch of 2025-11-18, 61abf3f; that the images' plugins, release-0.4.1 and release-0.5.3, have the same is
    unverified): an out-of-tree platform whose device type is ``cpu``. None of its methods is here: they act on a
    ``VllmConfig`` (``create_engine_config``), which nothing here makes."""
    from vllm.platforms import Platform, PlatformEnum

    class NeuronPlatformStandIn(Platform):
        _enum = PlatformEnum.OOT
        device_name = "cpu"
        device_type = "cpu"
        ray_device_key = "neuron_cores"
        supported_quantization: ClassVar[list[str]] = ["neuron_quant", "fbgemm_fp8"]
        device_control_env_var = "NEURON_RT_VISIBLE_CORES"

    globals()["NeuronPlatformStandIn"] = NeuronPlatformStandIn
    return f"{__name__}.NeuronPlatformStandIn"


class FakeEngineClient:
    """Stands for the ``AsyncLLM`` that ``build_async_engine_client_from_engine_args`` would start: what
    ``run_batch``'s serving objects read when they are built (``__init__`` in vllm/entrypoints/openai/
    serving_models.py, serving_engine.py, serving_chat.py in 0.13.0; models/serving.py, engine/serving.py,
    chat_completion/serving.py in 0.16.0)."""

    def __init__(self, engine_args: Any, record: dict[str, Any]) -> None:
        self._record = record
        self.input_processor = None
        self.io_processor = None
        # vLLM 0.16.0 reads the engine's renderer too (models/serving.py), and the text config's model type
        # (chat_completion/serving.py, for Kimi K2's tool call ids); 0.13.0 reads neither.
        self.renderer = None
        hf_config = types.SimpleNamespace(model_type="llama", num_labels=0)
        self.model_config = types.SimpleNamespace(
            model=engine_args.model, max_model_len=engine_args.max_model_len, logits_processors=None,
            generation_config="auto", hf_config=hf_config, hf_text_config=hf_config, get_diff_sampling_param=dict)

    async def get_supported_tasks(self) -> tuple[str, ...]:
        self._record.setdefault("calls", []).append("get_supported_tasks")
        return ("generate",)


def run(argv: list[str]) -> dict[str, Any]:
    """``argv`` (``vllm`` first) through vLLM's real CLI, with the recorders in place."""
    record: dict[str, Any] = {"argv": argv}
    import prometheus_client
    from vllm import platforms
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli import main as cli_main
    from vllm.entrypoints.cli import serve as cli_serve
    from vllm.entrypoints.openai import api_server

    def take(args: argparse.Namespace) -> None:
        fields = vars(args)
        record["subcommand"] = fields.get("subparser")
        record["args"] = {k: v for k, v in fields.items() if is_json(v)}
        record["args_not_json"] = sorted(k for k, v in fields.items() if not is_json(v))
        record["frontend"] = {k: jsonable(fields[k]) for k in FRONTEND_FIELDS if k in fields}

    def take_engine_args(engine_args: Any) -> None:
        record["engine_args"] = {
            f.name: jsonable(getattr(engine_args, f.name)) for f in dataclasses.fields(engine_args)}
        record["engine_args_types"] = {
            k: type(getattr(engine_args, k)).__name__
            for k in ("additional_config", "speculative_config", "enable_prefix_caching", "served_model_name")}

    def replaced(name: str) -> Any:
        def starts(args: argparse.Namespace, *_: Any, **__: Any) -> Any:
            record["started"] = name
            take(args)
            take_engine_args(AsyncEngineArgs.from_cli_args(args))
        return starts

    async def run_server_worker(listen_address: str, sock: Any, args: argparse.Namespace, *_: Any, **__: Any) -> None:
        record["listen_address"] = listen_address
        replaced("run_server_worker")(args)

    def create_server_socket(address: tuple[str, int]) -> None:
        record["server_socket"] = list(address)

    @contextlib.asynccontextmanager
    async def fake_engine(engine_args: Any, **kwargs: Any) -> AsyncIterator[FakeEngineClient]:
        batch = record.setdefault("run_batch", {})
        batch["engine_started_with"] = {k: jsonable(v) for k, v in kwargs.items()}
        take_engine_args(engine_args)
        yield FakeEngineClient(engine_args, batch)
        batch["engine_closed"] = True

    real_run_batch: Any = None

    async def run_batch(engine_client: Any, args: argparse.Namespace) -> None:
        take(args)
        batch = record["run_batch"]
        await real_run_batch(engine_client, args)
        batch["completed"] = True
        output = Path(args.output_file)
        if output.is_file():
            batch["output_lines"] = len(output.read_text(encoding="utf-8").splitlines())

    api_server.create_server_socket = create_server_socket  # type: ignore[assignment]
    api_server.run_server_worker = run_server_worker  # type: ignore[assignment]
    cli_serve.run_headless = replaced("run_headless")  # type: ignore[assignment]
    cli_serve.run_multi_api_server = replaced("run_multi_api_server")  # type: ignore[assignment]
    api_server.build_async_engine_client_from_engine_args = fake_engine  # type: ignore[assignment]
    prometheus_client.start_http_server = (  # type: ignore[assignment]
        lambda port, addr="0.0.0.0", **_: record.setdefault("metrics_server", {"port": port, "addr": addr}))
    from vllm.entrypoints.openai import run_batch as batch_module
    real_run_batch = batch_module.run_batch
    batch_module.run_batch = run_batch  # type: ignore[assignment]

    record["platform"] = type(platforms.current_platform).__name__
    saved, code, stderr = sys.argv, 0, io.StringIO()
    sys.argv = list(argv)
    try:
        with contextlib.redirect_stderr(Tee(sys.stderr, stderr)):
            cli_main.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        refusal = [line for line in stderr.getvalue().splitlines() if ": error: " in line]
        if code and refusal:
            record["error"] = refusal[-1]
    except Exception as error:  # the container's process would end with it
        code, record["error"] = 1, "".join(traceback.format_exception_only(error)).strip()
        record["traceback_tail"] = traceback.format_exc().splitlines()[-12:]
    finally:
        sys.argv = saved
    record["exit_code"] = code
    record["stderr_tail"] = stderr.getvalue().splitlines()[-5:]
    return record


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", required=True, help="the container's argv, vllm first, as a JSON list")
    parser.add_argument("--env", default="{}", help="the container's environment additions, as a JSON object")
    ns = parser.parse_args(args)
    # The JSON alone on stdout: everything else (vLLM's logger writes to stdout) goes to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    argv = json.loads(ns.json)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(json.loads(ns.env))
    os.environ["VLLM_CACHE_ROOT"] = tempfile.mkdtemp(prefix="vllm-cache-")
    sys.meta_path.insert(0, NeuronPlatformPlugin())
    result = run([str(w) for w in argv])
    out.write(json.dumps(result, indent=2, sort_keys=True, default=str) + "\n")
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
