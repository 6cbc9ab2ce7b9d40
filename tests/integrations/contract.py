"""The assertions every flavour's test module runs: tailwatch's analysis of the stored spans equals the
truth computed from the spans the SDK produced (:mod:`tests.integrations.truth`).

A test module sets ``FLAVOUR`` and subclasses :class:`FlavourContract`; the fixtures are those of
``conftest.py``. Each failure lists every differing value as ``tailwatch … truth …``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from collectors.schema import span_kind_sql, status_code_sql
from tests.integrations.apps.base import CHAT_MODEL, QUEUE, SUPPORT_MODEL, WORKFLOW
from tests.integrations.ingest import FlavourRun
from tests.integrations.truth import Truth, is_http_attempt, is_llm, is_workflow

__all__ = ["FlavourContract", "assert_rows", "hop_names", "llm_span_shapes", "workflow_span_shapes"]

_MISSING = object()


def _same(actual: Any, expected: Any) -> bool:
    if expected is None or actual is None:
        return actual is None and expected is None
    if isinstance(expected, bool) or isinstance(actual, bool):
        return actual == expected
    if isinstance(expected, int) and isinstance(actual, int):
        return actual == expected
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        return math.isclose(float(actual), float(expected), rel_tol=1e-9, abs_tol=1e-9)
    return bool(actual == expected)


def assert_rows(
    label: str,
    actual: Mapping[Any, Mapping[str, Any]],
    expected: Mapping[Any, Mapping[str, Any]],
    fields: Iterable[str],
) -> None:
    """Every key of both sides present in both, and every field equal (floats to 1e-9)."""
    fields = list(fields)
    problems = []
    for key in sorted(set(expected) | set(actual), key=repr):
        a, e = actual.get(key), expected.get(key)
        if e is None:
            problems.append(f"  {key}: reported by tailwatch, not in the truth: {dict(a or {})}")
        elif a is None:
            problems.append(f"  {key}: missing from tailwatch; truth { ({f: e.get(f) for f in fields}) }")
        else:
            for f in fields:
                got = a.get(f, _MISSING)
                if got is _MISSING:
                    problems.append(f"  {key} {f}: absent from tailwatch's output; truth {e[f]!r}")
                elif not _same(got, e[f]):
                    problems.append(f"  {key} {f}: tailwatch {got!r}, truth {e[f]!r}")
    assert not problems, f"{label}:\n" + "\n".join(problems)


def _by(
    rows: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], Any]
) -> dict[Any, Mapping[str, Any]]:
    return {key(r): r for r in rows}


def llm_span_shapes(truth: Truth) -> set[tuple[str, str, str, str]]:
    """(name, kind, scope, where its HTTP attempts are) of every LLM span; the attempts are
    ``children`` (each attempt a CLIENT child), ``siblings`` (no attempt below it, but HTTP attempts
    that are not LLM spans start beside it: the instrumentation did not make its span current) or
    ``none``."""
    out = set()
    for s in truth.spans:
        if not is_llm(s):
            continue
        if truth.http_attempts(s):
            where = "children"
        else:
            parent = truth.parent(s)
            siblings = truth.kids(parent) if parent is not None else []
            beside = [
                k for k in siblings if is_http_attempt(k) and not is_llm(k) and k["start_ns"] >= s["start_ns"]
            ]
            where = "siblings" if beside else "none"
        out.add((s["name"], s["kind"], s["scope"], where))
    return out


def workflow_span_shapes(truth: Truth) -> set[tuple[str, str, str]]:
    """(name, kind, scope) of every workflow span."""
    return {(s["name"], s["kind"], s["scope"]) for s in truth.spans if is_workflow(s)}


def hop_names(truth: Truth) -> set[str]:
    """The names of the workflow spans' direct children, over every run."""
    return {k["name"] for s in truth.spans if is_workflow(s) for k in truth.kids(s)}


