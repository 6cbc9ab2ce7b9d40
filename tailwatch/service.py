"""``tailwatch serve``: receivers, scheduled jobs and the read API in one process.

:class:`JobRunner` owns the APScheduler 3 ``BackgroundScheduler``: one job per stage call, each
with an interval or cron trigger, ``coalesce=True`` (a backlog of missed ticks runs once),
``max_instances=1`` (a slow run is never overlapped by the next) and ``misfire_grace_time``. Every
run — ok, error, or skipped because it missed its slot, overlapped, or this instance does not hold
the scheduler lease — is one row in ``tailwatch_job_runs`` and one increment in ``/metrics``. A job
that raises is logged and recorded; the scheduler simply fires it again at the next tick, and the
receivers never notice.

:class:`Service` wires the stages together: the ingest pipeline and receivers (collectors), the
API and ``/dashboards/`` routes (:mod:`tailwatch.api`) mounted on the OTLP/HTTP port, the jobs
(analytics, slo_rules, dashboards), the tail metrics on ``/metrics`` (:mod:`tailwatch.metrics`)
and the discovery file read commands use to find the API.

Usage::

    service = Service(load_config("tailwatch.toml"))
    service.start()          # returns once listening
    ...
    service.stop()           # stop accepting, flush the queue, let the running job finish
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from analytics import Conventions
from collectors import IngestPipeline, IngestRuntime, inspect_traces
from slo_rules import EvaluationResult, NotifierConfig, RuleSet
from storage import Lease, Store, TailwatchError, open_store, parse_dsn
from tailwatch.commands._common import check_traces, latency_targets
from tailwatch.config import JOB_NAMES, JobName, Schedule, TailwatchConfig
from tailwatch.metrics import TailMetrics
from tailwatch.remote import SERVICE_FILE
from tailwatch.service_schema import JOB_RUNS_TABLE, recent_job_runs

if TYPE_CHECKING:
    from tailwatch.api import ServiceApi

__all__ = [
    "Job",
    "JobContext",
    "JobRun",
    "JobRunner",
    "JobStatus",
    "ScheduledAnalysis",
    "SchedulerLease",
    "Service",
    "ServiceError",
    "dashboards_base_url",
    "default_jobs",
    "recent_job_runs",
]

log = logging.getLogger("tailwatch.service")

JobStatus = Literal["ok", "error", "skipped"]


class ServiceError(TailwatchError):
    """The service cannot start (a port in use, a store it cannot own)."""


SCHEDULER_LEASE = "scheduler"


def _now() -> datetime:
    return datetime.now(UTC)


class _CountingStore(Store):
    """The service's store as one job run sees it: the same client, counting rows read.

    It shares the service store's lock (the client is one session and the embedded engine one per
    process, so every caller must serialize on the same lock); closing it leaves the client open.
    """

    def __init__(self, inner: Store) -> None:
        super().__init__(inner.location, inner.client, shares=inner)
        self.rows_read = 0

    def query_arrow(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> pa.Table:
        table = super().query_arrow(sql, parameters, settings)
        self.rows_read += table.num_rows
        return table

    def query_rows(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        rows = super().query_rows(sql, parameters, settings)
        self.rows_read += len(rows)
        return rows


@dataclass(frozen=True)
class JobContext:
    """What a job function receives: the store (counting rows read), the config and its start time."""

    store: Store
    config: TailwatchConfig
    now: datetime


JobFunc = Callable[[JobContext], object]


@dataclass(frozen=True)
class Job:
    """A named function on a schedule. The function's return value is only logged."""

    name: str
    schedule: Schedule
    func: JobFunc


@dataclass(frozen=True)
class JobRun:
    job: str
    run_id: str
    started_at: datetime
    finished_at: datetime
    status: JobStatus
    error: str = ""
    rows_read: int = 0


