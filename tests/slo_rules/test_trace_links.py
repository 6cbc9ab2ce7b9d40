"""Exemplar traces linked to the user's trace viewer, and resolutions on every notifier.

The viewer templates are the ones docs/alerting.md#trace-links shows; each is checked for the URL
its viewer reads (Grafana's Explore pane state, HyperDX's epoch-millisecond range)."""

from __future__ import annotations

import json
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import polars as pl
import pytest

from slo_rules import PagerDutyConfig, SlackConfig, WebhookConfig, check_trace_url, deliver, trace_link
from slo_rules.engine import evaluate_with
from slo_rules.rules import rules_from_text
from storage import Store, parse_time
from tests.slo_rules.receivers import Receiver
from tests.slo_rules.test_lifecycle import REGRESSION, SyntheticSource, T, _attribution

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
JAEGER = "http://jaeger:16686/trace/{trace_id}"
TEMPO = (
    "http://grafana:3000/explore?schemaVersion=1&orgId=1&panes=%7B%22tw%22%3A%7B%22datasource%22%3A%22"
    "TEMPO_UID%22%2C%22queries%22%3A%5B%7B%22refId%22%3A%22A%22%2C%22datasource%22%3A%7B%22type%22%3A%22"
    "tempo%22%2C%22uid%22%3A%22TEMPO_UID%22%7D%2C%22queryType%22%3A%22traceql%22%2C%22query%22%3A%22"
    "{trace_id}%22%7D%5D%2C%22range%22%3A%7B%22from%22%3A%22{start_ms}%22%2C%22to%22%3A%22{end_ms}%22%7D%7D%7D"
)
HYPERDX = "http://hyperdx:8080/search?whereLanguage=sql&where=TraceId%20%3D%20'{trace_id}'&from={start_ms}&to={end_ms}"
SIGNOZ = "http://signoz:8080/trace/{trace_id}"
START, END = T - timedelta(hours=1), T + timedelta(minutes=15)
START_MS, END_MS = int(START.timestamp() * 1000), int(END.timestamp() * 1000)


def test_jaeger_and_signoz_open_the_trace_page() -> None:
    assert trace_link(check_trace_url(JAEGER), TRACE) == f"http://jaeger:16686/trace/{TRACE}"
    assert trace_link(check_trace_url(SIGNOZ), TRACE) == f"http://signoz:8080/trace/{TRACE}"


def test_grafana_tempo_explore_pane_queries_the_trace_in_the_window() -> None:
    url = trace_link(check_trace_url(TEMPO), TRACE, start=START, end=END)
    assert url is not None
    query = parse_qs(urlsplit(url).query)
    assert query["schemaVersion"] == ["1"] and query["orgId"] == ["1"]
    (pane,) = json.loads(query["panes"][0]).values()
    assert pane["queries"] == [
        {
            "refId": "A",
            "datasource": {"type": "tempo", "uid": "TEMPO_UID"},
            "queryType": "traceql",
            "query": TRACE,
        }
    ]
    # Grafana's URL time range takes epoch milliseconds (or now-relative strings), not ISO 8601.
    assert pane["range"] == {"from": str(START_MS), "to": str(END_MS)}


def test_hyperdx_search_filters_the_trace_in_the_window() -> None:
    url = trace_link(check_trace_url(HYPERDX), TRACE, start=START, end=END)
    assert url is not None
    query = parse_qs(urlsplit(url).query)
    assert query["where"] == [f"TraceId = '{TRACE}'"] and query["whereLanguage"] == ["sql"]
    assert (query["from"], query["to"]) == ([str(START_MS)], [str(END_MS)])


