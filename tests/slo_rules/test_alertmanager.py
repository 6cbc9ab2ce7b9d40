"""tailwatch → a real Alertmanager (Debian's prometheus-alertmanager on loopback) → a webhook receiver.

The alerts come from synthetic analysis frames (as in test_lifecycle) evaluated at the real clock:
Alertmanager judges ``startsAt``/``endsAt`` against its own clock. Alertmanager's ``group_wait`` and
``group_interval`` are 1 s, so a notification takes about a second to come out of it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from collectors import insert_spans
from collectors.spans import SpanRow
from slo_rules import AlertmanagerConfig, deliver, delivery_status
from slo_rules.engine import evaluate_with
from slo_rules.rules import rules_from_text
from storage import Store, ensure_schema, open_store, parse_time, utc_now
from tailwatch.cli import main
from tests.analytics import builders as b
from tests.slo_rules.alertmanager import BINARY, Alertmanager, config_yaml, start_pair
from tests.slo_rules.receivers import Receiver
from tests.slo_rules.test_lifecycle import REGRESSION, SyntheticSource, _attribution

pytestmark = pytest.mark.skipif(BINARY is None, reason="prometheus-alertmanager is not installed")

JAEGER = "http://jaeger.example:16686/trace/{trace_id}"
RULES = rules_from_text(REGRESSION.replace("    for: 10m\n", ""))
MINUTE = timedelta(seconds=60)


@pytest.fixture
def hook() -> Iterator[Receiver]:
    receiver = Receiver().start()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture
def start_alertmanager(tmp_path: Path, hook: Receiver) -> Iterator[Callable[..., Alertmanager]]:
    started: list[Alertmanager] = []

    def start(**options: Any) -> Alertmanager:
        am = Alertmanager(tmp_path / f"am-{len(started)}", config_yaml(hook.url + "/am", **options))
        started.append(am)
        return am.start()

    try:
        yield start
    finally:
        for am in started:
            am.stop()


def _wait(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def _bodies(hook: Receiver) -> list[dict[str, Any]]:
    return [r.json() for r in hook.requests]


def _tick(store: Store, source: SyntheticSource, notifiers: list[AlertmanagerConfig], **options: Any) -> None:
    """One scheduled evaluation as the service runs it: evaluate now, then drain the outbox."""
    registry = options.pop("registry", None)
    evaluate_with(store, RULES, utc_now(), source, notifiers=notifiers, trace_url=JAEGER, **options)
    report = deliver(store, notifiers, registry=registry)
    assert report.ok, report


def test_alerts_arrive_grouped_by_alertmanager_with_labels_and_cause(
    store: Store, hook: Receiver, start_alertmanager: Callable[..., Alertmanager]
) -> None:
    am = start_alertmanager()
    config = AlertmanagerConfig(am.url)
    frames = {
        name: frame.vstack(frame.with_columns(operation=frame["operation"].str.replace("/chat", "/reply")))
        for name, frame in _attribution(2200.0).items()
    }
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=frames)
    registry = CollectorRegistry()
    at = utc_now()
    evaluate_with(store, RULES, at, source, notifiers=[config], trace_url=JAEGER, evaluation_interval=MINUTE)
    assert deliver(store, [config], registry=registry).delivered == 1

    _wait(lambda: len(hook.requests) >= 1)
    (body,) = _bodies(hook)
    # Alertmanager's grouping (group_by: [alertname]): both operations in one notification.
    assert (body["receiver"], body["status"], body["groupLabels"]) == ("hook", "firing", {"alertname": "p99"})
    assert body["commonLabels"] == {
        "alertname": "p99",
        "severity": "ticket",
        "service": "chat-api",
        "path": "hot",
        "cause": "llm",
    }
    alerts = sorted(body["alerts"], key=lambda a: a["labels"]["operation"])
    assert [a["labels"]["operation"] for a in alerts] == ["POST /chat", "POST /reply"]
    notes = alerts[0]["annotations"]
    assert notes["summary"].startswith("chat-api: p99 of POST /chat 1.2 s → 3.4 s; 87% of the increase")
    assert notes["cause"] == "llm" and notes["exemplar_trace_ids"] == "a" * 32
    assert notes["exemplar_url"] == notes["exemplar_urls"] == f"http://jaeger.example:16686/trace/{'a' * 32}"
    assert alerts[0]["generatorURL"] == "http://127.0.0.1:4318/dashboards/attribution.html"
    # endsAt four evaluation intervals ahead, as Alertmanager holds it.
    (held, _) = sorted(am.alerts(), key=lambda a: a["labels"]["operation"])
    assert held["status"]["state"] == "active"
    assert parse_time(held["endsAt"]) - at == pytest.approx(4 * MINUTE, abs=timedelta(seconds=1))
    labels = {"notifier": config.name, "kind": "alertmanager", "outcome": "delivered"}
    assert registry.get_sample_value("tailwatch_notifications_total", labels) == 1.0


def test_a_firing_alert_outlives_resolve_timeout_while_re_sent_and_expires_when_not(
    store: Store, hook: Receiver, start_alertmanager: Callable[..., Alertmanager]
) -> None:
    # resolve_timeout 2 s resolves an alert posted without endsAt 2 s after its last post. tailwatch
    # posts endsAt = now + 4 × the interval (1 s here), so with 2.5 s between evaluations, longer
    # than resolve_timeout, the alert stays firing throughout: one notification, no resolution.
    am = start_alertmanager(resolve_timeout="2s")
    config = AlertmanagerConfig(am.url)
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    ends = []
    for _ in range(3):
        _tick(store, source, [config], evaluation_interval=timedelta(seconds=1))
        (held,) = am.alerts()
        ends.append(parse_time(held["endsAt"]))
        time.sleep(2.5)
        (held,) = am.alerts()
        assert held["status"]["state"] == "active"
    assert ends == sorted(ends) and len(set(ends)) == 3  # every evaluation moved endsAt
    assert [b["status"] for b in _bodies(hook)] == ["firing"]
    # Nobody evaluates any more (tailwatch stopped): Alertmanager resolves it at the last endsAt.
    _wait(lambda: len(hook.requests) >= 2, timeout_s=10)
    assert [b["status"] for b in _bodies(hook)] == ["firing", "resolved"]
    assert am.alerts() == []


def test_a_resolution_arrives_as_resolved(
    store: Store, hook: Receiver, start_alertmanager: Callable[..., Alertmanager]
) -> None:
    am = start_alertmanager()
    config = AlertmanagerConfig(am.url)
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    _tick(store, source, [config])
    _wait(lambda: len(hook.requests) >= 1)
    source.analysis_frames = _attribution(10.0)  # the regression is gone
    before = utc_now()
    _tick(store, source, [config])
    _wait(lambda: len(hook.requests) >= 2)
    firing, resolved = _bodies(hook)
    assert (firing["status"], resolved["status"]) == ("firing", "resolved")
    (alert,) = resolved["alerts"]
    assert alert["status"] == "resolved" and alert["labels"]["cause"] == "llm"
    assert parse_time(alert["endsAt"]) >= before - timedelta(seconds=1)
    assert am.alerts() == []
    # The resolution is re-sent on the next evaluations (a lost request must not leave it firing);
    # Alertmanager already knows and sends nothing new.
    _tick(store, source, [config])
    time.sleep(1.5)
    assert len(hook.requests) == 2


def test_a_silence_created_in_alertmanager_suppresses_the_alert(
    store: Store, hook: Receiver, start_alertmanager: Callable[..., Alertmanager]
) -> None:
    am = start_alertmanager()
    config = AlertmanagerConfig(am.url)
    silence = am.silence({"alertname": "p99", "cause": "llm"})
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
    _tick(store, source, [config])
    (held,) = am.alerts()
    assert held["status"] == {"state": "suppressed", "silencedBy": [silence], "inhibitedBy": []}
    _tick(store, source, [config])
    time.sleep(2.5)  # past group_wait and a group_interval
    assert hook.requests == []


def test_an_ha_pair_notifies_once(tmp_path: Path, store: Store, hook: Receiver) -> None:
    first, second = start_pair(tmp_path / "pair", config_yaml(hook.url + "/am"))
    try:
        notifiers = [AlertmanagerConfig(first.url), AlertmanagerConfig(second.url)]
        assert notifiers[0].name != notifiers[1].name  # each instance has its own outbox rows
        source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=_attribution(2200.0))
        _tick(store, source, notifiers)
        assert [len(am.alerts()) for am in (first, second)] == [1, 1]
        _wait(lambda: len(hook.requests) >= 1)
        # The second instance waits its peer timeout (1 s), finds the first one's notification in
        # the gossiped log and stays quiet; give it well past that to make the point.
        _tick(store, source, notifiers)
        time.sleep(3.0)
        assert [b["status"] for b in _bodies(hook)] == ["firing"]
    finally:
        first.stop()
        second.stop()


def _shifted(spans: list[SpanRow], shift_ns: int) -> list[SpanRow]:
    return [
        dataclasses.replace(
            s,
            start_ns=s.start_ns + shift_ns,
            events=[dataclasses.replace(e, timestamp_ns=e.timestamp_ns + shift_ns) for e in s.events],
        )
        for s in spans
    ]


CLI_RULES = """
rules:
  - name: chat-p99-regression
    kind: p99_regression
    service: chat-api
    window: 1h
    min_requests: 200
    severity: page
