"""``architecture_drift`` rules on the generated drift scenario (tests/analytics/builders.py): one
ticket per finding of the drift report, labelled by kind, naming the symptom and the decision."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analytics import drift_report
from collectors.spans import insert_spans
from slo_rules import RuleError, evaluate, load_rules
from slo_rules.kinds.architecture_drift import DECISION
from slo_rules.rules import rules_from_text
from storage import Store
from tests.analytics.builders import scenario_drift

DRIFT_ONLY = """\
rules:
  - name: drift
    kind: architecture_drift
"""


def _findings_key(labels: dict[str, str]) -> tuple[str, str, str, str]:
    return (labels["kind"], labels.get("service", ""), labels.get("operation", ""), labels.get("queue", ""))


def test_the_shipped_pack_tickets_each_finding_with_its_symptom_and_decision(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    result = evaluate(store, load_rules(), scenario.end, dry_run=True)
    assert result.errors == []
    drift = [a for a in result.fired if a.labels["alertname"] == "architecture-drift"]
    # One alert per finding of the report the analytics compute for the same 14 days.
    expected = {(f.kind, f.service, f.operation, f.queue) for f in drift_report(store, scenario.end)}
    assert {_findings_key(a.labels) for a in drift} == expected == set(scenario.expected)
    assert {a.labels["severity"] for a in drift} == {"ticket"}
    shared = next(a for a in drift if a.labels["kind"] == "shared_operation")
    assert shared.annotations["decision"] == DECISION
    assert shared.annotations["since"] == "2026-11-12"
    assert "from 0% to 38%" in shared.annotations["summary"]
    assert shared.annotations["summary"].endswith(
        "say it is an online service now: set a p99 budget, bound the queue, isolate per request "
        "(or give the online path its own implementation and keep the batch one for batches)"
    )
    assert shared.annotations["drift_severity"] == "critical"
    cost = next(a for a in drift if a.labels["kind"] == "unit_cost_rising")
    assert "725 tokens and 1.00 model calls per item then, 1950 and 1.25 now" in cost.annotations["summary"]
    assert cost.annotations["drift_severity"] == "critical"  # with batch_shrinking in summary-worker
    retry = next(a for a in drift if a.labels["kind"] == "whole_batch_retry")
    assert (
        "50 items reprocessed per item that failed, 40 retried jobs, 40 of them"
        in retry.annotations["summary"]
    )
    queue = next(a for a in drift if a.labels["kind"] == "queue_unbounded")
    assert queue.labels["queue"] == "doc-index" and "service" not in queue.labels
    assert "the backlog is 120 and grows 30 a day" in queue.annotations["summary"]


def test_a_latency_slo_rule_in_the_set_is_a_latency_target(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    rules = rules_from_text(
        DRIFT_ONLY
        + """\
  - name: templates-slo
    kind: latency_slo
    service: web
    operation: "GET /*"
    threshold_ms: 300
    target: 0.99
"""
    )
    result = evaluate(store, rules, scenario.end, dry_run=True)
    targets = {a.labels.get("service") for a in result.fired if a.labels.get("kind") == "no_latency_target"}
    assert targets == {"summary-api"}


def test_kinds_and_queue_select_the_findings(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    only_queues = DRIFT_ONLY + '    kinds: [queue_unbounded]\n    queue: "doc-*"\n'
    result = evaluate(store, rules_from_text(only_queues), scenario.end, dry_run=True)
    assert [_findings_key(a.labels) for a in result.fired] == [("queue_unbounded", "", "", "doc-index")]
    other = DRIFT_ONLY + '    kinds: [queue_unbounded]\n    queue: "emails"\n'
    quiet = evaluate(store, rules_from_text(other), scenario.end, dry_run=True)
    assert quiet.fired == [] and quiet.errors == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    window: 36h\n", "whole days"),
        ("    labels: {kind: x}\n", "label 'kind'"),
        ("    kinds: [unit_cost]\n", "kinds"),
    ],
)
def test_invalid_drift_rules_are_refused(extra: str, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        rules_from_text(DRIFT_ONLY + extra)


def test_each_drift_alert_links_to_the_drift_view(store: Store) -> None:
    scenario = scenario_drift()
    insert_spans(store, scenario.spans)
    result = evaluate(store, load_rules(), scenario.end, dashboard_url="http://dash.example/dashboards")
    drift = [a for a in result.fired if a.labels["alertname"] == "architecture-drift"]
    assert drift
    assert {a.annotations.get("dashboard") for a in drift} == {"http://dash.example/dashboards/drift.html"}


def test_the_symptom_names_the_release_the_change_arrived_with() -> None:
    from datetime import UTC, datetime

    from analytics import DriftFinding
    from slo_rules import drift_symptom

    finding = DriftFinding(
        "no_latency_target",
        "digest-api",
        "POST /summaries/now",
        "",
        datetime(2026, 12, 4, tzinfo=UTC),
        {"p99_ms_now": 1810.0},
    )
    assert drift_symptom(finding).endswith("(since 2026-12-04)")
    released = replace(finding, since_release="0.3.0")
    assert drift_symptom(released).endswith("(since 2026-12-04, with digest-api 0.3.0)")
