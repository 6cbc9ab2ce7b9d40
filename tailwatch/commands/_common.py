"""Options and helpers shared by the commands.

The conventions every command follows, in one place:

* **Settings**: a command that reads the store or any setting takes ``--store`` and ``--config``
  (:func:`store_config_options`) and gets its :class:`TailwatchConfig` from
  :func:`command_config`: command-line option → ``TAILWATCH_*`` environment variable → the config
  file (``--config``, ``$TAILWATCH_CONFIG``, else ``./tailwatch.toml``) → documented default.
* **Windows**: ``--start``/``--end``/``--last`` (:func:`window_options`, :func:`resolve_window`).
* **Output**: ``--format table|json`` (:func:`format_option`); ``text`` is still accepted for
  ``table``.
* **Exit status**: :data:`EXIT_OK` (0), :data:`EXIT_PROBLEM` (1: the command ran and found something
  the user must act on), :data:`EXIT_USAGE` (2: a usage or configuration error, one
  ``tailwatch: error: …`` line), :data:`EXIT_INTERRUPTED` (130: Ctrl-C).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

import click

from storage import Store, TailwatchError, as_utc, parse_duration, parse_time, utc_now
from tailwatch.config import CONFIG_ENV, DEFAULT_CONFIG_FILE, STORE_ENV, TailwatchConfig, load_config

if TYPE_CHECKING:
    from collectors import TracesLayout

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
"""The command did what was asked."""
EXIT_PROBLEM = 1
"""The command ran and found a problem the user must act on (a rule file that does not validate,
a file that could not be read, a rule that could not be evaluated, undelivered notifications)."""
EXIT_USAGE = 2
"""A usage or configuration error: one ``tailwatch: error: …`` line naming what to change."""
EXIT_INTERRUPTED = 130
"""Interrupted (Ctrl-C), as a shell reports a process ended by SIGINT."""


def store_option(func: F) -> F:
    """``--store DSN``: the option, else ``TAILWATCH_STORE``, else ``store`` of the config, else the
    embedded default."""
    return click.option(
        "--store",
        "store_dsn",
        metavar="DSN",
        envvar=STORE_ENV,
        default=None,
        help="chdb:///abs/path or http(s)://user:password@host:port/db "
        f"[env {STORE_ENV}; default: store of the config, else chdb://$PWD/.tailwatch/store].",
    )(func)


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CONFIG_ENV,
    help=f"TOML config file [env {CONFIG_ENV}; default: ./{DEFAULT_CONFIG_FILE} when present].",
)


def store_config_options(func: F) -> F:
    """``--store`` and ``--config``: what every command that reads the store or a setting takes.

    The command then calls :func:`command_config` with both::

        @click.command()
        @store_config_options
        def list_command(store_dsn: str | None, config_path: Path | None) -> None:
            config = command_config(store_dsn, config_path)
    """
    return store_option(config_option(func))


def _from_environment(param: str) -> bool:
    """Whether the current command's parameter got its value from its environment variable (which
    :func:`load_config` reads itself, naming the variable in its messages)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    return ctx.get_parameter_source(param) is click.core.ParameterSource.ENVIRONMENT


def command_config(
    store_dsn: str | None = None, config_path: Path | None = None, **overrides: Any
) -> TailwatchConfig:
    """The settings of a command: option → ``TAILWATCH_*`` → the config file → default.

    ``store_dsn`` and ``config_path`` are the values of ``--store`` and ``--config``
    (:func:`store_config_options`); the file is ``--config``, else ``$TAILWATCH_CONFIG``, else
    ``./tailwatch.toml`` when present. ``overrides`` are dotted config keys set by other options
    (``{"ingest.batch_rows": 500}``); None values are ignored. A mistake raises one
    :class:`~tailwatch.config.ConfigError` line naming the key and where its value came from.
    """
    # A --store folded in from TAILWATCH_STORE is left to load_config, whose messages then name the
    # variable rather than --store.
    store = None if _from_environment("store_dsn") else store_dsn
    return load_config(config_path, overrides={"store": store, **overrides})


OutputFormat = Literal["table", "json"]
OUTPUT_FORMATS: tuple[OutputFormat, ...] = get_args(OutputFormat)
# Spellings kept working: `--format text` was the readable output of `schema inspect` and
# `summaries status`.
_FORMAT_ALIASES = {"text": "table"}


