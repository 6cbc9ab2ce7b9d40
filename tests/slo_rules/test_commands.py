"""``tailwatch alerts evaluate|list|deliver`` as a user runs them, on a real store."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from analytics import summary_coverage
from collectors import insert_spans
from storage import ensure_schema, open_store
from tailwatch.cli import main
from tests.analytics import builders as b
from tests.slo_rules.receivers import Receiver

RULES = """
rules:
  - name: chat-p99-regression
    kind: p99_regression
    service: chat-api
    window: 1h
    min_requests: 200
    severity: page
"""


def _tailwatch(*args: str, env: dict[str, str] | None = None) -> Result:
    # In-process (no store is held open by the test meanwhile): the same code path as the
    # installed command, without paying interpreter start-up for every call.
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_evaluate_list_deliver(store_dsn: str, tmp_path: Path) -> None:
    sc = b.scenario_llm_regression()
    with open_store(store_dsn) as store:
        ensure_schema(store)
        insert_spans(store, sc.spans)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    hook = Receiver().start()
    try:
        at = sc.end.isoformat().replace("+00:00", "Z")
        proc = _tailwatch(
            "alerts", "evaluate", "--store", store_dsn, "--at", at, "--rules", str(rules),
            env={"TAILWATCH_WEBHOOK_URL": hook.url + "/hook", "TAILWATCH_WEBHOOK_SECRET": "k"},
        )  # fmt: skip
        assert proc.exit_code == 0, proc.output
        assert "FIRING   chat-p99-regression  [page]  cause=llm  chat-api: p99 of POST /chat" in proc.output
        assert "delivery: 1 attempted, 1 delivered" in proc.output
        (got,) = hook.requests
        assert got.json()["alerts"][0]["annotations"]["cause"] == "llm"
        assert got.headers["x-tailwatch-signature"].startswith("sha256=")
    finally:
        hook.stop()

    listed = _tailwatch("alerts", "list", "--store", store_dsn)
    assert listed.exit_code == 0, listed.output
    assert listed.output.startswith("firing   page   chat-p99-regression  chat-api POST /chat  cause=llm")
    as_json = json.loads(_tailwatch("alerts", "list", "--store", store_dsn, "--format", "json").output)
    (alert,) = as_json["alerts"]
    assert alert["labels"]["service"] == "chat-api" and alert["annotations"]["cause"] == "llm"

    # Resolve two hours later while the receiver is down: the notification waits in the outbox.
    later = (sc.end + timedelta(hours=2)).isoformat()
    down = f"http://127.0.0.1:{hook.port}/hook"
    proc = _tailwatch(
        "alerts", "evaluate", "--store", store_dsn, "--at", later, "--rules", str(rules), "--webhook", down
    )
    assert proc.exit_code == 0, proc.output
    assert "RESOLVED chat-p99-regression" in proc.output
    assert "undelivered  webhook" in proc.output
    failed = _tailwatch("alerts", "deliver", "--store", store_dsn, "--webhook", down)
    assert failed.exit_code == 1 and "1 undelivered" in failed.output
    back = Receiver(port=hook.port).start()
    try:
        ok = _tailwatch("alerts", "deliver", "--store", store_dsn, "--webhook", down)
        assert ok.exit_code == 0, ok.output
        assert "1 delivered" in ok.output
        (resolved,) = back.requests
        assert resolved.json()["status"] == "resolved"
    finally:
        back.stop()


def test_errors_are_one_line(store_dsn: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    kind: nope\n")
    proc = _tailwatch("alerts", "evaluate", "--store", store_dsn, "--rules", str(bad))
    assert proc.exit_code == 2 and "Traceback" not in proc.output
    assert proc.output.strip().startswith(
        f"tailwatch: error: {bad}:3: rules[0].kind: unknown rule kind 'nope'"
    )
    proc = _tailwatch("alerts", "evaluate", "--store", store_dsn, "--at", "yesterday")
    assert proc.exit_code == 2 and "is not an ISO 8601 time" in proc.output


def test_rule_that_cannot_run_exits_1(store_dsn: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    # A store without traces: the analysis fails, the rule is reported, nothing is resolved.
    proc = _tailwatch("alerts", "evaluate", "--store", store_dsn, "--rules", str(rules))
    assert proc.exit_code == 1
    assert "error    rule chat-p99-regression: " in proc.output
    assert "1 rule errors" in proc.output


def test_evaluate_takes_the_store_rules_notifiers_and_conventions_of_the_config(
    store_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory whose tailwatch.toml names a store, a rules file and a webhook: a bare
    `alerts evaluate` there uses all three (not the shipped rules, not silence)."""
    sc = b.scenario_llm_regression()
    with open_store(store_dsn) as store:
        ensure_schema(store)
        insert_spans(store, sc.spans)
    (tmp_path / "rules.yaml").write_text(
        RULES
        + "  - {name: queues, kind: cold_path_starvation, window: 1h}\n"
        + "  - {name: slo, kind: latency_slo, service: chat-api, threshold_ms: 5000, target: 0.99}\n"
    )
    hook = Receiver().start()
    try:
        (tmp_path / "tailwatch.toml").write_text(
            f'store = "{store_dsn}"\n[rules]\nfiles = ["rules.yaml"]\n'
            f'[[notify.webhook]]\nurl = "{hook.url}/hook"\nname = "oncall"\n'
        )
        monkeypatch.chdir(tmp_path)
        at = sc.end.isoformat()
        dry = _tailwatch("alerts", "evaluate", "--at", at, "--dry-run", "--explain")
        assert dry.exit_code == 0, dry.output
        assert "evaluated 3 rules" in dry.output and "WOULD FIRE     chat-p99-regression" in dry.output
        assert "WOULD SEND     firing notification: chat-p99-regression" in dry.output
        assert "  skipped  queues  -: no job on a selected queue in the last 1h" in dry.output
        assert hook.requests == [] and _tailwatch("alerts", "list").output.startswith("no firing")
        proc = _tailwatch("alerts", "evaluate", "--at", at, "--format", "json")
        assert proc.exit_code == 0, proc.output
        body = json.loads(proc.output)
        assert [a["alertname"] for a in body["fired"]] == ["chat-p99-regression"]
        verdicts = {(e["rule"], e["verdict"]) for e in body["explanations"]}
        assert verdicts == {("chat-p99-regression", "fired"), ("queues", "skipped"), ("slo", "quiet")}
        (got,) = hook.requests  # the configured webhook, by its configured name
        assert got.json()["alerts"][0]["labels"]["alertname"] == "chat-p99-regression"
        # An instant before the last evaluation would rewind live state and notify again.
        earlier = (sc.end - timedelta(minutes=30)).isoformat()
        refused = _tailwatch("alerts", "evaluate", "--at", earlier)
        assert refused.exit_code == 2
        assert "is before the last evaluation of this store" in refused.output
        assert "pass --dry-run to see what it would do, or --force" in refused.output
        assert len(hook.requests) == 1
        assert _tailwatch("alerts", "evaluate", "--at", earlier, "--dry-run").exit_code == 0
    finally:
        hook.stop()


def test_evaluate_brings_the_summaries_up_to_date_as_the_service_does(store_dsn: str, tmp_path: Path) -> None:
    """From cron, `alerts evaluate` pays the service's cost: the minutes since the last build are
    summarised before the rules read them; a dry run writes nothing, summaries included."""
    sc = b.scenario_llm_regression()
    with open_store(store_dsn) as store:
        ensure_schema(store)
        insert_spans(store, sc.spans)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    at = sc.end.isoformat()
    dry = _tailwatch(
        "alerts", "evaluate", "--store", store_dsn, "--rules", str(rules), "--at", at, "--dry-run"
    )
    assert dry.exit_code == 0, dry.output
    with open_store(store_dsn) as store:
        assert summary_coverage(store) == []
    proc = _tailwatch("alerts", "evaluate", "--store", store_dsn, "--rules", str(rules), "--at", at)
    assert proc.exit_code == 0, proc.output
    assert "FIRING   chat-p99-regression" in proc.output
    with open_store(store_dsn) as store:
        (covered,) = summary_coverage(store)
        first = min(s.start_ns for s in sc.spans)
        assert covered[0] <= b.dt(first) and covered[1] > sc.end
