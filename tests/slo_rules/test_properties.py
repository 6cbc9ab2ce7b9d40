"""Invariants of the lifecycle and of rule parsing, over generated inputs."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slo_rules.state import AlertState, advance
from storage import format_duration, parse_duration

T = datetime(2026, 11, 2, tzinfo=UTC)
LABELS = {"alertname": "x", "severity": "page"}
TEN_YEARS = timedelta(days=3650)  # the longest duration the grammar accepts


@settings(max_examples=300, deadline=None)
@given(
    active=st.lists(st.booleans(), min_size=1, max_size=60),
    for_minutes=st.sampled_from([None, 0, 1, 3, 10]),
)
def test_transitions_alternate_and_respect_for(active: list[bool], for_minutes: int | None) -> None:
    for_ = None if for_minutes is None else timedelta(minutes=for_minutes)
    state: AlertState | None = None
    transitions: list[tuple[str, int]] = []
    streak = 0
    for minute, on in enumerate(active):
        streak = streak + 1 if on else 0
        state, transition = advance(
            state,
            on,
            T + timedelta(minutes=minute),
            for_=for_,
            repeat_interval=timedelta(days=365),
            labels=LABELS,
            annotations={},
            rule="x",
        )
        if transition is not None:
            transitions.append((transition, minute))
            if transition == "firing":
                # Fires only once the condition held for `for` without interruption.
                assert (streak - 1) >= (for_minutes or 0)
                assert state is not None and state.starts_at == T + timedelta(minutes=minute - streak + 1)
        if state is not None and state.state == "firing":
            assert on
    kinds = [t for t, _ in transitions]
    # Never paged twice for one episode, never resolved without having fired.
    assert all(a != b for a, b in itertools.pairwise(kinds))
    assert not kinds or kinds[0] == "firing"


@given(st.integers(min_value=1, max_value=10**7), st.sampled_from(["ms", "s", "m", "h", "d", "w"]))
def test_duration_round_trip(amount: int, unit: str) -> None:
    seconds = amount * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    if seconds > TEN_YEARS.total_seconds():  # a typo, and an overflow of date arithmetic: refused
        with pytest.raises(ValueError, match="longer than 10 years"):
            parse_duration(f"{amount}{unit}")
        return
    value = parse_duration(f"{amount}{unit}")
    assert parse_duration(format_duration(value)) == value
