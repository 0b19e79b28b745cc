"""Regression nets over whole templates: snapshots, cfn-lint, and cdk-nag being really active."""

import json
import os
import subprocess
import sys
from pathlib import Path

import aws_cdk
import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from neuron_serving.settings import PRESETS

from .conftest import CAPACITY_CONFIGS, CERTIFICATE, SNAPSHOT_CONFIGS, synthesize, synthesized
from .test_stack_settings import ORG

CHECKOV = Path(__file__).resolve().parents[2] / ".tools" / "checkov" / "bin" / "checkov"
"""checkov in a venv of its own (tests/harness/requirements-checkov.txt; scripts/test makes it)."""

LINTED_CONFIGS = {
    **SNAPSHOT_CONFIGS,
    "pinned_ami": {"ami_id": "ami-0123456789abcdef0"},
    "serving_ami_fleet_registry": {"serving_ami": "build", "fleet": "asg",
                                   "image_registry": "111122223333.dkr.ecr.us-east-1.amazonaws.com/ghcr"},
    "inf2_48xlarge_tp8": {"instance_type": "inf2.48xlarge", "tensor_parallel": "8"},
    "internet_facing": {"internet_facing": "true", "allowed_cidrs": "203.0.113.0/24", "certificate_arn": CERTIFICATE},
    "internet_facing_sign_in_rate_limit": {
        "internet_facing": "true", "allowed_cidrs": "203.0.113.0/24", "certificate_arn": CERTIFICATE,
        "fleet": "asg", "rate_limit": "1000", "permissions_boundary": "team-boundary", "role_path": "/neuron/",
        "oidc_issuer": "https://idp.example.com", "oidc_client_id": "alb", "oidc_client_secret": "oidc/alb",
        "oidc_authorization_endpoint": "https://idp.example.com/authorize",
        "oidc_token_endpoint": "https://idp.example.com/token",
        "oidc_user_info_endpoint": "https://idp.example.com/userinfo"},
    "internal_api_keys_prebuilt": {"api_keys": "true", "prebuilt_export": "s3://team-exports/llama3-8b/tp2",
                                   "hf_token_secret": "hf/token"},
    "organisation": ORG,
    **CAPACITY_CONFIGS,
    **{f"preset_{name}": {"preset": name} for name in PRESETS},
}
"""Every configuration the gates scan: the snapshot set, the internet-facing ones, and the rest of
what changes the template's security (API keys, sign-in, rate limit, boundary, prebuilt export),
an organisation's settings (imported VPC, tags, alarm topic) and every preset."""


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("name", sorted(SNAPSHOT_CONFIGS))
def test_template_matches_snapshot(name, synth, snapshot_json):
    assert synth(**SNAPSHOT_CONFIGS[name]).json == snapshot_json


@pytest.fixture(scope="module")
def gated_templates(tmp_path_factory) -> list[str]:
    """Every configuration of LINTED_CONFIGS synthesized (cdk-nag's AwsSolutions checks attached:
    an unacknowledged finding fails synthesis) and written to a file."""
    directory = tmp_path_factory.mktemp("templates")
    paths = []
    for name, context in LINTED_CONFIGS.items():
        path = directory / f"{name}.json"
        path.write_text(json.dumps(synthesized(**context).json))
        paths.append(str(path))
    return paths


def test_cfn_lint_reports_nothing_on_any_template(gated_templates):
    cfn_lint = Path(sys.executable).parent / "cfn-lint"
    result = subprocess.run([str(cfn_lint), *gated_templates], capture_output=True, text=True)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_checkov_fails_no_check_on_any_template(gated_templates):
    if not CHECKOV.exists():
        pytest.fail("scripts/test makes .tools/checkov (tests/harness/requirements-checkov.txt)")
    # Offline: no Prisma Cloud mapping download (--skip-download, BC_SKIP_MAPPING) and no PyPI
    # update check (CKV_SKIP_PACKAGE_UPDATE_CHECK).
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CKV_SKIP_PACKAGE_UPDATE_CHECK": "true"}
    result = subprocess.run([str(CHECKOV), "--skip-download", "--framework", "cloudformation", "--output", "json",
                             "--quiet", *(arg for p in gated_templates for arg in ("-f", p))],
                            capture_output=True, text=True, env=env, timeout=600)
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = sorted({(Path(c["file_path"]).stem, c["check_id"], c["resource"])
                     for r in reports for c in r["results"]["failed_checks"]})
    assert failed == [], result.stderr[-2000:]
    scanned = sum(r["summary"]["passed"] for r in reports)
    assert scanned > 100 * len(LINTED_CONFIGS) // 2, "checkov checked too little to be trusted"


def test_cdk_nag_is_active_so_an_unacknowledged_finding_fails_synthesis(monkeypatch):
    acknowledge = aws_cdk.Validations.acknowledge

    def drop_ec29(self, *rules):
        kept = [rule for rule in rules if "EC29" not in rule.id]
        if kept:
            acknowledge(self, *kept)

    monkeypatch.setattr(aws_cdk.Validations, "acknowledge", drop_ec29)
    with pytest.raises(RuntimeError, match=r"AwsSolutions-EC29"):
        synthesize({})


def exceptions(context: dict) -> dict[str, str]:
    """Every cdk-nag acknowledgment (``aws:cdk:acknowledged-rules`` metadata, by construct path)
    and every checkov skip (``Metadata.checkov.skip``, by logical id) of one configuration, with
    its reason."""
    synth = synthesized(**context)
    found = {}
    for construct in synth.stack.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == "aws:cdk:acknowledged-rules":
                for rule, reason in entry.data.items():
                    found[f"cdk-nag {rule} at {construct.node.path}"] = reason
    for logical_id, resource in synth.json["Resources"].items():
        for skip in resource.get("Metadata", {}).get("checkov", {}).get("skip", []):
            found[f"checkov {skip['id']} on {logical_id} ({resource['Type']})"] = skip["comment"]
    return found


def test_every_acknowledgment_and_skip_with_its_reason_in_one_list(snapshot):
    """The one place a reviewer reads every exception to the scanners' rules, over every scanned
    configuration; a new one changes this snapshot."""
    every: dict[str, str] = {}
    for context in LINTED_CONFIGS.values():
        every.update(exceptions(context))
    assert all(len(reason) >= 40 for reason in every.values()), every
    assert dict(sorted(every.items())) == snapshot


@pytest.mark.parametrize("name", ["default", "internet_facing_sign_in_rate_limit", "internal_api_keys_prebuilt"])
def test_every_cdk_nag_acknowledgment_is_still_needed(name, monkeypatch):
    """Dropping any one acknowledgment makes synthesis fail: none is left over."""
    context = LINTED_CONFIGS[name]
    # Ours are AwsSolutions' (aws-cdk-lib acknowledges CloudFormation-Validate rules of its own).
    rules = sorted({key.split()[1].removeprefix("Annotation::") for key in exceptions(context)
                    if key.startswith("cdk-nag Annotation::AwsSolutions-")})
    assert rules
    acknowledge = aws_cdk.Validations.acknowledge
    for dropped in rules:
        def without(self, *acks, dropped=dropped):
            kept = [a for a in acks if a.id != dropped]
            if kept:
                acknowledge(self, *kept)

        monkeypatch.setattr(aws_cdk.Validations, "acknowledge", without)
        with pytest.raises(RuntimeError, match="ValidationFailed"):
            synthesize(context)
