"""Synthetic traces for the end-to-end dashboard tests: every view has data, and every string a
span can carry (service, operation, span name, queue, workflow, hop) is hostile somewhere."""

from __future__ import annotations

from datetime import datetime

from collectors import SpanRow
from tests.analytics.builders import S, at, cold_job, dt, hot_request, scenario_llm_regression, workflow_run
from tests.dashboards.frames import HOSTILE, HOSTILE_FLAG

# Baseline hour [T0, T0+1h), current hour [T0+1h, T0+2h): the window the tests export.
START: datetime = dt(at(3600))
END: datetime = dt(at(7200))


def dashboard_spans(requests: int = 200) -> list[SpanRow]:
    spans = list(scenario_llm_regression(requests=requests).spans)
    for window in (0, 1):
        for i in range(60):
            start = at(window * 3600 + i * 55.0)
            duration = 300.0 + (i % 10) * 40.0 + (600.0 if window and i % 20 == 0 else 0.0)
            spans += hot_request(
                HOSTILE,
                HOSTILE_FLAG,
                start,
                duration,
                version="1.0.0" if window == 0 else HOSTILE,
                internal=[(HOSTILE_FLAG, duration * 0.5)],
                http_status=499 if i % 15 == 0 else 200,
            )
    for i in range(40):
        enqueue = at(3600 + i * 80.0)
        spans += cold_job(HOSTILE, enqueue, 2.0 + (30.0 if i % 20 == 0 else 0.0), 1.0)
        spans += cold_job("emails", enqueue + S, 0.5, 0.2, via="parent")
    for i in range(40):
        retries = {HOSTILE_FLAG: 1} if i % 10 == 0 else {}
        spans += workflow_run(HOSTILE, at(3600 + i * 60.0), ("plan", HOSTILE_FLAG, "answer"), retries)
    return spans
