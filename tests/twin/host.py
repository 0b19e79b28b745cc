"""A twin of the serving host: Ubuntu 22.04's own userland (tests/twin/rootfs.py) booted with systemd
as PID 1 under ``systemd-nspawn``, in a network namespace of the test's own, with real cloud-init
running the user data as EC2 hands it over.

What is real: the distribution's systemd, cloud-init, HAProxy (with its package's postinst, which
starts it with the default configuration), python3, curl, coreutils, gpg, the docker CLI and the AWS
CLI; the user data itself, synthesized by the stack. What is imitated, and only that:

- the hypervisor: cloud-init's NoCloud datasource takes the place of EC2's (a seed directory holding
  the user data and an instance id; ``datasource_list: [NoCloud, None]``, ``network: {config:
  disabled}``: the twin has no udev to configure interfaces with), and the metadata service is
  :class:`tests.twin.imds.Imds` on 169.254.169.254 in the twin's namespace;
- the Neuron devices: empty files bound at ``/dev/neuronN``; the DLAMI's driver and tools packages are
  stand-ins of their names and versions in the rootfs (tests/twin/rootfs.py, ``DLAMI_PACKAGES``);
- the Docker engine: the docker CLI talks to the test's recording engine (tests/harness/dockerd.py),
  whose socket is bound into the twin; ``docker.service`` is replaced by a unit that links the socket
  where the CLI looks for it (``/run/docker.sock``), and ``docker.socket`` and ``containerd`` are masked.
  What runs inside the containers is the test's behaviour (tests/twin/images.py);
- AWS: moto and the recorder (tests/harness/aws.py), reached through ``AWS_ENDPOINT_URL_*`` set as
  systemd's default environment in the twin (``DefaultEnvironment=``, systemd-system.conf(5)), which
  every unit, cloud-init's included, inherits; the CLI's credentials come from the metadata service
  as on EC2;
- the CloudWatch agent, which the boot would download from AWS: its control script, as an image that
  ships the agent has it.

The twin's root is an overlay of the cached rootfs (lower) and a directory of the test's (upper), so
a boot writes nothing to the cache and survives a reboot of the twin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path

from tests.twin.cleanup import owned
from tests.twin.netns import NetNs

ENGINE_DIR = "/run/twin-engine"
"""Where the recording engine's socket directory is bound inside the twin."""

CLOUD_CFG = """\
# The twin's hypervisor: cloud-init's NoCloud seed instead of EC2's metadata (tests/twin/host.py).
datasource_list: [NoCloud, None]
network: {config: disabled}
"""

DOCKER_UNIT = f"""\
# The twin's Docker engine is the test's recording engine (tests/harness/dockerd.py), outside the
# twin; its socket directory is bound at {ENGINE_DIR}. This unit stands in for the docker.io
# package's docker.service, which would start dockerd.
[Unit]
Description=Docker Application Container Engine (the test's recording engine)

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/ln -sfn {ENGINE_DIR}/docker.sock /run/docker.sock

[Install]
WantedBy=multi-user.target
"""

AGENT_CTL = """\
#!/usr/bin/python3 -S
# Stand-in for amazon-cloudwatch-agent-ctl (package amazon-cloudwatch-agent), called as the
# CloudWatch agent user guide shows (-a fetch-config -m ec2 -s -c file:PATH). Fails, as the real one
# does, when the config is missing or not a JSON object; records its calls in /var/log/twin-agent.log.
import json, sys
argv = sys.argv[1:]
with open("/var/log/twin-agent.log", "a") as log:
    log.write(json.dumps(argv) + "\\n")
if "fetch-config" in argv:
    source = argv[argv.index("-c") + 1]
    config = json.load(open(source.removeprefix("file:")))
    if not isinstance(config, dict):
        sys.exit("Configuration validation second phase failed")
    print("Configuration validation succeeded")
"""


