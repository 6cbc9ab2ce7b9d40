"""``tailwatch demo``: the whole pipeline on simulated traffic, from OTLP spans to alerts and dashboards.

The steps, all in one process on loopback:

1. a fresh embedded store (``OUT/store``, wiped) or the ``--store`` given;
2. the OTLP/HTTP receiver and ingest pipeline of :mod:`collectors` on ``127.0.0.1`` (ephemeral port);
3. the :class:`~demo.generator.Workload` exported through the SDK's ``OTLPSpanExporter``;
4. the analysis of the last simulated day against the day before (``analytics.analyze``), persisted,
   with the architecture drift report of the three days (``analytics.DriftReport``);
5. the demo rules (``demo/rules.yaml``) evaluated at the simulated end, alerts delivered
   to a webhook receiver the demo runs on ``127.0.0.1`` that appends each body to
   ``OUT/alerts.jsonl``;
6. the dashboards exported to ``OUT/dashboards/`` (one shared plotly.js beside the pages), and the
   analysis run behind every alert link to ``OUT/dashboards/runs/<run>/``, so each link in
   ``OUT/alerts.jsonl`` opens a page the demo wrote;
7. a summary: per scenario the alert it raised, its cause and where to look; also in
   ``OUT/summary.json``.

A scenario is scored from structured data only: the alerts that reached the webhook are matched to
it by their labels (rule, service and operation, workflow or queue) and their ``cause``; the
evidence that tells it apart and the trace to open come from the frames of the analysis in step 4
(the analysis the rules read for the same window), never from an alert's prose. The migration
scenario expects no alert: it is scored from the ``slices`` frame alone (the async variant's split
and p99 against the sync control), and the release-coupling row names the operation's
recommendation from the ``boundary`` frame. The drift scenario expects no alert either: it is scored
from the drift report (the shared function's finding from the last day, and the batch shrinking).
An analysis without those frames is reported as such.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import polars as pl

from analytics import Analysis, Conventions, DriftReport, analyze, build_summaries, persist_analysis
from collectors import IngestRuntime, PipelineSettings
from dashboards import PLOTLY_JS, export_dashboards
from demo.generator import (
    SCENARIO_INFO,
    SCENARIOS,
    ExportStats,
    Scenario,
    ScenarioInfo,
    Workload,
    export_otlp_http,
)
from slo_rules import WebhookConfig, deliver, evaluate, load_rules
from storage import Store, TailwatchError, ensure_schema, open_store, parse_dsn

__all__ = [
    "DEMO_RULES_PATH",
    "DemoError",
    "DemoResult",
    "ProgressBar",
    "ScenarioOutcome",
    "WebhookSink",
    "alert_links",
    "format_summary",
    "match_alerts",
    "read_alert_lines",
    "run_demo",
]

DEMO_RULES_PATH = Path(__file__).with_name("rules.yaml")
# Spans per OTLP export request (the SDK batch processor sends 512; bigger means fewer fsyncs).
EXPORT_BATCH = 2048
# Export threads in the generator process: requests in flight while the next spans are built.
EXPORT_THREADS = 2
# The evidence each scenario must show besides its alert (the demo's ground truth, not the rules'
# thresholds): (a) the release added at least this many sync LLM calls per request; (b) the share
# of calls to the victim's model that come from cold-path work rose at least this much, (e) not;
# (f) the async variant's share of requests is within three binomial standard deviations of the
# rollout's (at least this far), and its p99 at most this fraction of the sync control's.
MIN_SYNC_LLM_INCREASE = 0.5
MIN_COLD_SHARE_RISE = 0.1
MIN_SPLIT_TOLERANCE = 0.05
MAX_TREATMENT_P99_RATIO = 0.5
# The columns the demo reads of the analysis frames that the boundary report adds.
BOUNDARY_COLUMNS = (
    "service",
    "operation",
    "p99_ms",
    "budget_ms",
    "p99_without_sync_llm_ms",
    "recommendation",
)
SLICES_COLUMNS = ("service", "operation", "flag", "variant", "requests", "p99_ms", "cold_p99_s")
# The architecture drift report over the three simulated days, by day: "then" the first day, "now"
# the last (analytics.drift; the product's default is 14 days with 3-day edges).
DEMO_CONVENTIONS = Conventions(drift_days=3, drift_edge_days=1)


class ProgressBar(Protocol):
    """What the demo needs of a progress bar; ``tqdm`` is one."""

    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class DemoError(TailwatchError):
    """The demo could not run (a stage failed, the output directory is unusable)."""


class WebhookSink:
    """A loopback HTTP endpoint that appends every POSTed JSON body as one line to a file.

    Usage::

        with WebhookSink(Path("alerts.jsonl")) as sink:
            deliver(store, [WebhookConfig(sink.url)], force=True)
    """

    def __init__(self, path: Path, host: str = "127.0.0.1") -> None:
        self.path = path
        self.received = 0
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    # One line per delivery, whatever the sender's formatting.
                    line = json.dumps(json.loads(body), separators=(",", ":"), ensure_ascii=False)
                except ValueError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with sink._lock, sink.path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")
                    sink.received += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-webhook", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def __enter__(self) -> WebhookSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@dataclass
class ScenarioOutcome:
    """One row of the summary table."""

    scenario: Scenario
    letter: str
    enabled: bool
    expected_kind: str | None  # None: no alert expected, the analysis frames are the evidence
    expected_cause: str | None
    target: str
    alerts: list[str] = field(default_factory=list)  # alert names that fired on the target
    kind: str = ""  # the expected rule kind, when it fired
    cause: str = ""  # its alert's `cause` (llm, internal, mixed, none)
    evidence: str = ""
    evidence_ok: bool = True
    # False when the frame the evidence is read from lacks its columns: only "no alert" is checked.
    scored: bool = True
    summary: str = ""
    where: str = ""
    exemplar_trace: str = ""

    @property
    def caught(self) -> bool:
        if self.expected_kind is None:
            return not self.alerts and self.scored and self.evidence_ok
        return (
            self.kind == self.expected_kind
            and (self.expected_cause is None or self.cause == self.expected_cause)
            and self.evidence_ok
        )

    @property
    def ok(self) -> bool:
        if not self.enabled or (self.expected_kind is None and not self.scored):
            return not self.alerts
        return self.caught


@dataclass
class DemoResult:
    out_dir: Path
    store_dsn: str
    scenarios: tuple[Scenario, ...]
    outcomes: list[ScenarioOutcome]
    timings: dict[str, float]
    spans: int
    spans_per_s: float
    alerts_delivered: int
    dashboards: list[str]
    period: dict[str, str]
    unexpected: list[str] = field(default_factory=list)  # alerts on no scenario's target

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes) and not self.unexpected

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["out_dir"] = str(self.out_dir)
        data["ok"] = self.ok
        for row, outcome in zip(data["outcomes"], self.outcomes, strict=True):
            row["caught"] = outcome.caught
            row["ok"] = outcome.ok
        return data


# ---------------------------------------------------------------------------------------------
# Matching delivered alerts to scenarios
# ---------------------------------------------------------------------------------------------


def _alert_kind(alert: dict[str, Any], kinds: dict[str, str]) -> str:
    labels = alert.get("labels", {})
    return labels.get("kind") or kinds.get(labels.get("alertname", ""), "")


def _on_target(alert: dict[str, Any], info_service: str, info_operation: str) -> bool:
    labels = alert.get("labels", {})
    if labels.get("workflow"):
        return bool(labels["workflow"] == info_operation)
    if labels.get("queue"):
        return bool(labels["queue"] == info_operation)
    return bool(labels.get("service") == info_service and labels.get("operation") == info_operation)


def read_alert_lines(path: Path) -> list[dict[str, Any]]:
    """Firing alerts of every webhook body in ``path`` (one Alertmanager body per line)."""
    alerts: list[dict[str, Any]] = []
    if not path.exists():
        return alerts
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        body = json.loads(line)
        alerts.extend(a for a in body.get("alerts", []) if a.get("status") == "firing")
    return alerts


def alert_links(path: Path) -> list[str]:
    """Every link of every alert (firing or resolved) in the webhook bodies of ``path``: its
    annotations' values and its ``generatorURL`` that are URLs, in order, without repeats."""
    links: dict[str, None] = {}
    if not path.exists():
        return []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        for alert in json.loads(line).get("alerts", []):
            values = [*alert.get("annotations", {}).values(), alert.get("generatorURL", "")]
            for value in values:
                if isinstance(value, str) and re.match(r"[a-z]+://", value):
                    links[value] = None
    return list(links)


