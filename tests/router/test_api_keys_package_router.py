"""The API keys at boot, against the HAProxy that Ubuntu's and Debian's haproxy package starts on
install: its own binary, with the package's default configuration (/etc/haproxy/haproxy.cfg of the
package installed here), whose runtime socket is the path the sync talks to. That HAProxy knows no key
file, so the boot's sync must not talk to it, only write the file the endpoint's router reads when it
starts (issue 22, defect 2; the boot on the twin, tests/twin, shows the whole of it)."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from routersim import MISSING_HAPROXY, find_haproxy

from neuron_serving.userdata import api_keys

PACKAGE_CONFIG = Path("/etc/haproxy/haproxy.cfg")
KEY = api_keys.new_key()


@pytest.fixture
def package_router(tmp_path: Path) -> Iterator[Path]:
    """HAProxy running the package's default configuration; its runtime socket's path."""
    haproxy = find_haproxy()
    if haproxy is None or not PACKAGE_CONFIG.is_file():
        pytest.fail(MISSING_HAPROXY)
    sock = tmp_path / "admin.sock"
    text = PACKAGE_CONFIG.read_text()
    assert re.search(r"^\s*stats socket /run/haproxy/admin.sock .*level admin", text, re.M), text
    # Here, unlike on a host: its socket in this test's directory, in the foreground, as this user,
    # and without syslog.
    text = text.replace("/run/haproxy/admin.sock", str(sock))
    text = re.sub(r"^\s*(chroot|user|group|daemon|log)\b.*$", "", text, flags=re.M)
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    process = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        yield sock
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_package_router_refuses_the_key_switch(package_router: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="Unknown ACL"):
        api_keys.update_router(str(package_router), str(tmp_path / "api-keys.sha256"), [api_keys.digest(KEY)])


def test_the_boot_sync_writes_the_key_file_and_leaves_the_package_router_alone(
        package_router: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The secret as Secrets Manager would give it (the AWS CLI's part is tested in tests/boot).
    monkeypatch.setattr(api_keys, "read_secret", lambda secret, region: f'{{"alice": "{api_keys.stored(KEY)}"}}')
    keys_file = tmp_path / "api-keys.sha256"
    sent: list[bytes] = []
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: object) -> None:
        sent.append(str(address).encode())
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    assert api_keys.main(["sync", "--secret", "keys", "--region", "us-east-2", "--keys-file", str(keys_file),
                          "--socket", str(package_router), "--file-only"]) == 0
    assert keys_file.read_text() == api_keys.keys_file_text([api_keys.digest(KEY)])
    assert sent == []
    assert "1 key(s) in force: alice" in capsys.readouterr().out
