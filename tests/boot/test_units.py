"""The systemd units the boot script writes, checked by the real ``systemd-analyze verify``.

Every file the script writes (``embedded_files``) goes under a temporary directory at its path on
the host; that directory is the root verify works in (``--root``), so the ``/opt/neuron-serving/bin``
scripts a unit runs are the rendered ones, with the modes the boot gives them. No systemd needs to
run (verify starts its own manager in test mode, no PID 1, no container, no privileges).

What it relies on, per systemd-analyze(1) of systemd 252 (Debian 12's package ``systemd``
252.39-1~deb12u2, the version these tests were written against; Ubuntu 24.04 hosts run 255):

- ``verify FILE...`` loads the units named and every unit they reference, and reports "unknown
  sections and directives", "missing dependencies which are required to start the given unit" and
  "commands listed in ExecStart= and similar which are not found in the system or not executable";
- ``--root=PATH``: "With cat-files and verify, operate on files underneath the specified root
  path", both for the unit search path (``PATH/etc/systemd/system``, ``PATH/usr/lib/systemd/system``,
  ...) and for the executables checked;
- ``--recursive-errors=yes``: "return a non-zero process exit status when warnings arise during
  verification of either the specified unit or any of its associated dependencies". Without it an
  unknown directive still exits 0 (observed with 252.39), hence the flag, and the tests also
  require verify to print nothing at all;
- ``--man=no``: no man(1) lookup for ``Documentation=``; ``--generators=no``: no unit generators,
  which would otherwise read the test machine's configuration;
- ``SYSTEMD_LOG_LEVEL`` / ``SYSTEMD_LOG_TARGET`` (ENVIRONMENT in the same page): set to ``info`` and
  ``console`` so that the output reaches stderr whatever the caller's environment (under a systemd
  service, the automatic target would be the journal). ``SYSTEMD_UNIT_PATH`` is not passed on.

A template unit cannot be verified as such (252 instantiates it as ``@i``): each ``neuron-replica@``
instance the boot enables, one per row of ``replicas.table``, is verified by its name.

What the host provides beside the rendered files is placeholders (``HOST_UNITS``, ``HOST_BINARIES``):
``docker.service`` (Ubuntu's docker.io, which the boot installs), ``haproxy.service``, the standard
targets a service's default dependencies and ``WantedBy=`` name, and ``/usr/bin/env``. Verify does
not check what ``/usr/bin/env`` runs (``docker``, ``python3``): those are found on ``PATH`` at run
time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bootsim import require
from test_boot_render import CONFIGS, OPTION_CONFIGS, embedded_files, rendered

UNIT_DIR = "/etc/systemd/system"
REPLICA = "neuron-replica@.service"
READY = "neuron-serving-ready.service"
METRICS = "neuron-serving-metrics.service"
API_KEYS = "neuron-serving-api-keys.service"
API_KEYS_TIMER = "neuron-serving-api-keys.timer"
INTERRUPTION = "neuron-serving-interruption.service"

HOST_UNITS = {
    "docker.service": "[Service]\nExecStart=/usr/bin/env true\n",
    "haproxy.service": "[Service]\nExecStart=/usr/bin/env true\n",
    **{target: "[Unit]\nDescription=placeholder\n" for target in [
        "sysinit.target", "basic.target", "shutdown.target", "network-online.target", "multi-user.target",
        "timers.target", "time-set.target", "time-sync.target"]},
}
"""The units of the host the rendered units name (Requires=, After=, WantedBy=, default dependencies)."""

HOST_BINARIES = ["/usr/bin/env"]


@pytest.fixture(scope="module")
def systemd_analyze() -> Iterator[str]:
    path = require(shutil.which("systemd-analyze"), "install Debian's systemd for systemd-analyze")
    yield path


def host_root(config: str, root: Path) -> list[str]:
    """Write ``config``'s boot files and the host's placeholders under ``root``; return the names
    of the units the boot enables (each template's instances by name)."""
    files = embedded_files(rendered(config)[1])
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        # As bundle() does: executable exactly when it has a shebang.
        target.chmod(0o755 if text.startswith("#!") else 0o644)
    for name, text in HOST_UNITS.items():
        unit = root / "usr/lib/systemd/system" / name
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(text)
    for binary in HOST_BINARIES:
        executable = root / binary.lstrip("/")
        executable.parent.mkdir(parents=True, exist_ok=True)
        executable.write_text("#!/bin/sh\n")
        executable.chmod(0o755)
    replicas = [row.split()[0] for row in files["/etc/neuron-serving/replicas.table"].splitlines() if row.strip()]
    units = []
    for path in files:
        directory, _, name = path.rpartition("/")
        if path.startswith(UNIT_DIR + "/"):
            assert directory == UNIT_DIR, f"{path}: teach test_units.py to verify drop-ins"
            units += [name.replace("@.", f"@{n}.") for n in replicas] if "@." in name else [name]
    return units


def verify(systemd_analyze: str, root: Path, units: list[str]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "SYSTEMD_LOG_LEVEL": "info", "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_COLOR": "0"}
    return subprocess.run(
        [systemd_analyze, "verify", f"--root={root}", "--man=no", "--generators=no", "--recursive-errors=yes",
         *units],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )


def expected_units(config: str) -> set[str]:
    options = OPTION_CONFIGS[config][1] if config in OPTION_CONFIGS else {}
    return {REPLICA} | ({READY} if "warm_pool_hook" in options else set()) | (
        {METRICS} if "monitoring" in options else set()) | (
        {API_KEYS, API_KEYS_TIMER} if "api_keys_secret" in options else set()) | (
        {INTERRUPTION} if options.get("interruptions") else set())


def test_the_configurations_cover_every_unit_the_boot_writes() -> None:
    assert set().union(*map(expected_units, [*CONFIGS, *OPTION_CONFIGS])) == {
        REPLICA, READY, METRICS, API_KEYS, API_KEYS_TIMER, INTERRUPTION}


@pytest.mark.parametrize("config", [*CONFIGS, *OPTION_CONFIGS])
def test_systemd_analyze_verify_passes_on_every_unit_the_boot_writes(
    config: str, systemd_analyze: str, tmp_path: Path
) -> None:
    units = host_root(config, tmp_path)
    written = {path.rpartition("/")[2] for path in embedded_files(rendered(config)[1]) if path.startswith(UNIT_DIR)}
    assert written == expected_units(config)
    assert "neuron-replica@0.service" in units and REPLICA not in units
    result = verify(systemd_analyze, tmp_path, units)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def _edit(path: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        file = root / path.lstrip("/")
        assert old in file.read_text()
        file.write_text(file.read_text().replace(old, new))

    return edit


def _remove(path: str) -> Callable[[Path], None]:
    return lambda root: (root / path.lstrip("/")).unlink()


def _not_executable(path: str) -> Callable[[Path], None]:
    return lambda root: (root / path.lstrip("/")).chmod(0o644)


@pytest.mark.parametrize(
    ("config", "breakage", "reported"),
    [
        ("inf2.xlarge-1-replica", _edit(f"{UNIT_DIR}/{REPLICA}", "\nRestartSec=", "\nRestartSecs="), "RestartSecs"),
        ("inf2.xlarge-1-replica", _edit(f"{UNIT_DIR}/{REPLICA}", "\n[Service]\n", "\n[Servce]\n"), "Servce"),
        ("inf2.xlarge-1-replica", _remove("/opt/neuron-serving/bin/run-replica"), "run-replica"),
        ("inf2.xlarge-1-replica", _remove("/usr/lib/systemd/system/docker.service"), "docker.service"),
        ("trn1.32xlarge-tp2-secret-arn-fleet", _not_executable("/opt/neuron-serving/bin/wait-ready"), "wait-ready"),
        ("trn1.32xlarge-tp2-secret-arn-fleet", _edit(f"{UNIT_DIR}/{READY}", "Type=oneshot", "Type=oneshoot"),
         "oneshoot"),
        ("inf2.xlarge-monitoring", _edit(f"{UNIT_DIR}/{METRICS}", "Restart=always", "Restart=allways"), "allways"),
        ("inf2.xlarge-monitoring", _remove("/usr/bin/env"), "/usr/bin/env"),
    ],
)
def test_systemd_analyze_verify_reports_a_broken_unit(
    config: str, breakage: Callable[[Path], None], reported: str, systemd_analyze: str, tmp_path: Path
) -> None:
    units = host_root(config, tmp_path)
    breakage(tmp_path)
    result = verify(systemd_analyze, tmp_path, units)
    assert result.returncode != 0
    assert reported in result.stdout + result.stderr


EXEC = re.compile(r"^Exec(?:Start|StartPre|StartPost|Stop|StopPost|Reload|Condition)=[-@:+!]*(.*)$", re.MULTILINE)
CALLS_AWS = re.compile(r"""(?:^|[\s;&|(!{\[])["']?aws["']?[\s,]""")
"""A command word ``aws`` in a shell line, or the string ``"aws"`` opening a Python argv."""


def _code(text: str) -> str:
    """``text`` without its comment lines, which mention ``aws`` in prose."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def units_calling_aws(config: str) -> dict[str, list[str]]:
    """Each unit the boot writes whose commands run the AWS CLI, directly or through any script of the
    bundle they run (and those run in turn), with the files that call it: derived from the rendered
    files, so that a new unit or script that calls ``aws`` is covered without naming it here."""
    files = embedded_files(rendered(config)[1])
    found = {}
    for path, text in files.items():
        if not path.startswith(UNIT_DIR + "/"):
            continue
        seen: set[str] = set()
        todo = [word for command in EXEC.findall(text) for word in shlex.split(command)]
        callers = [path] if "aws" in todo else []
        todo = [word for word in todo if word in files]
        while todo:
            script = todo.pop()
            if script in seen:
                continue
            seen.add(script)
            code = _code(files[script])
            if CALLS_AWS.search(code):
                callers.append(script)
            todo += [other for other in files if other != script and other in code]
        if callers:
            found[path.rpartition("/")[2]] = sorted(callers)
    return found


def test_the_units_that_run_the_aws_cli_are_found_through_the_scripts_they_run() -> None:
    found = units_calling_aws("trn1.32xlarge-tp2-secret-arn-fleet")
    # The ready unit reaches the CLI only through wait-ready's report-phase, and complete-lifecycle.
    assert found[READY] == ["/opt/neuron-serving/bin/complete-lifecycle", "/opt/neuron-serving/bin/report-phase"]
    assert "/opt/neuron-serving/bin/export-model" in found[REPLICA]
    assert METRICS not in found


@pytest.mark.parametrize("config", [*CONFIGS, *OPTION_CONFIGS])
def test_every_unit_that_runs_the_aws_cli_has_the_snap_and_the_installers_bin_on_its_path(config: str) -> None:
    # The AWS CLI is a snap (/snap/bin: the bootstrap's `snap install aws-cli --classic`) or AWS's
    # installer's (/usr/local/bin); systemd's own PATH for services lacks /snap/bin (systemd.exec(5),
    # systemd 252 and 255, "Environment Variables in Spawned Processes", $PATH).
    files = embedded_files(rendered(config)[1])
    for unit in units_calling_aws(config):
        paths = re.findall(r"^Environment=PATH=(\S+)$", files[f"{UNIT_DIR}/{unit}"], re.MULTILINE)
        assert len(paths) == 1, f"{unit}: no PATH of its own"
        assert {"/snap/bin", "/usr/local/bin", "/usr/bin", "/bin"} <= set(paths[0].split(":")), unit
