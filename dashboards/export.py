"""Write the dashboards to a directory: one HTML page per view, an index, PNGs on request.

By default every page embeds plotly.js inline, so a page opened from disk, mailed, or attached to an
incident renders with no network at all (no CDN, no MathJax). Pages written together can instead
share one copy (``plotly_js="shared"``: :data:`PLOTLY_JS` beside them, still offline), and pages a
server serves can reference the copy it serves (``plotly_js="../../plotly-….min.js"``): 4.8 MB per
page otherwise. PNGs go through kaleido, which drives the system's Chromium; kaleido is only
loaded, and Chromium only needed, when PNGs are asked for.
"""

from __future__ import annotations

import html
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, get_args

import plotly
import plotly.graph_objects as go
import polars as pl
from plotly.offline import get_plotlyjs_version

from analytics import (
    Analysis,
    Conventions,
    DriftReport,
    analyze,
    latest_analysis,
    load_run,
    persist_analysis,
)
from dashboards import style
from dashboards.figures import VIEW_TITLES, VIEWS, View, build_figures
from dashboards.landing import index_body, live_index_body
from dashboards.views.attribution import EXEMPLARS
from slo_rules import alert_history, trace_link
from storage import Store, TailwatchError, as_utc

__all__ = [
    "BROWSER_ENV",
    "DEFAULT_WINDOW",
    "PLOTLY_JS",
    "DashboardError",
    "ExportFormat",
    "ExportReport",
    "PngExportError",
    "alerts_in_window",
    "export_dashboards",
    "find_browser",
    "landing_page",
    "plotly_js_source",
    "with_drift_report",
    "write_dashboards",
    "write_plotly_js",
]

_log = logging.getLogger(__name__)

ExportFormat = Literal["html", "png"]
EXPORT_FORMATS: Final[tuple[ExportFormat, ...]] = get_args(ExportFormat)
DEFAULT_WINDOW: Final = timedelta(hours=24)
# kaleido (through choreographer) reads the browser from this variable; tailwatch honours it too.
BROWSER_ENV: Final = "BROWSER_PATH"
_BROWSER_NAMES: Final = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
PNG_WIDTH: Final = 1400
ALERT_END_SLACK: Final = timedelta(milliseconds=1)  # alert times are DateTime64(3)
# A slow trace picked near the window's end finishes after it: the viewer's search runs past the end.
TRACE_END_SLACK: Final = timedelta(minutes=15)
# The shared copy of plotly.js, named for its version: a server can cache it for a year, and an
# upgrade changes the name rather than serving new pages a stale copy.
PLOTLY_JS: Final = f"plotly-{get_plotlyjs_version()}.min.js"


class DashboardError(TailwatchError):
    """The dashboards could not be exported (bad option, unwritable directory)."""