class _JobMetrics:
    """The job series on the registry shared with the receivers' ``/metrics``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "tailwatch_job_runs", "Scheduled job runs by outcome.", ["job", "status"], registry=registry
        )
        self.duration = Histogram(
            "tailwatch_job_duration_seconds",
            "Wall time of scheduled job runs.",
            ["job"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.rows = Counter(
            "tailwatch_job_rows_read",
            "Rows returned by the store to scheduled jobs.",
            ["job"],
            registry=registry,
        )
        self.last_success = Gauge(
            "tailwatch_job_last_success_timestamp_seconds",
            "Unix time of the last successful run of each job.",
            ["job"],
            registry=registry,
        )
        self.leader = Gauge(
            "tailwatch_scheduler_leader",
            "1 when this instance holds the scheduler lease and runs the jobs.",
            registry=registry,
        )


class SchedulerLease(Lease):
    """Only the holder of this lease runs scheduled jobs; any other instance stays passive
    (:class:`storage.Lease`, named ``scheduler``)."""

    def __init__(
        self, store: Store, ttl_s: float, holder: str | None = None, *, exclusive_store: bool | None = None
    ) -> None:
        super().__init__(store, SCHEDULER_LEASE, ttl_s, holder, exclusive_store=exclusive_store)


class JobRunner:
    """The APScheduler ``BackgroundScheduler`` running :class:`Job` s, recording every run.

    Usage::

        runner = JobRunner(store, config, [Job("tick", Schedule("interval", seconds=2), fn)])
        runner.start()
        ...
        runner.stop(timeout_s=30)
    """

    def __init__(
        self,
        store: Store,
        config: TailwatchConfig,
        jobs: Sequence[Job],
        *,
        registry: CollectorRegistry | None = None,
        lease: SchedulerLease | None = None,
        on_run: Callable[[JobRun], None] | None = None,
    ) -> None:
        """``on_run`` is called after each run that was not skipped (the service refreshes the
        tail metrics then); what it raises is logged."""
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        self.store = store
        self.config = config
        self.jobs = {job.name: job for job in jobs if job.schedule.kind != "off"}
        self.metrics = _JobMetrics(registry if registry is not None else CollectorRegistry())
        self.lease = lease if lease is not None else SchedulerLease(store, config.schedule.lease_ttl)
        self.instance = self.lease.holder
        self.on_run = on_run
        self._running = 0
        self._idle = threading.Condition()
        self._lease_lock = threading.Lock()
        # One run per job at a time, also when the API asks for a run while a scheduled one is on.
        self._job_locks = {name: threading.Lock() for name in self.jobs}
        self._lease_checked = 0.0
        self._leader = False
        self.scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(max_workers=max(1, len(self.jobs)))},
            job_defaults={
                "coalesce": True,
                "max_instances": 1,
                "misfire_grace_time": max(1, round(config.schedule.misfire_grace)),
            },
        )

    @property
    def alive(self) -> bool:
        """The scheduler is running and its thread (APScheduler's ``_thread``) is alive: what the
        service's ``/readyz`` adds to ingest's readiness."""
        thread = getattr(self.scheduler, "_thread", None)
        return bool(self.scheduler.running) and (thread is None or thread.is_alive())

    def start(self) -> None:
        from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED

        for job in self.jobs.values():
            self.scheduler.add_job(
                self._run, job.schedule.trigger(), args=[job.name], id=job.name, name=job.name
            )
            log.info("job %s scheduled: %s", job.name, job.schedule.describe())
        self.scheduler.add_listener(self._on_not_run, EVENT_JOB_MISSED | EVENT_JOB_MAX_INSTANCES)
        self.scheduler.start()

    def stop(self, timeout_s: float) -> bool:
        """No new runs; wait up to ``timeout_s`` for running ones. ``False`` if one is still running."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        try:
            with self._lease_lock:
                if self._leader:
                    self.lease.release()
        except Exception as exc:  # the lease simply expires instead
            log.warning("could not release the scheduler lease: %s", exc)
        return True

    def run_now(self, name: str) -> JobRun:
        """Run one job synchronously in the caller's thread (same recording as a scheduled run)."""
        return self._run(name)

    def _holds_lease(self) -> tuple[bool, str]:
        # Checked at most every third of the TTL: a renewal well before expiry, without a store
        # round trip per job run.
        with self._lease_lock:
            now = time.monotonic()
            if now - self._lease_checked >= self.config.schedule.lease_ttl / 3:
                try:
                    self._leader = self.lease.acquire()
                except Exception as exc:
                    log.error("scheduler lease check failed: %s", exc)
                    self._leader = False
                self._lease_checked = now
                self.metrics.leader.set(1 if self._leader else 0)
            return self._leader, self.lease.current_holder or "unknown"

    def _run(self, name: str) -> JobRun:
        job = self.jobs[name]
        started = _now()
        run_id = uuid.uuid4().hex
        with self._idle:
            self._running += 1
        try:
            leader, holder = self._holds_lease()
            if not leader:
                run = JobRun(name, run_id, started, _now(), "skipped", f"scheduler lease held by {holder}")
                self._record(run, quiet=True)
                return run
            view = _CountingStore(self.store)
            t0 = time.perf_counter()
            try:
                with self._job_locks[name]:
                    result = job.func(JobContext(view, self.config, started))
            except Exception as exc:
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
                run = JobRun(name, run_id, started, _now(), "error", error, view.rows_read)
                log.error(
                    "job %s failed after %.2fs: %s",
                    name,
                    time.perf_counter() - t0,
                    error,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                    extra={"job": name, "run_id": run_id, "status": "error"},
                )
            else:
                run = JobRun(name, run_id, started, _now(), "ok", "", view.rows_read)
                log.info(
                    "job %s ok in %.2fs, %d rows read%s",
                    name,
                    time.perf_counter() - t0,
                    view.rows_read,
                    f": {result}" if result is not None else "",
                    extra={"job": name, "run_id": run_id, "status": "ok"},
                )
            self.metrics.duration.labels(name).observe(time.perf_counter() - t0)
            self.metrics.rows.labels(name).inc(run.rows_read)
            if run.status == "ok":
                self.metrics.last_success.labels(name).set(run.finished_at.timestamp())
            self._record(run)
            if self.on_run is not None:
                try:
                    self.on_run(run)
                except Exception as exc:
                    log.error("after the %s run of job %s: %s", run.status, run.job, exc)
            return run
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _on_not_run(self, event: Any) -> None:
        from apscheduler.events import EVENT_JOB_MISSED

        reason = (
            "missed its start by more than misfire_grace (coalesced into the next run)"
            if event.code == EVENT_JOB_MISSED
            else "the previous run was still running"
        )
        now = _now()
        log.warning(
            "job %s skipped: %s", event.job_id, reason, extra={"job": event.job_id, "status": "skipped"}
        )
        self._record(JobRun(event.job_id, uuid.uuid4().hex, now, now, "skipped", reason))

    def _record(self, run: JobRun, *, quiet: bool = False) -> None:
        self.metrics.runs.labels(run.job, run.status).inc()
        try:
            self.store.command(
                f"INSERT INTO {self.store.table(JOB_RUNS_TABLE)} "
                "(job, run_id, instance, started_at, finished_at, status, error, rows_read) VALUES "
                "({job:String}, {run_id:String}, {instance:String}, {started:DateTime64(3, 'UTC')}, "
                "{finished:DateTime64(3, 'UTC')}, {status:String}, {error:String}, {rows:UInt64})",
                {
                    "job": run.job,
                    "run_id": run.run_id,
                    "instance": self.instance,
                    "started": run.started_at,
                    "finished": run.finished_at,
                    "status": run.status,
                    "error": run.error,
                    "rows": run.rows_read,
                },
            )
        except Exception as exc:
            # The history is best effort: a store that is down must not turn into a job failure loop.
            if not quiet:
                log.error("could not record the %s run of job %s: %s", run.status, run.job, exc)


# ---------------------------------------------------------------------------------------------
# The stage calls
# ---------------------------------------------------------------------------------------------


def _rollup(ctx: JobContext) -> object:
    from analytics import build_summaries

    # No explicit `until`: the settle delay leaves the newest minutes to late spans. The summaries
    # and per-minute aggregates every later analysis (scheduled, alerts, dashboards, API) reads.
    summaries = build_summaries(ctx.store, conventions=_conventions(ctx.config))
    return f"summaries: {summaries.describe()}"


@dataclass
class ScheduledAnalysis:
    """The latest analysis the service's schedule persisted: what ``/dashboards/`` shows.

    Runs are persisted by others too (an ad-hoc ``dashboard export`` of another window, the
    analysis behind each alert): "the newest persisted run" is whoever wrote last, so the
    scheduled export names its run's window instead.
    """

    run_id: str | None = None
    start: datetime | None = None
    end: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, run_id: str, start: datetime, end: datetime) -> None:
        with self._lock:
            self.run_id, self.start, self.end = run_id, start, end

    def window(self) -> tuple[datetime, datetime] | None:
        with self._lock:
            return (self.start, self.end) if self.start is not None and self.end is not None else None

    def run(self) -> str | None:
        """The run id of the latest scheduled analysis (what ``/dashboards/`` shows)."""
        with self._lock:
            return self.run_id


