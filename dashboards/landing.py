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
from dashboards.views.drift import no_drift_text
from dashboards.views.llm import llm_headline

__all__ = [
    "SYNC_LLM_INCREASE",
    "VIEW_DESCRIPTIONS",
    "AlertEntry",
    "alert_entries",
    "current_entries",
    "evidence_view",
    "headline",
    "index_body",
    "live_index_body",
    "release_findings",
]

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
    "llm": "Per model: time to first token, time per output token, tokens, cache and cost against the "
    "baseline; the anatomy of each llm regression, our change or the provider's.",
    "boundary": "Each operation's p99 against its budget, without its sync model calls, the what-if "
    "options against their price, and flag slices.",
    "drift": "Batch jobs drifting into online services: per finding the series by day it rests on.",
    "alerts": "Alerts firing and resolved in the window, with their cause.",
}
_SEVERITY_ORDER: Final = {"page": 0, "critical": 0, "ticket": 1, "warning": 1}

# What each rule kind writes in its summary (slo_rules.kinds): enough to tell the kinds that share
# the service/operation labels apart when the alert does not carry its dashboard link.
_SLICE = re.compile(r"variant .+ of flag .+ is worse than control")
_RELEASE = re.compile(r"p99 rises with releases|release .+ added .+ synchronous LLM calls|stepped p99 up")
_ABANDONMENT = re.compile(r"of requests abandoned \(limit|past the abandonment cliff")
# The decision every architecture_drift alert's summary ends with (slo_rules.kinds.architecture_drift).
_DRIFT = re.compile(r"say it is an online service now")
_VIEW_LINK = re.compile(r"(?:^|/)([a-z_]+)\.html(?:[?#].*)?$")
# The run page an alert links to, whichever base URL it was written with.
_RUN_PAGE = re.compile(r"/runs/([0-9a-f]{32})/([a-z_]+)\.html(?:[?#].*)?$")
# What the release_coupling rule kind calls a release that added synchronous LLM calls (its
# ``min_sync_llm_increase`` default): the landing page counts the releases the rule fires on.
SYNC_LLM_INCREASE: Final = 0.5


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
    # The page holding the evidence, relative to the landing page, when the alert carries its own
    # (the run page of the analysis behind it); else the view of the page's own analysis.
    link: str = ""


def evidence_view(alert: Mapping[str, Any]) -> View:
    """The view that holds the evidence for an alert (a row of ``slo_rules.alert_history``).

    The alert's own dashboard link when it carries one; else by what it is about: architecture
    drift (its summary's decision) → ``drift``, a queue → ``cold_path``, a workflow → ``retries``;
    for an operation, by its rule kind as its summary reads — release coupling → ``hot_path``,
    abandonment → ``abandonment``, a flag slice → ``boundary``, p99 regressions and latency SLOs →
    ``attribution``.
    """
    for url in _dashboard_links(alert):
        found = _VIEW_LINK.search(url)
        if found and found.group(1) in VIEWS:
            view: View = found.group(1)  # type: ignore[assignment]
            return view
    summary = str(alert.get("summary") or "")
    if _DRIFT.search(summary):
        # Before the queue: an unbounded queue's drift alert names its queue.
        return "drift"
    if alert.get("queue") or alert.get("path") == "cold":
        return "cold_path"
    if alert.get("workflow"):
        return "retries"
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
    return _ordered(entries)


def current_entries(states: pl.DataFrame | None) -> list[AlertEntry]:
    """One entry per alert of ``slo_rules.list_alerts`` (its state now): firing first (pages
    before tickets, the most recent first), then resolved, most recent first. Pending alerts are
    not listed. Each entry links to the run page its ``dashboard`` annotation names, as a path
    relative to ``/dashboards/`` (``runs/<run>/<view>.html``), whatever host the link was written for."""
    if states is None or not states.height:
        return []
    entries: list[AlertEntry] = []
    for row in states.iter_rows(named=True):
        state = str(row.get("state") or "")
        if state not in ("firing", "resolved"):
            continue
        link = ""
        for url in _dashboard_links(row):
            found = _RUN_PAGE.search(url)
            if found and found.group(2) in VIEWS:
                link = f"runs/{found.group(1)}/{found.group(2)}.html"
                break
        entries.append(
            AlertEntry(
                fingerprint=str(row.get("fingerprint") or ""),
                alertname=str(row.get("alertname") or ""),
                severity=str(row.get("severity") or ""),
                where=where(row),
                cause=str(row.get("cause") or ""),
                summary=str(row.get("summary") or ""),
                view=evidence_view(row),
                firing=state == "firing",
                since=row.get("starts_at"),
                resolved_at=row.get("ends_at") if state == "resolved" else None,
                link=link,
            )
        )
    return _ordered(entries)