class _FormatChoice(click.Choice):
    """``table`` or ``json``; ``text`` is read as ``table``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            value = _FORMAT_ALIASES.get(value.lower(), value)
        return super().convert(value, param, ctx)


def format_option(default: OutputFormat = "table", help: str | None = None) -> Callable[[F], F]:
    """``--format table|json`` (into the parameter ``output_format``): ``table`` is text for a
    person, ``json`` one JSON document for a program. Every listing and report takes it."""
    return click.option(
        "--format",
        "output_format",
        type=_FormatChoice(list(OUTPUT_FORMATS)),
        default=default,
        show_default=True,
        help=help or "table: readable text; json: one JSON document.",
    )


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


def window_options(default: str) -> Callable[[F], F]:
    """``--start``, ``--end`` and ``--last DURATION`` of a windowed command; ``default`` says which
    window it takes when none of them is given (part of ``--last``'s help)."""

    def decorate(func: F) -> F:
        func = click.option(
            "--last",
            type=DURATION,
            default=None,
            help="The window of this length ending at --end, else now (--last 1h, 30m, 7d); "
            f"not with --start [default: {default}].",
        )(func)
        func = click.option(
            "--end", type=ISO_TIME, default=None, help="Window end, exclusive (ISO 8601) [default: now]."
        )(func)
        return click.option(
            "--start",
            type=ISO_TIME,
            default=None,
            help="Window start (ISO 8601; UTC if no offset) [default: the --last window before --end].",
        )(func)

    return decorate


def resolve_window(
    start: datetime | None,
    end: datetime | None,
    last: timedelta | None,
    default_length: timedelta | None = None,
) -> tuple[datetime | None, datetime | None]:
    """The window ``[start, end)`` of ``--start``/``--end``/``--last``.

    ``--last`` (else ``default_length``, when there is one) ends at ``--end``, else now; a
    ``--start`` without ``--end`` ends now. With neither a start nor a length the start stays None
    (the command's own default). ``--last`` with ``--start`` is a usage error (exit 2)."""
    if last is not None and start is not None:
        raise click.UsageError(
            "give --start or --last, not both (--last 1h is the hour ending at --end, or now)"
        )
    if last is not None and last <= timedelta(0):
        raise click.BadParameter("must be longer than 0 (e.g. 1h)", param_hint="--last")
    length = last or (default_length if start is None else None)
    if start is None and length is not None:
        end = end or utc_now()
        start = end - length
    elif start is not None and end is None:
        end = utc_now()
    return start, end


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


def refresh_summaries(store: Store, config: TailwatchConfig) -> None:
    """Bring the summaries and per-minute aggregates up to date before a command reads: a one-shot
    command (from cron, say) pays what the service's rollup job pays every minute, and reads
    whole minutes from them. The first time over an existing table this is the catch-up: its
    progress goes to a terminal's stderr (a cron job's stays quiet)."""
    from analytics import build_summaries

    # Summaries built with other span conventions (the service's, say) are left alone: this
    # command then reads spans where they are, never rows reduced for another question.
    build_summaries(
        store,
        keep_others=True,
        conventions=config.analysis.conventions_object(),
        progress=(lambda line: click.echo(f"tailwatch: {line}", err=True)) if sys.stderr.isatty() else None,
    )


def latency_targets(
    rule_files: Sequence[Path], warn: Callable[[str], None] | None = None
) -> list[tuple[str, str]]:
    """(service glob, operation glob) of every ``latency_slo`` rule of the configured rule files:
    the hot operations with a latency target, for the drift report's ``no_latency_target``.
    ``warn``: where to say the rule files could not be read (default: stderr)."""
    from slo_rules import RuleError, load_rules

    try:
        rules = load_rules(list(rule_files))
    except RuleError as exc:
        # The analysis does not need the rules: say why every hot operation counts as without target.
        message = f"tailwatch: drift report: rule files not read, no latency target known ({exc})"
        if warn is None:
            click.echo(message, err=True)
        else:
            warn(message)
        return []
    return [(r.service, r.operation) for r in rules.rules if r.kind == "latency_slo"]
