"""Imitations of the Neuron SDK's compile-cache path, for the runners' ``--compile-cache`` mode
(tests/harness/optimum_neuron.py, optimum_neuron_045.py), so that optimum-neuron's real cache code runs on top:
``hub_neuronx_cache``, ``create_hub_compile_cache_proxy``, ``CompileCacheHfProxy``, ``get_hf_hub_cache_repo``,
huggingface-hub's ``HfApi``, and (0.3.0) ``neff_cache``.

What each imitates, and from where it is known:

- ``libneuronxla.neuron_cc_cache`` (``CacheUrl``, ``CompileCache``, ``CompileCacheFs``, ``CompileCacheS3``,
  ``create_compile_cache``) and ``libneuronxla.neuron_xla_compile``. libneuronxla's source is not public (its wheels
  come from pip.repos.neuron.amazonaws.com only, unreachable here); what is known of it:
  - the methods optimum-neuron calls on a cache and overrides in ``CompileCacheHfProxy``
    (huggingface/optimum-neuron v0.3.0 and v0.4.5, optimum/neuron/cache/hub_cache.py): ``cache_url``,
    ``cache_path``, ``get_cache_dir(model_hash, compile_flags_str)``, ``get_cache_dir_with_cache_key``,
    ``exists``, ``download_file``, ``upload_file``, ``upload_string_to_file``, ``is_s3()`` of a ``CacheUrl``,
    ``CacheUrl.get_cache_url(cache_dir=None)``, and (v0.3.0 optimum/neuron/models/inference/backend/cache.py)
    ``lookup(cache_key, compiler_args)`` giving an entry with ``exists``, ``neff_path``, ``download_neff``,
    ``download_wrapped_neff``, ``upload_inputs``, ``upload_neff``, used as a context manager (a lock);
  - ``NEURON_COMPILE_CACHE_URL`` chooses the cache, a local directory or ``s3://bucket/prefix``, default
    ``/var/tmp/neuron-compile-cache`` (optimum-neuron docs, guides/cache_system; v0.3.0
    optimum/neuron/utils/cache_utils.py ``get_neuron_cache_path``);
  - the layout, from the public cache's own tree (https://huggingface.co/aws-neuron/optimum-neuron-cache/tree/main/
    neuronxcc-2.14.227.0%2B2d4f85be/MODULE_12f7222c808d10fb46e5%2B2c2d707e):
    ``neuronxcc-<compiler version>/MODULE_<module hash>+<flags hash>/{compile_flags.txt,model.hlo_module.pb,
    model.neff}``; the proxy asks the Hub for the path below the default cache's ``cache_path``
    (hub_cache.py ``_rel_path``). The 20 hex digits of the module hash are NxD's ``get_hash_module`` (below);
    how libneuronxla derives the 8 after ``+`` is not public: here, the first 8 of sha256 of the flags.
  - ``neuron_xla_compile(module_bytes, compiler_flags, ..., cache_key, use_cache=True, cache_dir=None, work_dir)``
    is how NxD's ModelBuilder compiles each graph from NxD 0.15 on (aws-neuron/neuronx-distributed v2.26.0,
    src/neuronx_distributed/trace/model_builder.py ``submit_compilation_job_with_cache``); it looks the NEFF up in
    the cache ``create_compile_cache`` makes, which is why optimum-neuron's ``hub_neuronx_cache`` patches that
    function in every ``libneuronxla`` module (optimum-neuron commit c8549c9e "refactor(nxd): remove neff_cache
    context": "we still need to use the hub_neuronx_cache context to patch the libneuronxla create_compile_cache
    method"). Here the function is looked up in its module at call time, so the patch is what it gets.
  ``CompileCacheS3`` keeps its objects in a local directory (``--s3-root``), and records every call with its
  ``s3://`` URL. With ``--s3-denies-misses`` its lookup of a key it lacks raises what boto3's ``head_object``
  raises when S3 answers 403 (botocore's ClientError message: "An error occurred (403) when calling the
  HeadObject operation: Forbidden"), as S3 answers a role that may not list the bucket: what the real client
  does with that 403 is not public, so this is how code above it fares if the client lets it through.
- ``torch_neuronx.xla_impl.trace`` (``HloArtifacts``, ``NeffArtifacts``, ``setup_compiler_dirs``, ``hlo_compile``,
  ``generate_neff``): the functions optimum-neuron v0.3.0's ``neff_cache`` imports and patches
  (optimum/neuron/models/inference/backend/cache.py). ``hlo_compile`` is the compiler invocation: it is recorded and
  writes ``<workdir>/graph.neff``, the path ``neff_cache`` requires.
- ``neuronx_distributed.trace.model_builder.ModelBuilder`` (``add``, ``trace``), as optimum-neuron's ``get_builder``
  uses it (optimum/neuron/models/inference/backend/pretrained_model.py). ``trace`` makes one graph per model key
  and bucket, as NxD does (v2.26.0 model_builder.py: ``_generate_hlo`` per key, ``_tp0_bk<rank>`` workdirs), and
  compiles each the way the NxD of the image does: through ``torch_neuronx.xla_impl.trace.generate_neff(hlo,
  workdir, flags, False)`` for NxD 0.13 (optimum-neuron 0.3.0, whose ``neff_cache`` patches exactly that; v2.26.0
  keeps it as the fallback "as libneuronxla is outdated"), or through ``libneuronxla.neuron_xla_compile`` for NxD
  0.15 (optimum-neuron 0.4.5). Tracing to HLO needs the SDK: the "HLO" is a text of what defines the graph (model
  key, example input shapes and dtypes, the model config and the ``NxDNeuronConfig`` but its checkpoint path and
  revision, which a real HLO does not contain), hashed as NxD's ``get_hash_module`` hashes ``str(hlo_module)``
  with the flags (v2.26.0 model_builder.py; v0.3.0 backend/cache.py). The flags are optimum-neuron's compiler
  args plus what NxD v2.26.0 appends: ``--logfile=<workdir>/log-neuron-cc.txt`` and, for the priority graph,
  ``--enable-internal-neff-wrapper``.

Everything is recorded in ``record["compile_cache"]``: ``events`` (every default-cache call), ``lookups``
(graph, path relative to the cache, where found: ``default cache``, ``hub`` or None), ``fetches``,
``compilations``, ``uploads``; the runners add ``log`` (optimum-neuron's cache log lines).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_CACHE_DIR = "/var/tmp/neuron-compile-cache"
NEFF = "model.neff"
LOG_FILE = "log-neuron-cc.txt"  # NxD v2.26.0 model_builder.py LOG_FILE_DEFAULT_NAME


def get_hash_module(hlo_module: Any, flags: str | None) -> str:
    """NxD's (v2.26.0 src/neuronx_distributed/trace/model_builder.py) and optimum-neuron v0.3.0's
    (backend/cache.py) cache key: sha256 of ``str(hlo_module)`` and the flags without spaces, 20 hex digits."""
    text = str(hlo_module)
    if flags is not None:
        text += flags.replace(" ", "")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


class Recorder:
    def __init__(self, s3_root: str | None, s3_denies_misses: bool = False) -> None:
        self.data: dict[str, Any] = {"events": [], "lookups": [], "fetches": [], "compilations": [], "uploads": []}
        self.s3_root = s3_root
        self.s3_denies_misses = s3_denies_misses
        self.graph: str | None = None

    def event(self, cache: str, op: str, target: str, **more: Any) -> None:
        self.data["events"].append({"cache": cache, "op": op, "target": target, "graph": self.graph, **more})


REC: Recorder = Recorder(None)


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# libneuronxla.neuron_cc_cache
# ----------------------------------------------------------------------------------------------------------------
class CacheUrl:
    def __init__(self, url: str, url_type: str | None = None) -> None:
        self.url = url
        self.url_type = url_type or ("s3" if url.startswith("s3://") else "fs")

    def is_s3(self) -> bool:
        return self.url_type == "s3"

    @classmethod
    def get_cache_url(cls, cache_dir: str | None = None) -> CacheUrl:
        return cls(cache_dir or os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_CACHE_DIR)


def _compiler_dir() -> str:
    import neuronxcc

    return f"neuronxcc-{neuronxcc.__version__}"


class CompileCache:
    """What every cache has; ``lookup`` gives v0.3.0's ``neff_cache`` its entry, through this cache's own
    (possibly overridden, as by the Hub proxy) ``get_cache_dir``, ``exists``, ``download_file``, ``upload_file``."""

    cache_type = "base"

    def __init__(self, cache_url: CacheUrl) -> None:
        self.cache_url = cache_url
        self.cache_path = cache_url.url.rstrip("/")

    def get_cache_dir_with_cache_key(self, key: str) -> str:
        return f"{self.cache_path}/{_compiler_dir()}/{key}"

    def get_cache_dir(self, model_hash: str, compile_flags_str: str) -> str:
        flags_hash = hashlib.sha256(compile_flags_str.encode()).hexdigest()[:8]
        return self.get_cache_dir_with_cache_key(f"MODULE_{model_hash}+{flags_hash}")

    def lookup(self, cache_key: str, compiler_args: Any) -> _Entry:
        flags = compiler_args if isinstance(compiler_args, str) else json.dumps(compiler_args)
        return _Entry(self, self.get_cache_dir(cache_key, flags))

    def clean(self) -> None:
        pass

    def clear_locks(self) -> None:
        pass

    def hlo_acquire_lock(self, h: str) -> bool:
        return True

    def hlo_release_lock(self, h: str) -> None:
        pass


class CompileCacheFs(CompileCache):
    cache_type = "fs"

    def _local(self, path: str) -> str:
        return path

    def _name(self, path: str) -> str:
        return path

    def exists(self, path: str) -> bool:
        found = os.path.exists(self._local(path))
        REC.event(self.cache_type, "exists", self._name(path), result=found)
        return found

    def download_file(self, filename: str, dst_path: str) -> None:
        REC.event(self.cache_type, "download_file", self._name(filename), dst=dst_path)
        shutil.copyfile(self._local(filename), dst_path)

    def upload_file(self, cache_path: str, src_path: str) -> None:
        REC.event(self.cache_type, "upload_file", self._name(cache_path))
        os.makedirs(os.path.dirname(self._local(cache_path)), exist_ok=True)
        shutil.copyfile(src_path, self._local(cache_path))

    def upload_string_to_file(self, cache_path: str, data: str) -> None:
        REC.event(self.cache_type, "upload_string_to_file", self._name(cache_path))
        os.makedirs(os.path.dirname(self._local(cache_path)), exist_ok=True)
        Path(self._local(cache_path)).write_text(data)

    def download_file_to_string(self, filename: str, limit: int | None = None) -> str:
        REC.event(self.cache_type, "download_file_to_string", self._name(filename))
        return Path(self._local(filename)).read_text()[:limit]

    def remove(self, path: str) -> None:
        REC.event(self.cache_type, "remove", self._name(path))
        if os.path.exists(self._local(path)):
            os.remove(self._local(path))


class S3AccessDenied(Exception):
    """botocore's ClientError for a 403 of HeadObject, by its message (the tool venvs have no botocore)."""


