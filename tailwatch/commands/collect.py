"""``tailwatch collect``: the OTLP receivers alone, writing spans into the store."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import click

from collectors import IngestRuntime, PipelineSettings
from storage import Store, StoreInUseError, open_store, parse_dsn
from tailwatch.commands._common import command_config, store_config_options
from tailwatch.config import SPOOL_DIR_ENV
from tailwatch.remote import find_service


@click.command()
@store_config_options
@click.option(
    "--otlp-http",
    default=None,
    metavar="HOST:PORT",
    help="OTLP/HTTP listen address ('off' to disable; port 0 picks a free port) [env "
    "TAILWATCH_OTLP_HTTP; default: receiver.otlp_http of the config, else 127.0.0.1:4318].",
)
@click.option(
    "--otlp-grpc",
    default=None,
    metavar="HOST:PORT",
    help="OTLP/gRPC listen address ('off' to disable) [env TAILWATCH_OTLP_GRPC; default: "
    "receiver.otlp_grpc of the config, else 127.0.0.1:4317].",
)
@click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"fsync'd spool of acknowledged spans [env {SPOOL_DIR_ENV}; default: ingest.spool_dir of "
    "the config, else <store path>.spool].",
)
@click.option(
    "--no-spool",
    is_flag=True,
    help="Acknowledge exports only after the insert, no spool [default: ingest.spool of the config, else "
    "a spool].",
)
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Insert every N spans [env TAILWATCH_BATCH_ROWS; default: ingest.batch_rows of the config, "
    f"else {PipelineSettings.batch_rows}].",
)
@click.option(
    "--flush-interval",
    type=click.FloatRange(min=0.001),
    default=None,
    help="Insert at least every S seconds [env TAILWATCH_FLUSH_INTERVAL_S; default: "
    "ingest.flush_interval of the config, else 1].",
)
@click.option(
    "--max-queue-spans",
    type=click.IntRange(min=1),
    default=None,
    help="Spans held before answering 429/503 [env TAILWATCH_MAX_QUEUE_SPANS; default: "
    "ingest.max_queue_spans of the config, else 200000].",
)
def collect(
    store_dsn: str | None,
    config_path: Path | None,
    otlp_http: str | None,
    otlp_grpc: str | None,
    spool_dir: Path | None,
    no_spool: bool,
    batch_rows: int | None,
    flush_interval: float | None,
    max_queue_spans: int | None,
) -> None:
    """Receive OTLP traces (HTTP and gRPC) and write them into otel_traces until SIGTERM/SIGINT.

    The store and the [receiver], [ingest] and [auth] settings come from the configuration;
    options given here come first. Set TAILWATCH_INGEST_TOKEN (or the variable auth.token_env
    names) to require `Authorization: Bearer <token>` on both protocols. Binds loopback by default;
    give another HOST explicitly to accept remote exporters.
    """
    config = command_config(
        store_dsn,
        config_path,
        **{
            "receiver.otlp_http": otlp_http,
            "receiver.otlp_grpc": otlp_grpc,
            "ingest.spool_dir": spool_dir,
            "ingest.spool": False if no_spool else None,
            "ingest.batch_rows": batch_rows,
            "ingest.flush_interval": flush_interval,
            "ingest.max_queue_spans": max_queue_spans,
        },
    )
    location = parse_dsn(config.store)
    settings = config.pipeline_settings()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with _own_store(location.dsn) as store:
            runtime = IngestRuntime(
                store,
                settings,
                http=config.receiver.otlp_http,
                grpc=config.receiver.otlp_grpc,
                token=config.auth.token(),
            )
            runtime.start()
            try:
                if runtime.replayed:
                    click.echo(
                        f"tailwatch collect: replayed {runtime.replayed} spans from the spool", err=True
                    )
                for protocol, address, port in (
                    ("http", runtime.receivers.http_address, runtime.http_port),
                    ("grpc", runtime.receivers.grpc_address, runtime.grpc_port),
                ):
                    if address:
                        click.echo(
                            f"tailwatch collect: otlp/{protocol} listening on {address[0]}:{port}", err=True
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
                clean = runtime.stop(timeout_s=60.0)
            inserted = runtime.pipeline.inserted + runtime.replayed
            click.echo(
                f"tailwatch collect: stopped; {inserted} spans inserted"
                + ("" if clean else " (some spans left in the spool for the next start)"),
                err=True,
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _own_store(dsn: str) -> Store:
    """The store, which the receivers write; held by another process, one line saying what works."""
    try:
        return open_store(dsn)
    except StoreInUseError as exc:
        service = find_service(dsn)
        if service is None:
            raise StoreInUseError(
                f"store {dsn} is in use by another process; stop it before collecting into this store"
            ) from None
        raise StoreInUseError(
            f"store {dsn} is owned by the running tailwatch service (pid {service.pid}), which already "
            f"receives spans for it: export to {service.api_url}/v1/traces (OTLP/HTTP), or "
            "`tailwatch ingest FILE...` files through it"
        ) from exc
