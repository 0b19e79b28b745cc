"""A fleet of several instance types: one boot bundle holds each type's layout of the same export, and
each host runs the one of the type its instance metadata names (render.boot.render_fleet_boot), on
simulated hosts of each type."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from bootsim import BOOT_LOG, CACHE, SIGNAL, Host, make_plan

from neuron_serving.plan.engines.tgi import TGI, TGI_3_3_5
from neuron_serving.plan.host import resolve_host
from neuron_serving.plan.layout import ServingPlan, fleet_layouts
from neuron_serving.render.boot import BOOT_STEPS, LAYOUTS, HostBoot, render_boot_script, render_fleet_boot
from neuron_serving.render.boot_options import BootOptions
from tests.harness.userdata import user_data

MakeHost = Callable[..., Host]

TYPES = ("inf2.48xlarge", "inf2.24xlarge", "inf2.8xlarge")
PER_TYPE = ("/etc/haproxy/haproxy.cfg.new", "/etc/neuron-serving/replicas.table", BOOT_STEPS)
"""What differs between the types' boots without monitoring: the replicas, the router, the steps."""


def layouts() -> tuple[ServingPlan, ...]:
    return fleet_layouts(make_plan(TYPES[0], 2), TYPES)


def fleet_boot(plans: tuple[ServingPlan, ...] | None = None) -> HostBoot:
    plans = plans or layouts()
    return render_fleet_boot(plans, resolve_host(plans[0]), BootOptions(signal=SIGNAL))


def test_the_bundle_holds_shared_files_once_and_each_types_own_below_its_layout() -> None:
    plans = layouts()
    boot = fleet_boot(plans)
    alone = {p.instance.name: render_boot_script(p, resolve_host(plans[0]), BootOptions(signal=SIGNAL)) for p in plans}
    for name, single in alone.items():
        for path, text in single.files.items():
            if path == BOOT_STEPS:
                # The type's own steps, but for installing the files of its layout only.
                steps = boot.files[f"{LAYOUTS}/{name}{path}"]
                layout = f"etc/neuron-serving/layouts/{name}"
                assert f"    {layout}/*) t=${{p#{layout}/}} ;;" in steps
                assert steps.partition("\ncd /\n")[2] == text.partition("\ncd /\n")[2]
            elif path in PER_TYPE:
                assert boot.files[f"{LAYOUTS}/{name}{path}"] == text and path not in boot.files
            else:
                assert boot.files[path] == text and f"{LAYOUTS}/{name}{path}" not in boot.files
    # The shared files, the selector, and each type's own.
    assert len(boot.files) == len(alone[TYPES[0]].files) - len(PER_TYPE) + 1 + len(TYPES) * len(PER_TYPE)
    # One export for every type: the key is the same in the shared export-model.
    assert boot.deploy_env == alone[TYPES[0]].deploy_env
    selector = boot.files[BOOT_STEPS]
    assert selector.startswith(f"# The boot's steps of a fleet whose hosts may be any of: {' '.join(TYPES)}")


def test_one_type_is_the_single_types_boot() -> None:
    plan = make_plan("inf2.24xlarge", 2)
    assert render_fleet_boot((plan,), resolve_host(plan)).files == render_boot_script(plan, resolve_host(plan)).files