def _ordered(entries: list[AlertEntry]) -> list[AlertEntry]:
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


@dataclass(frozen=True)
class _Links:
    """Where the page's links go: ``base`` + ``<view>.html`` (or ``.png`` when only PNGs exist)."""

    base: str = ""
    formats: Sequence[str] = ("html",)

    def view(self, view: View) -> str:
        return f"{self.base}{view}.html" if "html" in self.formats else f"{self.base}{view}.png"


def _link(e: AlertEntry, links: _Links) -> str:
    href = e.link or links.view(e.view)
    name = VIEW_TITLES[e.view].split(":")[0]
    return f'<a class="evidence" href="{html.escape(href, quote=True)}">{html.escape(name)} →</a>'


def _cause_cell(e: AlertEntry) -> str:
    cause = f"<b>{html.escape(e.cause)}</b>" if e.cause else "<b>n/a</b>"
    summary = html.escape(e.summary) if e.summary else "no summary"
    return f'<td class="cause">{cause} — {summary}</td>'


def _alert_name(e: AlertEntry) -> str:
    severity = f' <span class="severity">{html.escape(e.severity)}</span>' if e.severity else ""
    return f"<td><b>{html.escape(e.alertname)}</b>{severity}</td>"


@dataclass(frozen=True)
class _Moment:
    """What the alert sections describe: the state at ``at`` (a window's end, or now)."""

    at: datetime
    quiet: str  # said when nothing fires
    resolved_title: str
    window_start: datetime | None = None  # an alert firing since before the window


def _firing_section(entries: list[AlertEntry], moment: _Moment, links: _Links) -> str:
    firing = [e for e in entries if e.firing]
    if not firing:
        return (
            '<section class="firing"><h2>Firing now: nothing</h2>'
            f'<p class="quiet">{html.escape(moment.quiet)}</p></section>'
        )
    rows = []
    for e in firing:
        if e.since is None:
            since = f"before {_when(moment.window_start)}" if moment.window_start else "before the window"
        else:
            since = f"{_when(e.since)} (for {_span((moment.at - e.since).total_seconds())})"
        rows.append(
            f'<tr class="alert-firing">{_alert_name(e)}<td>{html.escape(e.where)}</td>'
            f"<td>{html.escape(since)}</td>{_cause_cell(e)}<td>{_link(e, links)}</td></tr>"
        )
    return (
        f'<section class="firing"><h2>Firing now ({len(firing)}) at {_when(moment.at)}</h2>'
        '<table class="alerts"><tr><th>alert</th><th>where</th><th>firing since</th>'
        "<th>cause — summary</th><th>evidence</th></tr>" + "".join(rows) + "</table></section>"
    )


def _resolved_section(entries: list[AlertEntry], moment: _Moment, links: _Links) -> str:
    resolved = [e for e in entries if not e.firing]
    if not resolved:
        return ""
    rows = []
    for e in resolved[:MAX_RESOLVED]:
        fired = "before the window" if e.since is None else _when(e.since)
        when = f"{fired} → {_when(e.resolved_at)}" if e.resolved_at else fired
        rows.append(
            f'<tr class="alert-resolved">{_alert_name(e)}<td>{html.escape(e.where)}</td>'
            f"<td>{html.escape(when)}</td>{_cause_cell(e)}<td>{_link(e, links)}</td></tr>"
        )
    more = (
        f'<p class="meta">{len(resolved) - MAX_RESOLVED} more on the alerts timeline.</p>'
        if len(resolved) > MAX_RESOLVED
        else ""
    )
    return (
        f'<section class="resolved"><h2>{html.escape(moment.resolved_title)} ({len(resolved)})</h2>'
        '<table class="alerts"><tr><th>alert</th><th>where</th><th>fired → resolved</th>'
        "<th>cause — summary</th><th>evidence</th></tr>" + "".join(rows) + f"</table>{more}</section>"
    )


