"""What the model call's anatomy costs a window's analysis, beside the hot path's reduction.

Run ``python -m bench.anatomy`` (default: 1M spans a day over 8 days, :mod:`bench.scale_data`'s
shapes, whose hot-path model calls record a time to first chunk and cached input tokens). A fresh
embedded store is filled in SQL and summarised (:func:`analytics.build_summaries`); then, for the
last day and the last 7 days, each figure is the best of ``--repeat`` runs of a fresh lazy analysis
from the summaries (:func:`analytics.analyze` with ``lazy=True``) reading one frame:

* ``llm_anatomy`` — the per-minute anatomy histograms merged in ClickHouse, the call sums beside
  them, the partial minutes' calls bucketed in Polars, the fits;
* ``hot_path`` — the per-minute latency histograms merged the same way: the baseline, a reduction of
  the same shape over the requests instead of the calls;
* ``llm_costs`` — what a hot request costs: the per-minute sums of the requests' synchronous calls
  and tokens per version and model merged in ClickHouse, priced in Polars;
* the **floor**: one scan of the window's model-call spans' attribute maps (every key and value
  hashed, so the map columns are read and decompressed whole) — what reading the anatomy from raw
  spans would at least cost.

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
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

from analytics import analyze, build_summaries
from bench import best_of
from bench.scale_data import fill_days_ending
from storage import open_store

_FLOOR_SQL = """
SELECT count(), sum(cityHash64(SpanAttributes.keys, SpanAttributes.values))
FROM otel_traces
WHERE Timestamp >= {a:DateTime64(9)} AND Timestamp < {b:DateTime64(9)} AND SpanKind = 'Client'
SETTINGS use_query_condition_cache = 0
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--volume", type=float, default=1.0, help="M spans a day")
    parser.add_argument("--days", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args()
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    root = Path(tempfile.mkdtemp(prefix="tw-bench-anatomy-"))
    out: dict[str, Any] = {"volume_m_per_day": args.volume, "days": args.days}
    try:
        store = open_store(f"chdb://{root / 'store'}")
        t0 = time.perf_counter()
        rows = fill_days_ending(store, int(args.volume * 1e6 * args.days), end, args.days, chunks=args.days)
        out["spans"] = rows
        out["fill_s"] = time.perf_counter() - t0
        print(f"filled {rows:,} spans in {out['fill_s']:.1f} s", file=sys.stderr)
        t0 = time.perf_counter()
        build_summaries(store, until=end)
        out["summaries_s"] = time.perf_counter() - t0
        print(f"summarised in {out['summaries_s']:.1f} s", file=sys.stderr)
        table = []
        for label, days in (("last day", 1), ("last 7 days", 7)):
            start = end - timedelta(days=days)

            def frame(name: str, start: datetime = start) -> Any:
                return getattr(analyze(store, start, end, lazy=True), name)

            anatomy = best_of(partial(frame, "llm_anatomy"), args.repeat)
            hot = best_of(partial(frame, "hot_path"), args.repeat)
            costs = best_of(partial(frame, "llm_costs"), args.repeat)
            # The window and its baseline (the same length before it), as the analysis reads them.
            params = {"a": start - (end - start), "b": end}
            floor = best_of(partial(store.query_rows, _FLOOR_SQL, params), args.repeat)
            models = analyze(store, start, end, lazy=True).llm_anatomy.height
            out[label] = {
                "anatomy_s": anatomy,
                "hot_path_s": hot,
                "llm_costs_s": costs,
                "floor_s": floor,
                "rows": models,
            }
            table.append((label, anatomy, hot, costs, floor))
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load {load:.1f}; "
        f"{out['spans']:,} spans over {args.days} days, summaries built in {out['summaries_s']:.1f} s"
    )
    print(
        "| window | llm_anatomy | llm_costs | hot_path (baseline) | ratios to it | "
        "floor: scan of the calls' maps | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, anatomy, hot, costs, floor in table:
        print(
            f"| {label} | {anatomy:.2f} s | {costs:.2f} s | {hot:.2f} s | {anatomy / hot:.2f}×, "
            f"{costs / hot:.2f}× | {floor:.2f} s | {anatomy / floor:.2f}× |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
