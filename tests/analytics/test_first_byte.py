"""Streamed endpoints: the hot path's time to first byte (the ASGI instrumentation's first body
send) beside the total duration, and abandonment read against it where the conventions say so."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import polars as pl
import pytest

from analytics import Conventions, analyze, build_summaries
from analytics.conventions import ConventionsError
from analytics.sketch import RELATIVE_ERROR
from collectors import insert_spans
from collectors.spans import SpanRow
from storage import Store, ensure_schema, open_store
from tests.analytics.builders import at, dt, hot_request, streamed_request

SERVICE, STREAMED, PLAIN = "chat-api", "POST /chat/stream", "POST /chat"
N = 1_500


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, np.ndarray]]]:
    """Streamed requests (first byte ~400 ms, ~3 s in all; users leave when the first byte is late),
    plain ones answered in one body send, and roots of another framework with no send spans."""
    rng = np.random.default_rng(5)
    spans: list[SpanRow] = []
    first = rng.lognormal(6.0, 0.5, N)
    total = first + rng.lognormal(8.0, 0.3, N)
    left = rng.random(N) < np.where(first > 600, 0.5, 0.02)
    for i in range(N):
        spans += streamed_request(
            SERVICE, STREAMED, at(i * 2.0), first[i], total[i], chunks=6, abandoned=left[i]
        )
    plain = rng.lognormal(5.0, 0.4, N // 3)
    for i, ms in enumerate(plain):
        spans += streamed_request(SERVICE, PLAIN, at(i * 6.0 + 1), ms - 1.0, ms, chunks=1)
    for i in range(200):
        spans += hot_request("flask-api", "GET /old", at(i * 15.0), 80.0)
    store = open_store("chdb://" + str(tmp_path_factory.mktemp("first_byte") / "store"))
    ensure_schema(store)
    insert_spans(store, spans)
    try:
        yield store, {"first": first, "total": total, "left": left, "plain": plain - 1.0}
    finally:
        store.close()


def _hot(analysis: dict, operation: str) -> dict:
    return next(h for h in analysis["hot_path"] if h["operation"] == operation)


def test_the_hot_path_reports_the_time_to_first_byte_beside_the_duration(scenario) -> None:
    store, truth = scenario
    got = analyze(store, dt(at(0)), dt(at(N * 2.0)), conventions=Conventions()).to_dict()
    streamed = _hot(got, STREAMED)
    assert streamed["requests"] == streamed["first_byte_requests"] == streamed["streamed_requests"] == N
    for key, q in (("ttfb_p50_ms", 50), ("ttfb_p99_ms", 99)):
        assert streamed[key] == pytest.approx(np.percentile(truth["first"], q), rel=1e-6)
    assert streamed["p99_ms"] == pytest.approx(np.percentile(truth["total"], 99), rel=1e-6)
    assert streamed["ttfb_p99_ms"] < streamed["p99_ms"] / 3  # what the user waited for, not the last byte
    plain = _hot(got, PLAIN)
    assert plain["first_byte_requests"] == len(truth["plain"]) and plain["streamed_requests"] == 0
    assert plain["ttfb_p50_ms"] == pytest.approx(np.percentile(truth["plain"], 50), rel=1e-6)
    other = _hot(got, "GET /old")
    assert other["first_byte_requests"] == other["streamed_requests"] == 0 and other["ttfb_p99_ms"] is None


def test_the_series_and_the_hot_path_view_draw_the_first_byte(scenario) -> None:
    from dashboards.figures import hot_path_figure

    store, truth = scenario
    start, end = dt(at(0)), dt(at(N * 2.0))
    analysis = analyze(store, start, end, conventions=Conventions(series_buckets=10))
    series = analysis.hot_path_series.filter(pl.col("operation") == STREAMED).sort("bucket_start")
    every = series["bucket_start"][1] - series["bucket_start"][0]
    starts = np.arange(N) * 2.0
    for bucket, got in zip(series["bucket_start"], series["ttfb_p99_ms"], strict=True):
        lo = (bucket - start.replace(tzinfo=bucket.tzinfo)).total_seconds()
        inside = (starts >= lo) & (starts < lo + every.total_seconds())
        assert got == pytest.approx(np.percentile(truth["first"][inside], 99), rel=1e-6)
    plain = analysis.hot_path_series.filter(pl.col("operation") == PLAIN)
    assert plain["ttfb_p99_ms"].is_not_null().all()  # marked, not streamed: in the frame, not drawn
    figure = hot_path_figure(analysis)
    lines = [t for t in figure.data if t.name == "first byte p99"]
    assert len(lines) == 1 and list(lines[0].y) == series["ttfb_p99_ms"].to_list()
    assert sum(t.showlegend is not False for t in lines) == 1


def _buckets(values: np.ndarray, left: np.ndarray, width: int) -> dict[int, tuple[int, int]]:
    index = (values // width).astype(int)
    return {int(b) * width: (int((index == b).sum()), int(left[index == b].sum())) for b in np.unique(index)}


@pytest.mark.parametrize("latency", ["first_byte", "duration"])
def test_abandonment_is_read_against_the_latency_the_operation_names(scenario, latency: str) -> None:
    store, truth = scenario
    conv = Conventions(abandonment_latency=({"operation": "POST /chat/*", "latency": latency},))
    got = analyze(store, dt(at(0)), dt(at(N * 2.0)), conventions=conv).to_dict()
    row = next(a for a in got["abandonment"] if a["operation"] == STREAMED)
    assert row["latency"] == latency
    values = truth["first"] if latency == "first_byte" else truth["total"]
    want = _buckets(values, truth["left"], conv.bucket_ms)
    assert {b["lo_ms"]: (b["requests"], b["abandoned"]) for b in row["buckets"]} == want
    if latency == "first_byte":
        # Users leave when the first byte is late: the cliff is the bucket holding 600 ms.
        assert row["cliff_ms"] == 500


def test_a_long_window_merges_the_first_byte_from_the_aggregates(scenario) -> None:
    store, _ = scenario
    # Series buckets of whole minutes (5 min over the 50): the window is merged from the aggregates.
    conv = Conventions(
        exact_horizon=timedelta(minutes=30),
        series_buckets=10,
        abandonment_latency=(("*", STREAMED, "first_byte"),),
    )
    build_summaries(store, until=dt(at(N * 2.0 + 600)), conventions=conv)
    start, end = dt(at(0)), dt(at(N * 2.0))
    merged = analyze(store, start, end, conventions=conv)
    exact = analyze(store, start, end, conventions=conv, use_summaries=False)
    for name in ("first_byte_requests", "streamed_requests"):
        assert merged.hot_path[name].to_list() == exact.hot_path[name].to_list()
    keys = ["service", "operation", "bucket_start"]
    got, want = merged.hot_path_series.sort(keys), exact.hot_path_series.sort(keys)
    assert got.select(keys).equals(want.select(keys))
    for a, b in zip(got["ttfb_p99_ms"], want["ttfb_p99_ms"], strict=True):
        assert (a is None and b is None) or abs(a - b) <= RELATIVE_ERROR * b + 1e-9, ("series", a, b)
    for name in ("ttfb_p50_ms", "ttfb_p99_ms"):
        for a, b in zip(merged.hot_path[name], exact.hot_path[name], strict=True):
            assert (a is None and b is None) or abs(a - b) <= RELATIVE_ERROR * b + 1e-9, (name, a, b)
    assert merged.abandonment.equals(exact.abandonment)
    # The sketches' figures, not the rows': the aggregates were read.
    assert merged.hot_path["ttfb_p99_ms"].to_list() != exact.hot_path["ttfb_p99_ms"].to_list()
    assert merged.abandonment_summary["latency"].to_list() == exact.abandonment_summary["latency"].to_list()


def test_a_malformed_abandonment_latency_names_the_setting() -> None:
    with pytest.raises(ConventionsError, match="abandonment_latency"):
        Conventions(abandonment_latency=({"operation": "POST /chat", "latency": "first_token"},))
    with pytest.raises(ConventionsError, match="abandonment_latency"):
        Conventions.from_dict({"abandonment_latency": [{"operation": "POST /chat", "after": "first_byte"}]})