def _views_section(analysis: Analysis, links: _Links, alerts_line: str) -> str:
    items = []
    for view in VIEWS:
        anchors = []
        if "html" in links.formats:
            href = html.escape(f"{links.base}{view}.html", quote=True)
            anchors.append(f'<a href="{href}">{html.escape(VIEW_TITLES[view])}</a>')
        if "png" in links.formats:
            href = html.escape(f"{links.base}{view}.png", quote=True)
            label = "PNG" if anchors else html.escape(VIEW_TITLES[view]) + " (PNG)"
            anchors.append(f'<a href="{href}">{label}</a>')
        line = html.escape(alerts_line if view == "alerts" else headline(view, analysis, None))
        items.append(
            f'<li>{" · ".join(anchors)}<br><span class="desc">{html.escape(VIEW_DESCRIPTIONS[view])}'
            f"{' — ' + line if line else ''}</span></li>"
        )
    return (
        '\n<section class="views"><h2>Views</h2>'
        '<p>Colours: <span class="legend-llm">LLM time</span> and '
        '<span class="legend-internal">internal time</span> are the same in every view; times are UTC.</p>\n'
        f'<ul class="views">{"".join(items)}</ul></section>'
    )


def index_body(
    analysis: Analysis, alerts: pl.DataFrame | None, formats: Sequence[str], head: str, notes: Sequence[str]
) -> str:
    """The landing page's body: ``head`` (nav and meta, already HTML), the firing and resolved
    alerts at the window's end, then the views with their headlines."""
    entries = alert_entries(alerts)
    links = _Links("", formats)
    moment = _Moment(
        at=analysis.end,
        quiet=f"No alert is firing at the end of the window ({_when(analysis.end)}).",
        resolved_title="Resolved in this window",
        window_start=analysis.start,
    )
    note_html = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in notes)
    return (
        f"{head}\n{note_html}"
        + _firing_section(entries, moment, links)
        + _resolved_section(entries, moment, links)
        + _views_section(analysis, links, headline("alerts", analysis, alerts))
    )


