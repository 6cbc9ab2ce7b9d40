"""OTLP trace requests → ``otel_traces`` Arrow columns, mapped exactly as the Collector's exporter.

Decoding is upb's job (protobuf) or the standard JSON parser's (OTLP/JSON); the cost that matters is
the copy into columns. :func:`request_to_arrow` therefore touches each span once, appends scalars to
flat Python lists, and leaves everything that can be done per column to Arrow/NumPy: hex encoding of
ids (one ``bytes.hex()`` over the concatenated column), durations, enum names, and the per-resource
columns (ServiceName, ResourceAttributes, scope), which are built once per resource/scope and
repeated with ``take``.

Mapping (REFERENCE §1): Timestamp = start, Duration = end − start (ns), lowercase hex ids, ``''``
parent for roots, ``Server``/``Error`` spellings, attribute values stringified like pdata
``AsString()``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from collectors.schema import TRACES_ARROW_SCHEMA
from storage import TailwatchError

__all__ = [
    "DecodedSpans",
    "OtlpDecodeError",
    "any_value_to_string",
    "check_protobuf_shape",
    "check_request_shape",
    "decode_json",
    "decode_protobuf",
    "empty_spans_table",
    "export_response",
    "format_double",
    "request_to_arrow",
    "validate_request",
]

# Collector spellings, indexed by the OTLP enum value; the last entry stands for a value outside the
# enum (the Collector's SpanKindStr/StatusCodeStr return "" for those).
_KIND_NAMES = pa.array(["Unspecified", "Internal", "Server", "Client", "Producer", "Consumer", ""])
_STATUS_NAMES = pa.array(["Unset", "Ok", "Error", ""])
_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
_MAX_NS = 2**63  # DateTime64(9) / Arrow timestamp[ns] are signed 64-bit
_MAX_JSON_DEPTH = 64  # a real OTLP/JSON payload nests ~12 levels; deeper nesting is hostile
# Objects + arrays (outside strings) of one OTLP/JSON request: refused before json.loads, which with
# protobuf's ParseDict costs ~6 µs and ~100 bytes per container. A span with a dozen attributes has
# ~30, so this admits ~15k such spans (a Collector batch is 8192) and bounds a request's decode to
# ~3 s of CPU; 34 MB of ``{},`` (11M objects, ~130 s before) is refused in ~0.1 s.
MAX_JSON_CONTAINERS = 500_000
# Protobuf shape. Resources and scopes are a handful per export in practice: their counts are read
# off the wire before upb's parse (which allocates ~60 bytes per 2-byte empty message: 4M empty
# ResourceSpans in 8 MB took 245 MB and 2.6 s). Spans are counted after the parse, before any
# per-span Python work: a valid span needs 48 bytes on the wire (ids, times), so more spans than
# bytes/32 means mostly empty ones.
MAX_RESOURCE_SPANS = 65_536
MAX_SCOPE_SPANS = 65_536
_MIN_SPAN_WIRE_BYTES = 32


class OtlpDecodeError(TailwatchError):
    """The request body is not a decodable ``ExportTraceServiceRequest``."""


@dataclass(frozen=True)
class DecodedSpans:
    """The valid spans of one request as ``otel_traces`` columns, plus what was rejected and why."""

    table: pa.Table
    received: int
    rejected: int
    error_message: str = ""

    @property
    def accepted(self) -> int:
        return self.table.num_rows


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ``ExportTraceServiceRequest`` (upb also rejects invalid UTF-8 and deep nesting)."""
    try:
        return ExportTraceServiceRequest.FromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpDecodeError(f"invalid protobuf ExportTraceServiceRequest: {exc}") from None


