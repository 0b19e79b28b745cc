"""What the operator's commands print: tables and progress for people (with rich, which draws
them and leaves colours and cursor movement out when stdout is not a terminal or NO_COLOR is
set), or one JSON document for scripts (``--output json``)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

TEXT = "text"
JSON = "json"

Clock = Callable[[], dt.datetime]
Sleep = Callable[[float], None]
"""The clock and the wait of the commands that look again (``status --watch``, ``logs --follow``),
given to them by tests."""

OUTCOME_STYLES = {"pass": "green", "ready": "green", "warn": "yellow", "fail": "bold red", "failed": "bold red"}
"""How a cell that states an outcome is coloured (on a terminal)."""


def positive_seconds(text: str) -> float:
    """An option's number of seconds, more than 0 (an argparse ``type``: argparse names the option)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def output_option() -> argparse.ArgumentParser:
    """A parent parser with ``--output text|json``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--output", choices=(TEXT, JSON), default=TEXT,
                        help="text for people (default), or one JSON document on stdout for scripts")
    return parent


class Printer:
    """Prints a command's results as text or JSON, on ``stream`` (stdout by default)."""

    def __init__(self, output: str = TEXT, stream: TextIO | None = None) -> None:
        self.json = output == JSON
        self.stream = stream or sys.stdout
        # width: a wide table wraps its cells rather than being cut when the stream is no terminal.
        self.console = Console(file=self.stream, highlight=False, soft_wrap=False,
                               width=None if self.stream.isatty() else 160)

    def document(self, value: Any) -> None:
        """``value`` as one JSON document (with ``--output json``)."""
        json.dump(value, self.stream, indent=2, sort_keys=True, default=str)
        self.stream.write("\n")
        self.stream.flush()

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
              outcome_column: int | None = None) -> Table:
        """A table of ``rows``, whose ``outcome_column`` cells are coloured by :data:`OUTCOME_STYLES`."""
        table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
        for header in headers:
            table.add_column(header, overflow="fold")
        for row in rows:
            cells = [str(cell) for cell in row]
            if outcome_column is not None:
                style = OUTCOME_STYLES.get(cells[outcome_column].lower())
                if style:
                    cells[outcome_column] = f"[{style}]{cells[outcome_column]}[/]"
            table.add_row(*cells)
        return table

    def plain(self, *lines: str) -> None:
        """Lines written as they are: no wrapping at the console's width, no markup, no emoji. For
        output that lays itself out (``plan``'s table) or that a script captures whole (a new API key)."""
        for line in lines:
            self.stream.write(line + "\n")
        self.stream.flush()

    def print(self, *things: Any) -> None:
        """Text for people (rich renderables or strings, whose ``[`` is taken literally)."""
        for thing in things:
            if isinstance(thing, str):
                self.console.print(thing, markup=False)
            else:
                self.console.print(thing)
