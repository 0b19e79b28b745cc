"""Errors a user can act on: each names the setting, the value given, and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


class ServingConfigError(ValueError):
    """A serving configuration that cannot work, raised at synth time before anything deploys."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = "invalid serving configuration:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(message)


def problem(setting: str, value: object, allowed: str) -> str:
    """One problem in the house wording: ``setting (value) <allowed>``."""
    return f"{setting} ({value!r}) {allowed}"


class Problems:
    """Collects every problem with a configuration so the user sees them all at once."""

    def __init__(self) -> None:
        self._items: list[str] = []

    def add(self, setting: str, value: object, allowed: str) -> None:
        self._items.append(problem(setting, value, allowed))

    def add_all(self, problems: Iterable[str]) -> None:
        self._items.extend(problems)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def raise_if_any(self) -> None:
        if self._items:
            raise ServingConfigError(self._items)
