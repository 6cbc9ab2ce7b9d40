"""The anatomy of a model call: time to first token, generation time per output token, prompt and
output length, prompt cache and cost, per provider and model, the current window beside the
baseline (Polars and numpy, pure).

A model call's latency is its time to the first token (prefill and the provider's queue) plus the
time per output token times the tokens it generated, plus what throttling and retries add. Where an
instrumentation records the first token (the GenAI convention's ``time_to_first_chunk``, a chunk
event: :class:`analytics.conventions.Conventions` ``first_token_attributes``/``_events``), both
parts are measured per call: ``ttft`` and ``(duration − ttft) / output tokens``. Where no call of a
model records it (a non-streamed call's span has no first token), they are **estimated**: a robust
line through duration against output tokens, the intercept being the fixed part (time to first
token and overhead) and the slope the time per output token. The line is Theil–Sen's (the
call-weighted median of the slopes between the per-bucket medians of output-token buckets a quarter
octave wide), its intercept the weighted median of the buckets' residuals, and its uncertainty a 95%
bootstrap interval (the buckets' medians redrawn from their duration histograms).

The mergeable state is one histogram per measure (:data:`ANATOMY_BUCKETS_SCHEMA`, long format: a row
per window or minute, provider, model, measure and bucket), with the token and call sums of
:data:`analytics.summaries.CALL_MINUTES_SCHEMA` beside it: per-minute states add up, bucket by
bucket, into any window's (:mod:`analytics.summaries` keeps them per minute). Percentiles are
within :data:`analytics.sketch.RELATIVE_ERROR` (0.5%) of the exact ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

import numpy as np
import polars as pl

from analytics._common import empty
from analytics.conventions import Price
from analytics.sketch import BucketSample, bucket_expr
from analytics.stats import percentile

__all__ = [
    "ANATOMY_BUCKETS_SCHEMA",
    "ANATOMY_TOTALS_SCHEMA",
    "LLM_ANATOMY_SCHEMA",
    "LLM_ANATOMY_SERIES_SCHEMA",
    "LLM_CAUSES",
    "LLM_CAUSE_COLUMNS",
    "LlmCause",
    "anatomy_buckets",
    "anatomy_every",
    "anatomy_totals",
    "call_cost",
    "fixed_and_per_token",
    "llm_anatomy",
    "llm_anatomy_series",
    "llm_cause",
    "price_of",
    "usd_per_token",
    "with_llm_causes",
]

LlmCause = Literal[
    "provider_first_token",
    "provider_generation",
    "longer_prompts",
    "longer_outputs",
    "throttling",
    "more_calls",
    "mixed",
]
LLM_CAUSES: tuple[str, ...] = get_args(LlmCause)
# The causes that are the team's own change (the prompt or the request grew), not the provider's.
OUR_CAUSES = frozenset({"longer_prompts", "longer_outputs", "more_calls"})

# Measures of the state: time to first token (ms), generation time per output token (ms), input
# and output tokens per call, and the fit's 2-D histogram (output-token bucket × duration bucket).
Measure = Literal["ttft", "tpot", "input", "output", "fit"]
_FIT_SHIFT = 65536  # fit key = token bucket · 65536 + (duration bucket + 32768)
_FIT_BUCKETS_PER_OCTAVE = 4

ANATOMY_BUCKETS_SCHEMA: dict[str, Any] = {
    "provider": pl.String,
    "model": pl.String,
    "measure": pl.String,
    "key": pl.Int32,
    "n": pl.Int64,
}
# The sums beside the histograms, per provider, model and path (sync: on a hot request's path).
ANATOMY_TOTALS_SCHEMA: dict[str, Any] = {
    "window": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "sync": pl.Boolean,
    "calls": pl.Int64,
    "streamed_calls": pl.Int64,
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "cached_calls": pl.Int64,  # calls that report their cached input tokens (0 included)
    "backoff_ns": pl.Int64,
    "throttled_attempts": pl.Int64,
    "attempts": pl.Int64,
}

_SIDE: dict[str, Any] = {
    "calls": pl.Int64,
    "streamed_calls": pl.Int64,
    "ttft_p50_ms": pl.Float64,
    "ttft_p99_ms": pl.Float64,
    # "attribute": measured on the calls; "estimated": the fit's intercept; null: neither.
    "ttft_source": pl.String,
    "ms_per_output_token_p50": pl.Float64,
    "input_tokens_p50": pl.Float64,
    "output_tokens_p50": pl.Float64,
    # Σ cached input tokens / Σ input tokens; null when no call reports its cached tokens
    "cached_input_ratio": pl.Float64,
    "cost_per_1k_calls": pl.Float64,  # null without a price for the model
    "cost_per_day": pl.Float64,
    "backoff_ms_per_call": pl.Float64,
    "throttle_rate": pl.Float64,
    "sync_calls": pl.Int64,
    "sync_cost": pl.Float64,  # the cost of the calls on hot requests' paths, over the window
    # The estimate's 95% bootstrap interval (estimated sources only).
    "ttft_estimate_low_ms": pl.Float64,
    "ttft_estimate_high_ms": pl.Float64,
    "per_token_estimate_low_ms": pl.Float64,
    "per_token_estimate_high_ms": pl.Float64,
}
LLM_ANATOMY_SCHEMA: dict[str, Any] = {
    "provider": pl.String,
    "model": pl.String,
    **_SIDE,
    **{f"baseline_{k}": v for k, v in _SIDE.items()},
}


def price_of(prices: Sequence[Price], provider: str, model: str) -> Price | None:
    """The first price naming the provider (or ``*``) and the model."""
    return next((p for p in prices if p.matches(provider, model)), None)


def call_cost(
    price: Price | None, input_tokens: float, output_tokens: float, cached_tokens: float
) -> float | None:
    """USD for these tokens at ``price`` (cached input tokens are part of the input tokens and
    billed at the cached price); None without a price."""
    if price is None:
        return None
    cached_price = price.input if price.cached_input is None else price.cached_input
    uncached = max(input_tokens - cached_tokens, 0.0)
    return (uncached * price.input + cached_tokens * cached_price + output_tokens * price.output) / 1e6


def usd_per_token(totals: pl.DataFrame, prices: Sequence[Price]) -> dict[str, float]:
    """Per ``provider/model`` of the current window's :func:`anatomy_totals`: the USD one of its
    tokens costs on average (its calls' cost over their input and output tokens), for figures that
    know a call's total tokens only (the what-if options). Models without a price are left out."""
    out: dict[str, float] = {}
    if totals.is_empty():
        return out
    current = (
        totals.filter(pl.col("window") == "current")
        .group_by("provider", "model")
        .agg(pl.col("input_tokens", "output_tokens", "cached_tokens").sum())
    )
    for provider, model, inputs, outputs, cached in current.iter_rows():
        cost = call_cost(price_of(prices, provider, model), inputs, outputs, cached)
        if cost is not None and inputs + outputs > 0:
            out[f"{provider}/{model}"] = cost / (inputs + outputs)
    return out


def _token_bucket(column: str) -> pl.Expr:
    """A quarter-octave bucket of a token count (the fit's x axis)."""
    value = pl.col(column).cast(pl.Float64)
    return (value.log(2) * _FIT_BUCKETS_PER_OCTAVE).floor().cast(pl.Int32)


def anatomy_buckets(calls: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Per ``keys`` (e.g. window or minute, provider, model) of logical calls (``start_ns``,
    ``end_ns``, ``ttft_ns``, ``input_tokens``, ``output_tokens`` and the keys): the histograms of
    :data:`ANATOMY_BUCKETS_SCHEMA` (plus the keys other than provider and model). Pure."""
    schema = {
        **{k: calls.schema[k] for k in keys if k not in ANATOMY_BUCKETS_SCHEMA},
        **ANATOMY_BUCKETS_SCHEMA,
    }
    if calls.is_empty():
        return empty(schema)
    duration_ms = (pl.col("end_ns") - pl.col("start_ns")) / 1e6
    ttft_ms = pl.col("ttft_ns") / 1e6
    out = pl.col("output_tokens")
    base = calls.lazy().select(
        *keys,
        duration_ms.alias("_duration"),
        ttft_ms.alias("_ttft"),
        pl.col("input_tokens"),
        out,
    )
    # (measure, the calls it counts, their bucket): each counted on its own and the small results
    # concatenated — one frame of every call per measure grouped on a string would cost seconds on
    # a raw day of millions of calls.
    measures: list[tuple[str, pl.Expr, pl.Expr]] = [
        ("ttft", pl.col("_ttft").is_not_null(), bucket_expr("_ttft").cast(pl.Int32)),
        (
            "tpot",
            pl.col("_ttft").is_not_null() & (out > 0),
            bucket_expr(((pl.col("_duration") - pl.col("_ttft")).clip(lower_bound=0.0)) / out).cast(pl.Int32),
        ),
        ("input", pl.col("input_tokens") > 0, bucket_expr("input_tokens").cast(pl.Int32)),
        ("output", out > 0, bucket_expr("output_tokens").cast(pl.Int32)),
        (
            "fit",
            out > 0,
            _token_bucket("output_tokens") * _FIT_SHIFT + bucket_expr("_duration").cast(pl.Int32) + 32768,
        ),
    ]
    parts = pl.collect_all(
        [
            base.filter(where)
            .group_by(*keys, key.alias("key"))
            .agg(pl.len().cast(pl.Int64).alias("n"))
            .with_columns(pl.lit(measure).alias("measure"))
            for measure, where, key in measures
        ]
    )
    return pl.concat([part.select(list(schema)).cast(pl.Schema(schema)) for part in parts]).sort(
        *keys, "measure", "key"
    )


def anatomy_totals(calls: pl.DataFrame) -> pl.DataFrame:
    """:data:`ANATOMY_TOTALS_SCHEMA` from logical call rows with a ``window`` (or from call totals:
    rows with a ``calls`` count are summed as they are). Pure."""
    if calls.is_empty():
        return empty(ANATOMY_TOTALS_SCHEMA)
    counted = calls if "calls" in calls.columns else calls.with_columns(pl.lit(1, pl.Int64).alias("calls"))
    sums = [c for c in ANATOMY_TOTALS_SCHEMA if c not in ("window", "provider", "model", "sync")]
    return (
        counted.with_columns(pl.col("provider", "model").cast(pl.String))
        .group_by("window", "provider", "model", "sync")
        .agg(*(pl.col(c).sum().cast(pl.Int64) for c in sums))
        .select(list(ANATOMY_TOTALS_SCHEMA))
        .cast(pl.Schema(ANATOMY_TOTALS_SCHEMA))
    )


@dataclass(frozen=True)
class Fit:
    """The fixed part and the time per output token of a model's calls (ms), with 95% intervals."""

    fixed_ms: float
    per_token_ms: float
    fixed_low_ms: float | None
    fixed_high_ms: float | None
    per_token_low_ms: float | None
    per_token_high_ms: float | None


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2.0)])


