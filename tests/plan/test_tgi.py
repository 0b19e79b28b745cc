"""TGI: all six static-shape settings, explicitly, for every replica; the export key; the images it
accepts (its known tag, pinned to a digest or not)."""

import dataclasses

import pytest

from neuron_serving.plan import ServingConfigError, ServingRequest, plan_serving
from neuron_serving.plan.engines.base import optimum_neuron
from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5, tgi_settings


def _plan(**fields):
    return plan_serving(ServingRequest(**{"model_id": "llama-3-8b", "instance_type": "inf2.48xlarge",
                                          "tensor_parallel": 8, "batch_size": 8, "sequence_length": 4096,
                                          "max_input_tokens": 3072, **fields}))


def test_the_six_settings_follow_the_plan():
    assert tgi_settings(_plan()) == {
        "HF_NUM_CORES": "8",
        "HF_AUTO_CAST_TYPE": "bf16",
        "MAX_BATCH_SIZE": "8",
        "MAX_TOTAL_TOKENS": "4096",
        "MAX_INPUT_TOKENS": "3072",
        "MAX_BATCH_PREFILL_TOKENS": str(8 * 3072),
    }


def test_each_replica_environment_has_its_own_process_tag_and_the_export_as_model():
    plan = _plan()
    env = TGI.replica_environment(plan, TGI_3_3_5, plan.replicas[2], "/models/x")
    assert env["NEURON_PROCESS_TAG"] == "replica-2"
    assert env["MODEL_ID"] == "/models/x"
    assert env["MAX_CONCURRENT_REQUESTS"] == "128"
    assert set(tgi_settings(plan)) < set(env)


def test_export_key_changes_with_everything_that_changes_the_artifact():
    base = TGI.export_key(_plan(), TGI_3_3_5)
    variants = [
        TGI.export_key(_plan(model_id="llama-3.1-8b"), TGI_3_3_5),
        TGI.export_key(_plan(), dataclasses.replace(TGI_3_3_5, reference=TGI_3_3_5.reference.replace("5", "6"))),
        TGI.export_key(_plan(), dataclasses.replace(TGI_3_3_5, export=optimum_neuron("0.3.1", exports_offline=False))),
        TGI.export_key(_plan(tensor_parallel=4), TGI_3_3_5),
        TGI.export_key(_plan(batch_size=4), TGI_3_3_5),
        TGI.export_key(_plan(sequence_length=8192, max_input_tokens=4096), TGI_3_3_5),
        TGI.export_key(_plan(dtype="fp16"), TGI_3_3_5),
        TGI.export_key(_plan(), TGI_3_3_5, "5f0b02c75b57c5855da9ae460ce51323ea669d8a"),
        TGI.export_key(_plan(), TGI_3_3_5, "v2"),
    ]
    assert len({base, *variants}) == 10
    assert TGI.export_key(_plan(), TGI_3_3_5) == base


def test_export_key_is_a_safe_directory_name():
    key = TGI.export_key(_plan(model_id="NousResearch/Meta-Llama-3-8B-Instruct"), TGI_3_3_5)
    assert key.startswith("v4-tgi-meta-llama-3-8b-instruct-tp8-b8-s4096-bf16-")
    assert all(c.isalnum() or c == "-" for c in key)


DIGEST = "sha256:" + "0123456789abcdef" * 4
"""A well-formed digest (not the image's real one: the tests pull nothing)."""


def test_a_known_tag_pinned_to_a_digest_keeps_the_tags_facts_and_is_run_by_the_pinned_reference():
    pinned = TGI.image(f"{TGI_3_3_5.reference}@{DIGEST}")
    assert pinned.reference == f"{TGI_3_3_5.reference}@{DIGEST}"
    assert dataclasses.replace(pinned, reference=TGI_3_3_5.reference) == TGI_3_3_5
    assert TGI.image(TGI_3_3_5.reference) is TGI_3_3_5
    assert TGI.serving_image(_plan(), f"{TGI_3_3_5.reference}@{DIGEST}") == pinned


