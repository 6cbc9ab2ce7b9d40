from __future__ import annotations

import base64
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from collectors.otlp_decode import (
    OtlpDecodeError,
    any_value_to_string,
    decode_json,
    decode_protobuf,
    format_double,
    request_to_arrow,
)
from collectors.schema import TRACES_ARROW_SCHEMA
from tests.collectors.otlp_samples import EXAMPLE_TRACE_JSON, kv, make_request

TRACE = bytes.fromhex("5b8efff798038103d269b633813fc60c")
SPAN = bytes.fromhex("eee19b7ec3c1b174")


def _one(span: Span, resource: list[KeyValue] | None = None) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=resource or []), scope_spans=[ScopeSpans(spans=[span])]
            )
        ]
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.25, "0.25"),
        (-2.5, "-2.5"),
        (0.0, "0"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e-7, "1.5e-7"),
        (1e-6, "0.000001"),
        (123456789.125, "123456789.125"),
        (1e16, "10000000000000000"),
        (2.5e-10, "2.5e-10"),
        (float("nan"), "json: unsupported value: NaN"),
        (float("inf"), "json: unsupported value: +Inf"),
    ],
)
def test_doubles_print_like_pdata(value: float, text: str) -> None:
    assert format_double(value) == text


def test_any_value_strings_match_pdata_as_string() -> None:
    nested = AnyValue(
        kvlist_value=KeyValueList(
            values=[
                KeyValue(key="z", value=AnyValue(int_value=1)),
                KeyValue(key="a", value=AnyValue(string_value="<b>&")),
                KeyValue(
                    key="m", value=AnyValue(array_value=ArrayValue(values=[AnyValue(double_value=2.0)]))
                ),
                KeyValue(key="n", value=AnyValue()),
            ]
        )
    )
    cases = [
        (AnyValue(string_value="plain"), "plain"),
        (AnyValue(int_value=-42), "-42"),
        (AnyValue(bool_value=True), "true"),
        (AnyValue(bool_value=False), "false"),
        (AnyValue(double_value=3.0), "3"),
        (AnyValue(bytes_value=b"\x00\xffhi"), base64.b64encode(b"\x00\xffhi").decode()),
        (
            AnyValue(
                array_value=ArrayValue(
                    values=[AnyValue(string_value="a"), AnyValue(int_value=2), AnyValue(bool_value=True)]
                )
            ),
            '["a",2,true]',
        ),
        # encoding/json: sorted keys, HTML escaping, Go float form, null for an empty value.
        (nested, '{"a":"\\u003cb\\u003e\\u0026","m":[2],"n":null,"z":1}'),
        (AnyValue(), ""),
    ]
    for value, text in cases:
        assert any_value_to_string(value) == text


def test_span_maps_to_collector_columns() -> None:
    span = Span(
        trace_id=TRACE,
        span_id=SPAN,
        parent_span_id=bytes(8),  # all-zero parent is a root: ''
        trace_state="k=v",
        name="chat gpt-4o",
        kind=Span.SPAN_KIND_CLIENT,
        start_time_unix_nano=1_000_000_000,
        end_time_unix_nano=1_250_000_000,
        attributes=[kv("n", 7), kv("f", 0.5), kv("b", True), kv("s", "x")],
        status=Status(code=Status.STATUS_CODE_ERROR, message="boom"),
        events=[Span.Event(time_unix_nano=1_100_000_000, name="retry", attributes=[kv("attempt", 2)])],
        links=[Span.Link(trace_id=TRACE, span_id=bytes.fromhex("0102030405060708"), trace_state="a=b")],
    )
    decoded = request_to_arrow(_one(span, [kv("service.name", "svc"), kv("host.name", "h")]))
    assert decoded.table.schema == TRACES_ARROW_SCHEMA
    row = decoded.table.to_pylist()[0]
    assert row["Timestamp"].value == 1_000_000_000
    assert row["TraceId"] == "5b8efff798038103d269b633813fc60c"
    assert row["SpanId"] == "eee19b7ec3c1b174"
    assert row["ParentSpanId"] == ""
    assert (row["SpanKind"], row["StatusCode"], row["StatusMessage"]) == ("Client", "Error", "boom")
    assert row["Duration"] == 250_000_000
    assert row["ServiceName"] == "svc"
    assert dict(row["ResourceAttributes"]) == {"service.name": "svc", "host.name": "h"}
    assert dict(row["SpanAttributes"]) == {"n": "7", "f": "0.5", "b": "true", "s": "x"}
    assert [t.value for t in row["Events.Timestamp"]] == [1_100_000_000]
    assert row["Events.Name"] == ["retry"]
    assert [dict(a) for a in row["Events.Attributes"]] == [{"attempt": "2"}]
    assert row["Links.TraceId"] == ["5b8efff798038103d269b633813fc60c"]
    assert row["Links.SpanId"] == ["0102030405060708"]
    assert row["Links.TraceState"] == ["a=b"]
    assert row["TraceState"] == "k=v"


