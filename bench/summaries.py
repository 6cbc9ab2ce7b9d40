"""Summaries benchmark: what the per-minute summaries cost to build and what they save afterwards.

Run ``python -m bench.summaries`` (options: ``--sizes``, ``--repeat``, ``--keep``). For each size one
store is filled in SQL (``bench/analytics_data.py``: a baseline day and a current day) and copied
whole: store A keeps only the spans, store B gets the summaries. Each contender runs in its own
process (peak RSS is that process's own) on one of the two stores, one at a time:

* ``catch-up``        — :func:`analytics.build_summaries` over the spans of store B, from nothing, as
  far as a service running 30 minutes before the end of the current day has summarised (its
  settle delay back; run once: a second run finds nothing to do);
* ``full-analysis``   — :func:`analytics.analyze` of the current day against the baseline day on store
  A with ``use_summaries=False``: every span read. It is also the ``day`` contender's full recompute;
* ``steady-evaluate`` — the shipped rule pack (:data:`slo_rules.DEFAULT_RULES_PATH`, windows of 1 h
  and 1 d) evaluated 30 minutes before the end of the current day once, untimed, then again one
  minute later, timed (each repeat one more minute later). On store B the service's job first
  summarises the minute that settled since (timed apart: ``minute build``), and the windows are read
  from the summaries and, for their last minutes (the settle delay), from the spans; on store A (no
  summaries) every evaluation recomputes from the spans;
* ``floor``           — the scan floor of :mod:`bench.analytics` (every column the analysis reads,
  hashed) over both days on store A;
* ``day``             — ``analyze`` of the current day from the summaries (store B; its last half
  hour is not summarised and is read from the spans);
* ``30-day window``   — ``analyze`` of the 30 days ending with the current day, from the summaries
  (store B) and from the spans (store A). The data covers two days only: the other 28 days (and the
  30-day baseline before them) are empty, so this shows what a long window costs when little of it
  holds data, not a month of spans.

Wall time is the best of ``--repeat`` runs of the computation itself (opening the store excluded).
The engine's query condition cache is switched off in every contender, as in :mod:`bench.analytics`.
The acceptance ratios printed at the end: steady-evaluate at the largest size over the smallest
(target ≤ 1.5), steady-evaluate over the floor at the same size (target ≤ 0.3), catch-up over one
full analysis (target ≤ 1), and the day from summaries over its full recompute.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench.analytics import _machine, _peak_rss_mb, _spawn

MODULE = "bench.summaries"
STEADY_OFFSET = timedelta(minutes=30)  # the steady evaluation's first time, before the day's end
WINDOW_DAYS = 30

# Targets the acceptance sets for the ratios (the figure must not exceed them).
TARGET_STEADY_GROWTH = 1.5
TARGET_STEADY_FLOOR = 0.3
TARGET_CATCH_UP = 1.0


def _worker(mode: str, dsn: str, spans: int, repeat: int) -> dict[str, Any]:
    from bench.analytics_data import CURRENT_END, CURRENT_START
    from storage import open_store

    with open_store(dsn) as store:
        store.command("SET use_query_condition_cache = 0")
        if mode == "catch-up":
            from analytics import build_summaries

            started = time.perf_counter()
            build = build_summaries(store, until=_summarised_until(CURRENT_END - STEADY_OFFSET))
            seconds = time.perf_counter() - started
            return {
                "seconds": seconds,
                "runs": [seconds],
                "minutes": build.minutes,
                "rows": sum(build.rows.values()),
                "describe": build.describe(),
                "peak_rss_mb": _peak_rss_mb(),
            }
        if mode in ("steady-summaries", "steady-raw"):
            from slo_rules import DEFAULT_RULES_PATH, evaluate, load_rules

            rules = load_rules([DEFAULT_RULES_PATH])
            at = CURRENT_END - STEADY_OFFSET
            started = time.perf_counter()
            first = evaluate(store, rules, at, dashboard_links=False)
            first_s = time.perf_counter() - started
            times: list[float] = []
            builds: list[float] = []
            result = first
            for i in range(repeat):
                now = at + timedelta(minutes=1 + i)
                if mode == "steady-summaries":
                    # What the service's job does between two evaluations: the minute that settled.
                    from analytics import build_summaries

                    started = time.perf_counter()
                    build_summaries(store, until=_summarised_until(now))
                    builds.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = evaluate(store, rules, now, dashboard_links=False)
                times.append(time.perf_counter() - started)
            return {
                "seconds": min(times),
                "runs": times,
                "first_s": first_s,
                "minute_build_s": min(builds) if builds else None,
                "describe": str(result),
                "peak_rss_mb": _peak_rss_mb(),
            }
        from analytics import analyze

        if mode in ("full", "day"):
            start, end, summaries = CURRENT_START, CURRENT_END, mode == "day"
        elif mode in ("window-summaries", "window-raw"):
            start, end = CURRENT_END - timedelta(days=WINDOW_DAYS), CURRENT_END
            summaries = mode == "window-summaries"
        else:
            raise SystemExit(f"unknown mode {mode}")
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            analyze(store, start, end, use_summaries=summaries)
            times.append(time.perf_counter() - started)
    return {"seconds": min(times), "runs": times, "peak_rss_mb": _peak_rss_mb()}


def _summarised_until(now: datetime) -> datetime:
    """How far a service running at ``now`` has summarised: the summaries' settle delay back."""
    from analytics import Conventions
    from analytics.summaries import summary_settle

    return now - summary_settle(Conventions())


