"""The straightforward way: read the spans into pandas and compute the same metrics there.

This is what a team writes first: one query pulling every span of both windows (attribute maps as
Python dicts), ``drop_duplicates``, attribute extraction with ``.map``, groupbys, and per-trace
Python for the tree walks. Same conventions and outputs as :func:`analytics.analyze` (frames, not
JSON); the benchmark times it against the real thing.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from storage import Store

LLM_OPS = {"chat", "text_completion", "generate_content", "embeddings"}
WORKFLOW_OPS = {"invoke_workflow", "invoke_agent"}
KINDS = {
    f"SPAN_KIND_{k.upper()}": k
    for k in ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
}
STATUS = {f"STATUS_CODE_{s.upper()}": s for s in ("Unset", "Ok", "Error")}


def _get(column: pd.Series, key: str) -> pd.Series:
    return column.map(lambda d: dict(d).get(key, "") if d is not None else "")


def load(store: Store, lo: datetime, hi: datetime) -> pd.DataFrame:
    frame = store.client.query_df(
        "SELECT TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, "
        "toUnixTimestamp64Nano(Timestamp) AS ts, Duration, StatusCode, SpanAttributes, ResourceAttributes, "
        "`Links.TraceId` AS link_traces, `Links.SpanId` AS link_spans FROM otel_traces "
        "WHERE Timestamp >= {lo:DateTime64(9)} AND Timestamp < {hi:DateTime64(9)}",
        parameters={"lo": lo, "hi": hi},
    )
    frame = frame.drop_duplicates(subset=["TraceId", "SpanId"]).copy()
    frame["kind"] = frame["SpanKind"].replace(KINDS)
    frame["status"] = frame["StatusCode"].replace(STATUS)
    attrs = frame["SpanAttributes"]
    frame["op"] = _get(attrs, "gen_ai.operation.name")
    provider = _get(attrs, "gen_ai.provider.name")
    frame["provider"] = provider.where(provider != "", _get(attrs, "gen_ai.system"))
    frame["model"] = _get(attrs, "gen_ai.request.model")
    path = _get(attrs, "tailwatch.path")
    frame["path"] = path.where(path != "", _get(frame["ResourceAttributes"], "tailwatch.path"))
    frame["version"] = _get(frame["ResourceAttributes"], "service.version")
    frame["http_status"] = _get(attrs, "http.response.status_code")
    frame["abandoned_attr"] = _get(attrs, "tailwatch.abandoned")
    frame["error_type"] = _get(attrs, "error.type")
    frame["resend"] = pd.to_numeric(_get(attrs, "http.request.resend_count"), errors="coerce").fillna(0)
    tokens = pd.Series(0, index=frame.index)
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        tokens += pd.to_numeric(_get(attrs, key), errors="coerce").fillna(0)
    frame["tokens"] = tokens
    frame["queue"] = _get(attrs, "messaging.destination.name")
    frame["is_llm"] = (
        frame["op"].isin(LLM_OPS)
        | ((frame["op"] == "invoke_agent") & (frame["kind"] == "Client"))
        | ((frame["op"] == "") & (frame["provider"] != ""))
    )
    frame["end"] = frame["ts"] + frame["Duration"].astype("int64")
    return frame


def _critical(spans: list[dict[str, Any]]) -> dict[str, int]:
    children = defaultdict(list)
    ids = {s["SpanId"] for s in spans}
    root = None
    for s in spans:
        if s["ParentSpanId"] in ids:
            children[s["ParentSpanId"]].append(s)
        elif root is None or s["ts"] < root["ts"]:
            root = s
    credit: dict[str, int] = defaultdict(int)

    def walk(span: dict[str, Any], lo: int, hi: int) -> None:
        t = hi
        kids = sorted(
            (c for c in children[span["SpanId"]] if c["kind"] != "Consumer"),
            key=lambda c: c["end"],
            reverse=True,
        )
        for c in kids:
            cs, ce = max(c["ts"], lo), min(c["end"], hi)
            if ce <= cs or ce > t:
                continue
            credit[span["SpanId"]] += t - ce
            walk(c, cs, ce)
            t = cs
        credit[span["SpanId"]] += max(0, t - lo)

    if root is not None:
        walk(root, root["ts"], root["end"])
    return credit


def run(
    store: Store, start: datetime, end: datetime, step_window: timedelta = timedelta(hours=1)
) -> dict[str, pd.DataFrame]:
    """Every metric of the current window ``[start, end)`` against the window of equal length before
    (``step_window``: the release step's longest side, the ``release_step_window`` convention)."""
    baseline_start = start - (end - start)
    spans = load(store, baseline_start, end + timedelta(minutes=5))
    s_ns, e_ns, bs_ns = (int(x.timestamp() * 1e9) for x in (start, end, baseline_start))
    roots = hot_roots(spans, s_ns, e_ns, bs_ns)
    current = roots[roots["window"] == "current"]
    window = (spans["ts"] >= s_ns) & (spans["ts"] < e_ns)
    return {
        "hot_path": hot_path(current),
        "releases": releases(spans, roots, e_ns, step_window),
        "cold_path": cold_path(spans, window),
        "abandonment": abandonment(current),
        "retry_hops": retry_hops(spans, window),
        "attribution": attribution(spans, roots),
        "llm_signals": llm_signals(spans, window, roots),
    }


def hot_roots(spans: pd.DataFrame, s_ns: int, e_ns: int, bs_ns: int) -> pd.DataFrame:
    """Hot-path requests of both windows, with their window, abandonment and sync LLM calls."""
    roots = spans[
        (spans["ParentSpanId"] == "") & ((spans["kind"] == "Server") | (spans["path"] == "hot"))
    ].copy()
    roots["window"] = np.where(roots["ts"] >= s_ns, "current", "baseline")
    roots = roots[(roots["ts"] >= bs_ns) & (roots["ts"] < e_ns)]
    roots["duration_ms"] = roots["Duration"] / 1e6
    roots["abandoned"] = roots["http_status"].isin(["499"]) | (roots["abandoned_attr"].str.lower() == "true")
    sync = spans[spans["is_llm"] & (spans["path"] != "cold") & (spans["kind"] != "Consumer")]
    calls = sync.groupby("TraceId").size().rename("sync_llm_calls")
    return roots.merge(calls, left_on="TraceId", right_index=True, how="left").fillna({"sync_llm_calls": 0})


def hot_path(current: pd.DataFrame) -> pd.DataFrame:
    """Requests, percentiles and sync LLM calls per request of each current-window operation."""
    return current.groupby(["ServiceName", "SpanName"]).agg(
        requests=("duration_ms", "size"),
        p50_ms=("duration_ms", lambda x: x.quantile(0.5)),
        p95_ms=("duration_ms", lambda x: x.quantile(0.95)),
        p99_ms=("duration_ms", lambda x: x.quantile(0.99)),
        p999_ms=("duration_ms", lambda x: x.quantile(0.999)),
        sync_llm_calls_per_request=("sync_llm_calls", "mean"),
    )


def releases(
    spans: pd.DataFrame, roots: pd.DataFrame, e_ns: int, step_window: timedelta = timedelta(hours=1)
) -> pd.DataFrame:
    """Each release's own step: its first 1000 requests within ``step_window`` of its first span (not
    past the window's end) against the other versions' requests in as long before it (the last
    1000); naive bootstrap of the p99 delta."""
    rng = np.random.default_rng(1)
    release_rows = []
    first_seen = spans[spans["version"] != ""].groupby(["ServiceName", "version"])["ts"].min()
    for (service, op), group in roots.groupby(["ServiceName", "SpanName"]):
        group = group.sort_values("ts", kind="stable")
        for version in group[group["window"] == "current"]["version"].unique():
            released = int(first_seen.get((service, version), group[group["version"] == version]["ts"].min()))
            hi = min(released + int(step_window.total_seconds() * 1e9), e_ns)
            mine = group[(group["version"] == version) & (group["ts"] >= released) & (group["ts"] < hi)]
            after_rows = mine.head(1000)
            step_end = int(after_rows["ts"].iloc[-1]) + 1000 if len(after_rows) == 1000 else hi
            others = group[
                (group["version"] != version)
                & (group["ts"] >= released - (step_end - released))
                & (group["ts"] < released)
            ]
            before = others.tail(1000)["duration_ms"].to_numpy()
            after = after_rows["duration_ms"].to_numpy()
            if len(before) < 100 or len(after) < 100:
                continue
            deltas = [
                np.quantile(rng.choice(after, len(after)), 0.99)
                - np.quantile(rng.choice(before, len(before)), 0.99)
                for _ in range(200)
            ]
            release_rows.append(
                (
                    service,
                    op,
                    version,
                    np.quantile(after, 0.99) - np.quantile(before, 0.99),
                    *np.quantile(deltas, [0.025, 0.975]),
                )
            )
    return pd.DataFrame(release_rows, columns=["service", "operation", "version", "delta", "lo", "hi"])


def cold_path(spans: pd.DataFrame, window: pd.Series) -> pd.DataFrame:
    """Enqueue-to-ready per queue: producers joined to consumers through links or parents."""
    producers = spans[window & (spans["kind"] == "Producer")][
        ["TraceId", "SpanId", "queue", "SpanName", "ts"]
    ]
    consumers = spans[window & (spans["kind"] == "Consumer")].copy()
    consumers["link"] = [
        list(zip(lt, ls, strict=True)) if len(ls) else [(t, p)]
        for lt, ls, t, p in zip(
            consumers["link_traces"],
            consumers["link_spans"],
            consumers["TraceId"],
            consumers["ParentSpanId"],
            strict=True,
        )
    ]
    consumers = consumers.explode("link")
    consumers["p_trace"] = consumers["link"].map(lambda x: x[0])
    consumers["p_span"] = consumers["link"].map(lambda x: x[1])
    done = consumers.groupby(["p_trace", "p_span"]).agg(started=("ts", "min"), ended=("end", "max"))
    jobs = producers.merge(done, left_on=["TraceId", "SpanId"], right_index=True, how="left")
    jobs["queue"] = jobs["queue"].where(jobs["queue"] != "", jobs["SpanName"])
    jobs["ready_s"] = (jobs["ended"] - jobs["ts"]) / 1e9
    return jobs.groupby("queue").agg(
        jobs=("ts", "size"),
        completed=("ready_s", "count"),
        p50_s=("ready_s", lambda x: x.quantile(0.5)),
        p99_s=("ready_s", lambda x: x.quantile(0.99)),
        p999_s=("ready_s", lambda x: x.quantile(0.999)),
    )


def abandonment(current: pd.DataFrame) -> pd.DataFrame:
    """Requests and abandoned requests per operation and 500 ms bucket."""
    current = current.assign(bucket=(current["duration_ms"] // 500) * 500)
    return current.groupby(["ServiceName", "SpanName", "bucket"]).agg(
        requests=("abandoned", "size"), abandoned=("abandoned", "sum")
    )


def retry_hops(spans: pd.DataFrame, window: pd.Series) -> pd.DataFrame:
    """Attempts of each hop under the workflow span, tokens including descendants."""
    wf_spans = spans[window & spans["op"].isin(WORKFLOW_OPS)].sort_values("ts").drop_duplicates("TraceId")
    wf_traces = spans[spans["TraceId"].isin(wf_spans["TraceId"])]
    hop_rows = []
    wf_of = dict(
        zip(wf_spans["TraceId"], zip(wf_spans["SpanId"], wf_spans["SpanName"], strict=True), strict=True)
    )
    wf_traces = wf_traces.assign(wf_span=wf_traces["TraceId"].map(lambda t: wf_of[t][0]))
    attempts = wf_traces[wf_traces["ParentSpanId"] == wf_traces["wf_span"]]
    attempt_keys = set(zip(attempts["TraceId"], attempts["SpanId"], strict=True))
    parent = dict(
        zip(
            zip(wf_traces["TraceId"], wf_traces["SpanId"], strict=True),
            wf_traces["ParentSpanId"],
            strict=True,
        )
    )
    tokens: dict[tuple[str, str], float] = defaultdict(float)
    for trace_id, span_id, tok in zip(
        wf_traces["TraceId"], wf_traces["SpanId"], wf_traces["tokens"], strict=True
    ):
        cur = span_id
        while cur and (trace_id, cur) not in attempt_keys:
            cur = parent.get((trace_id, cur), "")
        if cur:
            tokens[(trace_id, cur)] += tok
    for (trace_id, hop), g in attempts.groupby(["TraceId", "SpanName"]):
        hop_rows.append((wf_of[trace_id][1], hop, len(g), sum(tokens[(trace_id, i)] for i in g["SpanId"])))
    hops = pd.DataFrame(hop_rows, columns=["workflow", "hop", "attempts", "tokens"])
    return hops.groupby(["workflow", "hop"]).agg(
        calls=("attempts", "size"), attempts=("attempts", "sum"), tokens=("tokens", "sum")
    )


def attribution(spans: pd.DataFrame, roots: pd.DataFrame) -> pd.DataFrame:
    """Critical path of the tail traces of both windows, LLM vs internal."""
    rows = []
    tails = {
        key: w[w["duration_ms"] >= w["duration_ms"].quantile(0.99)].nlargest(1000, "duration_ms")
        for key, w in roots.groupby(["ServiceName", "SpanName", "window"])
    }
    tail_ids = set().union(*(set(t["TraceId"]) for t in tails.values())) if tails else set()
    tail_spans = spans[spans["TraceId"].isin(tail_ids)]
    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in tail_spans.to_dict("records"):
        by_trace[record["TraceId"]].append(record)
    for (service, op), group in roots.groupby(["ServiceName", "SpanName"]):
        means = {}
        for window_name in group["window"].unique():
            tail = tails[(service, op, window_name)]
            llm = internal = 0.0
            for trace_id in tail["TraceId"]:
                records = by_trace[trace_id]
                credit = _critical(records)
                is_llm = {r["SpanId"]: r["is_llm"] for r in records}
                for span_id, ns in credit.items():
                    if is_llm[span_id]:
                        llm += ns
                    else:
                        internal += ns
            means[window_name] = (llm / max(1, len(tail)) / 1e6, internal / max(1, len(tail)) / 1e6)
        if "current" in means and "baseline" in means:
            rows.append(
                (
                    service,
                    op,
                    means["current"][0] - means["baseline"][0],
                    means["current"][1] - means["baseline"][1],
                )
            )
    return pd.DataFrame(rows, columns=["service", "operation", "llm_delta", "internal_delta"])


def llm_signals(spans: pd.DataFrame, window: pd.Series, roots: pd.DataFrame) -> pd.DataFrame:
    """Error, 429, retry and cold-path shares of the current window's LLM spans per provider/model."""
    llm_spans = spans[spans["is_llm"] & window].copy()
    hot_traces = set(roots["TraceId"])
    llm_spans["cold"] = (llm_spans["path"] == "cold") | ~llm_spans["TraceId"].isin(hot_traces)
    llm_spans["err"] = (llm_spans["status"] == "Error") | (llm_spans["error_type"] != "")
    llm_spans["thr"] = llm_spans["http_status"].isin(["429"]) | llm_spans["error_type"].isin(["429"])
    llm_spans["retry"] = (llm_spans["resend"] > 0) | llm_spans.sort_values("ts").duplicated(
        ["TraceId", "ParentSpanId", "SpanName"]
    )
    return llm_spans.groupby(["provider", "model"])[["err", "thr", "retry", "cold"]].mean()
