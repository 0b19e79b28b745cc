"""Fixtures that run the real HAProxy binary with the rendered router config in front of fake TGI
replicas (see routersim.py), and always stop both when the test ends."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from routersim import MISSING_HAPROXY, Router, find_haproxy, router_launcher

from neuron_serving.plan.engines import Engine, engine
from neuron_serving.userdata import api_keys
from tests.twin.rootfs import TwinUnavailable, rootfs

HAPROXY_BUILDS = ("2.4 jammy", "2.6 bookworm")
"""Every router test runs on both: Ubuntu 22.04's HAProxy 2.4, the Neuron DLAMI's (from the host
twin's rootfs, tests/twin/rootfs.py), and Debian 12's 2.6, this machine's."""


@pytest.fixture(scope="session", params=HAPROXY_BUILDS)
def haproxy_bin(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The HAProxy binary of the build. Missing, it skips the router tests, or fails them when
    ``CI`` is set: a CI job without HAProxy would otherwise pass without testing the router."""
    try:
        found = jammy_haproxy(tmp_path_factory.mktemp("jammy-haproxy")) if request.param == "2.4 jammy" \
            else find_haproxy()
    except TwinUnavailable as missing:
        found, reason = None, f"Ubuntu 22.04's HAProxy comes from the host twin's rootfs: {missing}"
    else:
        reason = MISSING_HAPROXY
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def haproxy_version(haproxy_bin: str) -> tuple[int, int]:
    """Major and minor version of the HAProxy build under test (``haproxy -v``), for the few
    answers that differ between 2.4 and 2.6 (each test cites the source behind the difference)."""
    out = subprocess.run([haproxy_bin, "-v"], capture_output=True, text=True, check=True, timeout=30).stdout
    found = re.search(r"version (\d+)\.(\d+)", out)
    assert found, out
    return int(found.group(1)), int(found.group(2))


def jammy_haproxy(directory: Path) -> str:
    """A launcher of the twin rootfs's /usr/sbin/haproxy (jammy-updates' package) through that
    rootfs's own dynamic loader and libraries, so it runs here as Ubuntu built it, unchrooted."""
    root = rootfs()
    libs = root / "usr/lib/x86_64-linux-gnu"
    launcher = directory / "haproxy"
    launcher.write_text(f'#!/bin/sh\nexec "{libs}/ld-linux-x86-64.so.2" --library-path "{libs}" '
                        f'"{root}/usr/sbin/haproxy" "$@"\n')
    launcher.chmod(0o755)
    return str(launcher)


@pytest.fixture
def start_router(haproxy_bin: str, tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """``start_router(replicas=3, token_delay=0.0, serving=None, record=False, **render_kwargs)``: a serving
    router and its fakes (behind recording relays with ``record``).

    ``render_kwargs`` go to ``render_router_config``; the health check interval defaults to the
    tests' short one. Whatever the outcome, everything started is stopped after the test.
    """
    with router_launcher(haproxy_bin, tmp_path) as launch:
        yield launch


@pytest.fixture(params=["tgi", "vllm"])
def serving(request: pytest.FixtureRequest) -> Engine:
    """Each engine in turn, for the tests that hold for both."""
    return engine(request.param)


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    """A directory for a router's key file and runtime API socket."""
    path = tmp_path / "keys"
    path.mkdir()
    return path


@pytest.fixture
def secure_router(start_router: Callable[..., Router], keys_dir: Path) -> Callable[..., Router]:
    """``secure_router(*keys, **kwargs)``: a router with API keys whose key file (in ``keys_dir``,
    beside its runtime socket) holds the digests of ``keys`` when it starts, one replica unless
    ``kwargs`` say otherwise, logging every request line to its log file."""

    def start(*keys: str, **kwargs: Any) -> Router:
        (keys_dir / "api-keys.sha256").write_text(api_keys.keys_file_text([api_keys.digest(k) for k in keys]))
        kwargs.setdefault("replicas", 1)
        return start_router(api_keys=True, keys_file=str(keys_dir / "api-keys.sha256"),
                            runtime_socket=str(keys_dir / "admin.sock"), log_target="stdout format raw", **kwargs)

    return start
