"""An opentelemetry-sdk ``SpanExporter`` that writes finished spans straight into the store.

For applications that want tracing into tailwatch without running a receiver. Spans go through the
SDK's own OTLP encoder and then the receivers' decoder, so the rows are identical to what an
OTLP export to ``tailwatch collect`` produces.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from collectors.otlp_decode import request_to_arrow
from collectors.pipeline import IngestPipeline
from collectors.writer import StoreSpanWriter
from storage import Store

__all__ = ["ClickHouseSpanExporter"]

log = logging.getLogger(__name__)


class ClickHouseSpanExporter(SpanExporter):
    """Export SDK spans to ``otel_traces`` of a store (one insert per export) or through a pipeline.

    Usage::

        store = open_store("chdb:///var/lib/tailwatch")
        provider.add_span_processor(BatchSpanProcessor(ClickHouseSpanExporter(store)))

    Use it behind ``BatchSpanProcessor`` (batches of 512 by default): every ``export`` is one insert.
    Never raises into the SDK: failures are logged once per run of failures and returned as
    ``SpanExportResult.FAILURE``.
    """

    def __init__(self, store: Store | None = None, *, pipeline: IngestPipeline | None = None) -> None:
        if (store is None) == (pipeline is None):
            raise ValueError("ClickHouseSpanExporter needs exactly one of store= or pipeline=")
        self._writer = StoreSpanWriter(store) if store is not None else None
        self._pipeline = pipeline
        self._shutdown = False
        self._failing = False
        self.exported = 0
        self.rejected = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            decoded = request_to_arrow(encode_spans(spans))
            if self._pipeline is not None:
                result = self._pipeline.submit(decoded.table, protocol="sdk")
                if not result.ok:
                    raise RuntimeError(result.message)
            elif self._writer is not None:
                self._writer.write(decoded.table)
        except Exception as exc:
            if not self._failing:
                log.error("tailwatch span export failed (%d spans): %s", len(spans), exc)
            self._failing = True
            return SpanExportResult.FAILURE
        if self._failing:
            log.info("tailwatch span export recovered")
        self._failing = False
        self.exported += decoded.accepted
        self.rejected += decoded.rejected
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._pipeline is not None:
            return self._pipeline.flush(timeout_millis / 1000)
        return True
