"""vLLM on NxD Inference: the serving path AWS maintains for inf2 and trn1 ("For Inf2 and Trn1 ...
use Option 1", aws-neuron/aws-neuron-sdk libraries/vllm-neuron/neuron-inference-overview.rst), in
AWS's Deep Learning Container.

The image runs vLLM with AWS's vllm-neuron plugin, which builds and compiles the model with NxD
Inference (neuronx-distributed-inference) when vLLM starts. ``NEURON_COMPILED_ARTIFACTS`` names
where the compiled model is saved and, when a finished compile is there, loaded from without
compiling ("Loading pre-compiled models", libraries/nxd-inference/developer_guides/
vllm-user-guide-v1.rst at v2.28.0). So the export runs vLLM itself, once, with the arguments every
replica serves with: ``vllm run-batch`` over an empty batch, which builds the engine (compiling and
saving) and exits. With ``save_sharded_checkpoint`` the compile also holds the weights sharded per
rank, so a replica needs neither the checkpoint nor the Hub. Each replica runs ``vllm serve`` on the
export, mounted read-only.

Facts about the images are from aws-neuron/deep-learning-containers (vllm/inference/<version>/
Dockerfile.neuronx, common/vllm_entrypoint.py, README.md), the Neuron release notes and manifest
(aws-neuron-sdk release-notes/, src/helperscripts/n2-manifest.json), and vLLM 0.13.0's PyPI wheel,
each cited where it is used; docs/engines.md tells why the SDK 2.28 image is the default.
"""

from __future__ import annotations

import dataclasses
import json

from ..errors import ServingConfigError, problem
from ..layout import Replica, ServingPlan
from .base import CHECKPOINT_FILES, DRAFT_DIR, TORCH_DTYPES, ExportToolchain, ServingImage, version_key
from .vllm import VllmServer

SERVED_CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
)
"""What vLLM reads from its ``--model`` directory beside the compiled model: the model's
configuration (vllm/transformers_utils/config.py, ``get_config``), its generation defaults
(``try_get_generation_config``) and the tokenizer (vllm/tokenizers/hf.py, ``from_pretrained``:
transformers' ``AutoTokenizer.from_pretrained``, which reads a chat template kept apart in
``chat_template.jinja`` too), all in vLLM 0.13.0. The plugin builds NxD Inference's configuration
from ``config.json`` before it loads the compiled model (vllm-neuron release-0.4.1,
vllm_neuron/worker/neuronx_distributed_model_loader.py; read in the fork whn09/vllm-neuron at 4fac6b7,
"Release 0.4.1", as no snapshot of the upstream branch was at hand). NxD Inference's compile writes
none of them; the checkpoint's weights are not read once the compile holds them sharded."""

NXDI_0_8 = ExportToolchain(
    # The NxD Inference of SDK 2.28 (n2-manifest.json: neuronx_distributed_inference 0.8.16251), which
    # the plugin compiles with; its version is part of every export key.
    "neuronx-distributed-inference", "0.8.16251",
    # Dockerfile.neuronx installs vLLM (vllm-neuron's requirements pull it) into /opt/conda/bin, on
    # PATH; `vllm` is vLLM's console script (vllm/entrypoints/cli/main.py).
    entrypoint="vllm",
    # vLLM 0.13.0 requires transformers<5 (its METADATA), whose huggingface-hub (<1.0) still ships
    # huggingface-cli.
    hub_cli="huggingface-cli",
    checkpoint_files=(*CHECKPOINT_FILES, "chat_template.jinja"),
    # Compiled from the local checkpoint; NxD Inference has no Hub cache of compiled graphs. Its
    # compiles go through the Neuron persistent cache, which NEURON_COMPILE_CACHE_URL may point at S3
    # (aws-neuron-sdk v2.28.0 libraries/nxd-inference/developer_guides/feature-guide.rst: "The Neuron
    # Persistent Cache is enabled by default for NxD Inference library"; neuronx-distributed v2.28.0
    # src/neuronx_distributed/trace/model_builder.py compiles with use_cache=True).
    hub_cache_variable=None,
    served_checkpoint_files=SERVED_CHECKPOINT_FILES,
)

