"""A text stream that writes to several: the tool runners (optimum_neuron.py, vllm_cli.py) keep what a tool
prints while it still reaches the terminal. Standard library only, as each runner runs in its tool's own venv."""

from __future__ import annotations

import io
from typing import Any


class Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def write(self, s: str) -> int:
        for stream in self._streams:
            stream.write(s)
        return len(s)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()
