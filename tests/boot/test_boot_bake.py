"""The bake of a serving AMI (userdata/bake.sh.j2, render_bake_script) on simulated hosts: it does the
boot's install-tools and pull-image steps from the same fragments, so that it installs and pulls
exactly what a boot on the same AMI would, and a host booted from the AMI finds that done."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import SMALL_MODEL, Host, make_plan

from neuron_serving.cdk.serving_ami import bake_document
from neuron_serving.plan.host import resolve_host
from neuron_serving.render.boot import render_bake_script
from neuron_serving.render.boot_options import BootOptions
from tests.harness.userdata import boot_of

PLAN = make_plan("inf2.xlarge", model_id=SMALL_MODEL)
CACHE = BootOptions(artifact_cache="s3://cache-bucket/exports")
REGISTRY = "111122223333.dkr.ecr.eu-west-1.amazonaws.com"


def _pulls(host: Host) -> list[tuple[str, str]]:
    return [(r["query"]["fromImage"], r["query"]["tag"]) for r in host.engine.records
            if r["kind"] == "request" and str(r["path"]).endswith("/images/create")]


def _installs(host: Host) -> list[list[str]]:
    return [a[a.index("install") + 1:] for a in host.calls("apt-get") if "install" in a]


def test_the_bake_installs_and_pulls_what_a_boot_on_the_same_image_would(make_host: Callable[..., Host]) -> None:
    spec = resolve_host(PLAN)
    baked, booted = make_host(0, missing=("haproxy",), images=()), make_host(1, missing=("haproxy",), images=())

    result = baked.run_script(render_bake_script(PLAN, spec))
    booted.boot(boot_of(PLAN))

    assert result.returncode == 0, result.stdout + result.stderr
    # The same steps, from the same fragments: HAProxy by apt (and rsyslog told of its rule), docker
    # enabled, the image pulled. The bake needs no Neuron device (the baked host has none).
    assert _installs(baked) == _installs(booted) == [["-y", "-q", "haproxy"]]
    assert ["try-restart", "rsyslog"] in baked.calls("systemctl")
    assert ["enable", "--now", "docker"] in baked.calls("systemctl")
    assert _pulls(baked) == _pulls(booted) == [("ghcr.io/huggingface/text-generation-inference", "3.3.5-neuron")]
    assert "baked: Docker version" in result.stdout and spec.pulled in result.stdout


def test_the_component_s_check_finds_the_baked_image_and_fails_without_it(make_host: Callable[..., Host]) -> None:
    spec = resolve_host(PLAN)
    check = _check_script(spec.pulled)
    baked, bare = make_host(0, images=()), make_host(0, images=())
    baked.run_script(render_bake_script(PLAN, spec))

    assert baked.run_script(check).returncode == 0
    unbaked = bare.run_script(check)
    assert unbaked.returncode != 0
    assert f"No such image: {spec.pulled}" in unbaked.stderr


def _check_script(image: str) -> str:
    """The check of the serving AMI's component (validate and test phases), as NeuronServingAmi writes it."""
    document = json.loads(bake_document("true", image))
    (check,) = {p["steps"][0]["inputs"]["commands"][0] for p in document["phases"] if p["name"] != "build"}
    return check


def test_the_bake_of_a_private_registry_logs_in_with_the_build_instance_s_role(make_host: Callable[..., Host]) -> None:
    spec = resolve_host(PLAN, image_registry=f"{REGISTRY}/ghcr")
    host = make_host(0, images=())

    result = host.run_script(render_bake_script(PLAN, spec, CACHE))

    assert result.returncode == 0, result.stdout + result.stderr
    assert host.aws("ecr", "get-login-password") == [["ecr", "get-login-password", "--region", "eu-west-1"]]
    assert _pulls(host) == [(f"{REGISTRY}/ghcr/huggingface/text-generation-inference", "3.3.5-neuron")]


def test_a_bake_whose_pull_keeps_failing_fails_the_build_saying_why(make_host: Callable[..., Host]) -> None:
    spec = resolve_host(PLAN)
    host = make_host(0, images=())

    result = host.run_script(render_bake_script(PLAN, spec), STUB_DOCKER_PULL_FAILURES="99")

    assert result.returncode != 0
    assert f"ERROR: could not pull {spec.pulled} after {spec.pull_attempts} attempts" in result.stdout
    assert len(_pulls(host)) == spec.pull_attempts


@pytest.mark.parametrize("options", [BootOptions(), CACHE], ids=["plain", "artifact-cache"])
@pytest.mark.parametrize("registry", [None, f"{REGISTRY}/ghcr"], ids=["public", "private"])
def test_shellcheck_passes_on_the_bake(options: BootOptions, registry: str | None, shellcheck: str,
                                       tmp_path: Path) -> None:
    script = tmp_path / "bake.sh"
    script.write_text(render_bake_script(PLAN, resolve_host(PLAN, image_registry=registry), options))
    result = subprocess.run([shellcheck, "-S", "warning", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_with_an_artifact_cache_the_bake_makes_sure_of_aws_cli_v2_as_the_boot_does() -> None:
    # install-tools' check of the CLI's conditional writes, for hosts that publish to the cache.
    assert "IfNoneMatch" in render_bake_script(PLAN, resolve_host(PLAN), CACHE)
    assert "IfNoneMatch" not in render_bake_script(PLAN, resolve_host(PLAN))
