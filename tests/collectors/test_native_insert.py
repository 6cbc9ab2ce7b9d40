"""ClickHouse-side mapping of raw OTLP protobuf: identical rows to the Python (Arrow) mapping."""

from __future__ import annotations

import random
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.testclient import TestClient

from collectors.grpc_receiver import GrpcReceiver
from collectors.native_insert import (
    _CHECK_STRUCTURE,
    _FALLBACK,
    FILE_SOURCE,
    INPUT_SOURCE,
    NativeInserter,
    _records,
    mapping_select,
    native_sample,
    needs_python_mapping,
    self_test,
)
from collectors.otlp_decode import request_to_arrow, validate_request
from collectors.pipeline import IngestPipeline
from collectors.receiver import create_http_app
from collectors.settings import PipelineSettings
from collectors.spans import read_spans
from storage import Store, ensure_schema, open_store, parse_dsn
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


def random_bodies(seed: int, requests: int, spans: int, attributes: int, key: str = "k{i}") -> list[bytes]:
    """Serialized requests whose spans carry up to ``attributes`` random values of every OTLP type,
    under keys ``key`` (formatted with the attribute's index ``i`` and ``m`` = i mod 3)."""
    rnd = random.Random(seed)
    bodies = []
    for n in range(requests):
        request, _ = make_request(spans, seed=seed % 1000 + n, attributes=0)
        for span in request.resource_spans[0].scope_spans[0].spans:
            count = rnd.randrange(attributes)
            span.attributes.extend(kv(key.format(i=i, m=i % 3), _random_value(rnd)) for i in range(count))
        bodies.append(request.SerializeToString())
    return bodies


def test_randomized_attribute_values_map_identically(store: Store) -> None:
    assert self_test(store, random_bodies(20261202, 12, 8, 12)) is None


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


# --- server stores: the batch as the INSERT's body, read by input() ------------------------------


