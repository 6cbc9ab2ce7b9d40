"""llm_cost_regression and llm_cache_drop on the anatomy of calls with a known truth: prices from the
configuration's table, no noise without prices or without a cache."""

from __future__ import annotations

import polars as pl
import pytest

from analytics import Price
from analytics.llm_anatomy import anatomy_buckets, anatomy_totals, llm_anatomy
from slo_rules.engine import evaluate_with
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
