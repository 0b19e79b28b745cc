"""The examples, as a user of the published wheel runs them: the wheel installed into a fresh
virtual environment outside the repository, each example copied on its own into an empty folder
and synthesized there (cdk-nag's checks on), with no file of the repository on the path."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.parent for p in (ROOT / "examples").glob("*/app.py"))


@pytest.fixture(scope="module")
def fresh_python(wheel, tmp_path_factory) -> Path:
    """A new venv holding only the wheel of this library. Its dependencies (aws-cdk-lib, jsii's
    Node.js bundle: hundreds of MB) come from the test venv's site-packages through a .pth path
    entry rather than a download per run; a path entry adds that folder to sys.path without running
    its .pth files, so the test venv's editable install of this library stays inactive there, and
    the venv's own site-packages, where the wheel goes, comes first."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    own = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    Path(own, "dependencies.pth").write_text(site.getsitepackages()[0] + "\n")
    return python


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AWS_", "CDK_"))}
    env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] = "20"
    return env


def test_the_fresh_venv_imports_the_library_from_the_wheel_with_its_templates(fresh_python, tmp_path):
    result = subprocess.run(
        [str(fresh_python), "-c", "import neuron_serving, neuron_serving.userdata as u, pathlib; "
         "print(neuron_serving.__file__); print(len(list(pathlib.Path(u.__file__).parent.rglob('*.j2'))))"],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, check=True)
    location, templates = result.stdout.split()
    assert Path(location).is_relative_to(fresh_python.parents[1])
    assert int(templates) == len(list((ROOT / "userdata").rglob("*.j2")))


def test_the_wheel_declares_every_dependency_it_needs(fresh_python):
    result = subprocess.run([str(fresh_python), "-m", "pip", "check", "--disable-pip-version-check"],
                            env=_environment(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_default_stack_synthesizes_from_the_wheel_with_no_argument(fresh_python, tmp_path):
    app = "from aws_cdk import App\nfrom neuron_serving import NeuronLlamaStack\napp = App()\n" \
          "NeuronLlamaStack(app, 'Llama')\napp.synth()\n"
    (tmp_path / "app.py").write_text(app)
    result = subprocess.run([str(fresh_python), "app.py"], cwd=tmp_path, env={**_environment(), "CDK_OUTDIR": "out"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    template = json.loads((tmp_path / "out" / "Llama.template.json").read_text())
    assert template["Outputs"]["ReplicaCount"]["Value"] == "6"


@pytest.fixture(scope="module")
def synthesized_examples(fresh_python, tmp_path_factory) -> dict[str, subprocess.CompletedProcess[str] | Path]:
    """Each example copied alone into an empty folder and run there by the fresh venv's python:
    its cloud assembly folder, or the failed run."""
    results: dict[str, subprocess.CompletedProcess[str] | Path] = {}
    for example in EXAMPLES:
        copy = tmp_path_factory.mktemp("example") / example.name
        shutil.copytree(example, copy, ignore=shutil.ignore_patterns("__pycache__", "cdk.out"))
        result = subprocess.run([str(fresh_python), "app.py"], cwd=copy,
                                env={**_environment(), "CDK_OUTDIR": "out"}, capture_output=True, text=True,
                                timeout=300)
        results[example.name] = copy / "out" if result.returncode == 0 else result
    return results


@pytest.mark.parametrize("example", [e.name for e in EXAMPLES])
def test_each_example_synthesizes_from_the_wheel_alone_with_cdk_nag(synthesized_examples, example):
    out = synthesized_examples[example]
    assert isinstance(out, Path), out.stderr[-3000:]
    assert list(out.glob("*.template.json")), "the example synthesized no stack"


def test_two_models_share_one_load_balancer_routed_by_host_without_name_clashes(synthesized_examples):
    out = synthesized_examples["multi_model"]
    assert isinstance(out, Path), out.stderr[-3000:]
    template = json.loads((out / "TwoModels.template.json").read_text())
    resources = template["Resources"].values()
    of = lambda kind: [r["Properties"] for r in resources if r["Type"] == kind]  # noqa: E731
    assert len(of("AWS::ElasticLoadBalancingV2::LoadBalancer")) == 1
    assert len(of("AWS::ElasticLoadBalancingV2::TargetGroup")) == 2
    assert len(of("AWS::AutoScaling::AutoScalingGroup")) == 2
    (rule,) = of("AWS::ElasticLoadBalancingV2::ListenerRule")
    assert rule["Conditions"] == [{"Field": "host-header", "HostHeaderConfig": {"Values": ["small.llm.internal"]}}]
    dashboards = [d["DashboardName"] for d in of("AWS::CloudWatch::Dashboard")]
    assert len(dashboards) == 2 and len({json.dumps(d) for d in dashboards}) == 2
    bodies = [json.dumps(d["DashboardBody"]) for d in of("AWS::CloudWatch::Dashboard")]
    assert '-Llama' in bodies[0] + bodies[1] and '-Small' in bodies[0] + bodies[1]
    # Each model's hosts compile and publish their export, so each dashboard alarms on a failed publish.
    publish_alarms = [a for a in of("AWS::CloudWatch::Alarm") if a.get("MetricName") == "ExportPublishFailures"]
    assert len(publish_alarms) == 2
    # Each fleet waits for its own hosts' readiness signals.
    fleets = [k for k, r in template["Resources"].items() if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert sorted(fleets) == ["LlamaFleet", "SmallFleet"]


def test_there_are_examples():
    assert {e.name for e in EXAMPLES} >= {"team_template", "multi_model"}
