"""The service's configuration: one module, one precedence order, one validation pass.

Every setting resolves **argument → ``TAILWATCH_*`` environment variable → TOML config file →
documented default**, and the merged result is validated by pydantic once, at start-up. A mistake
is never silently replaced by a default (unlike the OTel SDK's environment variables): a service
that starts with a different schedule or receiver than the one written down is worse than one that
refuses to start. Every problem becomes one :class:`ConfigError` line naming the key and where the
value came from (``file /etc/tailwatch.toml``, ``environment TAILWATCH_OTLP_HTTP``, ``--otlp-http``).

The TOML file::

    store = "chdb:///var/lib/tailwatch/store"

    [receiver]
    otlp_http = "127.0.0.1:4318"
    otlp_grpc = "127.0.0.1:4317"      # "off" disables a receiver

    [schedule]                         # durations "500ms", "2s", "5m", "1h", "1d";
    rollup = "60s"                     # a 5-field cron string "*/5 * * * *";
    analyze = "5m"                     # a table {cron = "*/5 * * * *"} or {every = "5m"};
    evaluate = "60s"                   # or "off"
    dashboards = "1h"

    [rules]
    files = ["slo_rules/default.yaml"]

    [[notify.webhook]]
    url = "http://127.0.0.1:5001/hook"
    secret_env = "TAILWATCH_WEBHOOK_SECRET"

Usage::

    config = load_config(Path("tailwatch.toml"), overrides={"receiver.otlp_http": "127.0.0.1:0"})
    config.schedule.analyze.seconds   # 300.0
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from collectors import DEFAULT_GRPC_ADDRESS, DEFAULT_HTTP_ADDRESS, PipelineSettings
from slo_rules import check_trace_url
from storage import StoreError, StoreLocation, TailwatchError, default_store_dsn, format_duration, parse_dsn
from storage import parse_duration as storage_parse_duration

if TYPE_CHECKING:
    from analytics import Conventions
    from slo_rules import NotifierConfig

__all__ = [
    "ALERTMANAGER_URL_ENV",
    "CONFIG_ENV",
    "DASHBOARDS_URL_ENV",
    "DEFAULT_CONFIG_FILE",
    "ENV_VARS",
    "INGEST_TOKEN_ENV",
    "JOB_NAMES",
    "SECRET_PATH_HOSTS",
    "SPOOL_DIR_ENV",
    "STORE_ENV",
    "TRACE_URL_ENV",
    "WEBHOOK_SECRET_ENV",
    "WEBHOOK_URL_ENV",
    "ConfigError",
    "EnvVar",
    "JobName",
    "LogFormat",
    "Schedule",
    "TailwatchConfig",
    "default_spool_dir",
    "example_config",
    "load_config",
    "mask_url",
    "parse_duration",
    "render_config",
    "resolve_dsn",
]

# ---------------------------------------------------------------------------------------------
# Environment variables: every TAILWATCH_* name the service reads is declared here, once.
# ---------------------------------------------------------------------------------------------

STORE_ENV = "TAILWATCH_STORE"
"""The store DSN (``--store`` wins; else the embedded store under ``./.tailwatch/store``)."""

CONFIG_ENV = "TAILWATCH_CONFIG"
"""Path of the TOML config file (``--config`` wins; else ``./tailwatch.toml`` when it exists)."""

INGEST_TOKEN_ENV = "TAILWATCH_INGEST_TOKEN"  # noqa: S105 (a variable name, not a secret)
"""Default name of the variable holding the bearer token for ingest, API and dashboards."""

DEFAULT_CONFIG_FILE = "tailwatch.toml"

SPOOL_DIR_ENV = "TAILWATCH_SPOOL_DIR"
"""Directory of the fsync'd ingest spool (default: beside an embedded store)."""

WEBHOOK_URL_ENV = "TAILWATCH_WEBHOOK_URL"
"""Adds one Alertmanager-format webhook receiver (``alerts evaluate``/``deliver``, ``serve``)."""

WEBHOOK_SECRET_ENV = "TAILWATCH_WEBHOOK_SECRET"  # noqa: S105 (a variable name, not a secret)
"""The HMAC secret the example config and ``alerts evaluate --webhook`` sign webhook bodies with."""

ALERTMANAGER_URL_ENV = "TAILWATCH_ALERTMANAGER_URL"
"""Alertmanager base URL(s), comma-separated for an HA pair (``notify.alertmanager``; ``alerts
evaluate``/``deliver --alertmanager``)."""

TRACE_URL_ENV = "TAILWATCH_TRACE_URL"
"""Template of a trace's URL in the user's trace viewer (``{trace_id}``, ``{start}``, ``{end}``)."""

DASHBOARDS_URL_ENV = "TAILWATCH_DASHBOARDS_URL"
"""Base URL of the dashboards as on-call reaches them, linked from every alert."""


def resolve_dsn(dsn: str | None = None) -> str:
    """Argument, then ``TAILWATCH_STORE``, then the config file's ``store`` (``TAILWATCH_CONFIG`` or
    ``./tailwatch.toml``; a command with ``--config`` resolves its store with
    ``tailwatch.commands._common.command_config`` and passes it here), then the embedded default."""
    if dsn:
        return dsn
    return os.environ.get(STORE_ENV, "").strip() or load_config().store


