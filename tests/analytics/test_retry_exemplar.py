"""``retry_amplification.exemplar_trace_id``: the trace of each workflow's most retried run."""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics import analyze, load_analysis, persist_analysis
from analytics.retries import retry_metrics
from collectors import SpanRow, insert_spans
from storage import Store
from tests.analytics.builders import at, dt, workflow_run

HOPS = ("classify", "extract", "decide")


def _row(frame: pl.DataFrame, workflow: str) -> dict[str, Any]:
    rows = frame.filter(pl.col("workflow") == workflow)
    assert rows.height == 1, rows
    return rows.row(0, named=True)


def _runs(workflow: str, retries: dict[int, dict[str, int]], runs: int = 40) -> list[list[SpanRow]]:
    """``runs`` runs 10 s apart; run i retries its hops as ``retries.get(i)`` says."""
    return [workflow_run(workflow, at(i * 10.0), HOPS, retries.get(i)) for i in range(runs)]


def test_exemplar_is_the_most_retried_run_and_empty_without_retries(store: Store) -> None:
    # One retry in a few runs, three in run 17: that run is the one to open.
    triage = _runs(
        "claims-triage", {3: {"classify": 1}, 17: {"classify": 2, "decide": 1}, 30: {"extract": 1}}
    )
    healthy = _runs("healthy", {})
    insert_spans(store, [s for run in triage + healthy for s in run])
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    assert analysis.retry_amplification.schema["exemplar_trace_id"] == pl.String
    assert _row(analysis.retry_amplification, "claims-triage")["exemplar_trace_id"] == triage[17][0].trace_id
    assert _row(analysis.retry_amplification, "healthy")["exemplar_trace_id"] == ""


def test_exemplar_ties_go_to_the_latest_run(store: Store) -> None:
    runs = _runs("claims-triage", {5: {"extract": 2}, 12: {"classify": 1, "decide": 1}, 20: {"decide": 1}})
    insert_spans(store, [s for run in runs for s in run])
    analysis = analyze(store, dt(at(0)), dt(at(3600)))
    assert _row(analysis.retry_amplification, "claims-triage")["exemplar_trace_id"] == runs[12][0].trace_id


def test_exemplar_survives_persistence(store: Store) -> None:
    runs = _runs("claims-triage", {8: {"classify": 3}})
    insert_spans(store, [s for run in runs for s in run])
    start, end = dt(at(0)), dt(at(3600))
    run_id = persist_analysis(store, analyze(store, start, end))
    loaded = load_analysis(store, start, end)
    assert loaded is not None
    assert _row(loaded.retry_amplification, "claims-triage")["exemplar_trace_id"] == runs[8][0].trace_id
    history = store.query_rows(
        "SELECT exemplar_trace_id FROM tailwatch_analysis_retry_amplification WHERE run_id = {r:String}",
        {"r": run_id},
    )
    assert history == [(runs[8][0].trace_id,)]


def _frame(runs: list[dict[str, Any]]) -> pl.DataFrame:
    """Workflow spans of runs given as {trace, id, start, attempts: [(hop, failed, extra_attempts)]}."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        trace, wf = run["trace"], run["trace"] * 1000
        rows.append(
            dict(
                trace_key=trace,
                span_key=wf,
                parent_key=0,
                name="invoke_workflow x",
                start_ns=run["start"],
                end_ns=run["start"] + 1000,
                failed=False,
                extra_attempts=0,
                trace_id=run["id"],
            )
        )
        for i, (hop, failed, extra) in enumerate(run["attempts"], start=1):
            begin = run["start"] + 10 * i
            rows.append(
                dict(
                    trace_key=trace,
                    span_key=wf + i,
                    parent_key=wf,
                    name=hop,
                    start_ns=begin,
                    end_ns=begin + 5,
                    failed=failed,
                    extra_attempts=extra,
                    trace_id="",
                )
            )
    return pl.DataFrame(rows).with_columns(
        pl.col("trace_key", "span_key", "parent_key").cast(pl.UInt64),
        (pl.col("trace_key") * 1000).cast(pl.UInt64).alias("wf_span_key"),
        pl.lit(0).alias("tokens"),
        pl.lit(0).alias("resend"),
        pl.lit("x").alias("workflow"),
    )


def test_exemplar_counts_the_sdk_attempts_inside_a_call() -> None:
    # Run 1: the agent called hop "a" again after a failure (1 retry). Run 2: one call whose SDK made
    # 3 HTTP attempts (2 retries inside the call), though it started first.
    runs = [
        {"trace": 1, "id": "t1", "start": 5000, "attempts": [("a", True, 0), ("a", False, 0)]},
        {"trace": 2, "id": "t2", "start": 0, "attempts": [("a", False, 2)]},
        {"trace": 3, "id": "t3", "start": 9000, "attempts": [("a", False, 0)]},
    ]
    _, amp = retry_metrics(_frame(runs))
    assert amp["exemplar_trace_id"].to_list() == ["t2"]
    # Without ids (a frame without the column, as older callers build it) there is no exemplar.
    _, amp = retry_metrics(_frame(runs).drop("trace_id"))
    assert amp["exemplar_trace_id"].to_list() == [""]
