"""What tailwatch posts to Alertmanager, evaluation after evaluation, and how the outbox carries it:
snapshots with moving ``endsAt``, resolutions re-sent for a while, superseded snapshots never sent,
failures counted and shown, credentials and TLS from the configuration. Alertmanager's side is
played by a recording receiver here; tests/slo_rules/test_alertmanager.py runs the real one."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from slo_rules import AlertmanagerConfig, DeliveryError, RuleError, deliver, delivery_status
from slo_rules.engine import evaluate_with
from slo_rules.fanout import resend_window
from slo_rules.notifiers import Notification, build_notifier
from slo_rules.outbox import outbox_rows
from slo_rules.rules import rules_from_text
from storage import Store, open_store, parse_time, utc_now
from tailwatch.cli import main
from tests.slo_rules.receivers import Receiver
from tests.slo_rules.test_lifecycle import REGRESSION, SyntheticSource, _attribution

RULES = rules_from_text(REGRESSION.replace("    for: 10m\n", ""))
MINUTE = timedelta(minutes=1)


def _posted(store: Store, notifier: str) -> list[list[dict[str, Any]]]:
    """The alerts each snapshot row of ``notifier`` holds, oldest first (pending rows keep bodies)."""
    rows = outbox_rows(store, notifier=notifier)
    return [[a for a in json.loads(r.notification)["alerts"]] for r in rows if r.notification]


def test_snapshots_move_ends_at_and_resend_resolutions(store: Store) -> None:
    am = AlertmanagerConfig("http://127.0.0.1:9/")
    assert am.name == "alertmanager@127.0.0.1:9" and am.alerts_url == "http://127.0.0.1:9/api/v2/alerts"
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    t0 = utc_now().replace(microsecond=0)

    def run(minutes: float) -> list[dict[str, Any]]:
        result = evaluate_with(store, RULES, t0 + minutes * MINUTE, source, notifiers=[am])
        if not result.enqueued:
            return []
        row = outbox_rows(store, notifier=am.name)[-1]
        alerts: list[dict[str, Any]] = json.loads(row.notification)["alerts"]
        return alerts

    def ends(alert: dict[str, Any]) -> timedelta:
        return parse_time(alert["endsAt"]) - t0

    (first,) = run(0)
    assert (first["status"], ends(first)) == ("firing", 4 * MINUTE)
    assert first["labels"]["cause"] == "llm" and "cause" not in RULES.rules[0].labels
    (again,) = run(1)  # a quiet evaluation re-sends the firing alert with endsAt moved on
    assert (again["status"], ends(again)) == ("firing", 5 * MINUTE)
    assert evaluate_with(store, RULES, t0 + MINUTE, source, notifiers=[am]).enqueued == 0  # same instant

    # A later explanation would blame our code: the alert keeps the cause it fired with, so its
    # label set (what Alertmanager routes and inhibits on) is stable until it resolves.
    source.analysis_frames = _attribution(2200.0, verdict="internal")
    (kept,) = run(2)
    assert (kept["labels"]["cause"], kept["status"], ends(kept)) == ("llm", "firing", 6 * MINUTE)
    # The regression ends: resolved with endsAt = the resolution, re-sent within the resend window.
    source.analysis_frames = _attribution(10.0)
    (resolved,) = run(3)
    assert (resolved["labels"]["cause"], resolved["status"], ends(resolved)) == (
        "llm",
        "resolved",
        3 * MINUTE,
    )
    (still,) = run(17)
    assert (still["status"], ends(still)) == ("resolved", 3 * MINUTE)
    assert run(19) == []  # past 15 minutes: nothing left to tell Alertmanager, nothing posted
    assert resend_window(timedelta(hours=1)) == timedelta(hours=4)


def _quick(config: Any) -> Any:
    return build_notifier(config, backoff_s=0.01)


def test_a_down_alertmanager_gets_only_the_newest_snapshot_and_failures_show(store_dsn: str) -> None:
    port = Receiver().start()
    port.stop()  # connection refused from now on
    am = AlertmanagerConfig(f"http://127.0.0.1:{port.port}")
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    registry = CollectorRegistry()
    t0 = utc_now()
    with open_store(store_dsn) as store:
        for minute in range(3):
            evaluate_with(store, RULES, t0 + minute * MINUTE, source, notifiers=[am])
            report = deliver(store, [am], registry=registry, notifier_factory=_quick)
            assert (report.attempted, report.retrying, report.superseded) == (1, 1, min(minute, 1))
        (status,) = delivery_status(store)
        assert (status.state, status.pending, status.superseded, status.last_delivered_at) == (
            "failing",
            1,
            2,
            None,
        )
        assert status.attempts == 3 and "ConnectError" in status.last_error
        # Superseded rows keep their delivery record but not their bodies.
        assert [r.status for r in outbox_rows(store)] == ["superseded", "superseded", "pending"]
        assert [bool(r.notification) for r in outbox_rows(store)] == [False, False, True]

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"notifier": am.name, "kind": "alertmanager", **labels})

    assert sample("tailwatch_notifications_total", outcome="retry") == 3.0
    assert sample("tailwatch_notifications_total", outcome="superseded") == 2.0
    assert sample("tailwatch_notifier_requests_total", result="error") == 9.0  # 3 tries per drain
    assert sample("tailwatch_notifications_pending") == 1.0
    listed = CliRunner().invoke(main, ["alerts", "list", "--store", store_dsn], catch_exceptions=False)
    assert f"delivery {am.name}  failing; 3 failed attempts, next attempt " in listed.output
    assert "ConnectError" in listed.output and "last delivered never" in listed.output
    as_json = json.loads(
        CliRunner().invoke(main, ["alerts", "list", "--store", store_dsn, "--format", "json"]).output
    )
    assert as_json["delivery"][0]["state"] == "failing"

    # Alertmanager is back: the next evaluation's snapshot is what it receives, once.
    back = Receiver(port=port.port).start()
    try:
        with open_store(store_dsn) as store:
            evaluate_with(store, RULES, t0 + 3 * MINUTE, source, notifiers=[am])
            report = deliver(store, [am], registry=registry)
            assert (report.delivered, report.superseded, report.ok) == (1, 1, True)
            (status,) = delivery_status(store)
            assert (status.state, status.delivered, status.last_error) == ("ok", 1, "")
    finally:
        back.stop()
    (got,) = back.requests
    assert got.path == "/api/v2/alerts" and got.headers["content-type"] == "application/json"
    (alert,) = got.json()
    assert set(alert) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert parse_time(alert["endsAt"]) == pytest.approx(t0 + 7 * MINUTE, abs=timedelta(milliseconds=1))
    assert "authorization" not in got.headers
    assert sample("tailwatch_notifications_total", outcome="delivered") == 1.0
    assert sample("tailwatch_notifications_pending") == 0.0
    assert (sample("tailwatch_notifier_last_success_timestamp_seconds") or 0) > t0.timestamp()


def _one_alert() -> Notification:
    return Notification.from_json(
        json.dumps(
            {
                "id": "0" * 32,
                "status": "firing",
                "groupKey": "{}",
                "groupLabels": {},
                "alerts": [
                    {
                        "status": "firing",
                        "labels": {"alertname": "x", "team-name": "odd", "empty": ""},
                        "annotations": {"summary": "s"},
                        "startsAt": "2026-12-01T00:00:00.000Z",
                        "endsAt": "2026-12-01T00:04:00.000Z",
                        "fingerprint": "f" * 16,
                    }
                ],
            }
        )
    )


def test_credentials_come_from_the_environment(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_AM_TOKEN", "t0ken")
    monkeypatch.setenv("TW_AM_PASSWORD", "pw")
    bearer = build_notifier(AlertmanagerConfig(receiver.url, bearer_token_env="TW_AM_TOKEN"))
    basic = build_notifier(AlertmanagerConfig(receiver.url, username="tw", password_env="TW_AM_PASSWORD"))
    assert bearer.send(_one_alert()).ok and basic.send(_one_alert()).ok
    bearer.close()
    basic.close()
    first, second = receiver.requests
    assert first.headers["authorization"] == "Bearer t0ken"
    assert second.headers["authorization"] == "Basic dHc6cHc="  # tw:pw
    (alert,) = first.json()
    # An invalid label name of an old stored alert is mended, an empty value dropped (Alertmanager
    # would refuse the whole request over either).
    assert alert["labels"] == {"alertname": "x", "team_name": "odd"}
    with pytest.raises(DeliveryError, match="TW_AM_UNSET"):
        build_notifier(AlertmanagerConfig(receiver.url, bearer_token_env="TW_AM_UNSET"))


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (openssl CLI)."""
    ca, ca_key, cert, key = (directory / n for n in ("ca.pem", "ca.key", "server.pem", "server.key"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, cwd=directory)

    ca_ext = [
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=test CA", *ca_ext)
    openssl("req", *ec, "-keyout", key, "-out", directory / "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    sign = ["-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2", "-extfile", directory / "ext"]
    openssl("x509", "-req", "-in", directory / "server.csr", "-out", cert, *sign)
    return ca, cert, key


def test_https_alertmanager_verified_with_the_configured_ca(tmp_path: Path) -> None:
    ca, cert, key = _certificates(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = Receiver(tls=context).start()
    try:
        trusted = build_notifier(AlertmanagerConfig(server.url, ca_file=str(ca)))
        assert trusted.send(_one_alert()).ok
        trusted.close()
        unknown = build_notifier(AlertmanagerConfig(server.url), backoff_s=0.01)
        refused = unknown.send(_one_alert())
        unknown.close()
    finally:
        server.stop()
    assert len(server.requests) == 1
    assert not refused.ok and "CERTIFICATE_VERIFY_FAILED" in refused.error
    with pytest.raises(DeliveryError, match="CA file"):
        build_notifier(AlertmanagerConfig(server.url, ca_file=str(tmp_path / "missing.pem")))


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ("{cause: llm}", "labels ['cause'] are set by the rule engine"),
        ("{team-name: x}", "must match [a-zA-Z_][a-zA-Z0-9_]*"),
    ],
)
def test_rule_labels_alertmanager_would_refuse(labels: str, message: str) -> None:
    with pytest.raises(RuleError, match=re.escape(message)):
        rules_from_text(REGRESSION + f"    labels: {labels}\n")
