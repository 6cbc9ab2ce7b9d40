"""Persist analysis runs so rules, dashboards and the API read history instead of recomputing.

A run is one row of ``tailwatch_analysis_runs`` (window, conventions, the JSON result), every frame
as Arrow IPC bytes in ``tailwatch_analysis_frames`` (the exact, typed frames :func:`load_analysis`
rebuilds), and the summary frames as typed rows of ``tailwatch_analysis_<frame>`` for SQL over
history, e.g.::

    SELECT window_end, p99_ms FROM tailwatch_analysis_hot_path
    WHERE service = 'chat-api' AND operation = 'POST /chat' ORDER BY window_end
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import polars as pl
import pyarrow as pa

from analytics.analysis import FRAME_SCHEMAS, Analysis
from analytics.conventions import Conventions
from analytics.llm_anatomy import LLM_CAUSE_COLUMNS
from analytics.schema import migration
from storage import DDLContext, Migration, Store, as_utc, ensure_schema, register_migrations

__all__ = ["MIGRATIONS", "latest_analysis", "load_analysis", "load_run", "persist_analysis", "runs"]

RUNS_TABLE = "tailwatch_analysis_runs"
FRAMES_TABLE = "tailwatch_analysis_frames"

# Frames kept as typed tables too, so rules and dashboards can query history in SQL
# (e.g. p99 of an operation across the last 50 runs).
HISTORY_FRAMES = (
    "hot_path",
    "releases",
    "release_coupling",
    "cold_path",
    "abandonment_summary",
    "retry_amplification",
    "attribution",
    "llm_signals",
)


def history_table(frame: str) -> str:
    return f"tailwatch_analysis_{frame}"


def clickhouse_type(dtype: Any) -> str:
    """The ClickHouse column type a Polars column of the analysis frames is stored as."""
    if dtype == pl.String:
        return "String"
    if dtype == pl.Boolean:
        return "Nullable(Bool)"
    if dtype == pl.Int64:
        return "Nullable(Int64)"
    if dtype == pl.Float64:
        return "Nullable(Float64)"
    if isinstance(dtype, pl.Datetime):
        return "Nullable(DateTime64(6, 'UTC'))"
    if isinstance(dtype, pl.List) and dtype.inner == pl.String:
        return "Array(String)"
    raise TypeError(f"no ClickHouse type for {dtype}")


def _runs(ctx: DDLContext) -> list[str]:
    body = """    run_id String,
    created_at DateTime64(3, 'UTC'),
    start DateTime64(9, 'UTC'),
    end DateTime64(9, 'UTC'),
    baseline_start DateTime64(9, 'UTC'),
    baseline_end DateTime64(9, 'UTC'),
    bucket_ms UInt32,
    conventions String,
    result String"""
    return ctx.create_table(RUNS_TABLE, body, tail="ORDER BY (start, end, created_at)")


def _frames(ctx: DDLContext) -> list[str]:
    body = """    run_id String,
    frame LowCardinality(String),
    ipc String CODEC(ZSTD(3))"""
    return ctx.create_table(FRAMES_TABLE, body, tail="ORDER BY (run_id, frame)")


def _history(ctx: DDLContext) -> list[str]:
    statements: list[str] = []
    for frame in HISTORY_FRAMES:
        columns = [
            "    run_id String",
            "    created_at DateTime64(3, 'UTC')",
            "    window_start DateTime64(9, 'UTC')",
            "    window_end DateTime64(9, 'UTC')",
        ]
        columns += [f"    `{name}` {clickhouse_type(dtype)}" for name, dtype in FRAME_SCHEMAS[frame].items()]
        order = "(window_end, run_id)"
        statements += ctx.create_table(history_table(frame), ",\n".join(columns), tail=f"ORDER BY {order}")
    return statements


def _cold_path_runs(ctx: DDLContext) -> list[str]:
    # Tables made before the cold path counted runs: a fresh store has the columns from v3 already.
    return [
        f"ALTER TABLE {ctx.name(history_table('cold_path'))}{ctx.on_cluster} "
        "ADD COLUMN IF NOT EXISTS `runs` Int64, ADD COLUMN IF NOT EXISTS `retried_jobs` Int64"
    ]


def _retry_exemplar(ctx: DDLContext) -> list[str]:
    # Tables made before retry amplification named its most retried run.
    return [
        f"ALTER TABLE {ctx.name(history_table('retry_amplification'))}{ctx.on_cluster} "
        "ADD COLUMN IF NOT EXISTS `exemplar_trace_id` String"
    ]


def _hot_path_sample(ctx: DDLContext) -> list[str]:
    # Tables made before sampled data was weighted: the sample behind each row's figures. Old rows
    # read these as null (fresh stores have the columns from v3, which takes today's frame schema).
    columns = ("sampled_requests", "effective_sample_size", "p99_tail_samples", "p99_warning")
    schema = FRAME_SCHEMAS["hot_path"]
    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(schema[c])}" for c in columns)
    return [f"ALTER TABLE {ctx.name(history_table('hot_path'))}{ctx.on_cluster} {adds}"]


def _baselines(ctx: DDLContext) -> list[str]:
    # Tables made before the cold path and retry amplification carried their baseline window's
    # figures. Old rows read these as null.
    statements = []
    for frame in ("cold_path", "retry_amplification"):
        schema = FRAME_SCHEMAS[frame]
        adds = ", ".join(
            f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(t)}"
            for c, t in schema.items()
            if c.startswith("baseline_")
        )
        statements.append(f"ALTER TABLE {ctx.name(history_table(frame))}{ctx.on_cluster} {adds}")
    return statements


def _release_steps(ctx: DDLContext) -> list[str]:
    # Tables made before a release's step was measured right after it: what it was measured over.
    # Old rows read these as null.
    schema = FRAME_SCHEMAS["releases"]
    adds = ", ".join(
        f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(schema[c])}" for c in ("step_start", "step_end")
    )
    return [f"ALTER TABLE {ctx.name(history_table('releases'))}{ctx.on_cluster} {adds}"]


def _llm_failed_attempts(ctx: DDLContext) -> list[str]:
    # Tables made before an LLM error meant a call failed after its retries: the failed (not 429)
    # attempts' rate beside it. Old rows read these as null (and their error_rate counted attempts).
    schema = FRAME_SCHEMAS["llm_signals"]
    columns = ("failed_attempt_rate_baseline", "failed_attempt_rate_current")
    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(schema[c])}" for c in columns)
    return [f"ALTER TABLE {ctx.name(history_table('llm_signals'))}{ctx.on_cluster} {adds}"]


def _llm_causes(ctx: DDLContext) -> list[str]:
    # Tables made before the cause inside "llm" was named: the cause and the parts of the delta.
    # Old rows read these as null.
    schema = FRAME_SCHEMAS["attribution"]
    adds = ", ".join(
        f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(schema[c])}" for c in LLM_CAUSE_COLUMNS
    )
    return [f"ALTER TABLE {ctx.name(history_table('attribution'))}{ctx.on_cluster} {adds}"]


def _first_byte(ctx: DDLContext) -> list[str]:
    # Tables made before streamed endpoints' first byte was read: the hot path's time to first byte
    # and what each operation's abandonment was read against. Old rows read these as null.
    statements = []
    for frame, columns in (
        ("hot_path", ("first_byte_requests", "streamed_requests", "ttfb_p50_ms", "ttfb_p99_ms")),
        ("abandonment_summary", ("latency",)),
    ):
        schema = FRAME_SCHEMAS[frame]
        adds = ", ".join(f"ADD COLUMN IF NOT EXISTS `{c}` {clickhouse_type(schema[c])}" for c in columns)
        statements.append(f"ALTER TABLE {ctx.name(history_table(frame))}{ctx.on_cluster} {adds}")
    return statements


# Versions 1-3, 7-10, 13, 19, 22 and 24 of the analytics component (analytics.schema holds the others).
MIGRATIONS: tuple[Migration, ...] = (
    migration(1, RUNS_TABLE, _runs),
    migration(2, FRAMES_TABLE, _frames),
    migration(3, "tailwatch_analysis_<frame> history", _history),
    migration(7, "tailwatch_analysis_cold_path runs", _cold_path_runs),
    migration(8, "tailwatch_analysis_retry_amplification exemplar", _retry_exemplar),
    migration(9, "tailwatch_analysis_hot_path sample size", _hot_path_sample),
    migration(10, "tailwatch_analysis_cold_path and _retry_amplification baselines", _baselines),
    migration(13, "tailwatch_analysis_releases step window", _release_steps),
    migration(19, "tailwatch_analysis_llm_signals failed attempt rates", _llm_failed_attempts),
    migration(22, "tailwatch_analysis_attribution causes inside llm", _llm_causes),
    migration(24, "tailwatch_analysis_hot_path first byte, _abandonment_summary latency", _first_byte),
)
register_migrations(MIGRATIONS)


def persist_analysis(store: Store, analysis: Analysis, conventions: Conventions | None = None) -> str:
    """Write one run; returns its run id."""
    ensure_schema(store, MIGRATIONS)
    run_id = uuid.uuid4().hex
    created = datetime.now(UTC)
    frames = analysis.frame_bytes()
    store.insert_arrow(
        store.table(FRAMES_TABLE),
        pa.table(
            {
                "run_id": pa.array([run_id] * len(frames), pa.string()),
                "frame": pa.array(list(frames), pa.string()),
                "ipc": pa.array(list(frames.values()), pa.binary()),
            }
        ),
    )
    for name in HISTORY_FRAMES:
        frame = getattr(analysis, name)
        if frame.is_empty():
            continue
        typed = frame.select(list(FRAME_SCHEMAS[name])).with_columns(
            pl.lit(run_id).alias("run_id"),
            pl.lit(created).cast(pl.Datetime("ms", "UTC")).alias("created_at"),
            pl.lit(analysis.start).cast(pl.Datetime("ns", "UTC")).alias("window_start"),
            pl.lit(analysis.end).cast(pl.Datetime("ns", "UTC")).alias("window_end"),
        )
        store.insert_arrow(store.table(history_table(name)), typed.to_arrow())
    # The run row goes last: a run is visible to readers only once its frames are in.
    store.insert_arrow(
        store.table(RUNS_TABLE),
        pa.table(
            {
                "run_id": [run_id],
                "created_at": pa.array([created], pa.timestamp("ms", tz="UTC")),
                "start": pa.array([analysis.start], pa.timestamp("ns", tz="UTC")),
                "end": pa.array([analysis.end], pa.timestamp("ns", tz="UTC")),
                "baseline_start": pa.array([analysis.baseline_start], pa.timestamp("ns", tz="UTC")),
                "baseline_end": pa.array([analysis.baseline_end], pa.timestamp("ns", tz="UTC")),
                "bucket_ms": pa.array([analysis.bucket_ms], pa.uint32()),
                "conventions": [json.dumps((conventions or Conventions()).to_dict())],
                "result": [analysis.to_json()],
            }
        ),
    )
    return run_id


def _load(store: Store, where: str, params: dict[str, Any]) -> Analysis | None:
    if not store.table_exists(RUNS_TABLE):
        return None
    rows = store.query_rows(
        f"SELECT run_id, start, end, baseline_start, baseline_end, bucket_ms FROM {store.table(RUNS_TABLE)} "
        f"WHERE {where} ORDER BY created_at DESC, run_id DESC LIMIT 1",
        params,
    )
    if not rows:
        return None
    run_id, start, end, baseline_start, baseline_end, bucket_ms = rows[0]
    blobs = store.query_arrow(
        f"SELECT frame, ipc FROM {store.table(FRAMES_TABLE)} WHERE run_id = {{run_id:String}}",
        {"run_id": run_id},
        settings={"output_format_arrow_string_as_string": 0},
    )
    # Binary Arrow output keeps the IPC bytes intact; names then arrive as bytes too.
    frames = {
        (name.decode() if isinstance(name, bytes) else str(name)): bytes(blob)
        for name, blob in zip(blobs.column("frame").to_pylist(), blobs.column("ipc").to_pylist(), strict=True)
    }

    return Analysis.from_frame_bytes(
        {
            "start": as_utc(start),
            "end": as_utc(end),
            "baseline_start": as_utc(baseline_start),
            "baseline_end": as_utc(baseline_end),
        },
        frames,
        bucket_ms=int(bucket_ms),
        run_id=str(run_id),
    )


def load_analysis(store: Store, start: datetime, end: datetime) -> Analysis | None:
    """The latest persisted run over exactly [start, end), or ``None``."""
    return _load(
        store,
        "start = {s:DateTime64(9)} AND end = {e:DateTime64(9)}",
        {"s": as_utc(start), "e": as_utc(end)},
    )


def load_run(store: Store, run_id: str) -> Analysis | None:
    """The persisted run ``run_id`` (what an alert's dashboard link names), or ``None``."""
    return _load(store, "run_id = {run_id:String}", {"run_id": run_id})


def latest_analysis(store: Store) -> Analysis | None:
    """The most recently persisted run, or ``None``."""
    return _load(store, "1", {})


def runs(store: Store, limit: int = 100) -> pl.DataFrame:
    """Persisted runs, newest first: run_id, created_at and the windows."""
    schema: dict[str, Any] = {
        "run_id": pl.String,
        "created_at": pl.Datetime("ms", "UTC"),
        "start": pl.Datetime("ns", "UTC"),
        "end": pl.Datetime("ns", "UTC"),
    }
    if not store.table_exists(RUNS_TABLE):
        return pl.DataFrame(schema=schema)
    frame = store.query_polars(
        f"SELECT run_id, created_at, start, end FROM {store.table(RUNS_TABLE)} "
        "ORDER BY created_at DESC LIMIT {limit:UInt32}",
        {"limit": limit},
    )
    return frame.cast(pl.Schema(schema))
