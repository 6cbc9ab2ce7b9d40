"""The model call's anatomy from call rows with a known truth: percentiles from the histograms, the
fixed/per-token estimate and its stated error, mergeability per minute, costs, and each cause."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
import pytest

from analytics.conventions import Conventions, ConventionsError, Price
from analytics.llm_anatomy import (
    anatomy_buckets,
    anatomy_totals,
    call_cost,
    fixed_and_per_token,
    llm_anatomy,
    llm_cause,
    with_llm_causes,
)

_MS = 1_000_000
T0 = 1_780_000_000 * 1_000_000_000


def calls(
    n: int,
    *,
    window: str = "current",
    ttft_ms: float = 400.0,
    per_token_ms: float = 20.0,
    input_tokens: float = 1000.0,
    output_tokens: float = 200.0,
    cached_share: float = 0.0,
    streamed: bool = True,
    backoff_ms: float = 0.0,
    model: str = "gpt-4o",
    seed: int = 1,
    start_ns: int = T0,
) -> pl.DataFrame:
    """Logical call rows: TTFT lognormal around ``ttft_ms``, generation ``per_token_ms`` per output
    token (±10%), token counts lognormal around theirs. Non-streamed calls carry no first token."""
    rng = np.random.default_rng(seed)
    ttft = rng.lognormal(np.log(ttft_ms), 0.3, n)
    out = np.maximum(1, rng.lognormal(np.log(output_tokens), 0.5, n)).astype(np.int64)
    inp = np.maximum(1, rng.lognormal(np.log(input_tokens), 0.3, n)).astype(np.int64)
    gen = out * per_token_ms * rng.uniform(0.9, 1.1, n)
    starts = start_ns + np.sort(rng.integers(0, 3600 * 1_000_000_000, n))
    duration = ((ttft + gen + backoff_ms) * _MS).astype(np.int64)
    return pl.DataFrame(
        {
            "window": [window] * n,
            "provider": ["openai"] * n,
            "model": [model] * n,
            "sync": [True] * n,
            "start_ns": starts,
            "end_ns": starts + duration,
            # Timed from the call's start: after the backoff of the attempts before the answer.
            "ttft_ns": [int((t + backoff_ms) * _MS) if streamed else None for t in ttft],
            "input_tokens": inp,
            "output_tokens": out,
            "cached_tokens": (inp * cached_share).astype(np.int64),
            "streamed_calls": [int(streamed)] * n,
            # Calls whose spans report their cached input tokens: those of a model that caches.
            "cached_calls": [int(cached_share > 0)] * n,
            "backoff_ns": [int(backoff_ms * _MS)] * n,
            "throttled_attempts": [0] * n,
            "attempts": [1] * n,
        },
        schema_overrides={"ttft_ns": pl.Int64},
    )


def anatomy_of(rows: pl.DataFrame, prices: tuple[Price, ...] = ()) -> dict[str, Any]:
    frame = llm_anatomy(
        anatomy_totals(rows), anatomy_buckets(rows, ["window", "provider", "model"]), prices, (1 / 24, 1 / 24)
    )
    assert frame.height == 1
    return frame.row(0, named=True)


def test_percentiles_from_the_histograms_are_within_half_a_percent_of_the_exact_ones() -> None:
    rows = pl.concat([calls(3000, seed=2), calls(3000, window="baseline", ttft_ms=300, seed=3)])
    row = anatomy_of(rows)
    current = rows.filter(pl.col("window") == "current")
    exact_ttft = current["ttft_ns"].to_numpy() / 1e6
    tpot = (
        (current["end_ns"] - current["start_ns"] - current["ttft_ns"]).to_numpy()
        / 1e6
        / current["output_tokens"].to_numpy()
    )
    for got, want in (
        (row["ttft_p50_ms"], np.quantile(exact_ttft, 0.5)),
        (row["ttft_p99_ms"], np.quantile(exact_ttft, 0.99)),
        (row["ms_per_output_token_p50"], np.quantile(tpot, 0.5)),
        (row["input_tokens_p50"], np.quantile(current["input_tokens"].to_numpy(), 0.5)),
        (row["output_tokens_p50"], np.quantile(current["output_tokens"].to_numpy(), 0.5)),
    ):
        assert got == pytest.approx(want, rel=0.005)
    assert row["ttft_source"] == row["baseline_ttft_source"] == "attribute"
    assert row["calls"] == row["streamed_calls"] == 3000
    assert row["baseline_ttft_p50_ms"] < row["ttft_p50_ms"]


def test_per_minute_histograms_merge_into_the_window_s() -> None:
    rows = calls(2000, seed=4)
    window = anatomy_buckets(rows, ["window", "provider", "model"])
    minute = pl.col("start_ns").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m").alias("minute")
    per_minute = anatomy_buckets(rows.with_columns(minute), ["window", "minute", "provider", "model"])
    assert per_minute["minute"].n_unique() > 30
    merged = per_minute.group_by("window", "provider", "model", "measure", "key").agg(pl.col("n").sum())
    keys = ["measure", "key"]
    assert merged.sort(keys).select(*keys, "n").equals(window.sort(keys).select(*keys, "n"))


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_the_estimate_on_non_streamed_calls_recovers_both_parts(seed: int) -> None:
    """The stated error (docs/analytics.md): with a few hundred calls whose output lengths vary, the
    fixed part within 15% and the time per token within 10% of the truth, each inside its interval."""
    rows = calls(800, ttft_ms=600, per_token_ms=12, streamed=False, seed=seed)
    # A few pathological calls (a provider stall) must not move a robust fit.
    slow = calls(16, ttft_ms=20_000, per_token_ms=12, streamed=False, seed=seed + 100)
    both = pl.concat([rows, slow])
    fit = fixed_and_per_token(
        anatomy_buckets(both, ["window", "provider", "model"]).filter(pl.col("measure") == "fit")
    )
    assert fit is not None
    # The truth: the median first token of the lognormal, the per-token mean.
    assert fit.fixed_ms == pytest.approx(600, rel=0.15)
    assert fit.per_token_ms == pytest.approx(12, rel=0.10)
    assert fit.fixed_low_ms is not None and fit.fixed_high_ms is not None
    assert fit.fixed_low_ms <= fit.fixed_ms <= fit.fixed_high_ms
    row = anatomy_of(both)
    assert row["ttft_source"] == "estimated" and row["ttft_p99_ms"] is None
    assert row["ttft_p50_ms"] == pytest.approx(fit.fixed_ms)


def test_no_estimate_when_every_call_has_the_same_length() -> None:
    rows = calls(300, streamed=False, seed=8).with_columns(pl.lit(200, pl.Int64).alias("output_tokens"))
    row = anatomy_of(rows)
    assert row["ttft_source"] is None and row["ttft_p50_ms"] is None


def test_cost_is_null_without_a_price_and_bills_cached_input_at_its_price() -> None:
    rows = calls(500, cached_share=0.5, seed=9)
    assert anatomy_of(rows)["cost_per_1k_calls"] is None
    price = Price("openai", "gpt-4o", input=2.5, output=10.0, cached_input=1.25)
    row = anatomy_of(rows, (price,))
    inp, out, cached = (float(rows[c].sum()) for c in ("input_tokens", "output_tokens", "cached_tokens"))
    want = ((inp - cached) * 2.5 + cached * 1.25 + out * 10.0) / 1e6
    assert row["cost_per_1k_calls"] == pytest.approx(want / 500 * 1000)
    assert row["cost_per_day"] == pytest.approx(want * 24)
    assert row["cached_input_ratio"] == pytest.approx(cached / inp)
    assert call_cost(Price("*", "gpt-4o", input=1.0, output=1.0), 10, 0, 0) == pytest.approx(1e-5)
    other = anatomy_of(rows.with_columns(pl.lit("gpt-4.1").alias("model")), (price,))
    assert other["cost_per_1k_calls"] is None


def test_a_malformed_price_names_the_entry_and_key() -> None:
    with pytest.raises(ConventionsError, match=r"llm_prices\[1\]\.output"):
        Conventions.from_dict(
            {
                "llm_prices": [
                    {"provider": "openai", "model": "a", "input": 1, "output": 2},
                    {"provider": "openai", "model": "b", "input": 1, "output": "ten"},
                ]
            }
        )
    with pytest.raises(ConventionsError, match=r"llm_prices\[0\]: unknown key 'price'"):
        Conventions.from_dict({"llm_prices": [{"provider": "x", "model": "m", "price": 1}]})


# Each cause from call rows whose truth is that cause: (changes to the current window's calls).
CAUSES: dict[str, dict[str, Any]] = {
    "provider_first_token": {"ttft_ms": 1600.0},
    "longer_prompts": {"ttft_ms": 1600.0, "input_tokens": 3000.0},
    "provider_generation": {"per_token_ms": 45.0},
    "longer_outputs": {"output_tokens": 600.0},
    "throttling": {"backoff_ms": 5000.0},
}


@pytest.mark.parametrize(("cause", "change"), list(CAUSES.items()))
@pytest.mark.parametrize("streamed", [True, False])
def test_each_cause_is_named_from_calls_with_that_truth(
    cause: str, change: dict[str, Any], streamed: bool
) -> None:
    baseline = calls(1500, window="baseline", streamed=streamed, seed=10)
    current = calls(1500, streamed=streamed, seed=11, **change)
    row = anatomy_of(pl.concat([baseline, current]))
    reading = llm_cause(row, delta_ms=1000.0)
    assert reading is not None
    assert reading.cause == cause, reading
    assert reading.ours == (cause in ("longer_prompts", "longer_outputs"))
    assert sum(reading.breakdown_ms.values()) == pytest.approx(1000.0, abs=0.5)
    assert ("our change" in reading.text) == reading.ours


def test_more_calls_per_request_is_our_change() -> None:
    baseline = calls(1500, window="baseline", seed=12)
    current = calls(1500, seed=13)
    reading = llm_cause(anatomy_of(pl.concat([baseline, current])), 800.0, calls_per_request=(1.0, 2.0))
    assert reading is not None and reading.cause == "more_calls" and reading.ours


def test_the_attribution_rows_gain_the_cause_on_llm_verdicts_only() -> None:
    rows = pl.concat([calls(1500, window="baseline", seed=14), calls(1500, seed=15, per_token_ms=45.0)])
    anatomy = llm_anatomy(anatomy_totals(rows), anatomy_buckets(rows, ["window", "provider", "model"]))
    attribution = pl.DataFrame(
        {
            "service": ["chat", "search"],
            "operation": ["POST /chat", "GET /search"],
            "verdict": ["llm", "internal"],
            "llm_delta_ms": [900.0, 10.0],
            "baseline_requests": [1500, 800],
            "current_requests": [1500, 800],
        }
    )
    spans = pl.DataFrame(
        {
            "service": ["chat", "search"],
            "operation": ["POST /chat", "GET /search"],
            "span_name": ["chat gpt-4o", "SELECT"],
            "class": ["llm", "internal"],
            "provider": ["openai", ""],
            "model": ["gpt-4o", ""],
            "delta_ms": [900.0, 10.0],
        }
    )
    out = with_llm_causes(attribution, spans, anatomy).sort("service")
    assert out["llm_cause"].to_list() == ["provider_generation", None]
    assert out["llm_cause_model"][0] == "gpt-4o"
    assert out.row(0, named=True)["llm_generation_ms"] > 800
    assert "ms per output token" in out["llm_cause_text"][0]


def test_the_series_gives_each_bucket_its_own_percentiles() -> None:
    from datetime import timedelta

    from analytics.llm_anatomy import anatomy_every, llm_anatomy_series

    # The slowdown starts half-way through the hour: the buckets after it show it, those before not.
    early = calls(1000, seed=20)
    late = calls(1000, seed=21, ttft_ms=1600.0, start_ns=T0 + 3600 * 1_000_000_000)
    rows = pl.concat([early, late])
    every = anatomy_every(timedelta(seconds=100))
    assert every == timedelta(minutes=2)
    every_ns = int(every.total_seconds()) * 1_000_000_000
    keyed = rows.with_columns(((pl.col("start_ns") // every_ns) * every_ns).alias("bucket_ns"))
    series = llm_anatomy_series(anatomy_buckets(keyed, ["bucket_ns", "provider", "model"]))
    assert series.height == keyed["bucket_ns"].n_unique()
    for row in series.iter_rows(named=True):
        ns = int(row["bucket_start"].timestamp()) * 1_000_000_000
        part = keyed.filter(pl.col("bucket_ns") == ns)
        assert row["first_token_calls"] == part.height
        assert row["ttft_p50_ms"] == pytest.approx(
            np.quantile(part["ttft_ns"].to_numpy() / 1e6, 0.5), rel=0.005
        )
    first, last = series["ttft_p50_ms"][0], series["ttft_p50_ms"][-1]
    assert last > 3 * first
