"""Errors of the rule engine: one :class:`RuleError` carrying every problem found, each with file and line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from storage import TailwatchError

__all__ = ["DeliveryError", "RuleError", "RuleProblem"]


@dataclass(frozen=True)
class RuleProblem:
    """One problem in a rule file. ``line`` is 1-based; 0 when the problem is the file itself."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else f"{self.file}: {self.message}"


class RuleError(TailwatchError):
    """Rule files that do not validate. ``problems`` lists every problem, the message names the first."""

    def __init__(self, problems: Sequence[RuleProblem]) -> None:
        self.problems = tuple(problems)
        first = str(self.problems[0]) if self.problems else "invalid rules"
        more = len(self.problems) - 1
        suffix = (
            f" (and {more} more problem{'s' if more > 1 else ''}; run `tailwatch rules check`)"
            if more
            else ""
        )
        super().__init__(first + suffix)


class DeliveryError(TailwatchError):
    """A notifier is misconfigured (for example its secret or routing key variable is not set)."""
