"""Model-call frames for the LLM view, computed by analytics from call rows with a known truth.

Two models: ``openai / gpt-4o`` streamed (its first token recorded on every call) and an Anthropic
model never streamed (its first token and time per token estimated from durations). The sample's
llm regression is gpt-4o's: either the provider's first token slowed at the same prompt length
(``provider_first_token``) or our prompts tripled (``longer_prompts``). ``llm_anatomy`` and the
attribution's cause columns come from ``analytics.llm_anatomy`` itself, so the view is tested on
the frames the analysis makes, not on hand-typed figures.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal

import numpy as np
import polars as pl

from analytics import Analysis
from analytics.conventions import Price
from analytics.llm_anatomy import (
    anatomy_buckets,
    anatomy_totals,
    llm_anatomy,
    llm_anatomy_series,
    with_llm_causes,
)

_MS = 1_000_000
_S = 1_000_000_000
PRICES = (Price("openai", "gpt-4o", input=2.5, output=10.0, cached_input=1.25),)
Cause = Literal["provider_first_token", "longer_prompts"]


def _calls(
    n: int,
    window: str,
    provider: str,
    model: str,
    ttft_ms: float,
    per_token_ms: float,
    input_tokens: float,
    output_tokens: float,
    cached_share: float,
    streamed: bool,
    seed: int,
    span: tuple[datetime, datetime],
) -> pl.DataFrame:
    """Logical call rows as analytics reads them (one per call, all on hot requests' paths)."""
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(np.log(ttft_ms), 0.25, n)
    out = np.maximum(1, rng.lognormal(np.log(output_tokens), 0.5, n)).astype(np.int64)
    inp = np.maximum(1, rng.lognormal(np.log(input_tokens), 0.2, n)).astype(np.int64)
    duration = ((ttft + out * per_token_ms * rng.uniform(0.9, 1.1, n)) * _MS).astype(np.int64)
    first = int(span[0].timestamp()) * _S
    starts = first + np.sort(rng.integers(0, int((span[1] - span[0]).total_seconds()) * _S, n))
    return pl.DataFrame(
        {
            "window": [window] * n,
            "provider": [provider] * n,
            "model": [model] * n,
            "sync": [True] * n,
            "start_ns": starts,
            "end_ns": starts + duration,
            "ttft_ns": [int(t * _MS) if streamed else None for t in ttft],
            "input_tokens": inp,
            "output_tokens": out,
            "cached_tokens": (inp * cached_share).astype(np.int64),
            "cached_calls": [1] * n,  # every call reports its cached input tokens (0 included)
            "streamed_calls": [int(streamed)] * n,
            "backoff_ns": [0] * n,
            "throttled_attempts": [0] * n,
            "attempts": [1] * n,
        },
        schema_overrides={"ttft_ns": pl.Int64},
    )


def call_rows(analysis: Analysis, other_model: str, cause: Cause = "provider_first_token") -> pl.DataFrame:
    """gpt-4o: first token 400 ms → 1.6 s, 20 ms per output token, half its input cached; its
    prompts 1,000 tokens, or 3,000 now when ``cause`` is ``longer_prompts``. The other model: 600 ms
    fixed and 12 ms per token in both windows, never streamed, nothing cached."""
    prompts_now = 3000.0 if cause == "longer_prompts" else 1000.0
    then = (analysis.baseline_start, analysis.baseline_end)
    now = (analysis.start, analysis.end)
    parts = [
        _calls(600, "baseline", "openai", "gpt-4o", 400.0, 20.0, 1000.0, 200.0, 0.5, True, 1, then),
        _calls(600, "current", "openai", "gpt-4o", 1600.0, 20.0, prompts_now, 200.0, 0.5, True, 2, now),
        _calls(400, "baseline", "anthropic", other_model, 600.0, 12.0, 800.0, 300.0, 0.0, False, 3, then),
        _calls(500, "current", "anthropic", other_model, 600.0, 12.0, 800.0, 300.0, 0.0, False, 4, now),
    ]
    return pl.concat(parts)


def anatomy_of(analysis: Analysis, rows: pl.DataFrame, prices: tuple[Price, ...] = PRICES) -> pl.DataFrame:
    """``llm_anatomy`` of the call rows over the analysis' two windows."""
    day = timedelta(days=1)
    days = ((analysis.end - analysis.start) / day, (analysis.baseline_end - analysis.baseline_start) / day)
    return llm_anatomy(
        anatomy_totals(rows), anatomy_buckets(rows, ["window", "provider", "model"]), prices, days
    )


def series_of(rows: pl.DataFrame, every: timedelta = timedelta(minutes=10)) -> pl.DataFrame:
    """``llm_anatomy_series`` of the current window's calls, per ``every``."""
    every_ns = int(every.total_seconds()) * _S
    current = rows.filter(pl.col("window") == "current").with_columns(
        ((pl.col("start_ns") // every_ns) * every_ns).alias("bucket_ns")
    )
    return llm_anatomy_series(anatomy_buckets(current, ["bucket_ns", "provider", "model"]))


def with_sample_llm(
    analysis: Analysis,
    other_model: str,
    cause: Cause = "provider_first_token",
    prices: tuple[Price, ...] = PRICES,
) -> Analysis:
    """The analysis with the two models' ``llm_anatomy`` and ``llm_anatomy_series``, and its
    attribution's llm cause columns as ``analytics.llm_anatomy.with_llm_causes`` sets them (the
    sample's llm verdict is gpt-4o's)."""
    rows = call_rows(analysis, other_model, cause)
    anatomy = anatomy_of(analysis, rows, prices)
    attribution = with_llm_causes(analysis.attribution, analysis.attribution_spans, anatomy)
    return replace(analysis, llm_anatomy=anatomy, llm_anatomy_series=series_of(rows), attribution=attribution)
