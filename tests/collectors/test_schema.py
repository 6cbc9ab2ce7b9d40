from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from collectors.layout import inspect_traces
from collectors.schema import NOT_CREATED, TRACES_ARROW_SCHEMA, TRACES_MIGRATIONS
from collectors.spans import SpanEvent, SpanLink, SpanRow, insert_spans, read_spans
from storage import DDLContext, SchemaError, Store, apply_schema, migration_state, render_ddl
from tests.collectors.tables import create_variant

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
        "SELECT name, type, compression_codec, default_kind, comment FROM system.columns "
        "WHERE database = {db:String} AND table = 'otel_traces' ORDER BY position",
        {"db": store.database},
    )
    stored = [(n, t) for n, t, _, kind, _ in rows if kind != "ALIAS"]
    assert stored == EXPECTED_COLUMNS
    aliases = [n for n, _, _, kind, _ in rows if kind == "ALIAS"]
    assert aliases == ["ResourceAttributeItems", "SpanAttributeItems"]
    codecs = {n: c for n, _, c, kind, _ in rows if kind != "ALIAS"}
    assert codecs["Timestamp"] == "CODEC(Delta(8), ZSTD(1))"
    assert codecs["Duration"] == "CODEC(T64, ZSTD(1))"
    assert all(c == "CODEC(ZSTD(1))" for n, c in codecs.items() if n not in ("Timestamp", "Duration"))
    assert all(comment for *_, comment in rows)
    create = store.query_value("SHOW CREATE TABLE otel_traces")
    assert "PARTITION BY toDate(Timestamp)" in create
    assert "PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))" in create
    assert "ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)" in create
    assert "ttl_only_drop_parts = 1" in create
    # The embedded engine is newer than 26.2: the exporter's full-text indexes.
    for index in (
        "INDEX idx_trace_id TraceId TYPE text(tokenizer = 'array')",
        "INDEX idx_span_attr_items SpanAttributeItems TYPE text(tokenizer = 'array')",
        "INDEX idx_duration Duration TYPE minmax GRANULARITY 1",
        "INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8",
    ):
        assert index in create
    assert [n for n, _ in stored] == [f.name for f in TRACES_ARROW_SCHEMA]
    lookup = store.query_value("SHOW CREATE TABLE otel_traces_trace_id_ts")
    assert "AggregatingMergeTree" in lookup and "PARTITION BY toStartOfWeek(Start)" in lookup
    assert "SimpleAggregateFunction(min, DateTime)" in lookup and "ttl_only_drop_parts = 1" in lookup


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
    assert "ReplicatedMergeTree(" in ddl and "ReplicatedAggregatingMergeTree(" in ddl
    assert "ENGINE = Distributed(`prod`, `default`, `otel_traces_local`, cityHash64(TraceId))" in ddl
    assert "TTL toDateTime(Timestamp) + toIntervalDay(14)" in ddl
    assert "FROM `default`.`otel_traces_local`" in ddl  # the view reads the shard-local table
    single = render_ddl(list(TRACES_MIGRATIONS), DDLContext())
    assert "ON CLUSTER" not in single and "Distributed" not in single and "Replicated" not in single
    assert "TTL" not in single


def test_collector_cluster_layout_makes_every_table_under_its_own_name() -> None:
    ctx = DDLContext(cluster="prod", cluster_layout="collector")
    ddl = render_ddl(list(TRACES_MIGRATIONS), ctx)
    assert "_local" not in ddl and "Distributed" not in ddl
    assert "CREATE TABLE IF NOT EXISTS `default`.`otel_traces` ON CLUSTER `prod`" in ddl
    assert "ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')" in ddl
    assert "ENGINE = ReplicatedAggregatingMergeTree(" in ddl
    # The lookup's view reads the span table itself, as the Collector's does on a cluster.
    assert "TO `default`.`otel_traces_trace_id_ts`\nAS SELECT" in ddl
    assert "FROM `default`.`otel_traces`\nWHERE TraceId != ''" in ddl


def test_ttl_is_rendered_in_the_largest_unit_that_divides_it() -> None:
    def clause(ttl: timedelta) -> str:
        return DDLContext(ttl=ttl).ttl_clause("Timestamp").strip()

    assert clause(timedelta(hours=36)) == "TTL toDateTime(Timestamp) + toIntervalHour(36)"
    assert clause(timedelta(minutes=30)) == "TTL toDateTime(Timestamp) + toIntervalMinute(30)"
    assert clause(timedelta(days=7)) == "TTL toDateTime(Timestamp) + toIntervalDay(7)"
    assert clause(timedelta(hours=72)) == "TTL toDateTime(Timestamp) + toIntervalDay(3)"
    assert DDLContext(ttl_days=7).ttl_clause("Start").strip() == "TTL toDateTime(Start) + toIntervalDay(7)"
    with pytest.raises(SchemaError, match="whole minutes"):
        DDLContext(ttl=timedelta(seconds=90))
    with pytest.raises(SchemaError, match="once"):
        DDLContext(ttl=timedelta(hours=1), ttl_days=1)


