"""``slice_regression``: a feature-flag variant worse than its control, on synthetic ``slices`` frames
with the real schema and through the real analysis of flag-split traffic."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest

from analytics import FRAME_SCHEMAS, Conventions
from collectors import insert_spans
from slo_rules import check_rule_files, evaluate, list_alerts, load_rules
from slo_rules.engine import evaluate_with
from slo_rules.kinds import EVALUATORS
from slo_rules.rules import RULE_KINDS, SliceRegressionRule, rules_from_text
from storage import Store
from tests.analytics import builders as b

T = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
DASH = "http://tailwatch.example:4318/dashboards"
ALERTING_MD = Path(__file__).resolve().parents[2] / "docs" / "alerting.md"

RULE = """
rules:
  - name: rollout
    kind: slice_regression
    service: docs-api
    operation: "POST /summarize"
    flag: "summary-*"
    window: 1h
    min_requests: 200
"""


@dataclass
class SliceSource:
    """An analysis whose frames are all empty but ``slices``; records the windows asked for."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    windows: list[tuple[datetime, datetime]] = field(default_factory=list)

    def analysis(
        self, start: datetime, end: datetime, bs: datetime | None = None, be: datetime | None = None
    ) -> Any:
        self.windows.append((start, end))
        frames = {name: pl.DataFrame(schema=schema) for name, schema in FRAME_SCHEMAS.items()}
        frames["slices"] = pl.DataFrame(self.rows, schema=FRAME_SCHEMAS["slices"])
        return SimpleNamespace(**frames)

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        raise AssertionError("slice_regression reads no good/total counts")


def _control(**over: Any) -> dict[str, Any]:
    row = {
        "service": "docs-api",
        "operation": "POST /summarize",
        "flag": "summary-mode",
        "control": "off",
        "variant": "off",
        "is_control": True,
        "requests": 700,
        "p50_ms": 300.0,
        "p99_ms": 800.0,
        "abandonment_rate": 0.02,
        "abandonment_rate_low": 0.0121,
        "abandonment_rate_high": 0.0330,
        "sync_llm_calls_per_request": 0.0,
        "cold_p99_s": None,
        "cold_jobs": 0,
        "p99_delta_ms": None,
        "abandonment_delta": None,
        "significant": None,
        "p99_significant": None,
        "abandonment_significant": None,
    }
    return row | over


def _variant(p99_ms: float = 2000.0, rate: float = 0.025, **over: Any) -> dict[str, Any]:
    """The ``on`` variant against the ``off`` control: p99 and abandonment significant as given."""
    control = _control()
    row = _control(
        variant="on",
        is_control=False,
        requests=300,
        p50_ms=900.0,
        p99_ms=p99_ms,
        abandonment_rate=rate,
        abandonment_rate_low=max(rate - 0.015, 0.0),
        abandonment_rate_high=rate + 0.02,
        sync_llm_calls_per_request=1.0,
        p99_delta_ms=p99_ms - control["p99_ms"],
        abandonment_delta=rate - control["abandonment_rate"],
        p99_significant=True,
        abandonment_significant=False,
    )
    row |= over
    row["significant"] = bool(row["p99_significant"] or row["abandonment_significant"])
    return row


def _evaluate(store: Store, rows: list[dict[str, Any]], at: datetime = T, text: str = RULE) -> Any:
    source = SliceSource(rows)
    result = evaluate_with(store, rules_from_text(text), at, source, dashboard_url=DASH)
    assert result.errors == []
    assert source.windows == [(at - timedelta(hours=1), at)]  # the rule's window, no baseline
    return result


def test_a_variant_significantly_slower_than_control_fires_on_latency(store: Store) -> None:
    result = _evaluate(store, [_control(), _variant()])
    (alert,) = result.fired
    assert alert.labels == {
        "alertname": "rollout",
        "severity": "ticket",
        "service": "docs-api",
        "operation": "POST /summarize",
        "path": "hot",
        "flag": "summary-mode",
        "variant": "on",
    }
    notes = alert.annotations
    assert notes["summary"] == (
        "docs-api POST /summarize: variant on of flag summary-mode is worse than control off on p99: "
        "p99 2.0 s vs 800 ms (+1.2 s), abandonment 2.5% (1.0%–4.5%) vs 2.0% (1.2%–3.3%) (+0.5 pp); "
        "300 vs 700 requests, 1.00 vs 0.00 sync LLM calls per request"
    )
    assert notes["cause"] == "latency" and notes["regressed"] == "p99" and notes["control"] == "off"
    assert notes["requests"] == "700 → 300"
    assert notes["p99_ms"] == "800.0 → 2000.0" and notes["p99_delta_ms"] == "1200.0"
    assert notes["p50_ms"] == "300.0 → 900.0"
    assert notes["abandonment_rate"] == "0.0200 → 0.0250" and notes["abandonment_delta"] == "0.0050"
    assert notes["abandonment_rate_interval"] == "[0.0121, 0.0330] → [0.0100, 0.0450]"
    assert notes["sync_llm_calls_per_request"] == "0.00 → 1.00"
    assert "cold_p99_s" not in notes  # neither side queued work
    assert notes["dashboard"] == DASH + "/boundary.html"
    # The alert's own labels are its identity; cause is what Alertmanager gets as a label too.
    assert list_alerts(store)["cause"].to_list() == ["latency"]


