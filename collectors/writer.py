"""The span sink: columnar inserts into ``otel_traces``.

:class:`SpanWriter` is the one-method boundary between the pipeline and a store;
:class:`StoreSpanWriter` is the ClickHouse implementation (Arrow in, one insert per batch).

JSON tables (the Collector's ``json: true`` variant): the Arrow rows keep their ``Map`` attribute
columns and ClickHouse reads each map into the ``JSON`` column (a dotted key becomes a nested path,
values stay strings), as the ClickHouse-side mapping does with ``CAST(toJSONString(map), 'JSON')``.
A JSON object cannot hold a key twice: both paths keep a key's first value
(``type_json_skip_duplicated_paths``), and since the Arrow reader refuses a map with a repeated key
whatever that setting says, such maps are reduced to first values before the insert.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from collectors.layout import inspect_traces
from collectors.schema import TRACES_TABLE
from storage import Store

__all__ = ["JSON_INSERT_SETTINGS", "SpanWriter", "StoreSpanWriter", "insert_traces_arrow", "span_keys"]

# A repeated attribute key keeps its first value in a JSON column (an error otherwise).
JSON_INSERT_SETTINGS: dict[str, object] = {"type_json_skip_duplicated_paths": 1}
_ATTRIBUTE_COLUMNS = ("ResourceAttributes", "SpanAttributes", "Events.Attributes", "Links.Attributes")


def _maps(column: pa.ChunkedArray) -> pa.MapArray:
    """Every map of an attribute column (one per row, or one per event/link)."""
    array = column.combine_chunks()
    if pa.types.is_list(array.type) and not isinstance(array, pa.MapArray):
        array = array.flatten()
    assert isinstance(array, pa.MapArray)
    return array


def _has_repeated_keys(maps: pa.MapArray) -> bool:
    # Polars and numpy rather than Arrow compute kernels: those wait on Arrow's thread pool, which
    # stalled in a process running the embedded engine.
    keys = maps.keys
    if len(keys) == 0:
        return False
    owner = np.repeat(np.arange(len(maps)), np.diff(maps.offsets.to_numpy()))
    pairs = pl.DataFrame({"map": owner, "key": pl.from_arrow(keys)})
    return bool(pairs.is_duplicated().any())


def _first_values(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: set[str] = set()
    kept = []
    for key, value in pairs:
        if key not in seen:
            seen.add(key)
            kept.append((key, value))
    return kept


def _without_repeated_keys(column: pa.ChunkedArray) -> pa.Array:
    rows: list[Any] = column.to_pylist()
    if pa.types.is_list(column.type):
        rows = [[_first_values(m) for m in row] for row in rows]
    else:
        rows = [_first_values(m) for m in rows]
    return pa.array(rows, type=column.type)


def insert_traces_arrow(store: Store, table: str, data: pa.Table, json: bool) -> None:
    """Insert rows of the trace schema into ``table``, whose attribute columns are JSON if ``json``."""
    if not json:
        store.insert_arrow(table, data)
        return
    for name in _ATTRIBUTE_COLUMNS:
        column = data.column(name)
        if _has_repeated_keys(_maps(column)):  # rare: OTLP forbids it, some clients still do it
            data = data.set_column(data.schema.get_field_index(name), name, _without_repeated_keys(column))
    store.insert_arrow(table, data, settings=JSON_INSERT_SETTINGS)


class SpanWriter(Protocol):
    """Where batches go. ``write`` raises on failure; the pipeline keeps the batch and retries."""

    def write(self, table: pa.Table) -> None: ...

    def present(self, table: pa.Table) -> np.ndarray:
        """A boolean mask: which rows' (TraceId, SpanId) are already stored (used on replay)."""
        ...


def span_keys(table: pa.Table) -> pa.Array:
    return pc.binary_join_element_wise(table.column("TraceId"), table.column("SpanId"), "")


_IDS_PER_QUERY = 2_000  # 32-character ids: about 70 KB of parameter per query


class StoreSpanWriter:
    """Inserts Arrow batches into the store's ``otel_traces``."""

    def __init__(self, store: Store, table: str = TRACES_TABLE) -> None:
        self.store = store
        self.table = table
        self._json: bool | None = None

    def write(self, table: pa.Table) -> None:
        if self._json is None:
            # Read at the first write, when the pipeline has created the table if it was missing.
            self._json = inspect_traces(self.store, table=self.table).json
        # One contiguous block per insert: ClickHouse makes one part per insert either way, and a
        # single chunk avoids per-chunk overhead in the client's Arrow stream.
        insert_traces_arrow(self.store, self.table, table.combine_chunks(), self._json)

    def present(self, table: pa.Table) -> np.ndarray:
        if table.num_rows == 0:
            return np.zeros(0, dtype=bool)
        ts = table.column("Timestamp").cast(pa.int64())
        lo, hi = pc.min(ts).as_py(), pc.max(ts).as_py()
        trace_ids = pc.unique(table.column("TraceId")).to_pylist()
        # In slices: a ClickHouse server refuses a query parameter over 128 KiB by default.
        parts = [
            self.store.query_arrow(
                f"SELECT TraceId, SpanId FROM {self.store.table(self.table)} "
                "WHERE Timestamp >= fromUnixTimestamp64Nano({lo:Int64}) "
                "AND Timestamp <= fromUnixTimestamp64Nano({hi:Int64}) AND TraceId IN {ids:Array(String)}",
                {"lo": lo, "hi": hi, "ids": trace_ids[i : i + _IDS_PER_QUERY]},
            )
            for i in range(0, len(trace_ids), _IDS_PER_QUERY)
        ]
        found = pa.concat_tables(parts)
        if found.num_rows == 0:
            return np.zeros(table.num_rows, dtype=bool)
        mask = pc.is_in(span_keys(table), value_set=span_keys(found))
        return np.asarray(mask.to_numpy(zero_copy_only=False), dtype=bool)
