"""`tailwatch grafana dashboard`: the dashboard JSON's shape. Its queries run against a real
Prometheus scraping `serve` in tests/tailwatch/test_prometheus.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from dashboards import VIEWS
from tailwatch.cli import main
from tailwatch.commands.grafana import (
    PANELS,
    RELEASE_ANNOTATION_EXPR,
    SCHEMA_VERSION,
    VARIABLES,
    grafana_dashboard,
)
from tailwatch.metrics import _SPECS, ALERTS

SERIES = re.compile(r"\btailwatch_[a-z0-9_]+")


def test_every_query_reads_a_series_of_metrics_and_every_panel_links_back() -> None:
    board = grafana_dashboard("https://tw.example/dashboards/")
    assert board["schemaVersion"] == SCHEMA_VERSION == 42
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "service", "operation", "queue", "tailwatch_url"]
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert variables["tailwatch_url"]["query"] == "https://tw.example/dashboards"
    for name in ("service", "operation", "queue"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert variables[name]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    known = set(_SPECS) | {ALERTS}
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]] + [RELEASE_ANNOTATION_EXPR]
    exprs += [metric for metric, _ in VARIABLES.values()]
    for expr in exprs:
        names = SERIES.findall(expr)
        assert names and set(names) <= known, expr
    annotation = board["annotations"]["list"][1]
    assert annotation["expr"] == RELEASE_ANNOTATION_EXPR and annotation["useValueForTime"] is True
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids) == len(PANELS)
    cells = set()
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        [link] = panel["links"]
        page = re.fullmatch(r"\$\{tailwatch_url\}/(?:latest/([a-z_]+)\.html)?", link["url"])
        assert page is not None and (page[1] is None or page[1] in VIEWS), link
        pos = panel["gridPos"]
        cell = {(pos["x"] + dx, pos["y"] + dy) for dx in range(pos["w"]) for dy in range(pos["h"])}
        assert not cell & cells and pos["x"] + pos["w"] <= 24, panel["title"]
        cells |= cell
    # The panels: hot path, sync calls, cold path p99 and pending, abandonment and cliff,
    # amplification, verdict and Δp99, LLM rates, alerts.
    text = json.dumps(board)
    for series in (
        "tailwatch_hot_path_latency_seconds",
        "tailwatch_hot_path_sync_llm_calls_per_request",
        "tailwatch_cold_path_enqueue_to_ready_seconds",
        "tailwatch_cold_path_pending_jobs",
        "tailwatch_abandonment_ratio",
        "tailwatch_abandonment_cliff_seconds",
        "tailwatch_retry_attempt_amplification_ratio",
        "tailwatch_retry_token_amplification_ratio",
        "tailwatch_attribution_verdict",
        "tailwatch_attribution_p99_delta_seconds",
        "tailwatch_llm_call_throttle_ratio",
        "tailwatch_llm_call_failed_attempt_ratio",
        "tailwatch_llm_call_error_ratio",
        "tailwatch_llm_call_retry_ratio",
        "tailwatch_alerts",
    ):
        assert series in text, series


def test_the_command_prints_the_dashboard_linking_to_the_configured_url(tmp_path: Path) -> None:
    (tmp_path / "tailwatch.toml").write_text(
        '[dashboards]\npublic_url = "https://tailwatch.example.com/dashboards"\n'
    )
    runner = CliRunner()
    done = runner.invoke(main, ["grafana", "dashboard", "--config", str(tmp_path / "tailwatch.toml")])
    assert done.exit_code == 0, done.output
    board = json.loads(done.output)
    [url] = [v["query"] for v in board["templating"]["list"] if v["name"] == "tailwatch_url"]
    assert url == "https://tailwatch.example.com/dashboards"
    done = runner.invoke(
        main, ["grafana", "dashboard", "--dashboards-url", "http://10.0.0.5:4318/dashboards", "--uid", "x"]
    )
    board = json.loads(done.output)
    assert board["uid"] == "x"
    assert [v["query"] for v in board["templating"]["list"] if v["name"] == "tailwatch_url"] == [
        "http://10.0.0.5:4318/dashboards"
    ]
