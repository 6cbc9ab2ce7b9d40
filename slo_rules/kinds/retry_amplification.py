"""``retry_amplification``: attempts or tokens per logical call of a workflow above a limit.

The summary leads with what the runs paid (observed attempt and token amplification) and gives the
compounding model (per-hop retry rates multiplied) as the worst case it is. The alert says whose
retries they are (``cause``: the model provider's failed calls, ``llm``; the workflow's own steps,
``internal``; ``mixed``; :func:`slo_rules.annotate.retry_annotations`), carries the provider's 429,
error, retry and backoff figures for the models behind the retried hops, and names, when the
analytics found one, the trace of the workflow's most retried run (``exemplar_trace_ids``, as the
hot-path kinds name their slow traces).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import polars as pl

from slo_rules.annotate import retry_annotations
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import RetryAmplificationRule
from storage import format_duration

__all__ = ["candidates"]

log = logging.getLogger("tailwatch.slo_rules")

# The most retried run's trace ('' when none was retried); absent from analyses that predate it.
EXEMPLAR_COLUMN = "exemplar_trace_id"


def candidates(rule: RetryAmplificationRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    hops = analysis.retry_hops
    llm_calls = getattr(analysis, "llm_calls", None)  # absent from analyses that predate it
    out: list[Candidate] = []
    for row in analysis.retry_amplification.iter_rows(named=True):
        workflow = str(row["workflow"])
        if not rule.selects(workflow):
            continue
        labels = alert_labels(rule, rule.severity, workflow=workflow)

        def annotate(row: dict[str, Any] = row, workflow: str = workflow) -> dict[str, str]:
            explained = retry_annotations(
                workflow, hops, llm_calls, lambda: _previous_llm_calls(ctx, start, end)
            )
            extra = {
                "attempt_amplification": f"{float(row.get('attempt_amplification') or 1):.4f}",
                "token_amplification": f"{float(row.get('token_amplification') or 1):.4f}",
                "modeled_amplification": f"{float(row.get('modeled_amplification') or 1):.4f}",
                "runs": str(row.get("runs")),
                "dashboard": ctx.dashboard("retries"),
            }
            exemplar = str(row.get(EXEMPLAR_COLUMN) or "")
            if exemplar:
                extra["exemplar_trace_ids"] = exemplar
                extra.update(ctx.trace_links(exemplar, start, end))
            return finish(extra, _head(rule, row, workflow), explained, rule)

        runs = int(row.get("runs") or 0)
        skipped = runs < rule.min_runs
        reason = (
            f"{runs} runs < {rule.min_runs}"
            if skipped
            else f"{float(row.get('attempt_amplification') or 1):.3f}× attempts, "
            f"{float(row.get('token_amplification') or 1):.3f}× tokens over {runs} runs "
            f"(limits {rule.max_attempt_amplification}×, {rule.max_token_amplification}×)"
        )
        out.append(Candidate(rule, labels, _breached(rule, row), annotate, reason=reason, skipped=skipped))
    if not out:
        ctx.note(rule, f"no run of a selected workflow in the last {format_duration(rule.window)}")
    return out


def _head(rule: RetryAmplificationRule, row: dict[str, Any], workflow: str) -> str:
    """What the runs paid, then what the compounding model projects:
    ``workflow claims: observed 1.287× attempts (limit 1.1×) and 1.110× tokens over 200 runs; per-hop
    retry rates would compound to 3.233× if every retry replayed the work behind it (worst case)``."""
    attempts = float(row.get("attempt_amplification") or 1.0)
    observed = [f"{attempts:.3f}× attempts{_limit(attempts, rule.max_attempt_amplification)}"]
    if row.get("token_amplification") is not None:
        tokens = float(row["token_amplification"])
        observed.append(f"{tokens:.3f}× tokens{_limit(tokens, rule.max_token_amplification)}")
    modeled = float(row.get("modeled_amplification") or 1.0)
    return (
        f"workflow {workflow}: observed {' and '.join(observed)} over {row.get('runs')} runs; "
        f"per-hop retry rates would compound to {modeled:.3f}× if every retry replayed the work "
        "behind it (worst case)"
    )


def _limit(value: float, limit: float | None) -> str:
    return f" (limit {limit:g}×)" if limit is not None and value > limit else ""


def _breached(rule: RetryAmplificationRule, row: dict[str, Any]) -> bool:
    if int(row.get("runs") or 0) < rule.min_runs:
        return False
    attempt_amp = float(row.get("attempt_amplification") or 1.0)
    token_amp = float(row.get("token_amplification") or 1.0)
    return (rule.max_attempt_amplification is not None and attempt_amp > rule.max_attempt_amplification) or (
        rule.max_token_amplification is not None and token_amp > rule.max_token_amplification
    )


def _previous_llm_calls(ctx: Context, start: datetime, end: datetime) -> pl.DataFrame | None:
    """The per-model call summary of the window of equal length before ``start``: the baselines of
    the provider signal. Analysed only for a firing alert whose retried hops reached a model (the
    source keeps it for the rest of the evaluation); a failure leaves the current values alone."""
    try:
        return getattr(ctx.source.analysis(start - (end - start), start), "llm_calls", None)
    except Exception as exc:
        log.warning("the provider baseline before %s could not be analysed: %s", start.isoformat(), exc)
        return None
