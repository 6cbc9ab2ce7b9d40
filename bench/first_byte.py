"""What reading streamed endpoints' first byte costs a raw analysis, beside the roots it joins.

Run ``python -m bench.first_byte`` (default: 1M spans a day over 2 days, :mod:`bench.scale_data`'s
shapes). A fresh embedded store is filled in SQL; then every hot request gets the send spans the
ASGI instrumentation writes for a streamed answer (``http.response.start`` at once, four
``http.response.body`` sends spread over the request, the last at its end), inserted in SQL from
the roots. For the last day (and its baseline, as an analysis reads them), each figure is the best
of ``--repeat`` runs:

* ``roots`` — the hot-path roots' read (:func:`analytics.llm_spans.roots_sql`);
* ``first bytes`` — the added read (:func:`analytics.llm_spans.first_bytes_sql`: the send spans
  grouped per trace and service in ClickHouse);
* ``fetch_roots`` with the first byte (both reads and the join) against ``first_byte_attribute =
  ""`` (the roots alone), the ratio the feature adds to that step;
* the whole raw analysis of the last day (``analyze(..., use_summaries=False)``, every frame) with
  and without the first byte: what the feature adds to a window nothing has summarised yet.

The table goes to stdout with the machine, every number to ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from analytics import Conventions, analyze
from analytics._common import Windows
from analytics.llm_spans import fetch_roots, first_bytes_sql, roots_sql
from bench import best_of
from bench.scale_data import fill_days_ending
from collectors import TRACES_TABLE, inspect_traces
from storage import Store, open_store

# Per Server root: the response start, then four body sends spread over the request (the last at
# its end), each a 10 µs Internal child named as the instrumentation names it.
_SENDS_SQL = """
INSERT INTO otel_traces (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
                         ResourceAttributes, SpanAttributes, Duration, StatusCode)
SELECT t + toIntervalNanosecond(intDiv(d * i, 4)), tid, lower(hex(cityHash64(sid, i))), sid,
       concat(name, ' http send'), 'Internal', service, resource,
       map('asgi.event.type', if(i = 0, 'http.response.start', 'http.response.body')), 10000, 'Unset'
FROM (
    -- Renamed first: a ClickHouse alias is visible in the whole query, WHERE included.
    SELECT Timestamp AS t, TraceId AS tid, SpanId AS sid, SpanName AS name, ServiceName AS service,
           ResourceAttributes AS resource, Duration AS d
    FROM otel_traces WHERE ParentSpanId = '' AND SpanKind = 'Server'
) ARRAY JOIN [0, 1, 2, 3, 4] AS i
"""


def _query(store: Store, sql: str, windows: Windows, conv: Conventions) -> int:
    params = {**conv.sql_parameters(), **windows.params(conv)}
    return store.query_polars(inspect_traces(store).adapt(sql), params).height


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--volume", type=float, default=1.0, help="M spans a day")
    parser.add_argument("--days", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args()
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    root = Path(tempfile.mkdtemp(prefix="tw-bench-first-byte-"))
    out: dict[str, Any] = {"volume_m_per_day": args.volume, "days": args.days}
    try:
        store = open_store(f"chdb://{root / 'store'}")
        rows = fill_days_ending(store, int(args.volume * 1e6 * args.days), end, args.days, chunks=args.days)
        store.command(_SENDS_SQL)
        store.command("OPTIMIZE TABLE otel_traces FINAL")
        out["spans"] = int(store.query_value("SELECT count() FROM otel_traces"))
        print(f"filled {rows:,} spans, {out['spans'] - rows:,} send spans added", file=sys.stderr)
        windows = Windows.of(end - timedelta(days=1), end)
        table = store.table(TRACES_TABLE)
        conv, without = Conventions(), Conventions(first_byte_attribute="")
        roots = best_of(partial(_query, store, roots_sql(table), windows, conv), args.repeat)
        sends = best_of(partial(_query, store, first_bytes_sql(table), windows, conv), args.repeat)
        fetched = best_of(partial(fetch_roots, store, windows, conv), args.repeat)
        alone = best_of(partial(fetch_roots, store, windows, without), args.repeat)
        requests = int(fetch_roots(store, windows, conv)["first_byte_ms"].is_not_null().sum())
        raw = partial(analyze, store, windows.start, windows.end, use_summaries=False)
        whole = best_of(partial(raw, conventions=conv), args.repeat)
        whole_alone = best_of(partial(raw, conventions=without), args.repeat)
        out.update(roots_s=roots, first_bytes_s=sends, fetch_roots_s=fetched, fetch_roots_alone_s=alone)
        out.update(raw_analysis_s=whole, raw_analysis_alone_s=whole_alone)
        out["requests_with_first_byte"] = requests
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {load:.1f}; "
        f"{out['spans']:,} spans over {args.days} days; "
        f"{out['requests_with_first_byte']:,} requests with a first byte in the last day's read"
    )
    print("| step (last day + baseline) | time | ratio |")
    print("|---|---:|---:|")
    print(f"| roots read | {roots:.2f} s | 1.00× |")
    print(f"| first bytes read (send spans grouped in ClickHouse) | {sends:.2f} s | {sends / roots:.2f}× |")
    print(f"| fetch_roots without the first byte | {alone:.2f} s | {alone / roots:.2f}× |")
    print(f"| fetch_roots with the first byte | {fetched:.2f} s | {fetched / roots:.2f}× |")
    print(
        "| **raw analysis of the last day** without the first byte | "
        f"{out['raw_analysis_alone_s']:.2f} s | 1.00× |"
    )
    print(
        f"| … with the first byte | {out['raw_analysis_s']:.2f} s | "
        f"{out['raw_analysis_s'] / out['raw_analysis_alone_s']:.2f}× |"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