class PngExportError(DashboardError):
    """PNG export needs a Chromium that kaleido can find and launch."""


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote. ``computed`` is true when the analysis was run (and persisted) for it."""

    files: list[Path]
    analysis_run_id: str | None
    start: datetime | None = None
    end: datetime | None = None
    computed: bool = False
    alerts: int = 0
    notes: list[str] = field(default_factory=list)


def check_window(start: datetime | None, end: datetime | None) -> None:
    """Refuse an explicit window that is empty (before any store is opened)."""
    if start is not None and end is not None and start >= end:
        raise DashboardError(
            f"dashboard window is empty: start {start.isoformat()} is not before end {end.isoformat()}"
        )


def check_formats(formats: Sequence[str]) -> tuple[ExportFormat, ...]:
    """The requested formats, validated; an unknown one names the allowed values."""
    if isinstance(formats, str):
        formats = (formats,)
    chosen: list[ExportFormat] = []
    for value in formats:
        if value not in EXPORT_FORMATS:
            raise DashboardError(f"unknown dashboard format {value!r}; allowed: {', '.join(EXPORT_FORMATS)}")
        if value not in chosen:
            chosen.append(value)
    if not chosen:
        raise DashboardError(f"no dashboard format given; allowed: {', '.join(EXPORT_FORMATS)}")
    return tuple(chosen)


def export_dashboards(
    store: Store,
    out_dir: Path,
    start: datetime | None = None,
    end: datetime | None = None,
    formats: Sequence[ExportFormat] = ("html",),
    conventions: Conventions | None = None,
    trace_url: str | None = None,
    run_id: str | None = None,
    plotly_js: str = "inline",
    drift_days: int | None = None,
    latency_targets: Iterable[tuple[str, str]] = (),
) -> ExportReport:
    """Export every view for a window, computing and persisting its analysis — or, with
    ``run_id``, of that persisted run (the window is the run's).

    The Drift view draws the architecture drift report of the ``drift_days`` days (default the
    conventions' ``drift_days``; 0: none) before the analysis' end, read as ``tailwatch analyze``
    and the rules read it (``analytics.DriftReport.read``: computed at most once per store and hour,
    then kept), with ``latency_targets`` (the ``latency_slo`` rules' (service, operation) globs).

    Window: ``start``/``end`` as given (a missing end is now, a missing start is 24 h before the
    end); with neither, the latest persisted analysis, else the last 24 hours. ``trace_url``: the
    trace viewer's URL template (``{trace_id}``, ``{start}``, ``{end}``) exemplar ids link to.
    ``plotly_js``: how the pages load plotly.js (:func:`write_dashboards`).
    """
    chosen = check_formats(formats)
    if run_id is not None:
        loaded = load_run(store, run_id)
        if loaded is None:
            raise DashboardError(f"no analysis run {run_id} in the store; `tailwatch analyze` makes one")
        analysis, computed = loaded, False
    else:
        analysis, run_id, computed = _resolve_analysis(store, start, end, conventions)
    alerts, notes = alerts_in_window(store, analysis.start, analysis.end)
    if analysis.drift is None:
        analysis, note = with_drift_report(store, analysis, conventions, drift_days, latency_targets)
        notes += note
    files = write_dashboards(
        analysis,
        Path(out_dir),
        alerts=alerts,
        formats=chosen,
        run_id=run_id,
        notes=notes,
        trace_url=trace_url,
        plotly_js=plotly_js,
    )
    return ExportReport(
        files=files,
        analysis_run_id=run_id,
        start=analysis.start,
        end=analysis.end,
        computed=computed,
        alerts=0 if alerts is None else alerts.height,
        notes=notes,
    )


def _resolve_analysis(
    store: Store, start: datetime | None, end: datetime | None, conventions: Conventions | None
) -> tuple[Analysis, str | None, bool]:
    if start is None and end is None:
        latest = latest_analysis(store)
        if latest is not None:
            return latest, latest.run_id, False
        end = datetime.now(UTC)
    if end is None:
        end = datetime.now(UTC)
    end = as_utc(end)
    start = end - DEFAULT_WINDOW if start is None else as_utc(start)
    check_window(start, end)
    # A window is analysed afresh (from the summaries, where they reach): a run persisted earlier
    # for the same window is history, computed before spans that arrived since.
    computed = analyze(store, start, end, conventions=conventions)
    run_id = persist_analysis(store, computed)
    return computed, run_id, True


def with_drift_report(
    store: Store,
    analysis: Analysis,
    conventions: Conventions | None = None,
    days: int | None = None,
    latency_targets: Iterable[tuple[str, str]] = (),
) -> tuple[Analysis, list[str]]:
    """``analysis`` with the drift report of the ``days`` days before its end (0: as it is), and a
    note when it cannot be read (the other views do not need it)."""
    conv = conventions or Conventions()
    days = conv.drift_days if days is None else days
    if not days:
        return analysis, []
    try:
        report = DriftReport.read(store, analysis.end, conv, days=days, covered=latency_targets)
    except TailwatchError as exc:
        _log.warning("drift report unavailable: %s", exc)
        return analysis, [f"drift report unavailable: {exc}"]
    return analysis.with_drift(report), []


def alerts_in_window(store: Store, start: datetime, end: datetime) -> tuple[pl.DataFrame | None, list[str]]:
    """Alert transitions in the window, and a note when they cannot be read (``None``: a store
    without alerting yet draws the "no alerts" timeline)."""
    try:
        # Rules are evaluated *at* the end of a window (the scheduler's tick, the demo's simulated
        # end): a transition stamped exactly at ``end`` belongs to this window's timeline.
        return alert_history(store, start, end + ALERT_END_SLACK), []
    except TailwatchError as exc:
        # Dashboards of latency must not fail because the alert tables are missing or unreadable.
        _log.warning("alert history unavailable: %s", exc)
        return None, [f"alert history unavailable: {exc}"]


def write_dashboards(
    analysis: Analysis,
    out_dir: Path,
    *,
    alerts: pl.DataFrame | None = None,
    formats: Sequence[ExportFormat] = ("html",),
    run_id: str | None = None,
    notes: Sequence[str] = (),
    trace_url: str | None = None,
    plotly_js: str = "inline",
) -> list[Path]:
    """Write the views of an analysis (already computed) to ``out_dir``; returns the files written.

    ``plotly_js``: ``"inline"`` embeds plotly.js in every page (4.8 MB each; a page works alone,
    offline); ``"shared"`` writes one :data:`PLOTLY_JS` into ``out_dir`` that the pages load (the
    directory works offline as a whole); any other value ending in ``.js`` is the URL, relative to
    the pages, of a copy served elsewhere (nothing is written for it).
    """
    chosen = check_formats(formats)
    script = _plotly_script(plotly_js)
    figures = build_figures(analysis, alerts)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DashboardError(f"cannot create the dashboard directory {out_dir}: {exc.strerror}") from None
    files: list[Path] = []
    if "html" in chosen:
        if plotly_js == "shared":
            files.append(write_plotly_js(out_dir))
        for view in VIEWS:
            path = out_dir / f"{view}.html"
            _write_text(path, _view_page(view, figures[view], analysis, run_id, trace_url, script))
            files.append(path)
    if "png" in chosen:
        files += write_pngs(figures, out_dir)
    index = out_dir / "index.html"
    _write_text(index, _index_page(analysis, chosen, run_id, alerts, notes))
    files.append(index)
    return files


def _plotly_script(plotly_js: str) -> bool | str:
    """What ``Figure.to_html`` takes as ``include_plotlyjs`` for a ``plotly_js`` option."""
    if plotly_js == "inline":
        return True
    if plotly_js == "shared":
        return PLOTLY_JS
    if plotly_js.endswith(".js") and not any(c in plotly_js for c in "\"'<> "):
        return plotly_js
    raise DashboardError(f"plotly_js: expected 'inline', 'shared' or a URL ending in .js, got {plotly_js!r}")


def plotly_js_source() -> Path:
    """The plotly.js bundled with the installed ``plotly`` package (what ``inline`` embeds)."""
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def write_plotly_js(out_dir: Path) -> Path:
    """``out_dir/``:data:`PLOTLY_JS`, copied from the plotly package unless already there; the copy
    is renamed into place, so a page loading it never reads half a file."""
    target = out_dir / PLOTLY_JS
    source = plotly_js_source()
    if target.is_file() and target.stat().st_size == source.stat().st_size:
        return target
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".plotly-", suffix=".js", dir=out_dir)
        os.close(fd)
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise DashboardError(f"cannot write {target}: {exc.strerror}") from None
    return target


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise DashboardError(f"cannot write {path}: {exc.strerror}") from None


_PAGE_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 0 24px 24px; color: #222; }
nav { padding: 12px 0; border-bottom: 1px solid #ddd; margin-bottom: 8px; font-size: 14px; }
nav a { margin-right: 16px; color: #1d3557; text-decoration: none; }
nav a.current { font-weight: bold; text-decoration: underline; }
h1 { font-size: 20px; margin: 16px 0 4px; }
p.meta { color: #666; font-size: 13px; margin: 0 0 12px; }
ul.views li { margin: 10px 0; }
ul.views .desc { color: #555; font-size: 14px; }
.legend-llm { color: #8e44ad; font-weight: bold; } .legend-internal { color: #2a9d8f; font-weight: bold; }
h2 { font-size: 17px; margin: 20px 0 6px; }
section.firing h2 { color: #d62728; } p.quiet { color: #2ca02c; font-weight: bold; }
table.alerts { border-collapse: collapse; font-size: 14px; width: 100%; }
table.alerts th, table.alerts td { text-align: left; vertical-align: top; padding: 6px 10px;
  border-bottom: 1px solid #eee; }
table.alerts th { background: #f4f4f4; }
tr.alert-firing td:first-child { border-left: 4px solid #d62728; }
tr.alert-resolved td:first-child { border-left: 4px solid #2ca02c; }
span.severity { color: #666; font-size: 12px; border: 1px solid #ccc; border-radius: 3px; padding: 0 4px; }
a.evidence { white-space: nowrap; }
"""


def _nav(current: str, base: str | None = "", index: str = "index.html") -> str:
    """Links to the overview and each view (``base`` + ``<view>.html``; ``None``: no views yet)."""
    links = [
        f'<a href="{html.escape(index, quote=True)}"'
        + (' class="current"' if current == "index" else "")
        + ">Overview</a>"
    ]
    for view in VIEWS if base is not None else ():
        cls = ' class="current"' if view == current else ""
        href = html.escape(f"{base}{view}.html", quote=True)
        links.append(f'<a href="{href}"{cls}>{html.escape(VIEW_TITLES[view].split(":")[0])}</a>')
    return "<nav>" + "".join(links) + "</nav>"


def _meta(analysis: Analysis, run_id: str | None) -> str:
    parts = [f"window {html.escape(style.fmt_window(analysis.start, analysis.end))}"]
    parts.append(f"baseline {html.escape(style.fmt_window(analysis.baseline_start, analysis.baseline_end))}")
    if run_id:
        parts.append(f"analysis run {html.escape(run_id)}")
    parts.append(f"generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M')} UTC")
    return '<p class="meta">' + " · ".join(parts) + "</p>"


def _page(title: str, body: str, refresh_s: int | None = None) -> str:
    refresh = f'<meta http-equiv="refresh" content="{int(refresh_s)}">\n' if refresh_s else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"{refresh}<title>{html.escape(title)}</title>\n"
        f"<style>{_PAGE_STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _view_page(
    view: View,
    figure: go.Figure,
    analysis: Analysis,
    run_id: str | None,
    trace_url: str | None = None,
    script: bool | str = True,
) -> str:
    # include_plotlyjs=True inlines plotly.js (the page needs no network); a relative URL loads the
    # shared copy beside the pages or the one the service serves. The figure JSON that plotly
    # writes escapes <, > and / so no data can close the <script> element.
    plot = figure.to_html(
        full_html=False,
        include_plotlyjs=script,
        include_mathjax=False,
        div_id=f"tailwatch-{view}",
        config={"displaylogo": False, "responsive": True},
        default_width="100%",
    )
    title = f"tailwatch · {VIEW_TITLES[view]}"
    body = f"{_nav(view)}\n<h1>{html.escape(VIEW_TITLES[view])}</h1>\n{_meta(analysis, run_id)}\n{plot}"
    rows = _exemplar_rows(view, analysis)
    if rows:
        body += "\n" + _exemplar_section(rows, trace_url, analysis)
    return _page(title, body)


def _exemplar_rows(view: View, analysis: Analysis) -> list[tuple[str, list[str]]]:
    """(what, trace ids) of the exemplar traces a view shows: slow traces per operation, the most
    retried run per workflow."""
    if view == "attribution":
        return [
            (
                f"{a['service']} · {a['operation']} ({a['verdict']})",
                list(a["exemplar_trace_ids"] or [])[:EXEMPLARS],
            )
            for a in analysis.attribution.iter_rows(named=True)
            if a["exemplar_trace_ids"]
        ]
    if view == "retries":
        return [
            (f"{r['workflow']} (most retried run)", [r["exemplar_trace_id"]])
            for r in analysis.retry_amplification.iter_rows(named=True)
            if r.get("exemplar_trace_id")
        ]
    return []


def _exemplar_section(rows: list[tuple[str, list[str]]], trace_url: str | None, analysis: Analysis) -> str:
    """The exemplar traces as an HTML table, each id a link to the user's trace viewer when
    ``trace_url`` is set (the viewer searches the analysed window, as the alerts' links do)."""

    def cell(trace_id: str) -> str:
        url = trace_link(trace_url, trace_id, start=analysis.start, end=analysis.end + TRACE_END_SLACK)
        text = f"<code>{html.escape(trace_id)}</code>"
        if url is None:
            return text
        return (
            f'<a href="{html.escape(url, quote=True)}" rel="noopener noreferrer" target="_blank">{text}</a>'
        )

    body = "".join(
        f"<tr><td>{html.escape(what)}</td><td>{' '.join(cell(t) for t in ids)}</td></tr>"
        for what, ids in rows
    )
    hint = (
        ""
        if trace_url
        else '<p class="meta">Set <code>[links] trace_url</code> to open these in your trace viewer.</p>'
    )
    return (
        '<section class="exemplars"><h2>Exemplar traces</h2>'
        f"<table><tr><th>where</th><th>traces</th></tr>{body}</table>{hint}</section>"
    )


def _index_page(
    analysis: Analysis,
    formats: Sequence[ExportFormat],
    run_id: str | None,
    alerts: pl.DataFrame | None,
    notes: Sequence[str],
) -> str:
    head = f"{_nav('index')}\n<h1>tailwatch: what is firing</h1>\n{_meta(analysis, run_id)}"
    return _page("tailwatch dashboards", index_body(analysis, alerts, formats, head, notes))


# How often a browser reloads the live landing page: it states the alerts as they are now.
LANDING_REFRESH_S: Final = 60


def landing_page(
    analysis: Analysis | None,
    alerts: pl.DataFrame | None,
    *,
    now: datetime,
    run_id: str | None = None,
    waiting: str = "",
    resolved_since: datetime | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The on-call landing page a server renders on request (``/dashboards/``): ``alerts`` are
    ``slo_rules.list_alerts`` (their state ``now``), ``analysis`` the latest one with its views at
    ``runs/<run_id>/``; before any analysis (``None``) the page says what it waits for
    (``waiting``). It reloads itself every minute."""
    base = f"runs/{run_id}/" if analysis is not None and run_id else None
    if analysis is not None:
        meta = _meta(analysis, run_id)
    else:
        meta = f'<p class="meta">generated {now.astimezone(UTC).strftime("%Y-%m-%d %H:%M")} UTC</p>'
    head = f"{_nav('index', base, index='./')}\n<h1>tailwatch: what is firing</h1>\n{meta}"
    body = live_index_body(
        analysis,
        alerts,
        now=now,
        head=head,
        views_base=base or "",
        waiting=waiting,
        resolved_since=resolved_since,
        notes=notes,
    )
    return _page("tailwatch", body, refresh_s=LANDING_REFRESH_S)


# --- PNG -------------------------------------------------------------------------------------


def find_browser() -> str:
    """The Chromium kaleido should drive: ``BROWSER_PATH``, else one on ``PATH``."""
    configured = os.environ.get(BROWSER_ENV, "").strip()
    if configured:
        if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
            raise PngExportError(f"{BROWSER_ENV}={configured!r} is not an executable browser")
        return configured
    for name in _BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise PngExportError(
        "PNG export needs Chromium: install it (Debian: apt-get install chromium, or `make browser`) "
        f"or set {BROWSER_ENV} to a Chrome/Chromium executable"
    )


def write_pngs(figures: Mapping[str, go.Figure], out_dir: Path) -> list[Path]:
    """One PNG per figure through kaleido and the system Chromium, in a single browser session."""
    browser = find_browser()
    # Here rather than at the top: kaleido (and choreographer behind it) is only loaded for PNGs.
    import kaleido

    jobs: list[dict[str, Any]] = []
    paths: list[Path] = []
    for view, fig in figures.items():
        path = out_dir / f"{view}.png"
        height = int(fig.layout.height or 600)
        jobs.append(
            {"fig": fig, "path": path, "opts": {"format": "png", "width": PNG_WIDTH, "height": height}}
        )
        paths.append(path)
    try:
        # mathjax=False keeps kaleido from fetching MathJax off a CDN; plotly.js comes from the plotly
        # package on disk, so rendering needs no network either.
        kaleido.write_fig_from_object_sync(
            jobs, kopts={"path": browser, "mathjax": False}, cancel_on_error=True
        )
    except Exception as exc:  # kaleido raises many kinds (browser launch, timeouts, devtools)
        # choreographer packs a sentence and install advice into args; the first is the reason.
        reason = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        first = " ".join(reason.split())[:300] or type(exc).__name__
        raise PngExportError(f"PNG export through kaleido with {browser} failed: {first}") from None
    missing = [p for p in paths if not p.is_file() or p.stat().st_size == 0]
    if missing:
        raise PngExportError(f"PNG export wrote no image for: {', '.join(p.name for p in missing)}")
    return paths
