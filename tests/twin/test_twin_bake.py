"""The serving AMI's component (serving_ami=build) on the host twin: its build, validate and test phases,
as EC2 Image Builder runs them (ExecuteBash: each phase's commands as a bash script, as root), on
Ubuntu 22.04 with systemd as PID 1 and the DLAMI's real packages (tests/twin/host.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tests.cdk.conftest import synthesized
from tests.twin.conftest import World, failure_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "boot"))
from test_boot_synthesized import user_data


def test_the_serving_ami_s_bake_and_checks_pass_on_the_dlami_s_ubuntu(world: World) -> None:
    synth = synthesized(serving_ami="build")
    document = yaml.safe_load(synth.only("AWS::ImageBuilder::Component")["Data"])
    commands = {phase["name"]: phase["steps"][0]["inputs"]["commands"] for phase in document["phases"]}
    _, _, plan = user_data({"serving_ami": "build"})
    # A build instance: no Neuron device, nothing in its user data.
    twin, _, _ = world.twin("#cloud-config\n{}\n", plan, devices=0)
    twin.start()
    assert twin.wait_system(timeout=120) in ("running", "degraded"), failure_report(twin)

    for phase in ("build", "validate", "test"):
        (script,) = commands[phase]
        ran = twin.run("bash", "-c", script, timeout=300)
        assert ran.returncode == 0, f"{phase}:\n{ran.stdout}{ran.stderr}"

    # The bake pulled the hosts' image and enabled docker with the DLAMI's own systemd.
    image = synth.stack.boot_script.spec.pulled
    pulls = [r for r in world.engines[0].records
             if r["kind"] == "request" and str(r["path"]).endswith("/images/create")]
    assert [f"{p['query']['fromImage']}:{p['query']['tag']}" for p in pulls] == [image]
    assert twin.run("systemctl", "is-enabled", "docker").stdout.strip() == "enabled"
    # What the hosts' install-tools would install is there: nothing for apt to do.
    assert "apt-get" not in twin.run("bash", "-c", commands["build"][0], timeout=300).stdout