def test_a_variant_whose_users_give_up_more_fires_on_abandonment_with_its_queue(store: Store) -> None:
    # The async variant answers fast, but its users leave: abandonment, with what they wait for.
    variant = _variant(
        p99_ms=70.0,
        rate=0.16,
        p99_significant=True,  # significantly *faster*: not a regression
        abandonment_significant=True,
        sync_llm_calls_per_request=0.0,
        cold_p99_s=64.03,
        cold_jobs=300,
    )
    result = _evaluate(store, [_control(), variant])
    (alert,) = result.fired
    notes = alert.annotations
    assert notes["cause"] == "abandonment" and notes["regressed"] == "abandonment"
    assert notes["summary"] == (
        "docs-api POST /summarize: variant on of flag summary-mode is worse than control off on "
        "abandonment: p99 70 ms vs 800 ms (−730 ms), abandonment 16.0% (14.5%–18.0%) vs 2.0% "
        "(1.2%–3.3%) (+14.0 pp); 300 vs 700 requests, 0.00 vs 0.00 sync LLM calls per request; "
        "the work it queues is ready after 64.0 s at p99 (300 jobs)"
    )
    assert notes["cold_p99_s"] == "n/a → 64.030" and notes["cold_jobs"] == "0 → 300"


def test_worse_on_both_is_named_by_latency(store: Store) -> None:
    result = _evaluate(store, [_control(), _variant(rate=0.09, abandonment_significant=True)])
    (alert,) = result.fired
    assert alert.annotations["cause"] == "latency"
    assert alert.annotations["regressed"] == "p99,abandonment"
    assert "worse than control off on p99 and abandonment:" in alert.annotations["summary"]


@pytest.mark.parametrize(
    ("rows", "extra_keys"),
    [
        ([_control(), _variant(p99_significant=False)], ""),  # slower, but within the noise
        ([_control(), _variant(rate=0.09)], "    max_p99_delta_ms: null\n"),  # abandonment not significant
        ([_control(), _variant(requests=150)], ""),  # the variant below min_requests
        ([_control(requests=150), _variant()], ""),  # the control below min_requests
        ([_control()], ""),  # the control alone: nothing to compare
        ([_control(p99_ms=2500.0), _variant(p99_delta_ms=-500.0)], ""),  # significantly faster
        (
            [
                _control(),
                _variant(p99_ms=700.0, p99_delta_ms=-100.0, rate=0.005, abandonment_significant=True),
            ],
            "",
        ),  # significantly fewer abandoned
        ([_control(), _variant()], "    max_p99_delta_ms: 1500\n"),  # +1.2 s is within the limit
        ([_control(), _variant()], "    max_p99_delta_ms: null\n"),  # p99 not checked
        ([_control(), _variant(flag="other-flag"), _control(flag="other-flag")], ""),  # flag glob
        ([_control(), _variant()], '    variant: "canary-*"\n'),  # variant glob
        ([_control(), _variant(service="chat-api"), _control(service="chat-api")], ""),  # service
    ],
)
def test_no_alert(store: Store, rows: list[dict[str, Any]], extra_keys: str) -> None:
    result = _evaluate(store, rows, text=RULE + extra_keys)
    assert result.fired == [] and result.alerts == []


def test_an_empty_slices_frame_is_no_alert(store: Store) -> None:
    # No flags in the traces: the rule is quiet.
    source = SliceSource([])
    result = evaluate_with(store, rules_from_text(RULE), T, source)
    assert result.errors == [] and result.alerts == []


