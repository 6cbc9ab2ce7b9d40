"""What a hot request costs in model calls: tokens and USD per request per operation, version and
window, and the step at each release — the same from the request rows, from the summaries' rows and
from the per-minute state, against the tokens the spans carry."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from analytics import Conventions, analyze, build_summaries
from analytics.conventions import Price
from analytics.report import render_table
from analytics.summaries import summary_coverage
from analytics.summary_tables import MINUTES_TABLE
from collectors import insert_spans
from collectors.spans import SpanRow
from storage import Store, ensure_schema, open_store
from tests.analytics.builders import MS, at, dt, hot_request

HOUR = 3600.0
PRICE = Price(provider="openai", model="gpt-4o-mini", input=0.15, cached_input=0.075, output=0.6)
RELEASE = 1.5 * HOUR  # v1.1 triples the prompt
START, END = dt(at(HOUR)), dt(at(2 * HOUR))  # the current window; the baseline is the hour before


def _call(root: SpanRow, model: str, tokens: tuple[int, int, int], offset_ms: float) -> SpanRow:
    inputs, outputs, cached = tokens
    return SpanRow(
        trace_id=root.trace_id,
        span_id=f"{abs(hash((root.span_id, offset_ms, model))):016x}"[:16],
        parent_span_id=root.span_id,
        name=f"chat {model}",
        start_ns=root.start_ns + int(offset_ms * MS),
        duration_ns=int(40 * MS),
        kind="Client",
        service=root.service,
        resource_attributes=root.resource_attributes,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": str(inputs),
            "gen_ai.usage.output_tokens": str(outputs),
            "gen_ai.usage.cache_read.input_tokens": str(cached),
        },
    )


def _usd(tokens: tuple[int, int, int]) -> float:
    inputs, outputs, cached = tokens
    return ((inputs - cached) * 0.15 + cached * 0.075 + outputs * 0.6) / 1e6


def _filled(path: Path) -> tuple[Store, list[dict]]:
    """Two hours of three operations: POST /chat with one or two priced calls per request (the
    prompt tripled by v1.1), GET /search with none, POST /agent calling a model without a price;
    the store and each POST /chat request's truth."""
    rng = np.random.default_rng(9)
    spans: list[SpanRow] = []
    truth: list[dict] = []
    for i in range(1_400):
        t = i * (2 * HOUR / 1_400)
        version = "1.1" if t >= RELEASE else "1.0"
        request = hot_request("chat-api", "POST /chat", at(t), 300.0, version=version)
        root = request[0]
        calls = [(1000 * (3 if version == "1.1" else 1), int(rng.integers(100, 300)), 400)]
        if rng.random() < 0.3:
            calls.append((500, 50, 0))
        spans += request + [_call(root, "gpt-4o-mini", c, 10.0 + 50 * j) for j, c in enumerate(calls)]
        tokens = sum(a + b for a, b, _ in calls)
        truth.append({"t": t, "version": version, "calls": len(calls), "tokens": tokens,
                      "usd": sum(_usd(c) for c in calls)})  # fmt: skip
    for i in range(300):
        spans += hot_request("chat-api", "GET /search", at(i * 24.0), 80.0, version="1.0")
        agent = hot_request("chat-api", "POST /agent", at(i * 24.0 + 5), 500.0, version="1.0")
        spans += [*agent, _call(agent[0], "house-model", (800, 100, 0), 5.0)]
    store = open_store("chdb://" + str(path))
    ensure_schema(store)
    insert_spans(store, spans)
    return store, truth


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, list[dict]]]:
    store, truth = _filled(tmp_path_factory.mktemp("costs") / "store")
    try:
        yield store, truth
    finally:
        store.close()


def _expected(truth: list[dict], lo: float, hi: float, version: str | None = None) -> dict[str, float]:
    rows = [r for r in truth if lo <= r["t"] < hi and (version is None or r["version"] == version)]
    n = len(rows)
    if not n:
        return {"requests": 0}
    return {
        "requests": n,
        "calls": sum(r["calls"] for r in rows) / n,
        "tokens": sum(r["tokens"] for r in rows) / n,
        "usd": sum(r["usd"] for r in rows) / n,
    }


def _row(data: dict, operation: str, window: str, version: str = "") -> dict:
    return next(
        c
        for c in data["llm_costs"]
        if c["operation"] == operation and c["window"] == window and c["version"] == version
    )