def test_text_indexes_only_for_servers_that_have_them() -> None:
    old = render_ddl(list(TRACES_MIGRATIONS), DDLContext(server_version=(25, 8)))
    new = render_ddl(list(TRACES_MIGRATIONS), DDLContext(server_version=(26, 2)))
    unknown = render_ddl(list(TRACES_MIGRATIONS), DDLContext())
    assert "TYPE text(" not in old and "TYPE text(" not in unknown
    assert "idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01)" in old
    assert "idx_res_attr_items ResourceAttributeItems TYPE text(tokenizer = 'array')" in new
    assert "bloom_filter" not in new.split("-- collectors v2")[0]
    for ddl in (old, new):
        assert "idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8" in ddl
        assert "SpanAttributeItems Array(String) ALIAS arrayMap(" in ddl


def test_json_variant_ddl_enables_the_json_type_only_where_needed() -> None:
    json_ddl = render_ddl(list(TRACES_MIGRATIONS), DDLContext(variant="json", server_version=(25, 3)))
    assert "ResourceAttributes JSON COMMENT" in json_ddl and "Attributes JSON\n" in json_ddl
    table_ddl = json_ddl.split("-- collectors v2")[0]
    assert "AttributeItems" not in json_ddl and "idx_span_attr_value" not in table_ddl
    # The key lists the exporter writes beside each map, filled from the JSON paths by default.
    keys = "SpanAttributesKeys Array(LowCardinality(String)) DEFAULT JSONAllPaths(SpanAttributes)"
    assert keys in table_ddl
    assert "INDEX idx_span_attr_keys SpanAttributesKeys TYPE bloom_filter(0.01) GRANULARITY 1" in table_ddl
    assert "ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)" in json_ddl
    assert "enable_json_type" not in json_ddl
    older = render_ddl(list(TRACES_MIGRATIONS), DDLContext(variant="json", server_version=(24, 8)))
    assert "SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, enable_json_type = 1" in older


def test_a_span_table_made_elsewhere_is_found_and_gets_no_view_without_consent(raw_store: Store) -> None:
    create_variant(raw_store, "clickstack")
    report = apply_schema(raw_store, TRACES_MIGRATIONS)
    assert report.found == ["collectors v1 otel_traces"] and report.applied == []
    assert report.skipped == [f"collectors v2 otel_traces_trace_id_ts: {NOT_CREATED}"]
    assert "rerun with --yes" in NOT_CREATED
    assert not raw_store.table_exists("otel_traces_trace_id_ts_mv")
    assert migration_state(raw_store, "collectors", 1) == "found"
    assert migration_state(raw_store, "collectors", 2) is None
    assert inspect_traces(raw_store, refresh=True).created_by_tailwatch is False
    # Asked again (a later run): still skipped, still unrecorded.
    assert apply_schema(raw_store, TRACES_MIGRATIONS).skipped == report.skipped

    consented = apply_schema(raw_store, TRACES_MIGRATIONS, alter_foreign=True)
    assert consented.applied == ["collectors v2 otel_traces_trace_id_ts"]
    assert raw_store.table_exists("otel_traces_trace_id_ts_mv")
    insert_spans(raw_store, [_span()])
    assert raw_store.query_value("SELECT count() FROM otel_traces_trace_id_ts") == 1
    assert inspect_traces(raw_store, refresh=True).created_by_tailwatch is False


def test_lookup_made_by_the_collector_is_found_too(raw_store: Store) -> None:
    create_variant(raw_store, "collector_2026")
    report = apply_schema(raw_store, TRACES_MIGRATIONS)
    assert report.found == ["collectors v1 otel_traces", "collectors v2 otel_traces_trace_id_ts"]
    assert report.skipped == [] and report.applied == []
    assert migration_state(raw_store, "collectors", 2) == "found"


def test_tables_tailwatch_creates_are_recorded_as_its_own(store: Store) -> None:
    assert migration_state(store, "collectors", 1) == "applied"
    layout = inspect_traces(store, refresh=True)
    assert layout.created_by_tailwatch and layout.variant == "collector-2026"


def test_json_variant_creates_a_table_read_as_collector_json(raw_store: Store) -> None:
    apply_schema(raw_store, TRACES_MIGRATIONS, context=DDLContext(variant="json"))
    layout = inspect_traces(raw_store, refresh=True)
    assert layout.variant == "collector-json" and layout.json and layout.created_by_tailwatch
    assert layout.trace_id_lookup == "otel_traces_trace_id_ts (AggregatingMergeTree)"


def test_a_distributed_table_is_read_through_the_table_it_names() -> None:
    from collectors.layout import distributed_target

    # A Distributed otel_traces in tailwatch's database over the Collector's table in its own one:
    # the indexes are looked up there (the embedded engine has no cluster to make one for real).
    engine = "Distributed('c', 'otel', 'otel_traces', cityHash64(TraceId))"
    assert distributed_target(engine, "tw") == ("otel", "otel_traces")
    unquoted = "Distributed(c, '', otel_traces_local, rand())"
    assert distributed_target(unquoted, "tw") == ("tw", "otel_traces_local")
    assert distributed_target("Distributed('c', currentDatabase(), 'x')", "tw") == ("tw", "x")
    assert distributed_target("Distributed('c')", "tw") is None
    # The cluster too: where the summaries' deletes and partition drops go, ON CLUSTER.
    from collectors import distributed_parts

    assert distributed_parts(engine, "tw") == ("c", "otel", "otel_traces")
    assert distributed_parts("Distributed(`prod`, '', 'tailwatch_summary_requests_local')", "tw") == (
        "prod",
        "tw",
        "tailwatch_summary_requests_local",
    )
