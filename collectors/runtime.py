"""The ingest runtime: one pipeline and the OTLP receivers in front of it, started and stopped together.

``tailwatch collect``, ``tailwatch serve`` and the demo all run ingest through this one builder, so
the order that keeps acknowledged spans safe is written once: the pipeline (and its spool replay)
starts before anything listens, and on the way out the receivers stop accepting and drain before
the pipeline flushes and stops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType

from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from storage import Store, TailwatchError

__all__ = ["IngestRuntime"]


class IngestRuntime:
    """Pipeline + receivers. ``http``/``grpc`` are ``HOST:PORT`` (port 0: a free one) or None (off).

    Usage::

        with IngestRuntime(store, PipelineSettings(), http="127.0.0.1:0", grpc=None) as runtime:
            print(runtime.http_port)            # exporters send to http://127.0.0.1:<port>/v1/traces
            ...
            runtime.flush()                     # everything acknowledged so far is in the store
    """

    def __init__(
        self,
        store: Store,
        settings: PipelineSettings | None = None,
        *,
        http: str | None,
        grpc: str | None,
        token: str | None = None,
        extra_routes: Sequence[BaseRoute] = (),
        registry: CollectorRegistry | None = None,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.pipeline = IngestPipeline(store, settings, registry=registry)
        # Addresses are parsed here, before anything starts, so a typo costs nothing.
        self.receivers = Receivers(
            self.pipeline,
            http=http,
            grpc=grpc,
            token=token,
            extra_routes=extra_routes,
            registry=registry,
            ready=ready,
        )

    @property
    def settings(self) -> PipelineSettings:
        return self.pipeline.settings

    @property
    def replayed(self) -> int:
        """Spans replayed from the spool at start (acknowledged before a crash, inserted now)."""
        return self.pipeline.replayed

    @property
    def http_port(self) -> int:
        return self.receivers.http_port

    @property
    def grpc_port(self) -> int:
        return self.receivers.grpc_port

    def start(self) -> None:
        """Start the pipeline (replaying the spool), then listen. A taken port is one-line error."""
        self.pipeline.start()
        try:
            self.receivers.start()
        except OSError as exc:
            self.pipeline.stop()
            raise TailwatchError(str(exc)) from None
        except BaseException:
            self.pipeline.stop()
            raise

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every accepted span is inserted; False on timeout."""
        return self.pipeline.flush(timeout_s=timeout_s)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop accepting, drain in-flight requests, then flush and stop the pipeline."""
        self.receivers.stop()
        return self.pipeline.stop(timeout_s=timeout_s)

    def __enter__(self) -> IngestRuntime:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