class Twin:
    """One twin host. ``upper`` is its writable layer; ``merged`` its root as the host sees it."""

    def __init__(self, workdir: Path, rootfs: Path, netns: NetNs, *, devices: int, engine_dir: Path,
                 environment: Mapping[str, str]) -> None:
        self.workdir = workdir
        self.rootfs = rootfs
        self.netns = netns
        self.devices = devices
        self.engine_dir = engine_dir
        self.environment = dict(environment)
        self.upper = workdir / "upper"
        self.merged = workdir / "root"
        self.device_root = workdir / "devices"
        self.console = workdir / "console.log"
        self._nspawn: subprocess.Popen[bytes] | None = None
        self._mounted = False
        self.boots = 0
        self.instance_id = ""
        self._disks: list[Path] = []

    # -- the twin's disk ------------------------------------------------------------------------

    def path(self, path: str) -> Path:
        """A path of the twin, as the test reads it (its overlay root, mounted while it exists)."""
        return self.merged / path.lstrip("/")

    def prepare(self, user_data: str | bytes, instance_id: str) -> Twin:
        """The twin's first boot, as EC2 launches an instance: its disk (the cached rootfs) and the
        seed cloud-init reads the user data and instance id from."""
        for d in (self.upper, self.merged, self.workdir / "work", self.device_root / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "overlay", owned("root"), "-o",
                        f"lowerdir={self.rootfs},upperdir={self.upper},workdir={self.workdir / 'work'}",
                        str(self.merged)], check=True)
        self._mounted = True
        self.instance_id = instance_id
        for n in range(self.devices):
            (self.device_root / "dev" / f"neuron{n}").touch()
        data = user_data.encode() if isinstance(user_data, str) else user_data
        self._write("/var/lib/cloud/seed/nocloud/user-data", data, 0o600)
        self._write("/var/lib/cloud/seed/nocloud/meta-data",
                    f"instance-id: {instance_id}\nlocal-hostname: {instance_id}\n".encode(), 0o644)
        self._write("/etc/cloud/cloud.cfg.d/90-twin.cfg", CLOUD_CFG.encode(), 0o644)
        env = " ".join(json.dumps(f"{k}={v}") for k, v in sorted(self.environment.items()))
        self._write("/etc/systemd/system.conf.d/90-twin.conf", f"[Manager]\nDefaultEnvironment={env}\n".encode(),
                    0o644)
        self._write("/etc/systemd/system/docker.service", DOCKER_UNIT.encode(), 0o644)
        for masked in ("docker.socket", "containerd.service"):
            link = self.path(f"/etc/systemd/system/{masked}")
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        self._write("/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl", AGENT_CTL.encode(), 0o755)
        return self

    def limit_disk(self, path: str, size: str) -> None:
        """A filesystem of ``size`` (tmpfs's ``size=``) at ``path``, as a disk that fills up: mounted under
        the twin's root before it starts, so the twin and the engine's containers both write to it."""
        target = self.path(path)
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", owned("disk"), str(target)], check=True)
        self._disks.append(target)

    def _write(self, path: str, data: bytes, mode: int) -> None:
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    # -- power ----------------------------------------------------------------------------------

    def start(self) -> Twin:
        """Power on: systemd boots as PID 1; cloud-init runs the user data on the first boot only."""
        assert self._nspawn is None or self._nspawn.poll() is not None
        argv = ["systemd-nspawn", "--boot", "--keep-unit", "--register=no", "--quiet",
                f"--network-namespace-path={self.netns.path}", f"--machine={self.netns.name}",
                "-D", str(self.merged), f"--bind={self.engine_dir}:{ENGINE_DIR}",
                *[f"--bind={self.device_root}/dev/neuron{n}:/dev/neuron{n}" for n in range(self.devices)]]
        with open(self.console, "ab") as console:
            console.write(f"\n=== boot {self.boots + 1} ===\n".encode())
            self._nspawn = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console, stderr=console)
        self.boots += 1
        self._wait(lambda: self.init_pid() is not None, 60, "the twin's systemd to start")
        return self

    def running(self) -> bool:
        return self._nspawn is not None and self._nspawn.poll() is None

    def init_pid(self) -> int | None:
        """The PID, in the test's view, of the twin's systemd."""
        if self._nspawn is None or self._nspawn.poll() is not None:
            return None
        try:
            children = Path(f"/proc/{self._nspawn.pid}/task/{self._nspawn.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def run(self, *argv: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the twin (its mount, UTS, IPC, network and PID namespaces), as root."""
        pid = self.init_pid()
        assert pid is not None, "the twin is not running"
        return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "--", *argv],
                              capture_output=True, text=True, timeout=timeout, check=check,
                              env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                   "LANG": "C.UTF-8"})

    def wait_system(self, timeout: float = 240) -> str:
        """Waits until systemd has finished starting up (``running`` or ``degraded``) and returns that."""
        state = ""

        def settled() -> bool:
            nonlocal state
            state = self.run("systemctl", "is-system-running").stdout.strip()
            return state in ("running", "degraded")

        try:
            self._wait(settled, timeout, "the twin's systemd to finish starting")
        except TimeoutError as error:
            raise TimeoutError(f"{error} (last state: {state})") from None
        return state

    def wait_boot_script(self, timeout: float = 240) -> str:
        """Waits until the boot script has ended (its status file says done or failed) and returns that."""
        status = self.path("/var/log/neuron-serving/status")

        def ended() -> bool:
            # The status file says how it ended before the script reports it (phase, signal): the
            # script has ended once cloud-init's final stage, which runs it, has.
            if not status.is_file() or status.read_text().startswith("running"):
                return False
            state = self.run("systemctl", "show", "-P", "ActiveState", "cloud-final.service").stdout.strip()
            return state in ("active", "failed")

        self._wait(ended, timeout, "the boot script to end")
        return status.read_text().strip()

    def reboot(self) -> None:
        """``systemctl reboot`` inside; systemd-nspawn then exits with 133 (systemd-nspawn(1)), and the
        twin is powered on again, as the hypervisor restarts a rebooted instance."""
        self.run("systemctl", "reboot")
        assert self._nspawn is not None
        code = self._nspawn.wait(timeout=120)
        assert code == 133, f"systemd-nspawn exited {code} on reboot, not 133"
        self.start()

    def poweroff(self) -> None:
        if self._nspawn is None:
            return
        if self._nspawn.poll() is None:
            self.run("systemctl", "poweroff", timeout=30)
            try:
                self._nspawn.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._nspawn.kill()
                self._nspawn.wait()
        self._nspawn = None

    def destroy(self) -> None:
        self.poweroff()
        self._unmount()

    def kill(self) -> None:
        """Pulls the plug, for a test run being stopped (no time for a poweroff): SIGKILL to the twin's
        systemd, whose end ends every process of its PID namespace (pid_namespaces(7)), and to
        systemd-nspawn; then the disks come off."""
        pid = self.init_pid()
        if pid is not None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._nspawn is not None:
            self._nspawn.kill()
            # With a timeout: the signal may have come inside a wait() on it, whose lock is then held
            # (CPython, Lib/subprocess.py, Popen._wait: a wait without one blocks on _waitpid_lock).
            with suppress(subprocess.TimeoutExpired):
                self._nspawn.wait(timeout=10)
            self._nspawn = None
        self._unmount()

    def _unmount(self) -> None:
        for disk in reversed(self._disks):
            subprocess.run(["umount", "-l", str(disk)], check=False)
        self._disks.clear()
        if self._mounted:
            subprocess.run(["umount", "-l", str(self.merged)], check=False)
            self._mounted = False

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f}s for {what}")
            time.sleep(0.5)


def copy_console_tail(twin: Twin, lines: int = 60) -> str:
    """The end of the twin's console, for a failing test's message."""
    try:
        return "\n".join(twin.console.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