def _target(frame: pl.DataFrame, info: ScenarioInfo) -> pl.DataFrame:
    """The rows of a per-operation frame for the scenario's (service, operation)."""
    return frame.filter((pl.col("service") == info.service) & (pl.col("operation") == info.operation))


def _signed_ms(ms: float) -> str:
    """A change as the alerts print it: ``+850 ms``, ``+1.9 s``, ``−3.7 s``."""
    size = abs(ms)
    if size < 1000:
        text = f"{size:.0f} ms"
    elif size < 100_000:
        text = f"{size / 1000:.1f} s"
    elif size < 600_000:
        text = f"{size / 1000:.0f} s"
    else:
        text = f"{size / 60_000:.1f} min"
    return ("+" if ms >= 0 else "−") + text


def _pct_pair(before: float | None, after: float | None) -> str:
    return "n/a" if before is None or after is None else f"{before:.0%} → {after:.0%}"


def _frame(frame: pl.DataFrame, name: str, columns: Sequence[str]) -> pl.DataFrame | str:
    """The frame, or why it cannot be read (it lacks columns the demo reads)."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        return f"{name} frame lacks {', '.join(missing)}"
    return frame


def _ms(value: float | None) -> str:
    return "n/a" if value is None else _signed_ms(value).lstrip("+")


def _boundary_note(info: ScenarioInfo, analysis: Analysis) -> str:
    """The hot/cold boundary recommendation for the operation, with the numbers behind it."""
    frame = _frame(analysis.boundary, "boundary", BOUNDARY_COLUMNS)
    if isinstance(frame, str):
        return frame
    rows = _target(frame, info)
    if rows.is_empty():
        return "no boundary row"
    row = rows.row(0, named=True)
    return (
        f"{row['recommendation']}: p99 {_ms(row['p99_ms'])}, budget {_ms(row['budget_ms'])}, "
        f"{_ms(row['p99_without_sync_llm_ms'])} without sync LLM"
    )


def _slices_evidence(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool, bool]:
    """The migration's slices: the sync control against the async variant (requests, p99, and the
    cold path's enqueue-to-ready p99 the async variant's users now wait for). Returns the text,
    whether it holds, and whether the analysis could tell (False when the frame lacks columns)."""
    flag = info.flag
    assert flag is not None
    frame = _frame(analysis.slices, "slices", SLICES_COLUMNS)
    if isinstance(frame, str):
        return frame, False, False
    rows = _target(frame, info).filter(pl.col("flag") == flag.key)
    by_variant = {str(r["variant"]): r for r in rows.to_dicts()}
    control, treatment = by_variant.get(flag.control), by_variant.get(flag.treatment)
    if control is None or treatment is None:
        seen = ", ".join(sorted(by_variant)) or "none"
        return f"{flag.key}: variants {seen}, expected {flag.control} and {flag.treatment}", False, True
    if control.get("is_control") is False:
        # The analysis compares the variants against another control: its deltas mean something else.
        return f"{flag.key}: the analysis does not take {flag.control} as the control", False, True
    total = (control["requests"] or 0) + (treatment["requests"] or 0)
    share = (treatment["requests"] or 0) / total if total else 0.0
    c_p99, t_p99 = control["p99_ms"], treatment["p99_ms"]
    faster = c_p99 is not None and t_p99 is not None and t_p99 <= MAX_TREATMENT_P99_RATIO * c_p99
    cold = treatment["cold_p99_s"]
    text = (
        f"{flag.key}: {flag.control} {1 - share:.0%} p99 {_ms(c_p99)} vs {flag.treatment} {share:.0%} "
        f"p99 {_ms(t_p99)}, cold p99 {_ms(None if cold is None else cold * 1000)}"
    )
    p = flag.treatment_share
    tolerance = max(MIN_SPLIT_TOLERANCE, 3 * math.sqrt(p * (1 - p) / total)) if total else 0.0
    return text, faster and abs(share - p) <= tolerance, True


def _release_evidence(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool]:
    """The release of the window that added synchronous LLM calls (else its latest release), and the
    operation's boundary recommendation."""
    text, holds = _release_row(info, analysis)
    return f"{text}; {_boundary_note(info, analysis)}", holds


