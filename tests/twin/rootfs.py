"""The twin's userland: Ubuntu 22.04 (jammy), the Neuron DLAMI's distribution, built from Ubuntu's
archive with mmdebstrap (Debian's package) and cached under ``.tools/twin/``.

What it holds is :data:`RECIPE`: the archive's own packages (with their maintainer scripts, run by
mmdebstrap as apt runs them on a host) and the pinned AWS CLI. A change to the recipe names a new
cache directory, so the rootfs is rebuilt when its package list changes and never otherwise.

Trust: the archive's ``InRelease`` files are verified by apt, inside mmdebstrap, against Ubuntu's
archive signing key alone. The key comes out of Ubuntu's own ``ubuntu-keyring`` package, fetched from
the archive's pool, and is used only if its fingerprint is :data:`ARCHIVE_KEY_FINGERPRINT`, which is
pinned here (the "Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>" that signs jammy;
listed in ubuntu-keyring 2021.03.26, ``keyrings/ubuntu-archive-keyring.gpg``). Debian has no
ubuntu-keyring package to take it from instead.

The archive is never silently replaced: if it cannot be reached, :func:`rootfs` raises
:class:`TwinUnavailable` saying so, and the tests that need the twin fail.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("NEURON_SERVING_TWIN_CACHE") or REPO / ".tools" / "twin")

ARCHIVE = "http://archive.ubuntu.com/ubuntu"
SUITE = "jammy"

ARCHIVE_KEY_FINGERPRINT = "F6ECB3762474EDA9D21B7022871920D1991BC93C"
"""Ubuntu Archive Automatic Signing Key (2018), which signs jammy's and jammy-updates' InRelease."""

KEYRING_DEB = "pool/main/u/ubuntu-keyring/ubuntu-keyring_2021.03.26_all.deb"
"""jammy's ubuntu-keyring, whose usr/share/keyrings/ubuntu-archive-keyring.gpg holds the key."""

RECIPE: dict[str, object] = {
    "suite": SUITE,
    # The release and its updates pocket, as a 22.04 host's sources.list has them.
    "sources": [f"deb {ARCHIVE} {SUITE} main universe", f"deb {ARCHIVE} {SUITE}-updates main universe"],
    "variant": "minbase",
    "packages": [
        # Booted with systemd as PID 1; dbus for systemctl's bus.
        "systemd", "systemd-sysv", "dbus",
        # cloud-init runs the user data, as on every Ubuntu AMI. locales: its locale module installs
        # it when missing, which the twin's closed network cannot.
        "cloud-init", "locales",
        # The router, with its package's own postinst (which starts HAProxy with the default config).
        "haproxy",
        # On every Ubuntu server image; the boot uses them (curl for the metadata service, python3 for
        # check-export and the API keys, gpg for the CloudWatch agent's signature).
        "curl", "ca-certificates", "python3", "python3-pip", "gpg", "gpgv", "unzip", "iproute2", "util-linux",
        # The docker CLI of the distribution (docker.io 24+ in jammy-updates). Its engine is replaced by
        # the test's recording engine at boot (tests/twin/host.py): the DLAMI runs docker, none may run here.
        "docker.io",
    ],
    # The AWS CLI the hosts run, v2, as the tests' emulator is checked against (tests/harness/
    # requirements-aws.txt): the wheel built from aws/aws-cli tag 2.36.7 beside the repository
    # (AWS_CLI_WHEEL; v2 is not on PyPI), with its dependencies from PyPI, into the system Python 3.10,
    # as /usr/local/bin/aws (the wheel's scripts/aws).
    "pip": ["awscli==2.36.7"],
    "wheels": ["awscli-2.36.7-py3-none-any.whl"],
}

AWS_CLI_WHEELS = REPO.parent / "shared" / "awscli-v2"
"""Where :data:`RECIPE`'s ``wheels`` are: ``shared/`` beside the repository (its SOURCE says how they
were built)."""


NEURON_LS = """\
#!/usr/bin/python3 -S
# Stand-in for neuron-ls of aws-neuronx-tools 2.29.22.0, whose output the Neuron docs show
# (aws-neuron-sdk v2.29.1, tools/neuron-sys-tools/neuron-ls.rst): instance-type and instance-id
# lines, then a table. Inferentia2 and Trainium1 devices have 2 NeuronCores and 32 GB each
# (about-neuron/arch/neuron-hardware/inf2-arch, trn1-arch); PCI, CPU affinity and NUMA columns are
# placeholders (the boot only logs this output).
import glob, re, urllib.request
def md(path):
    try:
        put = urllib.request.Request("http://169.254.169.254/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        token = urllib.request.urlopen(put, timeout=2).read().decode()
        get = urllib.request.Request("http://169.254.169.254/latest/meta-data/" + path,
                                     headers={"X-aws-ec2-metadata-token": token})
        return urllib.request.urlopen(get, timeout=2).read().decode()
    except OSError:
        return "unknown"
print("instance-type: " + md("instance-type"))
print("instance-id: " + md("instance-id"))
rule = "+--------+--------+----------+--------+-----------+--------------+----------+------+"
print(rule)
print("| NEURON | NEURON |  NEURON  | NEURON | CONNECTED |     PCI      |   CPU    | NUMA |")
print("| DEVICE | CORES  | CORE IDS | MEMORY |  DEVICES  |     BDF      | AFFINITY | NODE |")
print(rule)
for n in sorted(int(re.sub(r"\\D", "", d)) for d in glob.glob("/dev/neuron[0-9]*")):
    print(f"| {n:<6} | 2      | {2 * n}-{2 * n + 1:<6} | 32 GB  |           | 0000:{n:02x}:1e.0 | 0-95     | 0    |")
print(rule)
"""