@dataclass
class _Analyze:
    scheduled: ScheduledAnalysis

    def __call__(self, ctx: JobContext) -> object:
        from analytics import analyze, persist_analysis

        analysis_cfg = ctx.config.analysis
        conventions = _conventions(ctx.config)
        start = ctx.now - timedelta(seconds=analysis_cfg.window)
        baseline_start = baseline_end = None
        if analysis_cfg.baseline:
            baseline_end = start
            baseline_start = start - timedelta(seconds=analysis_cfg.baseline)
        analysis = analyze(ctx.store, start, ctx.now, baseline_start, baseline_end, conventions=conventions)
        run_id = persist_analysis(ctx.store, analysis, conventions)
        self.scheduled.record(run_id, analysis.start, analysis.end)
        return f"analysis run {run_id}"


def _conventions(config: TailwatchConfig) -> Conventions | None:
    return config.analysis.conventions_object()


@dataclass
class _Rules:
    """The rule set, loaded once at start-up (so a bad rule file fails the start, not a job)."""

    files: Sequence[Path]
    ruleset: RuleSet | None = None

    def load(self) -> RuleSet:
        if self.ruleset is None:
            from slo_rules import load_rules

            self.ruleset = load_rules(list(self.files) or None)
        return self.ruleset


@dataclass
class _Evaluate:
    rules: _Rules
    dashboard_url: Callable[[], str | None]
    notifiers: list[NotifierConfig] = field(default_factory=list)
    # Where delivery outcomes are counted (the registry served on /metrics).
    registry: CollectorRegistry | None = None

    def __call__(self, ctx: JobContext) -> object:
        from slo_rules import deliver, evaluate

        url = self.dashboard_url()
        result = evaluate(
            ctx.store,
            self.rules.load(),
            ctx.now,
            notifiers=self.notifiers,
            dashboard_url=url,
            dashboard_links=url is not None,
            conventions=_conventions(ctx.config),
            trace_url=ctx.config.links.trace_url,
            evaluation_interval=self.interval(ctx.config.schedule.evaluate, ctx.now),
        )
        report = deliver(ctx.store, self.notifiers, registry=self.registry)
        return f"{result}; {report}"

    @staticmethod
    def interval(schedule: Schedule, now: datetime) -> timedelta:
        """How long until this job runs again: Alertmanager keeps a firing alert for four of these.
        For a cron schedule, the longest of its next few gaps."""
        if schedule.kind == "interval" and schedule.seconds:
            return timedelta(seconds=schedule.seconds)
        trigger = schedule.trigger()
        gaps: list[timedelta] = []
        fire = trigger.get_next_fire_time(None, now) if trigger is not None else None
        for _ in range(4):
            following = trigger.get_next_fire_time(fire, fire) if fire is not None else None
            if following is None or following <= fire:
                break
            gaps.append(following - fire)
            fire = following
        return max(gaps, default=timedelta(seconds=60))