class CompileCacheS3(CompileCacheFs):
    """An S3 cache whose objects are files below ``--s3-root`` (``s3://b/p/k`` is ``<root>/b/p/k``); its events
    name the ``s3://`` URL."""

    cache_type = "s3"

    def exists(self, path: str) -> bool:
        if REC.s3_denies_misses and not os.path.exists(self._local(path)):
            REC.event(self.cache_type, "exists", self._name(path), result=403)
            raise S3AccessDenied("An error occurred (403) when calling the HeadObject operation: Forbidden")
        return super().exists(path)

    def _local(self, path: str) -> str:
        if REC.s3_root is None:
            raise RuntimeError(f"an S3 compile cache ({path}) needs the runner's --s3-root")
        return os.path.join(REC.s3_root, path.removeprefix("s3://"))


def create_compile_cache(cache_url: CacheUrl) -> CompileCache:
    return CompileCacheS3(cache_url) if cache_url.is_s3() else CompileCacheFs(cache_url)


class _Entry:
    """The entry ``CompileCache.lookup`` gives (v0.3.0 backend/cache.py uses it)."""

    def __init__(self, cache: CompileCache, cache_dir: str) -> None:
        self.cache, self.cache_dir = cache, cache_dir
        self.neff_path = f"{cache_dir}/{NEFF}"
        self.exists = _lookup(cache, self.neff_path)

    def __enter__(self) -> _Entry:
        self.cache.hlo_acquire_lock(self.cache_dir)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cache.hlo_release_lock(self.cache_dir)

    def download_neff(self, dst: str) -> None:
        _fetch(self.cache, self.neff_path, dst)

    def download_wrapped_neff(self, dst: str) -> None:
        # Only when the compiler made one (weights not in their optimal layout): never here.
        return None

    def upload_inputs(self, compiler_target: str, compile_flags_str: str) -> None:
        _upload_inputs(self.cache, self.cache_dir, compiler_target, compile_flags_str)

    def upload_neff(self, neff: str) -> None:
        _upload(self.cache, self.neff_path, neff)

    def upload_wrapped_neff(self, path: str) -> None:
        _upload(self.cache, f"{self.cache_dir}/wrapped_neff.hlo", path)


