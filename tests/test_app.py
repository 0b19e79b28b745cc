"""The README's synth command, for real: the pinned CDK CLI runs app.py offline."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CDK = ROOT / "node_modules" / ".bin" / "cdk"


@pytest.fixture(scope="module")
def cdk_synth():
    if not CDK.exists():
        if os.environ.get("CI"):
            pytest.fail("node_modules/.bin/cdk is missing: run `npm ci`")
        pytest.skip("the pinned CDK CLI is not installed: run `npm ci`")
    env = {
        **os.environ,
        # app.py runs as `python3 app.py` (cdk.json): the venv's python3 must come first.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    }
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)

    def run(outdir: Path, *context: str) -> subprocess.CompletedProcess[str]:
        args = [str(CDK), "synth", "NeuronLlamaStack", "--quiet", "--output", str(outdir)]
        for item in context:
            args += ["-c", item]
        return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    return run


def test_cdk_synth_at_degree_4_on_inf2_24xlarge_reports_3_replicas(cdk_synth, tmp_path):
    result = cdk_synth(tmp_path, "instance_type=inf2.24xlarge", "tensor_parallel=4")
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_path / "NeuronLlamaStack.template.json").read_text())
    assert template["Outputs"]["ReplicaCount"]["Value"] == "3"
    assert template["Outputs"]["CoresPerReplica"]["Value"] == "4"


def test_cdk_synth_with_degree_5_fails_naming_tensor_parallel(cdk_synth, tmp_path):
    result = cdk_synth(tmp_path, "instance_type=inf2.24xlarge", "tensor_parallel=5")
    assert result.returncode != 0
    assert "NeuronLlamaStack: tensor_parallel (5) must be one of 2, 4, 6, 8, 10, 12 on inf2.24xlarge" in result.stderr
    assert "Traceback" not in result.stderr
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_cdk_synth_with_engine_vllm_serves_the_vllm_image(cdk_synth, tmp_path):
    result = cdk_synth(tmp_path, "engine=vllm")
    assert result.returncode == 0, result.stderr
    outputs = json.loads((tmp_path / "NeuronLlamaStack.template.json").read_text())["Outputs"]
    assert outputs["ServingImage"]["Value"] == "ghcr.io/huggingface/optimum-neuron-vllm:0.4.5"
    assert outputs["EndpointUrl"]["Description"].startswith("Base URL of the vLLM API: /v1/completions")
    assert outputs["ReplicaCount"]["Value"] == "6"


def test_cdk_synth_with_an_unknown_engine_fails_naming_engine(cdk_synth, tmp_path):
    result = cdk_synth(tmp_path, "engine=nonsense")
    assert result.returncode != 0
    assert "NeuronLlamaStack: engine ('nonsense') must be one of tgi, vllm" in result.stderr
    assert "Traceback" not in result.stderr


def test_cdk_synth_with_a_digest_but_no_tag_fails_asking_for_the_tag(cdk_synth, tmp_path):
    digest = "sha256:" + "0123456789abcdef" * 4
    result = cdk_synth(tmp_path, f"image=ghcr.io/huggingface/text-generation-inference@{digest}")
    assert result.returncode != 0
    assert (f"NeuronLlamaStack: image ('ghcr.io/huggingface/text-generation-inference@{digest}') pins a digest "
            "without a tag") in result.stderr
    assert f"include the tag: ghcr.io/huggingface/text-generation-inference:3.3.5-neuron@{digest}" in result.stderr
    assert "Traceback" not in result.stderr


def test_cdk_synth_with_a_misspelt_key_fails_naming_it_and_the_setting(cdk_synth, tmp_path):
    result = cdk_synth(tmp_path, "tensor_paralel=8")
    assert result.returncode != 0
    assert "NeuronLlamaStack: tensor_paralel ('8') is not a setting; did you mean tensor_parallel?" in result.stderr
    assert "Traceback" not in result.stderr


def test_cdk_synth_reads_an_organisations_config_file_and_a_preset(cdk_synth, tmp_path):
    org = tmp_path / "org.yaml"
    org.write_text("log_retention_days: 90\nname_prefix: ml-\ntags: {team: ml-platform}\n")
    result = cdk_synth(tmp_path / "out", f"config={org}", "preset=llama-3.1-8b-latency")
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_path / "out" / "NeuronLlamaStack.template.json").read_text())
    assert template["Outputs"]["CoresPerReplica"]["Value"] == "8"
    groups = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Logs::LogGroup"]
    assert {"Key": "team", "Value": "ml-platform"} in groups[0]["Tags"]
    assert 90 in {g.get("RetentionInDays") for g in groups}