def export_and_publish(
    store: Store,
    config: TailwatchConfig,
    now: datetime | None = None,
    *,
    window: tuple[datetime, datetime] | None = None,
    run_id: str | None = None,
) -> list[Path]:
    """Export the dashboards into a fresh directory, then move each file into ``out_dir``.

    The analysis: the persisted run ``run_id`` (the scheduled analysis'), else ``window``, else
    ``dashboards.window`` ending at ``now``, else the latest persisted analysis. Each file is
    replaced atomically (``os.replace``), so
    ``/dashboards/`` never serves a half-written view while an export runs. Nothing else writes
    ``out_dir``: API exports go to a temporary directory, alert links under ``out_dir/runs/``.
    """
    out_dir = config.dashboards.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    start: datetime | None = None
    end: datetime | None = None
    if window is not None:
        start, end = window
    elif config.dashboards.window:
        end = now or _now()
        start = end - timedelta(seconds=config.dashboards.window)
    from dashboards import export_dashboards

    staging = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir))
    try:
        report = export_dashboards(
            store,
            staging,
            start,
            end,
            formats=tuple(config.dashboards.formats),
            conventions=_conventions(config),
            trace_url=config.links.trace_url,
            run_id=run_id,
            # One plotly.js beside the pages (served to browsers, and the copy works from disk).
            plotly_js="shared",
            latency_targets=latency_targets(config.rules.files, warn=log.warning),
        )
        published = []
        for path in report.files:
            target = out_dir / Path(path).relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            published.append(target)
        return published
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass
class _Dashboards:
    """The scheduled export: the latest scheduled analysis (or ``dashboards.window`` ending now)."""

    scheduled: ScheduledAnalysis
    analyze: _Analyze

    def __call__(self, ctx: JobContext) -> object:
        window = None
        if not ctx.config.dashboards.window:
            window = self.scheduled.window()
            if window is None or ctx.config.schedule.analyze.kind == "off":
                # No scheduled analysis yet in this process (or none scheduled at all): run one
                # rather than publish whatever run was persisted last, by whoever.
                self.analyze(ctx)
                window = self.scheduled.window()
        # The scheduled analysis' own run, not another analysis of its window.
        run_id = self.scheduled.run() if window is not None else None
        files = export_and_publish(ctx.store, ctx.config, ctx.now, window=window, run_id=run_id)
        return f"{len(files)} files exported to {ctx.config.dashboards.out_dir}"


