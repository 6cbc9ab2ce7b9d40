"""OTLP requests with a known ground truth, shared by the collectors tests."""

from __future__ import annotations

import random
from dataclasses import dataclass

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z

# The official example payload's shape (opentelemetry-proto examples/trace.json): upper-case hex
# ids, integer enums, 64-bit times as strings, plus a scope attribute the mapping does not store.
EXAMPLE_TRACE_JSON = b"""{
  "resourceSpans": [
    {
      "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "my.service"}}]},
      "scopeSpans": [
        {
          "scope": {
            "name": "my.library",
            "version": "1.0.0",
            "attributes": [{"key": "my.scope.attribute", "value": {"stringValue": "some scope attribute"}}]
          },
          "spans": [
            {
              "traceId": "5B8EFFF798038103D269B633813FC60C",
              "spanId": "EEE19B7EC3C1B174",
              "parentSpanId": "EEE19B7EC3C1B173",
              "name": "I'm a server span",
              "startTimeUnixNano": "1544712660000000000",
              "endTimeUnixNano": "1544712661000000000",
              "kind": 2,
              "attributes": [{"key": "my.span.attr", "value": {"stringValue": "some value"}}]
            }
          ]
        }
      ]
    }
  ]
}"""


def kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


@dataclass(frozen=True)
class Expected:
    trace_id: str
    span_id: str
    start_ns: int
    duration_ns: int


def make_request(
    n: int,
    *,
    seed: int = 0,
    service: str = "chat-api",
    attributes: int = 12,
) -> tuple[ExportTraceServiceRequest, list[Expected]]:
    """``n`` valid, realistic spans (``attributes`` attributes each) and their identities."""
    rnd = random.Random(seed)
    spans = []
    expected = []
    for i in range(n):
        trace_id = rnd.randbytes(16)
        span_id = rnd.randbytes(8)
        start = BASE_NS + rnd.randrange(3_600 * 10**9)
        duration = rnd.randrange(1, 2 * 10**9)
        attrs = [
            kv("http.request.method", "POST"),
            kv("http.route", "/chat"),
            kv("http.response.status_code", 200),
            kv("gen_ai.operation.name", "chat"),
            kv("gen_ai.request.model", "gpt-4o"),
            kv("gen_ai.usage.input_tokens", rnd.randrange(4000)),
            kv("sample.ratio", 0.25),
            kv("feature.enabled", i % 2 == 0),
        ]
        attrs += [
            kv(f"extra.{j}", f"value-{rnd.randrange(100)}") for j in range(max(0, attributes - len(attrs)))
        ]
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=rnd.randbytes(8) if i % 3 else b"",
                name="POST /chat",
                kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=start,
                end_time_unix_nano=start + duration,
                attributes=attrs[:attributes],
                status=Status(code=Status.STATUS_CODE_ERROR if i % 10 == 0 else Status.STATUS_CODE_UNSET),
            )
        )
        expected.append(Expected(trace_id.hex(), span_id.hex(), start, duration))
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[kv("service.name", service), kv("service.version", "1.2.3")]),
                scope_spans=[
                    ScopeSpans(scope=InstrumentationScope(name="tests.scope", version="0.1"), spans=spans)
                ],
            )
        ]
    )
    return request, expected
