"""The model catalog: architecture figures of popular decoder models, and reading any other
model's Hugging Face ``config.json``.

Figures are those of each model's published ``config.json`` on the Hugging Face Hub. Parameter
counts are computed from the architecture (embeddings, attention, gated MLP, norms, LM head),
which reproduces the published counts (Llama-3-8B: 8.03 B, Llama-2-70B: 68.98 B).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import Problems, ServingConfigError, problem

SUPPORTED_MODEL_TYPES = ("granite", "llama", "mistral", "mixtral", "phi3", "qwen2", "qwen3")
"""Decoder architectures with gated MLPs (one, or ``num_local_experts`` of them) that the planner
can size. Which of them a deployment accepts is the serving image's to say
(``Engine.serving_image`` in :mod:`neuron_serving.plan.engines`)."""


@dataclass(frozen=True)
class ModelSpec:
    """The architecture figures the planner needs to size weights and KV cache."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int = 0
    tie_word_embeddings: bool = False
    num_experts: int = 1
    torch_dtype: str | None = "bfloat16"
    """The dtype of the published weights (``torch_dtype`` in ``config.json``), which optimum-neuron
    0.4.5 compiles with whatever auto-cast type it is given; ``None`` when the config has none."""
    hub_ids: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        problems = Problems()
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            problems.add(
                "model_type", self.model_type, f"is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads",
                     "intermediate_size", "vocab_size", "max_position_embeddings", "num_experts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.add(f"{self.name}: {name}", value, "must be a positive integer")
        if not problems and self.num_attention_heads % self.num_kv_heads:
            problems.add(
                f"{self.name}: num_key_value_heads",
                self.num_kv_heads,
                f"must divide num_attention_heads ({self.num_attention_heads})",
            )
        problems.raise_if_any()
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @property
    def parameter_count(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        # A mixture of experts keeps every expert's MLP, and a router, on the devices.
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        norms = 2 * self.hidden_size
        per_layer = q_and_o + k_and_v + mlp + router + norms
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return embeddings + self.num_layers * per_layer + self.hidden_size + lm_head

    @property
    def linear_parameter_count(self) -> int:
        """The parameters of the model's linear layers (attention projections, MLP and experts, and
        an untied LM head): those weight quantization converts. The embeddings, norms and a mixture
        of experts' router stay in the model's dtype."""
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size * self.num_experts
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layers * (q_and_o + k_and_v + mlp) + lm_head

    @property
    def linear_output_channels(self) -> int:
        """The output channels of those layers, each of which per-channel quantization scales."""
        attention = (self.num_attention_heads + 2 * self.num_kv_heads) * self.head_dim + self.hidden_size
        mlp = (2 * self.intermediate_size + self.hidden_size) * self.num_experts
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size
        return self.num_layers * (attention + mlp) + lm_head

    def weight_bytes(self, dtype_bytes: int, quantized_bytes: int | None = None) -> int:
        """The model's weights in bytes: every parameter in ``dtype_bytes``, or, quantized, the
        linear layers' in ``quantized_bytes`` with a float32 scale per output channel (see
        :data:`~neuron_serving.plan.layout.QUANTIZATIONS`) and the rest in ``dtype_bytes``."""
        if quantized_bytes is None:
            return self.parameter_count * dtype_bytes
        linear = self.linear_parameter_count
        return ((self.parameter_count - linear) * dtype_bytes + linear * quantized_bytes
                + self.linear_output_channels * 4)

    def kv_cache_bytes_per_token(self, dtype_bytes: int, degree: int) -> int:
        """Key and value bytes one token occupies on one NeuronCore at tensor-parallel ``degree``.

        KV heads are split across the cores; with more cores than KV heads each core still keeps
        one (the heads are replicated), hence the ceiling.
        """
        kv_heads_per_core = math.ceil(self.num_kv_heads / degree)
        return 2 * self.num_layers * kv_heads_per_core * self.head_dim * dtype_bytes

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str) -> ModelSpec:
        """Build a spec from the contents of a Hugging Face ``config.json``."""
        required = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "vocab_size", "max_position_embeddings")
        missing = [key for key in required if key not in config]
        if missing:
            raise ServingConfigError(
                [problem("model_config", name, f"lacks required keys: {', '.join(missing)}")]
            )
        return cls(
            name=name,
            model_type=str(config["model_type"]),
            hidden_size=config["hidden_size"],
            num_layers=config["num_hidden_layers"],
            num_attention_heads=config["num_attention_heads"],
            num_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=config["max_position_embeddings"],
            head_dim=config.get("head_dim") or 0,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            num_experts=config.get("num_local_experts") or 1,
            # transformers 4.56 renamed torch_dtype to dtype in the configs it writes.
            torch_dtype=config.get("torch_dtype") or config.get("dtype"),
        )