def _rel(cache: Any, path: str) -> str:
    root = getattr(cache, "default_cache", cache).cache_path
    return path[len(root) :].lstrip("/") if path.startswith(root) else path


def _lookup(cache: Any, neff_path: str) -> bool:
    start = len(REC.data["events"])
    found = bool(cache.exists(neff_path))
    in_default = any(e["op"] == "exists" and e["result"] for e in REC.data["events"][start:])
    where = ("default cache" if in_default else "hub") if found else None
    REC.data["lookups"].append({"graph": REC.graph, "path": _rel(cache, neff_path), "found": where,
                                "cache": type(cache).__name__, "default_cache": _default_url(cache)})
    return found


def _default_url(cache: Any) -> str:
    return str(getattr(cache, "default_cache", cache).cache_url.url)


def _fetch(cache: Any, neff_path: str, dst: str) -> None:
    start = len(REC.data["events"])
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    cache.download_file(neff_path, dst)
    from_default = any(e["op"] == "download_file" for e in REC.data["events"][start:])
    REC.data["fetches"].append({"graph": REC.graph, "path": _rel(cache, neff_path),
                                "from": "default cache" if from_default else "hub", "sha256": _sha256(dst)})


def _upload(cache: Any, path: str, src: str) -> None:
    REC.data["uploads"].append({"graph": REC.graph, "path": _rel(cache, path), "to": _default_url(cache)})
    cache.upload_file(path, src)


