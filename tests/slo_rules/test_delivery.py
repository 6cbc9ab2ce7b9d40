"""Notifiers and the outbox against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from slo_rules import (
    DeliveryResult,
    Notification,
    Notifier,
    NotifierConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
    deliver,
    verify_signature,
)
from slo_rules.notifiers import AlertPayload, build_notifier
from slo_rules.outbox import enqueue, outbox_rows
from storage import Store, ensure_schema, open_store
from tests.slo_rules.receivers import Received, Receiver

# Outbox rows expire by TTL a month after creation: synthetic times stay near the real clock.
NOW = datetime.now(UTC).replace(microsecond=0)


def _quick(config: NotifierConfig) -> Notifier:
    # The real notifier with short in-call backoff, so ten failing drains take well under a second each.
    return build_notifier(config, backoff_s=0.01)


def _notification(i: int, status: str = "firing") -> Notification:
    labels = {
        "alertname": "hot-path-p99-regression",
        "severity": "page",
        "service": "chat-api",
        "operation": f"POST /op{i}",
        "path": "hot",
    }
    return Notification(
        id=f"{i:032x}",
        status=status,  # type: ignore[arg-type]
        group_key='{}:{alertname="hot-path-p99-regression"}',
        group_labels={"alertname": "hot-path-p99-regression"},
        alerts=(
            AlertPayload(
                status=status,  # type: ignore[arg-type]
                labels=labels,
                annotations={"summary": f"p99 of POST /op{i} 1.2 s → 3.4 s", "cause": "llm"},
                starts_at=NOW,
                ends_at=NOW + timedelta(minutes=5) if status == "resolved" else None,
                fingerprint=f"{i:016x}",
                generator_url="http://127.0.0.1:4318/dashboards/attribution.html",
            ),
        ),
        external_url="http://127.0.0.1:4318/dashboards",
        created_at=NOW,
    )


def test_webhook_is_alertmanager_v4_signed_and_keyed(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_TEST_SECRET", "s3cr3t")
    notifier = build_notifier(
        WebhookConfig(receiver.url + "/hook", secret_env="TW_TEST_SECRET", name="oncall")
    )
    result = notifier.send(_notification(1))
    notifier.close()
    assert result.ok and result.status_code == 200 and result.attempts == 1
    (got,) = receiver.requests
    assert got.path == "/hook"
    assert got.headers["idempotency-key"] == f"{1:032x}"
    assert got.headers["content-type"] == "application/json"
    assert int(got.headers["x-tailwatch-timestamp"]) == pytest.approx(time.time(), abs=60)
    # The receiver's check: HMAC-SHA256 of "<timestamp>." + the raw body with the shared secret.
    stamp, signature = got.headers["x-tailwatch-timestamp"], got.headers["x-tailwatch-signature"]
    assert verify_signature("s3cr3t", got.body, signature, stamp)
    assert not verify_signature("wrong", got.body, signature, stamp)
    assert not verify_signature("s3cr3t", got.body + b" ", signature, stamp)
    # Regression: the timestamp was not signed, so a captured body replayed with a fresh timestamp
    # verified. Now the fresh timestamp breaks the signature, and the old one is out of tolerance.
    assert not verify_signature("s3cr3t", got.body, signature, str(int(stamp) + 600))
    assert not verify_signature("s3cr3t", got.body, signature, stamp, now=int(stamp) + 600)
    body = got.json()
    assert set(body) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert (body["version"], body["status"], body["receiver"], body["truncatedAlerts"]) == (
        "4",
        "firing",
        "oncall",
        0,
    )
    assert body["groupLabels"] == {"alertname": "hot-path-p99-regression"}
    assert body["commonLabels"]["service"] == "chat-api"
    (alert,) = body["alerts"]
    assert set(alert) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["startsAt"] == NOW.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert alert["fingerprint"] == f"{1:016x}"


def test_no_secret_no_signature(receiver: Receiver) -> None:
    notifier = build_notifier(WebhookConfig(receiver.url))
    assert notifier.send(_notification(2, "resolved")).ok
    (got,) = receiver.requests
    assert "x-tailwatch-signature" not in got.headers
    alert = got.json()["alerts"][0]
    ends = (NOW + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert alert["status"] == "resolved" and alert["endsAt"] == ends


def test_slack_body(receiver: Receiver) -> None:
    notifier = build_notifier(SlackConfig(receiver.url + "/services/T/B/X"))
    assert notifier.send(_notification(3)).ok
    body = receiver.requests[0].json()
    assert body["text"].startswith(":red_circle: [FIRING] hot-path-p99-regression (page): p99 of POST /op3")
    assert body["blocks"][0]["type"] == "section"
    assert "cause: *llm*" in body["blocks"][0]["text"]["text"]


def test_429_retry_after_is_honoured(receiver: Receiver) -> None:
    def throttle_once(r: Receiver, got: Received) -> tuple[int, dict[str, str], bytes] | None:
        if len(r.requests) == 0:
            return 429, {"Retry-After": "1"}, b"slow down"
        return 200, {}, b"ok"

    receiver.responder = throttle_once
    notifier = build_notifier(WebhookConfig(receiver.url), retries=3, backoff_s=0.01)
    result = notifier.send(_notification(4))
    assert result.ok and result.attempts == 2
    first, second = receiver.requests
    assert second.at - first.at >= 0.95
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert first.body == second.body


def test_long_retry_after_is_scheduled_by_the_outbox(store: Store, receiver: Receiver) -> None:
    calls: list[float] = []

    def throttle(r: Receiver, got: Received) -> tuple[int, dict[str, str], bytes] | None:
        calls.append(got.at)
        if len(calls) == 1:
            return 429, {"Retry-After": "120"}, b"slow down"
        return 200, {}, b"ok"

    receiver.responder = throttle
    config = WebhookConfig(receiver.url)
    enqueue(store, [(config, _notification(5))], now=NOW)
    report = deliver(store, [config], now=NOW)
    assert (report.attempted, report.delivered, report.retrying) == (1, 0, 1)
    (row,) = outbox_rows(store, status="pending")
    assert row.next_attempt_at >= NOW + timedelta(seconds=120)
    assert "HTTP 429" in row.last_error
    assert deliver(store, [config], now=NOW + timedelta(seconds=60)).attempted == 0
    later = deliver(store, [config], now=NOW + timedelta(seconds=121))
    assert (later.attempted, later.delivered) == (1, 1)
    assert len(calls) == 2


def test_endpoint_down_then_up_receives_everything_once(store: Store) -> None:
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()  # connection refused from now on
    config = WebhookConfig(f"http://127.0.0.1:{port}/hook")
    enqueue(store, [(config, _notification(i)) for i in range(6)], now=NOW)
    # Ten minutes of drains every minute while the endpoint is down; nothing is lost or dropped.
    for minute in range(10):
        report = deliver(store, [config], now=NOW + timedelta(minutes=minute), notifier_factory=_quick)
        assert report.delivered == 0 and report.dead == 0
    assert len(outbox_rows(store, status="pending")) == 6
    up = Receiver(port=port).start()
    try:
        moment = NOW + timedelta(minutes=20)  # past any backoff
        report = deliver(store, [config], now=moment)
        assert report.delivered == 6 and report.ok
        assert sorted(up.keys()) == [f"{i:032x}" for i in range(6)]
        # Delivered rows are never sent again.
        assert deliver(store, [config], now=moment + timedelta(hours=1), force=True).attempted == 0
        assert len(up.requests) == 6
        # Creation order is kept.
        assert up.keys() == [f"{i:032x}" for i in range(6)]
    finally:
        up.stop()
    rows = outbox_rows(store)
    assert {r.status for r in rows} == {"delivered"} and all(r.attempts > 1 for r in rows[:1])


def test_force_attempts_every_pending_row_and_4xx_is_dead(store: Store) -> None:
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()
    config = WebhookConfig(f"http://127.0.0.1:{port}")
    enqueue(store, [(config, _notification(i)) for i in range(3)], now=NOW)
    report = deliver(store, [config], now=NOW, notifier_factory=_quick)
    assert report.attempted == 1  # the first failure holds back the rest of that notifier's queue
    report = deliver(store, [config], now=NOW, force=True, notifier_factory=_quick)
    assert report.attempted == 3 and report.retrying == 3 and len(report.undelivered) == 3
    gone = Receiver(port=port, status=404).start()
    try:
        report = deliver(store, [config], now=NOW, force=True)
        assert report.dead == 3
        assert {r.status for r in outbox_rows(store)} == {"dead"}
        assert "HTTP 404" in outbox_rows(store)[0].last_error
    finally:
        gone.stop()


def test_unconfigured_notifier_is_reported(store: Store) -> None:
    enqueue(store, [(WebhookConfig("http://127.0.0.1:9", name="old"), _notification(1))], now=NOW)
    report = deliver(store, [WebhookConfig("http://127.0.0.1:9", name="new")], now=NOW)
    assert report.attempted == 0 and report.unconfigured == 1 and not report.ok


def test_enqueue_is_idempotent(store: Store) -> None:
    config = WebhookConfig("http://127.0.0.1:9")
    assert enqueue(store, [(config, _notification(1))], now=NOW) == 1
    assert enqueue(store, [(config, _notification(1))], now=NOW) == 0
    assert len(outbox_rows(store)) == 1


def test_pagerduty_body(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver.status = 202
    monkeypatch.setenv("TW_PD_KEY", "R0UTINGKEY")
    notifier = build_notifier(PagerDutyConfig("TW_PD_KEY", url=receiver.url + "/v2/enqueue"))
    assert notifier.send(_notification(7)).ok
    assert notifier.send(_notification(7, "resolved")).ok
    trigger, resolve = (r.json() for r in receiver.requests)
    assert receiver.requests[0].path == "/v2/enqueue"
    assert trigger["routing_key"] == "R0UTINGKEY" and trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == resolve["dedup_key"] == f"{7:016x}"
    assert trigger["payload"]["severity"] == "critical" and trigger["payload"]["source"] == "chat-api"
    assert trigger["payload"]["summary"].startswith("p99 of POST /op7")
    assert trigger["payload"]["custom_details"]["annotations"]["cause"] == "llm"
    assert resolve == {"routing_key": "R0UTINGKEY", "event_action": "resolve", "dedup_key": f"{7:016x}"}


def test_missing_secret_is_a_clear_error() -> None:
    from slo_rules import DeliveryError

    with pytest.raises(DeliveryError, match="TW_NOT_SET"):
        build_notifier(PagerDutyConfig("TW_NOT_SET"))


_DELIVER_SCRIPT = textwrap.dedent(
    """
    import sys
    from storage import open_store
    from slo_rules import WebhookConfig, deliver
    with open_store(sys.argv[1]) as store:
        report = deliver(store, [WebhookConfig(sys.argv[2])], force=True)
        print(report.delivered, len(report.undelivered), flush=True)
    """
)


def test_kill_mid_delivery_neither_loses_nor_duplicates(store_dsn: str, tmp_path: Path) -> None:
    receiver = Receiver(delay_s=0.15).start()
    config = WebhookConfig(receiver.url)
    total = 20
    with open_store(store_dsn) as store:
        ensure_schema(store)
        enqueue(store, [(config, _notification(i)) for i in range(total)], now=NOW)
    script = tmp_path / "deliver.py"
    script.write_text(_DELIVER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(script), store_dsn, receiver.url], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 60
        while len(receiver.requests) < 7 and time.time() < deadline:
            time.sleep(0.01)
        # Kill while a request is in flight (the receiver holds each one for 150 ms).
        time.sleep(0.07)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    received_before = len(receiver.requests)
    assert 0 < received_before < total
    rerun = subprocess.run(
        [sys.executable, str(script), store_dsn, receiver.url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr
    keys = receiver.keys()
    receiver.stop()
    expected = [f"{i:032x}" for i in range(total)]
    # Nothing lost: every notification arrived. Nothing duplicated beyond the one in-flight request
    # of the crash window, and that one carries the same Idempotency-Key (the receiver drops it).
    assert sorted(set(keys)) == expected
    assert len(keys) - len(set(keys)) <= 1
    assert sorted(dict.fromkeys(keys)) == expected
    assert json.loads("[" + rerun.stdout.split()[1] + "]") == [0]
    with open_store(store_dsn) as store:
        assert {r.status for r in outbox_rows(store)} == {"delivered"}


def test_a_misconfigured_notifier_holds_back_only_its_own_rows(store: Store, receiver: Receiver) -> None:
    ok = WebhookConfig(receiver.url, name="ok")
    unset = PagerDutyConfig("TW_UNSET_KEY", url=receiver.url, name="pd")
    enqueue(store, [(unset, _notification(1)), (ok, _notification(2))], now=NOW)
    report = deliver(store, [ok, unset], now=NOW)
    assert report.delivered == 1 and receiver.keys() == [f"{2:032x}"]
    assert report.errors == [
        "notifier 'pd': environment variable TW_UNSET_KEY (the PagerDuty routing key) is not set"
    ]
    (waiting,) = outbox_rows(store, status="pending")
    assert waiting.notifier == "pd" and waiting.attempts == 0


def test_a_notifier_that_raises_does_not_stop_the_drain(store: Store) -> None:
    class Exploding:
        name, kind = "boom", "webhook"

        def send(self, notification: Notification) -> DeliveryResult:
            raise RuntimeError("defect")

    config = WebhookConfig("http://127.0.0.1:9", name="boom")
    enqueue(store, [(config, _notification(i)) for i in range(2)], now=NOW)
    report = deliver(store, [config], now=NOW, force=True, notifier_factory=lambda c: Exploding())
    assert report.attempted == 2 and report.retrying == 2
    assert {r.last_error for r in outbox_rows(store)} == {"RuntimeError: defect"}