def _run(mode: str, dsn: str, size: int, repeat: int) -> dict[str, Any]:
    return _spawn(mode, dsn, size, repeat, module=MODULE)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="1000000,10000000", help="comma-separated span counts")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the generated stores")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--spans", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.dsn, args.spans, args.repeat)))
        return

    print(f"machine: {_machine()}", flush=True)
    repeat = max(1, args.repeat)
    results: list[dict[str, Any]] = []
    for size in (int(s) for s in args.sizes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix="tw-bench-summaries-"))
        raw_dsn = "chdb://" + str(workdir / "raw")
        summarised_dsn = "chdb://" + str(workdir / "summarised")
        try:
            gen = _spawn("generate", raw_dsn, size, 1)
            # The engine links its databases and tables into its store by relative symlinks: copied as
            # links they point into the copy.
            shutil.copytree(workdir / "raw", workdir / "summarised", symlinks=True)
            row: dict[str, Any] = {"spans": gen["rows"], "generate_s": gen["seconds"]}
            row["catch_up"] = _run("catch-up", summarised_dsn, size, 1)
            row["full"] = _run("full", raw_dsn, size, repeat)
            row["floor"] = _spawn("floor", raw_dsn, size, repeat)
            row["steady"] = _run("steady-summaries", summarised_dsn, size, repeat)
            row["steady_raw"] = _run("steady-raw", raw_dsn, size, repeat)
            row["day"] = _run("day", summarised_dsn, size, repeat)
            row["window"] = _run("window-summaries", summarised_dsn, size, repeat)
            row["window_raw"] = _run("window-raw", raw_dsn, size, repeat)
            results.append(row)
            _print_row(row)
        finally:
            if args.keep:
                print(f"stores kept in {workdir}", flush=True)
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(_markdown(results))


def _s(r: dict[str, Any]) -> str:
    return f"{r['seconds']:.2f} s ({r['peak_rss_mb']:.0f} MB)"


def _print_row(row: dict[str, Any]) -> None:
    c, full, f = row["catch_up"], row["full"], row["floor"]
    st, raw = row["steady"], row["steady_raw"]
    print(
        f"{row['spans']:>11,} spans (generated in {row['generate_s']:.1f} s):\n"
        f"  catch-up {_s(c)}: {c['describe']} → {c['seconds'] / full['seconds']:.2f}× full-analysis\n"
        f"  full-analysis {_s(full)}; floor {_s(f)}\n"
        f"  steady-evaluate from summaries {_s(st)} (first evaluation {st['first_s']:.2f} s; "
        f"{st['describe']}) → {st['seconds'] / f['seconds']:.3f}× floor; "
        f"the minute's build before it {st['minute_build_s']:.2f} s\n"
        f"  steady-evaluate from spans {_s(raw)} (first evaluation {raw['first_s']:.2f} s; "
        f"{raw['describe']})\n"
        f"  day from summaries {_s(row['day'])} → {row['day']['seconds'] / full['seconds']:.3f}× full\n"
        f"  {WINDOW_DAYS}-day window (2 days of data): summaries {_s(row['window'])}, "
        f"spans {_s(row['window_raw'])}",
        flush=True,
    )


def _check(value: float, target: float) -> str:
    return f"{value:.2f} ({'meets' if value <= target else 'misses'} ≤ {target:g})"


def _markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "Seconds (best of the runs) and peak RSS in MB of each contender's process. "
        "Store A holds only spans, store B the same spans and their summaries.",
        "",
        "| spans | catch-up (B) | full-analysis (A) | floor (A) | steady-evaluate, summaries (B) | "
        "steady-evaluate, spans (A) | day, summaries (B) | "
        f"{WINDOW_DAYS}-day window, summaries (B) | {WINDOW_DAYS}-day window, spans (A) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cells = ("catch_up", "full", "floor", "steady", "steady_raw", "day", "window", "window_raw")
    for row in results:
        lines.append(
            f"| {row['spans']:,} | "
            + " | ".join(f"{row[k]['seconds']:.2f} s / {row[k]['peak_rss_mb']:.0f} MB" for k in cells)
            + " |"
        )
    lines += [
        "",
        "| spans | catch-up / full-analysis | steady-evaluate / floor | steady (summaries) / steady (spans) "
        "| day summaries / full |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in results:
        full = row["full"]["seconds"]
        steady = row["steady"]["seconds"]
        lines.append(
            f"| {row['spans']:,} | {_check(row['catch_up']['seconds'] / full, TARGET_CATCH_UP)} | "
            f"{_check(steady / row['floor']['seconds'], TARGET_STEADY_FLOOR)} | "
            f"{steady / row['steady_raw']['seconds']:.3f} | {row['day']['seconds'] / full:.3f} |"
        )
    if len(results) >= 2:
        small, large = results[0], results[-1]
        growth = large["steady"]["seconds"] / small["steady"]["seconds"]
        lines += [
            "",
            f"steady-evaluate {large['spans']:,} / {small['spans']:,} spans: "
            f"{_check(growth, TARGET_STEADY_GROWTH)} for ×{large['spans'] / small['spans']:.0f} data "
            f"(spans: ×{large['steady_raw']['seconds'] / small['steady_raw']['seconds']:.1f}).",
        ]
    lines += [
        "",
        f"The {WINDOW_DAYS}-day window covers two days of data and {WINDOW_DAYS - 2} empty days "
        "(its baseline, the 30 days before, is empty too).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