@dataclass(frozen=True)
class EnvVar:
    """One ``TAILWATCH_*`` variable and the config key it sets."""

    name: str
    key: str
    help: str
    kind: Literal["str", "list", "webhook"] = "str"


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(STORE_ENV, "store", "store DSN (chdb:///abs/path or http(s)://user:pw@host:port/db)"),
    EnvVar("TAILWATCH_OTLP_HTTP", "receiver.otlp_http", "OTLP/HTTP listen address HOST:PORT or off"),
    EnvVar("TAILWATCH_OTLP_GRPC", "receiver.otlp_grpc", "OTLP/gRPC listen address HOST:PORT or off"),
    # `collect` and `serve` both build their pipeline settings from these (TailwatchConfig.pipeline_settings).
    EnvVar("TAILWATCH_BATCH_ROWS", "ingest.batch_rows", "rows per insert batch"),
    EnvVar("TAILWATCH_FLUSH_INTERVAL_S", "ingest.flush_interval", "longest wait before a partial batch"),
    EnvVar("TAILWATCH_MAX_QUEUE_SPANS", "ingest.max_queue_spans", "bound of the ingest queue (spans)"),
    EnvVar(SPOOL_DIR_ENV, "ingest.spool_dir", "directory of the fsync'd ingest spool"),
    EnvVar("TAILWATCH_SPOOL", "ingest.spool", "spool acknowledged spans before the insert (true/false)"),
    EnvVar("TAILWATCH_MAX_REQUEST_BYTES", "ingest.max_request_bytes", "body limit of one export"),
    EnvVar("TAILWATCH_MAX_QUEUE_BYTES", "ingest.max_queue_bytes", "bound of the ingest queue (bytes)"),
    EnvVar(
        "TAILWATCH_MAX_INFLIGHT_BYTES", "ingest.max_inflight_bytes", "bytes of OTLP/HTTP bodies read at once"
    ),
    EnvVar(
        "TAILWATCH_NATIVE_INSERT", "ingest.native_insert", "let ClickHouse decode raw exports (true/false)"
    ),
    EnvVar("TAILWATCH_TOKEN_ENV", "auth.token_env", "name of the variable holding the bearer token"),
    EnvVar("TAILWATCH_SCHEDULE_ENABLED", "schedule.enabled", "run the scheduled jobs (true/false)"),
    EnvVar("TAILWATCH_SCHEDULE_ROLLUP", "schedule.rollup", "rollup job schedule"),
    EnvVar("TAILWATCH_SCHEDULE_ANALYZE", "schedule.analyze", "analysis job schedule"),
    EnvVar("TAILWATCH_SCHEDULE_EVALUATE", "schedule.evaluate", "rule evaluation + delivery schedule"),
    EnvVar("TAILWATCH_SCHEDULE_DASHBOARDS", "schedule.dashboards", "dashboard export schedule"),
    EnvVar("TAILWATCH_ANALYSIS_WINDOW", "analysis.window", "window the analysis job covers, ending now"),
    EnvVar("TAILWATCH_DASHBOARDS_DIR", "dashboards.out_dir", "directory of the exported dashboards"),
    EnvVar(TRACE_URL_ENV, "links.trace_url", "trace viewer URL template with {trace_id}, {start}, {end}"),
    EnvVar(DASHBOARDS_URL_ENV, "dashboards.public_url", "base URL of /dashboards in alert links"),
    EnvVar(
        "TAILWATCH_DASHBOARDS_RUNS_MAX_AGE", "dashboards.runs_max_age", "age at which run pages are pruned"
    ),
    EnvVar("TAILWATCH_RULES", "rules.files", f"rule files, separated by '{os.pathsep}'", "list"),
    EnvVar(WEBHOOK_URL_ENV, "notify.webhook", "adds one Alertmanager-format webhook", "webhook"),
    EnvVar(ALERTMANAGER_URL_ENV, "notify.alertmanager", "Alertmanager URLs (comma-separated: an HA pair)"),
    EnvVar("TAILWATCH_LOG_FORMAT", "log.format", "plain or json"),
    EnvVar("TAILWATCH_LOG_LEVEL", "log.level", "debug, info, warning or error"),
)


class ConfigError(TailwatchError):
    """The configuration is invalid; the message names the key and where the value came from."""


# ---------------------------------------------------------------------------------------------
# Value types
# ---------------------------------------------------------------------------------------------

JobName = Literal["rollup", "analyze", "evaluate", "dashboards"]
JOB_NAMES: tuple[JobName, ...] = ("rollup", "analyze", "evaluate", "dashboards")
LogFormat = Literal["plain", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]

_DURATION_HINT = 'a duration such as "500ms", "2s", "5m", "1h", "1d"'


def parse_duration(value: object) -> float:
    """Seconds, in the one duration grammar (:func:`storage.parse_duration`)."""
    return storage_parse_duration(value).total_seconds()


Duration = Annotated[float, BeforeValidator(parse_duration)]


@dataclass(frozen=True)
class Schedule:
    """When a job runs: every ``seconds``, on a 5-field ``cron`` expression (UTC), or never."""

    kind: Literal["interval", "cron", "off"]
    seconds: float | None = None
    cron: str | None = None

    def describe(self) -> str:
        if self.kind == "interval" and self.seconds is not None:
            return format_duration(self.seconds)
        if self.kind == "cron":
            return f"cron {self.cron}"
        return "off"

    def to_toml(self) -> str:
        if self.kind == "cron":
            return "{ cron = " + json.dumps(self.cron) + " }"
        return json.dumps(self.describe())

    def trigger(self) -> Any:
        """The APScheduler 3 trigger (``None`` when off)."""
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        if self.kind == "interval":
            assert self.seconds is not None
            return IntervalTrigger(seconds=self.seconds, timezone="UTC")
        if self.kind == "cron":
            assert self.cron is not None
            return CronTrigger.from_crontab(self.cron, timezone="UTC")
        return None


_SCHEDULE_HINT = f'{_DURATION_HINT}, a cron expression "*/5 * * * *", {{cron = "..."}} or "off"'