def _upload_inputs(cache: Any, cache_dir: str, hlo_path: str, flags: str) -> None:
    inputs = Path(hlo_path).parent
    (inputs / "compile_flags.txt").write_text(flags)
    _upload(cache, f"{cache_dir}/compile_flags.txt", str(inputs / "compile_flags.txt"))
    _upload(cache, f"{cache_dir}/model.hlo_module.pb", hlo_path)


def _compile(hlo_text: str, flags: str, workdir: str) -> str:
    """The compiler invocation: recorded; writes ``<workdir>/graph.neff``."""
    neff = os.path.join(workdir, "graph.neff")
    os.makedirs(workdir, exist_ok=True)
    Path(neff).write_bytes(b"NEFF imitation of " + hashlib.sha256(hlo_text.encode()).hexdigest().encode())
    REC.data["compilations"].append({"graph": REC.graph, "module_hash": get_hash_module(hlo_text, flags),
                                     "flags": flags})
    return neff


def neuron_xla_compile(module_bytes: bytes, compiler_flags: str, input_format: str = "hlo",
                       platform_target: str | None = None, cache_key: str | None = None,
                       retry_failed_compilation: bool = False, lazy: bool = True, use_cache: bool = True,
                       cache_dir: str | None = None, work_dir: Any = None, create_subdir: bool = True) -> bytes:
    """libneuronxla's compile with its cache: ``create_compile_cache`` is read from this module when called, so that
    ``hub_neuronx_cache``'s patch (optimum/neuron/utils/patching.py ``patch_everywhere``) is what runs."""
    workdir = str(work_dir)
    hlo_text = module_bytes.decode()
    if not use_cache:
        return Path(_compile(hlo_text, compiler_flags, workdir)).read_bytes()
    wrapper = sys.modules["libneuronxla.neuron_cc_wrapper"]
    cache = wrapper.create_compile_cache(wrapper.CacheUrl.get_cache_url(cache_dir))
    key = cache_key or get_hash_module(hlo_text, compiler_flags)
    cache_dir_ = cache.get_cache_dir(key, compiler_flags)
    neff_path = f"{cache_dir_}/{NEFF}"
    local = os.path.join(workdir, "cached", NEFF)
    if _lookup(cache, neff_path):
        _fetch(cache, neff_path, local)
        return Path(local).read_bytes()
    os.makedirs(os.path.join(workdir, "model"), exist_ok=True)
    hlo_path = os.path.join(workdir, "model", "model.hlo_module.pb")
    Path(hlo_path).write_bytes(module_bytes)
    _upload_inputs(cache, cache_dir_, hlo_path, compiler_flags)
    neff = _compile(hlo_text, compiler_flags, workdir)
    _upload(cache, neff_path, neff)
    return Path(neff).read_bytes()