NXDI_0_10 = dataclasses.replace(NXDI_0_8, version="0.10.18399")
"""SDK 2.31's NxD Inference (n2-manifest.json: 0.10.18399, in SDK 2.31.0 and 2.31.1)."""

DLC_VLLM_0_13_0 = ServingImage(
    # deep-learning-containers README.md (tag 2.32.0), vllm-inference-neuronx: VLLM 0.13.0, Neuron
    # 2.28.0, trn1,trn2,trn3,inf2.
    reference="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.13.0-neuronx-py312-sdk2.28.0-ubuntu24.04",
    export=NXDI_0_8,
    # The vLLM user guide's supported models for text (vllm-user-guide-v1.rst at v2.28.0: "Llama
    # 2/3.1/3.3", "Qwen 2.5", "Qwen 3"); Llama 4, Qwen2-VL, Qwen3-VL and Pixtral are multimodal, which
    # this library does not serve. The plugin finds the model's class by its architecture
    # (neuronx_distributed_model_loader.py, _get_neuron_model_cls, in NxD Inference's MODEL_TYPES,
    # neuronx-distributed-inference utils/constants.py at cd3abf3, "Neuron SDK Release 2.28.0"):
    # LlamaForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM for these; MistralForCausalLM is refused
    # ("is not supported on Neuron for now").
    model_types=("llama", "qwen2", "qwen3"),
    neuron_sdk="2.28.0",
    # vllm/inference/0.13.0/Dockerfile.neuronx (tag 2.28.0): NEURONX_RUNTIME_LIB_VERSION=2.30.51.0-faafe26f0.
    neuron_runtime="2.30.51",
    # "Neuron Driver 2.29 requires Neuron Runtime Library 2.33 or later ... will cause nrt_init() to
    # fail" (aws-neuron-sdk release-notes/components/runtime.rst, Neuron 2.31.0). The Ubuntu 22.04
    # base DLAMI's last release (SDK 2.29) carries driver 2.27.4.0, which runs older runtimes
    # (neuron-runtime/nrt-troubleshoot.rst: "The driver remains backwards compatible with older
    # versions of Neuron Runtime").
    driver_below="2.29",
    dlami_parameter="/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id",
    # Dockerfile.neuronx (tag 2.28.0): NEURONX_CC_VERSION=2.23.6484.0+3b612583.
    neuronx_cc="2.23.6484.0+3b612583",
)
"""vLLM 0.13.0 with the vllm-neuron plugin's release-0.4.1 and NxD Inference 0.8 (Neuron SDK 2.28):
the last release whose NxD Inference supports Trn1 and Inf2 with its NKI kernels. The default."""

DLC_VLLM_0_16_0 = ServingImage(
    # README.md (tag 2.32.0): VLLM 0.16.0, Neuron 2.31.1, trn1,trn2,trn3,inf2.
    reference="public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.16.0-neuronx-py312-sdk2.31.1-ubuntu24.04",
    export=NXDI_0_10,
    model_types=("llama", "qwen2", "qwen3"),
    neuron_sdk="2.31.1",
    # vllm/inference/0.16.0/Dockerfile.neuronx (tag 2.31.1): NEURONX_RUNTIME_LIB_VERSION=2.33.10.0-3dcef56f0.
    neuron_runtime="2.33.10",
    driver_below=None,
    # "Neuron Runtime Library 2.32 is not backward-compatible with Neuron Driver 2.26 or earlier"
    # (runtime.rst, Neuron 2.30.0; containers.rst, "Neuron Containers [2.30.0]"); no note says which
    # drivers runtime 2.33 runs, which SDK 2.31 pairs with driver 2.29.0 (n2-manifest.json): 2.28,
    # SDK 2.30's driver, is the oldest taken, an assumption. The newest Ubuntu 24.04 base DLAMI (SDK
    # 2.32, driver 2.30.2.0) runs older runtimes, and 2.33 is new enough for Driver 2.29 and later.
    driver_from="2.28",
    dlami_parameter="/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id",
    # Dockerfile.neuronx (tag 2.31.1): NEURONX_CC_VERSION=2.26.6360.0+6f180f47.
    neuronx_cc="2.26.6360.0+6f180f47",
)
"""vLLM 0.16.0 with the plugin's release-0.5.3 and NxD Inference 0.10 (Neuron SDK 2.31.1): listed for
inf2 and trn1 by the containers' README, but from NxD Inference 2.29 on "NxD Inference models are now
only supported on Trn2 and newer hardware ... pin to release 2.28" (release-notes/components/
nxd-inference.rst, Neuron 2.29.0). Allowed, not the default."""

