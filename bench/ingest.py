"""Ingest benchmark: OTLP/HTTP exports from another process → receiver → rows queryable in otel_traces.

Run ``python -m bench.ingest`` (options: ``--spans``, ``--clients``, ``--modes``). For each mode the
receiver runs in its own process on an embedded store; this process sends 512-span requests of
realistic spans (10–20 attributes) over loopback from several keep-alive connections and reports

* sustained spans/s from the first request until ``count()`` sees every span,
* export-request latency p50/p99 (HdrHistogram, successful requests),
* the receiver's peak RSS.

Then, with no receiver at all, the storage ceiling: CPU per span of ClickHouse mapping the raw
requests, writing already-mapped rows into ``otel_traces`` in the default batches, and merging
them — what bounds any receiver on this machine.

Modes:

* ``native`` — tailwatch's receiver as shipped on an embedded store: the receiver validates the
  spans and spools the raw request (fsync before the 200); ClickHouse parses and maps the batched
  requests itself (Protobuf input format + ARRAY JOIN), 50k-row / 1 s batches.
* ``arrow`` — the same receiver with ``native_insert=False`` (what a ClickHouse server store uses):
  Arrow columns built straight from the decoded messages, spooled as Arrow IPC.
* ``baseline`` — the straightforward receiver: decode, one Python dict per span, buffer the rows and
  insert them with the client's row insert in the same batches (50k rows / 1 s; no spool, so it is
  the cheaper of the two on paper).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
from hdrh.histogram import HdrHistogram
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

SPANS_PER_REQUEST = 512
_PORT = re.compile(r"BENCH_PORT=(\d+)")


# --- workload ----------------------------------------------------------------------------------


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _attributes(rnd: random.Random, kind: str) -> list[KeyValue]:
    common = [
        _kv("http.request.method", "POST"),
        _kv("http.route", "/chat"),
        _kv("http.response.status_code", rnd.choice([200, 200, 200, 429, 500])),
        _kv("server.address", "api.internal.example.com"),
        _kv("url.path", f"/chat/{rnd.randrange(100_000)}"),
        _kv("user_agent.original", "python-httpx/0.27"),
        _kv("network.protocol.version", "1.1"),
        _kv("client.address", f"10.0.{rnd.randrange(256)}.{rnd.randrange(256)}"),
        _kv("feature.flag.streaming", rnd.random() < 0.5),
        _kv("tenant.id", f"tenant-{rnd.randrange(500)}"),
    ]
    if kind == "llm":
        common += [
            _kv("gen_ai.operation.name", "chat"),
            _kv("gen_ai.provider.name", "openai"),
            _kv("gen_ai.request.model", "gpt-4o"),
            _kv("gen_ai.response.model", "gpt-4o-2024-08-06"),
            _kv("gen_ai.usage.input_tokens", rnd.randrange(50, 8_000)),
            _kv("gen_ai.usage.output_tokens", rnd.randrange(10, 2_000)),
            _kv("gen_ai.request.temperature", 0.7),
            _kv("gen_ai.response.time_to_first_chunk", round(rnd.uniform(0.1, 3.0), 3)),
        ]
    return common[: rnd.randrange(10, 21)] if kind == "http" else common


def make_request(seed: int, now_ns: int) -> bytes:
    """One serialized 512-span export: 64 traces of a server span + 7 children, 10–20 attributes each."""
    rnd = random.Random(seed)
    spans: list[Span] = []
    while len(spans) < SPANS_PER_REQUEST:
        trace_id = rnd.randbytes(16)
        root_id = rnd.randbytes(8)
        start = now_ns - rnd.randrange(60 * 10**9)
        duration = rnd.randrange(50, 5_000) * 10**6
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=root_id,
                name="POST /chat",
                kind=Span.SPAN_KIND_SERVER,
                start_time_unix_nano=start,
                end_time_unix_nano=start + duration,
                attributes=_attributes(rnd, "http"),
                status=Status(code=Status.STATUS_CODE_UNSET),
            )
        )
        for _ in range(7):
            child_start = start + rnd.randrange(duration // 2)
            spans.append(
                Span(
                    trace_id=trace_id,
                    span_id=rnd.randbytes(8),
                    parent_span_id=root_id,
                    name="chat gpt-4o",
                    kind=Span.SPAN_KIND_CLIENT,
                    start_time_unix_nano=child_start,
                    end_time_unix_nano=child_start + rnd.randrange(duration // 2),
                    attributes=_attributes(rnd, "llm"),
                    status=Status(
                        code=Status.STATUS_CODE_ERROR if rnd.random() < 0.02 else Status.STATUS_CODE_UNSET
                    ),
                )
            )
    resource_attrs = [
        _kv("service.name", "chat-api"),
        _kv("service.version", "2.14.1"),
        _kv("deployment.environment.name", "production"),
        _kv("host.name", "ip-10-0-3-17"),
        _kv("telemetry.sdk.language", "python"),
    ]
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=resource_attrs),
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(
                            name="opentelemetry.instrumentation.httpx", version="0.50b0"
                        ),
                        spans=spans[:SPANS_PER_REQUEST],
                    )
                ],
            )
        ]
    )
    return request.SerializeToString()


# --- receivers (run in the server subprocess) ----------------------------------------------------


def _bench_routes(store: Any) -> list[Any]:
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def count(request: Request) -> JSONResponse:
        return JSONResponse({"rows": int(store.query_value("SELECT count() FROM otel_traces"))})

    async def rss(request: Request) -> JSONResponse:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return JSONResponse({"peak_rss_kib": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime})

    return [Route("/bench/count", count), Route("/bench/rss", rss)]


def _serve_columnar(store: Any, spool: Path, native: bool) -> None:
    from collectors import IngestRuntime, PipelineSettings

    settings = PipelineSettings(spool_dir=spool, native_insert=native)
    routes = _bench_routes(store)
    with IngestRuntime(store, settings, http="127.0.0.1:0", grpc=None, extra_routes=routes) as runtime:
        _wait_for_term(runtime.http_port)


def _baseline_rows(body: bytes) -> list[dict[str, Any]]:
    """The straightforward mapping: one dict per span, every field copied in Python."""
    from collectors.otlp_decode import any_value_to_string, decode_protobuf

    kinds = ["Unspecified", "Internal", "Server", "Client", "Producer", "Consumer"]
    codes = ["Unset", "Ok", "Error"]
    rows = []
    for rs in decode_protobuf(body).resource_spans:
        res = {kv.key: any_value_to_string(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                rows.append(
                    {
                        "Timestamp": span.start_time_unix_nano,
                        "TraceId": span.trace_id.hex(),
                        "SpanId": span.span_id.hex(),
                        "ParentSpanId": span.parent_span_id.hex(),
                        "TraceState": span.trace_state,
                        "SpanName": span.name,
                        "SpanKind": kinds[span.kind],
                        "ServiceName": res.get("service.name", ""),
                        "ResourceAttributes": res,
                        "ScopeName": ss.scope.name,
                        "ScopeVersion": ss.scope.version,
                        "SpanAttributes": {kv.key: any_value_to_string(kv.value) for kv in span.attributes},
                        "Duration": span.end_time_unix_nano - span.start_time_unix_nano,
                        "StatusCode": codes[span.status.code],
                        "StatusMessage": span.status.message,
                        "Events.Timestamp": [e.time_unix_nano for e in span.events],
                        "Events.Name": [e.name for e in span.events],
                        "Events.Attributes": [
                            {kv.key: any_value_to_string(kv.value) for kv in e.attributes}
                            for e in span.events
                        ],
                        "Links.TraceId": [link.trace_id.hex() for link in span.links],
                        "Links.SpanId": [link.span_id.hex() for link in span.links],
                        "Links.TraceState": [link.trace_state for link in span.links],
                        "Links.Attributes": [
                            {kv.key: any_value_to_string(kv.value) for kv in link.attributes}
                            for link in span.links
                        ],
                    }
                )
    return rows


def _serve_baseline(store: Any) -> None:
    import asyncio

    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from collectors import TRACES_ARROW_SCHEMA, TRACES_MIGRATIONS
    from collectors.settings import PipelineSettings
    from storage import ensure_schema

    ensure_schema(store, TRACES_MIGRATIONS)
    batch_rows = PipelineSettings().batch_rows  # the same batches as the receiver's
    columns = TRACES_ARROW_SCHEMA.names
    buffer: list[list[Any]] = []
    lock = threading.Condition()
    stop = threading.Event()

    def flusher() -> None:
        last = time.monotonic()
        while not stop.is_set() or buffer:
            with lock:
                lock.wait_for(
                    lambda: len(buffer) >= batch_rows or stop.is_set(),
                    timeout=max(0.0, 1.0 - (time.monotonic() - last)),
                )
                rows = buffer[:]
                buffer.clear()
            last = time.monotonic()
            if rows:
                store.client.insert("otel_traces", rows, column_names=columns)

    async def traces(request: Request) -> Response:
        body = await request.body()

        def work() -> None:
            rows = [[row[c] for c in columns] for row in _baseline_rows(body)]
            with lock:
                buffer.extend(rows)
                if len(buffer) >= batch_rows:
                    lock.notify()

        await run_in_threadpool(work)
        return Response(b"", media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"]), *_bench_routes(store)])
    thread = threading.Thread(target=flusher, daemon=True)
    thread.start()
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    server_thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    server_thread.start()
    while not server.started:
        time.sleep(0.01)
    _wait_for_term(sock.getsockname()[1])
    server.should_exit = True
    server_thread.join(10)
    stop.set()
    with lock:
        lock.notify()
    thread.join(30)


def _wait_for_term(port: int) -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"BENCH_PORT={port}", flush=True)
    done.wait()


def serve(mode: str, dsn: str, spool: Path) -> None:
    from storage import open_store

    with open_store(dsn) as store:
        if mode in ("native", "arrow"):
            _serve_columnar(store, spool, native=mode == "native")
        else:
            _serve_baseline(store)


# --- the driver ----------------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    spans: int
    seconds: float
    p50_ms: float
    p99_ms: float
    peak_rss_mib: float
    throttled: int
    cpu_us_per_span: float

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds


def _requests(n: int) -> Iterator[bytes]:
    now = time.time_ns()
    for i in range(n):
        yield make_request(i, now)


def run_mode(mode: str, bodies: list[bytes], clients: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as tmp:
        dsn = "chdb://" + str(Path(tmp) / "store")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.ingest",
                "--serve",
                mode,
                "--store",
                dsn,
                "--spool",
                str(Path(tmp) / "spool"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = _PORT.search(line)
        if not match:
            proc.kill()
            raise SystemExit(f"{mode} receiver did not start: {line!r}")
        base = f"http://127.0.0.1:{match.group(1)}"
        histogram = HdrHistogram(1, 60_000_000, 3)  # microseconds
        hist_lock = threading.Lock()
        throttled = 0
        total = len(bodies) * SPANS_PER_REQUEST
        headers = {"Content-Type": "application/x-protobuf"}
        next_index = iter(range(len(bodies)))
        index_lock = threading.Lock()

        def client() -> None:
            nonlocal throttled
            with httpx.Client(timeout=60) as http:
                while True:
                    with index_lock:
                        i = next(next_index, None)
                    if i is None:
                        return
                    while True:
                        started = time.perf_counter()
                        r = http.post(base + "/v1/traces", content=bodies[i], headers=headers)
                        elapsed_us = int((time.perf_counter() - started) * 1e6)
                        if r.status_code == 200:
                            with hist_lock:
                                histogram.record_value(max(1, elapsed_us))
                            break
                        if r.status_code not in (429, 503):
                            raise SystemExit(f"{mode}: unexpected HTTP {r.status_code}: {r.content[:200]!r}")
                        with hist_lock:
                            throttled += 1
                        time.sleep(float(r.headers.get("Retry-After", "1")) / 10)

        with httpx.Client(timeout=60) as http:
            cpu_before = http.get(base + "/bench/rss").json()["cpu_s"]
        started = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            for future in [pool.submit(client) for _ in range(clients)]:
                future.result()
        with httpx.Client(timeout=60) as http:
            while http.get(base + "/bench/count").json()["rows"] < total:
                time.sleep(0.02)
            seconds = time.perf_counter() - started
            usage = http.get(base + "/bench/rss").json()
            rss_kib, cpu_s = usage["peak_rss_kib"], usage["cpu_s"] - cpu_before
            if os.environ.get("BENCH_METRICS") and mode != "baseline":
                for metric_line in http.get(base + "/metrics").text.splitlines():
                    if metric_line.startswith(
                        (
                            "tailwatch_ingest_insert_seconds_sum",
                            "tailwatch_ingest_insert_seconds_count",
                            "tailwatch_ingest_batch_rows_sum",
                            "tailwatch_ingest_batch_rows_count",
                        )
                    ):
                        print(metric_line, file=sys.stderr)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        return Result(
            mode,
            total,
            seconds,
            histogram.get_value_at_percentile(50) / 1000,
            histogram.get_value_at_percentile(99) / 1000,
            rss_kib / 1024,
            throttled,
            cpu_s * 1e6 / total,
        )


# --- the storage ceiling ---------------------------------------------------------------------------


@dataclass
class Ceiling:
    map_us: float  # ClickHouse parsing + flattening + mapping the raw requests (into a Null table)
    write_us: float  # writing already-mapped rows into otel_traces (+ the Collector's trace-id MV)
    merge_us: float  # merging those parts into one
    batch_rows: int

    @property
    def bound_spans_per_s(self) -> float:
        # Every span is written once and merged at least once; nothing else runs.
        return (os.cpu_count() or 1) * 1e6 / (self.write_us + self.merge_us)


def measure_ceiling(bodies: list[bytes], batches: int = 8) -> Ceiling:
    """CPU per span of ClickHouse's own work on the Collector schema, with no receiver at all."""
    from collectors import TRACES_MIGRATIONS
    from collectors.native_insert import NativeInserter
    from collectors.settings import PipelineSettings
    from storage import ensure_schema, open_store

    def cpu_s() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    batch_rows = PipelineSettings().batch_rows
    per_batch = max(1, batch_rows // SPANS_PER_REQUEST)
    with (
        tempfile.TemporaryDirectory(prefix="tw-bench-ceiling-") as tmp,
        open_store("chdb://" + str(Path(tmp) / "store")) as store,
    ):
        ensure_schema(store, TRACES_MIGRATIONS)
        inserter = NativeInserter(store, Path(tmp) / "work", table="bench_null")
        store.command("CREATE TABLE bench_null AS otel_traces ENGINE = Null")
        chunks = [bodies[i : i + per_batch] for i in range(0, len(bodies), per_batch)][:batches]
        started = cpu_s()
        for chunk in chunks:
            inserter.insert(chunk)
        mapped = sum(len(c) for c in chunks) * SPANS_PER_REQUEST
        map_us = (cpu_s() - started) * 1e6 / mapped
        NativeInserter(store, Path(tmp) / "work").insert(chunks[0])
        store.command("CREATE TABLE bench_rows ENGINE = Memory AS SELECT * FROM otel_traces")
        store.command("TRUNCATE TABLE otel_traces")
        rows = int(store.query_value("SELECT count() FROM bench_rows"))
        started = cpu_s()
        for _ in range(batches):
            store.command("INSERT INTO otel_traces SELECT * FROM bench_rows")
        write_us = (cpu_s() - started) * 1e6 / (rows * batches)
        started = cpu_s()
        store.command("OPTIMIZE TABLE otel_traces FINAL")
        merge_us = (cpu_s() - started) * 1e6 / (rows * batches)
    return Ceiling(map_us, write_us, merge_us, rows)


class _InputAsFile:
    """A ClickHouse server's ``input()`` on the embedded engine: a statement sent with a body (the
    server path's ``INSERT … FROM input(S) … FORMAT F``) reads that body from a file instead, and
    its inline schema from a file holding the same text (the engine would cache an inline schema in
    the directory where the process first used the Protobuf format)."""

    def __init__(self, client: Any, work: Path) -> None:
        self._client = client
        self._body = work / "body.binpb"
        self._schema = work / "schema.proto"

    def command(
        self, cmd: str, parameters: Any = None, data: bytes | None = None, settings: Any = None
    ) -> Any:
        if data is not None:
            from collectors.native_insert import INPUT_SOURCE

            fmt = re.search(r"\sFORMAT (\w+)\s*$", cmd)
            assert fmt is not None
            self._body.write_bytes(data)
            source = f"file({{body_path:String}}, '{fmt.group(1)}', {{structure:String}})"
            cmd = cmd[: fmt.start()].replace(INPUT_SOURCE, source)
            parameters = {**parameters, "body_path": str(self._body)}
            settings = dict(settings or {})
            self._schema.write_text(settings.pop("format_schema"))
            message = settings.pop("format_schema_message_name")
            settings.update(format_schema_source="file", format_schema=f"{self._schema}:{message}")
        return self._client.command(cmd, parameters=parameters, settings=settings)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class ServerPath:
    """Wall time per span of a server store's two insert paths (µs)."""

    check_us: float  # ClickHouse mapping, in the collector: parse + exactness check of the attributes
    statement_us: float  # ClickHouse mapping, the INSERT … FROM input() (on the server in production)
    arrow_map_us: float  # Arrow path, in the collector: request_to_arrow
    arrow_insert_us: float  # Arrow path, the Arrow insert

    @property
    def clickhouse_us(self) -> float:
        return self.check_us + self.statement_us

    @property
    def arrow_us(self) -> float:
        return self.arrow_map_us + self.arrow_insert_us


def measure_server_path(bodies: list[bytes], batches: int = 4) -> ServerPath:
    """A server store's two insert paths, both run on the embedded engine (no network), into a
    Null table so that only the mapping and the statement count."""
    from collectors import TRACES_MIGRATIONS
    from collectors.native_insert import NativeInserter, needs_python_mapping
    from collectors.otlp_decode import decode_protobuf, request_to_arrow
    from collectors.settings import PipelineSettings
    from storage import Store, ensure_schema, open_store, parse_dsn

    per_batch = max(1, PipelineSettings().batch_rows // SPANS_PER_REQUEST)
    chunks = [bodies[i : i + per_batch] for i in range(0, len(bodies), per_batch)][:batches]
    spans = sum(len(c) for c in chunks) * SPANS_PER_REQUEST
    with (
        tempfile.TemporaryDirectory(prefix="tw-bench-server-") as tmp,
        open_store("chdb://" + str(Path(tmp) / "store")) as store,
    ):
        ensure_schema(store, TRACES_MIGRATIONS)
        store.command("CREATE TABLE bench_null AS otel_traces ENGINE = Null")
        client = _InputAsFile(store.client, Path(tmp))
        server = Store(parse_dsn("http://bench:8123/default"), client, shares=store)
        inserter = NativeInserter(server, table="bench_null")
        inserter.insert(chunks[0][:1])  # warm-up: the schema's parse and cache
        started = time.perf_counter()
        for chunk in chunks:
            [needs_python_mapping(decode_protobuf(b)) for b in chunk]
        check_s = time.perf_counter() - started
        started = time.perf_counter()
        for chunk in chunks:
            inserter.insert(chunk)
        statement_s = time.perf_counter() - started - check_s  # insert() runs the check too
        map_s = insert_s = 0.0
        for chunk in chunks:
            started = time.perf_counter()
            table = pa.concat_tables([request_to_arrow(decode_protobuf(b)).table for b in chunk])
            table = table.combine_chunks()
            map_s += time.perf_counter() - started
            started = time.perf_counter()
            store.insert_arrow("bench_null", table)
            insert_s += time.perf_counter() - started
    per_span = 1e6 / spans
    return ServerPath(check_s * per_span, statement_s * per_span, map_s * per_span, insert_s * per_span)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=307_200, help="spans per mode (multiple of 512)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent keep-alive connections")
    parser.add_argument("--modes", default="native,arrow,baseline")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument(
        "--no-ceiling", action="store_true", help="skip the storage-ceiling measurement (no receiver)"
    )
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--spool", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.store, Path(args.spool))
        return
    n = max(1, args.spans // SPANS_PER_REQUEST)
    print(f"generating {n} requests of {SPANS_PER_REQUEST} spans…", file=sys.stderr)
    bodies = list(_requests(n))
    results = []
    for mode in args.modes.split(","):
        print(f"running {mode}…", file=sys.stderr)
        results.append(run_mode(mode.strip(), bodies, args.clients))
    baseline = next((r for r in results if r.mode == "baseline"), None)
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs (nproc), {_cpu_model()}; {args.clients} client connections; "
        f"load average {load:.1f}"
    )
    print(
        f"{'mode':<10} {'spans':>9} {'spans/s':>10} {'vs base':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'peak RSS MiB':>13} {'429/503':>8} {'CPU us/span':>12}"
    )
    for r in results:
        ratio = f"{r.spans_per_s / baseline.spans_per_s:.2f}x" if baseline else "-"
        print(
            f"{r.mode:<10} {r.spans:>9} {r.spans_per_s:>10,.0f} {ratio:>8} {r.p50_ms:>8.1f} {r.p99_ms:>8.1f} "
            f"{r.peak_rss_mib:>13.0f} {r.throttled:>8} {r.cpu_us_per_span:>12.1f}"
        )
    ceiling = None
    if not args.no_ceiling:
        print("measuring the storage ceiling…", file=sys.stderr)
        ceiling = measure_ceiling(bodies)
        print(
            f"ClickHouse alone, CPU per span: mapping raw requests {ceiling.map_us:.1f} us; writing "
            f"{ceiling.batch_rows:,}-row batches of mapped rows into otel_traces {ceiling.write_us:.1f} us; "
            f"merging them {ceiling.merge_us:.1f} us → storage alone bounds ingest on this machine at "
            f"{ceiling.bound_spans_per_s:,.0f} spans/s"
        )
        print("measuring a server store's insert paths…", file=sys.stderr)
        server = measure_server_path(bodies)
        print(
            f"Server store, wall time per span (both run on the embedded engine, no network): "
            f"ClickHouse mapping {server.clickhouse_us:.1f} us (collector: parse + exactness check "
            f"{server.check_us:.1f} us; INSERT … FROM input() {server.statement_us:.1f} us); Arrow path "
            f"{server.arrow_us:.1f} us (collector: request_to_arrow {server.arrow_map_us:.1f} us; "
            f"Arrow insert {server.arrow_insert_us:.1f} us)"
        )
    if args.json:
        out: dict[str, Any] = {"modes": [r.__dict__ | {"spans_per_s": r.spans_per_s} for r in results]}
        if ceiling is not None:
            out["ceiling"] = ceiling.__dict__ | {"bound_spans_per_s": ceiling.bound_spans_per_s}
            out["server_path"] = server.__dict__ | {
                "clickhouse_us": server.clickhouse_us,
                "arrow_us": server.arrow_us,
            }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
