"""``tailwatch collect``: the OTLP receivers alone, writing spans into the store."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from types import FrameType

import click

from collectors.settings import (
    DEFAULT_GRPC_ADDRESS,
    DEFAULT_HTTP_ADDRESS,
    INGEST_TOKEN_ENV,
    SPOOL_DIR_ENV,
    PipelineSettings,
    parse_address,
)
from storage import TailwatchError, open_store, parse_dsn
from tailwatch.commands._common import store_option
from tailwatch.config import default_spool_dir, resolve_dsn


def _address(value: str) -> str | None:
    return None if value.strip().lower() in ("off", "none", "") else value.strip()


@click.command()
@store_option
@click.option(
    "--otlp-http",
    default=DEFAULT_HTTP_ADDRESS,
    show_default=True,
    metavar="HOST:PORT",
    help="OTLP/HTTP listen address ('off' to disable; port 0 picks a free port).",
)
@click.option(
    "--otlp-grpc",
    default=DEFAULT_GRPC_ADDRESS,
    show_default=True,
    metavar="HOST:PORT",
    help="OTLP/gRPC listen address ('off' to disable).",
)
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=SPOOL_DIR_ENV,
    default=None,
    help=f"fsync'd spool of acknowledged spans [env {SPOOL_DIR_ENV}; default: <store path>.spool].",
)
@click.option("--no-spool", is_flag=True, help="Acknowledge exports only after the insert (no spool).")
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=None,
    help=f"Insert every N spans [{PipelineSettings.batch_rows}].",
)
@click.option(
    "--flush-interval",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Insert at least every S seconds [1].",
)
@click.option(
    "--max-queue-spans",
    type=click.IntRange(min=1),
    default=None,
    help="Spans held before answering 429/503 [200000].",
)
def collect(
    store_dsn: str | None,
    otlp_http: str,
    otlp_grpc: str,
    spool_dir: Path | None,
    no_spool: bool,
    batch_rows: int | None,
    flush_interval: float | None,
    max_queue_spans: int | None,
) -> None:
    """Receive OTLP traces (HTTP and gRPC) and write them into otel_traces until SIGTERM/SIGINT.

    Set TAILWATCH_INGEST_TOKEN to require `Authorization: Bearer <token>` on both protocols.
    Binds loopback by default; give another HOST explicitly to accept remote exporters.
    """
    from collectors.pipeline import IngestPipeline
    from collectors.receivers import Receivers

    location = parse_dsn(resolve_dsn(store_dsn))
    spool = None if no_spool else (spool_dir or default_spool_dir(location))
    settings = PipelineSettings.from_env(
        batch_rows=batch_rows,
        flush_interval_s=flush_interval,
        max_queue_spans=max_queue_spans,
        spool_dir=spool,
    )
    if no_spool:  # explicit: also over TAILWATCH_SPOOL_DIR
        settings = replace(settings, spool_dir=None)
    http, grpc = _address(otlp_http), _address(otlp_grpc)
    # Addresses are checked before the store and spool are opened, so a typo costs nothing.
    if http:
        parse_address(http, what="the OTLP/HTTP address")
    if grpc:
        parse_address(grpc, what="the OTLP/gRPC address")
    token = os.environ.get(INGEST_TOKEN_ENV, "").strip() or None
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with open_store(location.dsn) as store:
            pipeline = IngestPipeline(store, settings)
            pipeline.start()
            if pipeline.replayed:
                click.echo(f"tailwatch collect: replayed {pipeline.replayed} spans from the spool", err=True)
            receivers = Receivers(pipeline, http=http, grpc=grpc, token=token)
            try:
                try:
                    receivers.start()
                except OSError as exc:  # a taken port or an unknown host: one line, not a traceback
                    raise TailwatchError(str(exc)) from None
                if receivers.http_address:
                    host = receivers.http_address[0]
                    click.echo(
                        f"tailwatch collect: otlp/http listening on {host}:{receivers.http_port}", err=True
                    )
                if receivers.grpc_address:
                    host = receivers.grpc_address[0]
                    click.echo(
                        f"tailwatch collect: otlp/grpc listening on {host}:{receivers.grpc_port}", err=True
                    )
                click.echo(
                    f"tailwatch collect: writing to {location.redacted()}"
                    + (f", spool {settings.spool_dir}" if settings.spool_dir else ", no spool"),
                    err=True,
                )
                while not stop.wait(0.5):
                    pass
                click.echo("tailwatch collect: stopping, flushing the queue", err=True)
            finally:
                receivers.stop()
                clean = pipeline.stop(timeout_s=60.0)
            inserted = pipeline.inserted + pipeline.replayed
            click.echo(
                f"tailwatch collect: stopped; {inserted} spans inserted"
                + ("" if clean else " (some spans left in the spool for the next start)"),
                err=True,
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
