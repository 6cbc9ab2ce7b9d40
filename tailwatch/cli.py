"""The ``tailwatch`` command line. Each command group lives in ``tailwatch/commands/``."""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from storage import TailwatchError
from tailwatch import __version__
from tailwatch.commands import alerts as alerts_commands
from tailwatch.commands import analyze as analyze_commands
from tailwatch.commands import collect as collect_commands
from tailwatch.commands import config as config_commands
from tailwatch.commands import dashboard as dashboard_commands
from tailwatch.commands import demo as demo_commands
from tailwatch.commands import generate as generate_commands
from tailwatch.commands import grafana as grafana_commands
from tailwatch.commands import ingest as ingest_commands
from tailwatch.commands import rules as rules_commands
from tailwatch.commands import schema as schema_commands
from tailwatch.commands import serve as serve_commands
from tailwatch.commands import summaries as summaries_commands
from tailwatch.commands._common import EXIT_INTERRUPTED, EXIT_USAGE


class _Group(click.Group):
    """The exit statuses of every command (``tailwatch.commands._common``): a
    :class:`TailwatchError` becomes one ``tailwatch: error: …`` line and exit status 2, Ctrl-C
    ``tailwatch: interrupted`` and 130 (click's own "Aborted!" and 1 said nothing)."""

    def invoke(self, ctx: click.Context) -> Any:
        # clickhouse-connect logs a driver failure ("Unexpected Http Driver Exception", a urllib3
        # line) before raising it; the raised error already becomes our one-line message.
        logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)
        try:
            return super().invoke(ctx)
        except TailwatchError as exc:
            click.echo(f"tailwatch: error: {exc}", err=True)
            sys.exit(EXIT_USAGE)
        except KeyboardInterrupt:
            click.echo("\ntailwatch: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tailwatch")
def main() -> None:
    """tailwatch: latency tails of AI features, from OpenTelemetry traces in ClickHouse.

    Every command that reads the store or a setting takes --store DSN (or TAILWATCH_STORE):
    chdb:///abs/path for the embedded engine (default: .tailwatch/store under the working
    directory) or http(s)://user:password@host:port/database for a ClickHouse server or cluster;
    and --config FILE (or TAILWATCH_CONFIG, else ./tailwatch.toml when present): each setting is
    the option, else its TAILWATCH_* variable, else the file, else the default.

    Exit status: 0 ok; 1 the command ran and found a problem to act on; 2 a usage or
    configuration error (one line); 130 interrupted.
    """


main.add_command(schema_commands.schema)
main.add_command(analyze_commands.analyze)
main.add_command(rules_commands.rules)
main.add_command(alerts_commands.alerts)
main.add_command(collect_commands.collect)
main.add_command(ingest_commands.ingest)
main.add_command(generate_commands.generate)
main.add_command(demo_commands.demo)
main.add_command(serve_commands.serve)
main.add_command(config_commands.config)
main.add_command(dashboard_commands.dashboard)
main.add_command(summaries_commands.summaries)
main.add_command(grafana_commands.grafana)
