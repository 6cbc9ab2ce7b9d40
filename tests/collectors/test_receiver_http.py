from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator

import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from collectors.pipeline import IngestPipeline
from collectors.receiver import create_http_app
from collectors.spans import read_spans
from storage import Store
from tests.collectors.otlp_samples import EXAMPLE_TRACE_JSON, make_request

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


@pytest.fixture
def client(pipeline: IngestPipeline) -> Iterator[TestClient]:
    async def extra(request: object) -> PlainTextResponse:
        return PlainTextResponse("mounted")

    app = create_http_app(pipeline, extra_routes=[Route("/api/v1/ping", extra)])
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c


def _stored(store: Store, pipeline: IngestPipeline) -> set[str]:
    assert pipeline.flush(10)
    return set(read_spans(store).column("SpanId").to_pylist())


def _valid(client: TestClient, seed: int) -> None:
    request, _ = make_request(3, seed=seed)
    response = client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    assert response.status_code == 200


def test_protobuf_json_and_gzip_exports_are_stored(
    client: TestClient, pipeline: IngestPipeline, store: Store
) -> None:
    request, expected = make_request(20, seed=1)
    r = client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-protobuf"
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")

    gz, expected_gz = make_request(5, seed=2)
    r = client.post(
        "/v1/traces",
        content=gzip.compress(gz.SerializeToString()),
        headers={**PB, "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200

    r = client.post(
        "/v1/traces", content=EXAMPLE_TRACE_JSON, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {}
    ids = {e.span_id for e in expected + expected_gz} | {"eee19b7ec3c1b174"}
    assert _stored(store, pipeline) == ids


def test_partial_success_keeps_valid_spans(
    client: TestClient, pipeline: IngestPipeline, store: Store
) -> None:
    request, expected = make_request(4, seed=3)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans.append(
        Span(trace_id=b"\x01" * 15, span_id=b"\x02" * 8, start_time_unix_nano=1, end_time_unix_nano=2)
    )
    spans.append(
        Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=5, end_time_unix_nano=2)
    )
    r = client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 2
    assert "2 of 6 spans rejected" in partial.error_message

    js = json.loads(EXAMPLE_TRACE_JSON)
    js["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "abc"
    r = client.post("/v1/traces", content=json.dumps(js).encode(), headers=JS)
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"
    assert _stored(store, pipeline) == {e.span_id for e in expected}


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"\x0a\xff\xff\xff\x0f", PB, 400),  # truncated protobuf
        (b'{"resourceSpans": [', JS, 400),  # truncated JSON
        (b"[" * 10_000 + b"]" * 10_000, JS, 400),  # 10k-deep nesting
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\xc3\x28"}]}]}]}', JS, 400),  # bad UTF-8
        (b"hello", {"Content-Type": "text/plain"}, 415),
        (b"hello", {}, 415),
        (b"\x1f\x8b\x08\x00garbage", {**PB, "Content-Encoding": "gzip"}, 400),
        (b"x", {**PB, "Content-Encoding": "br"}, 415),
    ],
)
def test_hostile_requests_get_4xx_and_the_next_valid_one_succeeds(
    client: TestClient, body: bytes, headers: dict[str, str], status: int
) -> None:
    r = client.post("/v1/traces", content=body, headers=headers)
    assert r.status_code == status
    if headers.get("Content-Type") == "application/json":
        assert r.json()["code"] == code_pb2.INVALID_ARGUMENT
    elif headers.get("Content-Type") not in PB.values():
        # Neither OTLP encoding: a plain sentence, not a protobuf Status starting with a tag byte.
        assert r.headers["content-type"].startswith("text/plain")
        assert r.text.startswith("unsupported content type ") and r.text.endswith("\n")
    else:
        assert status_pb2.Status.FromString(r.content).message
    _valid(client, seed=status)