# A JSON string: brackets inside one (a truncated prompt holding "[{") are text, not nesting.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("{"), ord("[")]] = 1
_DEPTH_STEP[[ord("}"), ord("]")]] = -1
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _json_structure_problem(body: bytes) -> str:
    """Why the body's structure is refused before parsing ('' if it is not): more than
    ``MAX_JSON_CONTAINERS`` objects/arrays, or nesting deeper than ``_MAX_JSON_DEPTH``, counting
    only brackets outside strings. Strings are removed by a regex, everything but brackets by
    ``bytes.translate``, and the depth is a running sum over the brackets (all in C; a byte loop in
    Python took seconds on a large export)."""
    if body.count(b"[") + body.count(b"{") <= _MAX_JSON_DEPTH:
        return ""  # an upper bound of both the count and the depth
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    containers = brackets.count(b"[") + brackets.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        return f"more than {MAX_JSON_CONTAINERS} objects and arrays"
    if containers <= _MAX_JSON_DEPTH or len(brackets) > 2 * containers:
        return ""  # shallow, or more closing brackets than opening ones: json.loads refuses it
    depth = np.cumsum(_DEPTH_STEP[np.frombuffer(brackets, dtype=np.uint8)], dtype=np.int32)
    if int(depth.max()) > _MAX_JSON_DEPTH:
        return f"nested deeper than {_MAX_JSON_DEPTH} levels"
    return ""


def _hex_id(value: Any) -> str:
    """OTLP/JSON ids are hex (any case); protobuf's JSON parser wants base64 for bytes fields.

    Invalid hex becomes a 1-byte id, so the span is rejected individually (partial success) rather
    than failing the whole request.
    """
    if not isinstance(value, str):
        return base64.b64encode(b"\xff").decode()
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b"\xff"
    if value and len(value) % 2:
        raw = b"\xff"
    return base64.b64encode(raw).decode()


