from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from slo_rules import DEFAULT_RULES_PATH, RuleError, check_rule_files, load_rules
from slo_rules.rules import (
    DEFAULT_BURN_RATES,
    LatencySloRule,
    P99RegressionRule,
    rules_from_text,
)
from storage import format_duration, parse_duration

HERE = Path(__file__).parent
CONTRACT = HERE / "contract_rules.yaml"


def test_contract_file_is_accepted_as_is() -> None:
    rules = load_rules([CONTRACT])
    assert [r.kind for r in rules.rules] == [
        "latency_slo",
        "p99_regression",
        "cold_path_starvation",
        "abandonment",
        "retry_amplification",
        "release_coupling",
    ]
    slo = rules.rules[0]
    assert isinstance(slo, LatencySloRule)
    assert (slo.threshold_ms, slo.target, slo.window) == (1500.0, 0.99, timedelta(days=30))
    # Defaults are the SRE Workbook tiers, fastest first.
    assert [(t.long, t.short_window, t.factor, t.severity) for t in slo.tiers()] == [
        (timedelta(hours=1), timedelta(minutes=5), 14.4, "page"),
        (timedelta(hours=6), timedelta(minutes=30), 6.0, "page"),
        (timedelta(days=1), timedelta(hours=2), 3.0, "ticket"),
        (timedelta(days=3), timedelta(hours=6), 1.0, "ticket"),
    ]
    reg = rules.rules[1]
    assert isinstance(reg, P99RegressionRule)
    assert reg.selects("support-chat", "POST /anything") and not reg.selects("search-api", "GET /search")
    assert (reg.min_increase.relative, reg.min_increase.absolute_ms, reg.min_requests) == (0.2, 100.0, 200)
    assert check_rule_files([CONTRACT]) == []


def test_default_pack_ships_and_loads() -> None:
    assert DEFAULT_RULES_PATH.name == "default.yaml" and DEFAULT_RULES_PATH.exists()
    rules = load_rules()
    assert len(rules) >= 6
    assert {r.kind for r in rules.rules} >= {
        "p99_regression",
        "release_coupling",
        "cold_path_starvation",
        "abandonment",
        "retry_amplification",
        "architecture_drift",
        "llm_cost_regression",
        "llm_cache_drop",
    }
    # Not shipped: which variant is the control needs the team's naming (slice_control_variants).
    assert "slice_regression" not in {r.kind for r in rules.rules}
    assert rules.route.repeat_interval == timedelta(hours=4) and rules.route.send_resolved


BAD = """\
rules:
  - name: a
    kind: latency_slo
    service: support-chat
    treshold_ms: 1500
    target: 1.5
    window: 30x
  - name: b
    kind: p99_rgression
  - name: a
    kind: abandonment
  - kind: retry_amplification
    workflow: x
    max_attempt_amplification: 1.1
    severity: urgent
  - name: c
    kind: p99_regression
    baseline: last
    min_increase: {relativ: 0.2}
"""


