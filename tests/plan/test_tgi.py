"""TGI settings: all six static-shape settings, explicitly, for every replica."""

import dataclasses

from neuron_serving.plan import ServingRequest, plan_serving
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
        TGI.export_key(_plan(), dataclasses.replace(TGI_3_3_5, optimum_neuron="0.3.1")),
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
