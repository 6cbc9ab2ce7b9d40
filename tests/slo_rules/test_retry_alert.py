"""The retry amplification alert: whose retries they are, the provider's signal, and which
amplification the workflow paid."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from analytics.llm_calls import LLM_CALLS_SCHEMA
from collectors import insert_spans
from slo_rules import evaluate
from slo_rules.annotate import retry_annotations
from slo_rules.engine import evaluate_with
from slo_rules.rules import rules_from_text
from storage import Store
from tests.analytics import builders as b

T = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)

RULES = rules_from_text(
    """
rules:
  - name: retries
    kind: retry_amplification
    workflow: claims-*
    window: 1h
    max_attempt_amplification: 1.1
"""
)


def _llm_calls(*rows: dict[str, Any]) -> pl.DataFrame:
    """``llm_calls`` rows from counts, the rates derived as the analytics derive them: errors are
    calls failed after their retries, per call; failed (not 429) and 429 attempts per attempt."""
    full = []
    for r in rows:
        calls, attempts = r["calls"], r["attempts"]
        failed, throttled = r.get("failed_attempts", 0), r.get("throttled_attempts", 0)
        failed_calls = r.get("failed_calls", 0)
        full.append(
            {
                "sync_calls": 0,
                "cold_calls": calls,
                "tokens": 1000 * calls,
                "backoff_ms": 0.0,
                "cold_share": 1.0,
                **r,
                "failed_attempts": failed,
                "throttled_attempts": throttled,
                "failed_calls": failed_calls,
                "error_rate": failed_calls / calls,
                "failed_attempt_rate": max(failed - throttled, 0) / attempts,
                "throttle_rate": throttled / attempts,
                "retry_rate": (attempts - calls) / calls,
            }
        )
    return pl.DataFrame(full, schema=LLM_CALLS_SCHEMA)


def _hops(*rows: tuple[str, int, int, int]) -> pl.DataFrame:
    """``retry_hops`` of claims-triage from (hop, calls, attempts, tokens)."""
    return pl.DataFrame(
        [
            {
                "workflow": "claims-triage",
                "hop": hop,
                "hop_index": i,
                "calls": calls,
                "attempts": attempts,
                "retry_rate": (attempts - calls) / calls,
                "tokens": tokens,
            }
            for i, (hop, calls, attempts, tokens) in enumerate(rows, 1)
        ]
    )


AMPLIFICATION = pl.DataFrame(
    {
        "workflow": ["claims-triage"],
        "runs": [200],
        "attempt_amplification": [1.287],
        "token_amplification": [1.11],
        "modeled_amplification": [3.233],
        "exemplar_trace_id": ["c" * 32],
    }
)

# The same window an hour earlier: the provider barely throttled.
CALM = _llm_calls(
    {"provider": "openai", "model": "gpt-4o", "calls": 500, "attempts": 505, "failed_attempts": 5,
     "throttled_attempts": 2, "backoff_ms": 3000.0},
)  # fmt: skip
THROTTLED = _llm_calls(
    {"provider": "openai", "model": "gpt-4o", "calls": 500, "attempts": 900, "failed_attempts": 400,
     "throttled_attempts": 360, "failed_calls": 20, "backoff_ms": 310_000.0},
    {"provider": "anthropic", "model": "claude-sonnet-4", "calls": 100, "attempts": 100},
)  # fmt: skip
HEALTHY = _llm_calls({"provider": "openai", "model": "gpt-4o", "calls": 500, "attempts": 500})


@dataclass
class WindowedSource:
    """The given frames for the evaluated window; ``previous`` (or an error) for the hour before."""

    frames: dict[str, pl.DataFrame]
    previous: dict[str, pl.DataFrame] | None = None
    reads: list[datetime] = field(default_factory=list)

    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        self.reads.append(start)
        if end < T:
            if self.previous is None:
                raise RuntimeError("no spans before the window")
            return SimpleNamespace(**self.previous)
        return SimpleNamespace(**self.frames)

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        return pl.DataFrame(schema={"service": pl.String, "operation": pl.String, "good": pl.Int64})


def _fire(store: Store, source: WindowedSource, at: datetime = T) -> dict[str, str]:
    result = evaluate_with(store, RULES, at, source)
    assert result.errors == []
    (alert,) = result.fired
    assert alert.labels == {"alertname": "retries", "severity": "ticket", "workflow": "claims-triage"}
    return alert.annotations


def test_a_throttled_provider_is_the_cause_with_its_429s(store: Store) -> None:
    hops = _hops(("chat gpt-4o", 200, 380, 400_000), ("lookup", 200, 204, 0))
    source = WindowedSource(
        {"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": THROTTLED},
        previous={"llm_calls": CALM},
    )
    notes = _fire(store, source)
    assert notes["cause"] == "llm"
    assert notes["llm_retry_share"] == "0.978"  # 180 of 184 retries follow the provider's failures
    assert notes["llm_model"] == "openai gpt-4o"
    assert notes["llm_429_rate"] == "0.004 → 0.4"
    # 20 of 500 calls failed after their retries; 5 − 2 of 505 and 400 − 360 of 900 attempts failed
    # other than with a 429.
    assert notes["llm_error_rate"] == "0 → 0.04"
    assert notes["llm_failed_attempt_rate"] == "0.0059 → 0.0444"
    assert notes["llm_retry_rate"] == "0.01 → 0.8"
    assert notes["llm_backoff_s"] == "3 → 310"
    # The hop's name names its model: the other provider of the window is not blamed.
    assert notes["llm_signals"] == (
        "openai gpt-4o: 429s 0.4%→40.0%, failed attempts 0.6%→4.4%, failed calls 0.0%→4.0%, "
        "retries 1.0%→80.0%, backoff 3.0 s→310 s"
    )
    assert notes["retried_hops"] == "chat gpt-4o 90.0% (llm), lookup 2.0% (internal)"
    assert (
        "; cause llm: 98% of the retries follow failed model calls "
        "(openai gpt-4o: 429s 0.4%→40.0%, failed attempts 0.6%→4.4%, failed calls 0.0%→4.0%, "
        "backoff 3.0 s→310 s); "
        "retries by hop: chat gpt-4o 90.0% (llm), lookup 2.0% (internal)"
    ) in notes["summary"]
    assert notes["exemplar_trace_ids"] == "c" * 32


def test_retries_of_the_workflows_own_steps_are_internal(store: Store) -> None:
    # ``search`` is a tool that calls the model (it spent tokens), but no model call failed.
    hops = _hops(("classify", 200, 200, 300_000), ("search", 200, 260, 500_000), ("validate", 200, 230, 0))
    source = WindowedSource(
        {"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": HEALTHY},
        previous={"llm_calls": HEALTHY},
    )
    notes = _fire(store, source)
    assert notes["cause"] == "internal"
    assert notes["llm_retry_share"] == "0"
    assert notes["llm_429_rate"] == "0 → 0"
    assert notes["retried_hops"] == "search 30.0% (internal), validate 15.0% (internal)"
    assert (
        "cause internal: the retries are the workflow's own steps (search, validate), not the provider "
        "(openai gpt-4o: 429s 0.0%→0.0%, failed attempts 0.0%→0.0%, failed calls 0.0%→0.0%, "
        "backoff 0 ms→0 ms)"
    ) in notes["summary"]


def test_a_tool_without_model_calls_is_internal_whatever_the_provider_does(store: Store) -> None:
    hops = _hops(("classify", 200, 200, 300_000), ("validate", 200, 260, 0))
    source = WindowedSource(
        {"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": THROTTLED}
    )
    notes = _fire(store, source)
    assert notes["cause"] == "internal"
    assert "llm_model" not in notes  # no retried hop reached a model
    assert source.reads == [T - timedelta(hours=1)]  # nor was the window before analysed


@pytest.mark.parametrize(
    ("provider_failures", "cause", "share"),
    [
        (400, "mixed", "0.5"),  # the model hop's 60 retries all follow failures; validate's 60 do not
        (12, "internal", "0.1"),  # the provider failed 12 times: it explains 12 of the 120 retries
    ],
)
def test_both_sources_or_too_few_provider_failures(
    store: Store, provider_failures: int, cause: str, share: str
) -> None:
    hops = _hops(("classify", 200, 260, 300_000), ("validate", 200, 260, 0))
    calls = _llm_calls(
        {"provider": "openai", "model": "gpt-4o", "calls": 500, "attempts": 600,
         "failed_attempts": provider_failures, "throttled_attempts": provider_failures // 2},
    )  # fmt: skip
    source = WindowedSource({"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": calls})
    notes = _fire(store, source)
    assert (notes["cause"], notes["llm_retry_share"]) == (cause, share)
    # Without the window before, the current values alone.
    assert notes["llm_429_rate"] == f"{provider_failures // 2 / 600:.4f}".rstrip("0")
    if cause == "mixed":
        assert (
            "cause mixed: 50% of the retries follow failed model calls (openai gpt-4o: 429s"
            in notes["summary"]
        )
        assert "50% are the workflow's own steps (validate)" in notes["summary"]


def test_the_summary_reads_the_observed_amplification_as_the_fact(store: Store) -> None:
    hops = _hops(("chat gpt-4o", 200, 380, 400_000))
    source = WindowedSource(
        {"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": THROTTLED}
    )
    notes = _fire(store, source)
    assert notes["summary"].startswith(
        "workflow claims-triage: observed 1.287× attempts (limit 1.1×) and 1.110× tokens over 200 runs; "
        "per-hop retry rates would compound to 3.233× if every retry replayed the work behind it "
        "(worst case); cause llm"
    )
    assert (notes["attempt_amplification"], notes["modeled_amplification"]) == ("1.2870", "3.2330")


def test_a_firing_alert_keeps_the_cause_and_text_it_fired_with(store: Store) -> None:
    # The provider recovers while the retries go on: the alert on-call was paged with is not
    # rewritten (same identity, same cause and summary); it stays one alert, not two.
    hops = _hops(("chat gpt-4o", 200, 380, 400_000))
    frames = {"retry_amplification": AMPLIFICATION, "retry_hops": hops, "llm_calls": THROTTLED}
    first = evaluate_with(store, RULES, T, WindowedSource(frames))
    (llm,) = first.fired
    frames["llm_calls"] = HEALTHY
    later = evaluate_with(store, RULES, T + timedelta(minutes=1), WindowedSource(frames))
    assert later.fired == [] and later.resolved == []
    (still,) = later.firing
    assert still.fingerprint == llm.fingerprint and still.labels == llm.labels
    assert still.cause == llm.cause == "llm" and still.annotations == llm.annotations


def test_hops_that_say_nothing_about_models_leave_the_cause_open() -> None:
    # An analysis without the hops' counts and tokens, and without llm_calls.
    hops = pl.DataFrame({"workflow": ["claims-triage"], "hop": ["extract"], "retry_rate": [0.05]})
    notes = retry_annotations("claims-triage", hops, None)
    assert notes["cause"] == "none" and "llm_retry_share" not in notes
    assert notes["summary_tail"] == "retries by hop: extract 5.0%"


# Through the real analytics.

RULES_E2E = rules_from_text(
    """