def test_every_problem_has_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    problems = check_rule_files([path])
    got = [(p.line, p.message) for p in problems]
    assert got == [
        (2, "rules[0].threshold_ms: required key is missing"),
        (5, "rules[0].treshold_ms: unknown key (did you mean 'threshold_ms'?)"),
        (6, "rules[0].target: Input should be less than 1"),
        (7, "rules[0].window: invalid duration '30x': use a number and a unit, e.g. 500ms, 30s, 5m, 1h, 1d"),
        (
            9,
            "rules[1].kind: unknown rule kind 'p99_rgression'; allowed kinds: latency_slo, p99_regression, "
            "release_coupling, cold_path_starvation, abandonment, retry_amplification, slice_regression, "
            "architecture_drift, llm_cost_regression, llm_cache_drop",
        ),
        (10, "rules[2]: set max_rate, p99_beyond_cliff: true, or both"),
        (10, "rule name 'a' is already used on line 2"),
        (12, "rules[3].name: required key is missing"),
        (15, "rules[3].severity: 'urgent' is not allowed; expected 'page', 'ticket' or 'info'"),
        (18, "rules[4].baseline: 'last' is not allowed; expected 'previous' or 'previous_release'"),
        (19, "rules[4].min_increase.relativ: unknown key (did you mean 'relative'?)"),
    ]
    assert all(p.file == str(path) for p in problems)
    with pytest.raises(
        RuleError, match=r"bad\.yaml:2: rules\[0\]\.threshold_ms: required key is missing \(and 10 more"
    ):
        load_rules([path])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rules:\n  - name: x\n    kind: [\n", "3: YAML syntax error"),
        (
            "rules:\n  - name: x\n    name: y\n    kind: abandonment\n    max_rate: 0.1\n",
            "3: duplicate key 'name'",
        ),
        ("", "1: the file is empty"),
        ("- a\n- b\n", "1: expected a mapping with 'rules:'"),
        ("rule: []\n", "1: missing 'rules:'"),
        ("rules:\n  - name: x\n    kind: abandonment\n", "2: rules[0]: set max_rate"),
        (
            "rules:\n  - name: s\n    kind: latency_slo\n    threshold_ms: 5\n    target: 0.9\n"
            "    burn_rates:\n      - {long: 1h, short: 2h, factor: 3}\n",
            "7: rules[0].burn_rates[0]: short window 2h must be shorter than long window 1h",
        ),
        (
            "rules:\n  - name: s\n    kind: latency_slo\n    threshold_ms: 5\n    target: 0.9\n"
            "    window: 1d\n"
            "    burn_rates:\n      - {long: 3d, factor: 1}\n",
            "2: rules[0]: burn-rate long window 3d exceeds the SLO window 1d",
        ),
        (
            "rules:\n  - name: x\n    kind: abandonment\n    max_rate: 0.1\n    labels: {service: y}\n",
            "2: rules[0]:",
        ),
        # Regressions: these were tracebacks (serve exited) instead of problems with their line.
        (
            "rules:\n  - name: x\n    kind: abandonment\n    max_rate: 0.1\n    window: 99999999999999d\n",
            "5: rules[0].window: duration '99999999999999d' is longer than 10 years",
        ),
    ],
)
def test_single_problems(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    problems = check_rule_files([path])
    assert problems, text
    assert str(problems[0]).startswith(f"{path}:{expected}"), str(problems[0])


def test_a_yaml_alias_bomb_is_a_problem_not_a_hang(tmp_path: Path) -> None:
    # Regression: ten levels of ten aliases (10^7 values from 300 bytes) took the loader minutes.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\nrules: []\n")
    started = time.monotonic()
    problems = check_rule_files([path])
    assert time.monotonic() - started < 10
    assert len(problems) == 1 and "expands to more than 100,000 values" in problems[0].message


def test_missing_file_and_cross_file_duplicates(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("rules:\n  - {name: x, kind: abandonment, max_rate: 0.1}\n")
    b = tmp_path / "b.yaml"
    b.write_text("rules:\n  - {name: x, kind: abandonment, max_rate: 0.2}\n")
    problems = [str(p) for p in check_rule_files([a, b, tmp_path / "nope.yaml"])]
    assert problems == [
        f"{b}: rule name 'x' is already defined in {a}",
        f"{tmp_path / 'nope.yaml'}: no such file",
    ] or sorted(problems) == sorted(
        [f"{b}: rule name 'x' is already defined in {a}", f"{tmp_path / 'nope.yaml'}: no such file"]
    )


def test_custom_tiers_and_severity_cap() -> None:
    rules = rules_from_text(
        """
rules:
  - name: s
    kind: latency_slo
    threshold_ms: 300
    target: 0.999
    severity: ticket
    min_events: 5
    for: 2m
    burn_rates:
      - {long: 1h, factor: 14, severity: page}
      - {long: 6h, short: 20m, factor: 6}
"""
    )
    slo = rules.rules[0]
    assert slo.for_ == timedelta(minutes=2)
    tiers = slo.tiers()
    assert [(t.long, t.short_window, t.factor, t.severity) for t in tiers] == [
        (timedelta(hours=1), timedelta(minutes=5), 14.0, "ticket"),
        (timedelta(hours=6), timedelta(minutes=20), 6.0, "ticket"),
    ]
    assert DEFAULT_BURN_RATES[0].factor == 14.4


def test_durations() -> None:
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("500ms") == timedelta(milliseconds=500)
    assert parse_duration(90) == timedelta(seconds=90)
    # A bare number is seconds whether YAML reads it as a number or as a string (storage's grammar).
    assert parse_duration("5") == timedelta(seconds=5)
    for bad in ("", "1x", "-1h", "0s", "5 parsecs", True):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert [format_duration(parse_duration(s)) for s in ("30d", "1h", "5m", "90s", "2w", "500ms")] == [
        "30d",
        "1h",
        "5m",
        "90s",
        "2w",
        "500ms",
    ]


def test_rules_check_command(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    proc = subprocess.run(
        [sys.executable, "-m", "tailwatch", "rules", "check", str(CONTRACT), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == f"{bad}:2: rules[0].threshold_ms: required key is missing"
    assert len([line for line in lines if line.startswith(f"{bad}:")]) == 11
    ok = subprocess.run(
        [sys.executable, "-m", "tailwatch", "rules", "check", str(CONTRACT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "6 rules" in ok.stdout
