"""Module-scoped fixtures: each flavour's app runs once per test module (``FLAVOUR = "<name>"`` in the
module), into a store the module owns (opened and closed by :func:`ingested_run`; pytest runs a
module's tests together and tears the fixture down before the next module's tests open theirs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics import Conventions, analyze
from tests.integrations.ingest import FlavourRun, ingested_run
from tests.integrations.truth import Truth

# Small samples (30 requests per endpoint and phase): a verdict needs 20 requests a window and a p99
# step of 50 ms.
# 30 requests a window: at the p99 the tail is one trace, and one scheduling hiccup of a loaded
# machine decides the verdict; the slowest 10% (three traces) are compared instead.
CONVENTIONS = Conventions(attribution_min_requests=20, attribution_min_delta_ms=50.0, tail_quantile=0.9)


@pytest.fixture(scope="module")
def flavour_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlavourRun]:
    flavour: str = request.module.FLAVOUR
    tmp: Path = tmp_path_factory.mktemp(flavour)
    with ingested_run(flavour, tmp) as run:
        yield run


@pytest.fixture(scope="module")
def truth(flavour_run: FlavourRun) -> Truth:
    return Truth(flavour_run.spans)


@pytest.fixture(scope="module")
def analysis(flavour_run: FlavourRun) -> dict[str, Any]:
    """``analyze(...).to_dict()`` over the current phase against the baseline phase."""
    (start, end), (baseline_start, baseline_end) = flavour_run.current, flavour_run.baseline
    result = analyze(flavour_run.store, start, end, baseline_start, baseline_end, conventions=CONVENTIONS)
    return result.to_dict()
