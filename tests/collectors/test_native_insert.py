"""ClickHouse-side mapping of raw OTLP protobuf: identical rows to the Python (Arrow) mapping."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.testclient import TestClient

from collectors.grpc_receiver import GrpcReceiver
from collectors.native_insert import NativeInserter, native_sample, self_test
from collectors.otlp_decode import request_to_arrow, validate_request
from collectors.pipeline import IngestPipeline
from collectors.receiver import create_http_app
from collectors.settings import PipelineSettings
from collectors.spans import read_spans
from storage import Store
from tests.collectors.otlp_samples import kv, make_request


def test_native_mapping_matches_python_mapping(store: Store) -> None:
    request, _ = make_request(50, seed=5, attributes=18)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].attributes.append(kv("tiny", 2.5e-9))  # Go exponent form: handled by the Python path
    spans[1].attributes.append(kv("bytes", b"\x00\x01\xfe"))
    assert (
        self_test(
            store,
            [native_sample(), request.SerializeToString(), make_request(3, seed=6)[0].SerializeToString()],
        )
        is None
    )


def test_a_duplicate_service_name_maps_the_same_either_way(store: Store) -> None:
    # Regression: the native path kept the first of two service.name attributes (a ClickHouse map
    # lookup), the Python path the last.
    request, _ = make_request(3, seed=8)
    request.resource_spans[0].resource.attributes.append(kv("service.name", "the-second"))
    assert self_test(store, [native_sample(), request.SerializeToString()]) is None
    first = next(
        a.value.string_value for a in request.resource_spans[0].resource.attributes if a.key == "service.name"
    )
    assert set(request_to_arrow(request).table.column("ServiceName").to_pylist()) == {first}


def _random_value(rnd: random.Random) -> object:
    kind = rnd.randrange(6)
    if kind == 0:
        return "".join(rnd.choice('aZ09 <>&"\\/\n\tüß😀\u2028') for _ in range(rnd.randrange(8)))
    if kind == 1:
        return rnd.choice([0, -1, 2**63 - 1, -(2**63), rnd.randrange(-(10**12), 10**12)])
    if kind == 2:
        edge = [0.0, -0.0, 1e-6, 9.99e-7, 1e21, 9.999999999999999e20, 5e-324, 1.7976931348623157e308, 0.1]
        return rnd.choice([*edge, rnd.uniform(-1e6, 1e6), struct.unpack("<d", rnd.randbytes(8))[0]])
    if kind == 3:
        return rnd.random() < 0.5
    return rnd.randbytes(rnd.randrange(7))


def test_randomized_attribute_values_map_identically(store: Store) -> None:
    rnd = random.Random(20261202)
    bodies = []
    for n in range(12):
        request, _ = make_request(8, seed=100 + n, attributes=0)
        for span in request.resource_spans[0].scope_spans[0].spans:
            span.attributes.extend(kv(f"k{i}", _random_value(rnd)) for i in range(rnd.randrange(12)))
        bodies.append(request.SerializeToString())
    assert self_test(store, bodies) is None


def test_validate_request_agrees_with_the_mapping() -> None:
    request, _ = make_request(6, seed=8)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[1].trace_id = b"\x01" * 3
    spans[4].end_time_unix_nano = spans[4].start_time_unix_nano - 1
    spans.add(
        trace_id=b"\x02" * 16, span_id=b"\x03" * 8, start_time_unix_nano=1, end_time_unix_nano=2
    ).links.add(trace_id=b"\x04" * 5)
    full = request_to_arrow(request)
    copy = ExportTraceServiceRequest.FromString(request.SerializeToString())
    received, rejected, message = validate_request(copy)
    assert (
        (received, rejected, message) == (full.received, full.rejected, full.error_message) == (7, 3, message)
    )
    cleaned = request_to_arrow(copy)
    assert (cleaned.received, cleaned.rejected) == (4, 0)
    assert cleaned.table.equals(full.table)


def test_fallback_requests_go_through_python(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    inserter = NativeInserter(store, Path("relative-work-dir"))
    plain, _ = make_request(4, seed=1)
    nested, _ = make_request(2, seed=2)
    nested.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="arr").value.array_value.values.add(
        string_value="x"
    )
    inserter.insert([plain.SerializeToString(), nested.SerializeToString()])
    assert inserter.python_requests == 1
    rows = {r["SpanId"]: r for r in read_spans(store).to_pylist()}
    assert len(rows) == 6
    span_id = nested.resource_spans[0].scope_spans[0].spans[0].span_id.hex()
    assert dict(rows[span_id]["SpanAttributes"])["arr"] == '["x"]'


def test_a_request_clickhouse_cannot_parse_does_not_block_the_queue(store: Store, tmp_path: Path) -> None:
    request, expected = make_request(3, seed=12)
    first = request.resource_spans[0].scope_spans[0].spans[0]
    # Field 9 (attributes) once more with the varint wire type: upb keeps it as an unknown field,
    # ClickHouse's Protobuf parser refuses the message.
    first.CopyFrom(Span.FromString(first.SerializeToString() + b"\x48\x01"))
    good, expected_good = make_request(2, seed=13)
    inserter = NativeInserter(store, tmp_path)
    inserter.insert([request.SerializeToString(), good.SerializeToString()])
    assert inserter.python_requests == 2
    assert sorted(read_spans(store).column("SpanId").to_pylist()) == sorted(
        e.span_id for e in expected + expected_good
    )


@pytest.mark.parametrize("native", [True, False])
def test_receiver_rows_are_the_same_either_way(store: Store, tmp_path: Path, native: bool) -> None:
    pipeline = IngestPipeline(
        store, PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s", native_insert=native)
    )
    pipeline.start()
    try:
        assert pipeline.accepts_raw is native
        request, _ = make_request(5, seed=11)
        bad = request.resource_spans[0].scope_spans[0].spans.add(trace_id=b"\x01", span_id=b"\x02" * 8)
        bad.kind = Span.SPAN_KIND_CLIENT
        with TestClient(create_http_app(pipeline), base_url="http://127.0.0.1") as client:
            r = client.post(
                "/v1/traces",
                content=request.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert r.status_code == 200
        over_grpc, _ = make_request(4, seed=12)
        over_grpc.resource_spans[0].scope_spans[0].spans.add(trace_id=b"\x01" * 16, span_id=b"\x02")
        receiver = GrpcReceiver(pipeline, "127.0.0.1", 0)
        receiver.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
                response = trace_service_pb2_grpc.TraceServiceStub(channel).Export(over_grpc, timeout=10)
            assert response.partial_success.rejected_spans == 1
        finally:
            receiver.stop()
        assert pipeline.flush(10)
    finally:
        pipeline.stop()
    request.MergeFrom(over_grpc)
    expected = request_to_arrow(request).table.sort_by("SpanId")
    stored = read_spans(store).sort_by("SpanId")
    assert stored.num_rows == expected.num_rows == 9
    for name in ("TraceId", "SpanId", "SpanAttributes", "ResourceAttributes", "Duration", "SpanKind"):
        assert stored.column(name).to_pylist() == expected.column(name).to_pylist()