NEURON_MONITOR = """\
#!/usr/bin/python3 -S
# Stand-in for neuron-monitor of aws-neuronx-tools 2.29.22.0 (aws-neuron-sdk v2.29.1,
# tools/neuron-sys-tools/neuron-monitor-user-guide.rst): `neuron-monitor -c CONFIG` prints one JSON
# report a line every `period` of the config. The report is one recorded for the publisher's tests
# (tests/monitor/monitor_fixtures/neuron-monitor-first.json), shipped beside this script.
import json, sys, time
argv = sys.argv[1:]
period = 5.0
if "-c" in argv:
    period = float(str(json.load(open(argv[argv.index("-c") + 1])).get("period", "5s")).rstrip("s"))
report = json.dumps(json.load(open("/opt/aws/neuron/share/twin/neuron-monitor-report.json")), separators=(",", ":"))
while True:
    time.sleep(period)
    print(report, flush=True)
"""

MONITOR_REPORT = (REPO / "tests/monitor/monitor_fixtures/neuron-monitor-first.json").read_text()

DLAMI_PACKAGES: list[dict[str, object]] = [
    # What the Neuron DLAMI ships, per its documentation: "Neuron driver, EFA, and Neuron tools"
    # (aws-neuron-sdk v2.29.1 dlami/index.rst, deploy/environments/dlami.rst), at the versions of the
    # SDK release the last Ubuntu 22.04 base DLAMI carries (Neuron 2.29.1, the Ubuntu 22.04 DLAMI's
    # last: release-notes/components/dlamis.rst, 2.30.0; src/helperscripts/n2-manifest.json at v2.29.1).
    # Imitated as packages of those names and versions, so that dpkg-query answers as on the AMI.
    {"name": "aws-neuronx-dkms", "version": "2.27.4.0", "arch": "all", "files": {},
     "description": "Stand-in for the Neuron driver (no kernel module: the twin's devices are files)"},
    {"name": "aws-neuronx-tools", "version": "2.29.22.0", "arch": "amd64",
     "files": {"opt/aws/neuron/bin/neuron-ls": NEURON_LS, "opt/aws/neuron/bin/neuron-monitor": NEURON_MONITOR,
               "opt/aws/neuron/share/twin/neuron-monitor-report.json": MONITOR_REPORT},
     "description": "Stand-in for the Neuron tools: neuron-ls and neuron-monitor (/opt/aws/neuron/bin)"},
]
"""Docker, the AWS CLI and the CloudWatch agent are not stated to be on the DLAMI: the boot installs
them when missing, from Ubuntu's archive and AWS. The twin, whose network reaches neither, has
docker.io and the pinned AWS CLI from its recipe, and the agent's control script (tests/twin/host.py)."""

RECIPE["dlami"] = DLAMI_PACKAGES


class TwinUnavailable(RuntimeError):
    """The twin cannot be built here (the archive, a tool, or a privilege is missing)."""


def recipe_digest() -> str:
    return hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:16]


def rootfs() -> Path:
    """The cached rootfs of :data:`RECIPE`, built first if it is not there (once, under a lock, for
    every test process of the run)."""
    target = CACHE / f"{SUITE}-{recipe_digest()}"
    done = target / "rootfs" / ".twin-complete"
    if done.exists():
        return target / "rootfs"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _build(target)
    return target / "rootfs"