def dashboards_base_url(config: TailwatchConfig, api_url: str | None) -> str | None:
    """The base URL alerts link to, ``None`` when no dashboard can be opened: no
    ``dashboards.public_url`` and either no OTLP/HTTP listener (``api_url``) or the dashboards
    job off (``schedule.dashboards = "off"``, or scheduling disabled)."""
    if config.dashboards.public_url:
        return config.dashboards.public_url.rstrip("/")
    if not config.schedule.enabled or config.schedule.dashboards.kind == "off":
        return None
    return f"{api_url.rstrip('/')}/dashboards" if api_url else None


def default_jobs(
    config: TailwatchConfig,
    *,
    rules: _Rules | None = None,
    dashboard_url: Callable[[], str | None] | None = None,
    registry: CollectorRegistry | None = None,
    scheduled: ScheduledAnalysis | None = None,
) -> list[Job]:
    """The four stage jobs on their configured schedules (delivery counted on ``registry``).

    ``dashboard_url``: the base URL alerts link to, ``None`` for no links (default: from the
    configuration, :func:`dashboards_base_url`); ``scheduled``: where the analyze job records its
    runs for the dashboards job (and the API) to find.
    """
    rules = rules or _Rules(config.rules.files)
    scheduled = scheduled if scheduled is not None else ScheduledAnalysis()
    analyze = _Analyze(scheduled)

    def configured_url() -> str | None:
        return dashboards_base_url(config, config.api_url())

    funcs: dict[JobName, JobFunc] = {
        "rollup": _rollup,
        "analyze": analyze,
        "evaluate": _Evaluate(rules, dashboard_url or configured_url, config.notifiers(), registry=registry),
        "dashboards": _Dashboards(scheduled, analyze),
    }
    return [Job(name, config.schedule.job(name), funcs[name]) for name in JOB_NAMES]


# ---------------------------------------------------------------------------------------------
# The service
# ---------------------------------------------------------------------------------------------