class FlavourContract:
    """The shared tests. ``service`` is the flavour's ``service.name``."""

    service: str = ""

    # -- the harness itself ----------------------------------------------------------------
    def test_store_holds_every_span_as_dumped(self, flavour_run: FlavourRun) -> None:
        rows = flavour_run.store.query_rows(
            f"""SELECT DISTINCT TraceId, SpanId, ParentSpanId, SpanName, {span_kind_sql()},
                   toUnixTimestamp64Nano(Timestamp), Duration, ServiceName, {status_code_sql()}
                FROM otel_traces"""
        )
        stored = {(r[0], r[1]): tuple(r[2:]) for r in rows}
        dumped = {
            (s["trace_id"], s["span_id"]): (
                s["parent_span_id"],
                s["name"],
                s["kind"].title(),
                s["start_ns"],
                s["end_ns"] - s["start_ns"],
                s["resource"]["service.name"],
                s["status"].title(),
            )
            for s in flavour_run.spans
        }
        assert len(rows) == len(stored) == len(dumped)
        assert stored == dumped

    def test_scenario_happened(self, truth: Truth, flavour_run: FlavourRun) -> None:
        """The engineered events are in the spans (else the other tests would prove little)."""
        base, cur = flavour_run.baseline_ns, flavour_run.current_ns
        requests = truth.requests(cur)
        assert {op for _, op in requests} == {"POST /chat", "POST /agent", "POST /enqueue", "POST /support"}
        assert all(len(v) >= 25 for v in requests.values())
        calls = truth.llm_calls(cur)
        assert any(c["throttled_attempts"] > 0 for c in calls.values()), "no SDK retry on a 429"
        # Some 429 attempts were retried into a success: a call the user met no error on.
        assert any(c["throttled_attempts"] > c["failed_calls"] for c in calls.values()), (
            "no call won after a 429"
        )
        assert any(c["cold_calls"] > 0 for c in calls.values()), "no LLM call under a consumer"
        wf = truth.workflows(cur)[WORKFLOW]
        assert wf["attempt_amplification"] > 1 and wf["token_amplification"] > 1
        queue = truth.queues(cur)[QUEUE]
        assert queue["runs"] > queue["jobs"] == queue["completed"], "no task retried itself"
        before, after = truth.hot_path(base), truth.hot_path(cur)
        for op in ("POST /chat", "POST /support"):
            key = (self.service, op)
            assert after[key]["p99_ms"] > before[key]["p99_ms"] + 100, f"{op} did not slow down"

    # -- the analysis against the truth ----------------------------------------------------
    def test_requests_and_p99_per_operation(
        self, analysis: dict[str, Any], truth: Truth, flavour_run: FlavourRun
    ) -> None:
        actual = _by(analysis["hot_path"], lambda r: (r["service"], r["operation"]))
        assert_rows("hot path", actual, truth.hot_path(flavour_run.current_ns), ["requests", "p99_ms"])

    def test_sync_llm_calls_per_request(
        self, analysis: dict[str, Any], truth: Truth, flavour_run: FlavourRun
    ) -> None:
        actual = _by(analysis["hot_path"], lambda r: (r["service"], r["operation"]))
        assert_rows(
            "synchronous LLM calls per request",
            actual,
            truth.hot_path(flavour_run.current_ns),
            ["sync_llm_calls_per_request"],
        )

    def test_llm_calls(self, analysis: dict[str, Any], truth: Truth, flavour_run: FlavourRun) -> None:
        actual = _by(analysis.get("llm_calls", []), lambda r: (r["provider"], r["model"]))
        assert_rows(
            "llm_calls",
            actual,
            truth.llm_calls(flavour_run.current_ns),
            [
                "calls",
                "sync_calls",
                "cold_calls",
                "attempts",
                "failed_attempts",
                "throttled_attempts",
                "failed_calls",
                "error_rate",
                "failed_attempt_rate",
                "throttle_rate",
                "retry_rate",
                "cold_share",
                "tokens",
                "backoff_ms",
            ],
        )

    def test_workflow_retry_amplification(
        self, analysis: dict[str, Any], truth: Truth, flavour_run: FlavourRun
    ) -> None:
        expected = truth.workflows(flavour_run.current_ns)
        actual = _by(analysis["retry_amplification"], lambda r: r["workflow"])
        assert_rows("workflows", actual, expected, ["runs", "attempt_amplification", "token_amplification"])
        for name, wf in expected.items():
            hops = _by(actual[name]["hops"], lambda r: r["hop"])
            assert_rows(f"hops of {name}", hops, wf["hops"], ["calls", "attempts", "retry_rate", "tokens"])

    def test_queue_jobs(self, analysis: dict[str, Any], truth: Truth, flavour_run: FlavourRun) -> None:
        actual = _by(analysis["cold_path"], lambda r: r["queue"])
        assert_rows(
            "cold path queues",
            actual,
            truth.queues(flavour_run.current_ns),
            ["jobs", "completed", "pending", "runs", "p50_s", "p99_s"],
        )

    def _verdict(self, analysis: dict[str, Any], operation: str) -> tuple[str | None, dict[str, Any]]:
        for row in analysis["attribution"]:
            if (row["service"], row["operation"]) == (self.service, operation):
                summary = {k: row[k] for k in ("baseline_p99_ms", "current_p99_ms", "delta_ms", "llm_share")}
                return row["verdict"], {**summary, "top_spans": row["top_spans"][:4]}
        return None, {}

    def test_attribution_llm_for_provider_slowdown(self, analysis: dict[str, Any]) -> None:
        # The mock made CHAT_MODEL slower; /chat's code is unchanged.
        verdict, row = self._verdict(analysis, "POST /chat")
        assert verdict == "llm", f"{CHAT_MODEL} slowed down, verdict {verdict}: {row}"

    def test_attribution_internal_for_app_slowdown(self, analysis: dict[str, Any]) -> None:
        # /support sleeps longer in its own span; SUPPORT_MODEL is unchanged.
        verdict, row = self._verdict(analysis, "POST /support")
        assert verdict == "internal", (
            f"app code slowed down ({SUPPORT_MODEL} unchanged), verdict {verdict}: {row}"
        )
