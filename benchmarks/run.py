"""One benchmark run: every scenario in turn, then ``figures.json`` and the plots."""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from . import plots, report, scenarios
from .router import find_haproxy
from .scenarios import Scale

DEFAULT_OUTPUT = Path(__file__).parent / "results"


def run(scale: Scale, output: Path) -> dict[str, Any]:
    """Run every scenario at ``scale``; write ``figures.json``, ``overhead.png``, ``mixed.png``
    and ``failover.png`` to ``output``; return the figures."""
    output.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="benchmarks-") as work:
        workdir = Path(work)
        overhead = asyncio.run(scenarios.overhead(scale, workdir))
        mixed = asyncio.run(scenarios.mixed(scale, workdir))
        failover = asyncio.run(scenarios.failover(scale, workdir))
        overload = asyncio.run(scenarios.overload(scale, workdir))
        layouts = asyncio.run(scenarios.layouts(scale, workdir))
    figures: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "haproxy": _haproxy_version(),
        "seconds": round(time.monotonic() - began, 1),
        "setup": report.setup(scale),
        "overhead": report.overhead_figures(overhead),
        "mixed": report.mixed_figures(mixed),
        "failover": report.failover_figures(failover),
        "overload": report.overload_figures(overload),
        "layouts": report.layouts_figures(layouts),
    }
    figures["targets"] = [t.to_json() for t in report.targets(figures)]
    figures["withdrawn_targets"] = report.withdrawn(figures)
    (output / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")
    plots.overhead(figures["overhead"], output / "overhead.png")
    plots.mixed(mixed, output / "mixed.png")
    plots.failover(failover, output / "failover.png")
    return figures


def _haproxy_version() -> str:
    first = subprocess.run([find_haproxy(), "-v"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return first.split(" - ")[0]
