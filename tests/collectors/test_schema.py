from __future__ import annotations

import base64
from datetime import UTC, datetime

import pyarrow as pa

from collectors.schema import TRACES_ARROW_SCHEMA, TRACES_MIGRATIONS
from collectors.spans import SpanEvent, SpanLink, SpanRow, insert_spans, read_spans
from storage import DDLContext, Store, apply_schema, render_ddl

EXPECTED_COLUMNS = [
    ("Timestamp", "DateTime64(9)"),
    ("TraceId", "String"),
    ("SpanId", "String"),
    ("ParentSpanId", "String"),
    ("TraceState", "String"),
    ("SpanName", "LowCardinality(String)"),
    ("SpanKind", "LowCardinality(String)"),
    ("ServiceName", "LowCardinality(String)"),
    ("ResourceAttributes", "Map(LowCardinality(String), String)"),
    ("ScopeName", "String"),
    ("ScopeVersion", "String"),
    ("SpanAttributes", "Map(LowCardinality(String), String)"),
    ("Duration", "UInt64"),
    ("StatusCode", "LowCardinality(String)"),
    ("StatusMessage", "String"),
    ("Events.Timestamp", "Array(DateTime64(9))"),
    ("Events.Name", "Array(LowCardinality(String))"),
    ("Events.Attributes", "Array(Map(LowCardinality(String), String))"),
    ("Links.TraceId", "Array(String)"),
    ("Links.SpanId", "Array(String)"),
    ("Links.TraceState", "Array(String)"),
    ("Links.Attributes", "Array(Map(LowCardinality(String), String))"),
]


def test_otel_traces_has_the_collector_columns_types_and_layout(store: Store) -> None:
    rows = store.query_rows(
        "SELECT name, type, compression_codec FROM system.columns "
        "WHERE database = {db:String} AND table = 'otel_traces' ORDER BY position",
        {"db": store.database},
    )
    assert [(n, t) for n, t, _ in rows] == EXPECTED_COLUMNS
    codecs = {n: c for n, _, c in rows}
    assert codecs["Timestamp"] == "CODEC(Delta(8), ZSTD(1))"
    assert all(c == "CODEC(ZSTD(1))" for n, c in codecs.items() if n != "Timestamp")
    create = store.query_value("SHOW CREATE TABLE otel_traces")
    assert "PARTITION BY toDate(Timestamp)" in create
    assert "ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))" in create
    assert "ttl_only_drop_parts = 1" in create
    for index in (
        "INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1",
        "INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1",
        "INDEX idx_duration Duration TYPE minmax GRANULARITY 1",
    ):
        assert index in create
    assert [n for n, _, _ in rows] == [f.name for f in TRACES_ARROW_SCHEMA]


def test_applying_twice_is_a_no_op(raw_store: Store) -> None:
    first = apply_schema(raw_store, TRACES_MIGRATIONS)
    assert len(first.applied) == len(TRACES_MIGRATIONS)
    second = apply_schema(raw_store, TRACES_MIGRATIONS)
    assert second.applied == []
    assert len(second.already) == len(TRACES_MIGRATIONS)
    recorded = raw_store.query_rows(
        "SELECT component, version FROM tailwatch_schema_migrations FINAL ORDER BY version"
    )
    assert recorded == [("collectors", 1), ("collectors", 2)]


def test_ensure_all_applies_every_stage_once(raw_store: Store) -> None:
    from storage import ensure_schema, registered_migrations

    report = ensure_schema(raw_store)
    assert len(report.applied) == len(registered_migrations())
    assert ensure_schema(raw_store).applied == []


def _span(**kw: object) -> SpanRow:
    base: dict[str, object] = dict(
        trace_id="0af7651916cd43dd8448eb211c80319c",
        span_id="b7ad6b7169203331",
        name="chat gpt-4o",
        start_ns=1_700_000_000_123_456_789,
        duration_ns=1_234_567_891,
    )
    base.update(kw)
    return SpanRow(**base)  # type: ignore[arg-type]