def _release_row(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool]:
    served = _target(analysis.releases, info).sort("released_at")
    if served.is_empty():
        return "no release in the window", False
    added = served.filter(
        pl.col("sync_llm_calls_per_request_after") - pl.col("sync_llm_calls_per_request_before")
        >= MIN_SYNC_LLM_INCREASE
    )
    row = (served if added.is_empty() else added).row(-1, named=True)
    before, after = row["sync_llm_calls_per_request_before"], row["sync_llm_calls_per_request_after"]
    if before is None or after is None:
        return f"{row['version']}: sync LLM calls/request n/a", False
    return (
        f"{row['version']}: sync LLM calls/request {before:.2f} → {after:.2f}",
        after - before >= MIN_SYNC_LLM_INCREASE,
    )


def _times(value: float | None) -> str:
    return "?" if value is None else f"×{value:.2f}"


def _retry_evidence(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool]:
    rows = analysis.retry_amplification.filter(pl.col("workflow") == info.operation)
    row = rows.row(0, named=True) if not rows.is_empty() else {}
    # The alert's kind is the diagnosis: no second fact to check.
    return (
        f"attempts {_times(row.get('attempt_amplification'))}, "
        f"tokens {_times(row.get('token_amplification'))}",
        True,
    )


def _hot_path_evidence(name: Scenario, info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool]:
    """The span that carries the p99 change and, for the LLM scenarios, the cold-path share of calls
    to the operation's model: what tells a noisy neighbour (b) from a slow provider (e)."""
    spans = _target(analysis.attribution_spans, info).sort(
        pl.col("delta_ms").fill_null(0.0), descending=True, maintain_order=True
    )
    top = ""
    if not spans.is_empty():
        first = spans.row(0, named=True)
        top = f"{first['span_name']} {_signed_ms(float(first['delta_ms'] or 0.0))}"
    # The model whose signals the alert reports: that of the LLM span adding the most time, else the
    # first with signals.
    slower = spans.filter((pl.col("class") == "llm") & (pl.col("delta_ms") > 0))
    preferred = list(dict.fromkeys(slower.select("provider", "model").rows()))

    def rank(row: dict[str, Any]) -> int:
        key = (row["provider"], row["model"])
        return preferred.index(key) if key in preferred else len(preferred)

    signals = sorted(_target(analysis.llm_signals, info).to_dicts(), key=rank)
    model, before, after = "?", None, None
    if signals:
        main = signals[0]
        model = " ".join(str(p) for p in (main["provider"], main["model"]) if p) or "?"
        before, after = main["cold_share_baseline"], main["cold_share_current"]
    rising = before is not None and after is not None and after - before >= MIN_COLD_SHARE_RISE
    if name == "noisy_neighbour":
        # A noisy batch neighbour, not a slow provider: cold work now shares the model.
        return f"{top}; cold share of {model} {_pct_pair(before, after)}", rising
    cause_text, cause_ok = _llm_cause_evidence(info, analysis)
    if name == "llm_slowdown":
        return f"{top}; cold share {_pct_pair(before, after)}{cause_text}", not rising and cause_ok
    return f"{top}{cause_text}", cause_ok