def test_unknown_enum_values_map_to_empty_like_the_collector() -> None:
    span = Span(trace_id=TRACE, span_id=SPAN, kind=9, start_time_unix_nano=1, end_time_unix_nano=2)
    span.status.code = 7  # type: ignore[assignment]
    row = request_to_arrow(_one(span)).table.to_pylist()[0]
    assert (row["SpanKind"], row["StatusCode"], row["ServiceName"]) == ("", "", "")


def test_invalid_spans_are_rejected_individually() -> None:
    good = Span(trace_id=TRACE, span_id=SPAN, start_time_unix_nano=10, end_time_unix_nano=20)
    bad = [
        Span(trace_id=TRACE[:15], span_id=SPAN, start_time_unix_nano=10, end_time_unix_nano=20),
        Span(trace_id=TRACE, span_id=SPAN[:7], start_time_unix_nano=10, end_time_unix_nano=20),
        Span(trace_id=bytes(16), span_id=SPAN, start_time_unix_nano=10, end_time_unix_nano=20),
        Span(
            trace_id=TRACE,
            span_id=SPAN,
            parent_span_id=b"\x01",
            start_time_unix_nano=10,
            end_time_unix_nano=20,
        ),
        Span(trace_id=TRACE, span_id=SPAN, start_time_unix_nano=20, end_time_unix_nano=10),
        Span(
            trace_id=TRACE,
            span_id=SPAN,
            start_time_unix_nano=1,
            end_time_unix_nano=2,
            events=[Span.Event(time_unix_nano=2**63, name="far future")],
        ),
    ]
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[bad[0], good, *bad[1:]])])]
    )
    decoded = request_to_arrow(request)
    assert (decoded.received, decoded.accepted, decoded.rejected) == (7, 1, 6)
    assert "6 of 7 spans rejected" in decoded.error_message
    assert "trace_id" in decoded.error_message


def test_resources_and_scopes_repeat_per_span() -> None:
    request, expected = make_request(5, service="a")
    other, expected_b = make_request(3, seed=1, service="b")
    request.resource_spans.extend(other.resource_spans)
    table = request_to_arrow(request).table
    assert table.column("ServiceName").to_pylist() == ["a"] * 5 + ["b"] * 3
    assert table.column("ScopeName").to_pylist() == ["tests.scope"] * 8
    assert table.column("SpanId").to_pylist() == [e.span_id for e in expected + expected_b]
    assert table.column("Duration").to_pylist() == [e.duration_ns for e in expected + expected_b]


def test_example_trace_json() -> None:
    row = request_to_arrow(decode_json(EXAMPLE_TRACE_JSON)).table.to_pylist()[0]
    assert row["TraceId"] == "5b8efff798038103d269b633813fc60c"
    assert row["SpanId"] == "eee19b7ec3c1b174"
    assert row["ParentSpanId"] == "eee19b7ec3c1b173"
    assert row["SpanKind"] == "Server"
    assert row["Timestamp"].value == 1544712660000000000
    assert row["Duration"] == 1_000_000_000
    assert (row["ServiceName"], row["ScopeName"], row["ScopeVersion"]) == (
        "my.service",
        "my.library",
        "1.0.0",
    )
    assert dict(row["SpanAttributes"]) == {"my.span.attr": "some value"}


