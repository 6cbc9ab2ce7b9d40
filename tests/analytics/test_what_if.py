"""The what-if options against a known truth: heavy-tailed (lognormal) model calls behind a fixed
internal time, some requests calling twice in a row, a second model on a share of the requests.

The expected figures are computed here from the spans the builder made, with this file's own code:
the calls of a request run back to back after its internal work and the root ends with the last
one, so each request's new latency is its duration minus its calls' latencies plus their new ones.
The draws follow the rule docs/analytics.md states (a fresh ``default_rng(what_if_seed)`` per
provider/model, the pool its sorted observed latencies, the calls in start order). Users abandon
every other request that took ``ABANDON_MS`` or more: the abandoned requests saved are read off that
curve (per 500 ms bucket) here too."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from polars.testing import assert_frame_equal

from analytics import Conventions, Price, analyze, build_summaries, render_table
from analytics.what_if import HEDGE_QUANTILES, fallback_for
from collectors.spans import SpanRow, insert_spans
from storage import Store
from tests.analytics.builders import MS, at, dt, hot_request

SERVICE, OPERATION = "answers", "POST /answer"
INTERNAL_MS = 300.0
BUDGET_MS = 1500.0
MAIN, SECOND = "openai/gpt-4o", "openai/gpt-4o-mini"
WINDOW_S = 3600.0
ABANDON_MS = 2000.0
BUCKET_MS = 500
GRID = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)


@dataclass(frozen=True)
class Call:
    start_ns: int
    end_ns: int
    model: str

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / MS


@dataclass(frozen=True)
class Request:
    start_ns: int
    duration_ms: float
    calls: tuple[Call, ...]
    abandoned: bool


def _spans(requests: int = 1500, seed: int = 37) -> list[SpanRow]:
    """An hour of requests, one every 2.4 s: 300 ms of internal work, then one (or, one in five,
    two) lognormal model calls — gpt-4o heavy-tailed, gpt-4o-mini on one request in four, faster."""
    rng = np.random.default_rng(seed)
    spans: list[SpanRow] = []
    step_s = WINDOW_S / requests
    for i in range(requests):
        mini = i % 4 == 3
        calls = 2 if i % 5 == 0 else 1
        if mini:
            llm = rng.lognormal(math.log(250.0), 0.5, size=calls)
        else:
            llm = rng.lognormal(math.log(500.0), 0.9, size=calls)
        llm_ms = [round(float(x), 3) for x in llm]
        spans += hot_request(
            SERVICE,
            OPERATION,
            at(i * step_s + 0.5),
            0.0,
            llm_ms=llm_ms,
            internal=[("retrieve", INTERNAL_MS)],
            model="gpt-4o-mini" if mini else "gpt-4o",
            abandoned=i % 2 == 0 and INTERNAL_MS + sum(llm_ms) >= ABANDON_MS,
        )
    return spans


def _requests(spans: list[SpanRow], since_ns: int) -> list[Request]:
    """The requests starting at or after ``since_ns`` and their model calls, read off the spans."""
    roots = {s.span_id: s for s in spans if s.parent_span_id in ("", None)}
    calls: dict[str, list[Call]] = defaultdict(list)
    for s in spans:
        system = s.attributes.get("gen_ai.provider.name")
        if s.parent_span_id in roots and system is not None:
            model = f"{system}/{s.attributes['gen_ai.request.model']}"
            calls[s.parent_span_id].append(Call(s.start_ns, s.start_ns + s.duration_ns, model))
    return [
        Request(
            r.start_ns,
            r.duration_ns / MS,
            tuple(sorted(calls[r.span_id], key=lambda c: c.start_ns)),
            r.attributes.get("tailwatch.abandoned") == "true",
        )
        for r in roots.values()
        if r.start_ns >= since_ns
    ]


def _p99(values: list[float]) -> float:
    return float(np.quantile(np.array(values), 0.99, method="linear"))


def _draw_pools(requests: list[Request]) -> tuple[list[Call], dict[str, np.ndarray]]:
    ordered = sorted((c for r in requests for c in r.calls), key=lambda c: (c.start_ns, c.end_ns))
    pools: dict[str, list[float]] = defaultdict(list)
    for c in ordered:
        pools[c.model].append(c.ms)
    return ordered, {m: np.sort(np.array(v)) for m, v in pools.items()}


def _abandon_rate(window: list[Request]) -> Callable[[float], float]:
    """The abandonment curve of the window's requests: a latency's 500 ms bucket's rate, a bucket
    nobody fell in taking that of the nearest observed bucket below (the fastest when none is)."""
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for r in window:
        counts[int(r.duration_ms // BUCKET_MS)][0] += 1
        counts[int(r.duration_ms // BUCKET_MS)][1] += r.abandoned
    observed = sorted(counts)

    def rate(ms: float) -> float:
        below = [b for b in observed if b <= ms // BUCKET_MS]
        n, a = counts[below[-1] if below else observed[0]]
        return a / n

    return rate


def _usd_per_token(conv: Conventions) -> dict[str, float]:
    """Every call here: 500 input and 200 output tokens, none cached."""
    out = {}
    for price in conv.llm_prices:
        out[f"{price.provider}/{price.model}"] = (500 * price.input + 200 * price.output) / 1e6 / 700
    return out


def _expected(
    requests: list[Request], window: list[Request], conv: Conventions
) -> dict[tuple[str, str], dict[str, float]]:
    """(option, parameter) → p99, requests over budget and abandoned requests saved a day, extra
    calls ratio, and (with prices) extra USD a day, from the spans (``window``: every request of the
    analysed window, for the curve)."""
    usd = _usd_per_token(conv)
    ordered, pools = _draw_pools(requests)
    rate = _abandon_rate(window)
    per_day = 86400.0 / min(WINDOW_S, conv.exact_horizon.total_seconds())
    p95 = {m: float(np.quantile(pool, 0.95, method="linear")) for m, pool in pools.items()}

    def draws(source: str, calls: list[Call]) -> dict[Call, float]:
        pool = pools[source]
        picked = pool[np.random.default_rng(conv.what_if_seed).integers(0, pool.size, size=len(calls))]
        return dict(zip(calls, picked.tolist(), strict=True))

    second: dict[Call, float] = {}
    for model in pools:
        second.update(draws(model, [c for c in ordered if c.model == model]))

    def figures(new: dict[Call, float], extra: int = 0) -> dict[str, float]:
        # In whole nanoseconds, as span times are.
        latency = [round(r.duration_ms + sum(new[c] - c.ms for c in r.calls), 6) for r in requests]
        return {
            "p99": _p99(latency),
            "over": sum(v >= BUDGET_MS for v in latency) * per_day,
            "saved": sum(rate(r.duration_ms) - rate(v) for r, v in zip(requests, latency, strict=True))
            * per_day,
            "extra_calls": extra / len(ordered),
        }

    out: dict[tuple[str, str], dict[str, float]] = {}
    for label, delay in [("T=p95", None), *((f"T={d:g}ms", d) for d in conv.what_if_delays_ms)]:
        t = {c: p95[c.model] if delay is None else delay for c in ordered}
        over_t = [c for c in ordered if c.ms > t[c]]
        out["hedge", label] = figures(
            {c: min(c.ms, t[c] + second[c]) if c in over_t else c.ms for c in ordered}, len(over_t)
        ) | {
            "usd": sum(700 * usd.get(c.model, math.nan) for c in over_t) * per_day,
            "tokens": 700 * len(over_t) * per_day,
        }
        f = fallback_for(SERVICE, OPERATION, conv)
        out["timeout_fallback", f"{label} F={f:g}ms"] = figures(
            {c: t[c] + f if c.ms > t[c] else c.ms for c in ordered}
        ) | {"usd": 0.0}
    # The hedge with the lowest p99 whose extra tokens (here: calls, every call reports the same
    # tokens) stay within the budget, over each model's quantiles of the documented grid.
    best: tuple[float, str, dict[str, float]] | None = None
    for q in GRID:
        t = {c: float(np.quantile(pools[c.model], q, method="linear")) for c in ordered}
        over_t = [c for c in ordered if c.ms > t[c]]
        if len(over_t) / len(ordered) <= conv.what_if_max_extra_tokens:
            got = figures(
                {c: min(c.ms, t[c] + second[c]) if c in over_t else c.ms for c in ordered}, len(over_t)
            ) | {
                "usd": sum(700 * usd.get(c.model, math.nan) for c in over_t) * per_day,
                "tokens": 700 * len(over_t) * per_day,
            }
            if best is None or got["p99"] < best[0]:
                best = (
                    got["p99"],
                    f"T=p{round(q * 100)} best≤{conv.what_if_max_extra_tokens:.0%} tokens",
                    got,
                )
    assert best is not None
    out["hedge", best[1]] = best[2]
    for target in pools:
        routed = draws(target, ordered)
        out["route_model", target] = figures(
            {c: c.ms if c.model == target else routed[c] for c in ordered}
        ) | {
            "usd": sum(700 * (usd.get(target, math.nan) - usd.get(c.model, math.nan)) for c in ordered)
            * per_day
        }
    out["move_off_hot_path", "replacement=0ms"] = figures(dict.fromkeys(ordered, 0.0)) | {"usd": 0.0}
    return out


def _check(
    analysis_rows: list[dict[str, Any]], requests: list[Request], window: list[Request], conv: Conventions
) -> None:
    expected = _expected(requests, window, conv)
    rows = {(r["option"], r["parameter"]): r for r in analysis_rows}
    assert set(rows) == set(expected)
    now = _p99([r.duration_ms for r in requests])
    ordered, _ = _draw_pools(requests)
    for key, want in expected.items():
        got = rows[key]
        assert (got["service"], got["operation"], got["requests"]) == (SERVICE, OPERATION, len(requests))
        assert got["budget_ms"] == BUDGET_MS
        # Span times are whole nanoseconds: the new latencies agree to a few of them.
        assert got["p99_ms"] == pytest.approx(want["p99"], abs=1e-4), key
        assert got["p99_delta_ms"] == pytest.approx(want["p99"] - now, abs=1e-4), key
        assert got["requests_over_budget"] == pytest.approx(want["over"], rel=1e-12), key
        assert got["abandoned_saved_per_day"] == pytest.approx(want["saved"], rel=1e-9, abs=1e-6), key
        if key[0] == "hedge":
            # Exactly the calls over T send a second request.
            assert got["extra_calls_ratio"] == want["extra_calls"], key
            assert round(got["extra_calls_ratio"] * len(ordered)) == round(want["extra_calls"] * len(ordered))
            # Every call here reports the same tokens (500 in, 200 out): the hedged ones pay them twice.
            assert got["extra_tokens_ratio"] == pytest.approx(want["extra_calls"], rel=1e-12), key
        else:
            assert got["extra_calls_ratio"] == 0.0
        assert got["assumption"]
        # Every call here reports 700 tokens: a hedge pays its hedged calls' again, the rest none.
        assert got["extra_tokens_per_day"] == pytest.approx(want.get("tokens", 0.0), rel=1e-12), key
        if not conv.llm_prices:
            assert got["extra_cost_per_day"] is None, key
        else:
            assert got["extra_cost_per_day"] == pytest.approx(want["usd"], rel=1e-9, abs=1e-9), key
    # The options mean something on this data: hedging and cutting at p95 shorten the tail.
    assert rows["hedge", "T=p95"]["p99_delta_ms"] < 0
    f = fallback_for(SERVICE, OPERATION, conv)
    assert rows["timeout_fallback", f"T=p95 F={f:g}ms"]["p99_delta_ms"] < 0
    assert rows["hedge", "T=p95"]["abandoned_saved_per_day"] > 0


def _conventions(**kwargs: Any) -> Conventions:
    return Conventions(
        latency_budgets=((SERVICE, OPERATION, BUDGET_MS),), what_if_delays_ms=(800.0, 1500.0), **kwargs
    )


def test_what_if_matches_the_per_request_rule(store: Store) -> None:
    assert GRID == HEDGE_QUANTILES  # the documented grid
    spans = _spans()
    insert_spans(store, spans)
    conv = _conventions()
    analysis = analyze(store, dt(at(0)), dt(at(WINDOW_S)), use_summaries=False, conventions=conv)
    data = json.loads(analysis.to_json())
    _check(data["what_if"], _requests(spans, at(0)), _requests(spans, at(0)), conv)
    assert "WHAT IF" in render_table(data) and "route_model" in render_table(data)
    # The boundary's counterfactual is the same figure.
    [boundary] = data["boundary"]
    moved = [w for w in data["what_if"] if w["option"] == "move_off_hot_path"]
    assert moved[0]["p99_ms"] == boundary["p99_without_sync_llm_ms"]
    # The recommendation names the cheapest option under budget: fewest extra tokens (a hedge pays
    # its calls over T again), then calls, then the least to build, then the lowest p99.
    effort = ["timeout_fallback", "route_model", "hedge", "move_off_hot_path"]
    expected = _expected(_requests(spans, at(0)), _requests(spans, at(0)), conv)
    under = [(k, v) for k, v in expected.items() if v["p99"] < BUDGET_MS]
    (option, parameter), _ = min(
        under,
        key=lambda kv: (kv[1]["extra_calls"], kv[1]["extra_calls"], effort.index(kv[0][0]), kv[1]["p99"]),
    )
    assert boundary["recommendation"] == "move_off_hot_path"
    assert boundary["cheapest_option"] == f"{option} {parameter}"
    assert any(
        r.startswith(f"cheapest option under budget: {option} {parameter}") for r in boundary["reasons"]
    )


def test_priced_options_cost_their_tokens_at_the_models_prices(store: Store) -> None:
    spans = _spans()
    insert_spans(store, spans)
    prices = (
        Price("openai", "gpt-4o", input=2.5, output=10.0),
        Price("openai", "gpt-4o-mini", input=0.15, output=0.6),
    )
    conv = _conventions(llm_prices=prices)
    analysis = analyze(store, dt(at(0)), dt(at(WINDOW_S)), use_summaries=False, conventions=conv)
    data = json.loads(analysis.to_json())
    _check(data["what_if"], _requests(spans, at(0)), _requests(spans, at(0)), conv)
    rows = {(r["option"], r["parameter"]): r for r in data["what_if"]}
    # Routing every call to the cheaper model saves money; a hedge costs some.
    assert (
        rows["route_model", SECOND]["extra_cost_per_day"] < 0 < rows["hedge", "T=p95"]["extra_cost_per_day"]
    )
    # Without the second model's price, an option touching it has no cost (null, never 0).
    partial = analyze(
        store,
        dt(at(0)),
        dt(at(WINDOW_S)),
        use_summaries=False,
        conventions=_conventions(llm_prices=prices[:1]),
    )
    assert all(r["extra_cost_per_day"] is None for r in partial.to_dict()["what_if"])


def test_a_fallback_configured_for_the_operation_is_the_one_simulated(store: Store) -> None:
    spans = _spans()
    insert_spans(store, spans)
    conv = Conventions.from_dict(
        {
            "latency_budgets": [{"service": SERVICE, "operation": OPERATION, "budget_ms": BUDGET_MS}],
            "what_if_delays_ms": [800.0, 1500.0],
            "what_if_fallbacks": [
                {"service": "other", "operation": "*", "fallback": "5ms"},
                {"service": SERVICE, "operation": "POST *", "fallback": "400ms"},
            ],
        }
    )
    assert fallback_for(SERVICE, OPERATION, conv) == 400.0 and fallback_for("x", "y", conv) == 50.0
    analysis = analyze(store, dt(at(0)), dt(at(WINDOW_S)), use_summaries=False, conventions=conv)
    data = json.loads(analysis.to_json())
    _check(data["what_if"], _requests(spans, at(0)), _requests(spans, at(0)), conv)
    assert ("timeout_fallback", "T=p95 F=400ms") in {(r["option"], r["parameter"]) for r in data["what_if"]}


def test_what_if_reads_the_most_recent_exact_horizon_from_summaries(store: Store) -> None:
    spans = _spans()
    insert_spans(store, spans)
    # Two hours (the series in whole minutes: the long-window path), the spans in the second.
    conv = _conventions(exact_horizon=timedelta(minutes=20))
    start, end = dt(at(-WINDOW_S)), dt(at(WINDOW_S))
    build_summaries(store, until=dt(at(2 * WINDOW_S)), conventions=conv)
    summarised = analyze(store, start, end, conventions=conv)
    full = analyze(store, start, end, use_summaries=False, conventions=conv)
    since = at(WINDOW_S - conv.exact_horizon.total_seconds())
    _check(
        json.loads(summarised.to_json())["what_if"], _requests(spans, since), _requests(spans, at(0)), conv
    )
    assert_frame_equal(summarised.what_if, full.what_if)