def test_collector_shaped_rows_round_trip_losslessly(store: Store) -> None:
    span = _span(
        parent_span_id="00f067aa0ba902b7",
        kind="Client",
        service="chat-api",
        resource_attributes={"service.name": "chat-api", "service.version": "1.5.0"},
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.usage.input_tokens": "120",
            "bytes": base64.b64encode(b"\x00\x01").decode(),
            "list": '["a",1,true]',
            "quote": 'it\'s "quoted"',
        },
        status_code="Error",
        status_message="rate limited",
        scope_name="opentelemetry.instrumentation.openai",
        scope_version="0.1b0",
        trace_state="congo=t61rcWkgMzE",
        events=(SpanEvent(1_700_000_000_200_000_001, "exception", {"exception.type": "RateLimitError"}),),
        links=(
            SpanLink("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b8", "k=v", {"link.kind": "enqueue"}),
        ),
    )
    root = _span(span_id="00f067aa0ba902b7", kind="Server", service="chat-api", name="POST /chat")
    insert_spans(store, [span, root])
    back = read_spans(store).to_pylist()
    got = next(r for r in back if r["SpanId"] == "b7ad6b7169203331")
    ts = got["Timestamp"]
    assert int(pa.scalar(ts, type=pa.timestamp("ns", tz="UTC")).value) == 1_700_000_000_123_456_789
    assert got["Duration"] == 1_234_567_891
    assert got["ParentSpanId"] == "00f067aa0ba902b7"
    assert dict(got["SpanAttributes"]) == dict(span.attributes)
    assert dict(got["ResourceAttributes"]) == {"service.name": "chat-api", "service.version": "1.5.0"}
    assert got["StatusCode"] == "Error" and got["StatusMessage"] == "rate limited"
    assert got["TraceState"] == "congo=t61rcWkgMzE"
    assert got["ScopeName"] == "opentelemetry.instrumentation.openai" and got["ScopeVersion"] == "0.1b0"
    ev_ts = pa.scalar(got["Events.Timestamp"][0], type=pa.timestamp("ns", tz="UTC")).value
    assert ev_ts == 1_700_000_000_200_000_001
    assert got["Events.Name"] == ["exception"]
    assert [dict(a) for a in got["Events.Attributes"]] == [{"exception.type": "RateLimitError"}]
    assert got["Links.TraceId"] == ["4bf92f3577b34da6a3ce929d0e0e4736"]
    assert got["Links.SpanId"] == ["00f067aa0ba902b8"]
    assert got["Links.TraceState"] == ["k=v"]
    assert [dict(a) for a in got["Links.Attributes"]] == [{"link.kind": "enqueue"}]
    # The materialized view fills the trace-id lookup the way Grafana's plugin expects.
    start, end = store.query_rows(
        "SELECT Start, End FROM otel_traces_trace_id_ts WHERE TraceId = {t:String}", {"t": span.trace_id}
    )[0]
    assert start == end == datetime(2023, 11, 14, 22, 13, 20)


def test_readers_accept_legacy_spellings_extra_columns_and_duplicates(store: Store) -> None:
    store.command("ALTER TABLE otel_traces ADD COLUMN SampleRate UInt64 DEFAULT 1")
    legacy = _span(kind="SPAN_KIND_SERVER", status_code="STATUS_CODE_ERROR", service="svc")
    insert_spans(store, [legacy])
    insert_spans(store, [legacy])  # a retried export: same (TraceId, SpanId)
    rows = read_spans(store).to_pylist()
    assert len(rows) == 1
    assert rows[0]["SpanKind"] == "Server"
    assert rows[0]["StatusCode"] == "Error"
    assert "SampleRate" not in rows[0]
    assert read_spans(store, dedupe=False).num_rows == 2


def test_read_spans_window_is_half_open(store: Store) -> None:
    t0 = 1_700_000_000_000_000_000
    insert_spans(store, [_span(span_id=f"{i:016x}", start_ns=t0 + i * 1_000_000_000) for i in range(5)])
    start = datetime.fromtimestamp((t0 + 1_000_000_000) / 1e9, tz=UTC)
    end = datetime.fromtimestamp((t0 + 3_000_000_000) / 1e9, tz=UTC)
    assert read_spans(store, start, end).num_rows == 2


def test_cluster_ddl_has_on_cluster_replicated_engines_and_distributed_tables() -> None:
    ddl = render_ddl(list(TRACES_MIGRATIONS), DDLContext(cluster="prod", ttl_days=14))
    assert "ON CLUSTER `prod`" in ddl
    assert "ReplicatedMergeTree(" in ddl
    assert "ENGINE = Distributed(`prod`, `default`, `otel_traces_local`, cityHash64(TraceId))" in ddl
    assert "TTL toDateTime(Timestamp) + toIntervalDay(14)" in ddl
    assert "FROM `default`.`otel_traces_local`" in ddl  # the view reads the shard-local table
    single = render_ddl(list(TRACES_MIGRATIONS), DDLContext())
    assert "ON CLUSTER" not in single and "Distributed" not in single and "Replicated" not in single
    assert "TTL" not in single
