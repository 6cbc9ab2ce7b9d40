"""Scale benchmark: days of traffic at millions of spans a day, each figure beside its baseline.

Run ``python -m bench.scale`` (the acceptance sizes: ``--volumes 6.5,13 --days 8``, 52M and 104M
spans; a quick run: ``--volumes 0.5 --days 2 --steady-sizes 100000,1000000``). For each volume a
fresh embedded store is filled in SQL (:mod:`bench.scale_data`, the shapes of
:mod:`bench.analytics_data`, one day at a time) and then, each contender in its own process (its peak
RSS is that process's own, read by the parent with ``wait4``), one at a time:

1. **catch-up** — :func:`analytics.build_summaries` (what ``tailwatch summaries build`` runs) over the
   whole store from nothing, against **one raw analysis of the same spans**: :func:`analytics.analyze`
   of the whole range with ``use_summaries=False`` (target ≤ 1×);
2. **raw analysis of the last day** (``use_summaries=False``; it reads that day and its baseline, the
   day before) against the **floor**: one scan of the columns it reads over those two days,
   :data:`bench.analytics.FLOOR_SQL` (every value hashed, so each column is read and decompressed
   whole; target ≤ 3×); beside it the same analysis against the scan of the last day alone;
3. **1-day analysis** from the summaries against the scan of that day's columns (target ≤ 1×);
4. **7-day analysis** from the summaries against the 1-day analysis (target ≤ 2×), and its peak RSS
   (target ≤ 1.5 GiB).

The catch-up and its raw analysis run once, back to back; figures 2–4 run ``--rounds`` rounds (each
analysis next to its floor), each contender ``--repeat`` times in its process: a figure is the best
run, its peak RSS the largest, and the paired ratio of each round is reported too (a shared
machine's speed drifts by tens of percent within minutes).

5. **steady ``tailwatch alerts evaluate``** from the command line (the installed ``tailwatch``, the
   shipped rules, no configuration, a fresh process each time, wall time and peak RSS of that
   process) on a store of ``--steady-sizes`` spans (10M and 1M; two days of spans, the last one
   slower, ending ``STEADY_AHEAD`` after the first evaluation): one evaluation at the current time
   (untimed: it summarises the whole store), then ``--steady-rounds`` evaluations each a minute
   later, at the real time, ``--at`` one minute after the previous one, the two stores alternating.
   Each evaluation first summarises the minute that settled since the previous one, as a cron job
   does. Figure: the largest store's best over the smallest's (target ≤ 1.5×).

The engine's query condition cache is switched off in every in-process contender, as in
:mod:`bench.analytics`. A child whose resident memory passes ``--max-rss-gib`` (default 60% of the
memory available at the start) is killed and reported as stopped, so that a raw analysis too big for
the machine does not take other work down with it. Stores are deleted after each volume unless
``--keep``. Progress goes to stderr, the table to stdout, every number to ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.analytics import FLOOR_SQL, _machine, _peak_rss_mb
from bench.scale_data import Volume

MODULE = "bench.scale"

# The acceptance's targets (a figure meets its target when it does not exceed it).
TARGET_CATCH_UP = 1.0  # catch-up / one raw analysis of the same spans
TARGET_RAW = 3.0  # raw analysis / one scan of the columns it reads
TARGET_DAY = 1.0  # 1-day analysis from the summaries / one scan of that day's columns
TARGET_WEEK = 2.0  # 7-day analysis / 1-day analysis
TARGET_WEEK_RSS_MIB = 1.5 * 1024  # 7-day analysis' peak RSS
TARGET_STEADY = 1.5  # steady evaluation, largest store / smallest store

STEADY_AHEAD = timedelta(minutes=60)  # the steady stores' spans end this long after the first evaluation
_MINUTE = 60.0
_STARTED = time.monotonic()


def _log(message: str) -> None:
    elapsed = time.monotonic() - _STARTED
    print(
        f"[scale {datetime.now(UTC):%H:%M:%S} +{elapsed / 60:.1f} min] {message}", file=sys.stderr, flush=True
    )


# ---------------------------------------------------------------------------------------------------
# The child processes


def _worker(mode: str, dsn: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One contender, in this (fresh) process; its JSON result."""
    from storage import open_store, parse_time

    def progress(line: str) -> None:
        print(f"  [{mode}] {line}", file=sys.stderr, flush=True)

    with open_store(dsn) as store:
        store.command("SET use_query_condition_cache = 0")
        if mode in ("generate", "generate-steady"):
            from bench.scale_data import fill, fill_days_ending, span_table_bytes

            started = time.perf_counter()
            if mode == "generate":
                volume = Volume(spec["spans_per_day"], spec["days"], parse_time(spec["end"]))
                rows = fill(store, volume, progress)
            else:
                rows = fill_days_ending(store, spec["spans"], parse_time(spec["end"]), 2, progress)
            seconds = time.perf_counter() - started
            return {"rows": rows, "seconds": seconds, "bytes": span_table_bytes(store)}
        if mode == "catch-up":
            from analytics import build_summaries

            said = [0.0]

            def every_10s(line: str) -> None:
                # One line per chunk would be hundreds at 100M spans.
                if time.monotonic() - said[0] >= 10:
                    said[0] = time.monotonic()
                    progress(line)

            started = time.perf_counter()
            build = build_summaries(store, until=parse_time(spec["until"]), progress=every_10s)
            seconds = time.perf_counter() - started
            return {
                "seconds": seconds,
                "runs": [seconds],
                "describe": build.describe(),
                "minutes": build.minutes,
                "rows": sum(build.rows.values()),
                "summary_bytes": _summary_bytes(store),
                "peak_rss_mib": _peak_rss_mb(),
            }
        lo, hi = parse_time(spec["start"]), parse_time(spec["end"])
        times: list[float] = []
        for _ in range(max(1, int(spec.get("repeat", 1)))):
            started = time.perf_counter()
            if mode == "floor":
                store.query_rows(FLOOR_SQL, {"lo": lo, "hi": hi})
            elif mode == "analyze":
                from analytics import analyze

                analyze(store, lo, hi, use_summaries=bool(spec["summaries"]))
            else:
                raise SystemExit(f"unknown mode {mode}")
            times.append(time.perf_counter() - started)
    return {"seconds": min(times), "runs": times, "peak_rss_mib": _peak_rss_mb()}


