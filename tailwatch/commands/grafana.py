"""``tailwatch grafana dashboard``: a Grafana dashboard over the tail metrics ``serve`` exposes on
``/metrics``, printed as JSON to import or provision.

The panels read only the series of :mod:`tailwatch.metrics` (names checked by the tests against
that module and, through a real Prometheus scraping ``serve``, by running every query). Each panel
links back to the tailwatch page holding the same evidence, ``<dashboards URL>/latest/<view>.html``
(the service redirects it to that view of its latest scheduled analysis).

Usage::

    tailwatch grafana dashboard > tailwatch-grafana.json
    tailwatch grafana dashboard --dashboards-url https://tailwatch.example.com/dashboards
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import click

from dashboards import VIEW_TITLES, View
from tailwatch.commands._common import config_option
from tailwatch.config import load_config

__all__ = ["PANELS", "SCHEMA_VERSION", "Panel", "Target", "grafana", "grafana_dashboard"]

# The classic dashboard JSON model: 42 is its last schema version (Grafana 12 and 13 import it as
# it is; newer versions migrate it on load).
SCHEMA_VERSION: Final = 42
DEFAULT_UID: Final = "tailwatch-tails"
DEFAULT_TITLE: Final = "tailwatch: AI feature latency tails"
_DATASOURCE: Final = {"type": "prometheus", "uid": "${datasource}"}
_HOT = 'service=~"$service", operation=~"$operation"'
_QUEUE = 'queue=~"$queue"'

PanelType = Literal["timeseries", "table"]


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A panel: its queries, unit, kind and the tailwatch view holding the same evidence."""

    title: str
    description: str
    view: View | None  # None: the landing page
    targets: tuple[Target, ...]
    unit: str = "none"
    kind: PanelType = "timeseries"
    # Columns a table shows besides the value (its labels).
    columns: tuple[str, ...] = field(default_factory=tuple)


PANELS: Final[tuple[Panel, ...]] = (
    Panel(
        "Hot-path p50 and p99 per operation",
        "Request latency over each analysis window, all versions; dotted marks are releases. "
        "Quantiles are not histograms: compare them, never average them across operations.",
        "hot_path",
        (
            Target(
                f'tailwatch_hot_path_latency_seconds{{{_HOT}, quantile="0.5"}}',
                "{{service}} {{operation}} p50",
            ),
            Target(
                f'tailwatch_hot_path_latency_seconds{{{_HOT}, quantile="0.99"}}',
                "{{service}} {{operation}} p99",
            ),
        ),
        unit="s",
    ),
    Panel(
        "Synchronous LLM calls per hot request",
        "Model calls on the request path per request: a release that adds one sets the p99 from then on.",
        "hot_path",
        (Target(f"tailwatch_hot_path_sync_llm_calls_per_request{{{_HOT}}}", "{{service}} {{operation}}"),),
    ),
    Panel(
        "Cold path: enqueue-to-ready p99 per queue",
        "From enqueue to the result being ready, jobs enqueued in the analysis window.",
        "cold_path",
        (Target(f'tailwatch_cold_path_enqueue_to_ready_seconds{{{_QUEUE}, quantile="0.99"}}', "{{queue}}"),),
        unit="s",
    ),
    Panel(
        "Cold path: jobs still pending",
        "Jobs enqueued in the analysis window and not ready at its end.",
        "cold_path",
        (Target(f"tailwatch_cold_path_pending_jobs{{{_QUEUE}}}", "{{queue}}"),),
    ),
    Panel(
        "Abandonment ratio",
        "Share of hot-path requests the client abandoned.",
        "abandonment",
        (Target(f"tailwatch_abandonment_ratio{{{_HOT}}}", "{{service}} {{operation}}"),),
        unit="percentunit",
    ),
    Panel(
        "Abandonment cliff",
        "The latency from which abandonment jumps; absent where there is none.",
        "abandonment",
        (Target(f"tailwatch_abandonment_cliff_seconds{{{_HOT}}}", "{{service}} {{operation}}"),),
        unit="s",
    ),
    Panel(
        "Retry and token amplification per workflow",
        "LLM call attempts per logical call, and tokens of all attempts over the final ones' (1: none).",
        "retries",
        (
            Target("tailwatch_retry_attempt_amplification_ratio", "{{workflow}} attempts"),
            Target("tailwatch_retry_token_amplification_ratio", "{{workflow}} tokens"),
        ),
    ),
    Panel(
        "Δp99 against the baseline",
        "p99 of the analysis window minus p99 of the baseline window.",
        "attribution",
        (Target(f"tailwatch_attribution_p99_delta_seconds{{{_HOT}}}", "{{service}} {{operation}}"),),
        unit="s",
    ),
    Panel(
        "Attribution verdict: LLM or internal",
        "Where each operation's p99 change went, as the latest analysis judged it.",
        "attribution",
        (Target(f"tailwatch_attribution_verdict{{{_HOT}}} == 1", "{{verdict}}"),),
        kind="table",
        columns=("service", "operation", "verdict"),
    ),
    Panel(
        "LLM calls: 429s, failed attempts, failed calls and retries",
        "Per provider and model: attempts answered 429, attempts failed otherwise (5xx, timeouts), calls "
        "that failed after their retries (what the user met), attempts beyond the first per call.",
        "attribution",
        (
            Target("tailwatch_llm_call_throttle_ratio", "{{provider}} {{model}} 429 attempts"),
            Target("tailwatch_llm_call_failed_attempt_ratio", "{{provider}} {{model}} failed attempts"),
            Target("tailwatch_llm_call_error_ratio", "{{provider}} {{model}} failed calls"),
            Target("tailwatch_llm_call_retry_ratio", "{{provider}} {{model}} retries"),
        ),
        unit="percentunit",
    ),
    Panel(
        "Alerts firing",
        "tailwatch's own alerts (its notifiers page for them: do not page on this series again).",
        None,
        (
            Target(
                'sum by (alertname, severity, cause) (tailwatch_alerts{alertstate="firing"})', "{{alertname}}"
            ),
        ),
        kind="table",
        columns=("alertname", "severity", "cause"),
    ),
)