def _llm_cause_evidence(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool]:
    """Which part of the model call moved (the attribution row's ``llm_cause``), for a scenario that
    expects one: the text to append and whether it is the expected cause."""
    if info.llm_cause is None:
        return "", True
    rows = _target(analysis.attribution, info)
    if rows.is_empty() or "llm_cause" not in rows.columns or rows["llm_cause"][0] is None:
        return "; cause inside llm not found", False
    row = rows.row(0, named=True)
    return f"; {row['llm_cause_text']}", row["llm_cause"] == info.llm_cause


def _drift_evidence(info: ScenarioInfo, analysis: Analysis) -> tuple[str, bool, bool]:
    """The findings of the analysis' drift report: the scenario's expected kinds, the shared
    function's from the report's last day (when the endpoint appeared). Returns the text, whether
    it holds, and whether the analysis could tell (False without a drift report)."""
    report = analysis.drift
    if report is None:
        return "no drift report with the analysis", False, False
    # Another scenario's service can drift too (h's prompt raises its tokens per request): its
    # findings are that scenario's, not this one's.
    others = {i.service for i in SCENARIO_INFO.values() if i.name != info.name}
    mine = [f for f in report.findings if f.service not in others]
    if not mine:
        return "no drift finding", False, True
    parts = []
    for f in mine:
        e = f.evidence
        if f.kind == "shared_operation":
            what = (
                f"hot share {_pct_pair(e.get('hot_share_then'), e.get('hot_share_now'))}, "
                f"hot p99 {_ms(e.get('hot_p99_ms_now'))}"
            )
        elif f.kind == "batch_shrinking":
            what = (
                f"{e.get('runs_per_day_then', 0):.0f} run/day of {e.get('items_per_run_then', 0):.0f} → "
                f"{e.get('runs_per_day_now', 0):.0f} of {e.get('items_per_run_now', 0):.0f}"
            )
        elif f.kind == "whole_batch_retry":
            what = (
                f"{e.get('items_reprocessed_per_failed_item', 0):.0f} items reprocessed per failed item, "
                f"{e.get('retried_jobs', 0)} retried jobs"
            )
        else:
            what = f.operation or f.queue
        release = f" with {f.since_release}" if f.since_release else ""
        parts.append(f"{f.kind} since {f.since:%m-%d}{release}: {what}")
    last_day = report.end - timedelta(days=report.edge_days)
    shared = [
        f
        for f in mine
        if f.kind == "shared_operation" and f.operation == info.operation and f.since == last_day
    ]
    kinds = {f.kind for f in mine}
    return "; ".join(parts), bool(shared) and set(info.drift) <= kinds, True