# ----------------------------------------------------------------------------------------------------------------
# torch_neuronx.xla_impl.trace
# ----------------------------------------------------------------------------------------------------------------
class HloArtifacts:
    def __init__(self, hlo_module: Any, constant_parameter_tensors: Any = None) -> None:
        self.hlo_module = hlo_module
        self.constant_parameter_tensors = constant_parameter_tensors or {}


class NeffArtifacts:
    def __init__(self, neff_filename: str | None = None) -> None:
        self.neff_filename = neff_filename


def setup_compiler_dirs(hlo_module: Any, compiler_workdir: Any, constant_parameter_tensors: Any,
                        inline_weights_to_neff: bool) -> str:
    """Writes the HLO where the compiler reads it: ``<workdir>/model/graph.hlo``, returned."""
    path = os.path.join(str(compiler_workdir), "model", "graph.hlo")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_text(str(hlo_module))
    return path


def hlo_compile(compiler_target: str, compiler_workdir: Any = None, compiler_args: Any = None) -> str:
    flags = compiler_args if isinstance(compiler_args, str) else " ".join(compiler_args or [])
    return _compile(Path(compiler_target).read_text(), flags, str(compiler_workdir))


def generate_neff(hlo_artifacts: HloArtifacts, compiler_workdir: Any = None, compiler_args: Any = None,
                  inline_weights_to_neff: bool = True) -> NeffArtifacts:
    """torch-neuronx's compile without any cache."""
    target = setup_compiler_dirs(hlo_artifacts.hlo_module, compiler_workdir, None, inline_weights_to_neff)
    return NeffArtifacts(hlo_compile(target, compiler_workdir, compiler_args))


# ----------------------------------------------------------------------------------------------------------------
# neuronx_distributed.trace.model_builder.ModelBuilder
# ----------------------------------------------------------------------------------------------------------------
class _Hlo:
    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text

    def SerializeToString(self) -> bytes:  # protobuf's name, which NxD calls
        return self.text.encode()


def _graph_text(key: str, model_instance: Any, inputs: Any, tp_degree: int) -> str:
    neuron_config = json.loads(model_instance.neuron_config.to_json_string())
    for field in ("checkpoint_id", "checkpoint_revision"):
        neuron_config.pop(field, None)
    config = {k: v for k, v in model_instance.config.to_dict().items() if k not in ("_name_or_path", "name_or_path")}
    shapes = [[list(t.shape), str(t.dtype)] for t in inputs]
    return json.dumps({"key": key, "tp_degree": tp_degree, "inputs": shapes, "neuron_config": neuron_config,
                       "config": config}, sort_keys=True, default=str)


