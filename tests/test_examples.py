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
         "print(neuron_serving.__file__); print(len(list(pathlib.Path(u.__file__).parent.glob('*.j2'))))"],
        cwd=tmp_path, env=_environment(), capture_output=True, text=True, check=True)
    location, templates = result.stdout.split()
    assert Path(location).is_relative_to(fresh_python.parents[1])
    assert int(templates) == len(list((ROOT / "userdata").glob("*.j2")))


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


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_synthesizes_from_the_wheel_alone(fresh_python, tmp_path, example):
    copy = tmp_path / example.name
    shutil.copytree(example, copy, ignore=shutil.ignore_patterns("__pycache__", "cdk.out"))
    result = subprocess.run([str(fresh_python), "app.py"], cwd=copy, env={**_environment(), "CDK_OUTDIR": "out"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    templates = list((copy / "out").glob("*.template.json"))
    assert templates, "the example synthesized no stack"
    manifest = json.loads((copy / "out" / "manifest.json").read_text())
    assert not [m for a in manifest["artifacts"].values() for m in a.get("metadata", {}).values()
                if any(entry["type"] == "aws:cdk:error" for entry in m)]


def test_there_are_examples():
    assert {e.name for e in EXAMPLES} >= {"team_template"}
