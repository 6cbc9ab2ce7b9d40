"""The scale benchmark's data: days of traffic at millions of spans a day, built in SQL.

The spans are :mod:`bench.analytics_data`'s shapes (hot requests of 5 spans with a synchronous LLM
call, queued jobs of 3 spans with a linked consumer and its LLM call, agent workflows of 5 spans
with a retried hop or a tool call), spread evenly over ``days`` days ending at :data:`SCALE_END`,
one insert per day and shape, then merged into one part per day (``OPTIMIZE … FINAL``) as every
benchmark's store is. The last day's tail is slower (the LLM call for chat-api, db.query for
search-api) and every service releases a version every 12 hours.

Usage::

    volume = Volume(spans_per_day=6_500_000, days=8)
    with open_store(dsn) as store:
        fill(store, volume)                       # 52M spans over [volume.start, volume.end)
        analyze(store, *volume.last_day)          # the last day against the day before
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bench.analytics_data import generate
from storage import Store

__all__ = ["SCALE_END", "Volume", "fill", "fill_days_ending", "span_table_bytes"]

# A fixed end (a Monday, midnight UTC): the same run gives the same spans wherever and whenever it runs.
SCALE_END = datetime(2026, 11, 9, tzinfo=UTC)

_DAY = timedelta(days=1)

Window = tuple[datetime, datetime]


@dataclass(frozen=True)
class Volume:
    """``days`` days of traffic at ``spans_per_day`` spans a day, ending at ``end``."""

    spans_per_day: int
    days: int
    end: datetime = SCALE_END

    def __post_init__(self) -> None:
        if self.spans_per_day < 1000:
            raise ValueError(f"spans_per_day must be at least 1000 (got {self.spans_per_day})")
        if self.days < 2:
            raise ValueError(f"days must be at least 2: the last day and its baseline (got {self.days})")

    @property
    def spans(self) -> int:
        return self.spans_per_day * self.days

    @property
    def start(self) -> datetime:
        return self.end - self.days * _DAY

    @property
    def whole(self) -> Window:
        """Every span of the volume."""
        return self.start, self.end

    @property
    def last_day(self) -> Window:
        return self.end - _DAY, self.end

    @property
    def last_day_read(self) -> Window:
        """What an analysis of the last day reads: that day and its baseline, the day before."""
        return self.end - 2 * _DAY, self.end

    @property
    def last_week(self) -> Window:
        """The last 7 days (holding ``days`` days of spans when there are fewer than 7)."""
        return self.end - 7 * _DAY, self.end

    def label(self) -> str:
        return f"{self.spans_per_day / 1e6:g}M spans/day × {self.days} days"


def fill(store: Store, volume: Volume, progress: Callable[[str], None] | None = None) -> int:
    """Create the span table and insert ``volume``'s spans, a day at a time; returns the rows."""
    return fill_days_ending(store, volume.spans, volume.end, volume.days, progress, chunks=volume.days)


def fill_days_ending(
    store: Store,
    spans: int,
    end: datetime,
    days: int = 2,
    progress: Callable[[str], None] | None = None,
    *,
    chunks: int = 1,
) -> int:
    """Create the span table and insert about ``spans`` spans over the ``days`` days ending at ``end``
    (the last one slower), merged into one part per day; returns the rows."""
    from collectors import TRACES_MIGRATIONS
    from storage import ensure_schema

    ensure_schema(store, TRACES_MIGRATIONS)
    rows = generate(store, spans, start=end - days * _DAY, days=days, chunks=chunks, progress=progress)
    if progress is not None:
        progress(f"{rows:,} spans inserted; merging the parts (OPTIMIZE TABLE otel_traces FINAL)")
    store.command("OPTIMIZE TABLE otel_traces FINAL")
    return rows


def span_table_bytes(store: Store) -> int:
    """Bytes on disk of the span table's active parts (its trace-id view excluded)."""
    value = store.query_value(
        "SELECT sum(bytes_on_disk) FROM system.parts "
        "WHERE active AND database = currentDatabase() AND table = 'otel_traces'"
    )
    return int(value or 0)
