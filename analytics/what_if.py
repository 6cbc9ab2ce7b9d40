"""What-if options per hot operation: what a hedge, a timeout with a fallback, another model or moving
the calls off the hot path would do to p99, and at what price — simulated per request from its own
spans (Polars and numpy, pure).

Each request keeps its other time; only its synchronous model calls change:

* ``hedge`` at delay T (default: the call's provider/model p95 over the rows read; also each of
  ``Conventions.what_if_delays_ms``): a call of latency X₁ becomes min(X₁, T + X₂), X₂ drawn from
  the same provider/model's observed synchronous call latencies. Each call over T sends a second
  request: extra calls are exactly those over T. Beside them, the delay of :data:`HEDGE_QUANTILES`
  (each model's quantile q) with the lowest p99 whose extra tokens stay within
  ``what_if_max_extra_tokens``.
* ``timeout_fallback`` at T (the same delays): a call over T becomes T + F, F =
  ``what_if_fallback_ms`` (50 ms, a cache read; per operation ``what_if_fallbacks``), no extra call.
* ``route_model`` to each other provider/model seen on the operation's synchronous calls: the
  operation's calls of any other model take latencies drawn from that model's observed
  distribution (its calls of that model are kept).
* ``move_off_hot_path``: the boundary's counterfactual (:func:`analytics.boundary.counterfactual`),
  read as it is.

**A request's new latency** = duration − (its calls' union) + (the new calls' union), where the
union is that of :func:`analytics.boundary.sync_llm_union_ns` and, the new one, is approximated:
each call keeps its start but is moved by the change of the calls of its request that ended before
it started (they are taken to precede it: sequential calls stay sequential, concurrent ones stay
concurrent), and ends at its moved start + its new latency. The change is bounded below by the
request's LLM time on the critical path (``sync_llm_ms`` of the counterfactual: for the walked tail
traces, less than the union when a call runs beside longer internal work): a request is never made
shorter than without its calls.

**Draws**: the pool of a provider/model is its observed synchronous call latencies in milliseconds
(over the requests simulated, every operation), sorted; each draw is a fresh
``numpy.random.default_rng(what_if_seed)`` taking ``pool[rng.integers(0, len(pool), size=n)]`` for
the operation's calls ordered by (start, end, trace key): for a hedge, one draw per provider/model
over its calls (used by those over T); for ``route_model``, one draw over all the operation's calls
(used by those of other models). Independent draws: a slow moment of a provider is not repeated in
its second request.

**Figures** per (service, operation, option, parameter): ``p99_ms`` of the new latencies (weighted
when sampled, as the boundary), ``p99_delta_ms`` against the same requests' p99, requests at or over
the budget (:func:`analytics.boundary.budget_for`) per day, abandoned requests a day saved (the
boundary's rule, :func:`analytics.boundary._saved_per_day`, on the window's abandonment curve),
``extra_calls_ratio`` (extra model
requests / synchronous calls), ``extra_tokens_ratio`` (hedge: each call over T is charged its tokens
again — the second request sends the same input and is assumed to run to its end; the store keeps
one token total per call, so the input-only lower bound cannot be told apart), and
``extra_cost_per_day`` in USD (null unless every model the option touches has a price: each call's
tokens at its model's average USD per token, :func:`analytics.llm_anatomy.usd_per_token` — a hedge
pays its hedged calls' tokens again, a route the difference between the models' prices for the same
tokens, a timeout's fallback and moving the calls off the request cost nothing extra).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import numpy as np
import polars as pl

from analytics._common import empty
from analytics.boundary import (
    NO_CURVE,
    _count_over,
    _p99,
    _saved_per_day,
    _weights,
    abandonment_by_operation,
    budget_for,
    union_ns_per_row,
)
from analytics.conventions import Conventions

__all__ = [
    "HEDGE_QUANTILES",
    "WHAT_IF_CALLS_SCHEMA",
    "WHAT_IF_SCHEMA",
    "WhatIfOption",
    "what_if",
    "with_cheapest_option",
]

WhatIfOption = Literal["hedge", "timeout_fallback", "route_model", "move_off_hot_path"]

WHAT_IF_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "option": pl.String,  # WhatIfOption
    "parameter": pl.String,  # "T=p95", "T=2000ms", "T=p95 F=50ms", "openai/gpt-4o-mini", ...
    "requests": pl.Int64,  # the requests simulated (the window's most recent what_if_horizon)
    "budget_ms": pl.Float64,  # null when none
    "p99_ms": pl.Float64,
    "p99_delta_ms": pl.Float64,  # against the same requests' p99
    "requests_over_budget": pl.Float64,  # per day; null without a budget
    "abandoned_saved_per_day": pl.Float64,  # from the abandonment curve; null when nobody abandoned
    "extra_calls_ratio": pl.Float64,
    "extra_tokens_ratio": pl.Float64,  # null when the calls report no tokens
    "extra_tokens_per_day": pl.Float64,  # the same as tokens a day; null when no tokens are reported
    "extra_cost_per_day": pl.Float64,  # USD; null without the prices of the models it touches
    "assumption": pl.String,
}

# The synchronous logical calls of the requests simulated (analytics.llm_calls.logical_calls).
WHAT_IF_CALLS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "provider": pl.String,
    "model": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "tokens": pl.Int64,
}

_INDEPENDENT = "independent draws from the same window"


def _pools(calls: pl.DataFrame) -> dict[str, np.ndarray]:
    """Each provider/model's observed call latencies (ms), sorted."""
    out: dict[str, np.ndarray] = {}
    for (key,), part in calls.group_by("_model"):
        out[str(key)] = np.sort(part["_latency_ms"].to_numpy())
    return out


