"""Hand-built ``analytics.Analysis`` frames with known values.

The figures are pure functions of these frames, so their tests need no store: every number drawn
can be checked against the row it came from. ``HOSTILE`` names appear in every string column a
span can set, to prove nothing in them is interpreted as markup.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl

from analytics import FRAME_SCHEMAS, Analysis, DriftFinding, DriftReport
from tests.dashboards.llm_frames import with_sample_llm

HOSTILE = "<img src=x onerror=alert(1)>"
HOSTILE_FLAG = '<img src=x onerror="window.__xss=1">'
HOSTILE_TEMPLATE = "op %{x} 'quoted' & <b>bold</b>"

START = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
END = START + timedelta(hours=4)
BUCKET = timedelta(minutes=10)


def _buckets() -> list[datetime]:
    n = int((END - START) / BUCKET)
    return [START + i * BUCKET for i in range(n)]


def sample_analysis(hostile: bool = True) -> Analysis:
    """Two hot operations (one with a release that adds an LLM call), two queues (one starved), an
    abandonment cliff at 2000 ms, a 3-hop workflow at 5% retries, an LLM and an internal regression."""
    svc = "chat-api"
    op_llm = HOSTILE if hostile else "POST /chat"
    op_int = HOSTILE_TEMPLATE if hostile else "GET /search"
    span_hostile = HOSTILE_FLAG if hostile else "db.query"
    queue_bad = HOSTILE if hostile else "doc-summaries"
    workflow = HOSTILE_FLAG if hostile else "claims-triage"
    buckets = _buckets()
    release_at = START + timedelta(hours=2)
    series_rows = []
    for i, b in enumerate(buckets):
        after = b >= release_at
        series_rows.append(
            (
                svc,
                op_llm,
                b,
                100 + i,
                400.0 + i,
                900.0 + i,
                (2100.0 if after else 1300.0) + i,
                2.0 if after else 1.0,
            )
        )
        series_rows.append((svc, op_int, b, 50 + i, 120.0, 300.0, 450.0 + 2 * i, 0.0))
    hot_path_series = pl.DataFrame(
        series_rows,
        schema={
            "service": pl.String,
            "operation": pl.String,
            "bucket_start": pl.Datetime("us", "UTC"),
            "requests": pl.Int64,
            "p50_ms": pl.Float64,
            "p95_ms": pl.Float64,
            "p99_ms": pl.Float64,
            "sync_llm_calls_per_request": pl.Float64,
        },
        orient="row",
    )
    hot_path = pl.DataFrame(
        {
            "service": [svc, svc],
            "operation": [op_llm, op_int],
            "requests": [5000, 2500],
            "p50_ms": [410.0, 120.0],
            "p95_ms": [920.0, 300.0],
            "p99_ms": [2050.0, 470.0],
            "p999_ms": [2600.0, 520.0],
            "sync_llm_calls_per_request": [1.5, 0.0],
        }
    )
    releases = pl.DataFrame(
        {
            "service": [svc, svc, svc],
            "operation": [op_llm, op_llm, op_int],
            "version": ["1.4.0", HOSTILE if hostile else "1.5.0", "2.0.1"],
            "released_at": [START + timedelta(hours=1), release_at, START + timedelta(hours=3)],
            "requests_before": [1200, 2400, 1800],
            "requests_after": [1300, 2600, 700],
            "p99_before_ms": [1290.0, 1310.0, 460.0],
            "p99_after_ms": [1305.0, 2110.0, 470.0],
            "p99_delta_ms": [15.0, 800.0, 10.0],
            "significant": [False, True, False],
            "sync_llm_calls_per_request_before": [1.0, 1.0, 0.0],
            "sync_llm_calls_per_request_after": [1.0, 2.0, 0.0],
        },
        schema_overrides={"released_at": pl.Datetime("us", "UTC")},
    )
    release_coupling = pl.DataFrame(
        {
            "service": [svc, svc],
            "operation": [op_llm, op_int],
            "releases": [2, 1],
            "spearman_rho": [1.0, None],
            "p99_slope_ms_per_release": [800.0, None],
            "coupled": [True, False],
        },
        schema_overrides={"spearman_rho": pl.Float64, "p99_slope_ms_per_release": pl.Float64},
    )
    cold_path = pl.DataFrame(
        {
            "queue": [queue_bad, "exports"],
            "jobs": [900, 300],
            "completed": [880, 300],
            "pending": [20, 0],
            "p50_s": [3.0, 1.0],
            "p95_s": [60.0, 1.8],
            "p99_s": [180.0, 2.0],
            "p999_s": [240.0, 2.5],
            "queue_wait_p99_s": [170.0, 0.5],
            "processing_p99_s": [9.0, 1.6],
            "p99_over_p50": [60.0, 2.0],
            "starved": [True, False],
            "runs": [900, 300],
            "retried_jobs": [0, 0],
            # The starved queue was healthy in the baseline window; exports ran the same.
            "baseline_jobs": [850, 310],
            "baseline_p50_s": [2.5, 1.0],
            "baseline_p99_s": [8.0, 2.1],
            "baseline_queue_wait_p99_s": [4.0, 0.5],
            "baseline_processing_p99_s": [7.5, 1.5],
        }
    )
    cold_series_rows = []
    for i, b in enumerate(buckets):
        cold_series_rows.append((queue_bad, b, 30, 29, i % 5, 3.0, 150.0 + i, 2.0, 1.0))
        cold_series_rows.append(("exports", b, 10, 10, 0, 1.0, 2.0, 0.2, 0.8))
    cold_path_series = pl.DataFrame(
        cold_series_rows,
        schema={
            "queue": pl.String,
            "bucket_start": pl.Datetime("us", "UTC"),
            "jobs": pl.Int64,
            "completed": pl.Int64,
            "pending": pl.Int64,
            "p50_s": pl.Float64,
            "p99_s": pl.Float64,
            "queue_wait_p50_s": pl.Float64,
            "processing_p50_s": pl.Float64,
        },
        orient="row",
    )
    cdf_x = [0.5 * (1.25**k) for k in range(30)]
    cold_path_cdf = pl.DataFrame(
        {
            "queue": [queue_bad] * 30 + ["exports"] * 30,
            "enqueue_to_ready_s": cdf_x + [x / 10 for x in cdf_x],
            "cdf": [(k + 1) / 30 for k in range(30)] * 2,
            "window": ["current"] * 60,
        }
    )
    cold_path_cdf = pl.concat(
        [
            cold_path_cdf,
            cold_path_cdf.with_columns(pl.col("enqueue_to_ready_s") / 8, pl.lit("baseline").alias("window")),
        ]
    )
    lo = list(range(0, 4000, 500))
    requests = [400, 900, 1200, 800, 500, 300, 150, 50]
    abandoned = [2, 5, 6, 4, 60, 45, 30, 12]
    rate = [a / n for a, n in zip(abandoned, requests, strict=True)]
    abandonment = pl.DataFrame(
        {
            "service": [svc] * 8,
            "operation": [op_llm] * 8,
            "lo_ms": lo,
            "hi_ms": [x + 500 for x in lo],
            "requests": requests,
            "abandoned": abandoned,
            "rate": rate,
            "rate_low": [max(0.0, r - 0.01) for r in rate],
            "rate_high": [r + 0.02 for r in rate],
        }
    )
    abandonment_summary = pl.DataFrame(
        {
            "service": [svc],
            "operation": [op_llm],
            "requests": [sum(requests)],
            "abandoned": [sum(abandoned)],
            "rate": [sum(abandoned) / sum(requests)],
            "cliff_ms": [2000],
            "p99_ms": [2050.0],
        },
        schema_overrides={"cliff_ms": pl.Int64},
    )
    hops = ["plan", span_hostile, "answer"]
    retry_hops = pl.DataFrame(
        {
            "workflow": [workflow] * 3,
            "hop": hops,
            "hop_index": [1, 2, 3],
            "calls": [1000, 1000, 1000],
            "attempts": [1050, 1050, 1050],
            "retry_rate": [0.05, 0.05, 0.05],
            "tokens": [210_000, 315_000, 420_000],
        }
    )
    retry_amplification = pl.DataFrame(
        {
            "workflow": [workflow],
            "runs": [1000],
            "attempt_amplification": [1.157],
            "token_amplification": [1.162],
            "modeled_amplification": [1.05**3],
            "exemplar_trace_id": ["0af7651916cd43dd8448eb211c80319c"],
            "baseline_runs": [980],
            "baseline_attempt_amplification": [1.02],
            "baseline_token_amplification": [1.03],
        }
    )
    attribution = pl.DataFrame(
        {
            "service": [svc, svc],
            "operation": [op_llm, op_int],
            "baseline_p99_ms": [1300.0, 300.0],
            "current_p99_ms": [2100.0, 470.0],
            "delta_ms": [800.0, 170.0],
            "llm_share": [0.9, 0.05],
            "internal_share": [0.1, 0.95],
            "verdict": ["llm", "internal"],
            "llm_delta_ms": [720.0, 8.5],
            "internal_delta_ms": [80.0, 161.5],
            "baseline_requests": [2400, 1200],
            "current_requests": [2600, 1300],
            "exemplar_trace_ids": [["a" * 32, "b" * 32], ["c" * 32]],
        }
    )
    attribution_spans = pl.DataFrame(
        {
            "service": [svc, svc, svc, svc],
            "operation": [op_llm, op_llm, op_int, op_int],
            "span_name": ["chat gpt-4o", span_hostile, span_hostile, "embeddings"],
            "class": ["llm", "internal", "internal", "llm"],
            "provider": ["openai", None, None, "openai"],
            "model": ["gpt-4o", None, None, HOSTILE if hostile else "text-embedding-3"],
            "delta_ms": [700.0, 60.0, 150.0, 8.5],
        },
        schema_overrides={"provider": pl.String, "model": pl.String},
    )
    llm_signals = pl.DataFrame(
        {
            "service": [svc],
            "operation": [op_llm],
            "provider": ["openai"],
            "model": ["gpt-4o"],
            "error_rate_baseline": [0.01],
            "error_rate_current": [0.02],
            "throttle_rate_baseline": [0.0],
            "throttle_rate_current": [0.12],
            "retry_rate_baseline": [0.01],
            "retry_rate_current": [0.1],
            "cold_share_baseline": [0.05],
            "cold_share_current": [0.4],
            "failed_attempt_rate_baseline": [0.003],
            "failed_attempt_rate_current": [0.004],
        }
    )
    # The LLM operation is over its cliff budget and would be within it without its model call; the
    # other is within budget. A flag splits the LLM operation into a sync control and an async variant.
    boundary = pl.DataFrame(
        [
            (
                svc,
                op_llm,
                2000,
                2100.0,
                2000.0,
                "cliff",
                40,
                320.0,
                2.0,
                650.0,
                0,
                55.0,
                "move_off_hot_path",
                ["p99 2,100 ms ≥ budget 2,000 ms (cliff)"],
                2000,
                2000.0,
                False,
                "timeout_fallback T=p95 F=50ms",
            ),
            (
                svc,
                op_int,
                1000,
                450.0,
                900.0,
                "config",
                0,
                0.0,
                0.0,
                450.0,
                0,
                None,
                "keep",
                ["p99 450 ms < budget 900 ms (config)"],
                1000,
                1000.0,
                False,
                None,
            ),
        ],
        schema=FRAME_SCHEMAS["boundary"],
        orient="row",
    )
    # The LLM operation's what-if options, as analytics.what_if reports them without a price table (no
    # cost), against its p99 of 2,100 ms and budget of 2,000 ms. Under the budget: the hedge (5% more
    # tokens) and, at no extra tokens or calls, the timeout, the cheaper model and moving the calls
    # off — of which the boundary recommends the timeout. The other model's name is hostile.
    options = [
        # option, parameter, p99, abandoned saved/day, extra calls, extra tokens
        ("hedge", "T=p95", 1700.0, 60.0, 0.05, 0.05),
        ("hedge", "T=p80 best≤10% tokens", 1650.0, 70.0, 0.2, 0.2),
        ("timeout_fallback", "T=p95 F=50ms", 1800.0, 50.0, 0.0, 0.0),
        ("route_model", f"openai/{HOSTILE_TEMPLATE if hostile else 'gpt-4o'}", 2300.0, -10.0, 0.0, 0.0),
        ("route_model", "openai/gpt-4o-mini", 1900.0, 30.0, 0.0, 0.0),
        ("move_off_hot_path", "replacement=0ms", 650.0, 120.0, 0.0, 0.0),
    ]
    what_if = pl.DataFrame(
        {
            "service": [svc] * len(options),
            "operation": [op_llm] * len(options),
            "option": [o[0] for o in options],
            "parameter": [o[1] for o in options],
            "requests": [2000] * len(options),
            "budget_ms": [2000.0] * len(options),
            "p99_ms": [o[2] for o in options],
            "p99_delta_ms": [o[2] - 2100.0 for o in options],
            "requests_over_budget": [300.0 if o[2] >= 2000.0 else 100.0 for o in options],
            "abandoned_saved_per_day": [o[3] for o in options],
            "extra_calls_ratio": [o[4] for o in options],
            "extra_tokens_ratio": [o[5] for o in options],
            # As an analysis from before the absolute figure existed: the chart falls back to the share.
            "extra_tokens_per_day": [None] * len(options),
            "extra_cost_per_day": [None] * len(options),
            "assumption": [f"{o[0]}: independent draws from the same window" for o in options],
        },
        schema=FRAME_SCHEMAS["what_if"],
    )
    flag = HOSTILE_FLAG if hostile else "summarize-off-hot-path"
    slices = pl.DataFrame(
        [
            (
                svc,
                op_llm,
                flag,
                "sync",
                "sync",
                True,
                700,
                900.0,
                2100.0,
                0.12,
                0.10,
                0.15,
                1.0,
                None,
                None,
                None,
                None,
                None,
                None,
                0,
            ),
            (
                svc,
                op_llm,
                flag,
                "sync",
                "async",
                False,
                300,
                20.0,
                25.0,
                0.02,
                0.01,
                0.04,
                0.0,
                10.7,
                -2075.0,
                -0.10,
                True,
                True,
                True,
                290,
            ),
        ],
        schema=FRAME_SCHEMAS["slices"],
        orient="row",
    )
    analysis = Analysis(
        drift=sample_drift(hostile),
        start=START,
        end=END,
        baseline_start=START - (END - START),
        baseline_end=START,
        boundary=boundary,
        what_if=what_if,
        slices=slices,
        hot_path=hot_path,
        releases=releases,
        release_coupling=release_coupling,
        hot_path_series=hot_path_series,
        cold_path=cold_path,
        cold_path_series=cold_path_series,
        cold_path_cdf=cold_path_cdf,
        abandonment=abandonment,
        abandonment_summary=abandonment_summary,
        retry_hops=retry_hops,
        retry_amplification=retry_amplification,
        attribution=attribution,
        attribution_spans=attribution_spans,
        llm_signals=llm_signals,
    )
    # Two models' call anatomy and the llm verdict's cause, computed by analytics from call rows.
    return with_sample_llm(analysis, HOSTILE_TEMPLATE if hostile else "claude-sonnet-4")


# Extra cost a day (USD) per what-if option of the sample, as with a price table: the hedges pay for
# their tokens, the cheaper model saves money, the other model has no price (its cost unknown).
PRICES = {
    "T=p95": 12.4,
    "T=p80 best≤10% tokens": 49.6,
    "T=p95 F=50ms": 0.0,
    "openai/gpt-4o-mini": -3.1,
    "replacement=0ms": 0.0,
}


def priced(analysis: Analysis) -> Analysis:
    """The analysis with an ``extra_cost_per_day`` on its what-if options (:data:`PRICES`)."""
    cost = pl.col("parameter").replace_strict(PRICES, default=None, return_dtype=pl.Float64)
    return replace(analysis, what_if=analysis.what_if.with_columns(cost.alias("extra_cost_per_day")))


DRIFT_DAYS = 14
DRIFT_EDGE_DAYS = 3


def sample_drift(hostile: bool = True) -> DriftReport:
    """A drift report over the 14 days before ``END``: a shared function whose hot-path share goes
    from 0 to 40% on day 9 (in a critical service, which also has no latency target) and a queue
    whose backlog grows by 30 jobs a day from day 10."""
    days = DRIFT_DAYS
    start = END - timedelta(days=days)
    day = [start + timedelta(days=d) for d in range(days)]
    function = HOSTILE if hostile else "summarise_document (summaries.summarise)"
    queue = HOSTILE_FLAG if hostile else "doc-index"
    hot = [0] * 9 + [40] * 5
    cold = [100] * 9 + [60] * 5
    shared = DriftFinding(
        "shared_operation",
        "summary-api",
        function,
        "",
        day[9],
        {
            "hot_share_then": 0.0,
            "hot_share_now": 0.4,
            "hot_calls_per_day_then": 0.0,
            "hot_calls_per_day_now": 40.0,
            "hot_p99_ms_now": 900.0,
        },
        "critical",
        [
            {
                "day": day[d],
                "hot_calls": hot[d],
                "cold_calls": cold[d],
                "hot_share": hot[d] / (hot[d] + cold[d]),
                "hot_p99_ms": 900.0 if hot[d] else None,
                "cold_p99_ms": 2000.0,
            }
            for d in range(days)
        ],
        since_release=HOSTILE_TEMPLATE if hostile else "0.3.0",
    )
    target = DriftFinding(
        "no_latency_target",
        "summary-api",
        "POST /summaries/now",
        "",
        day[9],
        {"requests": 200, "requests_per_day_now": 40.0, "p99_ms_now": 950.0},
        "critical",
        [{"day": day[d], "requests": hot[d], "p99_ms": 950.0 if hot[d] else None} for d in range(days)],
    )
    enqueued = [50] * 10 + [80] * 4
    backlog = [0] * 10 + [30, 60, 90, 120]
    unbounded = DriftFinding(
        "queue_unbounded",
        "",
        "",
        queue,
        day[10],
        {
            "enqueued_per_day_then": 50.0,
            "enqueued_per_day_now": 80.0,
            "completed_per_day_then": 50.0,
            "completed_per_day_now": 50.0,
            "backlog_now": 120.0,
            "backlog_slope_per_day": 30.0,
        },
        "warning",
        [
            {"day": day[d], "enqueued": enqueued[d], "completed": 50, "backlog": float(backlog[d])}
            for d in range(days)
        ],
    )
    return DriftReport((shared, unbounded, target), END, days, DRIFT_EDGE_DAYS)


def sample_alerts(hostile: bool = True) -> pl.DataFrame:
    op = HOSTILE if hostile else "POST /chat"
    return pl.DataFrame(
        {
            "fingerprint": ["f1", "f1", "f2"],
            "alertname": ["HotPathP99Regression", "HotPathP99Regression", "ColdPathStarvation"],
            "status": ["firing", "resolved", "firing"],
            "at": [
                START + timedelta(hours=2, minutes=10),
                START + timedelta(hours=3),
                START + timedelta(hours=1),
            ],
            "cause": ["llm", "llm", HOSTILE_FLAG if hostile else "queue"],
            "service": ["chat-api", "chat-api", ""],
            "operation": [op, op, ""],
            "summary": ["p99 +800 ms, 90% LLM", "back to normal", "p99/p50 60x"],
        },
        schema_overrides={"at": pl.Datetime("us", "UTC")},
    )


def empty_like(analysis: Analysis) -> Analysis:
    """The same analysis with every frame emptied (a window with no traffic)."""
    frames = {
        name: getattr(analysis, name).clear()
        for name in (
            "hot_path",
            "releases",
            "release_coupling",
            "hot_path_series",
            "cold_path",
            "cold_path_series",
            "cold_path_cdf",
            "abandonment",
            "abandonment_summary",
            "retry_hops",
            "retry_amplification",
            "attribution",
            "attribution_spans",
            "llm_signals",
        )
    }
    return Analysis(
        start=analysis.start,
        end=analysis.end,
        baseline_start=analysis.baseline_start,
        baseline_end=analysis.baseline_end,
        **frames,
    )


def oncall_alerts(hostile: bool = True) -> pl.DataFrame:
    """An alert history in ``slo_rules.alert_history``'s columns with one alert of every kind: four
    firing at the window's end (one written twice), three resolved (one fired before the window)."""
    op = HOSTILE if hostile else "POST /chat"
    queue = HOSTILE if hostile else "doc-summaries"
    workflow = HOSTILE_FLAG if hostile else "claims-triage"
    at = [START + timedelta(minutes=m) for m in range(0, 240, 10)]
    rows = [
        # fingerprint, alertname, status, at, cause, service, operation, summary, severity, queue,
        # workflow, path
        ("p99", "hot-path-p99-regression", "firing", at[13], "llm", "chat-api", op,
         "chat-api: p99 1,300 ms → 2,100 ms (+800 ms); 90% LLM (openai gpt-4o +700 ms)", "page", "", "",
         "hot"),
        ("p99", "hot-path-p99-regression", "firing", at[19], "llm", "chat-api", op,
         "chat-api: p99 1,300 ms → 2,100 ms (+800 ms); 90% LLM (openai gpt-4o +700 ms)", "page", "", "",
         "hot"),
        ("cold", "cold-path-starvation", "firing", at[6], "none", "", "", f"queue {queue} starved: "
         "enqueue-to-ready p50 3.0 s, p99 180.0 s (p99/p50 60× (limit 20×))", "ticket", queue, "", "cold"),
        ("rel", "hot-path-release-coupling", "firing", at[12], HOSTILE_TEMPLATE if hostile else "llm",
         "chat-api", op, "chat-api POST /chat: release 1.5.0 added 1.0 synchronous LLM calls per request "
         "(1.0 → 2.0)", "ticket", "", "", "hot"),
        ("ab", "hot-path-abandonment", "firing", at[15], "llm", "chat-api", op,
         "chat-api POST /chat: 12.0% of requests abandoned (limit 10.0%), cliff at 2,000 ms", "ticket", "",
         "", "hot"),
        ("retry", "workflow-retry-amplification", "firing", at[3], "none", "", "",
         f"workflow {workflow}: attempts ×1.157 (limit ×1.10) over 1000 runs", "ticket", "", workflow, ""),
        ("retry", "workflow-retry-amplification", "resolved", at[9], "none", "", "",
         f"workflow {workflow}: attempts ×1.157 (limit ×1.10) over 1000 runs", "ticket", "", workflow, ""),
        ("slice", "flag-slice-regression", "firing", at[1], "latency", "chat-api", op,
         "chat-api POST /chat: variant async of flag f is worse than control sync on p99: p99 25 ms vs "
         "20 ms (+5 ms)", "ticket", "", "", "hot"),
        ("slice", "flag-slice-regression", "resolved", at[20], "latency", "chat-api", op,
         "chat-api POST /chat: variant async of flag f is worse than control sync on p99: p99 25 ms vs "
         "20 ms (+5 ms)", "ticket", "", "", "hot"),
        ("old", "hot-path-p99-regression", "resolved", at[2], "internal", "chat-api", "GET /search",
         "chat-api: p99 300 ms → 470 ms (+170 ms); 95% internal", "page", "", "", "hot"),
    ]  # fmt: skip
    return pl.DataFrame(
        rows,
        schema={
            "fingerprint": pl.String,
            "alertname": pl.String,
            "status": pl.String,
            "at": pl.Datetime("ms", "UTC"),
            "cause": pl.String,
            "service": pl.String,
            "operation": pl.String,
            "summary": pl.String,
            "severity": pl.String,
            "queue": pl.String,
            "workflow": pl.String,
            "path": pl.String,
        },
        orient="row",
    )