def _summary_bytes(store: Any) -> int:
    value = store.query_value(
        "SELECT sum(bytes_on_disk) FROM system.parts "
        "WHERE active AND database = currentDatabase() AND table LIKE 'tailwatch\\_%'"
    )
    return int(value or 0)


@dataclass
class _Child:
    """What a child process cost, as its parent saw it."""

    seconds: float  # wall time from start to exit
    peak_rss_mib: float  # the child's own peak (wait4)
    code: int
    stdout: str
    stopped_at_mib: float | None = None  # killed by the memory guard at this resident size


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _run_child(
    cmd: list[str], limit_mib: float, *, cwd: Path | None = None, env: dict[str, str] | None = None
) -> _Child:
    """Run ``cmd`` to its end (stderr passed through), killing it if its resident memory passes
    ``limit_mib``; its wall time and its own peak RSS (``wait4``: unlike ``RUSAGE_CHILDREN`` it is
    this child's alone)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, cwd=cwd, env=env)
        done = threading.Event()
        stopped: list[float] = []

        def guard() -> None:
            while not done.wait(0.2):
                rss = _rss_mib(proc.pid)
                if rss is not None and rss > limit_mib:
                    stopped.append(rss)
                    os.kill(proc.pid, signal.SIGKILL)
                    return

        watcher = threading.Thread(target=guard, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        done.set()
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return _Child(
            seconds, usage.ru_maxrss / 1024, proc.returncode, out.read(), stopped[0] if stopped else None
        )


def _measure(mode: str, dsn: str, spec: dict[str, Any], limit_mib: float) -> dict[str, Any]:
    """``mode``'s worker in a fresh process: its result, with the peak RSS its parent saw; a child
    the memory guard stopped gives ``{"stopped": True, "seconds": its wall time so far, …}``."""
    cmd = [sys.executable, "-m", MODULE, "--worker", mode, "--dsn", dsn, "--spec", json.dumps(spec)]
    child = _run_child(cmd, limit_mib)
    if child.stopped_at_mib is not None:
        _log(
            f"{mode} stopped by the memory guard at {child.stopped_at_mib:,.0f} MiB "
            f"after {child.seconds:.1f} s"
        )
        return {"stopped": True, "seconds": child.seconds, "peak_rss_mib": child.stopped_at_mib, "runs": []}
    if child.code != 0:
        raise SystemExit(
            f"bench.scale: the {mode} worker failed (exit status {child.code}; its stderr above)"
        )
    result = dict(json.loads(child.stdout.strip().splitlines()[-1]))
    result["peak_rss_mib"] = child.peak_rss_mib
    result["wall_s"] = child.seconds
    return result


# ---------------------------------------------------------------------------------------------------
# Figures 1-4: one volume


def _window(w: tuple[datetime, datetime]) -> dict[str, str]:
    from storage import iso_z

    return {"start": iso_z(w[0]), "end": iso_z(w[1])}


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run, with the largest peak RSS of them all."""
    ok = [r for r in runs if not r.get("stopped")]
    if not ok:
        return {**max(runs, key=lambda r: r["seconds"]), "rounds": runs}
    return {
        **min(ok, key=lambda r: r["seconds"]),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "rounds": [r["seconds"] for r in runs],
    }


