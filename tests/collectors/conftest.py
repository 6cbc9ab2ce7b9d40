"""Fixtures for the ingest tests: a running pipeline on the test's fresh store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.pipeline import IngestPipeline
from collectors.settings import PipelineSettings
from storage import Store


@pytest.fixture
def pipeline(store: Store, tmp_path: Path) -> Iterator[IngestPipeline]:
    """A started pipeline with a spool, flushing fast; stopped (and flushed) at teardown."""
    p = IngestPipeline(
        store,
        PipelineSettings(batch_rows=2_000, flush_interval_s=0.05, spool_dir=tmp_path / "spool"),
    )
    p.start()
    try:
        yield p
    finally:
        p.stop(timeout_s=30)
