"""The span sink: columnar inserts into ``otel_traces``.

:class:`SpanWriter` is the one-method boundary between the pipeline and a store;
:class:`StoreSpanWriter` is the ClickHouse implementation (Arrow in, one insert per batch).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collectors.schema import TRACES_TABLE
from storage import Store

__all__ = ["SpanWriter", "StoreSpanWriter", "span_keys"]


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

    def write(self, table: pa.Table) -> None:
        # One contiguous block per insert: ClickHouse makes one part per insert either way, and a
        # single chunk avoids per-chunk overhead in the client's Arrow stream.
        self.store.insert_arrow(self.table, table.combine_chunks())

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
