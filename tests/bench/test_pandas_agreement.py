"""The benchmark's pandas baseline and :func:`analytics.analyze` compute the same numbers.

The analysis benchmark reports how much faster ``analyze`` is than a straightforward pandas
implementation of the same metrics; that ratio means something only if both do the same work and
reach the same answers. They are independent implementations (SQL reductions and Polars against a
full read into pandas, Python tree walks, ``.quantile``), so agreement on the benchmark's own data
also checks each against the other.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl
import pytest

from analytics import Conventions, analyze
from bench import pandas_baseline
from bench.analytics_data import CURRENT_END, CURRENT_START, generate
from storage import Store

SPANS = 100_000
HALF_DAY = timedelta(hours=12)


@pytest.fixture
def results(store: Store) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
    generate(store, SPANS)
    # A hundred requests an hour per operation: each release's step is measured over the half day
    # its version serves (an hour would hold too few for a p99).
    ours = analyze(
        store, CURRENT_START, CURRENT_END, conventions=Conventions(release_step_window=HALF_DAY)
    ).frames
    theirs = {
        name: pl.from_pandas(frame.reset_index())
        for name, frame in pandas_baseline.run(store, CURRENT_START, CURRENT_END, HALF_DAY).items()
    }
    return ours, theirs


def _same(value: float) -> object:
    """The other implementation's value, up to float rounding."""
    return pytest.approx(value, rel=1e-6, abs=1e-6)


def test_every_metric_agrees_with_the_pandas_baseline(
    results: tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]],
) -> None:
    ours, theirs = results

    # Hot path: the same requests and the same exact (linearly interpolated) percentiles.
    hot = {(r["service"], r["operation"]): r for r in ours["hot_path"].iter_rows(named=True)}
    assert len(hot) == theirs["hot_path"].height == 3
    for r in theirs["hot_path"].iter_rows(named=True):
        mine = hot[(r["ServiceName"], r["SpanName"])]
        assert mine["requests"] == r["requests"] > 2000
        for column in ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "sync_llm_calls_per_request"):
            assert mine[column] == _same(r[column]), column

    # Releases: the p99 delta of every release both report (pandas skips small samples).
    deltas = {
        (r["service"], r["operation"], r["version"]): r["p99_delta_ms"]
        for r in ours["releases"].iter_rows(named=True)
    }
    assert theirs["releases"].height == 6
    for r in theirs["releases"].iter_rows(named=True):
        assert deltas[(r["service"], r["operation"], r["version"])] == _same(r["delta"])
    # The regressing release is the one the data was built with; the baseline agrees on its size.
    flagged = ours["releases"].filter(pl.col("significant"))
    assert flagged.select("service", "version").rows() == [("chat-api", "v2")]

    # Cold path: jobs, completions and the enqueue-to-ready percentiles per queue.
    cold = {r["queue"]: r for r in ours["cold_path"].iter_rows(named=True)}
    assert set(cold) == set(theirs["cold_path"]["queue"]) == {"doc-summaries", "emails"}
    for r in theirs["cold_path"].iter_rows(named=True):
        mine = cold[r["queue"]]
        assert (mine["jobs"], mine["completed"]) == (r["jobs"], r["completed"])
        for column in ("p50_s", "p99_s", "p999_s"):
            assert mine[column] == _same(r[column]), (r["queue"], column)
    assert cold["doc-summaries"]["starved"] and not cold["emails"]["starved"]

    # Abandonment: requests and abandoned requests in every 500 ms bucket.
    buckets = {
        (r["service"], r["operation"], r["lo_ms"]): (r["requests"], r["abandoned"])
        for r in ours["abandonment"].iter_rows(named=True)
    }
    expected = {
        (r["ServiceName"], r["SpanName"], int(r["bucket"])): (r["requests"], r["abandoned"])
        for r in theirs["abandonment"].iter_rows(named=True)
    }
    assert buckets == expected
    assert sum(abandoned for _, abandoned in expected.values()) > 0

    # Retries: logical calls, attempts and tokens of every hop of the one workflow.
    hops = {
        r["hop"]: (r["calls"], r["attempts"], r["tokens"]) for r in ours["retry_hops"].iter_rows(named=True)
    }
    expected_hops = {
        r["hop"]: (r["calls"], r["attempts"], int(r["tokens"]))
        for r in theirs["retry_hops"].iter_rows(named=True)
    }
    assert hops == expected_hops
    assert set(hops) == {"classify", "extract", "decide"}
    assert all(attempts > calls for calls, attempts, _ in hops.values())

    # Attribution: the change in the tail traces' critical path, LLM and internal.
    split = {
        (r["service"], r["operation"]): (r["llm_delta_ms"], r["internal_delta_ms"])
        for r in ours["attribution"].iter_rows(named=True)
    }
    assert len(split) == theirs["attribution"].height == 3
    for r in theirs["attribution"].iter_rows(named=True):
        llm, internal = split[(r["service"], r["operation"])]
        assert (llm, internal) == (_same(r["llm_delta"]), _same(r["internal_delta"]))
    verdicts = dict(ours["attribution"].select("service", "verdict").iter_rows())
    assert verdicts["chat-api"] == "llm" and verdicts["search-api"] == "internal"

    # LLM signals of the model behind the LLM-side regression, current window.
    signals = ours["llm_signals"].row(0, named=True)
    baseline = theirs["llm_signals"].filter(
        (pl.col("provider") == signals["provider"]) & (pl.col("model") == signals["model"])
    )
    assert baseline.height == 1
    for ours_name, theirs_name in (
        ("error_rate_current", "err"),
        ("throttle_rate_current", "thr"),
        ("retry_rate_current", "retry"),
        ("cold_share_current", "cold"),
    ):
        assert signals[ours_name] == _same(baseline[theirs_name][0]), ours_name
    assert signals["cold_share_current"] > 0.1
