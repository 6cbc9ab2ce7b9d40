"""Prometheus metrics of the ingest path, registered in an injectable registry.

A pipeline gets its own :class:`~prometheus_client.CollectorRegistry` unless one is passed, so two
pipelines in one process (tests, or a service that restarts its receivers) never collide; the
service passes its registry so ``/metrics`` shows ingest and job metrics together.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["IngestMetrics"]

_BATCH_BUCKETS = (1, 10, 100, 512, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class IngestMetrics:
    """Counters and gauges of one pipeline and its receivers.

    Usage::

        registry = CollectorRegistry()
        metrics = IngestMetrics(registry)
        metrics.received.labels(protocol="http").inc(512)
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.received = Counter(
            "tailwatch_ingest_spans_received",
            "Spans received in export requests that decoded.",
            ["protocol"],
            registry=registry,
        )
        self.accepted = Counter(
            "tailwatch_ingest_spans_accepted",
            "Spans acknowledged to clients (spooled or inserted).",
            ["protocol"],
            registry=registry,
        )
        self.rejected = Counter(
            "tailwatch_ingest_spans_rejected",
            "Spans rejected as invalid (partial success), never retried by clients.",
            ["protocol"],
            registry=registry,
        )
        self.dropped = Counter(
            "tailwatch_ingest_spans_dropped",
            "Spans refused because the queue was full or the pipeline unavailable (clients retry).",
            ["protocol", "reason"],
            registry=registry,
        )
        self.requests = Counter(
            "tailwatch_ingest_requests",
            "Export requests by protocol and response status.",
            ["protocol", "status"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "tailwatch_ingest_queue_spans",
            "Spans accepted and waiting to be inserted.",
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "tailwatch_ingest_spool_bytes",
            "Bytes in the on-disk spool not yet released.",
            registry=registry,
        )
        self.batch_rows = Histogram(
            "tailwatch_ingest_batch_rows",
            "Rows per insert into otel_traces.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.insert_seconds = Histogram(
            "tailwatch_ingest_insert_seconds",
            "Latency of one insert into otel_traces.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inserted = Counter(
            "tailwatch_ingest_spans_inserted",
            "Spans written to otel_traces.",
            registry=registry,
        )
        self.insert_errors = Counter(
            "tailwatch_ingest_insert_errors",
            "Failed inserts (the batch is kept and retried).",
            registry=registry,
        )
        self.replayed = Counter(
            "tailwatch_ingest_spans_replayed",
            "Spans replayed from the spool at start (after a crash).",
            registry=registry,
        )
