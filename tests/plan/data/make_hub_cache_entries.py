"""Writes the registry entries of tests/plan/test_hub_cache.py with optimum-neuron's own code: the
entry (optimum/neuron/cache/entries/single_model.py, ``SingleModelCacheEntry.serialize``) of a
Neuron configuration (optimum/neuron/models/inference/backend/config.py, ``NxDNeuronConfig``), as an
export registers it. Run with each optimum-neuron tools venv from the repository root:

    .tools/optimum-neuron-0.3.0/bin/python tests/plan/data/make_hub_cache_entries.py
    .tools/optimum-neuron-0.4.5/bin/python tests/plan/data/make_hub_cache_entries.py

0.3.0 imports the Neuron SDK, which the harness's stubs stand in for (tests/harness/optimum_neuron.py);
the entries' neuronxcc_version is theirs (2.19.8089.0+8ab9f450) at both versions, and nothing reads it.
"""

import sys
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.harness.optimum_neuron import NeuronSdkStubFinder

sys.meta_path.insert(0, NeuronSdkStubFinder())

from optimum.neuron.cache.entries.single_model import SingleModelCacheEntry  # noqa: E402
from optimum.neuron.models.inference.backend.config import NxDNeuronConfig  # noqa: E402

OPTIMUM_NEURON = version("optimum-neuron")
# Llama 3.1 8B's config.json, the keys that differ from LlamaConfig's defaults (to_diff_dict).
LLAMA_8B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 131072, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "vocab_size": 128256,
            "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
# What the export of each version records as target on inf2 and trn1 (see neuron_serving.plan.hub_cache).
TARGET = "trn1" if OPTIMUM_NEURON == "0.4.5" else None
ENTRIES = {
    "llama-8b-tp2-b4-s4096": ("meta-llama/Meta-Llama-3.1-8B-Instruct", 2, 4, 4096, TARGET),
    "llama-8b-tp8-b32-s1024": ("meta-llama/Meta-Llama-3.1-8B-Instruct", 8, 32, 1024, TARGET),
    "llama-8b-tp2-b48-s1024": ("meta-llama/Meta-Llama-3.1-8B-Instruct", 2, 48, 1024, TARGET),
    "llama-8b-tp2-b48-s1024-trn2": ("meta-llama/Meta-Llama-3.1-8B-Instruct", 2, 48, 1024, "trn2"),
    "other-model-tp2-b48-s1024": ("unsloth/Llama-3.1-8B", 2, 48, 1024, TARGET),
}

out = Path(__file__).parent / "hub_cache"
for name, (model_id, degree, batch, sequence, target) in ENTRIES.items():
    neuron = NxDNeuronConfig(batch_size=batch, sequence_length=sequence, tp_degree=degree, torch_dtype="bfloat16",
                             target=target, continuous_batching=batch > 1)
    entry = SingleModelCacheEntry(model_id, "text-generation", dict(LLAMA_8B), neuron)
    (out / f"{OPTIMUM_NEURON}-{name}.json").write_text(entry.serialize() + "\n")
    print(OPTIMUM_NEURON, name, entry.hash)