class _MetricsGuard:
    """``/metrics`` behind the token when one is configured (``Bearer``, or Basic with the token
    as password, as the API takes it): the tail metrics name services, operations and alerts,
    which the API serves only with the token. ``/healthz`` and ``/readyz`` stay open for probes."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == "/metrics":
            from tailwatch.api import token_matches

            if not token_matches(Headers(scope=scope).get("authorization", ""), self.token):
                refused = PlainTextResponse(
                    "missing or wrong bearer token\n", status_code=401, headers={"WWW-Authenticate": "Bearer"}
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Service:
    """Receivers + jobs + API over one store, started and stopped as a unit."""

    def __init__(
        self,
        config: TailwatchConfig,
        *,
        jobs: Sequence[Job] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self._jobs_override = jobs
        self.store: Store | None = None
        self.ingest: IngestRuntime | None = None
        self.runner: JobRunner | None = None
        self.tail_metrics: TailMetrics | None = None
        self.rules = _Rules(config.rules.files)
        self.scheduled = ScheduledAnalysis()
        self.api: ServiceApi | None = None
        self._dashboards_published = False
        self.api_url: str | None = None
        self._service_file: Path | None = None

    @property
    def pipeline(self) -> IngestPipeline | None:
        return self.ingest.pipeline if self.ingest is not None else None

    def explain(self, at: datetime | None = None) -> EvaluationResult:
        """The service's evaluation as a dry run at ``at`` (default now): its rules, notifiers and
        links, nothing written or sent — what ``GET /api/v1/alerts/explain`` answers."""
        from slo_rules import evaluate

        assert self.store is not None
        url = self.dashboard_url()
        return evaluate(
            self.store,
            self.rules.load(),
            at,
            notifiers=self.config.notifiers(),
            dashboard_url=url,
            dashboard_links=url is not None,
            conventions=_conventions(self.config),
            trace_url=self.config.links.trace_url,
            dry_run=True,
        )

    def dashboard_url(self) -> str | None:
        """The URL alerts link to: configured, else this service's own ``/dashboards`` once
        listening; ``None`` (no links) where no dashboard can be opened (:func:`dashboards_base_url`)."""
        return dashboards_base_url(self.config, self.api_url)

    def start(self) -> None:
        """Open the store, apply the schema, start receivers and jobs; returns once listening."""
        from storage import ensure_schema
        from tailwatch.api import ServiceApi, api_routes

        config = self.config
        jobs = list(self._jobs_override) if self._jobs_override is not None else None
        if jobs is None and config.schedule.enabled:
            # Before anything listens: a broken rule file or a notifier without its secret is a
            # start-up error, not a job that fails every tick.
            config.check_environment()
            self.rules.load()
        self.store = open_store(config.store)
        try:
            ensure_schema(self.store)
            # A span table another tool made is read as it is: say which, and refuse one lacking
            # columns the jobs read now rather than as a failing job every tick.
            layout = inspect_traces(self.store)
            check_traces(layout, self.store.location.redacted())
            log.info("span table %s.%s: %s layout (%s attributes)", layout.database, layout.table,
                     layout.variant, layout.attributes)  # fmt: skip
            token = config.auth.token()
            run_job = self._run_job_for_api if config.schedule.enabled else None
            api = ServiceApi(
                self.store,
                config,
                token=token,
                run_job=run_job,
                scheduled_run=self.scheduled.run,
                next_run=self._next_run,
                explain=self.explain,
            )
            self.api = api
            # Run pages rendered by an earlier process age from when they were rendered.
            api.pages.prune()
            self.ingest = IngestRuntime(
                self.store,
                config.pipeline_settings(),
                http=config.receiver.otlp_http,
                grpc=config.receiver.otlp_grpc,
                token=token,
                extra_routes=api_routes(api),
                registry=self.registry,
                ready=lambda: self.runner is None or self.runner.alive,
            )
            if token:
                self.ingest.receivers.app.add_middleware(_MetricsGuard, token=token)
            if config.schedule.enabled:
                # The analysis and alert gauges; a receivers-only instance serves ingest series only.
                self.tail_metrics = TailMetrics(
                    self.store, registry=self.registry, scheduled_window=self.scheduled.window
                )
                self.tail_metrics.start()
            self.ingest.start()
            if config.receiver.otlp_http:
                host = config.receiver.otlp_http.rpartition(":")[0]
                if host in ("0.0.0.0", "::", "[::]", ""):  # noqa: S104 (reach a wildcard bind via loopback)
                    host = "127.0.0.1"
                self.api_url = f"http://{host}:{self.ingest.http_port}"
            if config.schedule.enabled:
                if jobs is None:
                    jobs = default_jobs(
                        config,
                        rules=self.rules,
                        dashboard_url=self.dashboard_url,
                        registry=self.registry,
                        scheduled=self.scheduled,
                    )
                self.runner = JobRunner(
                    self.store, config, jobs, registry=self.registry, on_run=self._after_job
                )
                self.runner.start()
            else:
                log.info("scheduling disabled ([schedule] enabled = false): receivers only")
            self._write_service_file()
        except BaseException:
            self.stop(timeout_s=5)
            raise
        # Each URL followed by a space: the log formatter masks URLs, and punctuation glued to one
        # would make it unparsable.
        log.info(
            "tailwatch serving store %s with OTLP/HTTP %s (API, /metrics) and OTLP/gRPC %s",
            parse_dsn(config.store).redacted(),
            self.api_url or "off",
            f"{config.receiver.otlp_grpc.rpartition(':')[0]}:{self.ingest.grpc_port if self.ingest else 0}"
            if config.receiver.otlp_grpc
            else "off",
        )

    def _after_job(self, run: JobRun) -> None:
        # A run may have persisted an analysis or changed an alert: the gauges follow at once
        # rather than at the next stale scrape.
        if self.tail_metrics is not None:
            self.tail_metrics.refresh_soon()
        if self.api is not None:
            # Every minute or so (the rollup's schedule): run pages older than runs_max_age go.
            self.api.pages.prune_soon()
        if run.job == "dashboards" and run.status == "ok":
            self._dashboards_published = True
        elif run.job == "analyze" and run.status == "ok":
            self._publish_first_dashboards()

    def _publish_first_dashboards(self) -> None:
        """Once the first scheduled analysis is in, run the dashboards job now rather than one
        interval after start (an hour by default), unless a previous run already published some."""
        runner = self.runner
        if self._dashboards_published or runner is None or "dashboards" not in runner.jobs:
            return
        self._dashboards_published = True
        if (self.config.dashboards.out_dir / "index.html").exists():
            return
        runner.scheduler.modify_job("dashboards", next_run_time=_now())

    def _next_run(self, name: str) -> datetime | None:
        """When the scheduler fires job ``name`` next; ``None`` when it is not scheduled here."""
        runner = self.runner
        job = runner.scheduler.get_job(name) if runner is not None and name in runner.jobs else None
        return job.next_run_time if job is not None else None

    def _run_job_for_api(self, name: str) -> JobRun:
        if self.runner is None or name not in self.runner.jobs:
            raise KeyError(name)
        return self.runner.run_now(name)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop accepting spans, flush the queue, wait for a running job. ``False`` on timeout."""
        timeout = self.config.schedule.shutdown_timeout if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        clean = True
        self._remove_service_file()
        if self.runner is not None and self.runner.scheduler.running:
            self.runner.scheduler.shutdown(wait=False)
        if self.ingest is not None:
            self.ingest.stop(timeout_s=max(1.0, deadline - time.monotonic()))
            self.ingest = None
        if self.runner is not None:
            clean = self.runner.stop(max(0.0, deadline - time.monotonic()))
            if not clean:
                log.warning("a job was still running after %.0fs; exiting without waiting for it", timeout)
            self.runner = None
        if self.tail_metrics is not None:
            self.tail_metrics.stop(timeout_s=max(1.0, deadline - time.monotonic()))
            self.tail_metrics = None
        if self.store is not None and clean:
            self.store.close()
            self.store = None
        return clean

    def _write_service_file(self) -> None:
        location = parse_dsn(self.config.store)
        if not location.embedded or self.api_url is None:
            return
        path = Path(location.path) / SERVICE_FILE
        body = {
            "api_url": self.api_url,
            "pid": os.getpid(),
            "store": self.config.store,
            "token_env": self.config.auth.token_env,
            "started_at": _now().isoformat(),
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        self._service_file = path

    def _remove_service_file(self) -> None:
        if self._service_file is not None:
            self._service_file.unlink(missing_ok=True)
            self._service_file = None
