"""llm_cost_regression and llm_cache_drop on the anatomy of calls with a known truth: prices from the
configuration's table, no noise without prices or without a cache."""

from __future__ import annotations

import polars as pl
import pytest

from analytics import Price
from analytics.llm_anatomy import anatomy_buckets, anatomy_totals, llm_anatomy
from slo_rules.engine import evaluate_with
from slo_rules.errors import RuleError
from slo_rules.rules import load_rules, rules_from_text
from storage import Store
from tests.analytics.test_llm_anatomy import calls
from tests.slo_rules.test_kinds import FrameSource, T

PRICE = Price("openai", "gpt-4o", input=2.5, output=10.0, cached_input=1.25)

RULES = """
rules:
  - name: cost
    kind: llm_cost_regression
    window: 1d
    per: {per}
    max_increase: 0.5
  - name: cache
    kind: llm_cache_drop
    window: 1h
    max_drop: 0.2
"""


def _anatomy(baseline: pl.DataFrame, current: pl.DataFrame, prices: tuple[Price, ...]) -> pl.DataFrame:
    rows = pl.concat([baseline.with_columns(pl.lit("baseline").alias("window")), current])
    return llm_anatomy(anatomy_totals(rows), anatomy_buckets(rows, ["window", "provider", "model"]), prices)


@pytest.mark.parametrize("per", ["day", "call"])
def test_a_tripled_prompt_that_loses_the_cache_raises_both_and_says_what_moved(
    store: Store, per: str
) -> None:
    baseline = calls(1000, window="baseline", input_tokens=2000, cached_share=0.6, seed=1)
    current = calls(1000, input_tokens=6000, cached_share=0.05, seed=2)
    anatomy = _anatomy(baseline, current, (PRICE,))
    row = anatomy.row(0, named=True)
    # The truth the rules judge: the cost per call and per day more than +50%, the cache −55 points.
    assert row["cost_per_1k_calls"] > 1.5 * row["baseline_cost_per_1k_calls"]
    assert row["baseline_cached_input_ratio"] - row["cached_input_ratio"] > 0.5
    result = evaluate_with(
        store, rules_from_text(RULES.format(per=per)), T, FrameSource({"llm_anatomy": anatomy})
    )
    assert result.errors == []
    fired = {a.labels["alertname"]: a for a in result.fired}
    assert set(fired) == {"cost", "cache"}
    cost = fired["cost"]
    assert cost.labels["provider"] == "openai" and cost.labels["model"] == "gpt-4o"
    assert (
        "input tokens p50 " in cost.annotations["summary"]
        and "cached input 60% → 5%" in cost.annotations["summary"]
    )
    assert "prompt-cache hits dropped, cached input 60% → 5%" in fired["cache"].annotations["summary"]


def test_no_price_no_cost_alert_and_the_reason_names_the_config_key(store: Store) -> None:
    baseline = calls(1000, window="baseline", input_tokens=2000, seed=3)
    current = calls(1000, input_tokens=6000, seed=4)
    anatomy = _anatomy(baseline, current, ())
    assert anatomy["cost_per_day"].to_list() == [None]
    result = evaluate_with(
        store, rules_from_text(RULES.format(per="day")), T, FrameSource({"llm_anatomy": anatomy})
    )
    assert result.errors == [] and result.fired == []
    # A model that never read from its cache has none to lose: no cache alert either.


def test_a_steady_model_is_quiet(store: Store) -> None:
    baseline = calls(1000, window="baseline", cached_share=0.5, seed=5)
    current = calls(1000, cached_share=0.48, seed=6)
    anatomy = _anatomy(baseline, current, (PRICE,))
    result = evaluate_with(
        store, rules_from_text(RULES.format(per="day")), T, FrameSource({"llm_anatomy": anatomy})
    )
    assert result.errors == [] and result.fired == []
    assert len(result.alerts) == 0 or all(a.state != "firing" for a in result.alerts)


def test_the_shipped_pack_has_both_rules_and_needs_prices_for_cost() -> None:
    kinds = {r.kind: r for r in load_rules().rules}
    assert kinds["llm_cost_regression"].per == "day"  # type: ignore[union-attr]
    assert kinds["llm_cache_drop"].min_baseline_ratio > 0  # type: ignore[union-attr]


def _costs(prompt_now: int, prices: tuple[Price, ...], requests: int = 500) -> pl.DataFrame:
    """Two windows of POST /chat requests, each with one synchronous gpt-4o call: the baseline's
    prompt 1,000 tokens, the current one's ``prompt_now``; GET /health with no call."""
    from datetime import timedelta

    from analytics.request_costs import llm_costs, request_llm_state

    rows, calls = [], []
    for i in range(2 * requests):
        window = "baseline" if i < requests else "current"
        rows.append({"trace_key": i, "service": "api", "operation": "POST /chat", "version": "1",
                     "weight": 1.0, "window": window})  # fmt: skip
        rows.append({"trace_key": 10_000 + i, "service": "api", "operation": "GET /health", "version": "1",
                     "weight": 1.0, "window": window})  # fmt: skip
        calls.append({"trace_key": i, "sync": True, "provider": "openai", "model": "gpt-4o",
                      "input_tokens": 1000 if window == "baseline" else prompt_now, "output_tokens": 200,
                      "cached_tokens": 0})  # fmt: skip
    requests_frame = pl.DataFrame(rows, schema_overrides={"trace_key": pl.UInt64})
    calls_frame = pl.DataFrame(calls, schema_overrides={"trace_key": pl.UInt64})
    state = request_llm_state(requests_frame, calls_frame, [pl.col("window")])
    day = timedelta(days=1)
    return llm_costs(state, prices, {"current": day, "baseline": day})


REQUEST_RULE = """
rules:
  - name: cost per request
    kind: llm_cost_regression
    window: 1d
    per: request
    operation: "POST *"
    max_increase: 0.5
"""


def test_per_request_a_tripled_prompt_fires_on_the_operation_with_its_tokens(store: Store) -> None:
    costs = _costs(3000, (PRICE,))
    chat = costs.filter((pl.col("operation") == "POST /chat") & (pl.col("version") == ""))
    before, after = (
        chat.filter(pl.col("window") == w)["llm_cost_per_request"][0] for w in ("baseline", "current")
    )
    assert after > 1.5 * before  # the truth the rule judges: (3000·2.5 + 200·10) / (1000·2.5 + 200·10)
    result = evaluate_with(store, rules_from_text(REQUEST_RULE), T, FrameSource({"llm_costs": costs}))
    assert result.errors == []
    (alert,) = result.fired
    assert (alert.labels["service"], alert.labels["operation"]) == ("api", "POST /chat")
    summary = alert.annotations["summary"]
    assert "cost per request $0.0045 → $0.0095" in summary and "tokens per request 1,200 → 3,200" in summary


def test_per_request_is_quiet_when_steady_or_unpriced(store: Store) -> None:
    for costs in (_costs(1000, (PRICE,)), _costs(3000, ())):
        result = evaluate_with(store, rules_from_text(REQUEST_RULE), T, FrameSource({"llm_costs": costs}))
        assert result.errors == [] and result.fired == []


def test_per_request_selects_operations_not_models() -> None:
    with pytest.raises(RuleError, match="per: request selects hot operations"):
        rules_from_text(REQUEST_RULE + "    model: gpt-4o\n")
    with pytest.raises(RuleError, match="service/operation need per: request"):
        rules_from_text(REQUEST_RULE.replace("per: request", "per: day"))
