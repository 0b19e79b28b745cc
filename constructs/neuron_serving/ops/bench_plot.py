"""The PNG of ``neuron-serving bench``: time to first token and inter-token latency (p50 and p99)
against the load each profile achieved (completed requests per second), with the performance
model's predicted p50 and p99 beside each measured point where it has them.

Drawn with matplotlib's object API (a :class:`~matplotlib.figure.Figure` saved through its Agg
canvas), not pyplot: no global state and no display needed. matplotlib is imported only here and
only when a plot is drawn; it is the ``bench`` extra (``pip install cdk-neuron-serving[bench]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .aws import OpsError


@dataclass(frozen=True)
class Point:
    """One profile's figures on the plot.

    :param predicted_ttft_s: the model's time to first token at this profile's load, p50 and p99, if any.
    :param predicted_itl_ms: the model's inter-token latency at this profile's load, p50 and p99, if any.
    """

    label: str
    requests_per_second: float
    ttft_s: tuple[float, float]
    """p50 and p99."""
    itl_ms: tuple[float, float]
    """p50 and p99."""
    predicted_ttft_s: tuple[float, float] | None = None
    predicted_itl_ms: tuple[float, float] | None = None


def plot(points: Sequence[Point], title: str, path: Path) -> None:
    """Write the PNG of ``points`` (sorted by load) to ``path``."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise OpsError("drawing the plot needs matplotlib: pip install 'cdk-neuron-serving[bench]' (the JSON "
                       "results were written)") from None
    ordered = sorted(points, key=lambda p: p.requests_per_second)
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    figure.suptitle(title, fontsize=10)
    panels = figure.subplots(1, 2)
    for axes, (name, unit, measured, predicted) in zip(panels, (
        ("time to first token", "s", [p.ttft_s for p in ordered], [p.predicted_ttft_s for p in ordered]),
        ("inter-token latency", "ms", [p.itl_ms for p in ordered], [p.predicted_itl_ms for p in ordered]),
    ), strict=True):
        load = [p.requests_per_second for p in ordered]
        axes.plot(load, [m[0] for m in measured], marker="o", label="p50")
        axes.plot(load, [m[1] for m in measured], marker="s", label="p99")
        known = [(x, y) for x, pair in zip(load, predicted, strict=True) if pair is not None for y in pair]
        if known:
            axes.scatter([x for x, _ in known], [y for _, y in known], marker="x", s=60, color="black",
                         label="predicted p50, p99", zorder=3)
        if axes is panels[0]:  # once: the profiles sit at the same loads in both panels
            for point, x, (p50, _) in zip(ordered, load, measured, strict=True):
                axes.annotate(point.label, (x, p50), textcoords="offset points", xytext=(4, -12), fontsize=7)
        axes.set_title(name)
        axes.set_xlabel("completed requests per second")
        axes.set_ylabel(f"{name} ({unit})")
        highest = max([m[1] for m in measured] + [y for _, y in known], default=0.0)
        axes.set_ylim(0, highest * 1.15 or 1.0)  # from zero, with room above the highest point
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.savefig(path, format="png", dpi=100)
