"""Options and helpers shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click

from storage import as_utc, parse_duration, parse_time
from tailwatch.config import CONFIG_ENV, DEFAULT_CONFIG_FILE, STORE_ENV, TailwatchConfig, load_config

F = TypeVar("F", bound=Callable[..., Any])


def store_option(func: F) -> F:
    """``--store DSN``, falling back to ``TAILWATCH_STORE`` and then the embedded default."""
    return click.option(
        "--store",
        "store_dsn",
        metavar="DSN",
        envvar=STORE_ENV,
        default=None,
        help="chdb:///abs/path or http(s)://user:password@host:port/db "
        f"[env {STORE_ENV}; default chdb://$PWD/.tailwatch/store]",
    )(func)


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CONFIG_ENV,
    help=f"TOML config file [env {CONFIG_ENV}; default ./{DEFAULT_CONFIG_FILE} when present].",
)


def command_config(store_dsn: str | None = None, **overrides: Any) -> TailwatchConfig:
    """The settings of a one-shot command: option → ``TAILWATCH_*`` → ``tailwatch.toml`` → default.

    ``overrides`` are dotted config keys (``{"ingest.batch_rows": 500}``); None values are ignored.
    """
    return load_config(overrides={"store": store_dsn, **overrides})


class _ISOTime(click.ParamType):
    """An ISO 8601 instant as UTC; one without an offset is UTC (:mod:`storage.times`)."""

    name = "ISO8601"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return as_utc(value)
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Duration(click.ParamType):
    """A duration in the one grammar (``30s``, ``5m``, ``1h30m``, ``1d``)."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


ISO_TIME = _ISOTime()
DURATION = _Duration()