class ModelBuilder:
    compile_through = "generate_neff"
    traced: Callable[[], Any] = object

    def __init__(self, router: Any = None, tp_degree: int = 1, compiler_workdir: str = "/tmp/nxd_model/",
                 **kwargs: Any) -> None:
        self.tp_degree = tp_degree
        self.compiler_workdir = compiler_workdir
        self.models: dict[str, dict[str, Any]] = {}

    def add(self, key: str, model_instance: Any, example_inputs: Any, compiler_args: str | None = None,
            bucket_config: Any = None, priority_model_idx: int | None = None) -> ModelBuilder:
        self.models[key] = {"instance": model_instance, "inputs": example_inputs, "args": compiler_args or "",
                            "priority": priority_model_idx}
        return self

    def trace(self, initialize_model_weights: bool = True, dry_run: bool = False) -> Any:
        scratch = os.environ["NEURON_COMPILE_IMITATION_WORKDIR"]
        for key, model in self.models.items():
            for rank, inputs in enumerate(model["inputs"]):
                REC.graph = f"{key}/_tp0_bk{rank}"
                # The flags name the builder's workdir, as NxD's do; the files go to a private scratch dir.
                flags = model["args"] + f" --logfile={Path(self.compiler_workdir, key, f'_tp0_bk{rank}', LOG_FILE)}"
                if rank == model["priority"]:
                    flags += " --enable-internal-neff-wrapper"
                hlo = _Hlo(_graph_text(key, model["instance"], inputs, self.tp_degree))
                workdir = os.path.join(scratch, key, f"_tp0_bk{rank}")
                if self.compile_through == "generate_neff":
                    trace_module = sys.modules["torch_neuronx.xla_impl.trace"]
                    trace_module.generate_neff(HloArtifacts(hlo), workdir, flags, False)
                else:
                    wrapper = sys.modules["libneuronxla.neuron_cc_wrapper"]
                    wrapper.neuron_xla_compile(module_bytes=hlo.SerializeToString(), compiler_flags=flags,
                                               cache_key=get_hash_module(hlo, flags), use_cache=True,
                                               cache_dir=None, work_dir=Path(workdir).absolute(),
                                               create_subdir=False)
        REC.graph = None
        return self.traced()


# ----------------------------------------------------------------------------------------------------------------
# Installation
# ----------------------------------------------------------------------------------------------------------------
class _LogCapture(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.levelname}: {record.getMessage()}")


def install(stub_module: Callable[[str], types.ModuleType], *, compile_through: str, traced: Callable[[], Any],
            s3_root: str | None, scratch: str, s3_denies_misses: bool = False) -> dict[str, Any]:
    """Puts the imitations in ``sys.modules`` (before optimum-neuron imports them) and returns the recording.

    ``stub_module(name)`` makes a stub module (the runners' SDK stubs), so that names not imitated stay stubs."""
    global REC
    REC = Recorder(s3_root, s3_denies_misses)
    os.environ["NEURON_COMPILE_IMITATION_WORKDIR"] = scratch
    ModelBuilder.compile_through = compile_through
    ModelBuilder.traced = traced
    import libneuronxla
    import neuronx_distributed.trace
    import torch_neuronx.xla_impl

    cc_cache = stub_module("libneuronxla.neuron_cc_cache")
    wrapper = stub_module("libneuronxla.neuron_cc_wrapper")
    for name in ("CacheUrl", "CompileCache", "CompileCacheFs", "CompileCacheS3", "create_compile_cache"):
        setattr(cc_cache, name, globals()[name])
        setattr(wrapper, name, globals()[name])
    wrapper.neuron_xla_compile = neuron_xla_compile  # type: ignore[attr-defined]
    libneuronxla.neuron_cc_cache = cc_cache  # type: ignore[attr-defined]
    libneuronxla.neuron_cc_wrapper = wrapper  # type: ignore[attr-defined]
    libneuronxla.neuron_xla_compile = neuron_xla_compile  # type: ignore[attr-defined]
    trace = stub_module("torch_neuronx.xla_impl.trace")
    for name in ("HloArtifacts", "NeffArtifacts", "setup_compiler_dirs", "hlo_compile", "generate_neff"):
        setattr(trace, name, globals()[name])
    torch_neuronx.xla_impl.trace = trace  # type: ignore[attr-defined]
    builder = stub_module("neuronx_distributed.trace.model_builder")
    builder.ModelBuilder = ModelBuilder  # type: ignore[attr-defined]
    neuronx_distributed.trace.model_builder = builder  # type: ignore[attr-defined]
    sys.modules.update({"libneuronxla.neuron_cc_cache": cc_cache, "libneuronxla.neuron_cc_wrapper": wrapper,
                        "torch_neuronx.xla_impl.trace": trace, "neuronx_distributed.trace.model_builder": builder})
    REC.data["log"] = []
    handler = _LogCapture(REC.data["log"])
    for name in ("optimum.neuron.cache.hub_cache", "Neuron"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return REC.data