def _fix_ids(payload: Any) -> None:
    if not isinstance(payload, dict):
        return
    for rs in _as_list(payload.get("resourceSpans", payload.get("resource_spans"))):
        if not isinstance(rs, dict):
            continue
        for ss in _as_list(rs.get("scopeSpans", rs.get("scope_spans"))):
            if not isinstance(ss, dict):
                continue
            for span in _as_list(ss.get("spans")):
                if not isinstance(span, dict):
                    continue
                for key in ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id"):
                    if key in span:
                        span[key] = _hex_id(span[key])
                for link in _as_list(span.get("links")):
                    if isinstance(link, dict):
                        for key in ("traceId", "trace_id", "spanId", "span_id"):
                            if key in link:
                                link[key] = _hex_id(link[key])


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    """Parse OTLP/JSON: hex ids in any case, integer (or name) enums, 64-bit ints as strings or
    numbers, unknown fields ignored."""
    problem = _json_structure_problem(body)
    if problem:
        raise OtlpDecodeError(f"invalid OTLP/JSON: {problem}")
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise OtlpDecodeError(f"invalid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise OtlpDecodeError("invalid OTLP/JSON: the body must be a JSON object")
    _fix_ids(payload)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(payload, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise OtlpDecodeError(f"invalid OTLP/JSON ExportTraceServiceRequest: {exc}") from None
    return request


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise IndexError("varint too long")


def _len_fields(
    buf: bytes, start: int, end: int, field: int, limit: int, too_many: str
) -> list[tuple[int, int]] | None:
    """(start, end) of each length-delimited ``field`` in ``buf[start:end]``, walking at most
    ``limit`` fields of any kind (OtlpDecodeError ``too_many`` beyond it); None when the bytes are
    not plain wire format (groups, truncation): upb's parse then decides."""
    found: list[tuple[int, int]] = []
    pos = start
    walked = 0
    try:
        while pos < end:
            walked += 1
            if walked > limit:
                raise OtlpDecodeError(too_many)
            key, pos = _varint(buf, pos)
            wire = key & 7
            if wire == 0:
                _, pos = _varint(buf, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                size, pos = _varint(buf, pos)
                if key >> 3 == field:
                    found.append((pos, pos + size))
                pos += size
            else:
                return None
    except IndexError:
        return None
    return found if pos == end else None


def check_protobuf_shape(body: bytes) -> None:
    """Before upb's parse: refuse (:class:`OtlpDecodeError`) more than ``MAX_RESOURCE_SPANS``
    ResourceSpans or ``MAX_SCOPE_SPANS`` ScopeSpans, read off the wire with a bounded walk (one step
    per resource and per scope, so a normal export costs microseconds)."""
    too_many = f"more than {MAX_RESOURCE_SPANS} resource_spans (or other fields) in one request"
    resources = _len_fields(body, 0, len(body), 1, MAX_RESOURCE_SPANS + 64, too_many)
    if resources is None:
        return
    if len(resources) > MAX_RESOURCE_SPANS:
        raise OtlpDecodeError(too_many)
    too_many = f"more than {MAX_SCOPE_SPANS} scope_spans (or other fields) in one request"
    budget = MAX_SCOPE_SPANS + 64
    scopes = 0
    for start, end in resources:
        found = _len_fields(body, start, end, 2, budget - scopes + 4, too_many)
        if found is None:
            return
        scopes += len(found)
        if scopes > MAX_SCOPE_SPANS:
            raise OtlpDecodeError(too_many)


def check_request_shape(request: ExportTraceServiceRequest, wire_bytes: int) -> None:
    """Refuse (:class:`OtlpDecodeError`) a request of mostly empty elements before per-element work:
    more than ``MAX_RESOURCE_SPANS`` ResourceSpans or ``MAX_SCOPE_SPANS`` ScopeSpans, or more
    spans than ``wire_bytes / 32`` (a valid span takes 48). Counted cheapest first: O(1), then one
    step per resource, then one per scope."""
    resources = len(request.resource_spans)
    if resources > MAX_RESOURCE_SPANS:
        raise OtlpDecodeError(f"more than {MAX_RESOURCE_SPANS} resource_spans in one request")
    scopes = sum(len(rs.scope_spans) for rs in request.resource_spans)
    if scopes > MAX_SCOPE_SPANS:
        raise OtlpDecodeError(f"more than {MAX_SCOPE_SPANS} scope_spans in one request")
    max_spans = wire_bytes // _MIN_SPAN_WIRE_BYTES + 64
    spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    if spans > max_spans:
        raise OtlpDecodeError(f"{spans} spans in {wire_bytes} bytes: mostly empty spans")


# --- pdata AsString() --------------------------------------------------------------------------


def format_double(value: float) -> str:
    """A double as pdata ``AsString()`` prints it: Go's encoding/json (ES6) shortest form."""
    if math.isnan(value) or math.isinf(value):
        go = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return f"json: unsupported value: {go}"
    text = repr(value)
    if "e" not in text:
        return text[:-2] if text.endswith(".0") else text
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        # Go pads the exponent to two digits like Python, then strips the zero of e-0X.
        mantissa, exponent = text.split("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
        if sign == "+" and len(digits) < 2:
            digits = digits.rjust(2, "0")
        return f"{mantissa}e{sign}{digits}"
    plain = format(Decimal(text), "f")
    if "." in plain:
        plain = plain.rstrip("0").rstrip(".")
    return plain


class _GoJsonUnsupported(Exception):
    """encoding/json refuses NaN/Inf; pdata then returns an empty string."""


def _raw(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return value.int_value
    if which == "bool_value":
        return value.bool_value
    if which == "double_value":
        d = value.double_value
        if math.isnan(d) or math.isinf(d):
            raise _GoJsonUnsupported
        return d
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "array_value":
        return [_raw(v) for v in value.array_value.values]
    if which == "kvlist_value":
        # Go maps marshal with sorted keys; a repeated key keeps its last value (pdata AsRaw).
        out: dict[str, Any] = {}
        for kv in value.kvlist_value.values:
            out[kv.key] = _raw(kv.value)
        return dict(sorted(out.items()))
    return None


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _go_json_encode(raw: Any) -> str:
    if isinstance(raw, str):
        return json.dumps(raw, ensure_ascii=False)
    if raw is None:
        return "null"
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        return format_double(raw)
    if isinstance(raw, list):
        return "[" + ",".join(_go_json_encode(v) for v in raw) + "]"
    return (
        "{"
        + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _go_json_encode(v) for k, v in raw.items())
        + "}"
    )


def _go_json(raw: Any) -> str:
    text = _go_json_encode(raw)
    # encoding/json escapes HTML-sensitive characters and the JS line separators; these characters
    # can only occur inside strings, so a plain replace is exact.
    for char, escaped in _GO_ESCAPES:
        if char in text:
            text = text.replace(char, escaped)
    return text


def any_value_to_string(value: AnyValue) -> str:
    """pdata ``Value.AsString()``: int decimal, double shortest JSON, bool true/false, bytes base64,
    array/kvlist JSON (sorted keys), empty value ''."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    return _non_string(value, which)


def _non_string(value: AnyValue, which: str | None) -> str:
    if which == "int_value":
        return str(value.int_value)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "double_value":
        return format_double(value.double_value)
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if which == "string_value":
        return value.string_value
    if which is None:
        return ""
    try:
        return _go_json(_raw(value))
    except _GoJsonUnsupported:
        return ""


# --- request → columns -------------------------------------------------------------------------


def _hex_column(ids: list[bytes]) -> pa.Array:
    """Lowercase hex of each id, without a per-id Python call: hex the concatenated buffer once."""
    binary = pa.array(ids, type=pa.binary())
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32, count=len(ids) + 1, offset=binary.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    data = bytes(memoryview(binary.buffers()[2] or b"")[start:end]) if end > start else b""
    hex_offsets = (offsets - start) * 2
    return pa.StringArray.from_buffers(
        len(ids), pa.py_buffer(hex_offsets.astype(np.int32).tobytes()), pa.py_buffer(data.hex().encode())
    )


def _map_array(offsets: list[int], keys: list[str], values: list[str]) -> pa.Array:
    return pa.MapArray.from_arrays(
        pa.array(offsets, type=pa.int32()),
        pa.array(keys, type=pa.string()),
        pa.array(values, type=pa.string()),
    )


def _list_array(offsets: list[int], values: pa.Array) -> pa.Array:
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), values)


def _enum_names(names: pa.Array, codes: list[int]) -> pa.Array:
    limit = len(names) - 1
    idx = np.asarray(codes, dtype=np.int64)
    idx = np.where((idx < 0) | (idx >= limit), limit, idx)
    return names.take(pa.array(idx))


def _timestamps(values: Any) -> pa.Array:
    return pa.array(np.asarray(values, dtype=np.int64), type=pa.int64()).cast(
        TRACES_ARROW_SCHEMA.field("Timestamp").type
    )


def empty_spans_table() -> pa.Table:
    return TRACES_ARROW_SCHEMA.empty_table()


def request_to_arrow(request: ExportTraceServiceRequest) -> DecodedSpans:
    """Columns for every valid span; spans with a bad id or end before start are rejected individually."""
    starts: list[int] = []
    ends: list[int] = []
    trace_ids: list[bytes] = []
    span_ids: list[bytes] = []
    parent_ids: list[bytes] = []
    trace_states: list[str] = []
    names: list[str] = []
    kinds: list[int] = []
    status_codes: list[int] = []
    status_messages: list[str] = []
    group_of_span: list[int] = []
    attr_offsets = [0]
    attr_keys: list[str] = []
    attr_values: list[str] = []
    ev_offsets = [0]
    ev_ts: list[int] = []
    ev_names: list[str] = []
    ev_attr_offsets = [0]
    ev_keys: list[str] = []
    ev_values: list[str] = []
    ln_offsets = [0]
    ln_trace: list[bytes] = []
    ln_span: list[bytes] = []
    ln_state: list[str] = []
    ln_attr_offsets = [0]
    ln_keys: list[str] = []
    ln_values: list[str] = []
    # Per (resource, scope) group: built once, repeated per span with take().
    g_service: list[str] = []
    g_res_offsets = [0]
    g_res_keys: list[str] = []
    g_res_values: list[str] = []
    g_scope_name: list[str] = []
    g_scope_version: list[str] = []

    received = 0
    rejected = 0
    first_error = ""
    keys_append = attr_keys.append
    values_append = attr_values.append
    non_string = _non_string

    for rs in request.resource_spans:
        res_keys: list[str] = []
        res_values: list[str] = []
        service, service_seen = "", False
        for kv in rs.resource.attributes:
            text = any_value_to_string(kv.value)
            res_keys.append(kv.key)
            res_values.append(text)
            # The first service.name wins, as in a ClickHouse map lookup (the native path) and in the
            # Collector's pdata Get.
            if kv.key == "service.name" and not service_seen:
                service, service_seen = text, True
        for ss in rs.scope_spans:
            group = len(g_service)
            g_service.append(service)
            g_res_keys.extend(res_keys)
            g_res_values.extend(res_values)
            g_res_offsets.append(len(g_res_keys))
            g_scope_name.append(ss.scope.name)
            g_scope_version.append(ss.scope.version)
            for span in ss.spans:
                received += 1
                tid = span.trace_id
                sid = span.span_id
                pid = span.parent_span_id
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                problem = span_problem(span, tid, sid, pid, start, end)
                if problem:
                    rejected += 1
                    if not first_error:
                        first_error = f"span {sid.hex() or '?'}: {problem}"
                    continue
                trace_ids.append(tid)
                span_ids.append(sid)
                parent_ids.append(b"" if pid == _ZERO_SPAN else pid)
                starts.append(start)
                ends.append(end)
                trace_states.append(span.trace_state)
                names.append(span.name)
                kinds.append(span.kind)
                status = span.status
                status_codes.append(status.code)
                status_messages.append(status.message)
                group_of_span.append(group)
                for kv in span.attributes:
                    keys_append(kv.key)
                    value = kv.value
                    # Most values are non-empty strings: reading string_value first skips the
                    # WhichOneof call for them (an empty result may be '' or another type).
                    text = value.string_value
                    if text:
                        values_append(text)
                    else:
                        values_append(non_string(value, value.WhichOneof("value")))
                attr_offsets.append(len(attr_keys))
                if span.events:
                    for event in span.events:
                        ev_ts.append(event.time_unix_nano)
                        ev_names.append(event.name)
                        for kv in event.attributes:
                            ev_keys.append(kv.key)
                            ev_values.append(any_value_to_string(kv.value))
                        ev_attr_offsets.append(len(ev_keys))
                ev_offsets.append(len(ev_ts))
                if span.links:
                    for link in span.links:
                        ln_trace.append(b"" if link.trace_id == _ZERO_TRACE else link.trace_id)
                        ln_span.append(b"" if link.span_id == _ZERO_SPAN else link.span_id)
                        ln_state.append(link.trace_state)
                        for kv in link.attributes:
                            ln_keys.append(kv.key)
                            ln_values.append(any_value_to_string(kv.value))
                        ln_attr_offsets.append(len(ln_keys))
                ln_offsets.append(len(ln_trace))

    if rejected:
        first_error = f"{rejected} of {received} spans rejected; first: {first_error}"
    if not trace_ids:
        return DecodedSpans(empty_spans_table(), received, rejected, first_error)

    start_arr = np.asarray(starts, dtype=np.uint64)
    duration = np.asarray(ends, dtype=np.uint64) - start_arr
    groups = pa.array(np.asarray(group_of_span, dtype=np.int32))
    columns = [
        _timestamps(start_arr.astype(np.int64)),
        _hex_column(trace_ids),
        _hex_column(span_ids),
        _hex_column(parent_ids),
        pa.array(trace_states, type=pa.string()),
        pa.array(names, type=pa.string()),
        _enum_names(_KIND_NAMES, kinds),
        pa.array(g_service, type=pa.string()).take(groups),
        _map_array(g_res_offsets, g_res_keys, g_res_values).take(groups),
        pa.array(g_scope_name, type=pa.string()).take(groups),
        pa.array(g_scope_version, type=pa.string()).take(groups),
        _map_array(attr_offsets, attr_keys, attr_values),
        pa.array(duration, type=pa.uint64()),
        _enum_names(_STATUS_NAMES, status_codes),
        pa.array(status_messages, type=pa.string()),
        _list_array(ev_offsets, _timestamps(ev_ts)),
        _list_array(ev_offsets, pa.array(ev_names, type=pa.string())),
        _list_array(ev_offsets, _map_array(ev_attr_offsets, ev_keys, ev_values)),
        _list_array(ln_offsets, _hex_column(ln_trace)),
        _list_array(ln_offsets, _hex_column(ln_span)),
        _list_array(ln_offsets, pa.array(ln_state, type=pa.string())),
        _list_array(ln_offsets, _map_array(ln_attr_offsets, ln_keys, ln_values)),
    ]
    table = pa.Table.from_arrays(columns, schema=TRACES_ARROW_SCHEMA)
    return DecodedSpans(table, received, rejected, first_error)


def span_problem(span: Any, tid: bytes, sid: bytes, pid: bytes, start: int, end: int) -> str:
    """Why a span cannot be stored (``''`` when it can): the checks both mapping paths apply.

    The ids and times are passed in because the caller has already read them from the message.
    """
    if len(tid) != 16 or tid == _ZERO_TRACE:
        return f"invalid trace_id (length {len(tid)}, must be 16 non-zero bytes)"
    if len(sid) != 8 or sid == _ZERO_SPAN:
        return f"invalid span_id (length {len(sid)}, must be 8 non-zero bytes)"
    if pid and len(pid) != 8:
        return f"invalid parent_span_id (length {len(pid)}, must be 0 or 8 bytes)"
    if end < start:
        return "end_time_unix_nano is before start_time_unix_nano"
    if end >= _MAX_NS:
        return "timestamp beyond the year 2262"
    if span.events and any(e.time_unix_nano >= _MAX_NS for e in span.events):
        return "event timestamp beyond the year 2262"
    if span.links and any(
        len(link.trace_id) not in (0, 16) or len(link.span_id) not in (0, 8) for link in span.links
    ):
        return "invalid link trace_id/span_id length"
    return ""


def validate_request(request: ExportTraceServiceRequest) -> tuple[int, int, str]:
    """Drop invalid spans from ``request`` in place (same rules as :func:`request_to_arrow`).

    Returns (received, rejected, error_message). Reads five fields per span and no attributes, so it
    costs a fraction of the full mapping; used when ClickHouse itself maps the raw request.
    """
    received = 0
    rejected = 0
    first_error = ""
    for rs in request.resource_spans:
        for ss in rs.scope_spans:
            bad: list[int] = []
            for index, span in enumerate(ss.spans):
                received += 1
                tid = span.trace_id
                sid = span.span_id
                problem = span_problem(
                    span, tid, sid, span.parent_span_id, span.start_time_unix_nano, span.end_time_unix_nano
                )
                if problem:
                    bad.append(index)
                    if not first_error:
                        first_error = f"span {sid.hex() or '?'}: {problem}"
            if bad:
                rejected += len(bad)
                dropped = set(bad)
                # Copy the survivors out before clearing: elements removed from a repeated field
                # must not be reused.
                keep = [span.SerializeToString() for i, span in enumerate(ss.spans) if i not in dropped]
                del ss.spans[:]
                for raw in keep:
                    ss.spans.add().MergeFromString(raw)
    if rejected:
        first_error = f"{rejected} of {received} spans rejected; first: {first_error}"
    return received, rejected, first_error


def export_response(rejected: int = 0, error_message: str = "") -> ExportTraceServiceResponse:
    """The spec's answer: empty on full success, ``partial_success`` when spans were rejected."""
    response = ExportTraceServiceResponse()
    if rejected or error_message:
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=rejected, error_message=error_message)
        )
    return response