def live_index_body(
    analysis: Analysis | None,
    states: pl.DataFrame | None,
    *,
    now: datetime,
    head: str,
    views_base: str,
    waiting: str = "",
    resolved_since: datetime | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The landing page a service renders on request: the alerts as they are ``now``
    (``states``: ``slo_rules.list_alerts``, resolved ones since ``resolved_since``), each linking
    to its own analysis' page when it carries one; then the views of ``analysis`` (the latest
    scheduled one) at ``views_base`` (``runs/<run id>/``), or, before any analysis, ``waiting``:
    what the page waits for, in words."""
    entries = current_entries(states)
    links = _Links(views_base, ("html",))
    since = f"since {_when(resolved_since)}" if resolved_since else "recently"
    moment = _Moment(
        at=now, quiet=f"No alert is firing now ({_when(now)}).", resolved_title=f"Resolved {since}"
    )
    note_html = "".join(f'<p class="meta">{html.escape(n)}</p>' for n in notes)
    body = (
        f"{head}\n{note_html}"
        + _firing_section(entries, moment, links)
        + _resolved_section(entries, moment, links)
    )
    if analysis is None:
        return (
            body + '\n<section class="waiting"><h2>Waiting for the first analysis</h2>'
            f'<p class="waiting">{html.escape(waiting)}</p></section>'
        )
    firing = sum(e.firing for e in entries)
    alerts_line = (
        f"{count_of(len(entries), 'alert')} now: {firing} firing, {len(entries) - firing} resolved"
        if entries
        else NO_ALERTS_TEXT
    )
    return body + _views_section(analysis, links, alerts_line)


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


def _signed(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:+,.0f} ms"


def release_findings(analysis: Analysis) -> list[str]:
    """The releases in the analysis window the ``release_coupling`` rule kind fires on, as text:
    a significant p99 step up, or at least :data:`SYNC_LLM_INCREASE` more synchronous LLM calls
    per request than the version before (largest step first)."""
    out: list[tuple[float, str]] = []
    for r in analysis.releases.iter_rows(named=True):
        released = r.get("released_at")
        if released is None or not analysis.start <= released < analysis.end:
            continue
        delta = r.get("p99_delta_ms")
        before, after = r.get("sync_llm_calls_per_request_before"), r.get("sync_llm_calls_per_request_after")
        what = []
        if r.get("significant") and delta is not None and delta > 0:
            what.append(f"p99 {fmt_ms(r['p99_before_ms'])} → {fmt_ms(r['p99_after_ms'])}")
        if before is not None and (after or 0.0) - before >= SYNC_LLM_INCREASE:
            what.append(f"sync LLM calls {before:.1f} → {after or 0.0:.1f} per request")
        if what:
            out.append((delta or 0.0, f"{r['version']} on {_op(r)}: {', '.join(what)}"))
    return [text for _, text in sorted(out, key=lambda item: -item[0])]


def headline(view: View, analysis: Analysis, alerts: pl.DataFrame | None) -> str:
    """One line per view for the landing page naming what stands out and where (plain text; the
    caller escapes it)."""
    if view == "hot_path":
        # The words of the release_coupling rule kind, one meaning each: a release that stepped p99
        # up or added synchronous LLM calls (what `hot-path-release-coupling` fires on), and,
        # named apart, an operation whose p99 rises with releases (the trend).
        rising = analysis.release_coupling.filter(pl.col("coupled").fill_null(False))
        findings = release_findings(analysis)
        operations = count_of(analysis.hot_path.height, "operation")
        return (
            f"{operations}; {count_of(len(findings), 'release')} in the window stepped p99 up or added "
            "sync LLM calls"
            + _names(findings)
            + f"; {count_of(rising.height, 'operation')} whose p99 rises with releases"
            + _names(
                [
                    f"{_op(r)} ({r['p99_slope_ms_per_release'] or 0:+,.0f} ms/release)"
                    for r in rising.iter_rows(named=True)
                ]
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
        rows = analysis.attribution
        if not rows.height:
            return "no hot-path operation to compare with the baseline"
        no_baseline = rows.filter(pl.col("baseline_requests").fill_null(0) == 0)
        regressions = rows.filter(pl.col("verdict").fill_null("none") != "none").sort(
            "delta_ms", descending=True, nulls_last=True
        )
        if regressions.height:
            text = count_of(regressions.height, "p99 regression") + _names(
                [
                    f"{_op(r)} Δp99 {_signed(r['delta_ms'])} (p99 {fmt_ms(r['baseline_p99_ms'])} → "
                    f"{fmt_ms(r['current_p99_ms'])}, {r['verdict']})"
                    for r in regressions.iter_rows(named=True)
                ]
            )
        elif no_baseline.height == rows.height:
            # Nothing to compare with is not "no regression".
            return "no baseline data: the baseline window held no request of any operation"
        else:
            text = "no p99 regression against the baseline"
        if no_baseline.height:
            text += f"; no baseline data for {count_of(no_baseline.height, 'operation')}" + _names(
                [_op(r) for r in no_baseline.iter_rows(named=True)]
            )
        return text
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
    if view == "llm":
        return llm_headline(analysis)
    if view == "drift":
        report = analysis.drift
        if report is None or not report.findings:
            return no_drift_text(analysis)
        critical = sum(f.severity == "critical" for f in report.findings)
        return f"{count_of(len(report.findings), 'finding')}, {critical} critical" + _names(
            [
                f"{f.kind} {' · '.join(p for p in (f.service, f.operation or f.queue) if p)} since "
                f"{f.since:%Y-%m-%d}"
                for f in sorted(report.findings, key=lambda f: f.severity != "critical")
            ]
        )
    entries = alert_entries(alerts)
    if not entries:
        return NO_ALERTS_TEXT
    firing = sum(e.firing for e in entries)
    return f"{count_of(len(entries), 'alert')}: {firing} firing, {len(entries) - firing} resolved"
