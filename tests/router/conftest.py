"""Fixtures that run the real HAProxy binary with the rendered router config in front of fake TGI
replicas (see routersim.py), and always stop both when the test ends."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from routersim import MISSING_HAPROXY, Router, find_haproxy, router_launcher


@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    """The HAProxy binary. Missing, it skips the router tests, or fails them when ``CI`` is set:
    a CI job without HAProxy would otherwise pass without testing the router."""
    found = find_haproxy()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(MISSING_HAPROXY)
        pytest.skip(MISSING_HAPROXY)
    return found


@pytest.fixture
def start_router(haproxy_bin: str, tmp_path: Path) -> Iterator[Callable[..., Router]]:
    """``start_router(replicas=3, token_delay=0.0, serving=None, record=False, **render_kwargs)``: a serving
    router and its fakes (behind recording relays with ``record``).

    ``render_kwargs`` go to ``render_router_config``; the health check interval defaults to the
    tests' short one. Whatever the outcome, everything started is stopped after the test.
    """
    with router_launcher(haproxy_bin, tmp_path) as launch:
        yield launch
