"""``tailwatch serve``: receivers, scheduled jobs, alert delivery and the read API in one process."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import click

from tailwatch.commands._common import EXIT_PROBLEM, command_config, store_config_options
from tailwatch.config import resolve_overrides
from tailwatch.logs import setup_logging

log = logging.getLogger("tailwatch.serve")


@click.command()
@store_config_options
@click.option(
    "--otlp-http",
    metavar="HOST:PORT",
    help="OTLP/HTTP + API listen address, or off [env TAILWATCH_OTLP_HTTP; default: "
    "receiver.otlp_http of the config, else 127.0.0.1:4318].",
)
@click.option(
    "--otlp-grpc",
    metavar="HOST:PORT",
    help="OTLP/gRPC listen address, or off [env TAILWATCH_OTLP_GRPC; default: receiver.otlp_grpc of "
    "the config, else 127.0.0.1:4317].",
)
@click.option(
    "--log-format",
    type=click.Choice(["plain", "json"]),
    default=None,
    help="Log lines as plain text or JSON objects [env TAILWATCH_LOG_FORMAT; default: log.format of "
    "the config, else plain].",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="[env TAILWATCH_LOG_LEVEL; default: log.level of the config, else info]",
)
def serve(
    store_dsn: str | None,
    config_path: Path | None,
    otlp_http: str | None,
    otlp_grpc: str | None,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """Run the receivers, the scheduled jobs and the read API until SIGTERM/SIGINT.

    Jobs: latency rollups, the analysis, rule evaluation + alert delivery, dashboard export, each
    on its [schedule] entry. With a chdb:// store the service owns it; `analyze`, `alerts list`
    and `dashboard export` then reach it through GET/POST /api/v1/... on the OTLP/HTTP port,
    which also serves the latest dashboards under /dashboards/.
    """
    from tailwatch.service import Service

    config = command_config(
        store_dsn,
        config_path,
        **resolve_overrides(
            otlp_http=otlp_http, otlp_grpc=otlp_grpc, log_format=log_format, log_level=log_level
        ),
    )
    setup_logging(config.log.format, config.log.level)

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    service = Service(config)
    service.start()
    failed = False
    while not stop.wait(1.0):
        if service.runner is not None and not service.runner.alive:
            # /readyz already says so; a scheduler that died runs no analysis, rule or delivery
            # again: stop cleanly (the queue flushed) and exit non-zero for the supervisor to restart.
            log.error("the job scheduler stopped unexpectedly: stopping so the service can be restarted")
            failed = True
            break
    if not failed:
        log.info("%s received: stopping", signal.Signals(received[0]).name if received else "stop")
    clean = service.stop()
    log.info("stopped")
    logging.shutdown()
    if failed:
        sys.stderr.flush()
        os._exit(EXIT_PROBLEM)
    if not clean:
        # A job overran shutdown_timeout: its worker thread would keep the interpreter alive.
        # The queue is already flushed, so leaving now loses nothing acknowledged.
        sys.stderr.flush()
        os._exit(0)
