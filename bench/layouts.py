"""Analysis cost on each trace-table layout, beside the Map layout and the scan floor of each store.

The same generated spans (:mod:`bench.analytics_data`) are written to a store in the Collector's
Map layout and to one in its JSON layout (``json: true``: attribute columns of ClickHouse's JSON
type, filled by parsing each map's JSON text, as the exporter's JSON insert does). For each store:
the floor (every column read and hashed once, as in :mod:`bench.analytics`) and ``analyze`` of
the current day; each figure is the best of ``--repeat`` runs in a fresh process.

    python -m bench.layouts --spans 1000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import analytics as analytics_bench
from bench.analytics import _machine

_JSON_TABLE = """
CREATE TABLE otel_traces (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)), TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)), ParentSpanId String CODEC(ZSTD(1)), TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)), SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)), ResourceAttributes JSON CODEC(ZSTD(1)),
    ResourceAttributesKeys Array(LowCardinality(String)) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)), ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes JSON CODEC(ZSTD(1)), SpanAttributesKeys Array(LowCardinality(String)) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)), StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (Timestamp DateTime64(9), Name LowCardinality(String), Attributes JSON) CODEC(ZSTD(1)),
    Links Nested (TraceId String, SpanId String, TraceState String, Attributes JSON) CODEC(ZSTD(1)),
    INDEX idx_res_attr_keys ResourceAttributesKeys TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_keys SpanAttributesKeys TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1
"""

_TO_JSON = """
INSERT INTO otel_traces
SELECT Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
       CAST(toJSONString(ResourceAttributes), 'JSON'), mapKeys(ResourceAttributes), ScopeName, ScopeVersion,
       CAST(toJSONString(SpanAttributes), 'JSON'), mapKeys(SpanAttributes),
       Duration, StatusCode, StatusMessage,
       `Events.Timestamp`, `Events.Name`, arrayMap(m -> CAST(toJSONString(m), 'JSON'), `Events.Attributes`),
       `Links.TraceId`, `Links.SpanId`, `Links.TraceState`,
       arrayMap(m -> CAST(toJSONString(m), 'JSON'), `Links.Attributes`)
FROM map_traces
"""


def _worker(mode: str, dsn: str, spans: int, repeat: int) -> dict[str, Any]:
    if mode not in ("generate-map", "generate-json"):
        # The floor and the analysis are timed exactly as bench.analytics times them.
        return analytics_bench._worker(mode, dsn, spans, repeat)
    from bench.analytics_data import generate
    from collectors import TRACES_MIGRATIONS
    from storage import ensure_schema, open_store

    with open_store(dsn) as store:
        started = time.perf_counter()
        ensure_schema(store, TRACES_MIGRATIONS[:1])
        rows = generate(store, spans)
        if mode == "generate-json":
            store.command("RENAME TABLE otel_traces TO map_traces")
            store.command(_JSON_TABLE)
            store.command(_TO_JSON, settings={"max_insert_threads": 2, "max_threads": 2})
            store.command("DROP TABLE map_traces")
        store.command("OPTIMIZE TABLE otel_traces FINAL")
        return {"rows": rows, "seconds": time.perf_counter() - started}


def _spawn(mode: str, dsn: str, spans: int, repeat: int) -> dict[str, Any]:
    return analytics_bench._spawn(mode, dsn, spans, repeat, module="bench.layouts")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.dsn, args.spans, args.repeat)))
        return
    print(f"machine: {_machine()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="tailwatch-bench-layouts-"))
    rows: dict[str, dict[str, float]] = {}
    try:
        for layout in ("map", "json"):
            dsn = f"chdb://{root / layout}"
            generated = _spawn(f"generate-{layout}", dsn, args.spans, 1)
            floor = _spawn("floor", dsn, args.spans, args.repeat)["seconds"]
            analysis = _spawn("analyze", dsn, args.spans, args.repeat)["seconds"]
            rows[layout] = {"floor": floor, "analyze": analysis}
            print(
                f"{layout:>4}: {generated['rows']:,} spans, floor {floor:.2f} s, analyze {analysis:.2f} s "
                f"({analysis / floor:.1f}x its floor)",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = rows["json"]["analyze"] / rows["map"]["analyze"]
    print(f"json/map analyze: {ratio:.2f}x")


if __name__ == "__main__":
    main()
