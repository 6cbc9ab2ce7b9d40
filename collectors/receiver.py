"""OTLP/HTTP receiver: ``POST /v1/traces`` plus ``/healthz``, ``/readyz`` and ``/metrics``.

The app is plain Starlette so the service can mount its own routes beside ours. Request bodies are
read with a cap and gunzipped incrementally with the same cap, so neither a large body nor a gzip
bomb can take more than ``max_request_bytes`` of memory; decoding and the spool fsync run in a
worker thread to keep the event loop free for other connections.

Hostile load is bounded in bytes and in CPU: all requests together hold at most
``max_inflight_bytes`` (compressed body, decompressed body, and the decoded form estimated from
its size) — beyond it a request is answered 429 + ``Retry-After`` (its body is drained, not kept);
a body's structure is checked before the expensive parts of decoding (``MAX_JSON_CONTAINERS``,
``check_protobuf_shape``, ``check_request_shape``), and a request waits at most ``DECODE_WAIT_S``
for a decode slot before a 503 + ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from collectors.otlp_decode import (
    DecodedSpans,
    OtlpDecodeError,
    check_protobuf_shape,
    check_request_shape,
    decode_json,
    decode_protobuf,
    export_response,
    request_to_arrow,
    validate_request,
)
from collectors.pipeline import IngestPipeline

__all__ = ["create_http_app", "token_matches"]

log = logging.getLogger(__name__)

_PROTOBUF_TYPES = frozenset({"application/x-protobuf", "application/protobuf"})
_JSON_TYPE = "application/json"


# Decoding is pure Python under the GIL: more threads than cores only add lock hand-offs. Waiting
# for the spool's fsync happens outside this limit, so slow disks still overlap.
_DECODE_SLOTS = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
# How long a request waits for a decode slot before it is answered 503 + Retry-After: the slots are
# shared by all clients, so a queue of expensive bodies must not hold a normal export past its
# exporter's timeout (10 s in the SDKs).
DECODE_WAIT_S = 3.0
_INFLATE_STEP = 1 << 20
# What a decoded request holds per byte of its (decompressed) body, charged to the in-flight budget
# before decoding: upb keeps a parsed export in ~4x its wire size; OTLP/JSON is ~3x larger than
# protobuf on the wire for the same spans, so ~1x.
_DECODED_PER_BYTE = {False: 4, True: 1}
_RETRY_AFTER = {"Retry-After": "1"}


class _TooLarge(Exception):
    pass


class _Stalled(Exception):
    """The client stopped sending its body."""


# A body must keep arriving: a client that sends its headers and then nothing would otherwise hold
# its connection, its reserved bytes and a file descriptor forever.
BODY_IDLE_TIMEOUT_S = 15.0


class _Busy(Exception):
    """The in-flight byte budget is spent by other requests."""


class _ByteBudget:
    """Bytes held by the requests being read and decoded, bounded by ``limit``.

    A request may exceed the limit while it is the only one holding bytes, so an export of up to
    ``max_request_bytes`` is never refused for its size alone.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, n: int, own: int) -> bool:
        with self._lock:
            if self.held + n > self.limit and self.held > own:
                return False
            self.held += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.held -= n


class _Charge:
    """One request's share of the :class:`_ByteBudget`; :meth:`release` returns all of it."""

    def __init__(self, budget: _ByteBudget) -> None:
        self.budget = budget
        self.held = 0
        self.decode_reserved = False

    def take(self, n: int) -> bool:
        if not self.budget.take(n, self.held):
            return False
        self.held += n
        return True

    def release(self) -> None:
        held, self.held = self.held, 0
        if held:
            self.budget.give(held)


@dataclass(frozen=True)
class _RawExport:
    """A validated protobuf export handed to the pipeline as bytes (see ``submit_raw``)."""

    body: bytes
    received: int
    rejected: int
    error_message: str

    @property
    def accepted(self) -> int:
        return self.received - self.rejected


def token_matches(presented: str | None, token: str | None) -> bool:
    """Constant-time comparison of a presented bearer token (``Bearer x``) with the configured one."""
    if token is None:
        return True
    if not presented:
        return False
    scheme, _, value = presented.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def _gunzip_capped(data: bytes, limit: int, charge: _Charge | None = None) -> bytes:
    """Decompress (possibly multi-member) gzip, never producing more than ``limit`` bytes; output is
    produced in steps of 1 MiB, each taken from ``charge`` first (:class:`_Busy` when refused)."""
    out: list[bytes] = []
    size = 0
    rest = data
    while rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        pending = rest
        while not inflater.eof:
            try:
                chunk = inflater.decompress(pending, min(_INFLATE_STEP, limit - size + 1))
            except zlib.error as exc:
                raise OtlpDecodeError(f"invalid gzip body: {exc}") from None
            pending = inflater.unconsumed_tail
            if not chunk and not pending:
                break  # needs input that is not there
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            if charge is not None and not charge.take(len(chunk)):
                raise _Busy
            out.append(chunk)
        if not inflater.eof:
            raise OtlpDecodeError("invalid gzip body: truncated")
        rest = inflater.unused_data
    return b"".join(out)


