"""Monitoring on a simulated host: the CloudWatch agent (installed only once AWS's signature of it
verifies, with the real gpg and gpgv), the metrics publisher and the replicas' logs, and a
monitoring failure that must not fail the boot."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from bootsim import (
    AGENT_CTL,
    AGENT_DEB,
    BOOT_LOG,
    HOOK,
    LOG_GROUPS,
    MONITORING,
    MONITORING_TOKENS,
    PUBLISHER_SOURCE,
    SIGNAL,
    SMALL_MODEL,
    Host,
    SigningKeys,
    install_agent,
    make_plan,
)
from test_boot_render import embedded_files

from neuron_serving.plan import ServingPlan
from neuron_serving.plan.engines.tgi import TGI
from neuron_serving.plan.metrics import AGENT_KEY_FINGERPRINT
from neuron_serving.render.boot import RUN_REPLICA, START_MONITORING, HostBoot
from neuron_serving.render.boot_options import BootOptions
from neuron_serving.render.monitoring import (
    AGENT_CONFIG,
    NEURON_MONITOR_CONFIG,
    PUBLISHER,
    PUBLISHER_CONFIG,
    render_neuron_monitor_config,
    render_publisher_config,
)
from tests.harness.userdata import boot_of, host_stack_env

MakeHost = Callable[..., Host]

MONITORED: dict[str, Any] = {"monitoring": MONITORING}
MONITORED_AT_SYNTH: dict[str, Any] = {"monitoring": MONITORING_TOKENS}
"""Monitoring options with deploy-time values resolved, and as the stack passes them at synth."""

METRICS_UNIT = "neuron-serving-metrics"
AGENT_PACKAGE = ("https://s3.us-east-2.amazonaws.com/amazoncloudwatch-agent-us-east-2/ubuntu/amd64/latest/"
                 "amazon-cloudwatch-agent.deb")
AGENT_KEY_URL = "https://s3.amazonaws.com/amazoncloudwatch-agent/assets/amazon-cloudwatch-agent.gpg"
"""Where the host gets the package's signature and AWS's key (the CloudWatch user guide,
"Verifying the signature of the CloudWatch agent package")."""
REFUSED = "CloudWatch agent not installed: "


def small_plan() -> ServingPlan:
    return make_plan("inf2.xlarge", model_id=SMALL_MODEL)


def pinning(keys: SigningKeys, **options: Any) -> BootOptions:
    """Monitoring as the stack configures it, but trusting the test's stand-in for AWS's key."""
    monitoring = replace(MONITORING, agent_key_fingerprint=keys.pinned)
    return BootOptions(monitoring=monitoring, **options)


def serve_agent(host: Host, keys: SigningKeys, **files: Any) -> dict[str, str]:
    """The knob that makes the curl stub serve this host the agent's files (SigningKeys.agent_files)."""
    return keys.agent_files(host.root.parent / "agent-files", **files)


def monitored_boot(make_host: MakeHost, keys: SigningKeys, plan: ServingPlan | None = None,
                   **knobs: str) -> tuple[Host, ServingPlan]:
    """A host after a successful boot with monitoring, the agent's package signed by the pinned key."""
    plan = plan or small_plan()
    host = make_host(plan.instance.devices)
    result = host.boot(boot_of(plan, pinning(keys)), **serve_agent(host, keys), **knobs)
    assert result.returncode == 0, result.stdout
    return host, plan


def fetch_configs(host: Host) -> list[list[str]]:
    return [argv for cmd, argv in host.entries() if cmd == "amazon-cloudwatch-agent-ctl"]


def agent_installs(host: Host) -> list[list[str]]:
    return [a for a in host.calls("apt-get") if "install" in a and any(w.endswith(AGENT_DEB) for w in a)]