def _llama2(name: str, hidden: int, layers: int, heads: int, kv: int, inter: int,
            hub_ids: tuple[str, ...]) -> ModelSpec:
    # Meta published Llama 2's Hugging Face weights in float16.
    return ModelSpec(name, "llama", hidden, layers, heads, kv, inter, 32000, 4096, torch_dtype="float16",
                     hub_ids=hub_ids)


def _llama3(name: str, hidden: int, layers: int, heads: int, inter: int, max_pos: int,
            hub_ids: tuple[str, ...], head_dim: int = 0, tied: bool = False) -> ModelSpec:
    return ModelSpec(name, "llama", hidden, layers, heads, 8, inter, 128256, max_pos,
                     head_dim=head_dim, tie_word_embeddings=tied, hub_ids=hub_ids)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _llama2("llama-2-7b", 4096, 32, 32, 32, 11008,
                ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf")),
        _llama2("llama-2-13b", 5120, 40, 40, 40, 13824,
                ("meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf")),
        _llama2("llama-2-70b", 8192, 80, 64, 8, 28672,
                ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf")),
        _llama3("llama-3-8b", 4096, 32, 32, 14336, 8192,
                ("meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct",
                 "NousResearch/Meta-Llama-3-8B", "NousResearch/Meta-Llama-3-8B-Instruct")),
        _llama3("llama-3-70b", 8192, 80, 64, 28672, 8192,
                ("meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct",
                 "NousResearch/Meta-Llama-3-70B-Instruct")),
        _llama3("llama-3.1-8b", 4096, 32, 32, 14336, 131072,
                ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                 "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct",
                 "NousResearch/Meta-Llama-3.1-8B-Instruct")),
        _llama3("llama-3.1-70b", 8192, 80, 64, 28672, 131072,
                ("meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct",
                 "meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct")),
        _llama3("llama-3.2-1b", 2048, 16, 32, 8192, 131072,
                ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B-Instruct",
                 "unsloth/Llama-3.2-1B-Instruct"), head_dim=64, tied=True),
        _llama3("llama-3.2-3b", 3072, 28, 24, 8192, 131072,
                ("meta-llama/Llama-3.2-3B", "meta-llama/Llama-3.2-3B-Instruct",
                 "unsloth/Llama-3.2-3B-Instruct"), head_dim=128, tied=True),
        ModelSpec("mistral-7b", "mistral", 4096, 32, 32, 8, 14336, 32000, 32768,
                  hub_ids=("mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
                           "mistralai/Mistral-7B-Instruct-v0.2")),
        ModelSpec("mistral-7b-v0.3", "mistral", 4096, 32, 32, 8, 14336, 32768, 32768,
                  hub_ids=("mistralai/Mistral-7B-v0.3", "mistralai/Mistral-7B-Instruct-v0.3")),
        ModelSpec("mixtral-8x7b", "mixtral", 4096, 32, 32, 8, 14336, 32000, 32768, num_experts=8,
                  hub_ids=("mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1")),
        ModelSpec("qwen2.5-7b", "qwen2", 3584, 28, 28, 4, 18944, 152064, 32768,
                  hub_ids=("Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct")),
    )
}

_BY_HUB_ID: dict[str, ModelSpec] = {
    hub_id.lower(): spec for spec in MODELS.values() for hub_id in spec.hub_ids
}


def _read_config(setting: str, path: str, name: str) -> ModelSpec:
    """The spec of the ``config.json`` at ``path``, the value of ``setting``."""
    return ModelSpec.from_hf_config(_read_json(setting, path), name=name)


