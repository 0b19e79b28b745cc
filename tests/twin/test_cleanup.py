"""A killed twin run leaves nothing behind (tests/twin/cleanup.py): a run stopped by a signal takes its
twins' mounts and namespaces with it, and a session reaps what killed runs left, and only that. Real
``ip netns``, real overlay and tmpfs mounts, a real pytest in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.twin.cleanup import NETNS_DIR, alive
from tests.twin.netns import NetNs

REPO = Path(__file__).resolve().parents[2]

# A twin as the world fixture makes one (tests/twin/conftest.py), on an empty lower layer instead of
# the rootfs and never powered on: its namespace, its overlay root and a tmpfs disk, each registered
# for a signal as the world registers them. The test writes what it made, then waits to be killed.
TWIN_LIKE = """
import json, os, time
import pytest
from tests.twin.cleanup import on_signal
from tests.twin.conftest import twin_session
from tests.twin.host import Twin
from tests.twin.netns import NetNs


@pytest.fixture
def twin(twin_session, tmp_path):
    netns = NetNs(f"twin{os.getpid()}-0").create()
    try:
        with on_signal(netns.delete), netns.entered():
            (tmp_path / "lower").mkdir()
            twin = Twin(tmp_path / "twin1", tmp_path / "lower", netns, devices=1, engine_dir=tmp_path,
                        environment={})
            with on_signal(twin.kill):
                twin.prepare("#cloud-config\\n", "i-0123456789abcdef0")
                twin.limit_disk("/var/lib/neuron-serving", "72k")
                yield twin
    finally:
        netns.delete()


def test_waits_to_be_killed(twin):
    made = {"pid": os.getpid(), "netns": twin.netns.name, "root": str(twin.merged)}
    with open(os.environ["TWIN_MADE"], "w") as out:
        json.dump(made, out)
    time.sleep(300)
"""

SESSION = """
from tests.twin.conftest import twin_session


def test_session_starts(twin_session):
    pass
"""


@pytest.fixture(autouse=True)
def root_and_netns() -> None:
    """As the twin itself (tests/twin/rootfs.py), these need root and iproute2, and fail without them."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the twin's cleanup tests need root and `ip` (iproute2): scripts/test runs them so")


INTERRUPTIBLE_PYTEST = ("import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "sys.exit(pytest.main(sys.argv[1:]))")
"""``python -m pytest`` with Python's own SIGINT handler (KeyboardInterrupt), as an interactive run has."""


def pytest_in_subprocess(tmp_path: Path, module: str, *options: str) -> subprocess.Popen[bytes]:
    """A pytest run of ``module``; the twin-like test writes what it made to ``made.json``."""
    test = tmp_path / "test_child.py"
    test.write_text(textwrap.dedent(module))
    # A session of its own: the test signals it (or its process group, as CI's timeout does). SIGINT
    # as at a terminal, whatever this run inherited: started in the background by a shell, it comes
    # ignored (bash(1), "COMMAND EXECUTION ENVIRONMENT"), and Python keeps it ignored.
    return subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE_PYTEST, "-q", "-p", "no:cacheprovider",
                             f"--basetemp={tmp_path / 'child'}", "--rootdir", str(tmp_path), *options, str(test)],
                            cwd=REPO, env={**os.environ, "TWIN_MADE": str(tmp_path / "made.json")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def mounts_of(pid: int) -> list[str]:
    """The mount sources of ``pid``'s twins in this mount namespace's table."""
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if f" twin-root-{pid} " in line or f" twin-disk-{pid} " in line]