def test_json_mapping_numbers_names_and_unknown_fields() -> None:
    payload = {
        "resourceSpans": [
            {
                "futureField": {"x": 1},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "5b8efff798038103D269B633813FC60C",
                                "spanId": "eee19b7ec3c1b174",
                                "startTimeUnixNano": 1544712660000000000,  # a number, not a string
                                "endTimeUnixNano": "1544712660000000500",
                                "kind": "SPAN_KIND_PRODUCER",
                                "status": {"code": 2},
                                "attributes": [
                                    {"key": "i", "value": {"intValue": "9007199254740993"}},
                                    {"key": "j", "value": {"intValue": 5}},
                                ],
                                "unknownSpanField": True,
                            },
                            {"traceId": "zz", "spanId": "eee19b7ec3c1b174", "startTimeUnixNano": "1"},
                        ]
                    }
                ],
            }
        ]
    }
    decoded = request_to_arrow(decode_json(json.dumps(payload).encode()))
    assert (decoded.accepted, decoded.rejected) == (1, 1)
    row = decoded.table.to_pylist()[0]
    assert row["Duration"] == 500
    assert (row["SpanKind"], row["StatusCode"]) == ("Producer", "Error")
    assert dict(row["SpanAttributes"]) == {"i": "9007199254740993", "j": "5"}


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 10_000 + b"]" * 10_000,
        b'{"resourceSpans": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\xff\xfe"}]}]}]}',
        b"{not json",
        b"[]",
        b'{"resourceSpans": "nope"}',
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
    ],
)
def test_hostile_json_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(OtlpDecodeError):
        decode_json(body)


def test_brackets_inside_strings_are_not_nesting() -> None:
    # Regression: ~30 spans whose prompt attribute was truncated after "[{" made the bracket count
    # exceed the depth limit, and the export got a non-retryable 400.
    spans = [
        {
            "traceId": f"{i + 1:032x}",
            "spanId": f"{i + 1:016x}",
            "name": "chat gpt-4o",
            "startTimeUnixNano": "1",
            "endTimeUnixNano": "2",
            "attributes": [
                {"key": "gen_ai.prompt", "value": {"stringValue": 'see [{"role": "user", \\"x[{'}}
            ],
        }
        for i in range(40)
    ]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    assert body.count(b"[") + body.count(b"{") > 64
    request = decode_json(body)
    assert len(request.resource_spans[0].scope_spans[0].spans) == 40
    # Nesting outside strings is still refused, escaped quotes in strings notwithstanding.
    deep = b'{"a": "\\"[[[", "b": ' + b"[" * 100 + b"]" * 100 + b"}"
    with pytest.raises(OtlpDecodeError, match="nested deeper"):
        decode_json(deep)


def test_invalid_utf8_and_truncation_in_protobuf() -> None:
    request, _ = make_request(3)
    body = request.SerializeToString()
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(body[:-7])
    bad_utf8 = body.replace(b"POST /chat", b"POST /\xff\xfeat")
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(bad_utf8)


# Property-based: any bytes either decode to a request that converts, or raise OtlpDecodeError.
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=600))
def test_fuzz_protobuf_decoder(body: bytes) -> None:
    try:
        request = decode_protobuf(body)
    except OtlpDecodeError:
        return
    decoded = request_to_arrow(request)
    assert decoded.accepted + decoded.rejected == decoded.received


@_FUZZ
@given(st.binary(max_size=400).map(lambda b: make_request(2)[0].SerializeToString()[:300] + b))
def test_fuzz_protobuf_valid_prefix(body: bytes) -> None:
    try:
        request = decode_protobuf(body)
    except OtlpDecodeError:
        return
    decoded = request_to_arrow(request)
    assert decoded.table.num_rows == decoded.accepted


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=25,
)
_span_like = st.fixed_dictionaries(
    {},
    optional={
        "traceId": st.text(alphabet="0123456789abcdefABCDEFxz", max_size=34) | _json_values,
        "spanId": st.text(alphabet="0123456789abcdef", max_size=18) | _json_values,
        "startTimeUnixNano": st.integers(min_value=-5, max_value=2**64 + 5) | st.text(max_size=22),
        "endTimeUnixNano": st.integers(min_value=0, max_value=2**64) | _json_values,
        "kind": st.integers(min_value=-3, max_value=12) | st.text(max_size=20),
        "attributes": st.lists(
            st.fixed_dictionaries({"key": st.text(max_size=10), "value": _json_values}), max_size=3
        ),
        "name": _json_values,
    },
)


@_FUZZ
@given(
    st.one_of(
        _json_values,
        st.builds(
            lambda spans: {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]},
            st.lists(_span_like, max_size=3),
        ),
    )
)
def test_fuzz_json_decoder(payload: object) -> None:
    body = json.dumps(payload).encode()
    try:
        request = decode_json(body)
    except OtlpDecodeError:
        return
    decoded = request_to_arrow(request)
    assert decoded.accepted + decoded.rejected == decoded.received