def test_metrics_exposition_types_process_series_and_no_created(client: TestClient) -> None:
    """A plain scrape gets the 0.0.4 text format every scraper reads; Prometheus's OpenMetrics
    request gets OpenMetrics; neither carries ``_created`` series, both the ``process_*`` ones."""
    _valid(client, seed=3)
    plain = client.get("/metrics")
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "_created" not in plain.text
    assert "process_cpu_seconds_total " in plain.text and "process_open_fds " in plain.text
    assert "python_info{" in plain.text
    assert 'tailwatch_ingest_requests_total{protocol="http",status="200"} 1.0' in plain.text
    prometheus_accept = (
        "application/openmetrics-text;version=1.0.0;escaping=underscores;q=0.5,"
        "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
    )
    om = client.get("/metrics", headers={"Accept": prometheus_accept})
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n") and "_created" not in om.text
    assert "process_cpu_seconds_total " in om.text


def test_body_limits_hold_before_and_after_decompression(pipeline: IngestPipeline) -> None:
    small = IngestPipeline(
        pipeline.store,
        type(pipeline.settings)(max_request_bytes=64 * 1024, flush_interval_s=0.05),
    )
    small.start()
    try:
        with TestClient(create_http_app(small), base_url="http://127.0.0.1") as c:
            request, _ = make_request(1)
            span = request.resource_spans[0].scope_spans[0].spans[0]
            span.attributes.add(key="huge").value.string_value = "x" * 200_000  # a huge attribute value
            r = c.post("/v1/traces", content=request.SerializeToString(), headers=PB)
            assert r.status_code == 413
            # A gzip bomb: 1 GiB of zeros in ~1 MiB; the cap stops inflating at the limit.
            inflater = zlib.compressobj(9, zlib.DEFLATED, 31)
            chunk = bytes(1 << 20)
            bomb = b"".join(inflater.compress(chunk) for _ in range(1024)) + inflater.flush()
            assert len(bomb) < 2 << 20
            r = c.post("/v1/traces", content=bomb, headers={**PB, "Content-Encoding": "gzip"})
            assert r.status_code == 413
            request, _ = make_request(2)
            r = c.post("/v1/traces", content=request.SerializeToString(), headers=PB)
            assert r.status_code == 200
    finally:
        small.stop()


def test_bearer_token(pipeline: IngestPipeline) -> None:
    with TestClient(create_http_app(pipeline, token="s3cret"), base_url="http://127.0.0.1") as c:
        body = make_request(1)[0].SerializeToString()
        assert c.post("/v1/traces", content=body, headers=PB).status_code == 401
        wrong = {**PB, "Authorization": "Bearer s3cre"}
        assert c.post("/v1/traces", content=body, headers=wrong).status_code == 401
        right = {**PB, "Authorization": "Bearer s3cret"}
        assert c.post("/v1/traces", content=body, headers=right).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes stay open


def test_health_readiness_metrics_and_extra_routes(client: TestClient, pipeline: IngestPipeline) -> None:
    assert client.get("/healthz").text == "ok\n"
    assert client.get("/readyz").status_code == 200
    assert client.get("/api/v1/ping").text == "mounted"
    request, _ = make_request(7)
    client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    bad = make_request(1)[0]
    bad.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01"
    client.post("/v1/traces", content=bad.SerializeToString(), headers=PB)
    assert pipeline.flush(10)
    text = client.get("/metrics").text
    assert 'tailwatch_ingest_spans_received_total{protocol="http"} 8.0' in text
    assert 'tailwatch_ingest_spans_accepted_total{protocol="http"} 7.0' in text
    assert 'tailwatch_ingest_spans_rejected_total{protocol="http"} 1.0' in text
    assert "tailwatch_ingest_queue_spans 0.0" in text
    assert "tailwatch_ingest_batch_rows_count" in text
    assert "tailwatch_ingest_insert_seconds_bucket" in text
    pipeline.stop()
    assert client.get("/readyz").status_code == 503
    r = client.post("/v1/traces", content=request.SerializeToString(), headers=PB)
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "1"