def _encode(message: Message, as_json: bool) -> bytes:
    if as_json:
        return json_format.MessageToJson(message, indent=None).encode()
    return message.SerializeToString()


class _TracesEndpoint:
    def __init__(self, pipeline: IngestPipeline, token: str | None) -> None:
        self.pipeline = pipeline
        self.token = token
        self.limit = pipeline.settings.max_request_bytes
        self.metrics = pipeline.metrics
        self.budget = _ByteBudget(pipeline.settings.max_inflight_bytes)

    def _error(
        self, status: int, code: int, message: str, as_json: bool, headers: dict[str, str] | None = None
    ) -> Response:
        body = _encode(status_pb2.Status(code=code, message=message), as_json)
        self.metrics.requests.labels(protocol="http", status=str(status)).inc()
        return Response(
            body,
            status_code=status,
            media_type=_JSON_TYPE if as_json else "application/x-protobuf",
            headers=headers,
        )

    async def handle(self, request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        as_json = content_type == _JSON_TYPE
        if not token_matches(request.headers.get("authorization"), self.token):
            return self._error(
                401,
                code_pb2.UNAUTHENTICATED,
                "missing or wrong bearer token",
                as_json,
                {"WWW-Authenticate": "Bearer"},
            )
        if not as_json and content_type not in _PROTOBUF_TYPES:
            # The client speaks neither OTLP encoding, so a protobuf Status would reach it as a
            # stray tag byte before the message: answer in plain text.
            self.metrics.requests.labels(protocol="http", status="415").inc()
            return PlainTextResponse(
                f"unsupported content type {content_type or '(none)'!r}; "
                "use application/x-protobuf or application/json\n",
                status_code=415,
            )
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", ""):
            return self._error(
                415,
                code_pb2.INVALID_ARGUMENT,
                f"unsupported content encoding {encoding!r}; use gzip",
                as_json,
            )
        charge = _Charge(self.budget)
        try:
            try:
                body = await self._read_body(request, charge, encoding == "gzip", as_json)
            except _TooLarge:
                return self._error(
                    413,
                    code_pb2.INVALID_ARGUMENT,
                    f"request body over the limit of {self.limit} bytes",
                    as_json,
                )
            except _Busy:
                return self._busy(as_json)
            except _Stalled:
                response = self._error(
                    408,
                    code_pb2.DEADLINE_EXCEEDED,
                    f"no body bytes for {BODY_IDLE_TIMEOUT_S:g} s; the request was abandoned",
                    as_json,
                )
                response.headers["Connection"] = "close"
                return response
            return await run_in_threadpool(self._process, body, encoding == "gzip", as_json, charge)
        finally:
            charge.release()

    def _busy(self, as_json: bool) -> Response:
        return self._error(
            429,
            code_pb2.RESOURCE_EXHAUSTED,
            "too many request bytes in flight; retry later",
            as_json,
            _RETRY_AFTER,
        )

    async def _read_body(self, request: Request, charge: _Charge, gzipped: bool, as_json: bool) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.limit:
            raise _TooLarge
        refused = False
        if declared.isdigit():
            # Reserved whole, up front: concurrent bodies taking the budget chunk by chunk would
            # each hold a part and refuse one another. An uncompressed body's decoded form too.
            decoded = 0 if gzipped else _DECODED_PER_BYTE[as_json]
            refused = not charge.take(int(declared) * (1 + decoded))
            charge.decode_reserved = not gzipped
        chunks: list[bytes] = []
        size = 0
        stream = request.stream()
        while True:
            try:
                chunk = await asyncio.wait_for(anext(stream), BODY_IDLE_TIMEOUT_S)
            except StopAsyncIteration:
                break
            except TimeoutError:
                raise _Stalled from None
            size += len(chunk)
            if size > self.limit:
                raise _TooLarge
            if refused:
                continue  # drained, not kept: the client gets its 429 instead of a reset connection
            if size > charge.held and not charge.take(len(chunk)):
                refused = True
                chunks.clear()
                continue
            chunks.append(chunk)
        if refused:
            raise _Busy
        return b"".join(chunks)

    def _process(self, body: bytes, gzipped: bool, as_json: bool, charge: _Charge) -> Response:
        if not _DECODE_SLOTS.acquire(timeout=DECODE_WAIT_S):
            return self._error(
                503, code_pb2.UNAVAILABLE, "all decoders busy; retry later", as_json, _RETRY_AFTER
            )
        try:
            parsed = self._decode(body, gzipped, as_json, charge)
        finally:
            _DECODE_SLOTS.release()
        if isinstance(parsed, Response):
            return parsed
        return self._submit(parsed, as_json)

    def _decode(
        self, body: bytes, gzipped: bool, as_json: bool, charge: _Charge
    ) -> Response | DecodedSpans | _RawExport:
        try:
            if gzipped:
                body = _gunzip_capped(body, self.limit, charge)
            if not charge.decode_reserved and not charge.take(len(body) * _DECODED_PER_BYTE[as_json]):
                raise _Busy
            if not as_json:
                check_protobuf_shape(body)
            request = decode_json(body) if as_json else decode_protobuf(body)
            check_request_shape(request, len(body))
            if not as_json and self.pipeline.accepts_raw:
                # ClickHouse maps the raw request at insert time: only validate the spans here.
                received, rejected, message = validate_request(request)
                raw = request.SerializeToString() if rejected else body
                return _RawExport(raw, received, rejected, message)
            decoded = request_to_arrow(request)
        except _TooLarge:
            return self._error(
                413,
                code_pb2.INVALID_ARGUMENT,
                f"decompressed body over the limit of {self.limit} bytes",
                as_json,
            )
        except _Busy:
            return self._busy(as_json)
        except OtlpDecodeError as exc:
            return self._error(400, code_pb2.INVALID_ARGUMENT, str(exc), as_json)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            # Values that decode but cannot become columns (e.g. lone surrogates in JSON strings).
            return self._error(400, code_pb2.INVALID_ARGUMENT, f"invalid span data: {exc}", as_json)
        return decoded

    def _submit(self, decoded: DecodedSpans | _RawExport, as_json: bool) -> Response:
        self.metrics.received.labels(protocol="http").inc(decoded.received)
        if isinstance(decoded, _RawExport):
            result = self.pipeline.submit_raw(decoded.body, decoded.accepted, protocol="http")
        else:
            result = self.pipeline.submit(decoded.table, protocol="http")
        if not result.ok:
            status, code = (
                (429, code_pb2.RESOURCE_EXHAUSTED)
                if result.status == "queue_full"
                else (
                    503,
                    code_pb2.UNAVAILABLE,
                )
            )
            return self._error(
                status, code, result.message, as_json, {"Retry-After": str(int(result.retry_after_s))}
            )
        if decoded.rejected:
            self.metrics.rejected.labels(protocol="http").inc(decoded.rejected)
        self.metrics.requests.labels(protocol="http", status="200").inc()
        return Response(
            _encode(export_response(decoded.rejected, decoded.error_message), as_json),
            media_type=_JSON_TYPE if as_json else "application/x-protobuf",
        )


_WITH_CREATED = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class _Exposition:
    """What ``/metrics`` serves: ``registry`` plus the process and platform series, without ``_created``.

    The ``_created`` series (a counter's creation time) double the series count and no dashboard
    reads them; leaving them out here keeps the process-wide switch of prometheus_client untouched
    for an application that embeds the collectors. ``process_*`` (CPU, memory, descriptors) and
    ``python_info`` are collected at each scrape, outside the registry, so a test's or service's
    own registry never clashes with another's.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.extra = (ProcessCollector(registry=None), PlatformCollector(registry=None))

    def collect(self) -> Iterator[Metric]:
        names = set()
        for metric in self.registry.collect():
            names.add(metric.name)
            if metric.type not in _WITH_CREATED:
                yield metric
                continue
            # A copy: a custom collector may hand out the same Metric at every scrape.
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept
        for collector in self.extra:
            # A registry that already registered its own process collector keeps its series.
            yield from (m for m in collector.collect() if m.name not in names)


def create_http_app(
    pipeline: IngestPipeline,
    token: str | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    registry: CollectorRegistry | None = None,
    ready: Callable[[], bool] | None = None,
) -> Starlette:
    """The OTLP/HTTP app: ``POST /v1/traces``, ``GET /healthz``, ``/readyz``, ``/metrics`` + ``extra_routes``.

    ``registry`` is what ``/metrics`` exposes (default: the pipeline's, which holds the ingest metrics);
    ``ready`` adds the embedding service's own readiness (e.g. its scheduler thread) to ``/readyz``.

    Usage::

        app = create_http_app(pipeline, token="s3cret")   # clients send Authorization: Bearer s3cret
        uvicorn.run(app, host="127.0.0.1", port=4318)
    """
    exposed = registry if registry is not None else pipeline.registry
    traces = _TracesEndpoint(pipeline, token or None)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        if pipeline.ready and (ready is None or ready()):
            return PlainTextResponse("ready\n")
        return PlainTextResponse("not ready\n", status_code=503)

    scraped = _Exposition(exposed)

    async def metrics(request: Request) -> Response:
        # The format the scraper asks for: OpenMetrics for Prometheus, else the 0.0.4 text format
        # every scraper reads (prometheus_client's "latest" text type, 1.0.0, older ones refuse).
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encode(scraped), headers={"Content-Type": content_type})

    routes: list[BaseRoute] = [
        Route("/v1/traces", traces.handle, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *extra_routes,
    ]
    app = Starlette(routes=routes)
    app.state.inflight_bytes = traces.budget  # observable: tests check it returns to 0
    return app
