"""Records ``haproxy-metrics.txt``: the full ``/metrics`` page of the real HAProxy running the rendered
router config, as the publisher scrapes it, in a state worth publishing.

Three fake replicas behind the router (tests/router/routersim.py), each limited to one request
in flight; replica-2 is killed and the router marks it DOWN; then six slow generations are sent
at once, so that two run and four wait in the router's queue while the page is captured. The
page then shows ``haproxy_backend_current_queue{proxy="replicas"} 4`` and two servers UP.

Run from the repository root with Debian's haproxy installed: ``.venv/bin/python
tests/monitor/monitor_fixtures/capture_haproxy_metrics.py``.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# routersim, and the repository's root for the benchmarks package it finds ports with.
sys.path[:0] = [str(HERE.parents[1] / "router"), str(HERE.parents[2])]

from routersim import find_haproxy, generate, http_request, launch_router  # noqa: E402

REQUESTS = 6
TOKENS = 20
TOKEN_DELAY = 0.1


def main() -> None:
    haproxy = find_haproxy()
    if haproxy is None:
        sys.exit("install Debian's haproxy first")
    with tempfile.TemporaryDirectory() as workdir:
        router = launch_router(haproxy, Path(workdir), replicas=3, token_delay=TOKEN_DELAY,
                               max_concurrent_per_replica=1)
        try:
            router.replicas["replica-2"].kill()
            router.wait_for_states({"replica-2": "DOWN"})
            senders = [threading.Thread(target=router.request, args=("POST", "/generate", generate(TOKENS)),
                                        kwargs={"timeout": 30}) for _ in range(REQUESTS)]
            for sender in senders:
                sender.start()
            deadline = time.monotonic() + 3
            while router.backend_stats()["qcur"] != str(REQUESTS - 2) and time.monotonic() < deadline:
                time.sleep(0.02)
            page = http_request(router.metrics_port, "GET", "/metrics").body.decode()
            for sender in senders:
                sender.join()
        finally:
            router.stop()
    (HERE / "haproxy-metrics.txt").write_text(page)
    print(f"wrote {len(page.splitlines())} lines")


if __name__ == "__main__":
    main()
