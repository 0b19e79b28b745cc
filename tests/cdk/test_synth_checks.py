"""Regression nets over whole templates: snapshots, cfn-lint, and cdk-nag being really active."""

import json
import subprocess
import sys
from pathlib import Path

import aws_cdk
import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from .conftest import SNAPSHOT_CONFIGS, synthesize

LINTED_CONFIGS = {
    **SNAPSHOT_CONFIGS,
    "pinned_ami": {"ami_id": "ami-0123456789abcdef0"},
    "inf2_48xlarge_tp8": {"instance_type": "inf2.48xlarge", "tensor_parallel": "8"},
}


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("name", sorted(SNAPSHOT_CONFIGS))
def test_template_matches_snapshot(name, synth, snapshot_json):
    assert synth(**SNAPSHOT_CONFIGS[name]).json == snapshot_json


def test_cfn_lint_reports_nothing_on_any_template(synth, tmp_path):
    paths = []
    for name, context in LINTED_CONFIGS.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(synth(**context).json))
        paths.append(str(path))
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), *paths], capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_cdk_nag_is_active_so_an_unacknowledged_finding_fails_synthesis(monkeypatch):
    acknowledge = aws_cdk.Validations.acknowledge

    def drop_ec29(self, *rules):
        kept = [rule for rule in rules if "EC29" not in rule.id]
        if kept:
            acknowledge(self, *kept)

    monkeypatch.setattr(aws_cdk.Validations, "acknowledge", drop_ec29)
    with pytest.raises(RuntimeError, match=r"AwsSolutions-EC29"):
        synthesize({})