def wait_for(path: Path, child: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            child.kill()
            output = child.communicate()[0].decode(errors="replace")
            pytest.fail(f"the child pytest made no twin: {output[-3000:]}")
        time.sleep(0.2)
    return path.read_text()


@pytest.mark.parametrize(("signum", "options", "exit_code"), [
    (signal.SIGTERM, ("-p", "no:xdist"), -signal.SIGTERM),
    # pytest's own SIGINT handling goes on after the cleanups: it reports the interruption (exit 2).
    (signal.SIGINT, ("-p", "no:xdist"), 2),
    # CI's timeout signals the whole process group; the twin is in an xdist worker, a process of its own.
    (signal.SIGTERM, ("-n", "1"), -signal.SIGTERM),
], ids=["sigterm", "sigint", "sigterm-xdist-group"])
def test_a_signalled_run_leaves_no_namespace_and_no_mount(tmp_path: Path, signum: int, options: tuple[str, ...],
                                                          exit_code: int) -> None:
    child = pytest_in_subprocess(tmp_path, TWIN_LIKE, *options)
    try:
        made = json.loads(wait_for(tmp_path / "made.json", child))
        assert (NETNS_DIR / made["netns"]).exists()
        assert len(mounts_of(made["pid"])) == 2, "the twin's overlay root and its tmpfs disk"
        if "-n" in options:
            os.killpg(child.pid, signum)
        else:
            os.kill(child.pid, signum)
        output = child.communicate(timeout=60)[0].decode(errors="replace")
        deadline = time.monotonic() + 60
        while alive(made["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(made["pid"]), output
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == exit_code, output
    assert not (NETNS_DIR / made["netns"]).exists(), output
    assert mounts_of(made["pid"]) == [], output
    assert not os.path.ismount(made["root"])


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has ended (and is waited for, so no zombie holds it)."""
    ended = subprocess.Popen(["true"])
    ended.wait()
    return ended.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    running = subprocess.Popen(["sleep", "300"])
    yield running.pid
    running.kill()
    running.wait()


def test_a_session_deletes_the_namespace_of_a_dead_pid_and_keeps_that_of_a_live_one(
        tmp_path: Path, dead_pid: int, live_pid: int) -> None:
    dead, live = NetNs(f"twin{dead_pid}-0").create(), NetNs(f"twin{live_pid}-0").create()
    # What a run killed by SIGKILL leaves running in its namespace (its twin, its servers).
    orphan = subprocess.Popen(["ip", "netns", "exec", dead.name, "sleep", "300"])
    try:
        deadline = time.monotonic() + 10
        while not subprocess.run(["ip", "netns", "pids", dead.name], capture_output=True, text=True).stdout.split():
            assert time.monotonic() < deadline, "`ip netns exec` never entered the namespace"
            time.sleep(0.1)
        session = pytest_in_subprocess(tmp_path, SESSION, "-p", "no:xdist")
        output = session.communicate(timeout=120)[0].decode(errors="replace")
        assert session.returncode == 0, output
        assert not (NETNS_DIR / dead.name).exists()
        assert (NETNS_DIR / live.name).exists()
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()
        orphan.wait()
        dead.delete()
        live.delete()


def test_a_session_unmounts_the_twin_mounts_of_a_dead_pid_and_nothing_else(
        tmp_path: Path, dead_pid: int, live_pid: int) -> None:
    # A space in the path: mountinfo escapes it (\\040), and the reaper must find the mount all the same.
    points = {name: tmp_path / name for name in ("dead run disk", "live run disk", "plain tmpfs")}
    sources = {"dead run disk": f"twin-disk-{dead_pid}", "live run disk": f"twin-disk-{live_pid}",
               "plain tmpfs": "twin-disk"}
    for name, point in points.items():
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", sources[name], str(point)], check=True)
    lower, upper, work, merged = (tmp_path / "dead run root" / d for d in ("lower", "upper", "work", "root"))
    for d in (lower, upper, work, merged):
        d.mkdir(parents=True)
    subprocess.run(["mount", "-t", "overlay", f"twin-root-{dead_pid}", "-o",
                    f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)], check=True)
    try:
        session = pytest_in_subprocess(tmp_path, SESSION, "-p", "no:xdist")
        output = session.communicate(timeout=120)[0].decode(errors="replace")
        assert session.returncode == 0, output
        assert not os.path.ismount(points["dead run disk"])
        assert not os.path.ismount(merged)
        assert os.path.ismount(points["live run disk"])
        assert os.path.ismount(points["plain tmpfs"])
    finally:
        for point in (*points.values(), merged):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


def test_a_signal_the_run_ignores_stays_ignored() -> None:
    # An xdist worker or a shell's background job may start with SIGINT ignored; taking it over would
    # turn a signal the run never stopped on into one that kills its twins and leaves it running.
    code = textwrap.dedent("""
        import signal
        from tests.twin.cleanup import _stop, on_signals
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with on_signals():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == _stop
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