def _cron(expr: object) -> Schedule:
    from apscheduler.triggers.cron import CronTrigger

    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ValueError(f'a cron expression has 5 fields ("*/5 * * * *"), got {expr!r}')
    text = " ".join(expr.split())
    try:
        CronTrigger.from_crontab(text, timezone="UTC")
    except ValueError as exc:
        raise ValueError(f"invalid cron expression {expr!r}: {exc}") from None
    return Schedule("cron", cron=text)


def parse_schedule(value: object) -> Schedule:
    """A job's schedule from any accepted spelling (see the module docstring)."""
    if isinstance(value, Schedule):
        return value
    if value is False or (isinstance(value, str) and value.strip().lower() in ("off", "never", "")):
        return Schedule("off")
    if isinstance(value, Mapping):
        keys = set(value)
        if keys == {"cron"}:
            return _cron(value["cron"])
        if keys == {"every"}:
            return Schedule("interval", seconds=parse_duration(value["every"]))
        raise ValueError(f"a schedule table takes exactly one of 'cron' or 'every', got {sorted(keys)}")
    if isinstance(value, str):
        text = value.strip()
        if text.lower().startswith("cron:"):
            return _cron(text[5:].strip())
        if len(text.split()) > 1:
            return _cron(text)
        try:
            return Schedule("interval", seconds=parse_duration(text))
        except ValueError:
            raise ValueError(f"expected {_SCHEDULE_HINT}, got {value!r}") from None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Schedule("interval", seconds=parse_duration(value))
    raise ValueError(f"expected {_SCHEDULE_HINT}, got {value!r}")


ScheduleValue = Annotated[Schedule, BeforeValidator(parse_schedule)]


def parse_host_port(value: object) -> str | None:
    """``HOST:PORT`` (port 0 = any free port), or ``None`` for ``"off"``."""
    if value is None or value is False:
        return None
    if not isinstance(value, str):
        raise ValueError(f'expected HOST:PORT or "off", got {value!r}')
    text = value.strip()
    if text.lower() in ("", "off", "none", "disabled"):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f'expected HOST:PORT (e.g. "127.0.0.1:4318") or "off", got {value!r}')
    return f"{host}:{int(port)}"


HostPort = Annotated[str | None, BeforeValidator(parse_host_port)]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_env_name(value: str | None) -> str | None:
    if value is not None and not _ENV_NAME.match(value):
        raise ValueError(f"expected the NAME of an environment variable, got {value!r}")
    return value


EnvName = Annotated[str, BeforeValidator(lambda v: _check_env_name(v) if isinstance(v, str) else v)]


def _check_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
    return value


Url = Annotated[str, BeforeValidator(lambda v: _check_url(v) if isinstance(v, str) else v)]
TraceUrl = Annotated[str, BeforeValidator(lambda v: check_trace_url(v) if isinstance(v, str) else v)]


# ---------------------------------------------------------------------------------------------
# The configuration model
# ---------------------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReceiverConfig(_Section):
    otlp_http: HostPort = DEFAULT_HTTP_ADDRESS
    otlp_grpc: HostPort = DEFAULT_GRPC_ADDRESS


def default_spool_dir(location: StoreLocation) -> Path:
    """Beside an embedded store (``<path>.spool``); per server under ``.tailwatch/spool`` otherwise.

    Each store gets its own spool so a replay never lands in the wrong store.
    """
    if location.embedded:
        return Path(location.path.rstrip("/") + ".spool")
    return Path(".tailwatch/spool").resolve() / f"{location.host}_{location.port}_{location.database}"


class IngestConfig(_Section):
    batch_rows: int = Field(default=PipelineSettings.batch_rows, gt=0)
    flush_interval: Duration = PipelineSettings.flush_interval_s
    max_queue_spans: int = Field(default=PipelineSettings.max_queue_spans, gt=0)
    # Exports are acknowledged once spooled (fsync'd), so a crash or a store outage loses none;
    # without a spool the acknowledgement waits for the insert. On by default.
    spool: bool = True
    spool_dir: Path | None = None
    max_request_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_queue_bytes: int = Field(default=PipelineSettings.max_queue_bytes, ge=1024)
    max_inflight_bytes: int = Field(default=PipelineSettings.max_inflight_bytes, ge=1024)
    native_insert: bool = PipelineSettings.native_insert

    @field_validator("spool_dir")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        return value.expanduser().absolute() if value is not None else None

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> IngestConfig:
        if self.max_queue_spans < self.batch_rows:
            raise ValueError(
                f"max_queue_spans ({self.max_queue_spans}) must be at least batch_rows ({self.batch_rows})"
            )
        return self


class AuthConfig(_Section):
    token_env: EnvName = INGEST_TOKEN_ENV

    def token(self) -> str | None:
        """The bearer token (``None``: no authentication). Only ever read from the environment."""
        return os.environ.get(self.token_env) or None


class ScheduleConfig(_Section):
    enabled: bool = True
    rollup: ScheduleValue = Schedule("interval", seconds=60.0)
    analyze: ScheduleValue = Schedule("interval", seconds=300.0)
    evaluate: ScheduleValue = Schedule("interval", seconds=60.0)
    dashboards: ScheduleValue = Schedule("interval", seconds=3600.0)
    # A run that starts later than this after its due time is skipped (and recorded as skipped).
    misfire_grace: Duration = 30.0
    # How long shutdown waits for a running job before exiting anyway.
    shutdown_timeout: Duration = 30.0
    # The scheduler lease: only the instance holding it runs jobs (see docs/service.md).
    lease_ttl: Duration = 30.0

    def job(self, name: JobName) -> Schedule:
        value = getattr(self, name)
        assert isinstance(value, Schedule)
        return value


class PriceConfig(_Section):
    """One model's prices, USD per million tokens (``[[analysis.prices]]``)."""

    provider: str = Field(min_length=1)  # "*" matches any provider
    model: str = Field(min_length=1)
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)  # default: the input price