def _evidence(name: Scenario, analysis: Analysis) -> tuple[str, bool]:
    """The one fact that tells this scenario apart, from the analysis, and whether it holds."""
    info = SCENARIO_INFO[name]
    if name == "release_coupling":
        return _release_evidence(info, analysis)
    if name == "retry_storm":
        return _retry_evidence(info, analysis)
    return _hot_path_evidence(name, info, analysis)


def _exemplar(name: Scenario, analysis: Analysis) -> str:
    """The trace to open: the workflow's most retried run, else the operation's first slow trace."""
    info = SCENARIO_INFO[name]
    if name == "retry_storm":
        runs = analysis.retry_amplification.filter(pl.col("workflow") == info.operation)
        return str(runs["exemplar_trace_id"][0] or "") if not runs.is_empty() else ""
    rows = _target(analysis.attribution, info)
    ids = rows["exemplar_trace_ids"][0] if not rows.is_empty() else None
    return str(ids[0]) if ids is not None and len(ids) else ""


def match_alerts(
    alerts: Sequence[dict[str, Any]],
    scenarios: Sequence[Scenario],
    rule_kinds: dict[str, str],
    dashboards_dir: Path,
    analysis: Analysis,
) -> tuple[list[ScenarioOutcome], list[str]]:
    """Per scenario: the firing alerts on its target (by their labels), the expected kind's cause,
    the evidence and the trace to open (from ``analysis``), where to look; and the alerts that fired
    on no scenario's target."""
    outcomes: list[ScenarioOutcome] = []
    claimed: set[int] = set()
    for name in SCENARIOS:
        info = SCENARIO_INFO[name]
        outcome = ScenarioOutcome(
            scenario=name,
            letter=info.letter,
            enabled=name in scenarios,
            expected_kind=info.alert_kind,
            expected_cause=info.cause,
            target=f"{info.service} {info.operation}",
            where=str(dashboards_dir / f"{info.view}.html"),
        )
        on_target = [a for a in alerts if _on_target(a, info.service, info.operation)]
        claimed.update(id(a) for a in on_target)
        outcome.alerts = sorted({a["labels"].get("alertname", "?") for a in on_target})
        if info.alert_kind is None:
            if outcome.enabled and info.flag is not None:
                outcome.evidence, outcome.evidence_ok, outcome.scored = _slices_evidence(info, analysis)
            elif outcome.enabled and info.drift:
                outcome.evidence, outcome.evidence_ok, outcome.scored = _drift_evidence(info, analysis)
            outcomes.append(outcome)
            continue
        primary = [a for a in on_target if _alert_kind(a, rule_kinds) == info.alert_kind]
        if primary:
            annotations = primary[0].get("annotations", {})
            outcome.kind = info.alert_kind
            outcome.cause = annotations.get("cause", "")
            outcome.summary = annotations.get("summary", "")
            outcome.evidence, outcome.evidence_ok = _evidence(name, analysis)
            outcome.exemplar_trace = _exemplar(name, analysis)
        outcomes.append(outcome)
    unexpected = sorted(
        {
            f"{a['labels'].get('alertname', '?')} on "
            + " ".join(
                a["labels"][k] for k in ("service", "operation", "queue", "workflow") if a["labels"].get(k)
            )
            for a in alerts
            if id(a) not in claimed
        }
    )
    return outcomes, unexpected