# The release annotation: every version's first-seen time, the series value (ms) as its time.
RELEASE_ANNOTATION_EXPR: Final = f"tailwatch_release_timestamp_seconds{{{_HOT}}} * 1000"
# What the template variables list (Grafana's label_values(), run as Prometheus's label API).
VARIABLES: Final[dict[str, tuple[str, str]]] = {
    "service": ("tailwatch_hot_path_requests", "service"),
    "operation": ('tailwatch_hot_path_requests{service=~"$service"}', "operation"),
    "queue": ("tailwatch_cold_path_jobs", "queue"),
}


def _link(panel: Panel) -> dict[str, Any]:
    if panel.view is None:
        return {"title": "tailwatch: what is firing", "url": "${tailwatch_url}/", "targetBlank": True}
    title = VIEW_TITLES[panel.view].split(":")[0]
    return {
        "title": f"tailwatch: {title}",
        "url": f"${{tailwatch_url}}/latest/{panel.view}.html",
        "targetBlank": True,
    }


def _panel(panel_id: int, panel: Panel, x: int, y: int) -> dict[str, Any]:
    table = panel.kind == "table"
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": dict(_DATASOURCE),
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "links": [_link(panel)],
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": dict(_DATASOURCE),
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": not table,
                "instant": table,
                **({"format": "table"} if table else {}),
            }
            for i, t in enumerate(panel.targets)
        ],
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
    }
    if table:
        keep = {name: i for i, name in enumerate(panel.columns)}
        body["options"] = {"showHeader": True}
        body["transformations"] = [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {
                        "Time": True,
                        "Value": True,
                        "__name__": True,
                        "instance": True,
                        "job": True,
                    },
                    "indexByName": keep,
                },
            }
        ]
    else:
        # The values change once per analysis run: steps, not slopes.
        body["fieldConfig"]["defaults"]["custom"] = {"lineInterpolation": "stepAfter", "spanNulls": False}
        body["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return body


def _query_variable(name: str, metric: str, label: str) -> dict[str, Any]:
    definition = f"label_values({metric}, {label})"
    return {
        "type": "query",
        "name": name,
        "label": name,
        "datasource": dict(_DATASOURCE),
        "definition": definition,
        "query": {"qryType": 1, "query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,  # on time range change: operations come and go
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "regex": "",
        "hide": 0,
    }


def grafana_dashboard(
    dashboards_url: str, *, title: str = DEFAULT_TITLE, uid: str = DEFAULT_UID
) -> dict[str, Any]:
    """The dashboard as Grafana's classic JSON model: a ``datasource`` variable for the Prometheus
    data source, ``service``/``operation``/``queue`` variables, the release annotations, and
    :data:`PANELS` two a row, each linking to ``dashboards_url`` (``tailwatch_url``, a hidden
    constant the dashboard's settings can change)."""
    panels = [_panel(i + 1, panel, 12 * (i % 2), 8 * (i // 2)) for i, panel in enumerate(PANELS)]
    variables: list[dict[str, Any]] = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Prometheus",
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "hide": 0,
            "current": {},
        },
        *(_query_variable(name, metric, label) for name, (metric, label) in VARIABLES.items()),
        {
            "type": "constant",
            "name": "tailwatch_url",
            "label": "tailwatch dashboards URL",
            "query": dashboards_url.rstrip("/"),
            "hide": 2,
        },
    ]
    return {
        "uid": uid,
        "title": title,
        "description": "Latency tails of AI features from tailwatch's /metrics: hot-path p99 against "
        "releases, cold-path enqueue-to-ready, abandonment, retry amplification, LLM vs internal "
        "attribution.",
        "tags": ["tailwatch", "latency", "llm"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "utc",
        "time": {"from": "now-24h", "to": "now"},
        "refresh": "1m",
        "links": [
            {
                "title": "tailwatch: what is firing",
                "url": "${tailwatch_url}/",
                "type": "link",
                "icon": "dashboard",
                "targetBlank": True,
            }
        ],
        "templating": {"list": variables},
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "name": "Releases",
                    "datasource": dict(_DATASOURCE),
                    "enable": True,
                    "iconColor": "#7f7f7f",
                    "expr": RELEASE_ANNOTATION_EXPR,
                    "step": "60s",
                    "titleFormat": "release {{version}}",
                    "textFormat": "{{service}} {{operation}}",
                    "tagKeys": "service,operation,version",
                    "useValueForTime": True,
                },
            ]
        },
        "panels": panels,
    }


def _default_url(config_path: Path | None) -> str:
    config = load_config(config_path)
    if config.dashboards.public_url:
        return config.dashboards.public_url.rstrip("/")
    listen = config.receiver.otlp_http or "127.0.0.1:4318"
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "::", "[::]", "") or port == "0":  # noqa: S104 (reach a wildcard bind via loopback)
        host = "127.0.0.1"
    return f"http://{host}:{port if port != '0' else '4318'}/dashboards"


