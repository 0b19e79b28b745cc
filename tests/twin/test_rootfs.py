"""The twin's rootfs recipe and its trust in Ubuntu's archive (tests/twin/rootfs.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.twin import rootfs


def test_without_the_archive_the_twin_is_unavailable_saying_so(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on loopback's discard port: as an unreachable archive, never another source.
    monkeypatch.setattr(rootfs, "ARCHIVE", "http://127.0.0.1:9/ubuntu")
    with pytest.raises(rootfs.TwinUnavailable, match="Ubuntu's archive cannot be reached"):
        rootfs.archive_key(tmp_path)


def test_the_cached_rootfs_is_ubuntu_22_04_with_the_dlami_packages_of_their_versions(
        twin_rootfs: Path) -> None:
    assert 'VERSION_ID="22.04"' in (twin_rootfs / "etc/os-release").read_text()
    listed = subprocess.run(["chroot", str(twin_rootfs), "dpkg-query", "-W", "-f", "${Package} ${Version}\n",
                             *[str(p["name"]) for p in rootfs.DLAMI_PACKAGES]],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert listed == [f"{p['name']} {p['version']}" for p in rootfs.DLAMI_PACKAGES]


def test_the_cached_rootfs_runs_aws_cli_v2_from_the_shared_wheel_under_jammys_python(twin_rootfs: Path) -> None:
    # The CLI the hosts run (the bootstrap's snap, AWS's installer), not PyPI's v1.
    version = subprocess.run(["chroot", str(twin_rootfs), "env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin",
                              "aws", "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("aws-cli/2.36.7 Python/3.10.")