def _read_json(setting: str, path: str) -> dict[str, Any]:
    """The JSON object in the file at ``path``, the value of ``setting``."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ServingConfigError([problem(setting, path, f"cannot be read: {err.strerror}")]) from None
    except json.JSONDecodeError as err:
        raise ServingConfigError(
            [problem(setting, path, f"is not valid JSON: {err.msg} at line {err.lineno}")]
        ) from None
    if not isinstance(config, dict):
        raise ServingConfigError([problem(setting, path, "must hold a JSON object")])
    return config


def resolve_model(model_id: str, model_config: str | None = None) -> ModelSpec:
    """The architecture of ``model_id``.

    ``model_config``, a path to the model's ``config.json``, wins when given; otherwise the
    catalog is searched by Hugging Face id and by catalog name (``llama-3.1-8b``).
    """
    if model_config is not None:
        return _read_config("model_config", model_config, model_id)
    spec = _BY_HUB_ID.get(model_id.lower()) or MODELS.get(model_id.lower())
    if spec is None:
        raise ServingConfigError(
            [
                problem(
                    "model_id",
                    model_id,
                    "is not in the model catalog; give model_config (a path to the model's "
                    "config.json) or use a catalog model: " + ", ".join(MODELS),
                )
            ]
        )
    return spec


def _eagle(hub_id: str, target: ModelSpec, max_pos: int) -> ModelSpec:
    # An EAGLE v1 draft is one decoder layer of its target's shape (SafeAILab/EAGLE
    # eagle/train/EAGLE-LLaMA3-Instruct-8B.json and -70B.json at f872b7f: the target's hidden,
    # intermediate and head figures, num_hidden_layers 1, 2048 positions, float16).
    return dataclasses.replace(target, name=hub_id, num_layers=1, max_position_embeddings=max_pos,
                               torch_dtype="float16", hub_ids=(hub_id,))


EAGLE_DRAFTS: dict[str, ModelSpec] = {
    draft.name.lower(): draft
    for draft in (
        # Drafts of Meta-Llama-3-8B-Instruct and -70B-Instruct, the pairs vLLM's own example serves
        # (vllm-project/vllm examples/offline_inference/spec_decode.py); AWS's NxD Inference guide serves
        # the 70B draft with Llama 3.1 70B Instruct (developer_guides/feature-guide.rst at v2.28.0, "EAGLE
        # Checkpoint Compatibility"), whose shape and vocabulary are Llama 3 70B's.
        _eagle("yuhuili/EAGLE-LLaMA3-Instruct-8B", MODELS["llama-3-8b"], 2048),
        _eagle("yuhuili/EAGLE-LLaMA3-Instruct-70B", MODELS["llama-3-70b"], 2048),
    )
}
"""EAGLE v1 drafts whose shape the library knows, by Hugging Face id (lowercase)."""


def eagle_fc_parameter_count(draft: ModelSpec) -> int:
    """The parameters of an EAGLE v1 draft's ``fc``, the layer that fuses the target's hidden state
    with the token's embedding: twice the hidden size to the hidden size (NxD Inference cd3abf3,
    models/llama/modeling_llama.py, an EAGLE draft's ``fc``: a ``WeightGatheredColumnParallel``, a
    ``ColumnParallelLinear`` whose weight each rank holds a slice of and gathers only to compute). Its bias,
    where the draft's config asks for one (``fc_bias``; yuhuili's drafts say ``"bias": false``), is a
    hidden size more, left out. The rest of the draft is a model of ``draft``'s shape, sharded as the
    target is, whose LM head is the target's copied in (:func:`resolve_draft`)."""
    return 2 * draft.hidden_size * draft.hidden_size


def resolve_draft(draft_id: str, target: ModelSpec, draft_config: str | None = None) -> ModelSpec:
    """The architecture of the EAGLE draft ``draft_id`` for ``target``: from ``draft_config``, a path
    to the draft's ``config.json``, when given, else from :data:`EAGLE_DRAFTS`. A draft predicts the
    target's next token from the target's hidden state, through the target's LM head: its hidden size
    and vocabulary must be the target's. Raises :class:`ServingConfigError` naming
    ``speculative_model`` or ``speculative_model_config``."""
    if draft_config is not None:
        config = _read_json("speculative_model_config", draft_config)
        architectures = [str(a) for a in config.get("architectures") or []]
        if "draft_vocab_size" in config or any("eagle3" in a.lower() for a in architectures):
            # EAGLE 3 drafts have their own architecture (LlamaForCausalLMEagle3) and vocabulary; the plugin
            # sets nothing of NxD Inference's is_eagle3 (vllm-neuron release-0.4.1 loader), and falls back to
            # the model's class for an architecture it does not know.
            raise ServingConfigError([problem(
                "speculative_model_config", draft_config, "is an EAGLE 3 draft's (draft_vocab_size or an Eagle3 "
                "architecture), which the image's vllm-neuron plugin does not compile; give an EAGLE (v1) draft")])
        draft = ModelSpec.from_hf_config(config, name=draft_id)
    else:
        known = EAGLE_DRAFTS.get(draft_id.lower())
        if known is None:
            raise ServingConfigError([problem(
                "speculative_model", draft_id, "is not an EAGLE draft the library knows the shape of; give "
                "speculative_model_config (a path to the draft's config.json) or use one of "
                + ", ".join(d.name for d in EAGLE_DRAFTS.values()))])
        draft = known
    problems = Problems()
    for name in ("hidden_size", "vocab_size"):
        if getattr(draft, name) != getattr(target, name):
            problems.add("speculative_model", draft_id, f"has {name} {getattr(draft, name)}, but {target.name} has "
                         f"{getattr(target, name)}: an EAGLE draft reads the target's hidden state and shares its "
                         "LM head, so it must be made for the model")
    problems.raise_if_any()
    return draft
