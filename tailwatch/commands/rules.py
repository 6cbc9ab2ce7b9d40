"""``tailwatch rules check FILE...``: validate rule files, every problem as ``file:line: message``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slo_rules import DEFAULT_RULES_PATH, check_rule_files, load_rules


@click.group()
def rules() -> None:
    """SLO and alert rules (YAML)."""


@rules.command("check")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path, dir_okay=False))
def check(files: tuple[Path, ...]) -> None:
    """Validate rule FILES (default: the shipped pack); print every problem, exit 1 if any."""
    paths = list(files) or [DEFAULT_RULES_PATH]
    problems = check_rule_files(paths)
    for problem in problems:
        click.echo(str(problem))
    if problems:
        click.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        sys.exit(1)
    ruleset = load_rules(paths)
    click.echo(f"ok: {len(ruleset)} rules in {len(paths)} file{'s' if len(paths) != 1 else ''}")