CONTAINER_PORT = 8080
"""The port each replica's server is told (``--port``): the one the image exposes and its health
check asks (``EXPOSE 8080 8081``, ``HEALTHCHECK CMD curl --fail http://localhost:8080/ping``,
Dockerfile.neuronx); vLLM's own default is 8000."""

BLOCK_SIZES = (8, 16, 32, 64, 128, 256)
"""The block sizes vLLM 0.13.0 accepts (vllm/config/cache.py, ``BlockSize``, but 1), powers of 2 as NxD
Inference's block KV cache assumes ("assuming the block_size is always a power of 2",
modules/kvcache/block_kv_cache_manager.py at cd3abf3). AWS recommends 32 or 16
(vllm-user-guide-v1.rst: "set pa_block_size=32 or 16")."""

MIN_PREFIX_CACHE_SEQUENCE = 512
"""With a prefix cache, NxD Inference's automatic buckets start at 512 tokens ("currently we have a
requirement of minimal 512 to use the FA kernel", modules/autobucketing.py at cd3abf3): a shorter
sequence has no bucket."""

TOOL_CALL_PARSERS = (
    "deepseek_v3", "deepseek_v31", "deepseek_v32", "ernie45", "gigachat3", "glm45", "granite", "granite-20b-fc",
    "hermes", "hunyuan_a13b", "internlm", "jamba", "kimi_k2", "llama3_json", "llama4_json", "llama4_pythonic",
    "longcat", "minimax", "minimax_m2", "mistral", "olmo3", "openai", "phi4_mini_json", "pythonic", "qwen3_coder",
    "qwen3_xml", "seed_oss", "step3", "xlam",
)
"""The tool call parsers vLLM 0.13.0 registers (vllm/tool_parsers/__init__.py, ``_TOOL_PARSERS_TO_REGISTER``);
the server refuses any other name before it binds its port (vllm/entrypoints/openai/api_server.py,
``validate_api_server_args``; tests/harness/test_vllm_013.py)."""

TOOL_CALL_FORMATS = (
    # Llama 3.1 and later (Llama 3's 128256-token vocabulary, a context of 128K: Llama 3.0 has 8K and
    # no tool calls in its chat template) write JSON tool calls, which llama3_json reads ("Tool
    # parser for Llama 3.x and 4 models", vllm/tool_parsers/llama_tool_parser.py in vLLM 0.13.0; its
    # docs, features/tool_calling.md, "Llama Models (llama3_json)"), from their own chat template.
    ("llama", 128256, 131072, "llama3_json"),
    # Qwen 2.5 and Qwen 3 write Hermes-style <tool_call> blocks (vLLM's docs, "Qwen Models": hermes).
    ("qwen2", None, None, "hermes"),
    ("qwen3", None, None, "hermes"),
)
"""Each model type (with the vocabulary and the least context that tell generations apart, where
they must) whose tool calls a parser reads, by default. Tool choices ``"required"`` or a named
function are not enforced by this image: the plugin ignores vLLM's structured-output mask under
on-device sampling (vllm-neuron release-0.4.1, vllm_neuron/worker/neuronx_distributed_model_runner.py:
"The grammar bitmask will be ignored")."""

