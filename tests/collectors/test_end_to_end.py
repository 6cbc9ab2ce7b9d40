"""The official opentelemetry-python exporters → running receivers on loopback → otel_traces."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from collectors.exporter import ClickHouseSpanExporter
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.spans import read_spans
from storage import Store
from tests.collectors.otlp_samples import make_request


@pytest.fixture
def receivers(pipeline: IngestPipeline) -> Iterator[Receivers]:
    r = Receivers(pipeline, http="127.0.0.1:0", grpc="127.0.0.1:0", token="tok")
    r.start()
    try:
        yield r
    finally:
        r.stop()


def _emit(exporter: SpanExporter, service: str, n: int) -> dict[str, str]:
    """``n`` request traces with a child LLM span each; returns span_id → name."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": service, "deployment.environment": "test"})
    )
    provider.add_span_processor(
        BatchSpanProcessor(exporter, max_export_batch_size=64, schedule_delay_millis=50)
    )
    tracer = provider.get_tracer("tests.e2e", "2.0")
    names: dict[str, str] = {}
    for i in range(n):
        with tracer.start_as_current_span(
            "POST /chat", kind=SpanKind.SERVER, attributes={"http.response.status_code": 200, "i": i}
        ) as root:
            root.add_event("accepted", {"queue.depth": 3})
            names[format(root.get_span_context().span_id, "016x")] = "POST /chat"
            link = Link(root.get_span_context(), {"link.kind": "follows"})
            with tracer.start_as_current_span(
                "chat gpt-4o",
                kind=SpanKind.CLIENT,
                links=[link],
                attributes={
                    "gen_ai.usage.input_tokens": 120,
                    "temperature": 0.7,
                    "stream": True,
                    "tags": ["a", "b"],
                },
            ) as llm:
                llm.set_status(Status(StatusCode.ERROR, "rate limited"))
                names[format(llm.get_span_context().span_id, "016x")] = "chat gpt-4o"
    assert provider.force_flush(10_000)
    provider.shutdown()
    return names


def _check(store: Store, service: str, names: dict[str, str]) -> None:
    rows = [r for r in read_spans(store, dedupe=False).to_pylist() if r["ServiceName"] == service]
    assert len(rows) == len(names)  # every span exactly once, even without read dedup
    assert {r["SpanId"]: r["SpanName"] for r in rows} == names
    llm = next(r for r in rows if r["SpanName"] == "chat gpt-4o")
    root = next(r for r in rows if r["SpanId"] == llm["ParentSpanId"])
    assert root["ParentSpanId"] == ""
    assert (root["SpanKind"], llm["SpanKind"]) == ("Server", "Client")
    assert (llm["StatusCode"], llm["StatusMessage"]) == ("Error", "rate limited")
    assert llm["TraceId"] == root["TraceId"] and len(llm["TraceId"]) == 32
    assert dict(llm["SpanAttributes"]) == {
        "gen_ai.usage.input_tokens": "120",
        "temperature": "0.7",
        "stream": "true",
        "tags": '["a","b"]',
    }
    assert dict(root["ResourceAttributes"])["deployment.environment"] == "test"
    assert (root["ScopeName"], root["ScopeVersion"]) == ("tests.e2e", "2.0")
    assert root["Events.Name"] == ["accepted"]
    assert [dict(a) for a in root["Events.Attributes"]] == [{"queue.depth": "3"}]
    assert llm["Links.SpanId"] == [root["SpanId"]]
    assert [dict(a) for a in llm["Links.Attributes"]] == [{"link.kind": "follows"}]
    assert root["Duration"] > llm["Duration"] > 0


def test_official_http_protobuf_exporter(
    receivers: Receivers, pipeline: IngestPipeline, store: Store
) -> None:
    exporter = HttpExporter(
        endpoint=f"http://127.0.0.1:{receivers.http_port}/v1/traces",
        headers={"Authorization": "Bearer tok"},
        compression=HttpCompression.Gzip,
    )
    names = _emit(exporter, "http-svc", 150)
    assert pipeline.flush(10)
    _check(store, "http-svc", names)


def test_official_grpc_exporter(receivers: Receivers, pipeline: IngestPipeline, store: Store) -> None:
    exporter = GrpcExporter(
        endpoint=f"127.0.0.1:{receivers.grpc_port}",
        insecure=True,
        headers={"authorization": "Bearer tok"},
        compression=grpc.Compression.Gzip,
    )
    names = _emit(exporter, "grpc-svc", 150)
    assert pipeline.flush(10)
    _check(store, "grpc-svc", names)


def test_grpc_status_codes(receivers: Receivers, pipeline: IngestPipeline) -> None:
    request, _ = make_request(3)
    with grpc.insecure_channel(f"127.0.0.1:{receivers.grpc_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Export(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = (("authorization", "Bearer tok"),)
        bad = make_request(2)[0]
        bad.resource_spans[0].scope_spans[0].spans[1].trace_id = b"\x05" * 3
        response = stub.Export(bad, metadata=auth, timeout=5)
        assert response.partial_success.rejected_spans == 1
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(
                b"\x0a\xff\xff\xff", metadata=auth, timeout=5
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # 200k empty ResourceSpans (400 KB): refused off the wire, before the parse allocates them.
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")(
                b"\x0a\x00" * 200_000, metadata=auth, timeout=5
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "resource_spans" in str(
            info.value.details()
        )
        assert time.monotonic() - started < 2
        assert not stub.Export(request, metadata=auth, timeout=5).HasField("partial_success")


def test_retried_export_leaves_two_rows_and_reads_count_one(
    receivers: Receivers, pipeline: IngestPipeline, store: Store
) -> None:
    """A client that timed out and retried delivers the same spans twice: reads deduplicate."""
    request, expected = make_request(10, seed=42, service="retry-svc")
    body = request.SerializeToString()
    url = f"http://127.0.0.1:{receivers.http_port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", "Authorization": "Bearer tok"}
    for _ in range(2):
        assert httpx.post(url, content=body, headers=headers, timeout=10).status_code == 200
    assert pipeline.flush(10)
    raw = store.query_value("SELECT count() FROM otel_traces WHERE ServiceName = 'retry-svc'")
    assert raw == 20
    deduped = [r for r in read_spans(store).to_pylist() if r["ServiceName"] == "retry-svc"]
    assert sorted(r["SpanId"] for r in deduped) == sorted(e.span_id for e in expected)


def test_in_process_sdk_exporter(store: Store) -> None:
    names = _emit(ClickHouseSpanExporter(store), "sdk-svc", 40)
    _check(store, "sdk-svc", names)


def test_sdk_exporter_through_a_pipeline(pipeline: IngestPipeline, store: Store) -> None:
    exporter = ClickHouseSpanExporter(pipeline=pipeline)
    names = _emit(exporter, "sdk-pipe", 10)
    assert exporter.force_flush()
    _check(store, "sdk-pipe", names)
