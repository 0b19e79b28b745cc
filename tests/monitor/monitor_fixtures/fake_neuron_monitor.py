"""A stand-in for neuron-monitor in the publisher's end-to-end tests: prints the given recorded
reports as neuron-monitor does, one JSON object per line, one line per period; then prints the
last one again every period until it is stopped, or exits with ``--exit`` (a crashing monitor).

Usage: ``fake_neuron_monitor.py PERIOD_SECONDS [--exit] REPORT.json...``
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    period, paths = float(argv[1]), [a for a in argv[2:] if a != "--exit"]
    reports = [json.dumps(json.loads(Path(p).read_text()), separators=(",", ":")) for p in paths]
    forever = itertools.repeat(reports[-1]) if "--exit" not in argv else iter(())
    for report in itertools.chain(reports, forever):
        time.sleep(period)
        print(report, flush=True)


if __name__ == "__main__":
    main(sys.argv)
