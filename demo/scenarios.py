"""``tailwatch demo``: the whole pipeline on simulated traffic, from OTLP spans to alerts and dashboards.

The steps, all in one process on loopback:

1. a fresh embedded store (``OUT/store``, wiped) or the ``--store`` given;
2. the OTLP/HTTP receiver and ingest pipeline of :mod:`collectors` on ``127.0.0.1`` (ephemeral port);
3. the :class:`~demo.generator.Workload` exported through the SDK's ``OTLPSpanExporter``;
4. the analysis of the last simulated day against the day before (``analytics.analyze``), persisted;
5. the demo rules (``demo/rules.yaml``) evaluated at the simulated end, alerts delivered
   to a webhook receiver the demo runs on ``127.0.0.1`` that appends each body to
   ``OUT/alerts.jsonl``;
6. the dashboards exported to ``OUT/dashboards/``;
7. a summary: per scenario the alert it raised, its cause and where to look; also in
   ``OUT/summary.json``.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from demo.generator import (
    SCENARIO_INFO,
    SCENARIOS,
    ExportStats,
    Scenario,
    Workload,
    export_otlp_http,
)
from storage import Store, TailwatchError, open_store, parse_dsn

__all__ = [
    "DEMO_RULES_PATH",
    "DemoError",
    "DemoResult",
    "ProgressBar",
    "ScenarioOutcome",
    "WebhookSink",
    "format_summary",
    "match_alerts",
    "run_demo",
]

DEMO_RULES_PATH = Path(__file__).with_name("rules.yaml")
# Spans per OTLP export request (the SDK batch processor sends 512; bigger means fewer fsyncs).
EXPORT_BATCH = 2048
# Export threads in the generator process: requests in flight while the next spans are built.
EXPORT_THREADS = 2


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
    expected_kind: str
    expected_cause: str | None
    target: str
    alerts: list[str] = field(default_factory=list)  # alert names that fired on the target
    kind: str = ""  # the expected rule kind, when it fired
    cause: str = ""  # its `cause` annotation
    evidence: str = ""
    evidence_ok: bool = True
    summary: str = ""
    where: str = ""
    exemplar_trace: str = ""

    @property
    def caught(self) -> bool:
        return (
            self.kind == self.expected_kind
            and (self.expected_cause is None or self.cause == self.expected_cause)
            and self.evidence_ok
        )

    @property
    def ok(self) -> bool:
        return self.caught if self.enabled else not self.alerts


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
    missing_stages: list[str]
    period: dict[str, str]
    unexpected: list[str] = field(default_factory=list)  # alerts on no scenario's target

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes) and not self.unexpected and not self.missing_stages

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


def _pair(text: str) -> tuple[float, float] | None:
    """``"0 → 0.2053"`` (the rules' before → after annotations) as numbers."""
    parts = [p.strip() for p in text.replace("->", "→").split("→")]
    try:
        return (float(parts[0]), float(parts[1])) if len(parts) == 2 else None
    except ValueError:
        return None


def _fmt_pair(pair: tuple[float, float] | None, raw: str, percent: bool = False) -> str:
    if pair is None:
        return raw or "n/a"
    if percent:
        return f"{pair[0]:.0%} → {pair[1]:.0%}"
    return f"{pair[0]:.2f} → {pair[1]:.2f}"


def _times(value: str) -> str:
    try:
        return f"×{float(value):.2f}"
    except ValueError:
        return value or "?"


def _evidence(scenario: Scenario, annotations: dict[str, str]) -> tuple[str, bool]:
    """The one fact that tells this scenario apart, read from the alert, and whether it holds."""
    if scenario == "release_coupling":
        raw = annotations.get("sync_llm_calls_per_request", "")
        pair = _pair(raw)
        return (
            f"{annotations.get('release', '?')}: sync LLM calls/request {_fmt_pair(pair, raw)}",
            bool(pair and pair[1] - pair[0] >= 0.5),
        )
    if scenario == "retry_storm":
        return (
            f"attempts {_times(annotations.get('attempt_amplification', ''))}, "
            f"tokens {_times(annotations.get('token_amplification', ''))}",
            True,
        )
    # "chat claude-sonnet-4 (llm, anthropic claude-sonnet-4) +3.3 s" -> "chat claude-sonnet-4 +3.3 s"
    top = re.sub(r"\s*\([^)]*\)", "", annotations.get("top_spans", "").split(";")[0]).strip()
    raw = annotations.get("llm_cold_share", "")
    pair = _pair(raw)
    rising = bool(pair and pair[1] - pair[0] >= 0.1)
    if scenario == "noisy_neighbour":
        # A noisy batch neighbour, not a slow provider: cold work now shares the model.
        return (
            f"{top}; cold share of {annotations.get('llm_model', '?')} {_fmt_pair(pair, raw, True)}",
            rising,
        )
    if scenario == "llm_slowdown":
        return f"{top}; cold share {_fmt_pair(pair, raw, True)}", not rising
    return top, True


def match_alerts(
    alerts: Sequence[dict[str, Any]],
    scenarios: Sequence[Scenario],
    rule_kinds: dict[str, str],
    dashboards_dir: Path,
    fallback_exemplars: dict[str, str] | None = None,
) -> tuple[list[ScenarioOutcome], list[str]]:
    """Per scenario: the firing alerts on its target, the expected kind's cause and evidence, where to
    look; and the alerts that fired on no scenario's target."""
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
        primary = [a for a in on_target if _alert_kind(a, rule_kinds) == info.alert_kind]
        if primary:
            annotations = primary[0].get("annotations", {})
            outcome.kind = info.alert_kind
            outcome.cause = annotations.get("cause", "")
            outcome.summary = annotations.get("summary", "")
            outcome.evidence, outcome.evidence_ok = _evidence(name, annotations)
            exemplars = [t.strip() for t in annotations.get("exemplar_trace_ids", "").split(",") if t.strip()]
            outcome.exemplar_trace = (
                exemplars[0] if exemplars else (fallback_exemplars or {}).get(info.operation, "")
            )
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
        where = "-"
        if o.alerts:
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
    missing: list[str] = []
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

    rule_kinds: dict[str, str] = {}
    dashboards: list[str] = []
    delivered = 0
    with (
        WebhookSink(alerts_path) as sink,
        _timed(timings, "total"),
        open_store(dsn) as store,
    ):
        with _timed(timings, "schema"):
            from storage import ensure_schema

            ensure_schema(store)
        with _timed(timings, "generate+ingest"):
            stats = _ingest(store, workload, out_dir / "spool", progress)
        echo(
            f"ingested {stats.spans:,} spans over OTLP/HTTP in {timings['generate+ingest']:.1f} s "
            f"({stats.spans / max(timings['generate+ingest'], 1e-9):,.0f} spans/s)"
        )
        if stats.failed_spans:
            raise DemoError(f"{stats.failed_spans} spans were refused by the receiver")

        analysis = None
        with _timed(timings, "analyze"):
            analysis = _analyze(store, tl.current_start, tl.end, missing)
        with _timed(timings, "rules"):
            rule_kinds, delivered = _alerts(store, rules_path, tl.end, sink.url, dashboards_dir, missing)
        with _timed(timings, "dashboards"):
            dashboards = _dashboards(store, dashboards_dir, tl.current_start, tl.end, missing)
        del analysis
        # Retry alerts carry no exemplar: point at the current window's most retried run.
        workflow = SCENARIO_INFO["retry_storm"].operation
        exemplars = {workflow: _most_retried_run(store, workflow, tl.current_start, tl.end)}

    outcomes, unexpected = match_alerts(
        read_alert_lines(alerts_path), workload.scenarios, rule_kinds, dashboards_dir, exemplars
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
        missing_stages=missing,
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
    from collectors.pipeline import IngestPipeline
    from collectors.receivers import Receivers
    from collectors.settings import PipelineSettings

    # With a spool an export is acknowledged once fsync'd, not once inserted, so the exporter
    # never waits for a flush; big insert batches suit ClickHouse.
    pipeline = IngestPipeline(
        store,
        PipelineSettings(
            batch_rows=50_000, flush_interval_s=0.5, max_queue_spans=400_000, spool_dir=spool_dir
        ),
    )
    pipeline.start()
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    # spawn, not fork: the parent runs the embedded engine's threads, which a fork would copy.
    ctx = multiprocessing.get_context("spawn")
    progress_q = ctx.Queue()
    results_q = ctx.Queue()
    try:
        receivers.start()
        endpoint = f"http://127.0.0.1:{receivers.http_port}/v1/traces"
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
        if not pipeline.flush(timeout_s=120):
            raise DemoError("the ingest pipeline did not drain within 120 s")
    finally:
        receivers.stop()
        pipeline.stop()
        progress_q.close()
        results_q.close()
    return ExportStats(**stats_dict)


def _most_retried_run(store: Store, workflow: str, start: datetime, end: datetime) -> str:
    """The trace of ``workflow`` with the most failed HTTP attempts (429s, 5xx: the attempts the
    provider SDK retries) in [start, end) ('' if none)."""
    from collectors.schema import TRACES_TABLE

    table = store.table(TRACES_TABLE)
    rows = store.query_rows(
        "SELECT TraceId, countIf(toUInt16OrZero(SpanAttributes['http.status_code']) >= 400 "
        "OR toUInt16OrZero(SpanAttributes['http.response.status_code']) >= 400) AS resends "
        f"FROM {table} WHERE Timestamp >= {{start:DateTime64(9)}} AND Timestamp < {{end:DateTime64(9)}} "
        f"AND TraceId IN (SELECT TraceId FROM {table} WHERE Timestamp >= {{start:DateTime64(9)}} "
        f"AND Timestamp < {{end:DateTime64(9)}} AND SpanAttributes['gen_ai.workflow.name'] = {{wf:String}}) "
        "GROUP BY TraceId ORDER BY resends DESC, TraceId LIMIT 1",
        {"start": start, "end": end, "wf": workflow},
    )
    return str(rows[0][0]) if rows and rows[0][1] else ""


def _analyze(store: Store, start: datetime, end: datetime, missing: list[str]) -> Any:
    try:
        from analytics import analyze, persist_analysis
    except ImportError:
        missing.append("analytics")
        return None
    analysis = analyze(store, start, end)
    persist_analysis(store, analysis)
    return analysis


def _alerts(
    store: Store, rules_path: Path, at: datetime, url: str, dashboards_dir: Path, missing: list[str]
) -> tuple[dict[str, str], int]:
    try:
        from slo_rules import WebhookConfig, deliver, evaluate, load_rules
    except ImportError:
        missing.append("slo_rules")
        return {}, 0
    rules = load_rules([rules_path])
    kinds = {str(rule.name): str(rule.kind) for rule in rules.rules}
    notifiers = [WebhookConfig(url=url, name="demo-webhook")]
    evaluate(store, rules, at, notifiers=notifiers, dashboard_url=dashboards_dir.as_uri())
    report = deliver(store, notifiers, force=True)
    return kinds, int(getattr(report, "delivered", 0))


def _dashboards(store: Store, out: Path, start: datetime, end: datetime, missing: list[str]) -> list[str]:
    try:
        from dashboards import export_dashboards
    except ImportError:
        missing.append("dashboards")
        return []
    report = export_dashboards(store, out, start, end)
    return [str(p) for p in report.files]
