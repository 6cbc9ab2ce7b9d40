"""The on-call landing page (``index.html``): what is firing, where, since when and why, then the views.

On-call lands here first, so the page leads with the alerts of the window: per alert still firing at
the window's end its name, where it is (service · operation, queue or workflow), since when, its
cause and summary as the rule wrote them (the numbers), and a link to the view that holds the
evidence; then the alerts resolved in the window; then one line per view naming what stands out.

Everything here is plain text until :func:`index_body` escapes it (``html.escape``): alert names,
causes and summaries come from span strings and rule files.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import polars as pl

from analytics import Analysis
from dashboards import style
from dashboards.views._common import VIEW_TITLES, VIEWS, View, count_of, fmt_ms
from dashboards.views.alerts import NO_ALERTS_TEXT

__all__ = ["VIEW_DESCRIPTIONS", "AlertEntry", "alert_entries", "evidence_view", "headline", "index_body"]

# Names listed in a view's headline before "and N more".
HEADLINE_NAMES: Final = 3
# Resolved alerts listed; the rest are on the alerts timeline.
MAX_RESOLVED: Final = 10
VIEW_DESCRIPTIONS: Final[dict[View, str]] = {
    "hot_path": "p50/p95/p99 per operation over time, every release marked, sync LLM calls per request.",
    "cold_path": "Enqueue-to-ready p50/p99 per queue, its distribution, queue wait vs processing, backlog.",
    "abandonment": "Share of abandoned requests per 500 ms of latency, 95% intervals, the cliff and p99.",
    "retries": "Retry rate per hop, compounding amplification vs observed, token amplification.",
    "attribution": "The p99 change split into LLM vs internal time, the spans behind it, exemplar traces.",
    "boundary": "Each operation's p99 against its budget, without its sync model calls, and flag slices.",
    "alerts": "Alerts firing and resolved in the window, with their cause.",
}
_SEVERITY_ORDER: Final = {"page": 0, "critical": 0, "ticket": 1, "warning": 1}

# What each rule kind writes in its summary (slo_rules.kinds): enough to tell the kinds that share
# the service/operation labels apart when the alert does not carry its dashboard link.
_SLICE = re.compile(r"variant .+ of flag .+ is worse than control")
_RELEASE = re.compile(r"p99 rises with releases|release .+ added .+ synchronous LLM calls|stepped p99 up")
_ABANDONMENT = re.compile(r"of requests abandoned \(limit|past the abandonment cliff")
_VIEW_LINK = re.compile(r"(?:^|/)([a-z_]+)\.html(?:[?#].*)?$")


@dataclass(frozen=True)
class AlertEntry:
    """One alert of the window as the landing page lists it (plain text, unescaped)."""

    fingerprint: str
    alertname: str
    severity: str
    where: str
    cause: str
    summary: str
    view: View
    firing: bool
    # The firing transition that opened the current (or last) episode; None: before the window.
    since: datetime | None
    resolved_at: datetime | None


def evidence_view(alert: Mapping[str, Any]) -> View:
    """The view that holds the evidence for an alert (a row of ``slo_rules.alert_history``).

    The alert's own dashboard link when it carries one; else by what it is about: a queue →
    ``cold_path``, a workflow → ``retries``; for an operation, by its rule kind as its summary reads
    — release coupling → ``hot_path``, abandonment → ``abandonment``, a flag slice → ``boundary``,
    p99 regressions and latency SLOs → ``attribution``.
    """
    for url in _dashboard_links(alert):
        found = _VIEW_LINK.search(url)
        if found and found.group(1) in VIEWS:
            view: View = found.group(1)  # type: ignore[assignment]
            return view
    if alert.get("queue") or alert.get("path") == "cold":
        return "cold_path"
    if alert.get("workflow"):
        return "retries"
    summary = str(alert.get("summary") or "")
    if _SLICE.search(summary):
        return "boundary"
    if _RELEASE.search(summary):
        return "hot_path"
    if _ABANDONMENT.search(summary):
        return "abandonment"
    return "attribution"


def _dashboard_links(alert: Mapping[str, Any]) -> list[str]:
    links = [str(alert["dashboard"])] if alert.get("dashboard") else []
    raw = alert.get("annotations")
    if raw:
        try:
            annotations = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            annotations = {}
        if isinstance(annotations, Mapping) and annotations.get("dashboard"):
            links.append(str(annotations["dashboard"]))
    return links


def where(alert: Mapping[str, Any]) -> str:
    """What an alert is about: ``service · operation``, ``queue q`` or ``workflow w``."""
    parts = []
    service, operation = alert.get("service") or "", alert.get("operation") or ""
    if service or operation:
        parts.append(" · ".join(p for p in (service, operation) if p))
    if alert.get("queue"):
        parts.append(f"queue {alert['queue']}")
    if alert.get("workflow"):
        parts.append(f"workflow {alert['workflow']}")
    return ", ".join(parts) or "—"


def alert_entries(alerts: pl.DataFrame | None) -> list[AlertEntry]:
    """One entry per alert (fingerprint) of the history, in its state at the end of the window:
    firing first (pages before tickets, the most recent first), then resolved, most recent first."""
    if alerts is None or not alerts.height:
        return []
    entries: list[AlertEntry] = []
    for _key, group in alerts.sort(["fingerprint", "at"]).group_by("fingerprint", maintain_order=True):
        events = list(group.iter_rows(named=True))
        last = events[-1]
        # An episode opens at its first firing row (a still-firing alert may be written again) and
        # closes at a resolved row; a resolved row with no firing row before it fired before the window.
        opened: datetime | None = None
        closed: datetime | None = None
        for e in events:
            if e["status"] == "firing":
                opened = opened or e["at"]
            else:
                closed, opened = opened, None
        firing = last["status"] == "firing"
        since = opened if firing else closed
        entries.append(
            AlertEntry(
                fingerprint=str(last["fingerprint"]),
                alertname=str(last.get("alertname") or ""),
                severity=str(last.get("severity") or ""),
                where=where(last),
                cause=str(last.get("cause") or ""),
                summary=str(last.get("summary") or ""),
                view=evidence_view(last),
                firing=firing,
                since=since,
                resolved_at=None if firing else last["at"],
            )
        )
    firing_now = [e for e in entries if e.firing]
    firing_now.sort(key=lambda e: e.since.timestamp() if e.since else float("-inf"), reverse=True)
    firing_now.sort(key=lambda e: _SEVERITY_ORDER.get(e.severity, 2))
    resolved = sorted(
        (e for e in entries if not e.firing),
        key=lambda e: e.resolved_at.timestamp() if e.resolved_at else 0.0,
        reverse=True,
    )
    return firing_now + resolved


def _when(at: datetime) -> str:
    return style.naive_utc(at).strftime("%Y-%m-%d %H:%M UTC")


def _span(seconds: float) -> str:
    minutes = max(0, round(seconds / 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [f"{days}d"] if days else []
    if hours:
        parts.append(f"{hours}h")
    if mins or not parts:
        parts.append(f"{mins}m")
    return " ".join(parts[:2])


def _link(view: View, formats: Sequence[str]) -> str:
    page = f"{view}.html" if "html" in formats else f"{view}.png"
    name = VIEW_TITLES[view].split(":")[0]
    return f'<a class="evidence" href="{page}">{html.escape(name)} →</a>'


def _cause_cell(e: AlertEntry) -> str:
    cause = f"<b>{html.escape(e.cause)}</b>" if e.cause else "<b>n/a</b>"
    summary = html.escape(e.summary) if e.summary else "no summary"
    return f'<td class="cause">{cause} — {summary}</td>'


def _alert_name(e: AlertEntry) -> str:
    severity = f' <span class="severity">{html.escape(e.severity)}</span>' if e.severity else ""
    return f"<td><b>{html.escape(e.alertname)}</b>{severity}</td>"


def _firing_section(entries: list[AlertEntry], analysis: Analysis, formats: Sequence[str]) -> str:
    firing = [e for e in entries if e.firing]
    window_end = _when(analysis.end)
    if not firing:
        return (
            '<section class="firing"><h2>Firing now: nothing</h2>'
            f'<p class="quiet">No alert is firing at the end of the window ({window_end}).</p></section>'
        )
    rows = []
    for e in firing:
        if e.since is None:
            since = f"before {_when(analysis.start)}"
        else:
            since = f"{_when(e.since)} (for {_span((analysis.end - e.since).total_seconds())})"
        rows.append(
            f'<tr class="alert-firing">{_alert_name(e)}<td>{html.escape(e.where)}</td>'
            f"<td>{html.escape(since)}</td>{_cause_cell(e)}<td>{_link(e.view, formats)}</td></tr>"
        )
    return (
        f'<section class="firing"><h2>Firing now ({len(firing)}) at {window_end}</h2>'
        '<table class="alerts"><tr><th>alert</th><th>where</th><th>firing since</th>'
        "<th>cause — summary</th><th>evidence</th></tr>" + "".join(rows) + "</table></section>"
    )


def _resolved_section(entries: list[AlertEntry], formats: Sequence[str]) -> str:
    resolved = [e for e in entries if not e.firing]
    if not resolved:
        return ""
    rows = []
    for e in resolved[:MAX_RESOLVED]:
        fired = "before the window" if e.since is None else _when(e.since)
        when = f"{fired} → {_when(e.resolved_at)}" if e.resolved_at else fired
        rows.append(
            f'<tr class="alert-resolved">{_alert_name(e)}<td>{html.escape(e.where)}</td>'
            f"<td>{html.escape(when)}</td>{_cause_cell(e)}<td>{_link(e.view, formats)}</td></tr>"
        )
    more = (
        f'<p class="meta">{len(resolved) - MAX_RESOLVED} more on the alerts timeline.</p>'
        if len(resolved) > MAX_RESOLVED
        else ""
    )
    return (
        f'<section class="resolved"><h2>Resolved in this window ({len(resolved)})</h2>'
        '<table class="alerts"><tr><th>alert</th><th>where</th><th>fired → resolved</th>'
        "<th>cause — summary</th><th>evidence</th></tr>" + "".join(rows) + f"</table>{more}</section>"
    )


def index_body(
    analysis: Analysis, alerts: pl.DataFrame | None, formats: Sequence[str], head: str, notes: Sequence[str]
) -> str:
    """The landing page's body: ``head`` (nav and meta, already HTML), the firing and resolved
    alerts, then the views with their headlines."""
    entries = alert_entries(alerts)
    note_html = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in notes)
    items = []
    for view in VIEWS:
        links = []
        if "html" in formats:
            links.append(f'<a href="{view}.html">{html.escape(VIEW_TITLES[view])}</a>')
        if "png" in formats:
            links.append(
                f'<a href="{view}.png">{"PNG" if links else html.escape(VIEW_TITLES[view]) + " (PNG)"}</a>'
            )
        line = html.escape(headline(view, analysis, alerts))
        items.append(
            f'<li>{" · ".join(links)}<br><span class="desc">{html.escape(VIEW_DESCRIPTIONS[view])}'
            f"{' — ' + line if line else ''}</span></li>"
        )
    return (
        f"{head}\n{note_html}"
        + _firing_section(entries, analysis, formats)
        + _resolved_section(entries, formats)
        + '\n<section class="views"><h2>Views</h2>'
        '<p>Colours: <span class="legend-llm">LLM time</span> and '
        '<span class="legend-internal">internal time</span> are the same in every view; times are UTC.</p>\n'
        f'<ul class="views">{"".join(items)}</ul></section>'
    )


# --- one line per view ------------------------------------------------------------------------


def _names(items: list[str], lead: str = ": ") -> str:
    """``lead`` and the first few items, or nothing when there are none."""
    if not items:
        return ""
    shown = items[:HEADLINE_NAMES]
    more = len(items) - len(shown)
    return lead + "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _op(row: Mapping[str, Any]) -> str:
    return f"{row['service']} · {row['operation']}"


def headline(view: View, analysis: Analysis, alerts: pl.DataFrame | None) -> str:
    """One line per view for the landing page naming what stands out and where (plain text; the
    caller escapes it)."""
    if view == "hot_path":
        coupled = analysis.release_coupling.filter(pl.col("coupled").fill_null(False))
        steps = analysis.releases.filter(
            pl.col("significant").fill_null(False)
            & (pl.col("released_at") >= analysis.start)
            & (pl.col("released_at") <= analysis.end)
        ).sort("p99_delta_ms", descending=True, nulls_last=True)
        operations = count_of(analysis.hot_path.height, "operation")
        return (
            f"{operations}, {coupled.height} with p99 coupled to releases"
            + _names(
                [
                    f"{_op(r)} ({r['p99_slope_ms_per_release'] or 0:+,.0f} ms/release)"
                    for r in coupled.iter_rows(named=True)
                ]
            )
            + _names(
                [
                    f"{r['version']} on {_op(r)} {fmt_ms(r['p99_before_ms'])} → {fmt_ms(r['p99_after_ms'])}"
                    for r in steps.iter_rows(named=True)
                ],
                lead="; p99 steps: ",
            )
        )
    if view == "cold_path":
        starved = analysis.cold_path.filter(pl.col("starved").fill_null(False)).sort(
            "p99_over_p50", descending=True, nulls_last=True
        )
        return f"{count_of(analysis.cold_path.height, 'queue')}, {starved.height} starved" + _names(
            [
                f"{r['queue']} (p50 {r['p50_s']:,.1f} s, p99 {r['p99_s']:,.1f} s)"
                for r in starved.iter_rows(named=True)
            ]
        )
    if view == "abandonment":
        summary = analysis.abandonment_summary
        cliffs = summary.filter(pl.col("cliff_ms").is_not_null())
        return f"{count_of(summary.height, 'operation')}, {cliffs.height} with a cliff" + _names(
            [
                f"{_op(r)} at {r['cliff_ms']:,} ms ({(r['rate'] or 0):.1%} abandoned)"
                for r in cliffs.iter_rows(named=True)
            ]
        )
    if view == "retries":
        amp = analysis.retry_amplification.sort(
            ["attempt_amplification", "workflow"], descending=[True, False]
        )
        return count_of(amp.height, "workflow") + _names(
            [
                f"{r['workflow']} ×{r['attempt_amplification'] or 1:.2f} attempts observed"
                for r in amp.iter_rows(named=True)
            ]
        )
    if view == "attribution":
        regressions = analysis.attribution.filter(pl.col("verdict").fill_null("none") != "none").sort(
            "delta_ms", descending=True, nulls_last=True
        )
        if not regressions.height:
            return "no p99 regression against the baseline"
        return count_of(regressions.height, "p99 regression") + _names(
            [
                f"{_op(r)} {fmt_ms(r['baseline_p99_ms'])} → {fmt_ms(r['current_p99_ms'])} ({r['verdict']})"
                for r in regressions.iter_rows(named=True)
            ]
        )
    if view == "boundary":
        over = analysis.boundary.filter(
            pl.col("recommendation").is_not_null() & (pl.col("recommendation") != "keep")
        )
        return f"{count_of(analysis.boundary.height, 'operation')}, {over.height} over budget" + _names(
            [
                f"{_op(r)} p99 {fmt_ms(r['p99_ms'])} vs budget {fmt_ms(r['budget_ms'])}"
                for r in over.iter_rows(named=True)
            ]
        )
    entries = alert_entries(alerts)
    if not entries:
        return NO_ALERTS_TEXT
    firing = sum(e.firing for e in entries)
    return f"{count_of(len(entries), 'alert')}: {firing} firing, {len(entries) - firing} resolved"