@click.group("grafana")
def grafana() -> None:
    """Grafana: a dashboard over the tail metrics `tailwatch serve` exposes on /metrics."""


@grafana.command("dashboard")
@config_option
@click.option(
    "--dashboards-url",
    default=None,
    help="Base URL of tailwatch's /dashboards the panels link to "
    "[default: dashboards.public_url, else http://<receiver.otlp_http>/dashboards].",
)
@click.option("--title", default=DEFAULT_TITLE, show_default=True, help="Dashboard title.")
@click.option("--uid", default=DEFAULT_UID, show_default=True, help="Dashboard uid (stable across imports).")
def dashboard(config_path: Path | None, dashboards_url: str | None, title: str, uid: str) -> None:
    """Print a Grafana dashboard JSON: import it (Dashboards → New → Import) or provision it.

    Hot-path p50/p99 with release annotations, sync LLM calls per request, cold-path p99 and
    pending jobs, abandonment ratio and cliff, retry and token amplification, Δp99 and the
    attribution verdict, LLM 429/error/retry rates and the alerts firing; a `datasource` variable
    for the Prometheus data source and `service`/`operation`/`queue` variables. Each panel links to
    the matching tailwatch page.
    """
    url = dashboards_url or _default_url(config_path)
    click.echo(json.dumps(grafana_dashboard(url, title=title, uid=uid), indent=2, ensure_ascii=False))
