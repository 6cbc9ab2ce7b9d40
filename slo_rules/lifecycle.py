"""Candidates → alert states and transitions: every alert of one evaluation takes one step.

Each candidate advances the alert its labels identify (:func:`slo_rules.state.advance`); alerts no
candidate mentions any more resolve, except those of rules that failed this time, which keep their
state (an outage of the analysis never resolves a firing alert). A firing alert keeps the
annotations it fired with; only an alert that starts is explained (an attribution analysis).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from slo_rules.kinds import Candidate
from slo_rules.state import AlertState, Transition, advance, fingerprint

__all__ = ["GONE", "Changes", "advance_alerts"]

log = logging.getLogger("tailwatch.slo_rules")

# Why an alert resolves when its rule no longer mentions it at all.
GONE = "no longer seen: nothing its rule selects had data in the rule's window"


@dataclass
class Changes:
    """What one evaluation changes: state rows to write, and the transitions to notify."""

    states: list[AlertState] = field(default_factory=list)
    transitions: list[tuple[AlertState, Transition]] = field(default_factory=list)

    def add(self, state: AlertState | None, transition: Transition | None, prev: AlertState | None) -> None:
        if state is None:
            return
        # An unchanged alert writes no row: a quiet evaluation costs no inserts.
        unchanged = (
            prev is not None
            and transition is None
            and prev.state == state.state
            and prev.active_since == state.active_since
            and prev.annotations == state.annotations
        )
        if not unchanged:
            self.states.append(state)
        if transition is not None:
            self.transitions.append((state, transition))

    def events(self, at: datetime) -> list[tuple[AlertState, Literal["firing", "resolved"], datetime]]:
        """The history rows: firing and resolved transitions (repeats are not history)."""
        return [
            (state, "firing" if transition == "firing" else "resolved", at)
            for state, transition in self.transitions
            if transition in ("firing", "resolved")
        ]


def advance_alerts(
    candidates: Sequence[Candidate],
    previous: Mapping[str, AlertState],
    at: datetime,
    *,
    repeat_interval: timedelta,
    failed: Collection[str] = (),
) -> Changes:
    """Advance every alert a candidate names, then resolve the ones no candidate names any more."""
    changes = Changes()
    seen: set[str] = set()
    faster: dict[str, list[AlertState]] = {}
    # Burn-rate tiers go fastest first, so a slower tier sees whether a faster one fires.
    for cand in sorted(candidates, key=lambda c: (c.group, c.rank)):
        fp = fingerprint(cand.labels)
        if fp in seen:
            continue
        seen.add(fp)
        prev = previous.get(fp)
        # A firing alert keeps what it fired with (slo_rules.state.advance): no new explanation.
        explain = cand.active and (prev is None or prev.state != "firing")
        annotations = _annotations(cand) if explain else {}
        state, transition = advance(
            prev,
            cand.active,
            at,
            for_=cand.rule.for_,
            repeat_interval=repeat_interval,
            labels=cand.labels,
            annotations=annotations or (dict(prev.annotations) if prev else {}),
            rule=cand.rule.name,
            suppressed=_suppressed(faster.get(cand.group, []), cand.long_window, at),
            now=cand.reason,
        )
        latest = state or prev
        if cand.group and latest is not None:
            faster.setdefault(cand.group, []).append(latest)
        changes.add(state, transition, prev)

    # Alerts whose condition no longer shows up at all (the operation went quiet) resolve too.
    for fp, prev in previous.items():
        if fp in seen or prev.rule in failed or prev.state not in ("pending", "firing"):
            continue
        state, transition = advance(
            prev,
            False,
            at,
            for_=None,
            repeat_interval=repeat_interval,
            labels=prev.labels,
            annotations=prev.annotations,
            rule=prev.rule,
            now=GONE,
        )
        changes.add(state, transition, prev)
    return changes


def _annotations(cand: Candidate) -> dict[str, str]:
    try:
        return cand.annotations()
    except Exception as exc:
        # The alert still fires (its condition holds); only the explanation is missing.
        log.exception("annotations of %s could not be computed", cand.rule.name)
        return {"summary": f"{cand.rule.name}: {type(exc).__name__}: {exc}", "cause": "none"}


def _suppressed(faster: Sequence[AlertState], long_window: timedelta | None, at: datetime) -> bool:
    """A slower burn-rate tier stays quiet while a faster tier of the same SLO fires, and for its own
    long window after that tier resolved: the budget it sees burning is the burn already notified."""
    if long_window is None:
        return False
    for state in faster:
        if state.state == "firing":
            return True
        if state.state == "resolved" and state.ends_at is not None and state.ends_at > at - long_window:
            return True
    return False