def _theil_sen(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    slope = _weighted_median((y[j] - y[i])[keep] / dx[keep], (w[i] * w[j])[keep])
    return slope, _weighted_median(y - slope * x, w)


_BOOTSTRAP = 200
_MIN_FIT_CALLS = 30


def fixed_and_per_token(fit: pl.DataFrame, seed: int = 0) -> Fit | None:
    """The robust line through duration against output tokens from one model's ``fit`` histogram
    (``key``, ``n``): None when its calls span fewer than two token buckets or number fewer than 30.
    Pure."""
    if fit.is_empty() or int(fit["n"].sum()) < _MIN_FIT_CALLS:
        return None
    keyed = fit.select(
        (pl.col("key") // _FIT_SHIFT).alias("tok"),
        (pl.col("key") % _FIT_SHIFT - 32768).alias("dur"),
        "n",
    ).sort("tok")
    groups = keyed.group_by("tok", maintain_order=True).agg("dur", "n")
    if groups.height < 2:
        return None
    # A bucket's tokens: its geometric middle.
    x = np.power(2.0, (groups["tok"].to_numpy() + 0.5) / _FIT_BUCKETS_PER_OCTAVE)
    samples = [
        BucketSample(d.to_numpy(), n.to_numpy()) for d, n in zip(groups["dur"], groups["n"], strict=True)
    ]
    w = np.array([s.size for s in samples], dtype=np.float64)
    medians = np.array([percentile(s, 0.5) or 0.0 for s in samples])
    slope, intercept = _theil_sen(x, medians, w)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(_BOOTSTRAP):
        y = np.array(
            [float(np.median(s.take(rng.integers(0, s.size, size=min(s.size, 201))))) for s in samples]
        )
        draws.append(_theil_sen(x, y, w))
    boot = np.array(draws)
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    return Fit(
        fixed_ms=max(intercept, 0.0),
        per_token_ms=max(slope, 0.0),
        fixed_low_ms=max(float(lo[1]), 0.0),
        fixed_high_ms=max(float(hi[1]), 0.0),
        per_token_low_ms=max(float(lo[0]), 0.0),
        per_token_high_ms=max(float(hi[0]), 0.0),
    )


def _quantile(hist: pl.DataFrame, q: float) -> float | None:
    if hist.is_empty():
        return None
    return percentile(BucketSample(hist["key"].to_numpy(), hist["n"].to_numpy()), q)


def _side(
    totals: pl.DataFrame, buckets: pl.DataFrame, price: Price | None, days: float, seed: int
) -> dict[str, Any]:
    """One window's anatomy of one model."""
    calls = int(totals["calls"].sum()) if totals.height else 0
    inputs = float(totals["input_tokens"].sum()) if totals.height else 0.0
    outputs = float(totals["output_tokens"].sum()) if totals.height else 0.0
    cached = float(totals["cached_tokens"].sum()) if totals.height else 0.0
    attempts = int(totals["attempts"].sum()) if totals.height else 0
    sync = totals.filter(pl.col("sync")) if totals.height else totals
    measure = {m: buckets.filter(pl.col("measure") == m) for m in ("ttft", "tpot", "input", "output", "fit")}
    row: dict[str, Any] = dict.fromkeys(_SIDE)
    row.update(
        calls=calls,
        streamed_calls=int(totals["streamed_calls"].sum()) if totals.height else 0,
        input_tokens_p50=_quantile(measure["input"], 0.5),
        output_tokens_p50=_quantile(measure["output"], 0.5),
        # Null, not 0, when no call reports its cache (openai-v2 writes no cached-token attribute).
        cached_input_ratio=cached / inputs if inputs > 0 and int(totals["cached_calls"].sum()) else None,
        backoff_ms_per_call=float(totals["backoff_ns"].sum()) / 1e6 / calls if calls else None,
        throttle_rate=float(totals["throttled_attempts"].sum()) / attempts if attempts else None,
        sync_calls=int(sync["calls"].sum()) if sync.height else 0,
    )
    if not measure["ttft"].is_empty():
        row.update(
            ttft_source="attribute",
            ttft_p50_ms=_quantile(measure["ttft"], 0.5),
            ttft_p99_ms=_quantile(measure["ttft"], 0.99),
            ms_per_output_token_p50=_quantile(measure["tpot"], 0.5),
        )
    else:
        fit = fixed_and_per_token(measure["fit"], seed)
        if fit is not None:
            row.update(
                ttft_source="estimated",
                ttft_p50_ms=fit.fixed_ms,
                ms_per_output_token_p50=fit.per_token_ms,
                ttft_estimate_low_ms=fit.fixed_low_ms,
                ttft_estimate_high_ms=fit.fixed_high_ms,
                per_token_estimate_low_ms=fit.per_token_low_ms,
                per_token_estimate_high_ms=fit.per_token_high_ms,
            )
    cost = call_cost(price, inputs, outputs, cached)
    if cost is not None and calls:
        row["cost_per_1k_calls"] = cost / calls * 1000.0
        row["cost_per_day"] = cost / days if days > 0 else None
        row["sync_cost"] = call_cost(
            price,
            float(sync["input_tokens"].sum()),
            float(sync["output_tokens"].sum()),
            float(sync["cached_tokens"].sum()),
        )
    return row


def llm_anatomy(
    totals: pl.DataFrame,
    buckets: pl.DataFrame,
    prices: Sequence[Price] = (),
    days: tuple[float, float] = (1.0, 1.0),
    seed: int = 0,
) -> pl.DataFrame:
    """Per provider and model: the current window's anatomy beside the baseline's
    (:data:`LLM_ANATOMY_SCHEMA`), from :func:`anatomy_totals` and the windows' histograms
    (:data:`ANATOMY_BUCKETS_SCHEMA` with a ``window``), the price table and each window's length in
    days (current, baseline). A model without calls in a window has null figures there. Pure."""
    if totals.is_empty():
        return empty(LLM_ANATOMY_SCHEMA)
    rows = []
    pairs = totals.select("provider", "model").unique().sort("provider", "model")
    for provider, model in pairs.iter_rows():
        price = price_of(prices, provider, model)
        mine_t = totals.filter((pl.col("provider") == provider) & (pl.col("model") == model))
        mine_b = buckets.filter((pl.col("provider") == provider) & (pl.col("model") == model))
        current = _side(
            mine_t.filter(pl.col("window") == "current"),
            mine_b.filter(pl.col("window") == "current"),
            price,
            days[0],
            seed,
        )
        baseline = _side(
            mine_t.filter(pl.col("window") == "baseline"),
            mine_b.filter(pl.col("window") == "baseline"),
            price,
            days[1],
            seed,
        )
        if not current["calls"] and not baseline["calls"]:
            continue
        rows.append(
            {
                "provider": provider,
                "model": model,
                **current,
                **{f"baseline_{k}": v for k, v in baseline.items()},
            }
        )
    if not rows:
        return empty(LLM_ANATOMY_SCHEMA)
    return pl.DataFrame(rows, schema=LLM_ANATOMY_SCHEMA)


LLM_ANATOMY_SERIES_SCHEMA: dict[str, Any] = {
    "provider": pl.String,
    "model": pl.String,
    "bucket_start": pl.Datetime("us", "UTC"),
    "first_token_calls": pl.Int64,  # calls with a recorded first token
    "ttft_p50_ms": pl.Float64,
    "ttft_p99_ms": pl.Float64,
    "ms_per_output_token_p50": pl.Float64,
    "input_tokens_p50": pl.Float64,
    "output_tokens_p50": pl.Float64,
}


def anatomy_every(every: timedelta) -> timedelta:
    """The anatomy series' bucket: the hot path's, rounded up to whole minutes (the per-minute
    state cannot be cut finer)."""
    return timedelta(minutes=max(1, math.ceil(every / timedelta(minutes=1))))


def llm_anatomy_series(buckets: pl.DataFrame) -> pl.DataFrame:
    """Per provider, model and time bucket of the current window (``bucket_ns``, from the
    histograms of :data:`ANATOMY_BUCKETS_SCHEMA`): the measured time to first token, time per output
    token and token percentiles (:data:`LLM_ANATOMY_SERIES_SCHEMA`; the estimate needs a window's
    calls, not a bucket's). Pure."""
    if buckets.is_empty():
        return empty(LLM_ANATOMY_SERIES_SCHEMA)
    rows = []
    for (provider, model, bucket), part in sorted(
        buckets.partition_by("provider", "model", "bucket_ns", as_dict=True).items(),
        key=lambda kv: (str(kv[0][0]), str(kv[0][1]), int(kv[0][2])),
    ):
        measure = {m: part.filter(pl.col("measure") == m) for m in ("ttft", "tpot", "input", "output")}
        rows.append(
            {
                "provider": provider,
                "model": model,
                "bucket_start": datetime.fromtimestamp(int(bucket) // 1_000_000_000, UTC),
                "first_token_calls": int(measure["ttft"]["n"].sum()),
                "ttft_p50_ms": _quantile(measure["ttft"], 0.5),
                "ttft_p99_ms": _quantile(measure["ttft"], 0.99),
                "ms_per_output_token_p50": _quantile(measure["tpot"], 0.5),
                "input_tokens_p50": _quantile(measure["input"], 0.5),
                "output_tokens_p50": _quantile(measure["output"], 0.5),
            }
        )
    return pl.DataFrame(rows, schema=LLM_ANATOMY_SERIES_SCHEMA)


# --- the cause inside "llm" ----------------------------------------------------------------------

# A part of the LLM delta names the cause when it holds this share of it; else "mixed".
_DOMINANCE = 0.6
# Prompts or outputs "grew" when their median rose by this factor.
_GREW = 1.25


@dataclass(frozen=True)
class CauseReading:
    """Why a model's calls held the tail longer: the cause, the parts of the delta (ms on the
    tail's critical path) and a sentence with the numbers."""

    cause: LlmCause
    breakdown_ms: dict[str, float]
    ours: bool
    text: str


def _ms(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1000:.2f} s" if abs(value) >= 1000 else f"{value:.0f} ms"


def _num(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f}"


def llm_cause(
    anatomy: dict[str, Any], delta_ms: float, calls_per_request: tuple[float, float] | None = None
) -> CauseReading | None:
    """The cause of an LLM delta of ``delta_ms`` (on the tail's critical path) from one model's
    :func:`llm_anatomy` row and the synchronous calls per hot request (baseline, current).

    The typical call is taken apart, baseline against current: first token (Δttft per call, less
    the backoff it holds), the
    generation (Δ(time per token × output tokens), split into the provider's speed and the output's
    length), the backoff between attempts, and the change in calls per request times a baseline
    call's time. The parts are scaled to the observed delta. A first-token rise with prompts grown
    by a quarter or more is the prompt's (``longer_prompts``), otherwise the provider's; a part
    holding 60% of the total names the cause, else ``mixed``. None when the row has no first-token
    figures on either side. Pure."""
    t0, t1 = anatomy.get("baseline_ttft_p50_ms"), anatomy.get("ttft_p50_ms")
    g0, g1 = anatomy.get("baseline_ms_per_output_token_p50"), anatomy.get("ms_per_output_token_p50")
    o0, o1 = anatomy.get("baseline_output_tokens_p50"), anatomy.get("output_tokens_p50")
    i0, i1 = anatomy.get("baseline_input_tokens_p50"), anatomy.get("input_tokens_p50")
    b0, b1 = anatomy.get("baseline_backoff_ms_per_call") or 0.0, anatomy.get("backoff_ms_per_call") or 0.0
    if None in (t0, t1, g0, g1, o0, o1):
        return None
    assert t0 is not None and t1 is not None and g0 is not None and g1 is not None
    assert o0 is not None and o1 is not None
    r0, r1 = calls_per_request if calls_per_request else (1.0, 1.0)
    # A call's first token is timed from its start, so it holds the backoff before the attempt that
    # answered (and so does the estimate's fixed part): the first-token part is what is left.
    call0 = t0 + g0 * o0
    parts = {
        "first_token": ((t1 - b1) - (t0 - b0)) * r1,
        "generation": (g1 * o1 - g0 * o0) * r1,
        "backoff": (b1 - b0) * r1,
        "more_calls": (r1 - r0) * call0,
    }
    speed = (g1 - g0) * o1 * r1
    length = g0 * (o1 - o0) * r1
    positive = {k: max(v, 0.0) for k, v in parts.items()}
    total = sum(positive.values())
    if total <= 0:
        return None
    breakdown = {k: round(v / total * delta_ms, 1) for k, v in positive.items()}
    top = max(positive, key=lambda k: positive[k])
    prompts_grew = i0 is not None and i1 is not None and i0 > 0 and i1 / i0 >= _GREW
    cause: LlmCause
    if positive[top] / total < _DOMINANCE:
        cause = "mixed"
    elif top == "first_token":
        cause = "longer_prompts" if prompts_grew else "provider_first_token"
    elif top == "generation":
        cause = "longer_outputs" if length > speed else "provider_generation"
    elif top == "backoff":
        cause = "throttling"
    else:
        cause = "more_calls"
    ours = cause in OUR_CAUSES
    who = "our change" if ours else ("the provider" if cause != "mixed" else "several parts")
    if cause == "longer_prompts":
        detail = f"prompts {_num(i0)} → {_num(i1)} tokens, time to first token {_ms(t0)} → {_ms(t1)}"
    elif cause == "provider_first_token":
        detail = (
            f"time to first token {_ms(t0)} → {_ms(t1)} at about the same prompt length "
            f"({_num(i0)} → {_num(i1)} tokens)"
        )
    elif cause == "provider_generation":
        detail = (
            f"generation {g0:.1f} → {g1:.1f} ms per output token at {_num(o0)} → {_num(o1)} output tokens"
        )
    elif cause == "longer_outputs":
        detail = f"outputs {_num(o0)} → {_num(o1)} tokens at {g0:.1f} → {g1:.1f} ms per token"
    elif cause == "throttling":
        detail = f"backoff {_ms(b0)} → {_ms(b1)} per call"
    elif cause == "more_calls":
        detail = f"calls per request {r0:.2f} → {r1:.2f}"
    else:
        detail = ", ".join(f"{k.replace('_', ' ')} {v:+.0f} ms" for k, v in breakdown.items() if v)
    return CauseReading(cause, breakdown, ours, f"{cause.replace('_', ' ')} ({who}): {detail}")


# The columns :func:`with_llm_causes` adds to the attribution rows (null but on ``llm`` verdicts).
LLM_CAUSE_COLUMNS: dict[str, Any] = {
    "llm_cause": pl.String,
    "llm_cause_ours": pl.Boolean,  # the team's change (prompt, output, calls), not the provider's
    "llm_cause_provider": pl.String,
    "llm_cause_model": pl.String,
    "llm_cause_text": pl.String,
    # llm_breakdown_ms: the parts of the LLM delta on the tail's critical path.
    "llm_first_token_ms": pl.Float64,
    "llm_generation_ms": pl.Float64,
    "llm_backoff_ms": pl.Float64,
    "llm_more_calls_ms": pl.Float64,
}


def with_llm_causes(attribution: pl.DataFrame, spans: pl.DataFrame, anatomy: pl.DataFrame) -> pl.DataFrame:
    """The attribution rows (:data:`analytics.attribution.ATTRIBUTION_SCHEMA`) with
    :data:`LLM_CAUSE_COLUMNS`: for each ``llm`` verdict, the :func:`llm_cause` of the model whose
    spans grew most on the operation's tail (``spans``: the attribution's spans), its synchronous
    calls per request being its calls on hot paths over the requests of the operations it serves.
    Pure."""
    nulls = [pl.lit(None, dtype).alias(name) for name, dtype in LLM_CAUSE_COLUMNS.items()]
    out = attribution.with_columns(nulls)
    if attribution.is_empty() or anatomy.is_empty():
        return out
    grown = (
        spans.filter((pl.col("class") == "llm") & (pl.col("delta_ms") > 0))
        .group_by("service", "operation", "provider", "model")
        .agg(pl.col("delta_ms").sum())
        .sort("delta_ms", descending=True)
    )
    served = grown.join(
        attribution.select("service", "operation", "baseline_requests", "current_requests"),
        on=["service", "operation"],
    )
    by_model = {
        (p, m): (float(b or 0), float(c or 0))
        for p, m, b, c in served.group_by("provider", "model")
        .agg(pl.col("baseline_requests").sum(), pl.col("current_requests").sum())
        .iter_rows()
    }
    rows = {(r["provider"], r["model"]): r for r in anatomy.iter_rows(named=True)}
    readings: list[dict[str, Any]] = []
    for row in attribution.iter_rows(named=True):
        reading: dict[str, Any] = dict.fromkeys(LLM_CAUSE_COLUMNS)
        top = grown.filter((pl.col("service") == row["service"]) & (pl.col("operation") == row["operation"]))
        if row["verdict"] == "llm" and top.height:
            provider, model = top["provider"][0], top["model"][0]
            model_row = rows.get((provider, model))
            requests = by_model.get((provider, model), (0.0, 0.0))
            per_request = None
            if model_row and requests[0] > 0 and requests[1] > 0:
                per_request = (
                    (model_row["baseline_sync_calls"] or 0) / requests[0],
                    (model_row["sync_calls"] or 0) / requests[1],
                )
            found = llm_cause(model_row, row["llm_delta_ms"] or 0.0, per_request) if model_row else None
            if found is not None:
                reading.update(
                    llm_cause=found.cause,
                    llm_cause_ours=found.ours,
                    llm_cause_provider=provider,
                    llm_cause_model=model,
                    llm_cause_text=found.text,
                    llm_first_token_ms=found.breakdown_ms["first_token"],
                    llm_generation_ms=found.breakdown_ms["generation"],
                    llm_backoff_ms=found.breakdown_ms["backoff"],
                    llm_more_calls_ms=found.breakdown_ms["more_calls"],
                )
        readings.append(reading)
    return attribution.with_columns(pl.DataFrame(readings, schema=LLM_CAUSE_COLUMNS))