def test_iso_window_and_default_window_around_a_time() -> None:
    url = trace_link("https://viewer/t/{trace_id}?from={start}&to={end}", TRACE, T)
    # ":" is left as is: a browser re-encodes "%3A" in a link to "%253A", which viewers misread.
    assert url == f"https://viewer/t/{TRACE}?from=2026-11-01T23:45:00Z&to=2026-11-02T00:15:00Z"
    assert trace_link(None, TRACE) is None and trace_link(JAEGER, "") is None


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("http://jaeger/trace/", "must contain {trace_id}"),
        ("http://jaeger/trace/{id}", "unknown: id"),
        ("http://jaeger/search?q={trace_id} x", "contains whitespace"),
        ("jaeger/trace/{trace_id}", "expected an http:// or https://"),
        ("http://jaeger/trace/{trace_id", "expected '}'"),
    ],
)
def test_bad_templates_are_refused(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        check_trace_url(template)


RULES = rules_from_text(REGRESSION.replace("    for: 10m\n", ""))


def test_exemplar_links_in_the_annotations_of_hot_path_and_retry_alerts(store: Store) -> None:
    retry_rules = rules_from_text(
        "rules:\n  - {name: retries, kind: retry_amplification, window: 1h, max_attempt_amplification: 1.1}\n"
    )
    frames = _attribution(2200.0)
    frames["attribution"] = frames["attribution"].with_columns(exemplar_trace_ids=pl.lit([TRACE, "b" * 32]))
    frames["retry_amplification"] = pl.DataFrame(
        {
            "workflow": ["claims"],
            "runs": [50],
            "attempt_amplification": [1.5],
            "token_amplification": [1.2],
            "modeled_amplification": [1.4],
            "exemplar_trace_id": ["c" * 32],
        }
    )
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=frames)
    (p99,) = evaluate_with(store, RULES, T, source, trace_url=HYPERDX).fired
    notes = p99.annotations
    assert notes["exemplar_trace_ids"] == f"{TRACE},{'b' * 32}"
    first, second = notes["exemplar_urls"].split(" ")
    assert notes["exemplar_url"] == first == trace_link(HYPERDX, TRACE, start=START, end=END)
    assert second == trace_link(HYPERDX, "b" * 32, start=START, end=END)
    (retries,) = evaluate_with(store, retry_rules, T, source, trace_url=JAEGER).fired
    assert retries.annotations["exemplar_url"] == f"http://jaeger:16686/trace/{'c' * 32}"
    # Without a template nothing is added (the ids stay).
    store.command("TRUNCATE TABLE tailwatch_alert_state")
    (plain,) = evaluate_with(store, RULES, T, source).fired
    assert "exemplar_url" not in plain.annotations and plain.annotations["exemplar_trace_ids"]


def test_resolved_reaches_every_notifier_with_trace_links(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TW_PD_KEY", "R0UTING")
    hook, slack, pd = Receiver().start(), Receiver().start(), Receiver(status=202).start()
    notifiers = [
        WebhookConfig(hook.url + "/hook"),
        SlackConfig(slack.url + "/services/T/B/X"),
        PagerDutyConfig("TW_PD_KEY", url=pd.url + "/v2/enqueue"),
    ]
    frames = _attribution(2200.0)
    frames["attribution"] = frames["attribution"].with_columns(exemplar_trace_ids=pl.lit([TRACE]))
    source = SyntheticSource(rate=1, bad=lambda m: 0.0, analysis_frames=frames)
    try:
        evaluate_with(store, RULES, T, source, notifiers=notifiers, trace_url=JAEGER)
        assert deliver(store, notifiers).delivered == 3
        source.analysis_frames = _attribution(10.0)
        (gone,) = evaluate_with(store, RULES, T + timedelta(hours=1), source, notifiers=notifiers).resolved
        assert deliver(store, notifiers).delivered == 3
    finally:
        for receiver in (hook, slack, pd):
            receiver.stop()
    link = f"http://jaeger:16686/trace/{TRACE}"

    fired, resolved = (r.json() for r in hook.requests)
    assert (fired["status"], resolved["status"]) == ("firing", "resolved")
    assert fired["alerts"][0]["annotations"]["exemplar_url"] == link
    assert parse_time(resolved["alerts"][0]["endsAt"]) == T + timedelta(hours=1)
    assert resolved["alerts"][0]["fingerprint"] == gone.fingerprint

    fired_msg, resolved_msg = (r.json() for r in slack.requests)
    assert fired_msg["text"].startswith(":red_circle: [FIRING] p99 (ticket): chat-api: p99 of POST /chat")
    section = fired_msg["blocks"][0]["text"]["text"]
    assert f"<{link}|trace 4bf92f35>" in section
    assert "<http://127.0.0.1:4318/dashboards/attribution.html|dashboard>" in section
    assert resolved_msg["text"].startswith(":large_green_circle: [RESOLVED] p99 (ticket): chat-api: p99")
    # The resolution says what resolved it, in numbers: back near the baseline frozen when it fired.
    assert "(resolved after 1h); now p99 1.2 s → 1.2 s vs its baseline of 22:00–23:00" in resolved_msg["text"]
    assert "resolved after 1h" in resolved_msg["blocks"][0]["text"]["text"]

    trigger, resolve = (r.json() for r in pd.requests)
    assert trigger["event_action"] == "trigger" and trigger["links"] == [
        {"href": "http://127.0.0.1:4318/dashboards/attribution.html", "text": "tailwatch dashboard"},
        {"href": link, "text": "exemplar trace 4bf92f35"},
    ]
    assert resolve == {"routing_key": "R0UTING", "event_action": "resolve", "dedup_key": gone.fingerprint}
    assert trigger["dedup_key"] == resolve["dedup_key"]