def _need(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise TwinUnavailable(f"{tool} is missing: apt-get install {package} (scripts/test installs it)")
    return found


def archive_key(workdir: Path) -> Path:
    """Ubuntu's archive key as a keyring file of that key alone, its fingerprint checked."""
    deb = workdir / "ubuntu-keyring.deb"
    fetched = subprocess.run(["curl", "-sSf", "-m", "120", "-o", str(deb), f"{ARCHIVE}/{KEYRING_DEB}"],
                             capture_output=True, text=True, check=False)
    if fetched.returncode != 0:
        raise TwinUnavailable(f"Ubuntu's archive cannot be reached ({ARCHIVE}/{KEYRING_DEB}: "
                              f"{fetched.stderr.strip()}); the twin needs it and has no other source")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "keyring")], check=True)
    keyring = workdir / "keyring" / "usr/share/keyrings/ubuntu-archive-keyring.gpg"
    home = workdir / "gnupg"
    home.mkdir(mode=0o700)
    key = workdir / "ubuntu-archive-2018.gpg"
    exported = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--no-default-keyring", "--keyring", str(keyring),
         "--export", ARCHIVE_KEY_FINGERPRINT], capture_output=True, check=False)
    if exported.returncode != 0 or not exported.stdout:
        raise TwinUnavailable(f"ubuntu-keyring holds no key {ARCHIVE_KEY_FINGERPRINT}")
    key.write_bytes(exported.stdout)
    listed = subprocess.run(["gpg", "--homedir", str(home), "--batch", "--with-colons", "--show-keys", str(key)],
                            capture_output=True, text=True, check=True).stdout
    fingerprints = [line.split(":")[9] for line in listed.splitlines() if line.startswith("fpr:")]
    if fingerprints[:1] != [ARCHIVE_KEY_FINGERPRINT]:
        raise TwinUnavailable(f"the archive key's fingerprint is {fingerprints[:1]}, not {ARCHIVE_KEY_FINGERPRINT}")
    return key


def _build(target: Path) -> None:
    mmdebstrap = _need("mmdebstrap", "mmdebstrap")
    # Rootfs of earlier recipes (half a gigabyte each) go.
    for old in CACHE.glob(f"{SUITE}-*"):
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    _need("systemd-nspawn", "systemd-container")
    if os.geteuid() != 0:
        raise TwinUnavailable("building and booting the twin needs root (mmdebstrap's root mode, systemd-nspawn)")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        # apt verifies as its sandbox user, _apt, who must be able to read the key.
        os.chmod(work, 0o755)
        key = archive_key(Path(work))
        key.chmod(0o644)
        root = target / "rootfs"
        pip = [str(p) for p in RECIPE["pip"]]  # type: ignore[attr-defined]
        local = [AWS_CLI_WHEELS / str(w) for w in RECIPE["wheels"]]  # type: ignore[attr-defined]
        missing = [str(w) for w in local if not w.is_file()]
        if missing:
            raise TwinUnavailable(f"the twin's AWS CLI wheel is missing: {', '.join(missing)}")
        wheels = Path(work) / "wheels"
        # Downloaded here, with this machine's pip settings (its index and certificates), for jammy's
        # Python 3.10; installed offline in the chroot, into the system Python, as an image builder's
        # `pip install` would.
        downloaded = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.10",
             "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--platform", "any", "-d", str(wheels), *map(str, local)], capture_output=True, text=True, check=False)
        if downloaded.returncode != 0:
            raise TwinUnavailable(f"pip could not download {' '.join(pip)} for the twin: {downloaded.stderr[-2000:]}")
        debs = _dlami_debs(Path(work) / "dlami")
        install = (f'cp -r {wheels} "$1/tmp/wheels" && env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$1" '
                   f'python3 -m pip install -q --no-index --find-links /tmp/wheels {" ".join(pip)} && '
                   f'cp -r {debs} "$1/tmp/dlami" && chroot "$1" sh -c "dpkg -i /tmp/dlami/*.deb" && '
                   'rm -rf "$1/tmp/wheels" "$1/tmp/dlami"')
        argv = [mmdebstrap, f"--variant={RECIPE['variant']}", f"--keyring={key}",
                "--include=" + ",".join(RECIPE["packages"]),  # type: ignore[arg-type]
                f"--customize-hook={install}",
                SUITE, str(root), *RECIPE["sources"]]  # type: ignore[misc]
        built = subprocess.run(argv, capture_output=True, text=True, check=False)
        (target / "build.log").write_text(built.stdout + built.stderr)
        if built.returncode != 0:
            tail = "\n".join((built.stdout + built.stderr).splitlines()[-15:])
            reached = "Ubuntu's archive cannot be reached" if "Could not" in tail or "Failed to fetch" in tail else ""
            raise TwinUnavailable(f"mmdebstrap failed (exit {built.returncode}){': ' + reached if reached else ''}; "
                                  f"log in {target / 'build.log'}:\n{tail}")
    (root / ".twin-complete").write_text(json.dumps(RECIPE, sort_keys=True) + "\n")


def _dlami_debs(directory: Path) -> Path:
    """:data:`DLAMI_PACKAGES` as .deb files (dpkg-deb --build), in ``directory``."""
    for package in DLAMI_PACKAGES:
        tree = directory / "tree" / str(package["name"])
        for path, text in dict(package["files"]).items():  # type: ignore[call-overload]
            target = tree / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            target.chmod(0o755 if text.startswith("#!") else 0o644)
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "DEBIAN" / "control").write_text(
            f"Package: {package['name']}\nVersion: {package['version']}\nArchitecture: {package['arch']}\n"
            f"Maintainer: cdk-neuron-serving tests <tests@localhost>\nDescription: {package['description']}\n")
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree),
                        str(directory / f"{package['name']}_{package['version']}_{package['arch']}.deb")],
                       check=True, capture_output=True)
    shutil.rmtree(directory / "tree")
    return directory
