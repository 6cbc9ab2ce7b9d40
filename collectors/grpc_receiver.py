"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Same semantics as the HTTP receiver, in gRPC status codes: INVALID_ARGUMENT for undecodable data,
RESOURCE_EXHAUSTED (with a ``RetryInfo`` detail, which OTLP clients honour) when the queue is full,
UNAVAILABLE when stopping or the spool fails, UNAUTHENTICATED without the bearer token. The message
size limit is the pipeline's ``max_request_bytes``, applied by grpc after decompression as well.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from collectors.otlp_decode import (
    OtlpDecodeError,
    check_protobuf_shape,
    check_request_shape,
    decode_protobuf,
    export_response,
    request_to_arrow,
    validate_request,
)
from collectors.pipeline import IngestPipeline, SubmitResult
from collectors.receiver import token_matches

__all__ = ["GrpcReceiver"]

log = logging.getLogger(__name__)


_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

HANDSHAKE_TIMEOUT_S = 10.0
CONNECTION_IDLE_S = 300.0


class _TraceService:
    """``Export`` registered with raw bytes in: the body is parsed here, once, so an undecodable one
    is INVALID_ARGUMENT (not grpc's INTERNAL) and the raw request can go to the pipeline as is."""

    def __init__(self, pipeline: IngestPipeline, token: str | None) -> None:
        self.pipeline = pipeline
        self.token = token
        self.metrics = pipeline.metrics

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            _SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self.export,
                    request_deserializer=None,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )

    def _abort(
        self, context: grpc.ServicerContext, code: grpc.StatusCode, message: str, retry_s: float = 0
    ) -> Any:
        self.metrics.requests.labels(protocol="grpc", status=code.name).inc()
        if retry_s:
            detail = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(retry_s)))
            status = status_pb2.Status(code=code.value[0], message=message)
            status.details.add().Pack(detail)
            context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(code, message)

    def export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        if self.token is not None:
            presented = dict(context.invocation_metadata()).get("authorization")
            if not token_matches(presented if isinstance(presented, str) else None, self.token):
                return self._abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            # The same checks as OTLP/HTTP: counts refused before upb's parse and per-element work.
            check_protobuf_shape(body)
            request = decode_protobuf(body)
            check_request_shape(request, len(body))
            if self.pipeline.accepts_raw:
                received, rejected, message = validate_request(request)
                self.metrics.received.labels(protocol="grpc").inc(received)
                raw = request.SerializeToString() if rejected else body
                result = self.pipeline.submit_raw(raw, received - rejected, protocol="grpc")
                return self._answer(context, result, rejected, message)
            decoded = request_to_arrow(request)
        except OtlpDecodeError as exc:
            return self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            return self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"invalid span data: {exc}")
        self.metrics.received.labels(protocol="grpc").inc(decoded.received)
        result = self.pipeline.submit(decoded.table, protocol="grpc")
        return self._answer(context, result, decoded.rejected, decoded.error_message)

    def _answer(
        self, context: grpc.ServicerContext, result: SubmitResult, rejected: int, message: str
    ) -> ExportTraceServiceResponse:
        if not result.ok:
            code = (
                grpc.StatusCode.RESOURCE_EXHAUSTED
                if result.status == "queue_full"
                else grpc.StatusCode.UNAVAILABLE
            )
            return self._abort(context, code, result.message, result.retry_after_s)
        if rejected:
            self.metrics.rejected.labels(protocol="grpc").inc(rejected)
        self.metrics.requests.labels(protocol="grpc", status="OK").inc()
        return export_response(rejected, message)


assert code_pb2.OK == 0  # google.rpc codes and grpc.StatusCode values coincide


class GrpcReceiver:
    """A grpc server for ``TraceService/Export`` on ``host:port`` (port 0 → an ephemeral port).

    Usage::

        receiver = GrpcReceiver(pipeline, "127.0.0.1", 4317, token=None)
        receiver.start(); print(receiver.port); receiver.stop()
    """

    def __init__(
        self,
        pipeline: IngestPipeline,
        host: str = "127.0.0.1",
        port: int = 4317,
        *,
        token: str | None = None,
        max_workers: int = 16,
    ) -> None:
        self.pipeline = pipeline
        self.host = host
        self.requested_port = port
        self.token = token or None
        self.max_workers = max_workers
        self.port = 0
        self._server: grpc.Server | None = None

    def start(self) -> int:
        limit = self.pipeline.settings.max_request_bytes
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="tailwatch-grpc"),
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 4 * 1024 * 1024),
                ("grpc.so_reuseport", 0),
                # A connection that has not finished its HTTP/2 preface in time is closed (a client
                # connecting and sending nothing would otherwise hold a descriptor forever), and one
                # idle for long is closed too (exporters reconnect transparently).
                ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
                ("grpc.max_connection_idle_ms", int(CONNECTION_IDLE_S * 1000)),
            ],
            # Calls beyond this are answered RESOURCE_EXHAUSTED at once instead of queuing.
            maximum_concurrent_rpcs=4 * self.max_workers,
        )
        server.add_generic_rpc_handlers((_TraceService(self.pipeline, self.token).handler(),))
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            port = server.add_insecure_port(f"{host}:{self.requested_port}")
        except RuntimeError as exc:
            raise OSError(
                f"cannot listen for OTLP/gRPC on {self.host}:{self.requested_port}: {exc}"
            ) from None
        if port == 0:
            raise OSError(f"cannot listen for OTLP/gRPC on {self.host}:{self.requested_port}")
        server.start()
        self._server = server
        self.port = port
        return port

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting; in-flight exports get ``grace_s`` to finish."""
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 1.0)
            self._server = None
