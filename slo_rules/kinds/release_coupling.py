"""``release_coupling``: a release that added synchronous LLM calls or stepped p99 up, or a p99 that
rises with releases (the analytics' coupled trend)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from analytics import Analysis
from slo_rules.annotate import fmt_ms, signed_ms
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish, instant
from slo_rules.rules import ReleaseCouplingRule
from storage import format_duration

__all__ = ["candidates"]

Key = tuple[str, str]  # (service, operation)
Finding = tuple[datetime, str, dict[str, Any]]  # (released at, sentence, release row)


def candidates(rule: ReleaseCouplingRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    findings = _release_findings(rule, analysis, start, end)
    trend = _coupled_trends(rule, analysis) if rule.coupled_trend else {}
    keys = set(findings) | set(trend)
    out: list[Candidate] = []
    for service, operation in sorted(keys):
        found = sorted(findings.get((service, operation), []), key=lambda f: f[0])
        coupled = trend.get((service, operation))
        active = bool(found) or coupled is not None
        labels = alert_labels(rule, rule.severity, service=service, operation=operation, path="hot")

        def annotate(
            service: str = service,
            operation: str = operation,
            found: list[Finding] = found,
            coupled: dict[str, Any] | None = coupled,
        ) -> dict[str, str]:
            parts = []
            # Several findings for one release (more LLM calls *and* a p99 step) read as one clause.
            seen_versions: dict[str, list[str]] = {}
            for _, text, row in found:
                seen_versions.setdefault(str(row.get("version")), []).append(text)
            for texts in seen_versions.values():
                parts.append(" and ".join([texts[0], *[t.split(" ", 2)[2] for t in texts[1:]]]))
            extra: dict[str, str] = {"dashboard": ctx.dashboard("hot_path")}
            if coupled is not None:
                parts.append(
                    f"p99 rises with releases (Spearman ρ {float(coupled.get('spearman_rho') or 0):.2f}, "
                    f"{float(coupled.get('p99_slope_ms_per_release') or 0):+.0f} ms per release over "
                    f"{coupled.get('releases')} releases)"
                )
                extra["spearman_rho"] = f"{float(coupled.get('spearman_rho') or 0):.3f}"
                extra["p99_slope_ms_per_release"] = (
                    f"{float(coupled.get('p99_slope_ms_per_release') or 0):.1f}"
                )
            attribution: dict[str, str] = {}
            if found:
                released, _, row = found[-1]
                extra["release"] = str(row.get("version"))
                extra["released_at"] = released.isoformat()
                extra["sync_llm_calls_per_request"] = (
                    f"{float(row.get('sync_llm_calls_per_request_before') or 0):.2f} → "
                    f"{float(row.get('sync_llm_calls_per_request_after') or 0):.2f}"
                )
                # The attribution compares what the step compares: the requests just before the
                # release and its first requests after it.
                step_start, step_end = instant(row.get("step_start")), instant(row.get("step_end"))
                before = (step_start, released) if step_start is not None else None
                attribution = ctx.attribution(released, step_end or ctx.at, service, operation, before)
            head = f"{service} {operation}: " + "; ".join(parts)
            return finish(extra, head, attribution, rule, own_p99=True)

        reason = "; ".join(text for _, text, _ in found) or _quiet(analysis, service, operation, start, end)
        if coupled is not None:
            reason += "; p99 rises with releases"
        out.append(Candidate(rule, labels, active, annotate, reason=reason))
    if not out:
        ctx.note(rule, f"no release of a selected operation in the last {format_duration(rule.window)}")
    return out


def _quiet(analysis: Analysis, service: str, operation: str, start: datetime, end: datetime) -> str:
    """What the operation's releases in the window did, when none of it is a finding."""
    texts = []
    for row in analysis.releases.iter_rows(named=True):
        released = instant(row.get("released_at"))
        if (row["service"], row["operation"]) != (service, operation) or released is None:
            continue
        if not start <= released < end:
            continue
        delta = row.get("p99_delta_ms")
        step = "no step (nothing before it)" if delta is None else f"p99 step {signed_ms(float(delta))}"
        if delta is not None and not row.get("significant"):
            step += (
                f" not significant ({row.get('requests_before')} requests before, "
                f"{row.get('requests_after')} after)"
            )
        before = row.get("sync_llm_calls_per_request_before")
        after = float(row.get("sync_llm_calls_per_request_after") or 0.0)
        calls = "" if before is None else f", sync LLM calls {float(before):.1f} → {after:.1f}"
        texts.append(f"release {row.get('version')}: {step}{calls}")
    return "; ".join(texts) or "no release in the window; p99 not coupled to releases"


def _release_findings(
    rule: ReleaseCouplingRule, analysis: Analysis, start: datetime, end: datetime
) -> dict[Key, list[Finding]]:
    """Per selected operation released in the window: what its releases did (possibly nothing)."""
    findings: dict[Key, list[Finding]] = {}
    for row in analysis.releases.iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        released = instant(row.get("released_at"))
        if not rule.selects(*key) or released is None or not start <= released < end:
            continue
        mine = findings.setdefault(key, [])
        raw_before = row.get("sync_llm_calls_per_request_before")
        before = float(raw_before or 0.0)
        after = float(row.get("sync_llm_calls_per_request_after") or 0.0)
        version = str(row.get("version"))
        # The first version seen has nothing before it: no "added calls" without a comparison.
        if raw_before is not None and after - before >= rule.min_sync_llm_increase:
            mine.append(
                (
                    released,
                    f"release {version} added {after - before:.1f} synchronous LLM calls per request "
                    f"({before:.1f} → {after:.1f})",
                    row,
                )
            )
        delta = float(row.get("p99_delta_ms") or 0.0)
        if rule.significant_step and bool(row.get("significant")) and delta > 0:
            mine.append(
                (
                    released,
                    f"release {version} stepped p99 up {fmt_ms(row.get('p99_before_ms'))} → "
                    f"{fmt_ms(row.get('p99_after_ms'))}",
                    row,
                )
            )
    return findings


def _coupled_trends(rule: ReleaseCouplingRule, analysis: Analysis) -> dict[Key, dict[str, Any] | None]:
    """Per selected operation with a trend row: the row when p99 is coupled to releases, else None."""
    trends: dict[Key, dict[str, Any] | None] = {}
    for row in analysis.release_coupling.iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        if rule.selects(*key):
            coupled = bool(row.get("coupled"))
            trends[key] = row if coupled else trends.get(key)
    return trends