def test_shellcheck_passes_on_the_selector_with_each_types_steps(shellcheck: str, tmp_path: Path) -> None:
    boot = fleet_boot()
    script = user_data(boot)
    sourcing = f'\n. ".{BOOT_STEPS}"\n'
    paths = []
    for name in TYPES:
        # As the bootstrap runs them: the selector, then the type's steps it sources, in one shell.
        steps = boot.files[BOOT_STEPS] + "\n" + boot.files[f"{LAYOUTS}/{name}{BOOT_STEPS}"]
        paths.append(tmp_path / f"{name}.sh")
        paths[-1].write_text(script.replace(sourcing, "\n" + steps))
    result = subprocess.run([shellcheck, "-S", "warning", "-s", "bash", *map(str, paths)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("instance_type", ["inf2.48xlarge", "inf2.8xlarge"])
def test_each_host_lays_out_the_replicas_of_the_type_it_is(make_host: MakeHost, instance_type: str) -> None:
    plans = layouts()
    plan = next(p for p in plans if p.instance.name == instance_type)
    host = make_host(plan.instance.devices)
    result = host.boot(fleet_boot(plans), STUB_INSTANCE_TYPE=instance_type)
    assert result.returncode == 0, result.stdout + result.stderr
    count = len(plan.replicas)
    assert host.path("/etc/neuron-serving/replicas.table").read_text().count("\n") == count
    config = host.path("/etc/haproxy/haproxy.cfg").read_text()
    assert len(re.findall(r"^\s+server replica-\d+ ", config, re.M)) == count
    assert [u for u in host.started_units() if u.startswith("neuron-replica@")] == [
        f"neuron-replica@{i}" for i in range(count)]
    for replica in plan.replicas:
        conf = host.path(f"/etc/neuron-serving/replica-{replica.index}.conf").read_text()
        assert f'DEVICES="{" ".join(map(str, replica.devices))}"' in conf and f"PORT={replica.port}" in conf
    # Only this type's files are installed, at their places (its steps too, instead of the selector).
    assert not host.path(LAYOUTS).exists()
    assert f"expected {plan.instance.devices} Neuron devices for {instance_type}" in host.path(
        BOOT_STEPS).read_text()
    [signal] = host.aws("cloudformation", "signal-resource")
    assert signal[signal.index("--status") + 1] == "SUCCESS"


def test_a_host_of_a_type_the_fleet_has_no_layout_for_fails_naming_both(make_host: MakeHost) -> None:
    host = make_host(6)
    result = host.boot(fleet_boot(), STUB_INSTANCE_TYPE="inf2.xlarge")
    assert result.returncode != 0
    reason = ("this host is an instance of type inf2.xlarge, for which the fleet has no layout "
              f"(it has: {' '.join(TYPES)})")
    assert f"failed in step layout: {reason}" in host.path(BOOT_LOG).read_text()
    assert host.path("/var/log/neuron-serving/status").read_text() == "failed layout\n"
    [signal] = host.aws("cloudformation", "signal-resource")
    assert "FAILURE" in signal and not host.containers()


def test_a_host_that_cannot_read_its_type_fails_before_any_step(make_host: MakeHost) -> None:
    host = make_host(6)
    result = host.boot(fleet_boot())
    assert result.returncode != 0
    assert "failed in step layout: cannot read this host's instance type from the instance metadata" in \
        host.path(BOOT_LOG).read_text()
    assert not host.calls("docker")


def test_hosts_of_different_types_share_one_export_through_the_cache(make_host: MakeHost) -> None:
    # The first host of the fleet (an inf2.48xlarge) exports and publishes; one of another type (an
    # inf2.8xlarge) finds the same export key in the cache and downloads it: one compile for the fleet.
    plans = layouts()
    boot = render_fleet_boot(plans, resolve_host(plans[0]), BootOptions(signal=SIGNAL, artifact_cache=CACHE))
    large, small = make_host(12), make_host(1)
    for host, instance_type in ((large, "inf2.48xlarge"), (small, "inf2.8xlarge")):
        result = host.boot(boot, STUB_INSTANCE_TYPE=instance_type)
        assert result.returncode == 0, result.stdout + result.stderr
    assert [len(h.exports()) for h in (large, small)] == [1, 0]
    key = TGI.export_key(plans[0], TGI_3_3_5)
    assert {TGI.export_key(p, TGI_3_3_5) for p in plans} == {key}
    [download] = [a for a in small.aws("s3", "sync") if a[-2].startswith("s3://")]
    assert download[-2] == f"{CACHE}/{key}/{large.instance_id}/"
    assert small.path("/etc/neuron-serving/replicas.table").read_text().count("\n") == 1
