"""``tailwatch config show|init``."""

from __future__ import annotations

from pathlib import Path

import click

from tailwatch.config import CONFIG_ENV, DEFAULT_CONFIG_FILE, example_config, load_config, render_config


@click.group("config")
def config() -> None:
    """Show the effective service configuration or write an example file."""


@config.command("show")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=CONFIG_ENV,
    help=f"TOML config file [env {CONFIG_ENV}; default ./{DEFAULT_CONFIG_FILE} when present].",
)
def show(config_path: Path | None) -> None:
    """Print the configuration `tailwatch serve` would run with (file + TAILWATCH_* env), secrets masked.

    Exits 2 with one line naming the key when the configuration is invalid.
    """
    click.echo(render_config(load_config(config_path)), nl=False)


@config.command("init")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG_FILE)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: Path, force: bool) -> None:
    """Write a commented example configuration to PATH [./tailwatch.toml]."""
    if path.exists() and not force:
        raise click.ClickException(f"{path} exists; use --force to overwrite it")
    path.write_text(example_config(), encoding="utf-8")
    click.echo(f"wrote {path}")