def test_pending_firing_and_resolved_when_the_variant_recovers(store: Store) -> None:
    text = RULE + "    for: 10m\n"
    first = _evaluate(store, [_control(), _variant()], T, text)
    assert [a.state for a in first.alerts] == ["pending"] and first.fired == []
    fired = _evaluate(store, [_control(), _variant()], T + timedelta(minutes=10), text)
    (alert,) = fired.fired
    assert alert.starts_at == T
    # Still worse an evaluation later: firing, not fired again.
    again = _evaluate(store, [_control(), _variant()], T + timedelta(minutes=15), text)
    assert again.fired == [] and [a.fingerprint for a in again.firing] == [alert.fingerprint]
    # The variant is fixed: back within the noise of the control.
    recovered = _variant(p99_ms=820.0, p99_significant=False)
    done = _evaluate(store, [_control(), recovered], T + timedelta(minutes=20), text)
    assert [a.fingerprint for a in done.resolved] == [alert.fingerprint]
    assert list_alerts(store, include_resolved_since=T)["state"].to_list() == ["resolved"]


def test_resolved_when_the_flag_is_gone(store: Store) -> None:
    # The kill switch: the flag is no longer evaluated, so its slices leave the window.
    (alert,) = _evaluate(store, [_control(), _variant()]).fired
    done = _evaluate(store, [], T + timedelta(hours=1))
    assert [a.fingerprint for a in done.resolved] == [alert.fingerprint]


def test_each_variant_is_its_own_alert(store: Store) -> None:
    rows = [
        _control(),
        _variant(),
        _variant(variant="beta"),
        _variant(variant="gamma", p99_significant=False),
    ]
    result = _evaluate(store, rows)
    assert sorted(a.labels["variant"] for a in result.fired) == ["beta", "on"]
    assert len({a.fingerprint for a in result.fired}) == 2


# --- rule files --------------------------------------------------------------------------------


def test_the_rule_model_and_its_defaults() -> None:
    (rule,) = rules_from_text("rules:\n  - {name: s, kind: slice_regression}\n").rules
    assert isinstance(rule, SliceRegressionRule)
    assert (rule.service, rule.operation, rule.flag, rule.variant) == ("*", "*", "*", "*")
    assert rule.window == timedelta(hours=1) and rule.severity == "ticket"
    assert (rule.max_p99_delta_ms, rule.max_abandonment_delta, rule.min_requests) == (0.0, 0.01, 100)
    assert rule.selects_slice("a", "b", "summary-mode", "async")
    assert "slice_regression" in RULE_KINDS and "slice_regression" in EVALUATORS


BAD = """\
rules:
  - name: ok
    kind: slice_regression
    flag: "summary-*"
  - name: typo
    kind: slice_regression
    variants: async
  - name: limits
    kind: slice_regression
    max_abandonment_delta: 1.5
    min_requests: 0
  - name: nothing
    kind: slice_regression
    max_p99_delta_ms: null
    max_abandonment_delta: null
  - name: clash
    kind: slice_regression
    labels: {flag: x}
"""


def test_rule_file_problems_have_their_lines(tmp_path: Path) -> None:
    path = tmp_path / "slices.yaml"
    path.write_text(BAD)
    got = [(p.line, p.message) for p in check_rule_files([path])]
    assert got == [
        (7, "rules[1].variants: unknown key (did you mean 'variant'?)"),
        (10, "rules[2].max_abandonment_delta: Input should be less than 1"),
        (11, "rules[2].min_requests: Input should be greater than or equal to 1"),
        (12, "rules[3]: set max_p99_delta_ms, max_abandonment_delta, or both"),
        (16, "rules[4]: labels ['flag'] are set by the rule engine; choose other label names"),
    ]


