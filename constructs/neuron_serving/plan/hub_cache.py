"""Which layouts are in optimum-neuron's public cache of compiled models, from its registry's
files given as plain values: no network here (the operator's ``plan`` reads them through
huggingface_hub, :mod:`neuron_serving.ops.hub_cache`).

The cache is a Hub model repository (:data:`~neuron_serving.plan.host.PUBLIC_HUB_CACHE`, which the
host's export consults too). Every export that filled it left one
JSON file in its registry, at
``neuronxcc-<compiler version>/0_REGISTRY/<optimum-neuron version>/<model_type>/<org>/<model>/<hash>.json``
(optimum-neuron v0.3.0 and v0.4.5, optimum/neuron/cache/hub_cache.py: ``REGISTRY_FOLDER``,
``hub_neuronx_cache``, and ``get_hub_cached_models``, which reads the same four levels). v0.4.5
also files each entry under its architecture's digest (``<registry>/<sha256>/<hash>.json``), a
second copy of the same entries that :func:`entry_paths` leaves out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from .engines.base import TORCH_DTYPES, ServingImage, release
from .host import PUBLIC_HUB_CACHE
from .layout import ServingPlan

CACHE_REPO_VARIABLE = "CUSTOM_CACHE_REPO"
"""The environment variable that names another cache repository instead (cache_utils.py
``get_hf_hub_cache_repos``, at both versions)."""

COMPILER_PREFIX = "neuronxcc-"
"""How a compiler's top-level folder of the cache starts; the rest is the version with its local
label, ``neuronxcc-2.21.33363.0+82129205``."""

REGISTRY_FOLDER = "0_REGISTRY"
"""The registry's folder inside a compiler's folder, then one folder per optimum-neuron version
(hub_cache.py ``REGISTRY_FOLDER = f"0_REGISTRY/{__version__}"``)."""

TEXT_GENERATION = "text-generation"
"""The task of the entries a decoder export registers (``_task``)."""

SINGLE_MODEL = "SingleModelCacheEntry"
"""The entry class of a transformers model (``_entry_class``: cache/entries/cache_entry.py
``ModelCacheEntry.serialize``); diffusers pipelines register ``MultiModelCacheEntry``."""

INF2_TRN1_TARGETS: tuple[str | None, ...] = (None, "trn1")
"""The ``target`` of entries compiled for inf2 and trn1, the families of the instance catalog:
optimum-neuron v0.4.5 records ``trn1`` for both (optimum/neuron/utils/instance.py,
``INSTANCE_VALUE_MAP``); v0.3.0 leaves it null except on trn2
(optimum/neuron/models/inference/backend/config.py, ``target: ... = None,  # set to "trn2" for trn2``)."""


def compiler_folder(names: Iterable[str], neuronx_cc: str) -> str | None:
    """The cache's top-level folder of compiler ``neuronx_cc`` among ``names``, or None.

    Matched on the release alone, as optimum-neuron v0.4.5 does (hub_cache.py ``hub_registry_path``:
    the folder carries the local label, which the package metadata it compares with lacks), but the
    whole release: ``neuronxcc-2.19.8089.0`` does not match ``neuronxcc-2.19.8089.01``."""
    wanted = release(neuronx_cc)
    for name in sorted(names):
        if name.startswith(COMPILER_PREFIX) and release(name[len(COMPILER_PREFIX):]) == wanted:
            return name
    return None


def registry_path(folder: str, optimum_neuron: str) -> str:
    """The registry of ``optimum_neuron``'s entries in a compiler's ``folder``."""
    return f"{folder}/{REGISTRY_FOLDER}/{optimum_neuron}"


def entry_paths(paths: Iterable[str], registry: str, model_type: str, model_ids: Iterable[str]) -> list[str]:
    """The registry files, among ``paths`` (the recursive listing of ``registry``), of the models
    ``model_ids`` (Hub ids, compared without case, as the Hub compares them) of ``model_type``."""
    wanted = {model_id.lower() for model_id in model_ids}
    found = []
    for path in sorted(paths):
        if not path.startswith(registry + "/") or not path.endswith(".json"):
            continue
        parts = path[len(registry) + 1:].split("/")
        if len(parts) == 4 and parts[0] == model_type and f"{parts[1]}/{parts[2]}".lower() in wanted:
            found.append(path)
    return found


@dataclass(frozen=True)
class CachedLayout:
    """One layout of the registry: what ``neuron`` (the export's Neuron configuration) says of it.

    :param model_id: the model the entry was compiled from (``_model_id``).
    :param batch_size: ``batch_size``.
    :param sequence_length: ``sequence_length``.
    :param tp_degree: ``tp_degree``.
    :param torch_dtype: ``torch_dtype``, a torch dtype's name (``bfloat16``).
    :param target: ``target``, the platform compiled for; None when the entry has none.
    """

    model_id: str
    batch_size: int
    sequence_length: int
    tp_degree: int
    torch_dtype: str
    target: str | None

    def serves(self, plan: ServingPlan) -> bool:
        """Whether this entry was compiled for ``plan``'s degree, shapes and dtype, for inf2 or trn1."""
        return ((self.tp_degree, self.batch_size, self.sequence_length, self.torch_dtype)
                == (plan.degree, plan.batch_size, plan.sequence_length, TORCH_DTYPES[plan.dtype])
                and self.target in INF2_TRN1_TARGETS)


def parse_entry(text: str) -> CachedLayout | None:
    """The layout a registry file holds, or None when it is not a text-generation entry of one
    model with integer shapes (a diffusers pipeline, another task, a format this does not know).

    The file is ``ModelCacheEntry.serialize``'s JSON (optimum-neuron v0.3.0 and v0.4.5,
    optimum/neuron/cache/entries/cache_entry.py and single_model.py): the model's configuration,
    with ``neuron`` (``NxDNeuronConfig.to_dict``: ``batch_size``, ``sequence_length``,
    ``tp_degree``, ``torch_dtype``, ``target``...), ``_entry_class``, ``_model_id`` and ``_task``."""
    try:
        entry = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(entry, dict) or entry.get("_entry_class") != SINGLE_MODEL:
        return None
    neuron = entry.get("neuron")
    model_id = entry.get("_model_id")
    if entry.get("_task") != TEXT_GENERATION or not isinstance(neuron, dict) or not isinstance(model_id, str):
        return None
    shapes = [_integer(neuron.get(key)) for key in ("batch_size", "sequence_length", "tp_degree")]
    dtype, target = neuron.get("torch_dtype"), neuron.get("target")
    if None in shapes or not isinstance(dtype, str) or not (target is None or isinstance(target, str)):
        return None
    batch, sequence, degree = (int(value or 0) for value in shapes)
    return CachedLayout(model_id, batch, sequence, degree, dtype, target)


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class HubCache:
    """What the cache holds of one model for one image's optimum-neuron and compiler.

    :param repo: the cache repository read.
    :param optimum_neuron: the optimum-neuron version whose registry was read.
    :param neuronx_cc: the compiler version whose folder was read.
    :param layouts: the layouts its registry holds for the model.
    """

    repo: str
    optimum_neuron: str
    neuronx_cc: str
    layouts: tuple[CachedLayout, ...]

    @classmethod
    def of(cls, image: ServingImage, repo: str, layouts: Iterable[CachedLayout]) -> HubCache:
        return cls(repo, image.export.version, image.neuronx_cc, tuple(layouts))

    def holds(self, plan: ServingPlan) -> bool:
        """Whether an entry of the registry was compiled for ``plan``."""
        return any(layout.serves(plan) for layout in self.layouts)

    def describe(self) -> str:
        """``in the public cache for optimum-neuron 0.3.0 and neuronx-cc 2.19.8089.0``."""
        where = "the public cache" if self.repo == PUBLIC_HUB_CACHE else f"the cache {self.repo}"
        return f"in {where} for optimum-neuron {self.optimum_neuron} and neuronx-cc {release(self.neuronx_cc)}"