class AnalysisConfig(_Section):
    window: Duration = 3600.0
    # Baseline = the window of this length just before the analysed one (default: same length).
    baseline: Duration | None = None
    # Span conventions passed to analytics.Conventions (e.g. min_release_requests = 50).
    conventions: dict[str, Any] = Field(default_factory=dict)
    # The price table: none shipped (prices are the team's); a model without one has no cost.
    prices: list[PriceConfig] = Field(default_factory=list)

    @field_validator("conventions")
    @classmethod
    def _known_conventions(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value:
            from analytics import Conventions

            try:
                Conventions.from_dict(value)  # checked at load; conventions_object() builds it
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return value

    def conventions_object(self) -> Conventions | None:
        """``analytics.Conventions`` with these overrides and the price table, or ``None`` for the
        defaults."""
        if not self.conventions and not self.prices:
            return None
        from analytics import Conventions

        overrides = dict(self.conventions)
        if self.prices:
            overrides["llm_prices"] = [p.model_dump() for p in self.prices]
        return Conventions.from_dict(overrides)


class DashboardsConfig(_Section):
    out_dir: Path = Path(".tailwatch/dashboards")
    # pydantic copies mutable defaults per instance.
    formats: list[Literal["html", "png"]] = ["html"]
    # Window of the exported views ending now; unset = the latest persisted analysis.
    window: Duration | None = None
    # Base URL of the dashboards as on-call reaches them (alert links); default http://<otlp_http>/dashboards
    public_url: Url | None = None
    # Rendered run pages (out_dir/runs/<run id>/) older than this are deleted; one asked for again
    # is rendered anew from the persisted run.
    runs_max_age: Duration = Field(default=86400.0, gt=0)

    @field_validator("out_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Relative values from a file were already joined to its directory; others are the cwd's.
        return value.expanduser().absolute()


class RulesConfig(_Section):
    files: list[Path] = Field(default_factory=list)


class WebhookEntry(_Section):
    url: Url
    secret_env: EnvName | None = None
    name: str = "webhook"
    timeout: Duration = 10.0


class SlackEntry(_Section):
    url: Url | None = None
    url_env: EnvName | None = None
    secret_env: EnvName | None = None
    name: str = "slack"
    timeout: Duration = 10.0

    @model_validator(mode="after")
    def _one_url(self) -> SlackEntry:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("set exactly one of url or url_env")
        return self


class PagerDutyEntry(_Section):
    routing_key_env: EnvName
    url: Url = "https://events.pagerduty.com/v2/enqueue"
    secret_env: EnvName | None = None
    name: str = "pagerduty"
    timeout: Duration = 10.0


class AlertmanagerEntry(_Section):
    # One per Alertmanager instance (both of an HA pair); credentials only from the environment.
    url: Url
    name: str | None = None  # default: alertmanager@host:port
    timeout: Duration = 10.0
    username: str | None = None
    password_env: EnvName | None = None
    bearer_token_env: EnvName | None = None
    ca_file: Path | None = None

    @model_validator(mode="after")
    def _auth(self) -> AlertmanagerEntry:
        if urlsplit(self.url).password is not None:
            raise ValueError("no password in the URL; set username and password_env")
        if (self.username is None) != (self.password_env is None):
            raise ValueError("basic auth takes both username and password_env")
        if self.password_env and self.bearer_token_env:
            raise ValueError("set basic auth (username, password_env) or bearer_token_env, not both")
        return self


def _alertmanager_urls(value: object) -> object:
    # TAILWATCH_ALERTMANAGER_URL arrives as one string: "http://am-0:9093,http://am-1:9093".
    if isinstance(value, str):
        return [{"url": u} for u in value.replace(",", " ").split()]
    return value


class NotifyConfig(_Section):
    webhook: list[WebhookEntry] = Field(default_factory=list)
    slack: list[SlackEntry] = Field(default_factory=list)
    pagerduty: list[PagerDutyEntry] = Field(default_factory=list)
    alertmanager: Annotated[list[AlertmanagerEntry], BeforeValidator(_alertmanager_urls)] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _unique_names(self) -> NotifyConfig:
        # The outbox keeps one row per (notifier name, notification): two notifiers under one name
        # would share it, and the second would never be sent anything.
        from slo_rules import AlertmanagerConfig

        names = [e.name for e in self.webhook] + [e.name for e in self.slack]
        names += [e.name for e in self.pagerduty]
        names += [AlertmanagerConfig(url=a.url, name=a.name or "").name for a in self.alertmanager]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"notifier names must be unique; give each a name: {', '.join(twice)}")
        return self


class LinksConfig(_Section):
    # The trace viewer users already run (Jaeger, Tempo, HyperDX/ClickStack, SigNoz): alerts,
    # notifications and dashboard tables link each exemplar trace there. See slo_rules.trace_link.
    trace_url: TraceUrl | None = None


class LogConfig(_Section):
    format: LogFormat = "plain"
    level: LogLevel = "info"


class TailwatchConfig(_Section):
    """The validated, effective configuration (see the module docstring for the file format)."""

    store: str = Field(default_factory=default_store_dsn)
    receiver: ReceiverConfig = Field(default_factory=ReceiverConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    analysis: AnalysisConfig = Field(default_factory=AnalysisConfig)
    dashboards: DashboardsConfig = Field(default_factory=DashboardsConfig)
    rules: RulesConfig = Field(default_factory=RulesConfig)
    notify: NotifyConfig = Field(default_factory=NotifyConfig)
    links: LinksConfig = Field(default_factory=LinksConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    # Where the file came from (not a key users set); relative paths in it resolve against it.
    config_file: Path | None = Field(default=None, exclude=True)

    @field_validator("store")
    @classmethod
    def _dsn(cls, value: str) -> str:
        try:
            parse_dsn(value)
        except StoreError as exc:
            raise ValueError(str(exc)) from None
        return value

    def spool_dir(self) -> Path | None:
        """Where ``serve`` spools acknowledged spans: ``ingest.spool_dir``, else beside the store;
        None with ``ingest.spool = false``."""
        if not self.ingest.spool:
            return None
        return self.ingest.spool_dir or default_spool_dir(parse_dsn(self.store))

    def pipeline_settings(self) -> PipelineSettings:
        """The ingest pipeline's settings: the one place ``collect``, ``serve`` and ``ingest`` get them."""
        return PipelineSettings(
            batch_rows=self.ingest.batch_rows,
            flush_interval_s=self.ingest.flush_interval,
            max_queue_spans=self.ingest.max_queue_spans,
            max_queue_bytes=self.ingest.max_queue_bytes,
            spool_dir=self.spool_dir(),
            max_request_bytes=self.ingest.max_request_bytes,
            max_inflight_bytes=self.ingest.max_inflight_bytes,
            native_insert=self.ingest.native_insert,
        )

    def api_url(self) -> str | None:
        """The service's base URL as configured (``http://host:port``), before it listens."""
        if self.receiver.otlp_http is None:
            return None
        host, _, port = self.receiver.otlp_http.rpartition(":")
        if port == "0":
            return None  # ephemeral port: the service fills it in once listening
        return f"http://{host}:{port}"

    def check_environment(self, environ: Mapping[str, str] | None = None) -> None:
        """Every variable a notifier needs is set; else :class:`ConfigError` naming the key.

        Run by ``serve`` at start-up (``config show`` only reports them): a notifier whose secret is
        missing would fail every delivery, so it is a start-up error like any other mistake.
        """
        env = os.environ if environ is None else environ
        needed: list[tuple[str, str | None]] = []
        for i, w in enumerate(self.notify.webhook):
            needed.append((f"notify.webhook[{i}].secret_env", w.secret_env))
        for i, sl in enumerate(self.notify.slack):
            needed += [
                (f"notify.slack[{i}].url_env", sl.url_env),
                (f"notify.slack[{i}].secret_env", sl.secret_env),
            ]
        for i, p in enumerate(self.notify.pagerduty):
            needed.append((f"notify.pagerduty[{i}].routing_key_env", p.routing_key_env))
            needed.append((f"notify.pagerduty[{i}].secret_env", p.secret_env))
        for i, a in enumerate(self.notify.alertmanager):
            needed.append((f"notify.alertmanager[{i}].password_env", a.password_env))
            needed.append((f"notify.alertmanager[{i}].bearer_token_env", a.bearer_token_env))
        where = f" (file {self.config_file})" if self.config_file else ""
        for i, a in enumerate(self.notify.alertmanager):
            if a.ca_file is not None and not a.ca_file.expanduser().is_file():
                key = f"notify.alertmanager[{i}].ca_file"
                raise ConfigError(f"invalid configuration: {key}: {a.ca_file} is not a file{where}")
        for key, name in needed:
            if name and not env.get(name):
                raise ConfigError(
                    f"invalid configuration: {key}: environment variable {name} is not set{where}; "
                    "set it or remove the key"
                )

    def notifiers(self) -> list[NotifierConfig]:
        """The ``[notify]`` entries as ``slo_rules`` notifier configs."""
        from slo_rules import AlertmanagerConfig, PagerDutyConfig, SlackConfig, WebhookConfig

        out: list[NotifierConfig] = []
        for w in self.notify.webhook:
            out.append(WebhookConfig(url=w.url, secret_env=w.secret_env, name=w.name, timeout_s=w.timeout))
        for s in self.notify.slack:
            out.append(
                SlackConfig(
                    url=s.url or "",
                    url_env=s.url_env,
                    secret_env=s.secret_env,
                    name=s.name,
                    timeout_s=s.timeout,
                )
            )
        for p in self.notify.pagerduty:
            out.append(
                PagerDutyConfig(
                    routing_key_env=p.routing_key_env,
                    url=p.url,
                    name=p.name,
                    timeout_s=p.timeout,
                    secret_env=p.secret_env,
                )
            )
        for a in self.notify.alertmanager:
            out.append(
                AlertmanagerConfig(
                    url=a.url,
                    name=a.name or "",
                    timeout_s=a.timeout,
                    username=a.username,
                    password_env=a.password_env,
                    bearer_token_env=a.bearer_token_env,
                    ca_file=str(a.ca_file.expanduser()) if a.ca_file else None,
                )
            )
        return out


# ---------------------------------------------------------------------------------------------
# Loading: file → env → arguments, with the source of every value remembered for messages
# ---------------------------------------------------------------------------------------------

Key = tuple[str | int, ...]


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _leaf_keys(tree: Mapping[str, Any], prefix: Key = ()) -> list[Key]:
    out: list[Key] = []
    for k, v in tree.items():
        key = (*prefix, k)
        if isinstance(v, Mapping) and v and k not in ("conventions",):
            out.extend(_leaf_keys(v, key))
        else:
            out.append(key)
    return out


def _format_key(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


# Relative paths in a config file resolve against the file's directory; these keys hold paths.
_PATH_KEYS = (("ingest", "spool_dir"), ("dashboards", "out_dir"))


def _resolve_rule_file(raw: object, base: Path | None) -> object:
    if not isinstance(raw, str):
        return raw
    path = Path(raw).expanduser()
    if path.is_absolute():
        return str(path)
    # A relative rule file is looked up next to the config file, then in the working directory,
    # then in the installation (so the contract's "slo_rules/default.yaml" always means the pack).
    candidates = [*([base / path] if base else []), Path.cwd() / path, Path(__file__).parents[1] / path]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate.resolve())
    return str(candidates[0])


def _header_lines(path: Path, table: str) -> list[int]:
    """The line numbers of the ``[[table]]`` headers of a TOML file, in order."""
    pattern = re.compile(r"^\s*\[\[\s*" + re.escape(table).replace(r"\.", r"\s*\.\s*") + r"\s*\]\]")
    text = path.read_text(encoding="utf-8")
    return [n for n, line in enumerate(text.splitlines(), start=1) if pattern.match(line)]


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None


def _env_layer(env: Mapping[str, str], tree: dict[str, Any], sources: dict[Key, str]) -> None:
    for var in ENV_VARS:
        raw = env.get(var.name)
        if raw is None or raw.strip() == "":
            continue
        label = f"environment {var.name}"
        if var.kind == "list":
            _set(tree, var.key, [p for p in raw.split(os.pathsep) if p.strip()])
        elif var.kind == "webhook":
            hooks = tree.setdefault("notify", {}).setdefault("webhook", [])
            if not isinstance(hooks, list):
                continue  # the file's own mistake is reported by validation
            hooks.append({"url": raw.strip(), "name": "env-webhook"})
            sources[("notify", "webhook", len(hooks) - 1)] = label
            continue
        else:
            _set(tree, var.key, raw.strip())
        sources[tuple(var.key.split("."))] = label


def load_config(
    path: Path | str | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    use_default_file: bool = True,
) -> TailwatchConfig:
    """Resolve and validate the configuration.

    ``path`` (``--config``) → ``TAILWATCH_CONFIG`` → ``./tailwatch.toml`` if present. ``overrides``
    are command-line values keyed by dotted name (``{"receiver.otlp_http": "127.0.0.1:0"}``;
    ``None`` values are ignored). Raises :class:`ConfigError` listing every problem on one line.
    """
    environ = os.environ if env is None else env
    file: Path | None = None
    if path is not None:
        file = Path(path)
    elif environ.get(CONFIG_ENV, "").strip():
        file = Path(environ[CONFIG_ENV].strip())
    elif use_default_file and Path(DEFAULT_CONFIG_FILE).is_file():
        file = Path(DEFAULT_CONFIG_FILE)

    tree: dict[str, Any] = {}
    sources: dict[Key, str] = {}
    base: Path | None = None
    if file is not None:
        file = file.expanduser().resolve()
        base = file.parent
        tree = _read_file(file)
        for key in _leaf_keys(tree):
            sources[key] = f"file {file}"
        # A price entry's problem names its line: a price table is long and its entries alike.
        for i, line in enumerate(_header_lines(file, "analysis.prices")):
            sources[("analysis", "prices", i)] = f"file {file}, line {line}"
        for top in ("notify",):
            section = tree.get(top)
            if isinstance(section, dict):
                for kind, entries in section.items():
                    if isinstance(entries, list):
                        for i in range(len(entries)):
                            sources[(top, kind, i)] = f"file {file}"
        for section_name, path_key in _PATH_KEYS:
            table = tree.get(section_name)
            value = table.get(path_key) if isinstance(table, dict) else None
            if (
                isinstance(table, dict)
                and isinstance(value, str)
                and not Path(value).expanduser().is_absolute()
            ):
                table[path_key] = str(base / Path(value).expanduser())
    _env_layer(environ, tree, sources)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        _set(tree, dotted, value)
        sources[tuple(dotted.split("."))] = "--" + dotted.rpartition(".")[2].replace("_", "-")

    rules = tree.get("rules")
    if isinstance(rules, dict) and isinstance(rules.get("files"), list):
        rule_base = base if sources.get(("rules", "files"), "").startswith("file ") else None
        rules["files"] = [_resolve_rule_file(f, rule_base) for f in rules["files"]]

    try:
        config = TailwatchConfig.model_validate({**tree, "config_file": file})
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources, file)) from None
    _check_files(config, sources)
    return config


def _describe(exc: ValidationError, sources: Mapping[Key, str], file: Path | None) -> str:
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        # pydantic appends the validator's name to the location of Annotated/function validators.
        loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith("function-")))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key" + _allowed_keys(loc)
        elif error["type"] == "literal_error":
            message = f"got {error['input']!r}; " + message.replace("Input should be", "allowed:")
        source = next(
            (sources[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in sources),
            f"file {file}" if file else "default",
        )
        problems.append(f"{_format_key(loc)}: {message} ({source})")
    return "invalid configuration: " + "; ".join(problems)


def _allowed_keys(loc: Sequence[str | int]) -> str:
    model: Any = TailwatchConfig
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return ""
        annotation = field.annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return ""
    names = [n for n in model.model_fields if n != "config_file"]
    return "; allowed: " + ", ".join(names)


def _check_files(config: TailwatchConfig, sources: Mapping[Key, str]) -> None:
    for i, rule_file in enumerate(config.rules.files):
        if not rule_file.is_file():
            source = sources.get(("rules", "files"), "default")
            raise ConfigError(
                f"invalid configuration: rules.files[{i}]: rule file {rule_file} does not exist ({source})"
            )


# ---------------------------------------------------------------------------------------------
# Showing the configuration (secrets masked) and the commented example
# ---------------------------------------------------------------------------------------------


# Webhook services whose URL path is itself the credential.
SECRET_PATH_HOSTS = ("hooks.slack.com", "discord.com", "discordapp.com", "webhook.office.com")


def mask_url(url: str) -> str:
    """A URL fit for logs and listings: no password, no query string, and no path for the webhook
    services whose path is the secret (Slack, Discord, Teams)."""
    try:
        host = urlsplit(url).hostname or ""
        secret_path = any(host == h or host.endswith("." + h) for h in SECRET_PATH_HOSTS)
        return _mask_url(url, whole_path=secret_path)
    except ValueError:  # e.g. a port that is not a number
        return "<unparsable URL>"


def _mask_url(url: str, *, whole_path: bool = False) -> str:
    """Hide passwords, query strings and (for Slack, whose URL is the secret) the path."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    if parts.username:
        netloc = f"{parts.username}:***@{netloc}" if parts.password else f"{parts.username}@{netloc}"
    path = "/***" if whole_path and parts.path not in ("", "/") else parts.path
    return urlunsplit((parts.scheme, netloc, path, "***" if parts.query else "", ""))


def _env_state(name: str | None) -> str:
    if not name:
        return ""
    return f"  # {name} is set (value masked)" if os.environ.get(name) else f"  # {name} is not set"


def render_config(config: TailwatchConfig) -> str:
    """The effective configuration as TOML, every secret masked (``tailwatch config show``)."""
    q = json.dumps
    lines = [
        f"# effective configuration; file: {config.config_file or '(none)'}",
        f"store = {q(parse_dsn(config.store).redacted())}",
        "",
        "[receiver]",
        f"otlp_http = {q(config.receiver.otlp_http or 'off')}",
        f"otlp_grpc = {q(config.receiver.otlp_grpc or 'off')}",
        "",
        "[ingest]",
        f"batch_rows = {config.ingest.batch_rows}",
        f"flush_interval = {q(format_duration(config.ingest.flush_interval))}",
        f"max_queue_spans = {config.ingest.max_queue_spans}",
        f"max_request_bytes = {config.ingest.max_request_bytes}",
        f"max_queue_bytes = {config.ingest.max_queue_bytes}",
        f"max_inflight_bytes = {config.ingest.max_inflight_bytes}",
    ]
    lines.append(f"spool = {str(config.ingest.spool).lower()}")
    spool_dir = config.spool_dir()
    if spool_dir is not None:
        lines.append(f"spool_dir = {q(str(spool_dir))}")
    lines += ["", "[auth]", f"token_env = {q(config.auth.token_env)}{_env_state(config.auth.token_env)}"]
    s = config.schedule
    lines += ["", "[schedule]", f"enabled = {str(s.enabled).lower()}"]
    lines += [f"{job} = {s.job(job).to_toml()}" for job in JOB_NAMES]
    lines += [
        f"misfire_grace = {q(format_duration(s.misfire_grace))}",
        f"shutdown_timeout = {q(format_duration(s.shutdown_timeout))}",
        f"lease_ttl = {q(format_duration(s.lease_ttl))}",
        "",
        "[analysis]",
        f"window = {q(format_duration(config.analysis.window))}",
    ]
    if config.analysis.baseline:
        lines.append(f"baseline = {q(format_duration(config.analysis.baseline))}")
    if config.analysis.conventions:
        lines.append("conventions = " + _inline_table(config.analysis.conventions))
    for price in config.analysis.prices:
        lines += ["", "[[analysis.prices]]"]
        lines += [f"{k} = {q(v)}" for k, v in price.model_dump().items() if v is not None]
    d = config.dashboards
    lines += [
        "",
        "[dashboards]",
        f"out_dir = {q(str(d.out_dir))}",
        f"formats = {q(list(d.formats))}",
        f"runs_max_age = {q(format_duration(d.runs_max_age))}",
    ]
    if d.window:
        lines.append(f"window = {q(format_duration(d.window))}")
    if d.public_url:
        lines.append(f"public_url = {q(_mask_url(d.public_url))}")
    lines += ["", "[rules]", f"files = {q([str(f) for f in config.rules.files])}"]
    if not config.rules.files:
        lines[-1] += "  # the default pack"
    for w in config.notify.webhook:
        lines += ["", "[[notify.webhook]]", f"url = {q(_mask_url(w.url))}", f"name = {q(w.name)}"]
        if w.secret_env:
            lines.append(f"secret_env = {q(w.secret_env)}{_env_state(w.secret_env)}")
        lines.append(f"timeout = {q(format_duration(w.timeout))}")
    for sl in config.notify.slack:
        lines += ["", "[[notify.slack]]", f"name = {q(sl.name)}"]
        if sl.url:
            lines.append(f"url = {q(_mask_url(sl.url, whole_path=True))}")
        if sl.url_env:
            lines.append(f"url_env = {q(sl.url_env)}{_env_state(sl.url_env)}")
    for p in config.notify.pagerduty:
        lines += [
            "",
            "[[notify.pagerduty]]",
            f"name = {q(p.name)}",
            f"routing_key_env = {q(p.routing_key_env)}{_env_state(p.routing_key_env)}",
            f"url = {q(_mask_url(p.url))}",
        ]
    for a in config.notify.alertmanager:
        lines += ["", "[[notify.alertmanager]]", f"url = {q(_mask_url(a.url))}"]
        lines += [f"name = {q(a.name)}"] if a.name else []
        lines += [f"username = {q(a.username)}"] if a.username else []
        for key, env in (("password_env", a.password_env), ("bearer_token_env", a.bearer_token_env)):
            lines += [f"{key} = {q(env)}{_env_state(env)}"] if env else []
        lines += [f"ca_file = {q(str(a.ca_file))}"] if a.ca_file else []
        lines.append(f"timeout = {q(format_duration(a.timeout))}")
    if config.links.trace_url:
        lines += ["", "[links]", f"trace_url = {q(config.links.trace_url)}"]
    lines += ["", "[log]", f"format = {q(config.log.format)}", f"level = {q(config.log.level)}"]
    return "\n".join(lines) + "\n"


def _inline_table(values: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in values.items()) + " }"


def _toml_value(value: Any) -> str:
    """A value as TOML writes it: tables inline, lists as arrays (a per-operation convention is a
    list of tables), strings, numbers and booleans as JSON spells them, which TOML shares."""
    if isinstance(value, Mapping):
        return _inline_table(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def example_config() -> str:
    """The commented example ``tailwatch config init`` writes; it loads as is."""
    env_lines = "\n".join(f"#   {v.name:<30} {v.key:<24} {v.help}" for v in ENV_VARS)
    return f"""# tailwatch configuration: `tailwatch serve` and every other command read it (--config FILE,
# else $TAILWATCH_CONFIG, else ./tailwatch.toml); `tailwatch config show` prints what they resolve.
#
# Every value resolves: command-line option -> TAILWATCH_* environment variable -> this file ->
# default. Durations: "500ms", "2s", "5m", "1h", "1d". Relative paths are relative to this file.
# Secrets never go in this file: name the environment variable that holds them (*_env keys).
#
# Environment variables:
{env_lines}

# The store: chdb:///abs/path (embedded; the service owns it while running) or
# http(s)://user:password@host:port/database (a ClickHouse server or cluster). Default: the
# embedded store under ./.tailwatch/store, which any user can start with.
# store = "chdb:///var/lib/tailwatch/store"

[receiver]
otlp_http = "127.0.0.1:4318"   # OTLP/HTTP, also /api/v1, /dashboards, /metrics; "off" disables
otlp_grpc = "127.0.0.1:4317"   # OTLP/gRPC; "off" disables

[ingest]
batch_rows = {PipelineSettings.batch_rows:<17} # insert when this many spans are queued ...
flush_interval = "1s"          # ... or after this long
max_queue_spans = 200000       # bound of the queue; beyond it exporters get 429/503
max_request_bytes = 67108864   # body limit of one export, also after decompression
max_queue_bytes = 268435456    # bound of the queue in bytes; beyond it exporters get 429
max_inflight_bytes = 268435456 # bodies read and decoded at once; beyond it exporters get 429
spool = true                   # fsync'd spool: exports are acknowledged once on disk, none lost
# spool_dir = "spool"          # where (default: beside an embedded store, <store>.spool)

[auth]
token_env = "TAILWATCH_INGEST_TOKEN"   # when set, ingest, API and dashboards require this bearer token

[schedule]
enabled = true                 # false on stateless collectors: receivers only
# Each job: a duration, a 5-field cron string in UTC ("*/5 * * * *"), {{ cron = "..." }}, or "off".
rollup = "60s"                 # per-minute rollups and the summaries analyses read
analyze = "5m"                 # the analysis over [now - analysis.window, now), persisted
evaluate = "60s"               # rule evaluation, then delivery of pending notifications
dashboards = "1h"              # export of the dashboards into dashboards.out_dir
misfire_grace = "30s"          # a run starting later than this after its due time is skipped
shutdown_timeout = "30s"       # how long SIGTERM waits for a running job
lease_ttl = "30s"              # scheduler lease: a second scheduling instance stays passive

[analysis]
window = "1h"                  # analysed window, ending at each run
# baseline = "1h"              # baseline window just before it (default: the same length)
# conventions = {{ min_release_requests = 50 }}   # analytics span conventions
# A streamed endpoint's abandonment read against its time to first byte:
# conventions = {{ abandonment_latency = [{{ operation = "POST /chat/stream", latency = "first_byte" }}] }}

# Model prices, USD per million tokens (none are shipped; a model without one has no cost):
# [[analysis.prices]]
# provider = "openai"          # "*" matches any provider
# model = "gpt-4o"
# input = 2.5
# cached_input = 1.25          # default: the input price
# output = 10.0

[dashboards]
out_dir = "dashboards"         # served under /dashboards/ on the OTLP/HTTP port
formats = ["html"]             # add "png" for images (needs Chromium)
# window = "1d"                # exported window; default: the latest analysis
# public_url = "https://tailwatch.example.com/dashboards"   # base of the links in alerts
runs_max_age = "1d"            # run pages (what alert links open) pruned after this, re-rendered on request

[rules]
files = []                     # [] = the shipped pack; paths are relative to this file

# Where alerts go: uncomment what you run. `tailwatch config check` says what is missing.
# Receivers of Alertmanager-format webhooks (the body Alertmanager sends its receivers, v4).
# [[notify.webhook]]
# url = "http://127.0.0.1:5001/hook"
# secret_env = "TAILWATCH_WEBHOOK_SECRET"   # HMAC-SHA256 signature of each body when set

# Alertmanager itself (POST /api/v2/alerts, re-sent every evaluation); one table per instance.
# [[notify.alertmanager]]
# url = "http://127.0.0.1:9093"
# bearer_token_env = "TAILWATCH_ALERTMANAGER_TOKEN"   # or username + password_env; ca_file for https

# [[notify.slack]]
# url_env = "TAILWATCH_SLACK_URL"         # the incoming-webhook URL is itself a secret

# [[notify.pagerduty]]
# routing_key_env = "TAILWATCH_PAGERDUTY_KEY"

# [links]
# trace_url = "http://127.0.0.1:16686/trace/{{trace_id}}"  # your trace viewer; {{start}}/{{end}} also work

[log]
format = "plain"               # or "json" (one object per line)
level = "info"
"""


def resolve_overrides(**values: Any) -> dict[str, Any]:
    """Command-line options (``otlp_http=...``) as dotted override keys for :func:`load_config`."""
    mapping: dict[str, str] = {
        "store": "store",
        "otlp_http": "receiver.otlp_http",
        "otlp_grpc": "receiver.otlp_grpc",
        "log_format": "log.format",
        "log_level": "log.level",
    }
    return {mapping[k]: v for k, v in values.items() if v is not None}
