"""The nxdi engine in a synthesized stack: its DLAMI, its compile cache, and a prefix cache by default."""

from __future__ import annotations

import json

from neuron_serving.plan.engines.nxdi import DLC_VLLM_0_16_0
from neuron_serving.plan.layout import request_from_layout
from neuron_serving.render.boot import EAGLE_DRAFT, RUN_REPLICA


def _replica_command(template) -> str:
    return template.stack.boot_script.boot.files[RUN_REPLICA]


def _image_id(template) -> str:
    (launch,) = template.resources("AWS::EC2::LaunchTemplate").values()
    return launch["Properties"]["LaunchTemplateData"]["ImageId"]


def test_the_default_nxdi_stack_keeps_a_prefix_cache_of_the_batch_at_full_length_and_says_so(synth):
    template = synth(engine="nxdi")
    plan = template.stack.plan
    blocks = -(-plan.sequence_length // 32) * plan.batch_size
    assert f"--enable-prefix-caching --block-size 32 --num-gpu-blocks-override {blocks}" in _replica_command(template)
    layout = json.loads(template.json["Outputs"]["ServingPlan"]["Value"])
    assert (layout["prefix_cache_block_size"], layout["prefix_cache_blocks"]) == (32, blocks)
    read = request_from_layout(layout)
    assert (read.prefix_cache_block_size, read.effective_prefix_cache_blocks, read.kv_cache_tokens) == (
        32, blocks, plan.request.kv_cache_tokens)
    # The SDK 2.28 image's runtime wants a driver below 2.29: the Ubuntu 22.04 base DLAMI (SDK 2.29, driver 2.27).
    assert _image_id(template) == "resolve:ssm:/aws/service/neuron/dlami/base/ubuntu-22.04/latest/image_id"
    # No Hub cache of compiled graphs, the bucket's compile cache as for the other engines.
    spec = template.stack.boot_script.spec
    assert spec.hub_cache is None
    assert template.stack.boot_script.options.compile_cache == template.stack.artifact_cache.compile_cache_uri


def test_without_prefix_caching_each_replica_has_one_block_per_batch_slot_and_int8_weights_when_asked(synth):
    template = synth(engine="nxdi", prefix_caching="false", quantization="int8")
    batch = template.stack.plan.batch_size
    assert f"--num-gpu-blocks-override {batch} --no-enable-prefix-caching" in _replica_command(template)
    layout = json.loads(template.json["Outputs"]["ServingPlan"]["Value"])
    assert "prefix_cache_block_size" not in layout
    assert '"quantization_dtype":"int8"' in _replica_command(template)
    # bench --stack reads the layout back with its quantized weights, whose memory the planner counts.
    assert layout["quantization"] == "int8" and request_from_layout(layout).quantization == "int8"


def test_an_eagle_draft_is_converted_by_the_bundles_script_and_named_by_every_replica_and_the_layout(synth):
    template = synth(engine="nxdi", speculative_model="yuhuili/EAGLE-LLaMA3-Instruct-8B", speculative_tokens="4",
                     prefix_caching="false")
    files = template.stack.boot_script.boot.files
    assert files[EAGLE_DRAFT].startswith('"""eagle-draft TARGET DRAFT OUT')
    command = _replica_command(template)
    assert '"method":"eagle"' in command and '"num_speculative_tokens":4' in command
    layout = json.loads(template.json["Outputs"]["ServingPlan"]["Value"])
    assert (layout["speculative_model"], layout["speculative_tokens"]) == ("yuhuili/EAGLE-LLaMA3-Instruct-8B", 4)
    # bench --stack reads the layout back with the draft, whose memory the planner counts.
    assert request_from_layout(layout).speculative_model == "yuhuili/EAGLE-LLaMA3-Instruct-8B"
    assert EAGLE_DRAFT not in synth(engine="nxdi").stack.boot_script.boot.files


def test_the_sdk_2_31_image_launches_the_newest_ubuntu_24_04_dlami_and_turns_the_attention_kernel_off(synth):
    template = synth(engine="nxdi", image=DLC_VLLM_0_16_0.reference)
    assert _image_id(template) == "resolve:ssm:/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id"
    assert '"attn_kernel_enabled":false' in _replica_command(template)
