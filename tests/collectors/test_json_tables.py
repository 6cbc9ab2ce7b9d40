"""Writes into the Collector's ``json: true`` table (``*Attributes JSON``): the ClickHouse-side
mapping, the Arrow path and ``insert_spans`` store what the SDK recorded, dotted keys as paths."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind

from collectors.layout import inspect_traces
from collectors.native_insert import native_sample, self_test
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from collectors.spans import SpanEvent, SpanLink, SpanRow, insert_spans
from storage import Store
from tests.collectors.otlp_samples import kv, make_request

# The Collector's template for `json: true` (database, cluster clause, engine and TTL filled in).
JSON_TRACES_DDL = """CREATE TABLE IF NOT EXISTS otel_traces (
    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)), TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)), TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)), SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)), ResourceAttributes JSON CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)), ScopeVersion String CODEC(ZSTD(1)), SpanAttributes JSON CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)), StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (Timestamp DateTime64(9), Name LowCardinality(String), Attributes JSON) CODEC(ZSTD(1)),
    Links Nested (TraceId String, SpanId String, TraceState String, Attributes JSON) CODEC(ZSTD(1)),
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
SETTINGS index_granularity=8192, ttl_only_drop_parts = 1"""


@pytest.fixture
def json_store(raw_store: Store) -> Store:
    raw_store.command(JSON_TRACES_DDL)
    assert inspect_traces(raw_store).json
    return raw_store


@pytest.fixture(params=[True, False], ids=["clickhouse-mapping", "arrow-path"])
def json_receivers(json_store: Store, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Receivers]:
    native: bool = request.param
    pipeline = IngestPipeline(
        json_store,
        PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "spool", native_insert=native),
    )
    pipeline.start()
    assert pipeline.accepts_raw is native
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    receivers.start()
    try:
        yield receivers
    finally:
        receivers.stop()
        pipeline.stop()


def _as_string(value: Any) -> str:
    """pdata ``AsString()`` of the values this test's SDK spans carry."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(list(value), separators=(",", ":"))


def _paths(text: str) -> dict[str, str]:
    """A JSON column's text as ``{dotted path: value}``."""

    def walk(node: dict[str, Any], prefix: str) -> Iterator[tuple[str, str]]:
        for key, value in node.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return dict(walk(json.loads(text), ""))


def _expected(attributes: Any) -> dict[str, str]:
    return {key: _as_string(value) for key, value in dict(attributes or {}).items()}


def _stored(store: Store) -> dict[str, dict[str, Any]]:
    rows = store.query_rows(
        "SELECT SpanId, ServiceName, SpanName, toString(getSubcolumn(SpanAttributes, 'gen_ai.system')), "
        "toJSONString(SpanAttributes), toJSONString(ResourceAttributes), "
        "arrayMap(a -> toJSONString(a), `Events.Attributes`), `Events.Name`, "
        "arrayMap(a -> toJSONString(a), `Links.Attributes`), `Links.SpanId` FROM otel_traces"
    )
    names = (
        "service",
        "name",
        "gen_ai.system",
        "span",
        "resource",
        "events",
        "event_names",
        "links",
        "link_ids",
    )
    return {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}