# The delays tried for the hedge with the lowest p99 within the extra-token budget: each call's
# provider/model quantile q of its observed latencies.
HEDGE_QUANTILES = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)


def _model_quantile(models: pl.Series, pools: dict[str, np.ndarray], q: float) -> np.ndarray:
    """Per call: its provider/model's quantile ``q`` (type 7) of the observed latencies."""
    at = {key: float(np.quantile(pool, q, method="linear")) for key, pool in pools.items()}
    return models.replace_strict(at, return_dtype=pl.Float64).to_numpy()


def _draws(calls: pl.DataFrame, pools: dict[str, np.ndarray], key_of: pl.Series, seed: int) -> np.ndarray:
    """Per call (rows of ``calls``, already in draw order): a latency drawn from the pool of the
    model ``key_of`` names for it; one fresh generator per model, the calls in their order."""
    out = np.full(calls.height, np.nan)
    keys = key_of.to_numpy()
    for key in sorted(set(keys.tolist())):
        at = np.flatnonzero(keys == key)
        pool = pools.get(key)
        if pool is None or pool.size == 0:
            continue
        rng = np.random.default_rng(seed)
        out[at] = pool[rng.integers(0, pool.size, size=at.size)]
    return out


class _Moves:
    """An operation's requests (``requests``) and calls (``calls``, ``_row`` the request's index):
    what :meth:`new_latency` needs that does not depend on the calls' new times, computed once for
    the tens of options simulated on the same calls."""

    def __init__(self, requests: pl.DataFrame, calls: pl.DataFrame) -> None:
        self.duration = requests["duration_ms"].to_numpy()
        self.floor = -requests["sync_llm_ms"].to_numpy()
        self.rows = requests.height
        self.empty = calls.is_empty()
        if self.empty:
            return
        self.start = calls["start_ns"].to_numpy()
        self.old_ns = calls["end_ns"].to_numpy() - self.start
        self.row = calls["_row"].to_numpy()
        frame = pl.DataFrame(
            {"i": np.arange(calls.height), "row": self.row, "s": self.start, "e": self.start + self.old_ns}
        )
        # The calls in (request, end) order: position k holds call by_end[k].
        ended = frame.sort("row", "e", maintain_order=True).with_row_index("k")
        self.by_end = ended["i"].to_numpy()
        # Per position, the position of its request's first call (its running sum starts there).
        self.first = ended.select(pl.col("k").min().over("row"))["k"].to_numpy().astype(np.int64)
        # Per call, the position of the last call of its request that ended at or before it started
        # (-1: none): the calls whose change moves it.
        self.before = (
            frame.sort("s")
            .join_asof(
                ended.select("row", "e", "k").sort("e", maintain_order=True),
                left_on="s",
                right_on="e",
                by="row",
                strategy="backward",
                check_sortedness=False,
            )
            .sort("i")["k"]
            .fill_null(-1)
            .to_numpy()
            .astype(np.int64)
        )
        self.union_now = self._union(self.start, self.start + self.old_ns)

    def _union(self, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        order = np.lexsort((s, self.row))
        return union_ns_per_row(self.row[order], s[order], e[order], self.rows)

    def new_latency(self, new_ms: np.ndarray) -> np.ndarray:
        """Per request: its duration with each of its calls lasting ``new_ms`` instead — see the
        module docstring."""
        if self.empty:
            return self.duration.copy()
        change_ns = np.round(new_ms * 1e6).astype(np.int64) - self.old_ns
        # The calls of the request that ended before this one started move it by their change.
        ordered = change_ns[self.by_end]
        running = np.cumsum(ordered)
        moved = running - running[self.first] + ordered[self.first]
        shift = np.where(self.before >= 0, moved[np.maximum(self.before, 0)], 0)
        new_s = self.start + shift
        new_e = new_s + self.old_ns + change_ns
        delta_ms = (self._union(new_s, new_e) - self.union_now) / 1e6
        # In whole nanoseconds, as spans are: a new latency on a bucket's edge (a fallback's T + F)
        # then falls in that bucket, not a float's width below it.
        return np.round(self.duration + np.maximum(delta_ms, self.floor), 6)


@dataclass(frozen=True)
class _Operation:
    """One operation's figures every option's row repeats or is measured against."""

    service: str
    operation: str
    requests: int
    budget: float | None
    weights: np.ndarray | None  # per request, None when every request stands for itself
    call_weights: np.ndarray  # per call, its request's weight
    p99_now: float
    per_day: float
    latency_now: np.ndarray  # per request, ms
    curve: pl.DataFrame  # the operation's abandonment buckets (lo_ms, rate, abandoned)
    bucket_ms: int


def _row(
    op: _Operation,
    option: WhatIfOption,
    parameter: str,
    new_latency: np.ndarray,
    extra_calls: np.ndarray | None,
    extra_tokens: float | None,
    assumption: str,
    extra_cost: float | None = None,
    extra_tokens_day: float | None = None,
) -> dict[str, Any]:
    p99 = _p99(new_latency, op.weights)
    over = None if op.budget is None else _count_over(new_latency, op.budget, op.weights) * op.per_day
    saved = _saved_per_day(
        op.latency_now, new_latency, op.curve, op.bucket_ms, op.per_day, op.weights, op.weights
    )
    w = op.call_weights
    return {
        "service": op.service,
        "operation": op.operation,
        "option": option,
        "parameter": parameter,
        "requests": op.requests,
        "budget_ms": op.budget,
        "p99_ms": p99,
        "p99_delta_ms": p99 - op.p99_now,
        "requests_over_budget": over,
        "abandoned_saved_per_day": saved,
        "extra_calls_ratio": 0.0 if extra_calls is None else float((w * extra_calls).sum() / w.sum()),
        "extra_tokens_ratio": extra_tokens,
        "extra_tokens_per_day": extra_tokens_day,
        "extra_cost_per_day": extra_cost,
        "assumption": assumption,
    }


def fallback_for(service: str, operation: str, conventions: Conventions) -> float:
    """The fallback time (ms) of a timed-out call of one operation: the first configured glob match
    (``what_if_fallbacks``), else ``what_if_fallback_ms``."""
    for service_glob, operation_glob, fallback_ms in conventions.what_if_fallbacks:
        if fnmatchcase(service, service_glob) and fnmatchcase(operation, operation_glob):
            return fallback_ms
    return conventions.what_if_fallback_ms


def _operation_rows(
    service: str,
    operation: str,
    group: pl.DataFrame,
    op_calls: pl.DataFrame,
    pools: dict[str, np.ndarray],
    cliffs: dict[tuple[str, str], Any],
    curve: pl.DataFrame,
    per_day: float,
    conv: Conventions,
    usd: Mapping[str, float],
) -> list[dict[str, Any]]:
    """The :data:`WHAT_IF_SCHEMA` rows of one operation: its requests (``group``, with ``_row``),
    their calls (``op_calls``, in draw order), its abandonment buckets (``curve``) and the USD per
    token of each priced ``provider/model``."""
    rows: list[dict[str, Any]] = []
    weights = _weights(group)
    call_w = op_calls["weight"].to_numpy()
    latency = op_calls["_latency_ms"].to_numpy()
    tokens = op_calls["tokens"].fill_null(0).to_numpy().astype(np.float64)
    total_tokens = float((tokens * call_w).sum())
    budget, _ = budget_for(service, operation, cliffs.get((service, operation)), conv)
    latency_now = group["duration_ms"].to_numpy()
    models = op_calls["_model"]
    # USD a day of each call's tokens at its model's price (nan: unpriced).
    price = np.array([usd.get(m, math.nan) for m in models.to_list()], dtype=np.float64)
    priced = bool(np.isfinite(price).all())
    call_usd = tokens * call_w * price * per_day

    def tokens_of(over: np.ndarray | None) -> float | None:
        """The extra tokens a day of paying the calls ``over`` again (none: nothing extra)."""
        if total_tokens == 0:
            return None
        return 0.0 if over is None else float((tokens * call_w)[over].sum() * per_day)

    def usd_of(over: np.ndarray | None) -> float | None:
        """The extra USD a day of paying the calls ``over`` again (none: nothing extra)."""
        if not priced:
            return None
        return 0.0 if over is None else float(call_usd[over].sum())

    op = _Operation(
        service,
        operation,
        group.height,
        budget,
        weights,
        call_w,
        _p99(latency_now, weights),
        per_day,
        latency_now,
        curve,
        conv.bucket_ms,
    )

    second = _draws(op_calls, pools, models, conv.what_if_seed)
    moves = _Moves(group, op_calls)
    fallback_ms = fallback_for(service, operation, conv)

    def hedge(delay: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """(new latencies, calls over T, extra tokens ratio — the extra calls ratio when the
        calls report no tokens) of a hedge at ``delay``."""
        over = latency > delay
        new = moves.new_latency(np.where(over, np.minimum(latency, delay + second), latency))
        if total_tokens == 0:
            return new, over, float((call_w * over).sum() / call_w.sum())
        return new, over, float((tokens * call_w * over).sum()) / total_tokens

    hedge_assumption = (
        f"second request at T, {_INDEPENDENT}; each hedged call's tokens paid twice; no extra 429s"
    )
    # Delays: each call's own model p95, then the configured ones.
    delays: list[tuple[str, np.ndarray]] = [("T=p95", _model_quantile(models, pools, 0.95))]
    delays += [(f"T={d:g}ms", np.full(op_calls.height, d)) for d in conv.what_if_delays_ms]
    for label, delay in delays:
        over_t = latency > delay
        new, _, extra_tokens = hedge(delay)
        rows.append(
            _row(
                op,
                "hedge",
                label,
                new,
                over_t.astype(np.float64),
                None if total_tokens == 0 else extra_tokens,
                hedge_assumption,
                usd_of(over_t),
                tokens_of(over_t),
            )
        )
        fallback = np.where(over_t, delay + fallback_ms, latency)
        rows.append(
            _row(
                op,
                "timeout_fallback",
                f"{label} F={fallback_ms:g}ms",
                moves.new_latency(fallback),
                None,
                0.0,
                f"calls over T answered by a fallback (a cache read) of "
                f"{fallback_ms:g} ms; its answer is good enough",
                usd_of(None),
                tokens_of(None),
            )
        )
    # The delay (each model's quantile q of the grid) with the lowest p99 whose extra tokens stay
    # within what_if_max_extra_tokens; the lowest q on a tie.
    best: tuple[float, float, np.ndarray, np.ndarray, float] | None = None
    for q in HEDGE_QUANTILES:
        new, over_t, extra_tokens = hedge(_model_quantile(models, pools, q))
        if extra_tokens <= conv.what_if_max_extra_tokens:
            p99 = _p99(new, weights)
            if best is None or p99 < best[0]:
                best = (p99, q, new, over_t, extra_tokens)
    if best is not None:
        _, q, new, over_t, extra_tokens = best
        rows.append(
            _row(
                op,
                "hedge",
                f"T=p{round(q * 100)} best≤{conv.what_if_max_extra_tokens:.0%} tokens",
                new,
                over_t.astype(np.float64),
                None if total_tokens == 0 else extra_tokens,
                hedge_assumption,
                usd_of(over_t),
                tokens_of(over_t),
            )
        )
    seen = sorted(set(models.to_list()))
    if len(seen) > 1:
        for target in seen:
            routed = np.where(
                (models == target).to_numpy(),
                latency,
                _draws(op_calls, pools, pl.Series([target] * op_calls.height), conv.what_if_seed),
            )
            rows.append(
                _row(
                    op,
                    "route_model",
                    target,
                    moves.new_latency(routed),
                    None,
                    0.0,
                    f"every other model's calls take {target}'s latency ({_INDEPENDENT}); "
                    "same tokens, same answers",
                    # The same tokens at the target's price instead of their own.
                    float((tokens * call_w * (usd[target] - price)).sum() * per_day)
                    if priced and target in usd
                    else None,
                    tokens_of(None),
                )
            )
    without = group["without_sync_llm_ms"].to_numpy()
    rows.append(
        _row(
            op,
            "move_off_hot_path",
            f"replacement={conv.sync_llm_replacement_ms:g}ms",
            without,
            None,
            0.0,
            "the boundary's counterfactual: the calls run off the request, each replaced by "
            f"{conv.sync_llm_replacement_ms:g} ms",
            usd_of(None),
            tokens_of(None),
        )
    )
    return rows


def what_if(
    requests: pl.DataFrame,
    calls: pl.DataFrame,
    abandonment_summary: pl.DataFrame,
    abandonment_buckets: pl.DataFrame,
    seconds: float,
    conventions: Conventions,
    usd_per_token: Mapping[str, float] | None = None,
) -> pl.DataFrame:
    """:data:`WHAT_IF_SCHEMA` rows from the :func:`analytics.boundary.counterfactual` requests
    simulated (those of the window's most recent ``what_if_horizon``), their synchronous calls
    (:data:`WHAT_IF_CALLS_SCHEMA`), the abandonment summary (cliffs, for the budgets) and buckets
    (the curve, over the whole window: for the abandoned requests saved) and the length of time the
    requests cover. Operations without a synchronous call get no row. Pure."""
    if requests.is_empty() or calls.is_empty() or seconds <= 0:
        return empty(WHAT_IF_SCHEMA)
    conv = conventions
    per_day = 86400.0 / seconds
    cliffs, curves = abandonment_by_operation(abandonment_summary, abandonment_buckets)
    requests = requests.with_columns(pl.col("weight").fill_null(1.0))
    every_call = (
        calls.join(
            requests.select("trace_key", "service", "operation", "weight"),
            on="trace_key",
            how="inner",
            maintain_order="left",
        )
        .with_columns(
            ((pl.col("end_ns") - pl.col("start_ns")) / 1e6).alias("_latency_ms"),
            pl.concat_str(
                pl.col("provider").cast(pl.String).fill_null(""),
                pl.lit("/"),
                pl.col("model").cast(pl.String).fill_null(""),
            ).alias("_model"),
        )
        .sort("start_ns", "end_ns", "trace_key")
    )
    pools = _pools(every_call)
    rows: list[dict[str, Any]] = []
    for (service, operation), group in sorted(
        requests.partition_by("service", "operation", as_dict=True).items(), key=lambda kv: kv[0]
    ):
        service, operation = str(service), str(operation)
        group = group.with_row_index("_row")
        op_calls = every_call.filter(
            (pl.col("service") == service) & (pl.col("operation") == operation)
        ).join(group.select("trace_key", "_row"), on="trace_key", how="inner", maintain_order="left")
        if op_calls.is_empty():
            continue
        curve = curves.get((service, operation), NO_CURVE)
        rows += _operation_rows(
            service, operation, group, op_calls, pools, cliffs, curve, per_day, conv, usd_per_token or {}
        )
    if not rows:
        return empty(WHAT_IF_SCHEMA)
    return pl.DataFrame(rows, schema=WHAT_IF_SCHEMA)


# Without a price table, options of equal extra tokens and calls are ranked by what they take to
# build: a timeout, another model, a hedge, then moving the calls off the request.
_EFFORT: dict[str, int] = {"timeout_fallback": 0, "route_model": 1, "hedge": 2, "move_off_hot_path": 3}


def with_cheapest_option(boundary: pl.DataFrame, options: pl.DataFrame) -> pl.DataFrame:
    """The boundary rows (:data:`analytics.boundary.BOUNDARY_SCHEMA`) with, for each operation over
    its budget, ``cheapest_option`` — of the :func:`what_if` rows whose p99 is under the budget, the
    one with the lowest extra cost a day (where priced), then the fewest extra tokens, then extra
    calls, then the least to build, then the lowest p99 — and a reason saying it (or that no option
    does). Pure."""
    if boundary.is_empty() or options.is_empty():
        return boundary
    by_operation = {
        (str(k[0]), str(k[1])): part
        for k, part in options.partition_by("service", "operation", as_dict=True).items()
    }
    cheapest: list[str | None] = []
    reasons: list[list[str]] = []
    for row in boundary.iter_rows(named=True):
        found = by_operation.get((row["service"], row["operation"]))
        budget = row["budget_ms"]
        reason = list(row["reasons"] or [])
        if found is None or budget is None or row["recommendation"] in (None, "keep"):
            cheapest.append(row["cheapest_option"])
            reasons.append(reason)
            continue
        under = [r for r in found.iter_rows(named=True) if r["p99_ms"] < budget]
        horizon = f"simulated on the last {found['requests'][0]:,} requests"
        if not under:
            cheapest.append(None)
            best = min(found.iter_rows(named=True), key=lambda r: r["p99_ms"])
            reason.append(
                f"no what-if option brings p99 under budget ({horizon}); the closest, "
                f"{best['option']} {best['parameter']}: p99 {best['p99_ms']:,.0f} ms"
            )
        else:
            best = min(
                under,
                key=lambda r: (
                    # Priced options by what they cost a day (the unpriced after them), then tokens.
                    r["extra_cost_per_day"] if r["extra_cost_per_day"] is not None else math.inf,
                    r["extra_tokens_ratio"] if r["extra_tokens_ratio"] is not None else math.inf,
                    r["extra_calls_ratio"],
                    _EFFORT.get(r["option"], len(_EFFORT)),
                    r["p99_ms"],
                ),
            )
            cheapest.append(f"{best['option']} {best['parameter']}")
            tokens = best["extra_tokens_ratio"]
            reason.append(
                f"cheapest option under budget: {best['option']} {best['parameter']}, p99 "
                f"{best['p99_ms']:,.0f} ms, {best['extra_calls_ratio']:+.1%} calls, "
                + ("tokens unknown" if tokens is None else f"{tokens:+.1%} tokens")
                + (
                    ""
                    if best["extra_cost_per_day"] is None
                    else f", {best['extra_cost_per_day']:+,.2f} USD a day"
                )
                + f" ({horizon})"
            )
        reasons.append(reason)
    return boundary.with_columns(
        pl.Series("cheapest_option", cheapest, dtype=pl.String),
        pl.Series("reasons", reasons, dtype=pl.List(pl.String)),
    )
