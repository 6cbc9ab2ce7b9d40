"""The sentences on-call reads first, from analysis frames with a known answer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import polars as pl

from slo_rules.annotate import attribution_annotations, fmt_ms


def _analysis(verdict: str, signals: dict[str, float]) -> SimpleNamespace:
    return SimpleNamespace(
        attribution=pl.DataFrame(
            {
                "service": ["chat-api"],
                "operation": ["POST /chat"],
                "baseline_p99_ms": [1200.0],
                "current_p99_ms": [3400.0],
                "delta_ms": [2200.0],
                "llm_share": [0.87 if verdict == "llm" else 0.1],
                "internal_share": [0.13 if verdict == "llm" else 0.9],
                "verdict": [verdict],
                "llm_delta_ms": [1914.0 if verdict == "llm" else 220.0],
                "internal_delta_ms": [286.0 if verdict == "llm" else 1980.0],
                "exemplar_trace_ids": [["a" * 32, "b" * 32]],
            }
        ),
        attribution_spans=pl.DataFrame(
            {
                "service": ["chat-api"] * 3,
                "operation": ["POST /chat"] * 3,
                "span_name": ["chat gpt-4o", "rerank", "auth"],
                "class": ["llm", "internal", "internal"],
                "provider": ["openai", "", ""],
                "model": ["gpt-4o", "", ""],
                "delta_ms": [1914.0, 250.0, -10.0] if verdict == "llm" else [220.0, 1980.0, 5.0],
            }
        ),
        llm_signals=pl.DataFrame(
            {
                "service": ["chat-api"],
                "operation": ["POST /chat"],
                "provider": ["openai"],
                "model": ["gpt-4o"],
                **{k: [v] for k, v in signals.items()},
            }
        ),
    )


QUIET = {
    "error_rate_baseline": 0.001,
    "error_rate_current": 0.002,
    "throttle_rate_baseline": 0.0,
    "throttle_rate_current": 0.0,
    "retry_rate_baseline": 0.01,
    "retry_rate_current": 0.012,
    "cold_share_baseline": 0.05,
    "cold_share_current": 0.06,
    "failed_attempt_rate_baseline": 0.004,
    "failed_attempt_rate_current": 0.005,
}


def test_llm_cause_sentence() -> None:
    notes = attribution_annotations(_analysis("llm", QUIET), "chat-api", "POST /chat")
    assert notes["summary_tail"] == (
        "p99 of POST /chat 1.2 s → 3.4 s; 87% of the increase is in LLM spans (openai gpt-4o), "
        "internal +286 ms"
    )
    assert notes["cause"] == "llm" and notes["llm_share"] == "0.87" and notes["internal_share"] == "0.13"
    assert notes["top_spans"] == (
        "chat gpt-4o (llm, openai gpt-4o) +1.9 s; rerank (internal) +250 ms; auth (internal) −10 ms"
    )
    assert notes["exemplar_trace_ids"] == "a" * 32 + "," + "b" * 32
    assert notes["llm_error_rate"] == "0.001 → 0.002" and notes["llm_cold_share"] == "0.05 → 0.06"


def test_noisy_neighbour_and_throttling_show_in_the_first_line() -> None:
    crowded = {**QUIET, "throttle_rate_current": 0.12, "cold_share_current": 0.55}
    notes = attribution_annotations(_analysis("llm", crowded), "chat-api", "POST /chat")
    assert notes["summary_tail"].endswith("; openai gpt-4o: 429s 0.0% → 12.0%, cold-path share 5% → 55%")
    assert notes["llm_signals"] == (
        "openai gpt-4o: failed calls 0.1%→0.2%, failed attempts 0.4%→0.5%, 429s 0.0%→12.0%, "
        "retries 1.0%→1.2%, cold-path share 5%→55%"
    )


def test_internal_cause_sentence() -> None:
    notes = attribution_annotations(_analysis("internal", QUIET), "chat-api", "POST /chat")
    assert notes["summary_tail"] == (
        "p99 of POST /chat 1.2 s → 3.4 s; 90% of the increase is in internal spans (rerank, auth), "
        "LLM +220 ms"
    )
    assert notes["cause"] == "internal"


def test_no_row_no_annotations() -> None:
    assert attribution_annotations(_analysis("llm", QUIET), "chat-api", "GET /other") == {}


def test_durations_for_people() -> None:
    assert [fmt_ms(v) for v in (850.0, 1234.0, 180_000.0, 750_000.0, None)] == [
        "850 ms",
        "1.2 s",
        "180 s",
        "12.5 min",
        "n/a",
    ]


def test_an_llm_alert_says_which_part_of_the_call_moved_and_whose_change_it_was() -> None:
    from analytics.llm_anatomy import anatomy_buckets, anatomy_totals, llm_anatomy, with_llm_causes
    from tests.analytics.test_llm_anatomy import calls

    # The release tripled the prompt: first tokens slower at three times the prompt length.
    rows = pl.concat(
        [calls(1500, window="baseline", seed=1), calls(1500, seed=2, ttft_ms=1600.0, input_tokens=3000.0)]
    )
    anatomy = llm_anatomy(anatomy_totals(rows), anatomy_buckets(rows, ["window", "provider", "model"]))
    analysis = _analysis("llm", QUIET)
    analysis.attribution = with_llm_causes(
        analysis.attribution.with_columns(
            pl.lit(1500).alias("baseline_requests"), pl.lit(1500).alias("current_requests")
        ),
        analysis.attribution_spans,
        anatomy,
    )
    notes = attribution_annotations(analysis, "chat-api", "POST /chat")
    assert notes["llm_cause"] == "longer_prompts" and notes["llm_cause_owner"] == "ours"
    assert "our change" in notes["summary_tail"] and "prompts" in notes["summary_tail"]
    assert (
        notes["summary_tail"].endswith(notes["llm_cause_text"])
        or notes["llm_cause_text"] in notes["summary_tail"]
    )
    parts = json.loads(notes["llm_breakdown_ms"])
    assert set(parts) == {"first_token", "generation", "backoff", "more_calls"}
    assert parts["first_token"] > 0.8 * 1914.0