def test_sdk_spans_are_stored_in_json_columns(json_store: Store, json_receivers: Receivers) -> None:
    recorded = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "json-svc", "deployment.env": "test"})
    )
    provider.add_span_processor(SimpleSpanProcessor(recorded))
    provider.add_span_processor(
        BatchSpanProcessor(
            HttpExporter(endpoint=f"http://127.0.0.1:{json_receivers.http_port}/v1/traces"),
            schedule_delay_millis=50,
        )
    )
    tracer = provider.get_tracer("tests.json", "1.0")
    for i in range(20):
        with tracer.start_as_current_span("POST /chat", kind=SpanKind.SERVER, attributes={"i": i}) as root:
            root.add_event("accepted", {"queue.depth": 3, "queue.name": "chat"})
            attributes: dict[str, Any] = {
                "gen_ai.system": "openai",
                "gen_ai.usage.input_tokens": 100 + i,
                "gen_ai.request.temperature": 0.5,
                "stream": i % 2 == 0,
            }
            if i == 7:  # an array value: this request goes through the Python mapping
                attributes["tags"] = ["a", "b"]
            link = Link(root.get_span_context(), {"link.kind": "follows"})
            with tracer.start_as_current_span("chat gpt-4o", kind=SpanKind.CLIENT, links=[link]) as llm:
                llm.set_attributes(attributes)
    assert provider.force_flush(10_000)
    provider.shutdown()
    pipeline = json_receivers.pipeline
    assert pipeline.flush(10)

    stored = _stored(json_store)
    spans: list[ReadableSpan] = list(recorded.get_finished_spans())
    assert len(stored) == len(spans) == 40
    for span in spans:
        assert span.context is not None
        row = stored[format(span.context.span_id, "016x")]
        assert (row["service"], row["name"]) == ("json-svc", span.name)
        assert _paths(row["span"]) == _expected(span.attributes)
        assert row["gen_ai.system"] == _expected(span.attributes).get("gen_ai.system", "")
        assert _paths(row["resource"]) == _expected(span.resource.attributes)
        assert row["event_names"] == [e.name for e in span.events]
        assert [_paths(a) for a in row["events"]] == [_expected(e.attributes) for e in span.events]
        assert row["link_ids"] == [format(link.context.span_id, "016x") for link in span.links]
        assert [_paths(a) for a in row["links"]] == [_expected(link.attributes) for link in span.links]


def test_insert_spans_writes_a_json_table(json_store: Store) -> None:
    rows = [
        SpanRow(
            trace_id="ab" * 16,
            span_id="cd" * 8,
            name="chat",
            start_ns=1_767_225_600_000_000_000,
            duration_ns=5_000,
            service="svc",
            attributes={"gen_ai.system": "anthropic", "gen_ai.usage.output_tokens": "42"},
            events=(SpanEvent(1_767_225_600_000_001_000, "token", {"n": "1"}),),
            links=(SpanLink("ef" * 16, "01" * 8, attributes={"a.b": "c"}),),
        )
    ]
    # A repeated key keeps its first value, as on the ClickHouse-side mapping.
    table = insert_spans(json_store, rows)
    assert table == 1
    (row,) = _stored(json_store).values()
    assert row["gen_ai.system"] == "anthropic"
    assert _paths(row["span"]) == {"gen_ai.system": "anthropic", "gen_ai.usage.output_tokens": "42"}
    assert _paths(row["resource"]) == {"service.name": "svc"}
    assert [_paths(a) for a in row["events"]] == [{"n": "1"}]
    assert [_paths(a) for a in row["links"]] == [{"a.b": "c"}]


def test_repeated_keys_keep_their_first_value_either_way(json_store: Store) -> None:
    request, _ = make_request(3, seed=3)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.extend([kv("dup", "first"), kv("dup", "second"), kv("a", "leaf"), kv("a.b", "nested")])
    assert self_test(json_store, [native_sample(), request.SerializeToString()]) is None
    insert_spans(json_store, [SpanRow("12" * 16, "34" * 8, "x", 1, 1, attributes={"k": "v"})])
    from collectors.otlp_decode import request_to_arrow

    insert_spans(json_store, request_to_arrow(request).table)
    value = json_store.query_value(
        "SELECT toString(getSubcolumn(SpanAttributes, 'dup')) FROM otel_traces WHERE SpanId = {s:String}",
        {"s": span.span_id.hex()},
    )
    assert value == "first"


def test_randomized_values_map_identically_on_json_tables(json_store: Store) -> None:
    from tests.collectors.test_native_insert import random_bodies

    # Dotted keys sharing prefixes: nested paths in the JSON columns.
    bodies = random_bodies(20261204, 8, 6, 10, key="k.{m}.{i}")
    assert self_test(json_store, [native_sample(), *bodies]) is None
