"""``tailwatch alerts evaluate|list|deliver`` as a user runs them, on a real store."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner, Result

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
