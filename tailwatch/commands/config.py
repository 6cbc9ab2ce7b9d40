"""``tailwatch config show|check|init``."""

from __future__ import annotations

import os
from pathlib import Path

import click

from slo_rules import DEFAULT_RULES_PATH, check_rule_files
from storage import TailwatchError, parse_dsn
from tailwatch.commands._common import config_option
from tailwatch.config import DEFAULT_CONFIG_FILE, example_config, load_config, render_config


@click.group("config")
def config() -> None:
    """Show or check the effective service configuration, or write an example file."""


@config.command("show")
@config_option
def show(config_path: Path | None) -> None:
    """Print the configuration `tailwatch serve` would run with (file + TAILWATCH_* env), secrets masked.

    Exits 2 with one line naming the key when the configuration is invalid.
    """
    click.echo(render_config(load_config(config_path)), nl=False)


@config.command("check")
@config_option
def check(config_path: Path | None) -> None:
    """Pre-flight check: everything `tailwatch serve` validates before it starts, without starting.

    The configuration (file + TAILWATCH_* env), the rule files, every secret a notifier names, and
    that an embedded store's directory can be created. Exits 1 listing every problem.
    """
    problems: list[str] = []
    try:
        loaded = load_config(config_path)
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
    return 1


@config.command("init")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG_FILE)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: Path, force: bool) -> None:
    """Write a commented example configuration to PATH [./tailwatch.toml]."""
    if path.exists() and not force:
        raise TailwatchError(f"{path} exists; use --force to overwrite it")
    path.write_text(example_config(), encoding="utf-8")
    click.echo(f"wrote {path}")
