"""Options and helpers shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from storage import Store, TailwatchError, as_utc, parse_duration, parse_time
from tailwatch.config import CONFIG_ENV, DEFAULT_CONFIG_FILE, STORE_ENV, TailwatchConfig, load_config

if TYPE_CHECKING:
    from collectors import TracesLayout

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


def check_traces(layout: TracesLayout, where: str) -> None:
    """Raise the one-line error of a span table tailwatch cannot read (missing, or lacking columns),
    naming a command that helps, instead of the SQL error the first read would give."""
    if not layout.exists:
        raise TailwatchError(
            f"store {where} has no {layout.table} table; run `tailwatch schema apply --store {where}` "
            "to create it, or point --store at the store your collectors write "
            "(`tailwatch schema inspect --store DSN` says what a store holds)"
        )
    if layout.missing_columns:
        raise TailwatchError(
            f"{layout.table} in store {where} ({layout.variant} layout) lacks columns tailwatch reads: "
            f"{', '.join(layout.missing_columns)}; point --store at the database where the Collector's "
            f"{layout.table} is (`tailwatch schema inspect --store DSN` says what a store holds), or "
            "make a new store with `tailwatch schema apply --store DSN`"
        )


def require_traces(store: Store, *, allow_missing: bool = False) -> TracesLayout:
    """The store's span table, checked once per store object (``inspect_traces`` caches it): every
    command that reads spans calls this first. ``allow_missing`` lets a store without the table
    through (the caller reports that itself); a table lacking columns is an error either way."""
    from collectors import inspect_traces

    layout = inspect_traces(store)
    if layout.exists or not allow_missing:
        check_traces(layout, store.location.redacted())
    return layout