def format_summary(result: DemoResult, cwd: Path | None = None) -> str:
    """The table the demo prints: scenario, alert, cause, the evidence, where to look."""

    def rel(path: str) -> str:
        try:
            return str(Path(path).resolve().relative_to((cwd or Path.cwd()).resolve()))
        except ValueError:
            return path

    rows = [("scenario", "alert raised", "cause", "evidence", "check", "where to look")]
    for o in result.outcomes:
        label = f"({o.letter}) {o.scenario}" + ("" if o.enabled else " [off]")
        alert = ", ".join(o.alerts) if o.alerts else "-"
        cause = o.kind + (f"/{o.cause}" if o.cause and o.cause != "none" else "") if o.kind else "-"
        check = "ok" if o.ok else ("MISSED" if o.enabled else "UNEXPECTED")
        if o.ok and o.enabled and not o.scored:
            check = "n/a"  # the analysis cannot tell: only the silence was checked
        where = "-"
        if o.alerts or (o.enabled and o.expected_kind is None):
            where = rel(o.where) + (f" trace {o.exemplar_trace}" if o.exemplar_trace else "")
        rows.append((label, alert, cause, o.evidence or "-", check, where))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * len(row[-1]))
    for alert in result.unexpected:
        lines.append(f"UNEXPECTED alert: {alert}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


@contextmanager
def _timed(timings: dict[str, float], step: str) -> Iterator[None]:
    began = time.perf_counter()
    try:
        yield
    finally:
        timings[step] = round(time.perf_counter() - began, 2)


def _fresh_store_dsn(out_dir: Path, store_dsn: str | None) -> str:
    if store_dsn:
        return store_dsn
    path = (out_dir / "store").resolve()
    # The demo owns OUT/store: wipe it so every run starts from an empty store.
    shutil.rmtree(path, ignore_errors=True)
    return f"chdb://{path}"


def run_demo(
    *,
    out_dir: Path,
    store_dsn: str | None = None,
    scenarios: Sequence[Scenario] = SCENARIOS,
    scale: float = 1.0,
    seed: int = 7,
    end: datetime | None = None,
    rules_path: Path = DEMO_RULES_PATH,
    progress: Callable[[int], ProgressBar] | None = None,
    echo: Callable[[str], None] = lambda _: None,
) -> DemoResult:
    """Runs the demo; ``progress(estimated_traces)`` opens a bar (e.g. ``tqdm``) for the export."""
    out_dir = out_dir.resolve()
    timings: dict[str, float] = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create {out_dir}: {exc.strerror or exc}") from exc
    alerts_path = out_dir / "alerts.jsonl"
    alerts_path.unlink(missing_ok=True)
    dashboards_dir = out_dir / "dashboards"
    shutil.rmtree(dashboards_dir, ignore_errors=True)
    shutil.rmtree(out_dir / "spool", ignore_errors=True)
    dsn = _fresh_store_dsn(out_dir, store_dsn)
    workload = Workload(scenarios, scale=scale, seed=seed, end=end)
    tl = workload.timeline
    echo(
        f"simulating {tl.start:%Y-%m-%d %H:%M} .. {tl.end:%Y-%m-%d %H:%M} UTC "
        f"(~{workload.estimated_traces():,} traces), scenarios: {', '.join(workload.scenarios) or 'none'}"
    )
    echo(f"store {parse_dsn(dsn).redacted()}")

    with (
        WebhookSink(alerts_path) as sink,
        _timed(timings, "total"),
        open_store(dsn) as store,
    ):
        with _timed(timings, "schema"):
            ensure_schema(store)
        with _timed(timings, "generate+ingest"):
            stats = _ingest(store, workload, out_dir / "spool", progress)
        echo(
            f"ingested {stats.spans:,} spans over OTLP/HTTP in {timings['generate+ingest']:.1f} s "
            f"({stats.spans / max(timings['generate+ingest'], 1e-9):,.0f} spans/s)"
        )
        if stats.failed_spans:
            raise DemoError(f"{stats.failed_spans} spans were refused by the receiver")

        with _timed(timings, "summaries"):
            # What `tailwatch serve` keeps up to date every minute: the analysis, the rules and the
            # dashboards below read these (and the spans of whatever they do not cover).
            summarised = build_summaries(store, until=tl.end)
        echo(f"summaries: {summarised.describe()}")
        with _timed(timings, "analyze"):
            # The window the demo rules read (the last day against the day before): the scenarios are
            # scored from these frames.
            analysis = analyze(store, tl.current_start, tl.end)
            run_id = persist_analysis(store, analysis)
            # The drift report of the three days, kept for the hour: the dashboards draw the same.
            analysis = analysis.with_drift(DriftReport.read(store, tl.end, DEMO_CONVENTIONS))
        with _timed(timings, "rules"):
            rule_kinds, delivered = _alerts(store, rules_path, tl.end, sink.url, dashboards_dir)
        with _timed(timings, "dashboards"):
            # Opened from disk: one plotly.js beside the pages rather than 4.8 MB in each.
            report = export_dashboards(
                store, dashboards_dir, run_id=run_id, plotly_js="shared", conventions=DEMO_CONVENTIONS
            )
            dashboards = [str(p) for p in report.files]
            # Each alert links to the analysis behind its numbers (dashboards/runs/<run>/<view>.html,
            # what `tailwatch serve` renders on request): the demo writes those pages too.
            dashboards += [str(p) for p in _export_linked_runs(store, alerts_path, dashboards_dir)]

    outcomes, unexpected = match_alerts(
        read_alert_lines(alerts_path), workload.scenarios, rule_kinds, dashboards_dir, analysis
    )
    result = DemoResult(
        out_dir=out_dir,
        store_dsn=parse_dsn(dsn).redacted(),
        scenarios=workload.scenarios,
        outcomes=outcomes,
        timings=timings,
        spans=stats.spans,
        spans_per_s=round(stats.spans_per_s),
        alerts_delivered=delivered,
        dashboards=dashboards,
        unexpected=unexpected,
        period={
            "start": tl.start.isoformat(),
            "baseline_start": tl.baseline_start.isoformat(),
            "current_start": tl.current_start.isoformat(),
            "end": tl.end.isoformat(),
        },
    )
    (out_dir / "summary.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result


def _export_process(
    scenarios: tuple[Scenario, ...],
    scale: float,
    seed: int,
    end: datetime,
    endpoint: str,
    batch_size: int,
    progress: Any,
    results: Any,
) -> None:
    """The generator as a client process of its own, as an instrumented application would be: its
    SDK work and the receiver's decoding and inserts do not share one interpreter lock."""
    workload = Workload(scenarios, scale=scale, seed=seed, end=end)
    stats = export_otlp_http(
        workload, endpoint, batch_size=batch_size, progress=progress.put, concurrency=EXPORT_THREADS
    )
    results.put(asdict(stats))


def _ingest(
    store: Store,
    workload: Workload,
    spool_dir: Path,
    progress: Callable[[int], ProgressBar] | None,
) -> ExportStats:
    """Receiver + pipeline on an ephemeral loopback port; a generator process exports to it."""
    # With a spool an export is acknowledged once fsync'd, not once inserted, so the exporter
    # never waits for a flush; big insert batches suit ClickHouse.
    runtime = IngestRuntime(
        store,
        PipelineSettings(
            batch_rows=50_000, flush_interval_s=0.5, max_queue_spans=400_000, spool_dir=spool_dir
        ),
        http="127.0.0.1:0",
        grpc=None,
    )
    # spawn, not fork: the parent runs the embedded engine's threads, which a fork would copy.
    ctx = multiprocessing.get_context("spawn")
    progress_q = ctx.Queue()
    results_q = ctx.Queue()
    try:
        runtime.start()
        endpoint = f"http://127.0.0.1:{runtime.http_port}/v1/traces"
        bar = progress(workload.estimated_traces()) if progress else None
        child = ctx.Process(
            target=_export_process,
            args=(
                workload.scenarios,
                workload.scale,
                workload.seed,
                workload.timeline.end,
                endpoint,
                EXPORT_BATCH,
                progress_q,
                results_q,
            ),
            name="tailwatch-demo-generator",
            daemon=True,
        )
        child.start()
        stats_dict: dict[str, Any] | None = None
        while stats_dict is None:
            try:
                started = progress_q.get(timeout=0.2)
                if bar is not None:
                    bar.update(started)
                continue
            except queue.Empty:
                pass
            try:
                stats_dict = results_q.get_nowait()
            except queue.Empty:
                if not child.is_alive() and results_q.empty():
                    raise DemoError(f"the generator process exited with code {child.exitcode}") from None
        child.join(30)
        if bar is not None:
            bar.close()
        if not runtime.flush(timeout_s=120):
            raise DemoError("the ingest pipeline did not drain within 120 s")
    finally:
        runtime.stop()
        progress_q.close()
        results_q.close()
    return ExportStats(**stats_dict)


_RUN_LINK = re.compile(r"/runs/([0-9a-f]{32})/[a-z_]+\.html$")


def _export_linked_runs(store: Store, alerts_path: Path, dashboards_dir: Path) -> list[Path]:
    """The views of every analysis run an alert in ``alerts_path`` links to under
    ``dashboards_dir``, written to ``dashboards_dir/runs/<run>/`` (loading the shared plotly.js two
    directories up); returns the files written."""
    base = dashboards_dir.as_uri()
    runs = {
        found.group(1): None
        for link in alert_links(alerts_path)
        if link.startswith(base + "/") and (found := _RUN_LINK.search(link)) is not None
    }
    files: list[Path] = []
    for run in runs:
        report = export_dashboards(
            store,
            dashboards_dir / "runs" / run,
            run_id=run,
            plotly_js=f"../../{PLOTLY_JS}",
            conventions=DEMO_CONVENTIONS,
        )
        files += report.files
    return files


def _alerts(
    store: Store, rules_path: Path, at: datetime, url: str, dashboards_dir: Path
) -> tuple[dict[str, str], int]:
    """Evaluates the demo rules at ``at`` and delivers their notifications to ``url``; returns each
    rule's kind by name and the notifications delivered."""
    rules = load_rules([rules_path])
    kinds = {str(rule.name): str(rule.kind) for rule in rules.rules}
    notifiers = [WebhookConfig(url=url, name="demo-webhook")]
    evaluate(store, rules, at, notifiers=notifiers, dashboard_url=dashboards_dir.as_uri())
    return kinds, deliver(store, notifiers, force=True).delivered