@pytest.mark.parametrize("how", ["rows", "summaries", "aggregates"])
def test_cost_per_request_per_operation_version_and_window(scenario, how: str) -> None:
    store, truth = scenario
    conv = Conventions(llm_prices=(PRICE,))
    if how == "aggregates":
        conv = Conventions(llm_prices=(PRICE,), exact_horizon=timedelta(minutes=20))
    if how != "rows":
        build_summaries(store, until=dt(at(2 * HOUR + 600)), conventions=conv)
    data = analyze(store, START, END, conventions=conv, use_summaries=how != "rows").to_dict()
    for window, lo, hi in (("current", HOUR, 2 * HOUR), ("baseline", 0.0, HOUR)):
        for version in ("", "1.0", "1.1"):
            want = _expected(truth, lo, hi, version or None)
            if not want["requests"]:
                continue
            got = _row(data, "POST /chat", window, version)
            assert got["requests"] == want["requests"], (window, version)
            assert got["sync_llm_calls_per_request"] == pytest.approx(want["calls"], rel=1e-12)
            assert got["llm_tokens_per_request"] == pytest.approx(want["tokens"], rel=1e-12)
            assert got["llm_cost_per_request"] == pytest.approx(want["usd"], rel=1e-9)
            assert got["llm_cost_per_day"] == pytest.approx(want["usd"] * want["requests"] * 24, rel=1e-9)
    search = _row(data, "GET /search", "current")
    assert search["llm_cost_per_request"] == 0.0 and search["sync_llm_calls_per_request"] == 0.0
    agent = _row(data, "POST /agent", "current")
    assert agent["llm_cost_per_request"] is None and agent["llm_tokens_per_request"] == pytest.approx(900.0)
    # The release's step: the version before over both windows → the released one over the window.
    (release,) = [
        r
        for h in data["hot_path"]
        if h["operation"] == "POST /chat"
        for r in h["releases"]
        if r["version"] == "1.1"
    ]
    before, after = _expected(truth, 0.0, 2 * HOUR, "1.0"), _expected(truth, HOUR, 2 * HOUR, "1.1")
    assert release["llm_cost_per_request_before"] == pytest.approx(before["usd"], rel=1e-9)
    assert release["llm_cost_per_request_after"] == pytest.approx(after["usd"], rel=1e-9)
    assert release["llm_tokens_per_request_after"] > 2 * release["llm_tokens_per_request_before"]
    assert "LLM COST PER HOT REQUEST" in render_table(data)


def test_without_prices_tokens_are_reported_and_cost_is_null(scenario) -> None:
    store, truth = scenario
    data = analyze(store, START, END, use_summaries=False).to_dict()
    chat = _row(data, "POST /chat", "current")
    assert chat["llm_cost_per_request"] is None and chat["llm_cost_per_day"] is None
    assert chat["llm_tokens_per_request"] == pytest.approx(
        _expected(truth, HOUR, 2 * HOUR)["tokens"], rel=1e-12
    )


def test_a_window_cut_mid_minute_and_partly_summarised_costs_the_same_as_its_rows(scenario) -> None:
    store, _ = scenario
    conv = Conventions(llm_prices=(PRICE,), exact_horizon=timedelta(minutes=20))
    build_summaries(store, until=dt(at(2 * HOUR + 600)), conventions=conv)
    # Forget the minutes from the window's middle on: its edges are partial minutes, its second
    # half is read raw (as minutes not summarised yet are).
    middle = dt(at(1.5 * HOUR))
    store.command(f"DELETE FROM {store.table(MINUTES_TABLE)} WHERE minute >= {{m:DateTime}}", {"m": middle})
    try:
        start, end = dt(at(HOUR + 17)), dt(at(2 * HOUR + 17))
        covered = summary_coverage(store, start, end, conventions=conv)
        assert covered and covered[0][0] <= start and covered[-1][1] == middle
        got = analyze(store, start, end, conventions=conv).llm_costs
        want = analyze(store, start, end, conventions=conv, use_summaries=False).llm_costs
    finally:
        build_summaries(store, until=dt(at(2 * HOUR + 600)), conventions=conv)
    keys = ["service", "operation", "version", "window"]
    assert got.select(keys).sort(keys).equals(want.select(keys).sort(keys))
    rows = zip(got.sort(keys).iter_rows(named=True), want.sort(keys).iter_rows(named=True), strict=True)
    for a, b in rows:
        assert a["requests"] == b["requests"], (a, b)
        for column in ("sync_llm_calls_per_request", "llm_tokens_per_request", "llm_cost_per_request"):
            assert (a[column] is None) == (b[column] is None), (column, a, b)
            assert a[column] is None or a[column] == pytest.approx(b[column], rel=1e-9), (column, a, b)