QUANTIZED_CHECKPOINT = "/tmp/neuron-serving-quantized-checkpoint.pt"
"""Where the export's quantized weights are written before the compile shards them, inside the
export's container, whose writable layer Docker drops with it. NxD Inference requires the path
(models/config.py: "quantized_checkpoints_path is required"); the plugin quantizes into it before
each compile (vllm-neuron release-0.4.1, neuronx_distributed_model_loader.py,
``_compile_and_load_model``: ``save_quantized_state_dict``, which writes one file there with ``torch.save``
unless the path is a directory, models/application_base.py at cd3abf3), and the compile's sharding
reads it back (``checkpoint_loader_fn``). A replica never reads it: with ``save_sharded_checkpoint``
the load reads the compile's ``weights/`` (application_base.py, ``load_weights``)."""

QUANTIZATION_TYPE = "per_channel_symmetric"
"""A scale per output channel, the finer of NxD Inference's two weight quantizations
(``per_tensor_symmetric``, ``per_channel_symmetric``: developer_guides/feature-guide.rst, "Model
Weight Quantization", at v2.28.0); the plugin's default is per tensor
(neuronx_distributed_model_loader.py, ``quantization_type``)."""

ATTENTION_KERNEL_OFF_FROM = "0.9"
"""NxD Inference 0.9 (SDK 2.29) and later turn an NKI attention kernel on by themselves for contexts
of 4096 tokens or more (neuronx-distributed-inference modules/attention/attention_base.py,
``get_flash_attention_strategy``: ``if q_len >= 4096: return FlashAttentionStrategy.UNSHARDED_KERNEL``)
unless ``attn_kernel_enabled`` is false, while "NxD Inference no longer supports NKI kernels on
Trn1/Inf2 hardware" (release notes, Neuron 2.29.0): with such an image the kernel is turned off."""


SPECULATION_METHOD = "eagle"
"""The one speculation vLLM's plugin compiles that this library serves: EAGLE v1, fused into the model
(vllm-neuron release-0.4.1, neuronx_distributed_model_loader.py: a ``--speculative-config`` turns on
``enable_fused_speculation`` with ``speculation_length`` its ``num_speculative_tokens``, and method
``eagle`` ``enable_eagle_speculation``; ``_init_fused_spec_config`` builds the draft's configuration from
``config.json`` at the config's ``model`` on every load, compiled or not). vLLM itself refuses a plain
draft model ("Speculative decoding with draft model is not supported yet", vllm/config/speculative.py in
0.13.0); the plugin sets nothing of EAGLE 3 (``is_eagle3``), and NxD Inference's fused speculation needs
on-device sampling, the plugin's default (models/model_base.py at cd3abf3, ``NeuronFusedSpecModel``)."""


