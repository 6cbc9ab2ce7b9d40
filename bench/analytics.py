"""Analytics benchmark: the full analysis over 1M and 10M spans in the embedded store.

Run ``python -m bench.analytics`` (options: ``--sizes``, ``--pandas-max``, ``--repeat``,
``--rounds``). For each size a fresh store is filled in SQL (``bench/analytics_data.py``), then each
contender runs in its own process (peak RSS is that process's own) on the same store, one at a time:

* ``analyze`` — :func:`analytics.analyze` over the current day against the baseline day;
* ``floor``   — one ClickHouse query scanning every column the analysis reads, over both days;
* ``pandas``  — ``bench/pandas_baseline.py``: the spans read into pandas, same metrics there
  (only up to ``--pandas-max`` spans: beyond that it needs more memory than the analysis by far).

Wall time is the best of ``--repeat`` runs of the computation itself (opening the store excluded).
The floor and the analysis alternate for ``--rounds`` rounds (floor, analyze, floor, analyze, …):
a shared machine's speed drifts by tens of percent within minutes, so besides the best of each the
report gives the median over rounds of the analysis against the floor measured just before it.
The engine's query condition cache is switched off in every contender: it remembers which granules a
filter rejected, so a second identical analysis in the same process skips them (about 20% faster at
10M spans). A scheduled service gets that gain; the benchmark measures an analysis that has not run
before.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Hashing every value forces ClickHouse to read and decompress each column whole: ``length(x)`` would
# be answered from the size subcolumns alone and understate the scan.
FLOOR_SQL = """
SELECT count(),
       sum(cityHash64(TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, StatusCode)),
       sum(cityHash64(ResourceAttributes)), sum(cityHash64(SpanAttributes)),
       sum(cityHash64(`Links.TraceId`, `Links.SpanId`)), sum(Duration), max(Timestamp)
FROM otel_traces
WHERE Timestamp >= {lo:DateTime64(9)} AND Timestamp < {hi:DateTime64(9)}
"""


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _worker(mode: str, dsn: str, spans: int, repeat: int) -> dict[str, Any]:
    from bench.analytics_data import BASELINE_START, CURRENT_END, CURRENT_START, generate
    from storage import open_store

    with open_store(dsn) as store:
        store.command("SET use_query_condition_cache = 0")
        if mode == "generate":
            from collectors import TRACES_MIGRATIONS
            from storage import ensure_schema

            ensure_schema(store, TRACES_MIGRATIONS)
            started = time.perf_counter()
            rows = generate(store, spans)
            store.command("OPTIMIZE TABLE otel_traces FINAL")
            return {"rows": rows, "seconds": time.perf_counter() - started}
        times: list[float] = []
        for _ in range(repeat):
            started = time.perf_counter()
            if mode == "analyze":
                from analytics import analyze

                analyze(store, CURRENT_START, CURRENT_END)
            elif mode == "floor":
                store.query_rows(FLOOR_SQL, {"lo": BASELINE_START, "hi": CURRENT_END})
            elif mode == "pandas":
                from bench import pandas_baseline

                pandas_baseline.run(store, CURRENT_START, CURRENT_END)
            else:
                raise SystemExit(f"unknown mode {mode}")
            times.append(time.perf_counter() - started)
    return {"seconds": min(times), "runs": times, "peak_rss_mb": _peak_rss_mb()}


def _spawn(mode: str, dsn: str, spans: int, repeat: int, module: str = "bench.analytics") -> dict[str, Any]:
    """Run ``module``'s worker for ``mode`` in a fresh process; its JSON result."""
    cmd = [sys.executable, "-m", module, "--worker", mode, "--dsn", dsn, "--spans", str(spans),
           "--repeat", str(repeat)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _machine() -> str:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPUs ({model}), load average at start {load:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,10000000", help="comma-separated span counts")
    parser.add_argument("--pandas-max", type=int, default=1_000_000, help="largest size pandas runs at")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="floor/analyze pairs per size")
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--spans", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.dsn, args.spans, args.repeat)))
        return

    print(f"machine: {_machine()}", flush=True)
    results: list[dict[str, Any]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix="tw-bench-analytics-"))
        dsn = "chdb://" + str(workdir / "store")
        try:
            gen = _spawn("generate", dsn, size, 1)
            rounds = [
                (_spawn("floor", dsn, size, args.repeat), _spawn("analyze", dsn, size, args.repeat))
                for _ in range(max(1, args.rounds))
            ]
            floors, analyses = [f for f, _ in rounds], [a for _, a in rounds]
            # Best of the rounds for each; the analysis's peak RSS is the largest of its runs.
            row: dict[str, Any] = {
                "spans": gen["rows"],
                "generate_s": gen["seconds"],
                "floor": min(floors, key=lambda r: r["seconds"]),
                "analyze": {
                    **min(analyses, key=lambda r: r["seconds"]),
                    "peak_rss_mb": max(a["peak_rss_mb"] for a in analyses),
                },
                "paired": [a["seconds"] / f["seconds"] for f, a in rounds],
            }
            if size <= args.pandas_max:
                row["pandas"] = _spawn("pandas", dsn, size, 1)
            results.append(row)
            _print_row(row)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(_markdown(results))


def _print_row(row: dict[str, Any]) -> None:
    a, f = row["analyze"], row["floor"]
    line = (
        f"{row['spans']:>11,} spans: analyze {a['seconds']:.2f} s (peak RSS {a['peak_rss_mb']:.0f} MB), "
        f"floor {f['seconds']:.2f} s → {a['seconds'] / f['seconds']:.1f}× floor "
        f"(paired rounds: {', '.join(f'{r:.2f}' for r in row['paired'])}; "
        f"median {statistics.median(row['paired']):.2f}×)"
    )
    if "pandas" in row:
        p = row["pandas"]
        line += (
            f"; pandas {p['seconds']:.2f} s (peak RSS {p['peak_rss_mb']:.0f} MB) → "
            f"{p['seconds'] / a['seconds']:.1f}× slower than analyze"
        )
    print(line, flush=True)


def _markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| spans | analyze (s) | analyze peak RSS (MB) | floor (s) | analyze / floor | paired median | "
        "pandas (s) | pandas peak RSS (MB) | pandas / analyze |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results:
        a, f = row["analyze"], row["floor"]
        p = row.get("pandas")
        lines.append(
            f"| {row['spans']:,} | {a['seconds']:.2f} | {a['peak_rss_mb']:.0f} | {f['seconds']:.2f} | "
            f"{a['seconds'] / f['seconds']:.1f}× | {statistics.median(row['paired']):.2f}× | "
            + (
                f"{p['seconds']:.1f} | {p['peak_rss_mb']:.0f} | {p['seconds'] / a['seconds']:.1f}× |"
                if p
                else "— | — | — |"
            )
        )
    if len(results) >= 2:
        small, large = results[0], results[-1]
        growth = (large["analyze"]["seconds"] / small["analyze"]["seconds"]) / (
            large["spans"] / small["spans"]
        )
        lines.append("")
        lines.append(
            f"Growth {small['spans']:,} → {large['spans']:,} spans: time ×"
            f"{large['analyze']['seconds'] / small['analyze']['seconds']:.1f} for ×"
            f"{large['spans'] / small['spans']:.0f} data (1.0 = linear: {growth:.2f})."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
