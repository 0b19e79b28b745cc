"""The run's plots, as PNG files: matplotlib with its Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

# Chosen before pyplot is imported: rendering to files needs no display.
matplotlib.use("Agg")

import matplotlib.pyplot as plt

from .load import Outcome
from .report import OVERHEAD_LIMIT, percentile
from .scenarios import FailoverResult, MixedResult

LABELS = {"shipped": "shipped router", "round_robin": "round robin"}


def overhead(figures: dict[str, Any], path: Path) -> None:
    """Router over direct for each latency figure, at 1 and 64 streams."""
    keys = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.2
    for i, key in enumerate(keys):
        values = [group["ratios"][key] or 0.0 for group in figures.values()]
        ax.bar([x + (i - 1.5) * width for x in range(len(values))], values, width, label=key.replace("_", " "))
    ax.axhline(OVERHEAD_LIMIT, color="red", linestyle="--", linewidth=1, label=f"target {OVERHEAD_LIMIT}")
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(figures)), [name.replace("_", " ") for name in figures])
    ax.set_ylabel("router / direct")
    ax.set_ylim(0.8, 1.2)
    ax.set_title("Router overhead")
    ax.legend(fontsize=8, ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def mixed(result: MixedResult, path: Path) -> None:
    """The distribution of TTFT and end-to-end latency under each router and as the planner
    predicts it behind the shipped router, p99 marked."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = (("time to first token", _ttft, "ttft_s"), ("end-to-end latency", _end, "e2e_s"))
    for ax, (title, measure, attribute) in zip(axes, panels, strict=True):
        for router, outcomes in result.outcomes.items():
            values = sorted(v for v in (measure(o) for o in outcomes if o.ok) if v is not None)
            if not values:
                continue
            share = [(i + 1) / len(values) for i in range(len(values))]
            line, = ax.plot(values, share, label=LABELS.get(router, router))
            ax.axvline(percentile(values, 99) or 0.0, color=line.get_color(), linestyle=":")
        predicted = sorted(getattr(t, attribute) for t in result.predicted)
        if predicted:
            share = [(i + 1) / len(predicted) for i in range(len(predicted))]
            line, = ax.plot(predicted, share, linestyle="--", color="gray", label="planner (shipped router)")
            ax.axvline(percentile(predicted, 99) or 0.0, color=line.get_color(), linestyle=":")
        ax.set_xscale("log")
        ax.set_xlabel("seconds (benchmark clock; dotted: p99)")
        ax.set_ylabel("share of requests")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle("Mixed chat and long-prompt workload")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def failover(result: FailoverResult, path: Path) -> None:
    """Each request's end-to-end latency by when it was sent, failures marked, with the kill, the
    marking down and the restart."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ok = [o for o in result.outcomes if o.ok]
    failed = [o for o in result.outcomes if not o.ok]
    ax.scatter([o.sent - result.killed_at for o in ok], [o.end or 0.0 for o in ok], s=6, label="served")
    ax.scatter([o.sent - result.killed_at for o in failed], [o.end or 0.0 for o in failed], s=18, marker="x",
               color="red", label="lost")
    events = [(0.0, "killed", "red"), (result.restarted_at - result.killed_at, "restarted", "green")]
    if result.marked_down_at is not None:
        events.append((result.marked_down_at - result.killed_at, "marked down", "orange"))
    if result.first_request_after_restart is not None:
        events.append((result.first_request_after_restart - result.killed_at, "takes traffic", "blue"))
    for at, label, color in events:
        ax.axvline(at, color=color, linestyle="--", linewidth=1, label=label)
    ax.set_xlabel("seconds since the replica was killed")
    ax.set_ylabel("end-to-end seconds")
    ax.set_title("One replica killed under load, then restarted")
    ax.legend(fontsize=8, ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _ttft(outcome: Outcome) -> float | None:
    return outcome.ttft


def _end(outcome: Outcome) -> float | None:
    return outcome.end
