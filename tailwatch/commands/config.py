"""``tailwatch config show|check|init``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from slo_rules import DEFAULT_RULES_PATH, check_rule_files
from storage import TailwatchError, parse_dsn
from tailwatch.commands._common import EXIT_PROBLEM, command_config, store_config_options
from tailwatch.config import DEFAULT_CONFIG_FILE, example_config, render_config


@click.group("config")
def config() -> None:
    """Show or check the effective service configuration, or write an example file."""


@config.command("show")
@store_config_options
def show(store_dsn: str | None, config_path: Path | None) -> None:
    """Print the configuration every command runs with (options, TAILWATCH_* env, the file,
    defaults), secrets masked.

    Exits 2 with one line naming the key when the configuration is invalid.
    """
    click.echo(render_config(command_config(store_dsn, config_path)), nl=False)


@config.command("check")
@store_config_options
def check(store_dsn: str | None, config_path: Path | None) -> None:
    """Pre-flight check: everything `tailwatch serve` validates before it starts, without starting.

    The configuration (file + TAILWATCH_* env), the rule files, every secret a notifier names, and
    that an embedded store's directory can be created. Exits 1 listing every problem.
    """
    problems: list[str] = []
    try:
        loaded = command_config(store_dsn, config_path)
    except TailwatchError as exc:
        raise SystemExit(_report([str(exc)])) from None
    try:
        loaded.check_environment()
    except TailwatchError as exc:
        problems.append(str(exc))
    rule_files = loaded.rules.files or [DEFAULT_RULES_PATH]
    problems += [f"rule file {p}" for p in check_rule_files(rule_files)]
    location = parse_dsn(loaded.store)
    if location.embedded:
        existing = Path(location.path)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK):
            problems.append(f"store {location.dsn}: {existing} is not writable by this user")
    if problems:
        raise SystemExit(_report(problems))
    click.echo(f"configuration ok ({loaded.config_file or 'defaults and environment'})")


def _report(problems: list[str]) -> int:
    for problem in problems:
        click.echo(f"tailwatch: error: {problem}", err=True)
    return EXIT_PROBLEM


@config.command("init")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG_FILE)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: Path, force: bool) -> None:
    """Write a commented example configuration to PATH [./tailwatch.toml]."""
    if path.exists() and not force:
        raise TailwatchError(f"{path} exists; use --force to overwrite it")
    path.write_text(example_config(), encoding="utf-8")
    click.echo(f"wrote {path}")
