"""Fit the performance model's constants on its published measurements and print them.

    python scripts/fit_performance.py
    python scripts/fit_performance.py --table

Least squares of the log of predicted over published, for every figure of
``neuron_serving.plan.performance.PUBLISHED``, over the logs of the five constants of
``Calibration`` (which keeps them positive), by Nelder-Mead from the shipped values. The printed
values are what ``performance.py`` ships, rounded to three significant figures; the script
changes nothing itself. ``--table`` prints instead the shipped model's error on every figure, as
docs/performance-model.md carries it (tests/plan/test_performance.py checks that it does).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields

from neuron_serving.plan.performance import CALIBRATION, PUBLISHED, Calibration, PublishedFigure, predict_published

Point = list[float]


def _calibration(point: Sequence[float]) -> Calibration:
    return Calibration(*(math.exp(x) for x in point))


def _loss(point: Sequence[float]) -> float:
    calibration = _calibration(point)
    return sum(math.log(predict_published(f, calibration) / f.value) ** 2 for f in PUBLISHED)


def _toward(centroid: Point, worst: Point, scale: float) -> Point:
    """The point ``scale`` of the way from ``centroid`` to ``worst`` (negative: beyond the centroid)."""
    return [c + scale * (w - c) for c, w in zip(centroid, worst, strict=True)]


def _nelder_mead(f: Callable[[Sequence[float]], float], start: Point, step: float = 0.3,
                 iterations: int = 20000, tolerance: float = 1e-14) -> Point:
    """The textbook Nelder-Mead simplex (reflection 1, expansion 2, contraction and shrink 1/2)."""
    simplex = [start] + [[x + (step if i == j else 0.0) for j, x in enumerate(start)] for i in range(len(start))]
    values = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / (len(simplex) - 1) for j in range(len(start))]
        worst = simplex[-1]
        reflected = _toward(centroid, worst, -1.0)
        r = f(reflected)
        if r < values[0]:
            expanded = _toward(centroid, worst, -2.0)
            e = f(expanded)
            simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
        elif r < values[-2]:
            simplex[-1], values[-1] = reflected, r
        else:
            contracted = _toward(centroid, worst, 0.5)
            c = f(contracted)
            if c < values[-1]:
                simplex[-1], values[-1] = contracted, c
            else:
                simplex = [simplex[0]] + [[b + 0.5 * (x - b) for b, x in zip(simplex[0], p, strict=True)]
                                          for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(len(simplex)), key=values.__getitem__)]


_METRICS = {
    "ms_per_output_token": "ms per output token",
    "ttft_s": "TTFT s, alone",
    "itl_ms": "ITL ms, alone",
    "step_ms": "decode step ms, every slot busy",
    "requests_per_second": "requests/s at saturation",
    "output_tokens_per_second": "output tokens/s at saturation",
}


def _row(figure: PublishedFigure) -> str:
    model = figure.model.removeprefix("llama-")
    replicas = f"{figure.replicas} x " if figure.replicas > 1 else ""
    server = "" if figure.served else ", no server"
    what = (f"{model} on {figure.instance}, {replicas}degree {figure.degree}, batch {figure.batch}, sequence "
            f"{figure.sequence}{server}: {_METRICS[figure.metric]}")
    predicted = predict_published(figure)
    source = next(short for start, short in _SOURCES if figure.source.startswith(start))
    return f"| {what} | [{source}]({figure.url}) | {figure.value:g} | {predicted:.4g} | " \
           f"{(predicted / figure.value - 1) * 100:+.1f}% |"


_SOURCES = (
    ("High performance Llama 2", "PyTorch blog, transformers-neuronx"),
    ("Optimum Neuron benchmark guide", "optimum-neuron guide, TGI"),
    ("optimum-neuron's TGI benchmark", "optimum-neuron benchmark, TGI"),
    ("optimum-neuron's vLLM", "optimum-neuron benchmark, vLLM"),
    ("optimum-neuron's static-batching", "optimum-neuron static batching"),
)
"""A short name for each source of PUBLISHED, by the start of its title."""


def table() -> str:
    """The shipped model against every published figure, as a Markdown table."""
    rows = ["| figure (Llama) | source | published | model | error |", "|---|---|---|---|---|"]
    return "\n".join(rows + [_row(figure) for figure in PUBLISHED])


def main() -> None:
    if "--table" in sys.argv[1:]:
        print(table())
        return
    start = [math.log(getattr(CALIBRATION, name.name)) for name in fields(Calibration)]
    fitted = _calibration(_nelder_mead(_loss, start))
    for name in fields(Calibration):
        print(f"{name.name.upper()} = {getattr(fitted, name.name):.3g}")
    print()
    rounded = Calibration(*(float(f"{getattr(fitted, name.name):.3g}") for name in fields(Calibration)))
    for figure in PUBLISHED:
        predicted = predict_published(figure, rounded)
        print(f"{figure.name:<55} published {figure.value:>8g}  predicted {predicted:>8.4g}  "
              f"{(predicted / figure.value - 1) * 100:+6.1f}%")


if __name__ == "__main__":
    main()
