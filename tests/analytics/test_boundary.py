"""The hot/cold boundary and the slices of a migration, against the truth of the spans built."""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict
from typing import Any

import numpy as np
import polars as pl
import pytest

from analytics import FRAME_SCHEMAS, Analysis, Conventions, ConventionsError, analyze, render_table
from analytics.boundary import BOUNDARY_SCHEMA, boundary, counterfactual, sync_llm_union_ns
from analytics.slices import control_variant
from collectors.spans import SpanRow, insert_spans
from storage import Store
from tests.analytics.builders import MS, T0_DT, S, scenario_boundary, scenario_flag_split

Z95 = 1.959963984540054


def _row(frame: pl.DataFrame, **where: object) -> dict[str, Any]:
    for key, value in where.items():
        frame = frame.filter(pl.col(key) == value)
    assert frame.height == 1, (where, frame)
    return frame.row(0, named=True)


def _truth(spans: list[SpanRow]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (service, operation), each request as built: latency, synchronous LLM time (the model
    calls directly under the root), version, abandoned, its trace id."""
    children: dict[str, list[SpanRow]] = defaultdict(list)
    roots = []
    for span in spans:
        if span.parent_span_id:
            children[span.parent_span_id].append(span)
        elif span.kind == "Server":
            roots.append(span)
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for root in roots:
        llm = [c for c in children[root.span_id] if "gen_ai.operation.name" in c.attributes]
        out[(root.service, root.name)].append(
            {
                "trace_id": root.trace_id,
                "latency": root.duration_ns / MS,
                "llm": sum(c.duration_ns for c in llm) / MS,
                "calls": len(llm),
                "version": root.resource_attributes.get("service.version", ""),
                "abandoned": root.attributes.get("http.response.status_code") == "499",
            }
        )
    return out


def _p(values: list[float] | np.ndarray, q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=np.float64), q, method="linear"))


def _wilson(k: int, n: int) -> tuple[float, float]:
    p = k / n
    denom = 1 + Z95 * Z95 / n
    centre = (p + Z95 * Z95 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 * Z95 / (4 * n * n)) / denom
    return centre - half, centre + half


def test_budgets_counterfactual_and_recommendations(store: Store) -> None:
    scenario = scenario_boundary()
    insert_spans(store, scenario.spans)
    conv = Conventions.from_dict({"latency_budgets": scenario.expected["budgets"]})
    analysis = analyze(store, scenario.start, scenario.end, conventions=conv)
    truth = _truth(scenario.spans)
    frame = analysis.boundary
    assert frame.columns == list(BOUNDARY_SCHEMA)
    recommendations = scenario.expected["recommendation"]
    assert {(r["service"], r["operation"]): r["recommendation"] for r in frame.iter_rows(named=True)} == (
        recommendations
    )
    per_day = 1.0  # a one-day window

    # The release that added a synchronous model call: the counterfactual p99 is the p99 of the same
    # requests with that call's time removed.
    chat = _row(frame, service="chat-api", operation="POST /chat")
    requests = truth[("chat-api", "POST /chat")]
    latency = [r["latency"] for r in requests]
    without = [r["latency"] - r["llm"] for r in requests]
    assert sum(r["llm"] > 0 for r in requests) == 1200  # 1.2.0 and 1.3.0 call the model
    assert chat["requests"] == 2400
    assert chat["p99_ms"] == pytest.approx(_p(latency, 0.99), abs=1e-6)
    assert chat["p99_without_sync_llm_ms"] == pytest.approx(_p(without, 0.99), abs=1e-6)
    assert (chat["budget_ms"], chat["budget_source"]) == (800.0, "config")
    assert _p(latency, 0.99) >= 800.0 > _p(without, 0.99)
    assert chat["requests_over_budget"] == sum(v >= 800.0 for v in latency)
    assert chat["requests_over_budget_per_day"] == pytest.approx(chat["requests_over_budget"] * per_day)
    assert chat["requests_over_budget_without_sync_llm"] == sum(v >= 800.0 for v in without)
    assert chat["sync_llm_calls_per_request"] == pytest.approx(0.5)
    assert chat["abandoned_saved_per_day"] is None  # nobody abandoned: no curve
    assert chat["reasons"][0] == f"p99 {_p(latency, 0.99):,.0f} ms ≥ budget 800 ms (config)"
    assert (
        f"without 0.5 sync model calls/request p99 would be {_p(without, 0.99):,.0f} ms" in chat["reasons"][2]
    )
    # Every release's share of the budget: the one adding the call spends more than all of it.
    shares = analysis.boundary_releases.filter(pl.col("service") == "chat-api")
    assert shares["version"].to_list() == ["1.0.0", "1.1.0", "1.2.0", "1.3.0"]
    for release in shares.iter_rows(named=True):
        version_ms = [r["latency"] for r in requests if r["version"] == release["version"]]
        assert release["requests"] == 600
        assert release["p99_ms"] == pytest.approx(_p(version_ms, 0.99), abs=1e-6)
        assert release["budget_share"] == pytest.approx(_p(version_ms, 0.99) / 800.0)
    by_version = {r["version"]: r["budget_share"] for r in shares.iter_rows(named=True)}
    assert by_version["1.1.0"] < 1.0 < by_version["1.2.0"]
    assert (
        shares["released_at"].to_list()
        == analysis.releases.filter(pl.col("service") == "chat-api")
        .sort("released_at")["released_at"]
        .to_list()
    )

    # Within budget: keep.
    status = _row(frame, service="status")
    status_ms = [r["latency"] for r in truth[("status", "GET /status")]]
    assert (status["budget_ms"], status["budget_source"], status["requests_over_budget"]) == (
        500.0,
        "config",
        0,
    )
    assert status["p99_ms"] == pytest.approx(_p(status_ms, 0.99), abs=1e-6) and status["p99_ms"] < 500.0

    # Over budget because of internal work: even without its model call.
    report = _row(frame, service="reports")
    report_req = truth[("reports", "POST /report")]
    report_without = [r["latency"] - r["llm"] for r in report_req]
    assert (report["budget_ms"], report["budget_source"]) == (2000.0, "config")
    assert report["p99_without_sync_llm_ms"] == pytest.approx(_p(report_without, 0.99), abs=1e-6)
    assert report["requests_over_budget_without_sync_llm"] == sum(v >= 2000.0 for v in report_without)

    # No budget configured: the abandonment cliff is the budget, the count over it exact.
    web = _row(frame, service="web")
    web_ms = [r["latency"] for r in truth[("web", "GET /answer")]]
    assert (web["budget_ms"], web["budget_source"]) == (2000.0, "cliff")
    assert web["requests_over_budget"] == sum(v >= 2000.0 for v in web_ms) == 1000
    assert web["requests_over_budget_per_day"] == pytest.approx(1000 * per_day)
    assert web["p99_without_sync_llm_ms"] == web["p99_ms"]
    assert web["abandoned_saved_per_day"] == 0.0  # no model call to remove

    # The JSON carries exactly the interface's keys, with the frame's values.
    data = json.loads(analysis.to_json())
    [chat_json] = [b for b in data["boundary"] if b["service"] == "chat-api"]
    assert chat_json == {k: v for k, v in chat.items() if k != "abandoned_saved_per_day"}
    table = render_table(data)
    assert "BOUNDARY" in table and "move_off_hot_path" in table and "optimise_internal" in table
    assert "    - p99 " in table


def test_without_a_budget_there_is_no_recommendation(store: Store) -> None:
    scenario = scenario_boundary(per_release=150)
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)  # no budgets configured
    chat = _row(analysis.boundary, service="chat-api")
    assert (chat["budget_ms"], chat["budget_source"], chat["recommendation"]) == (None, None, None)
    assert chat["requests_over_budget"] is None and chat["requests_over_budget_without_sync_llm"] is None
    assert chat["reasons"][0].startswith("no latency budget")
    assert analysis.boundary_releases.filter(pl.col("service") == "chat-api")["budget_share"].is_null().all()
    assert _row(analysis.boundary, service="web")["budget_source"] == "cliff"


def _requests(rows: list[tuple[int, float, int]]) -> pl.DataFrame:
    """(trace key, duration ms, sync calls) of current-window requests starting at T0."""
    return pl.DataFrame(
        {
            "trace_key": [r[0] for r in rows],
            "service": ["svc"] * len(rows),
            "operation": ["op"] * len(rows),
            "version": ["1"] * len(rows),
            "start": [T0_DT] * len(rows),
            "duration_ms": [r[1] for r in rows],
            "abandoned": [False] * len(rows),
            "sync_llm_calls": [r[2] for r in rows],
            "window": ["current"] * len(rows),
        },
        schema_overrides={"trace_key": pl.UInt64, "start": pl.Datetime("ns", "UTC")},
    )


def test_counterfactual_is_the_union_of_sync_calls_clipped_to_the_request() -> None:
    t0 = int(T0_DT.timestamp()) * S
    requests = _requests([(1, 1000.0, 2), (2, 1000.0, 3), (3, 500.0, 1), (4, 800.0, 0), (5, 900.0, 1)])

    def call(trace: int, start_ms: float, end_ms: float, sync: bool = True) -> dict[str, Any]:
        return {
            "trace_key": trace,
            "start_ns": t0 + int(start_ms * MS),
            "end_ns": t0 + int(end_ms * MS),
            "sync": sync,
        }

    calls = pl.DataFrame(
        [
            call(1, 100, 300),  # two sequential calls: 200 + 300 ms
            call(1, 400, 700),
            call(2, 0, 400),  # parallel calls overlapping: the union 0–600 ms
            call(2, 200, 600),
            call(2, 300, 500),
            call(3, 400, 900),  # runs past the root's end: clipped to 100 ms
            call(4, 0, 800, sync=False),  # queued work: not removed
            call(5, 100, 600),  # walked: only 200 ms of it on the critical path
        ],
        schema_overrides={"trace_key": pl.UInt64},
    )
    assert sync_llm_union_ns(requests, calls).tolist() == [500 * MS, 600 * MS, 100 * MS, 0, 500 * MS]
    walked = pl.DataFrame(
        {"trace_key": [5], "llm_ns": [200 * MS]}, schema={"trace_key": pl.UInt64, "llm_ns": pl.Int64}
    )
    frame = counterfactual(requests, calls, walked, Conventions())
    assert frame["sync_llm_ms"].to_list() == [500.0, 600.0, 100.0, 0.0, 200.0]
    assert frame["without_sync_llm_ms"].to_list() == [500.0, 400.0, 400.0, 800.0, 700.0]
    # A planned replacement (a warm cache's lookup) costs its time once per call removed.
    cached = counterfactual(requests, calls, walked, Conventions(sync_llm_replacement_ms=15.0))
    assert cached["without_sync_llm_ms"].to_list() == [530.0, 445.0, 415.0, 800.0, 715.0]
    assert counterfactual(requests.clear(), calls, None, Conventions()).is_empty()


def test_abandoned_requests_saved_per_day_read_the_curve() -> None:
    # Ten requests at 2.2 s (bucket 2000: 40% abandon) whose model call is 1.9 s; without it they
    # take 300 ms (bucket 0: 2%); ten at 1.2 s whose counterfactual lands in bucket 500, where no
    # request fell: the nearest observed bucket below it (0) gives the rate.
    t0 = int(T0_DT.timestamp()) * S
    rows = [(i, 2200.0, 1) for i in range(10)] + [(10 + i, 1200.0, 1) for i in range(10)]
    calls = pl.DataFrame(
        [{"trace_key": i, "start_ns": t0, "end_ns": t0 + 1900 * MS, "sync": True} for i in range(10)]
        + [{"trace_key": 10 + i, "start_ns": t0, "end_ns": t0 + 600 * MS, "sync": True} for i in range(10)],
        schema_overrides={"trace_key": pl.UInt64},
    )
    current = counterfactual(_requests(rows), calls, None, Conventions())
    buckets = pl.DataFrame(
        {
            "service": ["svc"] * 3,
            "operation": ["op"] * 3,
            "lo_ms": [0, 1000, 2000],
            "requests": [50, 10, 10],
            "abandoned": [1, 1, 4],
            "rate": [0.02, 0.1, 0.4],
        }
    )
    summary = pl.DataFrame({"service": ["svc"], "operation": ["op"], "cliff_ms": [2000]})
    releases = pl.DataFrame(schema={"service": pl.String, "operation": pl.String, "version": pl.String,
                                    "released_at": pl.Datetime("us", "UTC")})  # fmt: skip
    frame, _ = boundary(current, summary, buckets, releases, 3600.0, Conventions(bucket_ms=500))
    row = frame.row(0, named=True)
    assert row["abandoned_saved_per_day"] == pytest.approx((10 * (0.4 - 0.02) + 10 * (0.1 - 0.02)) * 24)
    assert row["recommendation"] == "move_off_hot_path" and row["budget_source"] == "cliff"
    assert any("abandoned requests a day saved" in reason for reason in row["reasons"])


def test_flag_split_between_a_sync_and_an_async_variant(store: Store) -> None:
    scenario = scenario_flag_split()
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    # The truth: each request's variant from its evaluation, however it was recorded.
    variant_of: dict[str, str] = {}
    for span in scenario.spans:
        attrs = [span.attributes, *(e.attributes for e in span.events)]
        for a in attrs:
            if a.get("feature_flag.key") == "summary-mode":
                variant_of[span.trace_id] = a.get("feature_flag.result.variant") or a["feature_flag.variant"]
    ready: dict[str, float] = {}
    producers = {s.span_id: s for s in scenario.spans if s.kind == "Producer"}
    for span in scenario.spans:
        if span.kind == "Consumer":
            ready[span.trace_id] = (span.end_ns - producers[span.parent_span_id].start_ns) / S
    requests = _truth(scenario.spans)[("docs-api", "POST /summarize")]
    frame = analysis.slices
    assert frame.height == 2 and set(frame["control"]) == {"sync"} and set(frame["flag"]) == {"summary-mode"}
    rows = {r["variant"]: r for r in frame.iter_rows(named=True)}
    for variant, expected_requests in scenario.expected["requests"].items():  # type: ignore[attr-defined]
        mine = [r for r in requests if variant_of[r["trace_id"]] == variant]
        row = rows[variant]
        latency = [r["latency"] for r in mine]
        abandoned = sum(r["abandoned"] for r in mine)
        assert row["requests"] == len(mine) == expected_requests
        assert row["p50_ms"] == pytest.approx(_p(latency, 0.5), abs=1e-6)
        assert row["p99_ms"] == pytest.approx(_p(latency, 0.99), abs=1e-6)
        assert row["abandonment_rate"] == pytest.approx(abandoned / len(mine))
        low, high = _wilson(abandoned, len(mine))
        assert (row["abandonment_rate_low"], row["abandonment_rate_high"]) == (
            pytest.approx(low),
            pytest.approx(high),
        )
        assert row["sync_llm_calls_per_request"] == pytest.approx(sum(r["calls"] for r in mine) / len(mine))
    assert (
        rows["sync"]["abandonment_rate"] == pytest.approx(0.10) and rows["async"]["abandonment_rate"] == 0.02
    )
    assert (rows["sync"]["sync_llm_calls_per_request"], rows["async"]["sync_llm_calls_per_request"]) == (
        1.0,
        0.0,
    )
    # What the async variant's users wait for instead: the enqueue-to-ready p99 of their jobs.
    cold = [ready[r["trace_id"]] for r in requests if variant_of[r["trace_id"]] == "async"]
    assert rows["async"]["cold_jobs"] == 300
    assert rows["async"]["cold_p99_s"] == pytest.approx(_p(cold, 0.99), abs=1e-6)
    assert rows["sync"]["cold_p99_s"] is None and rows["sync"]["cold_jobs"] == 0
    # Against the control.
    control, variant = rows["sync"], rows["async"]
    assert (
        control["is_control"] is True and control["p99_delta_ms"] is None and control["significant"] is None
    )
    assert variant["p99_delta_ms"] == pytest.approx(variant["p99_ms"] - control["p99_ms"])
    assert variant["abandonment_delta"] == pytest.approx(0.02 - 0.10)
    assert variant["significant"] is True
    assert variant["p99_significant"] is True and variant["abandonment_significant"] is True

    data = json.loads(analysis.to_json())
    [slice_json] = data["slices"]
    assert {k: slice_json[k] for k in ("service", "operation", "flag", "control")} == {
        "service": "docs-api", "operation": "POST /summarize", "flag": "summary-mode", "control": "sync",
    }  # fmt: skip
    assert [v["variant"] for v in slice_json["variants"]] == ["sync", "async"]
    assert slice_json["variants"][1]["cold_p99_s"] == pytest.approx(_p(cold, 0.99), abs=1e-6)
    table = render_table(data)
    assert "SLICES" in table and "flag=summary-mode  control=sync" in table


def test_slices_without_enough_requests_are_not_significant(store: Store) -> None:
    scenario = scenario_flag_split(requests=100)  # 70 and 30: below min_release_requests a side
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end)
    variant = _row(analysis.slices, variant="async")
    assert variant["requests"] == 30 and variant["p99_delta_ms"] < -500
    assert variant["significant"] is False
    # Any attribute can split requests: here the flag's variant attribute itself (on some roots).
    sliced = analyze(
        store,
        scenario.start,
        scenario.end,
        conventions=Conventions(slice_attributes=("feature_flag.result.variant",), flag_events=()),
    )
    by_attribute = sliced.slices.filter(pl.col("flag") == "feature_flag.result.variant")
    assert set(by_attribute["variant"]) == {"sync", "async"}
    # The requests whose root carries the attributes (one in three, as built).
    marked = [span for span in scenario.spans if "feature_flag.result.variant" in span.attributes]
    assert by_attribute["requests"].sum() == len(marked) == 33


def test_control_variant_prefers_conventional_names() -> None:
    conv = Conventions()
    assert control_variant({"on": 900, "off": 100}, conv) == "off"
    assert control_variant({"treatment": 10, "Control": 90}, conv) == "Control"
    assert control_variant({"b": 300, "a": 300, "c": 10}, conv) == "a"
    assert control_variant({"v2": 30, "v1": 70}, Conventions(slice_control_variants=("v2",))) == "v2"


def test_runs_persisted_before_the_boundary_frames_still_load() -> None:
    full = Analysis.from_frame_bytes(
        {"start": T0_DT, "end": T0_DT, "baseline_start": T0_DT, "baseline_end": T0_DT}, {}
    )
    old = {name: blob for name, blob in full.frame_bytes().items() if name not in ("boundary", "slices")}
    # A boundary_releases frame written before its budget_share column existed.
    buffer = io.BytesIO()
    pl.DataFrame(
        schema={k: v for k, v in FRAME_SCHEMAS["boundary_releases"].items() if k != "budget_share"}
    ).write_ipc(buffer)
    old["boundary_releases"] = buffer.getvalue()
    loaded = Analysis.from_frame_bytes(
        {"start": T0_DT, "end": T0_DT, "baseline_start": T0_DT, "baseline_end": T0_DT}, old
    )
    for name in ("boundary", "boundary_releases", "slices"):
        assert loaded.frames[name].schema == pl.Schema(FRAME_SCHEMAS[name])
    data = loaded.to_dict()
    assert data["boundary"] == [] and data["slices"] == []
    # A service answering without these sections still renders.
    assert "BOUNDARY" in render_table({k: v for k, v in data.items() if k not in ("boundary", "slices")})


def test_latency_budgets_and_replacement_cost_from_config() -> None:
    conv = Conventions.from_dict(
        {
            "latency_budgets": [
                {"service": "chat-*", "operation": "POST /chat", "budget": "2s"},
                {"operation": "GET /*", "budget_ms": 300},
                ["*", "*", 5000],
            ],
            "sync_llm_replacement_ms": "15ms",
            "flag_events": ["feature_flag.evaluation"],
        }
    )
    assert conv.latency_budgets == (
        ("chat-*", "POST /chat", 2000.0),
        ("*", "GET /*", 300.0),
        ("*", "*", 5000.0),
    )
    assert conv.sync_llm_replacement_ms == 15.0 and conv.flag_events == ("feature_flag.evaluation",)
    assert Conventions.from_dict(json.loads(json.dumps(conv.to_dict()))) == conv
    for bad, message in (
        ({"latency_budgets": [{"service": "*", "budget": "soon"}]}, "invalid duration"),
        ({"latency_budgets": [{"service": "*"}]}, "latency_budgets takes tables"),
        (
            {"latency_budgets": [{"service": "*", "budget": "1s", "budget_ms": 5}]},
            "latency_budgets takes tables",
        ),
        ({"latency_budgets": [{"budget": "1s", "operations": "x"}]}, "latency_budgets takes tables"),
        ({"latency_budgets": [["*", "*", -1]]}, "must be positive"),
        ({"latency_budgets": {"service": "*"}}, "latency_budgets takes tables"),
        ({"sync_llm_replacement_ms": -1.0}, "must not be negative"),
    ):
        with pytest.raises(ConventionsError, match=message):
            Conventions.from_dict(bad)