class _ServerShapedClient:
    """The embedded engine behind the calls a server store makes.

    A statement sent with a body (``INSERT … SELECT … FROM input(S) … FORMAT F`` + data) runs with
    ``input(S)`` replaced by ``file(<the body>, F, S)``: the embedded engine takes no request body,
    so this stands in for the server's ``input()``. The inline schema (``format_schema_source =
    'string'``) reaches the engine as a file holding the same text: the engine caches inline schemas
    in the directory where the process first used the Protobuf format, which may be the checkout.
    Everything else (SQL text, parameters, other settings) reaches the engine as sent.
    """

    def __init__(self, client: Any, work: Path) -> None:
        self._client = client
        self._work = work
        self.sent: list[tuple[str, dict[str, Any], dict[str, Any], bytes]] = []

    def command(
        self,
        cmd: str,
        parameters: dict[str, Any] | None = None,
        data: bytes | None = None,
        settings: dict[str, Any] | None = None,
    ) -> Any:
        if data is None:
            return self._client.command(cmd, parameters=parameters, settings=settings)
        self.sent.append((cmd, dict(parameters or {}), dict(settings or {}), data))
        fmt = re.search(r"\sFORMAT (\w+)\s*$", cmd)
        assert fmt is not None and INPUT_SOURCE in cmd
        body = self._work / f"body-{len(self.sent)}.bin"
        body.write_bytes(data)
        as_file = cmd[: fmt.start()].replace(
            INPUT_SOURCE, f"file({{body_path:String}}, '{fmt.group(1)}', {{structure:String}})"
        )
        settings = dict(settings or {})
        if settings.get("format_schema_source") == "string":
            schema = self._work / f"schema-{len(self.sent)}.proto"
            schema.write_text(settings.pop("format_schema"))
            message = settings.pop("format_schema_message_name")
            settings.update(format_schema_source="file", format_schema=f"{schema}:{message}")
        return self._client.command(
            as_file, parameters={**(parameters or {}), "body_path": str(body)}, settings=settings
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def server_store(store_dsn: str, tmp_path: Path) -> Iterator[Store]:
    """A fresh embedded store seen as a ClickHouse server (``http://…``) through
    :class:`_ServerShapedClient`."""
    (tmp_path / "bodies").mkdir()
    embedded = open_store(store_dsn)
    try:
        ensure_schema(embedded)
        client = _ServerShapedClient(embedded.client, tmp_path / "bodies")
        yield Store(parse_dsn("http://default@clickhouse.test:8123/default"), client, shares=embedded)
    finally:
        embedded.close()


def test_one_mapping_select_for_both_sources() -> None:
    for json in (False, True):
        embedded, server = mapping_select(FILE_SOURCE, json), mapping_select(INPUT_SOURCE, json)
        assert embedded.count(FILE_SOURCE) == server.count(INPUT_SOURCE) == 1
        assert server.replace(INPUT_SOURCE, FILE_SOURCE) == embedded


def test_server_path_sends_the_batch_as_the_body_with_an_inline_schema(server_store: Store) -> None:
    assert NativeInserter.supported(server_store)
    plain, expected = make_request(4, seed=21)
    nested, expected_nested = make_request(2, seed=22)
    nested.resource_spans[0].scope_spans[0].spans[1].attributes.append(kv("tiny", 2.5e-9))
    inserter = NativeInserter(server_store)
    inserter.insert([plain.SerializeToString(), nested.SerializeToString()])
    assert inserter.python_requests == 1
    client = server_store.client
    assert isinstance(client, _ServerShapedClient)
    ((sql, params, settings, body),) = client.sent
    assert "FROM input({structure:String})" in sql and sql.endswith("FORMAT Protobuf")
    assert params["python"] == [1]
    assert settings["format_schema_source"] == "string"
    assert settings["format_schema_message_name"] == "Request"
    assert "message Request" in settings["format_schema"]
    assert plain.SerializeToString() in body and nested.SerializeToString() in body
    stored = read_spans(server_store)
    assert sorted(stored.column("SpanId").to_pylist()) == sorted(
        e.span_id for e in expected + expected_nested
    )


def test_server_path_maps_like_python(server_store: Store) -> None:
    assert self_test(server_store, [native_sample(), *random_bodies(20261203, 8, 6, 10)]) is None


def test_server_pipeline_takes_raw_requests(server_store: Store, tmp_path: Path) -> None:
    pipeline = IngestPipeline(server_store, PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s"))
    pipeline.start()
    try:
        assert pipeline.accepts_raw
        request, _ = make_request(5, seed=31)
        assert pipeline.submit_raw(request.SerializeToString(), 5).ok
        assert pipeline.flush(10)
    finally:
        pipeline.stop()
    expected = request_to_arrow(request).table.sort_by("SpanId")
    stored = read_spans(server_store).sort_by("SpanId")
    for name in ("TraceId", "SpanId", "SpanAttributes", "ResourceAttributes", "Duration", "SpanKind"):
        assert stored.column(name).to_pylist() == expected.column(name).to_pylist()


def test_python_check_agrees_with_the_sql_scan(store: Store, tmp_path: Path) -> None:
    # The server path decides in Python which requests the Python mapping takes; the embedded path
    # asks ClickHouse. Both must pick the same requests.
    rnd = random.Random(7)
    bodies = [native_sample()]
    for n in range(40):
        request, _ = make_request(2, seed=400 + n, attributes=0)
        span = request.resource_spans[0].scope_spans[0].spans[n % 2]
        target = [request.resource_spans[0].resource.attributes, span.attributes]
        target.append(span.events.add(time_unix_nano=span.start_time_unix_nano, name="e").attributes)
        target.append(span.links.add(trace_id=b"\x05" * 16, span_id=b"\x06" * 8).attributes)
        kind = rnd.randrange(4)
        if kind == 0:
            value = kv("v", _random_value(rnd))
        elif kind == 1:
            value = kv("v", rnd.choice([1e-7, 1e21, -1e22, 1e-6, 5e20, float("nan"), float("inf"), 0.0]))
        else:
            value = kv("v", 1)
            value.value.ClearField("int_value")
            if kind == 2:
                value.value.array_value.values.add(int_value=1)
            else:
                value.value.kvlist_value.values.add(key="k", value=AnyValue(string_value="x"))
        target[rnd.randrange(4)].append(value)
        bodies.append(request.SerializeToString())
    path = tmp_path / "batch.binpb"
    path.write_bytes(_records(bodies))
    inserter = NativeInserter(store, tmp_path)
    rows = store.query_rows(
        _FALLBACK,
        {"path": str(path), "structure": _CHECK_STRUCTURE},
        settings={
            "input_format_protobuf_oneof_presence": 1,
            "format_schema": f"{inserter._schema_file()}:Request",
        },
    )
    by_sql = sorted(int(r[0]) for r in rows)
    by_python = [
        i for i, b in enumerate(bodies) if needs_python_mapping(ExportTraceServiceRequest.FromString(b))
    ]
    assert by_python == by_sql
    assert 0 < len(by_sql) < len(bodies)
