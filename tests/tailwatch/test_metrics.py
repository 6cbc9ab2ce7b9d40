"""Which analysis /metrics exposes: the one the schedule ran, not whichever run was persisted last."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, generate_latest

from analytics import analyze, persist_analysis
from storage import Store
from tailwatch.metrics import TailMetrics

END = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def _window_end(registry: CollectorRegistry) -> float:
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("tailwatch_analysis_window_end_timestamp_seconds "):
            return float(line.split()[1])
    raise AssertionError("no window end series")


def test_the_scheduled_run_is_exposed_even_when_a_newer_run_exists(store: Store) -> None:
    scheduled = (END - timedelta(hours=1), END)
    persist_analysis(store, analyze(store, *scheduled))
    # Persisted later: the analysis behind an alert's link, over the rule's own (longer) window.
    persist_analysis(store, analyze(store, END - timedelta(days=1), END + timedelta(minutes=5)))

    registry = CollectorRegistry()
    metrics = TailMetrics(store, registry=registry, scheduled_window=lambda: scheduled)
    assert metrics.refresh()
    assert _window_end(registry) == END.timestamp()

    # Before the schedule has run in this process: the newest persisted run.
    newest = CollectorRegistry()
    fallback = TailMetrics(store, registry=newest, scheduled_window=lambda: None)
    assert fallback.refresh()
    assert _window_end(newest) == (END + timedelta(minutes=5)).timestamp()