def assert_refused(host: Host, result: subprocess.CompletedProcess[str], reason: str) -> None:
    """The agent was not installed, for ``reason``, and the host serves without monitoring."""
    assert result.returncode == 0, result.stdout
    log = host.path(BOOT_LOG).read_text()
    assert REFUSED + reason in log
    assert "WARNING: monitoring not started (exit 1)" in log
    assert agent_installs(host) == []
    assert not host.path(AGENT_CTL).exists()
    assert fetch_configs(host) == []
    assert METRICS_UNIT not in host.started_units()
    assert host.started_units()[-1] == "neuron-replica@0"


def test_the_publisher_and_its_configs_are_written_as_rendered(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    host, plan = monitored_boot(make_host, agent_keys)
    publisher = host.path(PUBLISHER)
    assert publisher.read_text() == PUBLISHER_SOURCE.read_text()
    assert stat.S_IMODE(publisher.stat().st_mode) == 0o755
    # It comes in the boot bundle: no download of its own.
    assert host.aws("s3", "cp") == []
    assert host.path(PUBLISHER_CONFIG).read_text() == render_publisher_config(plan, TGI, MONITORING)
    assert host.path(NEURON_MONITOR_CONFIG).read_text() == render_neuron_monitor_config(plan)


def test_the_agent_config_names_the_stack_log_groups_and_is_valid_json(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    host, _ = monitored_boot(make_host, agent_keys)
    text = host.path(AGENT_CONFIG).read_text()
    assert "@" not in text
    collect = json.loads(text)["logs"]["logs_collected"]["files"]["collect_list"]
    assert {(c["file_path"], c["log_group_name"], c["log_stream_name"]) for c in collect} == {
        ("/var/log/neuron-serving/boot.log", LOG_GROUPS["boot"], "{instance_id}/boot"),
        ("/var/log/neuron-serving/export.log", LOG_GROUPS["boot"], "{instance_id}/export"),
        ("/var/log/neuron-serving/ready.log", LOG_GROUPS["boot"], "{instance_id}/ready"),
        ("/var/log/haproxy.log", LOG_GROUPS["router"], "{instance_id}"),
        ("/var/log/neuron-serving/metrics.emf", LOG_GROUPS["metrics"], "{instance_id}"),
    }


def test_a_missing_agent_is_downloaded_from_the_instance_region_verified_installed_and_given_our_config(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    host, _ = monitored_boot(make_host, agent_keys)
    downloads = {a[-1]: a[a.index("-o") + 1] for a in host.calls("curl") if "amazoncloudwatch-agent" in a[-1]}
    assert list(downloads) == [AGENT_PACKAGE, f"{AGENT_PACKAGE}.sig", AGENT_KEY_URL]
    assert all("--retry" in a for a in host.calls("curl") if a[-1] in downloads)
    deb = downloads[AGENT_PACKAGE]
    assert [a for a in host.calls("apt-get") if "install" in a] == [
        ["-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", deb]]
    assert not any(Path(path).exists() for path in downloads.values())  # removed once installed
    assert REFUSED not in host.path(BOOT_LOG).read_text()
    assert fetch_configs(host) == [
        ["-a", "fetch-config", "-m", "ec2", "-s", "-c", f"file:{host.path(AGENT_CONFIG)}"]]


def test_the_verification_keeps_its_keyring_in_a_directory_it_removes_and_never_in_roots(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    plan = small_plan()
    host = make_host(1)
    tmp = host.root.parent / "tmp"
    tmp.mkdir()
    result = host.boot(boot_of(plan, pinning(agent_keys)), TMPDIR=str(tmp), **serve_agent(host, agent_keys))
    assert result.returncode == 0, result.stdout
    assert agent_installs(host) and list(tmp.iterdir()) == []
    assert not (Path(host.env["HOME"]) / ".gnupg").exists()


def test_a_tampered_package_is_refused_and_not_installed(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    host = make_host(1)
    files = serve_agent(host, agent_keys, package=b"!<arch>\ndebian-binary   something else\n")
    result = host.boot(boot_of(small_plan(), pinning(agent_keys)), **files)
    assert_refused(host, result, f"{AGENT_PACKAGE}.sig is no good signature by {agent_keys.pinned}")
    assert "BAD signature" in host.path(BOOT_LOG).read_text()  # gpgv's own words


def test_a_signature_by_another_key_is_refused_though_gpgv_calls_it_good(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    """The key file holds the pinned key and another, which signed the package: gpgv finds the
    signature good and exits 0, but it is not the pinned key's."""
    host = make_host(1)
    files = serve_agent(host, agent_keys, signer="other", key_file=("pinned", "other"))
    result = host.boot(boot_of(small_plan(), pinning(agent_keys)), **files)
    assert_refused(host, result, f"{AGENT_PACKAGE}.sig is no good signature by {agent_keys.pinned}")
    assert 'Good signature from "Someone Else"' in host.path(BOOT_LOG).read_text()


def test_a_key_file_without_the_pinned_fingerprint_is_refused(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    host = make_host(1)
    files = serve_agent(host, agent_keys, signer="other", key_file=("other",))
    result = host.boot(boot_of(small_plan(), pinning(agent_keys)), **files)
    assert_refused(host, result, f"{AGENT_KEY_URL} holds no key {agent_keys.pinned}")


def test_a_package_without_a_signature_is_refused(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    host = make_host(1)
    result = host.boot(boot_of(small_plan(), pinning(agent_keys)),
                       **serve_agent(host, agent_keys, signer=None))
    assert result.returncode == 0, result.stdout
    log = host.path(BOOT_LOG).read_text()
    assert "curl: (22) The requested URL returned error: 404" in log
    assert "WARNING: monitoring not started (exit 22)" in log
    assert agent_installs(host) == [] and not host.path(AGENT_CTL).exists()
    assert host.started_units()[-1] == "neuron-replica@0"


def test_a_host_without_gpg_installs_it_before_verifying(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    """As on minimal Ubuntu images: the PATH holds every tool of the test machine's but gpg, which
    the apt-get stub then puts on it."""
    gpg = shutil.which("gpg")
    assert gpg is not None
    host = make_host(1)
    tools = host.root.parent / "usr-bin"
    tools.mkdir()
    for directory in host.env["PATH"].split(os.pathsep)[1:]:
        for tool in Path(directory).iterdir() if Path(directory).is_dir() else ():
            if tool.name != "gpg" and not (tools / tool.name).exists():
                (tools / tool.name).symlink_to(tool)
    host.env["PATH"] = os.pathsep.join([host.env["PATH"].split(os.pathsep)[0], str(tools)])
    assert shutil.which("gpg", path=host.env["PATH"]) is None
    result = host.boot(boot_of(small_plan(), pinning(agent_keys)), STUB_GPG=gpg, STUB_APT_BIN=str(tools),
                       **serve_agent(host, agent_keys))
    assert result.returncode == 0, result.stdout
    apt = [a[2:] for a in host.calls("apt-get")]
    assert apt[:2] == [["update", "-q"], ["install", "-y", "-q", "gpg"]]
    assert agent_installs(host) and fetch_configs(host)


def test_by_default_the_host_trusts_only_the_key_aws_documents() -> None:
    """The fingerprint the CloudWatch user guide gives ("Verifying the signature of the CloudWatch
    agent package"): 9376 16F3 450B 7D80 6CBD 9725 D581 6730 3B78 9C72."""
    documented = "9376 16F3 450B 7D80 6CBD 9725 D581 6730 3B78 9C72"
    assert documented.replace(" ", "") == AGENT_KEY_FINGERPRINT
    assert MONITORING.agent_key_fingerprint == AGENT_KEY_FINGERPRINT
    script = embedded_files(boot_of(small_plan(), BootOptions(**MONITORED)))[START_MONITORING]
    assert f"key={AGENT_KEY_FINGERPRINT}\n" in script


def test_an_agent_the_image_ships_is_not_installed_again(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    install_agent(host)
    assert host.boot(boot_of(plan, BootOptions(**MONITORED))).returncode == 0
    assert [a for a in host.calls("curl") if a[-1] == AGENT_PACKAGE] == []
    assert host.calls("apt-get") == []
    assert len(fetch_configs(host)) == 1


def test_the_agent_ships_the_boot_log_before_the_image_pull_and_the_publisher_then_starts(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    host, _ = monitored_boot(make_host, agent_keys)
    entries = host.entries()
    [fetch_config] = [n for n, (cmd, _) in enumerate(entries) if cmd == "amazon-cloudwatch-agent-ctl"]
    [pull] = [n for n, (cmd, argv) in enumerate(entries) if cmd == "docker" and argv[0] == "pull"]
    [start] = [n for n, (_, argv) in enumerate(entries) if argv == ["enable", "--now", METRICS_UNIT]]
    reload = next(n for n, (_, argv) in enumerate(entries) if argv == ["daemon-reload"])
    assert fetch_config < reload < start < pull
    unit = host.path(f"/etc/systemd/system/{METRICS_UNIT}.service").read_text().splitlines()
    assert f"ExecStart=/usr/bin/env python3 {PUBLISHER} {PUBLISHER_CONFIG}" in unit
    assert {"EnvironmentFile=/etc/neuron-serving/stack.env", "EnvironmentFile=/etc/neuron-serving/host.env",
            "Restart=always", "RestartSec=10", "WantedBy=multi-user.target"} <= set(unit)
    assert "After=network-online.target docker.service" in unit


def test_each_replica_logs_to_its_own_stream_of_the_replicas_group(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    host, plan = monitored_boot(make_host, agent_keys, make_plan("inf2.24xlarge", 4))
    for replica in plan.replicas:
        assert host.run(RUN_REPLICA, str(replica.index)).returncode == 0
        argv = host.calls("docker")[-1]
        options = [argv[n + 1] for n, arg in enumerate(argv) if arg == "--log-opt"]
        assert argv[argv.index("--log-driver") + 1] == "awslogs"
        assert options == ["awslogs-region=us-east-2", f"awslogs-group={LOG_GROUPS['replicas']}",
                           f"awslogs-stream={host.instance_id}/replica-{replica.index}",
                           "mode=non-blocking", "max-buffer-size=4m"]
        assert argv.index("--log-driver") < argv.index(argv[-1])  # an option of docker run, not of TGI
        # What the real docker CLI sent the engine.
        [created] = [c for c in host.containers() if c["name"] == f"replica-{replica.index}"]
        assert created["HostConfig"]["LogConfig"] == {"Type": "awslogs", "Config": {
            "awslogs-region": "us-east-2", "awslogs-group": LOG_GROUPS["replicas"],
            "awslogs-stream": f"{host.instance_id}/replica-{replica.index}",
            "mode": "non-blocking", "max-buffer-size": "4m"}}


def test_a_failed_agent_download_leaves_a_warning_and_the_host_serves(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    result = host.boot(boot_of(plan, BootOptions(**MONITORED, signal=SIGNAL)),
                       STUB_AGENT_DOWNLOAD_FAIL="1")
    assert result.returncode == 0, result.stdout
    log = host.path(BOOT_LOG).read_text()
    assert "WARNING: monitoring not started (exit 28)" in log
    assert fetch_configs(host) == []
    assert host.started_units()[-1] == "neuron-replica@0"
    assert host.path("/var/log/neuron-serving/status").read_text() == "done\n"
    assert [a[a.index("--status") + 1] for a in host.aws("cloudformation", "signal-resource")] == ["SUCCESS"]


def test_an_agent_refusing_its_config_leaves_a_warning_and_the_host_serves(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    host, _ = monitored_boot(make_host, agent_keys, STUB_AGENT_CONFIG_FAIL="1")
    assert "WARNING: monitoring not started (exit 1)" in host.path(BOOT_LOG).read_text()
    assert METRICS_UNIT not in host.started_units()
    assert host.started_units()[-1] == "neuron-replica@0"


def test_in_the_warm_pool_the_publisher_is_only_enabled_and_the_agent_ships_the_preparation(
    make_host: MakeHost, agent_keys: SigningKeys,
) -> None:
    plan = small_plan()
    host = make_host(1)
    options = pinning(agent_keys, signal=SIGNAL, warm_pool_hook=HOOK)
    result = host.boot(boot_of(plan, options), STUB_LIFECYCLE_STATE="Warmed:Stopped",
                       **serve_agent(host, agent_keys))
    assert result.returncode == 0, result.stdout
    assert ["enable", METRICS_UNIT] in host.calls("systemctl")
    assert METRICS_UNIT not in host.started_units()
    # fetch-config -s enables the agent, which systemd starts again on the next boot.
    assert [a[:5] for a in fetch_configs(host)] == [["-a", "fetch-config", "-m", "ec2", "-s"]]


def test_without_monitoring_no_agent_publisher_or_awslogs(make_host: MakeHost) -> None:
    plan = small_plan()
    host = make_host(1)
    assert host.boot(boot_of(plan, BootOptions(signal=SIGNAL))).returncode == 0
    assert host.run(RUN_REPLICA, "0").returncode == 0
    assert "--log-driver" not in host.calls("docker")[-1]
    assert [a for a in host.calls("curl") if "amazoncloudwatch-agent" in a[-1]] == []
    assert fetch_configs(host) == []
    assert METRICS_UNIT not in host.started_units()
    assert not host.path(PUBLISHER).exists()
    assert not host.path("/etc/neuron-serving/metrics.json").exists()


def deployed_stack_env(boot: HostBoot, names: dict[str, str]) -> str:
    """stack.env as the host writes it once CloudFormation has put ``names`` for the tokens."""
    stack_env = host_stack_env(boot)
    for token, name in names.items():
        stack_env = stack_env.replace(token, name)
    return stack_env


DEPLOYED = {MONITORING_TOKENS.service: "NeuronLlamaStack",
            **{MONITORING_TOKENS.log_groups[kind]: name for kind, name in LOG_GROUPS.items()}}
WANTED = {"SERVICE": "NeuronLlamaStack", **{f"LOG_GROUP_{kind.upper()}": name for kind, name in LOG_GROUPS.items()}}


def test_stack_env_reads_the_same_in_bash_as_in_systemd(tmp_path: Path) -> None:
    """The publisher's unit takes stack.env as an EnvironmentFile. systemd's environment.d
    generator parses with the same code as EnvironmentFile= (quotes, escapes), so what it prints
    is what the unit's process gets."""
    generator = Path("/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator")
    if not generator.is_file():
        pytest.skip("needs systemd's environment.d generator")
    script = boot_of(small_plan(), BootOptions(**MONITORED_AT_SYNTH))
    stack_env = deployed_stack_env(script, DEPLOYED)
    assert "='NeuronLlamaStack-BootLogs#1'" in stack_env  # quoted, as the shell needs it
    (tmp_path / "environment.d").mkdir()
    (tmp_path / "environment.d" / "stack.conf").write_text(stack_env)
    printed = subprocess.run([str(generator)], env={"XDG_CONFIG_HOME": str(tmp_path)}, capture_output=True,
                             text=True, check=True).stdout
    systemd = {k: v for line in printed.splitlines() for k, _, v in [line.partition("=")]}
    shell = subprocess.run(["bash", "-c", f"set -a; . {shlex.quote(str(tmp_path / 'environment.d/stack.conf'))}; "
                            f"printf '%s\\n' {' '.join(f'{k}=${k}' for k in WANTED)}"],
                           capture_output=True, text=True, check=True).stdout
    assert dict(line.partition("=")[::2] for line in shell.splitlines()) == WANTED
    assert {k: systemd[k] for k in WANTED} == WANTED


def test_the_downloaded_publisher_runs_on_the_hosts_python(make_host: MakeHost, agent_keys: SigningKeys) -> None:
    """With its usage line: the script parses and starts on the host's Python 3."""
    python = shutil.which("python3")
    assert python is not None
    host, _ = monitored_boot(make_host, agent_keys)
    result = subprocess.run([python, str(host.path(PUBLISHER))], capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "CONFIG_JSON" in result.stderr