def _volume(volume: Volume, args: argparse.Namespace, limit_mib: float) -> dict[str, Any]:
    from storage import iso_z

    workdir = Path(tempfile.mkdtemp(prefix="tw-bench-scale-", dir=args.dir))
    dsn = "chdb://" + str(workdir / "store")
    name = volume.label()
    out: dict[str, Any] = {
        "volume": name,
        "spans_per_day": volume.spans_per_day,
        "days": volume.days,
        "start": iso_z(volume.start),
        "end": iso_z(volume.end),
    }
    try:
        _log(f"{name}: generating {volume.spans:,} spans in SQL into {workdir}")
        gen = _measure(
            "generate",
            dsn,
            {"spans_per_day": volume.spans_per_day, "days": volume.days, "end": iso_z(volume.end)},
            limit_mib,
        )
        out["generate"] = gen
        _log(
            f"{name}: {gen['rows']:,} spans in {gen['seconds']:.0f} s, "
            f"span table {gen['bytes'] / 2**30:.2f} GiB "
            f"({gen['bytes'] / gen['rows']:.0f} B/span)"
        )
        out["spans"] = gen["rows"]

        _log(f"{name}: one raw analysis of the whole range (the catch-up's baseline)")
        raw_all = _measure("analyze", dsn, {**_window(volume.whole), "summaries": False}, limit_mib)
        _log(f"{name}: raw analysis of {volume.days} days {_cost(raw_all)}")
        _log(f"{name}: catch-up: summarising the whole store")
        catch = _measure("catch-up", dsn, {"until": iso_z(volume.end)}, limit_mib)
        _log(
            f"{name}: catch-up {_cost(catch)}: {catch['describe']}; summaries "
            f"{catch['summary_bytes'] / 2**20:,.0f} MiB on disk"
        )
        out["raw_whole"], out["catch_up"] = raw_all, catch

        contenders: dict[str, list[dict[str, Any]]] = {
            "floor_read": [],
            "raw_day": [],
            "floor_day": [],
            "day": [],
            "week": [],
        }
        specs: dict[str, tuple[str, dict[str, Any]]] = {
            "floor_read": ("floor", _window(volume.last_day_read)),
            "raw_day": ("analyze", {**_window(volume.last_day), "summaries": False}),
            "floor_day": ("floor", _window(volume.last_day)),
            "day": ("analyze", {**_window(volume.last_day), "summaries": True}),
            "week": ("analyze", {**_window(volume.last_week), "summaries": True}),
        }
        for r in range(max(1, args.rounds)):
            for key, (mode, spec) in specs.items():
                result = _measure(mode, dsn, {**spec, "repeat": args.repeat}, limit_mib)
                contenders[key].append(result)
                _log(f"{name}: round {r + 1}/{args.rounds}: {key} {_cost(result)}")
        for key, runs in contenders.items():
            out[key] = _best(runs)
        out["paired"] = {
            "raw_day/floor_read": [
                a["seconds"] / f["seconds"]
                for a, f in zip(contenders["raw_day"], contenders["floor_read"], strict=True)
            ],
            "day/floor_day": [
                a["seconds"] / f["seconds"]
                for a, f in zip(contenders["day"], contenders["floor_day"], strict=True)
            ],
            "week/day": [
                w["seconds"] / d["seconds"]
                for w, d in zip(contenders["week"], contenders["day"], strict=True)
            ],
        }
        out["disk_bytes"] = _du(workdir)
    finally:
        if args.keep:
            _log(f"{name}: store kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def _cost(r: dict[str, Any]) -> str:
    stopped = " (stopped by the memory guard)" if r.get("stopped") else ""
    return f"{r['seconds']:.2f} s, {r['peak_rss_mib']:,.0f} MiB{stopped}"


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# ---------------------------------------------------------------------------------------------------
# Figure 5: steady alerts evaluate from the command line


def _tailwatch() -> str:
    beside = Path(sys.executable).parent / "tailwatch"
    found = str(beside) if beside.exists() else shutil.which("tailwatch")
    if not found:
        raise SystemExit("bench.scale: the tailwatch command is not installed (pip install -e .)")
    return found


def _evaluate(tailwatch: str, dsn: str, at: datetime, workdir: Path, limit_mib: float) -> dict[str, Any]:
    from storage import iso_z

    # No configuration and none of tailwatch's variables: the shipped rules, no notifiers.
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV") if k in os.environ}
    cmd = [tailwatch, "alerts", "evaluate", "--store", dsn, "--at", iso_z(at), "--format", "json"]
    child = _run_child(cmd, limit_mib, cwd=workdir, env=env)
    if child.code not in (0, 1):
        raise SystemExit(f"bench.scale: tailwatch alerts evaluate failed (exit status {child.code})")
    try:
        report = json.loads(child.stdout)
    except json.JSONDecodeError:
        report = {}
    return {
        "at": iso_z(at),
        "seconds": child.seconds,
        "peak_rss_mib": child.peak_rss_mib,
        "exit": child.code,
        "rules": report.get("rules"),
        "firing": len(report.get("firing", [])),
        "errors": report.get("errors", []),
    }


def _steady(args: argparse.Namespace, limit_mib: float) -> dict[str, Any]:
    from storage import iso_z

    sizes = [int(s) for s in args.steady_sizes.split(",") if s.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="tw-bench-scale-steady-", dir=args.dir))
    tailwatch = _tailwatch()
    now = datetime.now(UTC).replace(microsecond=0)
    end = now.replace(second=0) + STEADY_AHEAD
    dsns = {size: "chdb://" + str(workdir / f"store-{size}") for size in sizes}
    out: dict[str, Any] = {"sizes": sizes, "end": iso_z(end), "stores": {}}
    try:
        for size in sizes:
            _log(f"steady evaluation: generating {size:,} spans over the two days before {iso_z(end)}")
            gen = _measure("generate-steady", dsns[size], {"spans": size, "end": iso_z(end)}, limit_mib)
            out["stores"][size] = {"spans": gen["rows"], "generate": gen, "first": None, "runs": []}
        first_at = datetime.now(UTC).replace(microsecond=0)
        for size in sizes:
            first = _evaluate(tailwatch, dsns[size], first_at, workdir, limit_mib)
            out["stores"][size]["first"] = first
            _log(f"steady evaluation: {size:,} spans: first evaluation (summarises the store) {_cost(first)}")
        anchor = datetime.now(UTC).replace(microsecond=0)
        for i in range(1, max(1, args.steady_rounds) + 1):
            at = anchor + timedelta(seconds=_MINUTE * i)
            wait = (at - datetime.now(UTC)).total_seconds()
            if wait > 0:
                _log(f"steady evaluation: waiting {wait:.0f} s for {iso_z(at)}")
                time.sleep(wait)
            for size in sizes if i % 2 else list(reversed(sizes)):
                run = _evaluate(tailwatch, dsns[size], at, workdir, limit_mib)
                out["stores"][size]["runs"].append(run)
                errors = f"; errors: {run['errors']}" if run["errors"] else ""
                _log(
                    f"steady evaluation: {size:,} spans at {run['at']}: {_cost(run)}, "
                    f"{run['firing']} alerts firing{errors}"
                )
        for size in sizes:
            store = out["stores"][size]
            store["best"] = min(r["seconds"] for r in store["runs"])
            store["median"] = statistics.median(r["seconds"] for r in store["runs"])
            store["peak_rss_mib"] = max(r["peak_rss_mib"] for r in store["runs"])
    finally:
        if args.keep:
            _log(f"steady evaluation: stores kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


# ---------------------------------------------------------------------------------------------------
# The report


@dataclass
class _Row:
    figure: str
    value: str
    baseline: str
    ratio: float | None
    target: str
    met: bool | None
    upper_bound: bool = False  # the baseline was stopped: the true ratio is below ``ratio``

    def cells(self) -> list[str]:
        met = "—" if self.met is None else ("yes" if self.met else "**no**")
        ratio = "—" if self.ratio is None else f"{'< ' if self.upper_bound else ''}{self.ratio:.2f}×"
        return [self.figure, self.value, self.baseline, ratio, self.target, met]


def _s(r: dict[str, Any], rss: bool = True) -> str:
    if r.get("stopped"):
        return f"> {r['seconds']:.1f} s (stopped at {r['peak_rss_mib']:,.0f} MiB)"
    return f"{r['seconds']:.2f} s" + (f", {r['peak_rss_mib']:,.0f} MiB" if rss else "")


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """``a``'s time over ``b``'s; when the memory guard stopped ``b`` (and not ``a``), ``a`` over the
    time ``b`` had run: an upper bound, which :func:`_upper` tells apart."""
    if a.get("stopped"):
        return None
    return float(a["seconds"] / b["seconds"])


def _upper(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(b.get("stopped")) and not a.get("stopped")


def _met(ratio: float | None, target: float) -> bool | None:
    return None if ratio is None else ratio <= target


def _compare(figure: str, a: dict[str, Any], b: dict[str, Any], what: str, target: float | None,
             *, b_rss: bool = True) -> _Row:  # fmt: skip
    """``a`` against its baseline ``b`` (``what`` it is)."""
    ratio, upper = _ratio(a, b), _upper(a, b)
    met = None if target is None else _met(ratio, target)
    if upper and met is False:
        met = None  # below a bound above the target: unknown
    limit = "—" if target is None else f"≤ {target:g}×"
    return _Row(figure, _s(a), f"{_s(b, b_rss)}: {what}", ratio, limit, met, upper)


def _rows(volumes: list[dict[str, Any]], steady: dict[str, Any] | None) -> list[_Row]:
    rows: list[_Row] = []
    for v in volumes:
        label = f"{v['volume']} ({v['spans']:,} spans)"
        days = v["days"]
        held = f" ({min(days, 7)} days of spans)" if days < 7 else ""
        rss, day_rss = v["week"]["peak_rss_mib"], v["day"]["peak_rss_mib"]
        rows += [
            _compare(f"{label}: catch-up (summaries build of the whole store)", v["catch_up"], v["raw_whole"],
                     f"one raw analysis of the {days} days", TARGET_CATCH_UP),
            _compare(f"{label}: raw analysis of the last day", v["raw_day"], v["floor_read"],
                     "scan of the columns it reads (that day and the day before)", TARGET_RAW, b_rss=False),
            _compare(f"{label}: the same, against the last day's scan alone", v["raw_day"], v["floor_day"],
                     "scan of the last day's columns", None, b_rss=False),
            _compare(f"{label}: 1-day analysis from the summaries", v["day"], v["floor_day"],
                     "scan of that day's columns", TARGET_DAY, b_rss=False),
            _compare(f"{label}: 7-day analysis from the summaries{held}", v["week"], v["day"],
                     "the 1-day analysis", TARGET_WEEK),
            _Row(f"{label}: 7-day analysis, peak RSS", f"{rss:,.0f} MiB",
                 f"{day_rss:,.0f} MiB: the 1-day analysis", rss / day_rss,
                 f"≤ {TARGET_WEEK_RSS_MIB:,.0f} MiB", rss <= TARGET_WEEK_RSS_MIB),
        ]  # fmt: skip
    if steady and len(steady["sizes"]) >= 2:
        small, large = min(steady["sizes"]), max(steady["sizes"])
        s, lg = steady["stores"][small], steady["stores"][large]
        ratio = lg["best"] / s["best"]
        rows.append(
            _Row(
                f"steady `tailwatch alerts evaluate` (CLI, a minute after the last), {lg['spans']:,} spans",
                f"{lg['best']:.2f} s, {lg['peak_rss_mib']:,.0f} MiB",
                f"{s['best']:.2f} s, {s['peak_rss_mib']:,.0f} MiB: the same on {s['spans']:,} spans",
                ratio,
                f"≤ {TARGET_STEADY:g}×",
                ratio <= TARGET_STEADY,
            )
        )
    return rows


def _markdown(rows: list[_Row]) -> str:
    lines = ["| figure | value | baseline | ratio | target | met? |", "|---|---:|---|---:|---|---|"]
    lines += ["| " + " | ".join(r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def _details(volumes: list[dict[str, Any]], steady: dict[str, Any] | None) -> str:
    lines: list[str] = []
    for v in volumes:
        g, c = v["generate"], v["catch_up"]
        paired = "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in xs)}" for k, xs in v["paired"].items())
        lines.append(
            f"- {v['volume']}: {v['spans']:,} spans generated in {g['seconds']:.0f} s, span table "
            f"{g['bytes'] / 2**30:.2f} GiB ({g['bytes'] / v['spans']:.0f} B/span); "
            f"catch-up: {c.get('describe', '')}, summaries {c.get('summary_bytes', 0) / 2**20:,.0f} MiB "
            f"on disk; paired ratios per round: {paired}"
        )
    if steady:
        for size in steady["sizes"]:
            st = steady["stores"][size]
            runs = ", ".join(f"{r['seconds']:.2f}" for r in st["runs"])
            first = st["first"]
            lines.append(
                f"- steady evaluation, {st['spans']:,} spans: first evaluation (summarising the store) "
                f"{first['seconds']:.2f} s; then {runs} s (median {st['median']:.2f} s)"
            )
    return "\n".join(lines)


def _machine_lines(load_end: float | None = None) -> dict[str, str]:
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    try:
        import chdb

        engine = f"chDB {getattr(chdb, '__version__', '?')}"
    except ImportError:
        engine = "chDB ?"
    info = {"machine": _machine(), "memory": mem, "nproc": str(os.cpu_count()), "engine": engine}
    if load_end is not None:
        info["load_at_end"] = f"{load_end:.1f}"
    return info


def _memory_available_mib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 8 * 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--volumes", default="6.5,13", help="comma-separated volumes, in M spans a day")
    parser.add_argument("--days", type=int, default=8, help="days of traffic per volume (at least 2)")
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of figures 2-4 (each next to its floor)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs of each contender in its process")
    parser.add_argument(
        "--steady-sizes",
        default="1000000,10000000",
        help="span counts of the steady-evaluation stores ('' skips figure 5)",
    )
    parser.add_argument("--steady-rounds", type=int, default=3, help="timed evaluations per store")
    parser.add_argument(
        "--max-rss-gib",
        type=float,
        default=None,
        help="kill a child past this resident size [default: 60%% of the memory available]",
    )
    parser.add_argument("--dir", default=None, help="where the stores go [default: the temporary directory]")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write every number there")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.dsn, json.loads(args.spec))))
        return

    volumes = [Volume(round(float(v) * 1e6), args.days) for v in args.volumes.split(",") if v.strip()]
    limit_mib = args.max_rss_gib * 1024 if args.max_rss_gib else 0.6 * _memory_available_mib()
    started_at = datetime.now(UTC)
    machine = _machine_lines()
    where = Path(args.dir or tempfile.gettempdir())
    free = shutil.disk_usage(where).free
    _log(
        f"machine: {machine['machine']}, {machine['memory']}, {machine['engine']}; "
        f"{free / 2**30:.0f} GiB free "
        f"in {where}; children killed past {limit_mib / 1024:.1f} GiB"
    )
    results: list[dict[str, Any]] = []
    for volume in volumes:
        # About 50 bytes a span on disk, twice while the parts merge: refuse rather than fill the disk.
        need = volume.spans * 60 * 2.5
        free = shutil.disk_usage(where).free
        if free < need:
            _log(
                f"{volume.label()}: skipped, needs about {need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
            )
            continue
        results.append(_volume(volume, args, limit_mib))
    steady = _steady(args, limit_mib) if args.steady_sizes.strip() else None
    load_end = os.getloadavg()[0]
    machine = _machine_lines(load_end)
    rows = _rows(results, steady)
    command = "python -m bench.scale " + " ".join(sys.argv[1:])
    print(
        f"{command}\nstarted {started_at:%Y-%m-%d %H:%M} UTC; {machine['machine']}, load average at end "
        f"{machine['load_at_end']}; {machine['memory']} RAM; {machine['engine']}\n"
    )
    print(_markdown(rows))
    print()
    print(_details(results, steady))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": command,
                    "started": started_at.isoformat(),
                    "machine": machine,
                    "volumes": results,
                    "steady": steady,
                    "table": [r.__dict__ for r in rows],
                },
                indent=2,
                default=str,
            )
        )
        _log(f"numbers written to {args.json}")


if __name__ == "__main__":
    main()
