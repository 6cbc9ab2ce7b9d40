"""``tailwatch rules check [FILE...]``: validate rule files, every problem as ``file:line: message``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from slo_rules import DEFAULT_RULES_PATH, check_rule_files, load_rules
from tailwatch.commands._common import (
    EXIT_PROBLEM,
    OutputFormat,
    command_config,
    config_option,
    format_option,
)


@click.group()
def rules() -> None:
    """SLO and alert rules (YAML)."""


@rules.command("check")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
@config_option
@format_option()
def check(files: tuple[Path, ...], config_path: Path | None, output_format: OutputFormat) -> None:
    """Validate rule FILES [default: rules.files of the config, else the shipped pack]: print every
    problem as file:line: message, exit 1 if there is any.

    These are the files `tailwatch serve` and `tailwatch alerts evaluate` load when the
    configuration (--config, TAILWATCH_RULES, TAILWATCH_CONFIG or ./tailwatch.toml) names them.
    """
    if files:
        paths = list(files)
    else:
        # A configured rule file that does not exist is already a configuration error (exit 2).
        paths = list(command_config(config_path=config_path).rules.files) or [DEFAULT_RULES_PATH]
    problems = check_rule_files(paths)
    count = 0 if problems else len(load_rules(paths))
    if output_format == "json":
        body = {
            "files": [str(p) for p in paths],
            "rules": count,
            "problems": [{"file": p.file, "line": p.line, "message": p.message} for p in problems],
        }
        click.echo(json.dumps(body, indent=2))
    else:
        for problem in problems:
            click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        sys.exit(EXIT_PROBLEM)
    if output_format == "table":
        click.echo(f"ok: {count} rules in {len(paths)} file{'s' if len(paths) != 1 else ''}")