rules:
  - name: retries
    kind: retry_amplification
    workflow: claims-*
    window: 1h
    max_attempt_amplification: 1.03
"""
)


def test_model_calls_that_time_out_are_the_providers(store: Store) -> None:
    # Every hop a chat call; 5% of each hop's calls time out once and are retried.
    rt = b.scenario_retries()
    insert_spans(store, rt.spans)
    (storm,) = evaluate(store, RULES_E2E, rt.end).fired
    notes = storm.annotations
    assert storm.labels == {"alertname": "retries", "severity": "ticket", "workflow": "claims-triage"}
    assert notes["cause"] == "llm" and notes["llm_retry_share"] == "1"
    assert notes["llm_model"] == "openai gpt-4o"
    # 30 failed of 630 attempts, each retried to success: no call failed; no 429; nothing called the
    # model the hour before.
    assert (notes["llm_error_rate"], notes["llm_429_rate"]) == ("0", "0")
    assert notes["llm_failed_attempt_rate"] == "0.0476"
    assert "observed 1.050× attempts (limit 1.03×) and 1.050× tokens over 200 runs" in notes["summary"]
    assert "would compound to 1.158×" in notes["summary"]
    assert (
        "cause llm: 100% of the retries follow failed model calls (openai gpt-4o: 429s 0.0%"
        in notes["summary"]
    )


def test_a_retried_tool_is_the_workflows_own(store: Store) -> None:
    # ``search`` is a tool wrapping a chat call; every fifth run's search fails once and is run again.
    spans = []
    for i in range(200):
        retries = {"search": 1} if i % 5 == 0 else {}
        spans += b.workflow_run(
            "claims-triage", b.at(i * 10.0), ("classify", "search", "decide"), retries, tool_hops=("search",)
        )
    insert_spans(store, spans)
    (storm,) = evaluate(store, RULES_E2E, b.dt(b.at(3600))).fired
    notes = storm.annotations
    assert notes["cause"] == "internal" and notes["llm_retry_share"] == "0"
    assert notes["retried_hops"] == "search 20.0% (internal)"
    assert notes["llm_error_rate"] == "0"  # the model answered every call
    assert (
        "cause internal: the retries are the workflow's own steps (search), not the provider"
        in notes["summary"]
    )