def test_the_export_key_changes_with_the_digest_and_an_unpinned_tag_keeps_its_key():
    tag = TGI.export_key(_plan(), TGI_3_3_5)
    pinned = TGI.export_key(_plan(), TGI.image(f"{TGI_3_3_5.reference}@{DIGEST}"))
    other = TGI.export_key(_plan(), TGI.image(f"{TGI_3_3_5.reference}@sha256:{'f' * 64}"))
    assert len({tag, pinned, other}) == 3
    assert pinned == TGI.export_key(_plan(), TGI.image(f"{TGI_3_3_5.reference}@{DIGEST}"))
    assert pinned.rsplit("-", 1)[0] == tag.rsplit("-", 1)[0]


@pytest.mark.parametrize("digest", [
    "sha256:" + "0123456789ABCDEF" * 4,
    "sha256:" + "0123456789abcdef" * 3,
    "sha256:" + "0123456789abcdef" * 4 + "0",
    "sha512:" + "0123456789abcdef" * 8,
    "md5:" + "0123456789abcdef" * 2,
    "0123456789abcdef" * 4,
    "",
    f"{DIGEST}@{DIGEST}",
])
def test_a_malformed_digest_is_refused_naming_image_and_the_form_allowed(digest):
    reference = f"{TGI_3_3_5.reference}@{digest}"
    with pytest.raises(ServingConfigError) as error:
        TGI.image(reference)
    assert str(error.value) == (
        f"image ({reference!r}) has a malformed digest ({digest!r}): a pinned image is a known image followed by "
        "@sha256:<64 lowercase hex digits>, such as "
        "ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@sha256:<64 lowercase hex digits>")


def test_a_digest_without_the_tag_is_refused_asking_for_the_known_tag():
    reference = f"ghcr.io/huggingface/text-generation-inference@{DIGEST}"
    with pytest.raises(ServingConfigError) as error:
        TGI.image(reference)
    assert str(error.value) == (
        f"image ({reference!r}) pins a digest without a tag, which does not say whose export and serving tools the "
        f"image carries; include the tag: ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@{DIGEST}")


def test_a_digest_of_an_unknown_repository_without_a_tag_names_the_known_images():
    with pytest.raises(ServingConfigError, match=r"^image \('localhost:5000/tgi@sha256:[0-9a-f]{64}'\) pins a digest "
                       r"without a tag, .*; include the tag: ghcr.io/huggingface/text-generation-inference:"
                       r"3.3.5-neuron, then @sha256:[0-9a-f]{64}$"):
        TGI.image(f"localhost:5000/tgi@{DIGEST}")


@pytest.mark.parametrize("reference", [
    f"ghcr.io/huggingface/text-generation-inference:3.3.4-neuron@{DIGEST}",
    f"example.com/huggingface/text-generation-inference:3.3.5-neuron@{DIGEST}",
    "ghcr.io/huggingface/text-generation-inference:latest",
])
def test_an_unknown_tag_with_or_without_a_digest_is_refused_naming_the_known_images(reference):
    with pytest.raises(ServingConfigError) as error:
        TGI.image(reference)
    assert str(error.value) == (
        f"image ({reference!r}) is not a TGI serving image this library knows the export and serving tools of; "
        "known: ghcr.io/huggingface/text-generation-inference:3.3.5-neuron "
        "(each may be pinned by digest: <image>@sha256:<64 lowercase hex digits>)")


def test_a_pinned_image_still_refuses_a_model_its_optimum_neuron_cannot_export():
    with pytest.raises(ServingConfigError, match=r"^model_id \('mistralai/Mistral-7B-Instruct-v0.3'\) is a mistral "
                       r"model, which optimum-neuron 0.3.0 in ghcr.io/huggingface/text-generation-inference:3.3.5-"
                       r"neuron@sha256:[0-9a-f]{64} cannot export"):
        TGI.serving_image(_plan(model_id="mistralai/Mistral-7B-Instruct-v0.3"), f"{TGI_3_3_5.reference}@{DIGEST}")
