"""The README's synth command, for real: `npx cdk synth` runs app.py offline with the CLI and the Node.js
pinned in package.json."""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CDK = ROOT / "node_modules" / ".bin" / "cdk"


@pytest.fixture(scope="module")
def npx_env() -> dict[str, str]:
    """The environment of the README's `npx cdk synth`: the venv active, no AWS credentials, and none of
    jsii's JSII_SILENCE_WARNING_* variables (scripts/test exports one for the in-process synths), so a
    Node.js that jsii does not support shows its banner here."""
    if not CDK.exists():
        if os.environ.get("CI"):
            pytest.fail("node_modules/.bin/cdk is missing: run `npm ci`")
        pytest.skip("the pinned CDK CLI is not installed: run `npm ci`")
    if shutil.which("npx") is None:
        pytest.skip("npx is not installed: install Node.js and npm")
    env = {
        **os.environ,
        # app.py runs as `python3 app.py` (cdk.json): the venv's python3 must come first.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "CDK_DISABLE_CLI_TELEMETRY": "true",
    }
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)
    for key in [key for key in env if key.startswith("JSII_SILENCE_WARNING_")]:
        del env[key]
    return env


@pytest.fixture(scope="module")
def cdk_synth(npx_env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(outdir: Path, *context: str) -> subprocess.CompletedProcess[str]:
        # Through npx as the README runs it: npx puts node_modules/.bin first on PATH, so the CLI, app.py
        # and jsii's kernel (which starts `node` from PATH unless JSII_NODE is set: aws/jsii v1.139.0,
        # packages/@jsii/python-runtime/src/jsii/_kernel/providers/process.py) run the pinned node.
        args = ["npx", "cdk", "synth", "NeuronLlamaStack", "--quiet", "--output", str(outdir)]
        for item in context:
            args += ["-c", item]
        result = subprocess.run(args, cwd=ROOT, env=npx_env, capture_output=True, text=True, timeout=300)
        # Every jsii node banner (end-of-life, deprecated, untested, known broken) has this line: aws/jsii
        # v1.139.0, packages/@jsii/check-node/src/index.ts, veryVisibleMessage. package.json pins Node 24,
        # whose end-of-life is 2028-04-30 in check-node's constants.ts (22's is 2027-04-30).
        assert "This software is currently running on node" not in result.stderr
        assert "end-of-life" not in result.stderr
        return result

    return run


def test_npx_runs_the_node_package_json_pins(npx_env):
    # Every synth below runs through npx and asserts that jsii printed no banner (cdk_synth).
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"].get("node")
    node = subprocess.run(["npx", "node", "--version"], cwd=ROOT, env=npx_env, capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()
    assert node == f"v{pinned}"
    assert node.startswith("v24.")


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