class Nxdi(VllmServer):
    """vLLM on NxD Inference in AWS's Deep Learning Container: the OpenAI-compatible API of vLLM
    (0.13.0 in the default image), whose routes, errors and metrics are vLLM's own
    (:class:`~neuron_serving.plan.engines.vllm.VllmServer`)."""

    name = "nxdi"
    title = "vLLM on NxD Inference"
    images = (DLC_VLLM_0_13_0, DLC_VLLM_0_16_0)
    container_port = CONTAINER_PORT
    # Prefix caching has no platform gate on NeuronCore-v2: its attention kernels are off by default
    # and the block KV layout runs without them (neuronx-distributed-inference cd3abf3,
    # modules/attention/attention_base.py; modules/kvcache/block_kv_cache_manager.py).
    prefix_caching = True
    min_prefix_cache_sequence = MIN_PREFIX_CACHE_SEQUENCE
    # INT8 weights. FP8 (f8e4m3, f8e5m2) is not offered: on NeuronCore-v2 it needs
    # XLA_HANDLE_SPECIAL_SCALAR (feature-guide.rst), and neuronx-cc refuses F8E4M3FN on TRN1/TRN2
    # ("Target TRN3 or later hardware", aws-neuron/aws-neuron-sdk issue 1393); see docs/engines.md.
    quantizations = ("int8",)
    speculative_decoding = True
    # Compiles go through NxD Inference, which has no Hugging Face Hub cache: settings of one are refused.
    unused_settings = (*VllmServer.unused_settings, "hub_compile_cache", "hub_compile_cache_repo")

    def check_plan(self, plan: ServingPlan, image: ServingImage) -> None:
        problems = []
        parser = plan.request.tool_call_parser
        if parser is not None and parser != "none" and parser not in TOOL_CALL_PARSERS:
            problems.append(problem("tool_call_parser", parser, f"must be none or one of vLLM 0.13.0's parsers: "
                                    f"{', '.join(TOOL_CALL_PARSERS)}"))
        block = plan.request.prefix_cache_block_size
        if block is not None and block not in BLOCK_SIZES:
            problems.append(problem("prefix_cache_block_size", block, "must be one of "
                                    f"{', '.join(map(str, BLOCK_SIZES))} (vLLM's --block-size)"))
        if block is not None and plan.sequence_length < MIN_PREFIX_CACHE_SEQUENCE:
            problems.append(problem("sequence_length", plan.sequence_length, f"must be at least "
                                    f"{MIN_PREFIX_CACHE_SEQUENCE} with prefix_caching: NxD Inference's buckets "
                                    "of a prefix cache start there; turn prefix_caching off for shorter sequences"))
        draft = plan.draft
        if draft is not None and draft.model_type not in image.model_types:
            problems.append(problem("speculative_model", plan.request.speculative_model, f"is a {draft.model_type} "
                                    f"model, which {image.export.title} cannot compile; it does "
                                    f"{', '.join(image.model_types)}"))
        if draft is not None and plan.request.prefix_cache_block_size is not None:
            # The plugin gives a step's speculated positions the slots after the last token's, consecutively
            # (vllm-neuron release-0.4.1, neuronx_distributed_model_runner.py: "append consecutive slots for the
            # speculative tokens", slots[0] + i): past the end of a block of the paged cache they are the next
            # physical block's, which may hold another request's or a cached prefix's keys and values.
            problems.append(problem("speculative_model", plan.request.speculative_model, "cannot be served with a "
                                    "prefix cache: the vllm-neuron plugin writes a step's speculated tokens to the "
                                    "slots after the last one's, past the end of its block into another's; set "
                                    "prefix_caching=false"))
        if draft is not None and plan.request.quantization is not None:
            # The plugin's draft configuration is a copy of the model's, quantization included
            # (_init_fused_spec_config: copy.deepcopy(config.neuron_config)), while only the model's
            # checkpoint is quantized before the compile (_compile_and_load_model).
            problems.append(problem("quantization", plan.request.quantization, "cannot be served with "
                                    "speculative_model: the vllm-neuron plugin compiles the draft with the model's "
                                    "quantization but quantizes only the model's weights"))
        if problems:
            raise ServingConfigError(problems)

    def neuron_config(self, plan: ServingPlan, image: ServingImage) -> dict[str, object]:
        """What the plugin is told to give NxD Inference beyond what it derives from vLLM's arguments
        (``--additional-config``'s ``override_neuron_config``, vllm-user-guide-v1.rst): the weights
        sharded per rank into the compiled artifacts (``save_sharded_checkpoint``, which without it
        are sharded from the checkpoint at every load), and, with an image whose NxD Inference turns
        NKI kernels on by itself, the attention kernel off (:data:`ATTENTION_KERNEL_OFF_FROM`); with
        quantized weights, the quantization (:data:`QUANTIZED_CHECKPOINT`, :data:`QUANTIZATION_TYPE`)."""
        config: dict[str, object] = {"save_sharded_checkpoint": True}
        if version_key(image.export.version) >= version_key(ATTENTION_KERNEL_OFF_FROM):
            config["attn_kernel_enabled"] = False
        if plan.request.quantization is not None:
            # The plugin passes these four to NxD Inference when "quantized" is given
            # (neuronx_distributed_model_loader.py, "Get quantization config if specified").
            config.update(quantized=True, quantized_checkpoints_path=QUANTIZED_CHECKPOINT,
                          quantization_type=QUANTIZATION_TYPE, quantization_dtype=plan.request.quantization)
        return config

    def engine_arguments(self, plan: ServingPlan, image: ServingImage, model: str) -> tuple[str, ...]:
        """vLLM's engine arguments, the same for the export and every replica, so that what the
        export compiled is what each replica loads (vLLM 0.13.0 vllm/engine/arg_utils.py,
        ``EngineArgs.add_cli_args``). The plugin turns them into NxD Inference's configuration:
        ``tp_degree`` from ``--tensor-parallel-size``, ``batch_size`` from ``--max-num-seqs``,
        ``seq_len`` and ``max_context_length`` from ``--max-model-len``, the dtype from ``--dtype``
        (neuronx_distributed_model_loader.py, ``_get_default_neuron_config``). Each is given: the
        plugin's platform gives ``--max-num-seqs`` its own default and ``--max-model-len`` none
        (vllm_neuron/platform.py).

        Without prefix caching the plugin keeps the KV cache contiguous, one block of the whole
        sequence per batch slot (platform.py sets ``block_size`` to ``max_model_len``), and
        ``num_gpu_blocks_override`` must be the batch size exactly (vllm-user-guide-v1.rst, Known
        Issues 2: "Set num_gpu_blocks_override to exactly max_num_seqs"; the platform adds vLLM's
        null block itself). vLLM turns prefix caching on unless told (vllm/config/cache.py,
        ``enable_prefix_caching: bool = True``), so it is turned off here.

        With a prefix cache, the KV cache is paged in blocks of ``--block-size`` tokens, which the
        plugin requires ("When prefix caching is enabled, block_size must be set", platform.py), and
        ``--num-gpu-blocks-override`` is the block count, at least ``ceil(max_model_len / block_size)
        * max_num_seqs`` (neuronx_distributed_model_loader.py, ``_validate_neuron_config``); the
        plugin gives NxD Inference ``is_prefix_caching``, ``is_block_kv_layout``, ``pa_block_size``
        and ``pa_num_blocks`` from them (``_get_default_neuron_config``).

        With an EAGLE draft, ``--speculative-config`` names it at ``<model>/eagle-draft`` (``model`` is the
        checkpoint's directory at the export, where export-model converts the draft, and the export's at
        a replica, which holds the draft's ``config.json``: :data:`~neuron_serving.plan.engines.base.DRAFT_DIR`),
        with :data:`SPECULATION_METHOD` and the tokens it speculates (vllm/config/speculative.py in 0.13.0:
        ``method``, ``model``, ``num_speculative_tokens``)."""
        block = plan.request.prefix_cache_block_size
        kv_cache = ("--num-gpu-blocks-override", str(plan.batch_size), "--no-enable-prefix-caching") if block is None \
            else ("--enable-prefix-caching", "--block-size", str(block),
                  "--num-gpu-blocks-override", str(plan.request.effective_prefix_cache_blocks))
        return ("--tensor-parallel-size", str(plan.degree), "--max-num-seqs", str(plan.batch_size),
                "--max-model-len", str(plan.sequence_length), "--dtype", TORCH_DTYPES[plan.dtype], *kv_cache,
                "--additional-config", json.dumps({"override_neuron_config": self.neuron_config(plan, image)},
                                                  separators=(",", ":"), sort_keys=True),
                *self._speculation(plan, model))

    @staticmethod
    def _speculation(plan: ServingPlan, model: str) -> tuple[str, ...]:
        if plan.request.speculative_model is None:
            return ()
        config = {"method": SPECULATION_METHOD, "model": f"{model}/{DRAFT_DIR}",
                  "num_speculative_tokens": plan.request.speculative_tokens}
        return ("--speculative-config", json.dumps(config, separators=(",", ":"), sort_keys=True))

    def export_arguments(self, plan: ServingPlan, image: ServingImage, source: str, output: str) -> tuple[str, ...]:
        # vLLM 0.13.0 vllm/entrypoints/openai/run_batch.py: main builds the engine client (the
        # plugin compiles and saves to NEURON_COMPILED_ARTIFACTS, export_environment), then run_batch
        # reads the input, skipping empty lines ("# Skip empty lines."), so /dev/null is a batch of
        # none, and writes the outputs with open(output_file, "w"). `output` is not an argument: the
        # compile goes to NEURON_COMPILED_ARTIFACTS.
        return ("run-batch", "-i", "/dev/null", "-o", "/dev/null", "--model", source,
                *self.engine_arguments(plan, image, source))

    def export_environment(self, plan: ServingPlan, image: ServingImage, output: str) -> dict[str, str]:
        return {
            # Where the plugin saves the compiled model ("Loading pre-compiled models").
            "NEURON_COMPILED_ARTIFACTS": output,
            # The checkpoint is local: nothing needs the Hub.
            "HF_HUB_OFFLINE": "1",
            **_QUIET,
        }

    def export_expectations(self, plan: ServingPlan, image: ServingImage) -> dict[str, object]:
        """A finished NxD Inference compile holds ``neuron_config.json`` (models/config.py,
        ``CONFIG_FILE``), the compiled ``model.pt`` (models/application_base.py,
        ``COMPILED_MODEL_FILE_NAME``) and, with ``save_sharded_checkpoint``, the weights as
        ``weights/tp{rank}_sharded_checkpoint.safetensors`` for every rank, which a load reads
        instead of sharding the checkpoint (application_base.py, ``load``); the copies of the
        checkpoint's configuration and tokenizer sit beside them. ``neuron_config.json`` holds the
        NxD Inference configuration under ``neuron_config`` (models/config.py, ``to_dict`` and
        ``InferenceConfig.to_json_string``; a dtype as its name), all at NxD Inference cd3abf3.

        The plugin loads whatever compile it finds and ignores differing arguments
        (neuronx_distributed_model_loader.py, ``_load_compiled_model``: "Using pre-compiled
        artifacts, override_neuron_config will be ignored"), so this check is the only one of the
        shapes: ``batch_size`` is ``--max-num-seqs``, ``seq_len`` and ``max_context_length`` are
        ``--max-model-len`` (``_get_default_neuron_config``)."""
        return {
            "config": "neuron_config.json",
            "fields": {
                "neuron_config.tp_degree": plan.degree,
                "neuron_config.batch_size": plan.batch_size,
                "neuron_config.seq_len": plan.sequence_length,
                "neuron_config.max_context_length": plan.sequence_length,
                "neuron_config.torch_dtype": TORCH_DTYPES[plan.dtype],
                "neuron_config.save_sharded_checkpoint": True,
                **self._kv_cache_fields(plan),
                **self._quantization_fields(plan),
                **self._speculation_fields(plan),
            },
            "files": ["config.json", "tokenizer_config.json", "neuron_config.json", "model.pt",
                      *(f"weights/tp{rank}_sharded_checkpoint.safetensors" for rank in range(plan.degree)),
                      *([f"{DRAFT_DIR}/config.json"] if plan.request.speculative_model is not None else [])],
        }

    @staticmethod
    def _speculation_fields(plan: ServingPlan) -> dict[str, object]:
        """What the compile records of a fused EAGLE draft (models/config.py, NeuronConfig:
        ``enable_fused_speculation``, ``enable_eagle_speculation``, ``speculation_length``). A replica
        also reads the draft's ``config.json`` from the export (:meth:`engine_arguments`); its weights are
        in the compile's sharded ones (application_base.py, ``checkpoint_loader_fn``: the draft's state
        dict joins the model's, which ``save_sharded_checkpoint`` shards into ``weights/``)."""
        if plan.request.speculative_model is None:
            return {"neuron_config.enable_fused_speculation": False}
        return {"neuron_config.enable_fused_speculation": True, "neuron_config.enable_eagle_speculation": True,
                "neuron_config.speculation_length": plan.request.speculative_tokens}

    @staticmethod
    def _kv_cache_fields(plan: ServingPlan) -> dict[str, object]:
        """What the compile records of its KV cache: a prefix cache's block size and count, the count
        with vLLM's null block that the plugin's platform adds (platform.py, ``num_gpu_blocks_override
        += 1``; ``_handle_pa_num_blocks``)."""
        block = plan.request.prefix_cache_block_size
        if block is None:
            return {"neuron_config.is_prefix_caching": False}
        return {"neuron_config.is_prefix_caching": True, "neuron_config.is_block_kv_layout": True,
                "neuron_config.pa_block_size": block,
                "neuron_config.pa_num_blocks": plan.request.effective_prefix_cache_blocks + 1}

    @staticmethod
    def _quantization_fields(plan: ServingPlan) -> dict[str, object]:
        """What the compile records of its weights' quantization (models/config.py, NeuronConfig:
        ``quantized``, ``quantization_type``, ``quantization_dtype``)."""
        if plan.request.quantization is None:
            return {"neuron_config.quantized": False}
        return {"neuron_config.quantized": True, "neuron_config.quantization_type": QUANTIZATION_TYPE,
                "neuron_config.quantization_dtype": plan.request.quantization}

    def replica_environment(self, plan: ServingPlan, image: ServingImage, replica: Replica,
                            model_dir: str) -> dict[str, str]:
        return {
            # The export: loaded, never compiled again (it is mounted read-only).
            "NEURON_COMPILED_ARTIFACTS": model_dir,
            "NEURON_PROCESS_TAG": replica.process_tag,
            "HF_HUB_OFFLINE": "1",
            **_QUIET,
        }

    @staticmethod
    def tool_call_parser(plan: ServingPlan) -> str | None:
        """The parser of the model's tool calls, or None: the one asked for, else the model's own
        format's (:data:`TOOL_CALL_FORMATS`)."""
        asked = plan.request.tool_call_parser
        if asked is not None:
            return None if asked == "none" else asked
        model = plan.model
        for model_type, vocab_size, context, parser in TOOL_CALL_FORMATS:
            if (model.model_type == model_type and vocab_size in (None, model.vocab_size)
                    and model.max_position_embeddings >= (context or 0)):
                return parser
        return None

    def replica_entrypoint(self, image: ServingImage) -> str | None:
        # `vllm` itself, not the image's entry point: that runs its arguments as a child
        # (common/vllm_entrypoint.py: subprocess.check_call(sys.argv[1:])), as PID 1 of the container
        # with no handler for SIGTERM, which the kernel then drops, so `docker stop` would wait out its
        # timeout and kill vLLM. vLLM, as PID 1, handles SIGTERM and shuts down
        # (vllm/entrypoints/launcher.py, serve_http: loop.add_signal_handler(signal.SIGTERM, ...)).
        return image.export.entrypoint

    def replica_command(self, plan: ServingPlan, image: ServingImage, model_dir: str) -> tuple[str, ...]:
        # `vllm serve` (replica_entrypoint). vLLM 0.13.0 vllm/entrypoints/openai/cli_args.py: the
        # served name is what clients send as `model`; no access log of every health check and
        # scrape, no /docs, /redoc, /openapi.json.
        # Tool calls are read by the server from the generated text (vllm/entrypoints/openai/serving_chat.py
        # with vllm/tool_parsers/), after the compile: they change nothing the export holds.
        parser = self.tool_call_parser(plan)
        tools = ("--enable-auto-tool-choice", "--tool-call-parser", parser) if parser else ()
        return ("serve", model_dir, "--served-model-name", plan.model_id, "--port", str(CONTAINER_PORT),
                "--disable-uvicorn-access-log", "--disable-fastapi-docs", *tools,
                *self.engine_arguments(plan, image, model_dir))


_QUIET = {
    # vllm/usage/usage_lib.py (0.13.0): no usage reports to stats.vllm.ai.
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # vllm/utils/network_utils.py (0.13.0), get_ip: without it vLLM looks for a route to 8.8.8.8 to learn its
    # address, for a distributed setup a single server does not have.
    "VLLM_HOST_IP": "127.0.0.1",
}


NXDI = Nxdi()
