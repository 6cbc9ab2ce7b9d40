"""``tailwatch analyze``: every tail metric over a window, as JSON or a readable table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import click

from storage import TailwatchError
from tailwatch.commands._common import store_option

OutputFormat = Literal["json", "table"]


class _ISOTime(click.ParamType):
    """An ISO 8601 instant; a value without an offset is taken as UTC."""

    name = "ISO8601"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            parsed = value
        else:
            text = str(value).strip()
            try:
                parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
            except ValueError:
                self.fail(f"{value!r} is not an ISO 8601 time (e.g. 2026-11-02T08:00:00Z)", param, ctx)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)


ISO_TIME = _ISOTime()


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines


def render_table(data: dict[str, Any]) -> str:
    """The JSON object of one analysis as plain text sections."""
    w = data["window"]
    out = [
        f"window   {w['start']} → {w['end']}",
        f"baseline {w['baseline_start']} → {w['baseline_end']}",
        "",
        "HOT PATH (latency ms; exact percentiles, linear interpolation)",
    ]
    out += _table(
        [
            "service",
            "operation",
            "requests",
            "p50",
            "p95",
            "p99",
            "p99.9",
            "sync LLM/req",
            "releases",
            "coupled",
        ],
        [
            [
                h["service"],
                h["operation"],
                _fmt(h["requests"]),
                _fmt(h["p50_ms"]),
                _fmt(h["p95_ms"]),
                _fmt(h["p99_ms"]),
                _fmt(h["p999_ms"]),
                _fmt(h["sync_llm_calls_per_request"], 2),
                _fmt(h["release_coupling"]["releases"]),
                _fmt(h["release_coupling"]["coupled"]),
            ]
            for h in data["hot_path"]
        ],
    )
    release_rows = [
        [
            h["service"],
            h["operation"],
            r["version"],
            _fmt(r["released_at"]),
            _fmt(r["p99_before_ms"]),
            _fmt(r["p99_after_ms"]),
            _fmt(r["p99_delta_ms"]),
            _fmt(r["significant"]),
            f"{_fmt(r['sync_llm_calls_per_request_before'], 2)} → "
            f"{_fmt(r['sync_llm_calls_per_request_after'], 2)}",
        ]
        for h in data["hot_path"]
        for r in h["releases"]
    ]
    if release_rows:
        out += ["", "RELEASES"]
        out += _table(
            [
                "service",
                "operation",
                "version",
                "released",
                "p99 before",
                "p99 after",
                "Δp99",
                "significant",
                "sync LLM/req",
            ],
            release_rows,
        )
    out += ["", "COLD PATH (enqueue-to-ready s)"]
    out += _table(
        [
            "queue",
            "jobs",
            "pending",
            "p50",
            "p95",
            "p99",
            "p99.9",
            "wait p99",
            "proc p99",
            "p99/p50",
            "starved",
        ],
        [
            [
                c["queue"],
                _fmt(c["jobs"]),
                _fmt(c["pending"]),
                _fmt(c["p50_s"], 2),
                _fmt(c["p95_s"], 2),
                _fmt(c["p99_s"], 2),
                _fmt(c["p999_s"], 2),
                _fmt(c["queue_wait_p99_s"], 2),
                _fmt(c["processing_p99_s"], 2),
                _fmt(c["p99_over_p50"]),
                _fmt(c["starved"]),
            ]
            for c in data["cold_path"]
        ],
    )
    out += ["", "ABANDONMENT (rate by response-time bucket)"]
    for a in data["abandonment"]:
        curve = "  ".join(
            f"{b['lo_ms']}:{b['rate'] * 100:.1f}%" for b in a["buckets"] if b["rate"] is not None
        )
        out.append(f"{a['service']} {a['operation']}  cliff_ms={_fmt(a['cliff_ms'])}  {curve}")
    out += ["", "RETRY AMPLIFICATION"]
    for r in data["retry_amplification"]:
        hops = ", ".join(f"{h['hop']} {h['retry_rate'] * 100:.1f}%" for h in r["hops"])
        out.append(
            f"{r['workflow']}  runs={r['runs']}  attempts×{_fmt(r['attempt_amplification'], 3)}  "
            f"tokens×{_fmt(r['token_amplification'], 3)}  "
            f"modeled×{_fmt(r['modeled_amplification'], 3)}  [{hops}]"
        )
    out += ["", "LLM CALLS (attempts as sent over the wire; rates of attempts, retries per call)"]
    out += _table(
        [
            "provider",
            "model",
            "calls",
            "sync",
            "cold share",
            "attempts",
            "errors",
            "429",
            "retries",
            "backoff s",
            "tokens",
        ],
        [
            [
                c["provider"],
                c["model"],
                _fmt(c["calls"]),
                _fmt(c["sync_calls"]),
                _fmt(c["cold_share"], 3),
                _fmt(c["attempts"]),
                _fmt(c["error_rate"], 3),
                _fmt(c["throttle_rate"], 3),
                _fmt(c["retry_rate"], 3),
                _fmt(c["backoff_ms"] / 1000.0 if c["backoff_ms"] is not None else None, 1),
                _fmt(c["tokens"]),
            ]
            for c in data.get("llm_calls", [])
        ],
    )
    out += ["", "ATTRIBUTION (p99 change vs baseline, critical path of tail traces)"]
    for a in data["attribution"]:
        out.append(
            f"{a['service']} {a['operation']}  "
            f"p99 {_fmt(a['baseline_p99_ms'])} → {_fmt(a['current_p99_ms'])} ms "
            f"(Δ {_fmt(a['delta_ms'])})  verdict={a['verdict']}  llm {a['llm_share'] * 100:.0f}% / "
            f"internal {a['internal_share'] * 100:.0f}%"
        )
        for s in a["top_spans"][:5]:
            model = f" [{s['provider']}/{s['model']}]" if s["model"] else ""
            out.append(f"    {s['class']:<8} {s['span_name']}{model}  Δ {_fmt(s['delta_ms'])} ms")
        for g in a["llm_signals"]:
            out.append(
                f"    {g['provider']}/{g['model']}: errors {_fmt(g['error_rate_baseline'], 3)}→"
                f"{_fmt(g['error_rate_current'], 3)}  429 {_fmt(g['throttle_rate_baseline'], 3)}→"
                f"{_fmt(g['throttle_rate_current'], 3)}  retries {_fmt(g['retry_rate_baseline'], 3)}→"
                f"{_fmt(g['retry_rate_current'], 3)}  cold share {_fmt(g['cold_share_baseline'], 3)}→"
                f"{_fmt(g['cold_share_current'], 3)}"
            )
        if a["exemplar_trace_ids"]:
            out.append(f"    exemplars: {' '.join(a['exemplar_trace_ids'])}")
    return "\n".join(out)


def _held_range(store: Any) -> tuple[int, datetime, datetime] | None:
    """How many spans the store holds and from when to when (None when it holds none)."""
    from collectors.schema import TRACES_TABLE

    count, first, last = store.query_rows(
        f"SELECT count(), min(Timestamp), max(Timestamp) FROM {store.table(TRACES_TABLE)}"
    )[0]
    return (int(count), first, last) if count else None


@click.command("analyze")
@store_option
@click.option("--start", type=ISO_TIME, required=True, help="Window start (ISO 8601; UTC if no offset).")
@click.option("--end", type=ISO_TIME, required=True, help="Window end, exclusive.")
@click.option(
    "--baseline-start", type=ISO_TIME, default=None, help="Baseline start [default: end − 2×length]."
)
@click.option("--baseline-end", type=ISO_TIME, default=None, help="Baseline end [default: --start].")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(list(get_args(OutputFormat))),
    default="json",
    show_default=True,
    help="json: one object; table: readable text.",
)
def analyze(
    store_dsn: str | None,
    start: datetime,
    end: datetime,
    baseline_start: datetime | None,
    baseline_end: datetime | None,
    output_format: OutputFormat,
) -> None:
    """Hot-path p99 vs releases, cold-path enqueue-to-ready, abandonment, retry amplification and
    LLM-vs-internal attribution over [--start, --end) against a baseline window."""
    from analytics import analyze as run_analysis
    from collectors.schema import TRACES_TABLE
    from storage import StoreInUseError, open_store

    if (baseline_start is None) != (baseline_end is None):
        raise TailwatchError("give both --baseline-start and --baseline-end, or neither")
    try:
        opened = open_store(store_dsn, create=False)
    except StoreInUseError as exc:
        # A running `tailwatch serve` owns the embedded store: ask its API instead.
        from tailwatch import remote

        text = remote.for_store(store_dsn, exc).analyze_json(start, end, baseline_start, baseline_end)
        click.echo(text if output_format == "json" else render_table(json.loads(text)))
        return
    with opened as store:
        if not store.table_exists(TRACES_TABLE):
            raise TailwatchError(
                f"store {store.location.redacted()} has no {TRACES_TABLE} table; "
                "run `tailwatch schema apply` "
                "or point --store at the store your collectors write"
            )
        analysis = run_analysis(store, start, end, baseline_start, baseline_end)
        shown = (analysis.hot_path, analysis.cold_path, analysis.llm_calls, analysis.retry_amplification)
        empty = all(frame.is_empty() for frame in shown)
        held = _held_range(store) if empty else None
    if output_format == "json":
        click.echo(analysis.to_json())
    else:
        click.echo(render_table(analysis.to_dict()))
    if empty:
        # An empty report says why, on stderr (stdout stays the JSON or table asked for).
        window = f"{analysis.start:%Y-%m-%d %H:%M} .. {analysis.end:%Y-%m-%d %H:%M} UTC"
        if held is None:
            click.echo(f"tailwatch: no spans in {window}; the store holds no spans at all", err=True)
        else:
            count, first, last = held
            click.echo(
                f"tailwatch: no requests, jobs or model calls in {window}; the store holds "
                f"{count:,} spans from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC",
                err=True,
            )
