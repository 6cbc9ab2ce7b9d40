"""Shared fixtures. The embedded engine allows one open store per process: every fixture that
opens one closes it at teardown, so the next test can open another path."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import analytics  # noqa: F401 - importing a stage registers its tables with storage.ensure_schema
import slo_rules  # noqa: F401
import tailwatch.service_schema  # noqa: F401
from storage import Store, ensure_schema, open_store

REPO_ROOT = Path(__file__).resolve().parent.parent
TAILWATCH_BIN = str(Path(sys.executable).with_name("tailwatch"))


@pytest.fixture
def store_dsn(tmp_path: Path) -> str:
    return "chdb://" + str(tmp_path / "store")


@pytest.fixture
def store(store_dsn: str) -> Iterator[Store]:
    """A fresh embedded store with the whole schema applied, closed after the test."""
    s = open_store(store_dsn)
    try:
        ensure_schema(s)
        yield s
    finally:
        s.close()


@pytest.fixture
def raw_store(store_dsn: str) -> Iterator[Store]:
    """A fresh embedded store with no schema."""
    s = open_store(store_dsn)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Tests never pick up a developer's TAILWATCH_* settings or write into the repository.
    for key in list(os.environ):
        if key.startswith("TAILWATCH_"):
            monkeypatch.delenv(key, raising=False)