"""


def test_cli_evaluate_posts_to_alertmanager(
    store_dsn: str, tmp_path: Path, hook: Receiver, start_alertmanager: Callable[..., Alertmanager]
) -> None:
    # The LLM regression scenario moved so that its current hour ends now.
    sc = b.scenario_llm_regression()
    shift = int(utc_now().timestamp() * 1e9) - int(sc.end.timestamp() * 1e9) - 1_000_000_000
    with open_store(store_dsn) as store:
        ensure_schema(store)
        insert_spans(store, _shifted(sc.spans, shift))
    rules = tmp_path / "rules.yaml"
    rules.write_text(CLI_RULES)
    am = start_alertmanager()
    template = "http://hyperdx.example:8080/search?where=TraceId%3A{trace_id}&from={start_ms}&to={end_ms}"
    proc = CliRunner().invoke(
        main,
        ["alerts", "evaluate", "--store", store_dsn, "--rules", str(rules), "--interval", "5m"],
        env={"TAILWATCH_ALERTMANAGER_URL": am.url, "TAILWATCH_TRACE_URL": template},
        catch_exceptions=False,
    )
    assert proc.exit_code == 0, proc.output
    assert "FIRING   chat-p99-regression  [page]  cause=llm" in proc.output
    assert "delivery: 1 attempted, 1 delivered" in proc.output
    _wait(lambda: len(hook.requests) >= 1)
    (alert,) = _bodies(hook)[0]["alerts"]
    assert alert["labels"]["cause"] == "llm" and alert["labels"]["operation"] == "POST /chat"
    assert alert["annotations"]["exemplar_url"].startswith(
        "http://hyperdx.example:8080/search?where=TraceId%3A"
    )
    (held,) = am.alerts(alertname="chat-p99-regression")
    assert parse_time(held["endsAt"]) - utc_now() > timedelta(minutes=19)  # 4 × 5 min
    listed = CliRunner().invoke(main, ["alerts", "list", "--store", store_dsn], catch_exceptions=False)
    assert f"delivery alertmanager@127.0.0.1:{am.port}  ok; 1 delivered; last delivered" in listed.output
    with open_store(store_dsn) as store:
        (status,) = delivery_status(store)
        assert (status.state, status.delivered) == ("ok", 1)