def test_rules_check_accepts_the_kind_and_names_the_line_of_a_bad_field(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(RULE)
    bad = tmp_path / "bad.yaml"
    bad.write_text(RULE + "    max_p99_delta_ms: -5\n")
    ok = subprocess.run(
        [sys.executable, "-m", "tailwatch", "rules", "check", str(good)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip() == "ok: 1 rules in 1 file"
    proc = subprocess.run(
        [sys.executable, "-m", "tailwatch", "rules", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        f"{bad}:10: rules[0].max_p99_delta_ms: Input should be greater than or equal to 0"
    )


def test_the_documented_example_is_accepted() -> None:
    text = ALERTING_MD.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    (example,) = [block for block in blocks if "kind: slice_regression" in block]
    (rule,) = rules_from_text(example).rules
    assert isinstance(rule, SliceRegressionRule) and rule.flag == "summary-*" and rule.min_requests == 200


# --- through the real analysis ------------------------------------------------------------------


def test_the_migration_that_works_is_quiet_and_the_old_path_alerts_against_a_named_control(
    store: Store,
) -> None:
    # 70% sync (the model in the request) against 30% async (a queue): the async variant is far
    # better on p99 and abandonment, so neither the default pack nor a rule on the flag alerts.
    sc = b.scenario_flag_split()
    insert_spans(store, sc.spans)
    rules = rules_from_text(RULE)
    quiet = evaluate(store, rules, sc.end, dashboard_url=DASH)
    assert quiet.errors == [] and quiet.alerts == [] and quiet.analyses_run == 1
    default = evaluate(store, load_rules(), sc.end, dashboard_url=DASH)
    assert default.errors == [] and default.alerts == []
    # Once async is the control (named so here; with these names, also once it serves more than
    # half the requests), sync is judged against it: worse on both.
    async_control = Conventions(slice_control_variants=("async",))
    named = evaluate(store, rules, sc.end, dashboard_url=DASH, conventions=async_control)
    (alert,) = named.fired
    assert alert.labels["flag"] == "summary-mode" and alert.labels["variant"] == "sync"
    notes = alert.annotations
    assert notes["cause"] == "latency" and notes["regressed"] == "p99,abandonment"
    assert notes["control"] == "async" and notes["requests"] == "300 → 700"
    assert notes["sync_llm_calls_per_request"] == "0.00 → 1.00"
    assert notes["abandonment_rate"] == "0.0200 → 0.1000"
    assert "control's queued work is ready after" in notes["summary"]
    assert notes["cold_jobs"] == "300 → 0"
    # Two hours on the window holds no traffic: resolved.
    later = evaluate(store, rules, sc.end + timedelta(hours=2), conventions=async_control)
    assert [a.fingerprint for a in later.resolved] == [alert.fingerprint]


def _abandoned_rollout(requests: int = 1000) -> list[Any]:
    """``docs-api POST /summarize`` under ``summary-mode``: 70% ``sync`` (600–1400 ms, 2% abandoned)
    and 30% ``async`` (30–70 ms, its summary ready 2–8 s later, a few after 60 s) whose users give
    up on 16% of the requests: faster, but worse for them."""
    rng = random.Random(31)
    spans: list[Any] = []
    for i in range(requests):
        start = b.at(i * 3.0)
        if i % 10 < 7:
            index = i // 10 * 7 + i % 10
            request = b.hot_request(
                "docs-api",
                "POST /summarize",
                start,
                0.0,
                llm_ms=600.0 + rng.random() * 800.0,
                internal=[("load doc", 20.0)],
                http_status=499 if index % 50 == 0 else 200,
            )
            spans += b.flagged(request, "summary-mode", "sync")
        else:
            index = i // 10 * 3 + i % 10 - 7
            wait = 60.0 + rng.random() * 10.0 if index % 50 == 0 else 1.0 + rng.random() * 5.0
            request = b.queued_request(
                "docs-api",
                "POST /summarize",
                start,
                30.0 + rng.random() * 40.0,
                "summaries",
                wait,
                1.0 + rng.random(),
                abandoned=index % 25 < 4,
            )
            spans += b.flagged(request, "summary-mode", "async")
    return spans


def test_an_async_variant_its_users_abandon_alerts_with_its_queue(store: Store) -> None:
    insert_spans(store, _abandoned_rollout())
    end = b.dt(b.at(3600))
    result = evaluate(store, rules_from_text(RULE), end, dashboard_url=DASH)
    assert result.errors == []
    (alert,) = result.fired
    assert alert.labels["variant"] == "async"
    notes = alert.annotations
    assert notes["cause"] == "abandonment" and notes["regressed"] == "abandonment"
    assert notes["control"] == "sync" and notes["requests"] == "700 → 300"
    assert notes["abandonment_rate"] == "0.0200 → 0.1600"
    assert notes["sync_llm_calls_per_request"] == "1.00 → 0.00"
    assert notes["cold_jobs"] == "0 → 300"
    summary = notes["summary"]
    assert summary.startswith(
        "docs-api POST /summarize: variant async of flag summary-mode is worse than control sync on "
        "abandonment: p99 "
    )
    assert "abandonment 16.0% (" in summary and "300 vs 700 requests" in summary
    assert "the work it queues is ready after" in summary and "at p99 (300 jobs)" in summary
    assert re.fullmatch(re.escape(DASH) + r"/runs/[0-9a-f]{32}/boundary\.html", notes["dashboard"])
