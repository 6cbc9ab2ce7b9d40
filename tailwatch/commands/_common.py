"""Options and helpers shared by the commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from tailwatch.config import STORE_ENV

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
