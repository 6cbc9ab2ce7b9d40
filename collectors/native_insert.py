"""Raw OTLP protobuf → ``otel_traces`` inside ClickHouse, without a Python copy per span.

The receivers' cost is not protobuf parsing but copying every attribute into Python objects. The
insert thread instead hands the acknowledged request bodies, as length-delimited messages, to
ClickHouse's own Protobuf input format (a trimmed copy of the OTLP schema in which nested
``AnyValue`` arrays/maps stay opaque bytes) and lets one ``INSERT … SELECT`` flatten them with
``ARRAY JOIN`` into exactly the Collector's columns. That work runs in C++ threads outside the GIL
(on the embedded engine, in parallel with the receivers; on a server, on the server).

One mapping SELECT (:func:`mapping_select`), two sources:

* embedded store — ``file(path, 'Protobuf', structure)``: the batch is written to a file the
  engine reads, with the schema as a ``.proto`` file beside it;
* server store — ``input(structure)``: the batch is the body of the INSERT request (``FORMAT
  Protobuf``), and the schema travels inline (``format_schema_source = 'string'``), since the server
  can read neither our files nor our ``.proto``. Servers without that setting use the Arrow path.

Exactness: values ClickHouse cannot stringify like pdata ``AsString()`` — array/kvlist values (Go
JSON) and doubles outside ``[1e-6, 1e21)`` (Go's exponent form) — send their whole request through
the Python mapping (:func:`collectors.otlp_decode.request_to_arrow`) instead. The embedded engine
finds those requests with a cheap SQL scan of the batch file; for a server, whose ``input()`` can be
read only once, :func:`needs_python_mapping` finds them on the parsed request with the same rule.
:func:`self_test` compares both paths on a sample at start and disables this one if they ever
differ (for example on a different ClickHouse version).

JSON tables (the Collector's ``json: true`` variant, ``*Attributes JSON``): the attribute maps are
built as above and become JSON through their JSON text (``CAST(toJSONString(map), 'JSON')``), so a
dotted key such as ``gen_ai.system`` is a nested path, as the Collector writes it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from google.protobuf.internal.encoder import _VarintBytes
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList

from collectors.layout import inspect_traces
from collectors.otlp_decode import decode_protobuf, request_to_arrow
from collectors.schema import TRACES_ARROW_SCHEMA, TRACES_TABLE
from collectors.writer import JSON_INSERT_SETTINGS, insert_traces_arrow
from storage import Store, StoreError

__all__ = [
    "FILE_SOURCE",
    "INPUT_SOURCE",
    "NativeInserter",
    "checked_inserter",
    "mapping_select",
    "native_sample",
    "needs_python_mapping",
    "self_test",
]

log = logging.getLogger(__name__)

# Field numbers as in opentelemetry-proto; ``tw_index`` (1000) is ours, appended to each body so a
# row can name its request (concatenated protobuf messages merge, so appending a field is valid).
_SCHEMA = """
syntax = "proto3";
message AnyValue {
  oneof value {
    string string_value = 1; bool bool_value = 2; int64 int_value = 3; double double_value = 4;
    bytes array_value = 5; bytes kvlist_value = 6; bytes bytes_value = 7;
  }
}
message KeyValue { string key = 1; AnyValue value = 2; }
message Resource { repeated KeyValue attributes = 1; }
message Scope { string name = 1; string version = 2; }
message Event { fixed64 time_unix_nano = 1; string name = 2; repeated KeyValue attributes = 3; }
message Link {
  bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; repeated KeyValue attributes = 4;
}
message Status { string message = 2; int32 code = 3; }
message Span {
  bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; bytes parent_span_id = 4; string name = 5;
  int32 kind = 6; fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8;
  repeated KeyValue attributes = 9; repeated Event events = 11; repeated Link links = 13; Status status = 15;
}
message ScopeSpans { Scope scope = 1; repeated Span spans = 2; }
message ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }
message Request { repeated ResourceSpans resource_spans = 1; uint64 tw_index = 1000; }
"""

_VALUE = (
    "Tuple(value Enum8('none'=0,'string_value'=1,'bool_value'=2,'int_value'=3,'double_value'=4,"
    "'array_value'=5,'kvlist_value'=6,'bytes_value'=7), string_value String, bool_value Bool, "
    "int_value Int64, double_value Float64, array_value String, kvlist_value String, bytes_value String)"
)
_KVS = f"Array(Tuple(key String, value {_VALUE}))"
_STRUCTURE = (
    f"resource_spans Array(Tuple(resource Tuple(attributes {_KVS}), scope_spans Array(Tuple("
    "scope Tuple(name String, version String), spans Array(Tuple(trace_id String, span_id String, "
    "trace_state String, parent_span_id String, name String, kind Int32, start_time_unix_nano UInt64, "
    f"end_time_unix_nano UInt64, attributes {_KVS}, "
    f"events Array(Tuple(time_unix_nano UInt64, name String, attributes {_KVS})), "
    f"links Array(Tuple(trace_id String, span_id String, trace_state String, attributes {_KVS})), "
    "status Tuple(message String, code Int32))))))), tw_index UInt64"
)
_SETTINGS = {
    "input_format_protobuf_oneof_presence": 1,
}
# A server reads the schema from the statement's settings: it cannot read our .proto file.
_SERVER_SETTINGS = {
    **_SETTINGS,
    "format_schema_source": "string",
    "format_schema": _SCHEMA,
    "format_schema_message_name": "Request",
}
_SCHEMA_FILE = f"otlp-trace-{hashlib.sha256(_SCHEMA.encode()).hexdigest()[:12]}.proto"
_INDEX_TAG = _VarintBytes(1000 << 3)


def _as_string(v: str) -> str:
    return (
        f"multiIf({v}.value = 'string_value', {v}.string_value, "
        f"{v}.value = 'int_value', toString({v}.int_value), "
        f"{v}.value = 'bool_value', if({v}.bool_value, 'true', 'false'), "
        f"{v}.value = 'double_value', toString({v}.double_value), "
        f"{v}.value = 'bytes_value', base64Encode({v}.bytes_value), '')"
    )


def _map(kvs: str, json: bool = False) -> str:
    as_map = (
        f"CAST((arrayMap(a -> a.key, {kvs}), arrayMap(a -> {_as_string('a.value')}, {kvs})), "
        "'Map(LowCardinality(String), String)')"
    )
    # A JSON column takes the map's JSON text: dotted keys become nested paths, values stay strings.
    return f"CAST(toJSONString({as_map}), 'JSON')" if json else as_map


def _hex_id(expr: str, size: int) -> str:
    return f"if({expr} = '' OR {expr} = repeat('\\0', {size}), '', lower(hex({expr})))"


# Where the mapping reads the batch: a file the embedded engine reads, or a server's request body.
FILE_SOURCE = "file({path:String}, 'Protobuf', {structure:String})"
INPUT_SOURCE = "input({structure:String})"

_COLUMNS = ", ".join(f"`{name}`" for name in TRACES_ARROW_SCHEMA.names)


def mapping_select(source: str, json: bool = False) -> str:
    """The SELECT turning ``Request`` messages read from ``source`` into ``otel_traces`` rows.

    One text for both stores; only ``source`` differs (:data:`FILE_SOURCE`, :data:`INPUT_SOURCE`).
    ``json``: the attribute columns are ``JSON`` (the Collector's ``json: true`` tables). Requests
    whose ``tw_index`` is in ``{python:Array(UInt64)}`` are left to the Python mapping.
    """
    resource = _map("rs.resource.attributes")
    return f"""SELECT
  fromUnixTimestamp64Nano(toInt64(sp.start_time_unix_nano)),
  lower(hex(sp.trace_id)),
  lower(hex(sp.span_id)),
  {_hex_id("sp.parent_span_id", 8)},
  sp.trace_state,
  sp.name,
  transform(sp.kind, [0, 1, 2, 3, 4, 5],
            ['Unspecified', 'Internal', 'Server', 'Client', 'Producer', 'Consumer'], ''),
  {resource}['service.name'],
  {_map("rs.resource.attributes", json)},
  ss.scope.name,
  ss.scope.version,
  {_map("sp.attributes", json)},
  sp.end_time_unix_nano - sp.start_time_unix_nano,
  transform(sp.status.code, [0, 1, 2], ['Unset', 'Ok', 'Error'], ''),
  sp.status.message,
  arrayMap(e -> fromUnixTimestamp64Nano(toInt64(e.time_unix_nano)), sp.events),
  arrayMap(e -> e.name, sp.events),
  arrayMap(e -> {_map("e.attributes", json)}, sp.events),
  arrayMap(l -> {_hex_id("l.trace_id", 16)}, sp.links),
  arrayMap(l -> {_hex_id("l.span_id", 8)}, sp.links),
  arrayMap(l -> l.trace_state, sp.links),
  arrayMap(l -> {_map("l.attributes", json)}, sp.links)
FROM {source}
ARRAY JOIN resource_spans AS rs
ARRAY JOIN rs.scope_spans AS ss
ARRAY JOIN ss.spans AS sp
WHERE tw_index NOT IN {{python:Array(UInt64)}}"""


# The fallback check reads only what it needs: a structure without strings skips most bytes, and
# flattening every attribute of a request into one array avoids a per-span ARRAY JOIN.
_CHECK_VALUE = "Array(Tuple(value Tuple(value Enum8('none'=0,'string_value'=1,'bool_value'=2,'int_value'=3,"
_CHECK_VALUE += "'double_value'=4,'array_value'=5,'kvlist_value'=6,'bytes_value'=7), double_value Float64, "
_CHECK_VALUE += "array_value String, kvlist_value String)))"
_CHECK_STRUCTURE = (
    f"resource_spans Array(Tuple(resource Tuple(attributes {_CHECK_VALUE}), scope_spans Array(Tuple("
    f"spans Array(Tuple(attributes {_CHECK_VALUE}, events Array(Tuple(attributes {_CHECK_VALUE})), "
    f"links Array(Tuple(attributes {_CHECK_VALUE})))))))), tw_index UInt64"
)
_ALL_VALUES = (
    "arrayConcat(arrayFlatten(resource_spans.resource.attributes.value.{f}), "
    "arrayFlatten(resource_spans.scope_spans.spans.attributes.value.{f}), "
    "arrayFlatten(resource_spans.scope_spans.spans.events.attributes.value.{f}), "
    "arrayFlatten(resource_spans.scope_spans.spans.links.attributes.value.{f}))"
)
_FALLBACK = f"""SELECT tw_index
FROM {FILE_SOURCE}
WHERE arrayExists(
    (v, d) -> v IN ('array_value', 'kvlist_value')
        OR (v = 'double_value' AND NOT (d = 0 OR (abs(d) >= 1e-6 AND abs(d) < 1e21))),
    {_ALL_VALUES.format(f="value")},
    {_ALL_VALUES.format(f="double_value")})"""


def _is_exact_double(d: float) -> bool:
    # The SQL scan's rule (_FALLBACK), in Python: NaN and infinities fail both comparisons.
    return d == 0 or 1e-6 <= abs(d) < 1e21


def _kvs_need_python(kvs: Sequence[KeyValue]) -> bool:
    for kv in kvs:
        case = kv.value.WhichOneof("value")
        if case == "array_value" or case == "kvlist_value":
            return True
        if case == "double_value" and not _is_exact_double(kv.value.double_value):
            return True
    return False


def needs_python_mapping(request: ExportTraceServiceRequest) -> bool:
    """Whether ``request`` holds a value ClickHouse would stringify unlike pdata (the SQL scan's rule).

    For server stores, whose ``input()`` is read once: the mapping cannot scan the batch first.
    """
    for rs in request.resource_spans:
        if _kvs_need_python(rs.resource.attributes):
            return True
        for ss in rs.scope_spans:
            for span in ss.spans:
                if _kvs_need_python(span.attributes):
                    return True
                for event in span.events:
                    if _kvs_need_python(event.attributes):
                        return True
                for link in span.links:
                    if _kvs_need_python(link.attributes):
                        return True
    return False


def _records(bodies: Sequence[bytes]) -> bytes:
    """The batch as length-delimited ``Request`` messages, each tagged with its index."""
    parts = []
    for index, body in enumerate(bodies):
        record = body + _INDEX_TAG + _VarintBytes(index)
        parts.append(_VarintBytes(len(record)))
        parts.append(record)
    return b"".join(parts)


class NativeInserter:
    """Inserts validated OTLP request bodies with ClickHouse's Protobuf input.

    Embedded stores read the batch from a file (``work_dir``); server stores receive it as the body
    of the INSERT (:meth:`supported` says whether the server can).
    """

    def __init__(self, store: Store, work_dir: Path | None = None, table: str = TRACES_TABLE) -> None:
        self.store = store
        self.table = table
        self.json = inspect_traces(store, table=table).json
        # Absolute: ClickHouse resolves a relative file() path against its own user_files directory.
        self.work_dir = (Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir())).resolve()
        self.python_requests = 0
        self._insert = f"INSERT INTO {store.table(table)} ({_COLUMNS}) "
        self._settings: dict[str, object] = dict(JSON_INSERT_SETTINGS) if self.json else {}
        if work_dir is not None and store.embedded:
            # Batch files a killed process left behind: their requests are still in the spool.
            for stale in self.work_dir.glob("otlp-batch-*.binpb"):
                stale.unlink(missing_ok=True)

    def _schema_file(self) -> Path:
        # An absolute schema file rather than an inline schema: ClickHouse caches inline schemas
        # in a ``__cache__`` directory under the process's working directory.
        path = self.work_dir / _SCHEMA_FILE
        if not path.exists():
            self.work_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(_SCHEMA)
            os.replace(tmp, path)
        return path

    @staticmethod
    def supported(store: Store) -> bool:
        """The embedded engine reads our files; a server needs the schema inline
        (``format_schema_source``, recent ClickHouse versions), else it uses the Arrow path."""
        if store.embedded:
            return True
        try:
            return bool(
                store.query_value("SELECT count() FROM system.settings WHERE name = 'format_schema_source'")
            )
        except StoreError as exc:
            log.warning("could not read the server's settings (%s); using the Arrow path", exc)
            return False

    def insert(self, bodies: Sequence[bytes]) -> None:
        """Insert every span of ``bodies`` (serialized, already validated ExportTraceServiceRequests)."""
        if not bodies:
            return
        try:
            insert = self._insert_from_file if self.store.embedded else self._insert_as_body
            fallback = insert(bodies)
        except StoreError as exc:
            # upb accepts some messages ClickHouse's parser refuses (a known field sent with
            # another wire type is an unknown field to upb). Such a batch must not block the
            # queue forever: map it in Python; if that insert fails too, the caller retries.
            log.warning(
                "ClickHouse could not map %d requests (%s); using the Python mapping", len(bodies), exc
            )
            fallback = list(range(len(bodies)))
        if fallback:
            self.python_requests += len(fallback)
            tables = [request_to_arrow(decode_protobuf(bodies[i])).table for i in fallback]
            insert_traces_arrow(self.store, self.table, pa.concat_tables(tables).combine_chunks(), self.json)

    def _insert_from_file(self, bodies: Sequence[bytes]) -> list[int]:
        """Embedded: the batch as a file; a first scan names the requests for the Python mapping."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="otlp-batch-", suffix=".binpb", dir=self.work_dir)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(_records(bodies))
            params = {"path": name, "structure": _STRUCTURE}
            settings = {**_SETTINGS, **self._settings, "format_schema": f"{self._schema_file()}:Request"}
            # The scan parses every message before anything is inserted, so a request ClickHouse
            # cannot parse fails here, with nothing written yet.
            rows = self.store.query_rows(
                _FALLBACK, {**params, "structure": _CHECK_STRUCTURE}, settings=settings
            )
            fallback = sorted(int(row[0]) for row in rows)
            self.store.command(
                self._insert + mapping_select(FILE_SOURCE, self.json),
                {**params, "python": fallback},
                settings=settings,
            )
            return fallback
        finally:
            os.unlink(name)

    def _insert_as_body(self, bodies: Sequence[bytes]) -> list[int]:
        """Server: the batch is the INSERT's body, read by ``input()``; the schema travels inline.

        The server parses the body as it reads it: a message it refuses fails the statement. The
        batch's requests are one block of ``input()`` rows (far fewer than ``max_insert_block_size``),
        so that failure comes before anything is written and the Python mapping then takes them all.
        """
        fallback = [i for i, body in enumerate(bodies) if needs_python_mapping(decode_protobuf(body))]
        self.store.command(
            self._insert + mapping_select(INPUT_SOURCE, self.json) + "\nFORMAT Protobuf",
            {"structure": _STRUCTURE, "python": fallback},
            {**_SERVER_SETTINGS, **self._settings},
            data=_records(bodies),
        )
        return fallback


def self_test(store: Store, sample: Sequence[bytes], work_dir: Path | None = None) -> str | None:
    """Insert ``sample`` both ways into a scratch table and compare; None when identical, else why."""
    scratch = "tailwatch_native_insert_check"
    target = store.table(scratch)
    try:
        store.command(f"DROP TABLE IF EXISTS {target}")
        store.command(f"CREATE TABLE {target} AS {store.table(TRACES_TABLE)} ENGINE = Memory")
        inserter = NativeInserter(store, work_dir, table=scratch)
        inserter.insert(sample)
        native = store.query_arrow(f"SELECT * FROM {target} ORDER BY TraceId, SpanId")
        store.command(f"TRUNCATE TABLE {target}")
        expected = pa.concat_tables([request_to_arrow(decode_protobuf(b)).table for b in sample])
        insert_traces_arrow(store, scratch, expected, inserter.json)
        python = store.query_arrow(f"SELECT * FROM {target} ORDER BY TraceId, SpanId")
    except Exception as exc:
        return f"native insert failed: {' '.join(str(exc).split())[:300]}"
    finally:
        try:
            store.command(f"DROP TABLE IF EXISTS {target}")
        except Exception:  # the check's own cleanup must not mask its answer
            log.debug("could not drop %s", scratch, exc_info=True)
    if native.num_rows != python.num_rows:
        return f"native insert wrote {native.num_rows} rows, the Python mapping {python.num_rows}"
    for name in python.column_names:
        if not native.column(name).equals(python.column(name)):
            return f"native insert differs from the Python mapping in column {name}"
    return None


def native_sample() -> bytes:
    """A request exercising every value kind and column, for :func:`self_test`."""

    def kv(key: str, **value: object) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(**value))  # type: ignore[arg-type]

    scalars = [
        kv("s", string_value="text <&> ü"),
        kv("empty", string_value=""),
        kv("i", int_value=-9_007_199_254_740_993),
        kv("zero", int_value=0),
        kv("t", bool_value=True),
        kv("f", bool_value=False),
        kv("d", double_value=0.1),
        kv("d1", double_value=1.0),
        kv("dneg", double_value=-2.5e-5),
        kv("dbig", double_value=123456789012345680000.0),
        kv("b", bytes_value=b"\x00\xff\x10"),
        kv("s", string_value="repeated key"),
        KeyValue(key="unset"),
    ]
    complex_values = [
        kv("arr", array_value=ArrayValue(values=[AnyValue(int_value=1), AnyValue(string_value="x")])),
        kv("map", kvlist_value=KeyValueList(values=[kv("z", double_value=1e22), kv("a", bool_value=True)])),
        kv("huge", double_value=1e300),
    ]
    request = ExportTraceServiceRequest()
    for r, service in enumerate(("svc-a", None)):
        rs = request.resource_spans.add()
        if service:
            rs.resource.attributes.extend([kv("service.name", string_value=service), *scalars[:3]])
        for c in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope-{c}" if c else ""
            ss.scope.version = "1.0" if c else ""
            for n in range(4):
                seed = r * 100 + c * 10 + n + 1
                span = ss.spans.add(
                    trace_id=bytes([seed]) * 16,
                    span_id=bytes([seed, 1]) * 4,
                    parent_span_id=bytes([seed, 2]) * 4 if n % 2 else (bytes(8) if n == 2 else b""),
                    trace_state="k=v" if n == 1 else "",
                    name=f"span {seed}",
                    kind=(n + c + r) % 7,
                    start_time_unix_nano=1_700_000_000_000_000_000 + seed,
                    end_time_unix_nano=1_700_000_000_000_000_000 + seed * 1000,
                )
                span.status.code = (n + r) % 4
                span.status.message = "failed" if n == 3 else ""
                span.attributes.extend(scalars if n != 3 else [*scalars[:2], complex_values[(r + c) % 3]])
                if n == 1:
                    event = span.events.add(time_unix_nano=1_700_000_000_000_000_500 + seed, name="retry")
                    event.attributes.extend(scalars[2:5])
                    span.events.add(time_unix_nano=1_700_000_000_000_000_600, name="no attrs")
                if n == 2:
                    span.links.add(trace_id=bytes([seed]) * 16, span_id=bytes([9]) * 8, trace_state="x=y")
                    span.links.add(trace_id=bytes(16), span_id=bytes(8)).attributes.extend(scalars[4:7])
    return request.SerializeToString()


# One check per store and process: the embedded engine is one per process (one version), and a
# server keeps its version while we run. Keyed by DSN and the table's attribute type (Map or JSON).
_CHECKED: dict[tuple[str, bool], str | None] = {}


def checked_inserter(store: Store, work_dir: Path | None = None) -> NativeInserter | None:
    """A :class:`NativeInserter` if this engine reproduces the Python mapping exactly, else None.

    Checked once per store and process against :func:`native_sample`, which exercises every value
    kind.
    """
    if not NativeInserter.supported(store):
        return None
    key = ("embedded" if store.embedded else store.dsn, inspect_traces(store).json)
    if key not in _CHECKED:
        problem = self_test(store, [native_sample()])
        if problem:
            log.warning("ClickHouse-side OTLP mapping disabled, using the Arrow path: %s", problem)
        _CHECKED[key] = problem
    if _CHECKED[key] is not None:
        return None
    return NativeInserter(store, work_dir)
