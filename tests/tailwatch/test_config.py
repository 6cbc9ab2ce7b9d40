from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from storage import default_store_dsn
from tailwatch.cli import main
from tailwatch.config import (
    ConfigError,
    Schedule,
    example_config,
    load_config,
    parse_duration,
    parse_schedule,
    render_config,
)

REPO = Path(__file__).resolve().parents[2]

# The configuration contract, verbatim.
CONTRACT_TOML = """\
store = "chdb:///var/lib/tailwatch/store"

[receiver]
otlp_http = "127.0.0.1:4318"
otlp_grpc = "127.0.0.1:4317"

[schedule]                 # durations: "500ms", "2s", "5m", "1h"; or cron = "*/5 * * * *"
rollup = "60s"
analyze = "5m"
evaluate = "60s"
dashboards = "1h"

[rules]
files = ["slo_rules/default.yaml"]

[[notify.webhook]]         # Alertmanager-format receivers; also [[notify.slack]], [[notify.pagerduty]]
url = "http://127.0.0.1:9093/hook"
secret_env = "TAILWATCH_WEBHOOK_SECRET"
"""


def _write(tmp_path: Path, text: str, name: str = "tailwatch.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_contract_file_is_accepted_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the rule file resolves from the installation, not the cwd
    config = load_config(_write(tmp_path, CONTRACT_TOML), env={})
    assert config.store == "chdb:///var/lib/tailwatch/store"
    assert config.receiver.otlp_http == "127.0.0.1:4318"
    assert config.receiver.otlp_grpc == "127.0.0.1:4317"
    assert config.schedule.rollup == Schedule("interval", seconds=60.0)
    assert config.schedule.analyze == Schedule("interval", seconds=300.0)
    assert config.schedule.evaluate == Schedule("interval", seconds=60.0)
    assert config.schedule.dashboards == Schedule("interval", seconds=3600.0)
    assert config.rules.files == [REPO / "slo_rules" / "default.yaml"]
    [hook] = config.notify.webhook
    assert hook.url == "http://127.0.0.1:9093/hook"
    assert hook.secret_env == "TAILWATCH_WEBHOOK_SECRET"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("2s", 2.0), ("5m", 300.0), ("1h", 3600.0), ("1d", 86400.0), (90, 90.0), ("1.5", 1.5)],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5x", "", "-1s", "0s", True, "1 h m", "99999999999d"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_schedule_spellings() -> None:
    cron = Schedule("cron", cron="*/5 * * * *")
    assert parse_schedule("*/5 * * * *") == cron
    assert parse_schedule("cron: */5  * * * *") == cron
    assert parse_schedule({"cron": "*/5 * * * *"}) == cron
    assert parse_schedule({"every": "2s"}) == Schedule("interval", seconds=2.0)
    assert parse_schedule("off") == Schedule("off")
    assert parse_schedule(False) == Schedule("off")
    with pytest.raises(ValueError, match="invalid cron expression"):
        parse_schedule("*/5 * * * 99")
    with pytest.raises(ValueError, match="exactly one of 'cron' or 'every'"):
        parse_schedule({"cron": "* * * * *", "every": "1m"})


def test_cron_table_forms_in_toml(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[schedule]\nanalyze = {cron = "*/5 * * * *"}\ndashboards = "0 * * * *"\nrollup = "off"\n'
        '[schedule.evaluate]\ncron = "* * * * *"\n',
    )
    config = load_config(path, env={})
    assert config.schedule.analyze == Schedule("cron", cron="*/5 * * * *")
    assert config.schedule.dashboards == Schedule("cron", cron="0 * * * *")
    assert config.schedule.evaluate == Schedule("cron", cron="* * * * *")
    assert config.schedule.rollup.kind == "off"
    # The rendered effective configuration is valid TOML and loads back to the same schedule.
    shown = tomllib.loads(render_config(config))
    assert shown["schedule"]["analyze"] == {"cron": "*/5 * * * *"}


def test_per_operation_conventions_show_as_toml_that_loads_back(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "[analysis.conventions]\n"
        'abandonment_latency = [{ operation = "POST /chat/stream", latency = "first_byte" }]\n'
        'latency_budgets = [{ service = "chat-*", operation = "POST /chat", budget = "2s" }]\n'
        'flag_events = ["feature_flag.evaluation"]\n',
    )
    config = load_config(path, env={})
    shown = tomllib.loads(render_config(config))["analysis"]["conventions"]
    assert shown["abandonment_latency"] == [{"operation": "POST /chat/stream", "latency": "first_byte"}]
    assert shown["latency_budgets"] == [{"service": "chat-*", "operation": "POST /chat", "budget": "2s"}]
    assert shown["flag_events"] == ["feature_flag.evaluation"]
    # What is shown is a configuration that loads to the same conventions.
    again = load_config(_write(tmp_path, render_config(config)), env={})
    assert again.analysis.conventions == config.analysis.conventions


def test_precedence_argument_env_file_default(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[receiver]\notlp_http = "127.0.0.1:1111"\notlp_grpc = "127.0.0.1:2222"\n'
        '[schedule]\nanalyze = "10m"\nevaluate = "30s"\n',
    )
    env = {"TAILWATCH_OTLP_HTTP": "127.0.0.1:3333", "TAILWATCH_SCHEDULE_ANALYZE": "2m"}
    config = load_config(path, env=env, overrides={"receiver.otlp_http": "127.0.0.1:4444"})
    assert config.receiver.otlp_http == "127.0.0.1:4444"  # argument beats env and file
    assert config.schedule.analyze.seconds == 120.0  # env beats file
    assert config.receiver.otlp_grpc == "127.0.0.1:2222"  # file beats default
    assert config.schedule.evaluate.seconds == 30.0
    assert config.schedule.rollup.seconds == 60.0  # default
    assert config.schedule.dashboards.seconds == 3600.0


def test_pipeline_settings_come_from_the_one_resolution(tmp_path: Path) -> None:
    # `collect`, `serve` and `ingest` build their pipeline from the same keys, so a variable set for
    # one is honoured by all (TAILWATCH_NATIVE_INSERT once worked for `collect` only).
    path = _write(tmp_path, "[ingest]\nbatch_rows = 700\nmax_queue_spans = 9000\n")
    env = {
        "TAILWATCH_FLUSH_INTERVAL_S": "0.5",
        "TAILWATCH_NATIVE_INSERT": "off",
        "TAILWATCH_MAX_QUEUE_BYTES": "1048576",
        "TAILWATCH_MAX_INFLIGHT_BYTES": "2097152",
    }
    settings = load_config(path, env=env, overrides={"ingest.max_queue_spans": 5000}).pipeline_settings()
    assert (settings.batch_rows, settings.flush_interval_s, settings.max_queue_spans) == (700, 0.5, 5000)
    assert (settings.max_queue_bytes, settings.max_inflight_bytes) == (1024 * 1024, 2 * 1024 * 1024)
    assert settings.native_insert is False
    assert settings.spool_dir is not None  # spooled by default, beside the store
    with pytest.raises(ConfigError, match=r"ingest.native_insert: .*\(environment TAILWATCH_NATIVE_INSERT\)"):
        load_config(env={"TAILWATCH_NATIVE_INSERT": "maybe"}, use_default_file=False)
    with pytest.raises(ConfigError, match=r"ingest.batch_rows: .*\(environment TAILWATCH_BATCH_ROWS\)"):
        load_config(env={"TAILWATCH_BATCH_ROWS": "lots"}, use_default_file=False)


def test_config_file_from_env_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text("rules: []\n")
    path = _write(tmp_path, '[dashboards]\nout_dir = "dash"\n[rules]\nfiles = ["rules.yaml"]\n', "x.toml")
    config = load_config(env={"TAILWATCH_CONFIG": str(path)})
    assert config.config_file == path
    assert config.dashboards.out_dir == tmp_path / "dash"
    assert config.rules.files == [tmp_path / "rules.yaml"]


def test_env_webhook_and_rules_list(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("rules: []\n")
    b.write_text("rules: []\n")
    env = {"TAILWATCH_WEBHOOK_URL": "http://127.0.0.1:9/hook", "TAILWATCH_RULES": f"{a}{os.pathsep}{b}"}
    config = load_config(env=env, use_default_file=False)
    assert [w.url for w in config.notify.webhook] == ["http://127.0.0.1:9/hook"]
    assert config.rules.files == [a, b]


def test_every_mistake_names_key_and_source(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[schedule]\nanalyze = "5x"\nanalyse = "5m"\n[receiver]\notlp_http = "nope"\n'
        '[log]\nformat = "xml"\n[[notify.webhook]]\nurl = "ftp://x"\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert "\n" not in message
    where = f"(file {path})"
    assert "schedule.analyze: expected a duration" in message and where in message
    assert "schedule.analyse: unknown key; allowed: enabled, rollup, analyze" in message
    assert "receiver.otlp_http: expected HOST:PORT" in message
    assert "log.format: got 'xml'; allowed: 'plain' or 'json'" in message
    assert "notify.webhook[0].url: expected an http:// or https:// URL" in message


def test_env_mistake_names_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"schedule.evaluate: .* \(environment TAILWATCH_SCHEDULE_EVALUATE\)"
    ):
        load_config(env={"TAILWATCH_SCHEDULE_EVALUATE": "often"}, use_default_file=False)
    with pytest.raises(ConfigError, match=r"store: .*not supported.*\(environment TAILWATCH_STORE\)"):
        load_config(env={"TAILWATCH_STORE": "mysql://x"}, use_default_file=False)


def test_file_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    bad = _write(tmp_path, "[schedule\nx=1\n")
    with pytest.raises(ConfigError, match=rf"config file {bad}: invalid TOML: .*line 1"):
        load_config(bad, env={})
    nofile = _write(tmp_path, '[rules]\nfiles = ["nowhere.yaml"]\n', "r.toml")
    with pytest.raises(ConfigError, match=r"rules.files\[0\]: rule file .*nowhere.yaml does not exist"):
        load_config(nofile, env={})
    small = _write(tmp_path, "[ingest]\nbatch_rows = 100\nmax_queue_spans = 10\n", "i.toml")
    with pytest.raises(ConfigError, match=r"ingest: max_queue_spans \(10\) must be at least batch_rows"):
        load_config(small, env={})


def test_example_loads_and_show_masks_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["config", "init", "tw.toml"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "tw.toml").read_text() == example_config()
    again = runner.invoke(main, ["config", "init", "tw.toml"])
    assert again.exit_code != 0 and "exists" in again.output
    config = load_config(tmp_path / "tw.toml", env={})
    assert config.schedule.analyze.seconds == 300.0
    # What `config init` writes starts as an ordinary user on a fresh machine: the default embedded
    # store, no notifier needing a secret, the shipped rules; `config check` says so.
    assert config.store == default_store_dsn() and config.notifiers() == []
    checked = runner.invoke(main, ["config", "check", "--config", "tw.toml"])
    assert checked.exit_code == 0 and "configuration ok" in checked.output, checked.output
    _write(
        tmp_path,
        '[[notify.webhook]]\nurl = "http://127.0.0.1:9/h"\nsecret_env = "UNSET_SECRET_X"\n'
        '[rules]\nfiles = ["missing.yaml"]\n',
        "broken.toml",
    )
    broken = runner.invoke(main, ["config", "check", "--config", "broken.toml"])
    assert broken.exit_code in (1, 2) and "missing.yaml" in broken.output

    text = (
        'store = "http://reader:hunter2@127.0.0.1:8123/db"\n'
        '[[notify.webhook]]\nurl = "http://u:pw@127.0.0.1:9/hook?key=abc"\nsecret_env = "HOOK_SECRET"\n'
        '[[notify.slack]]\nurl = "https://hooks.slack.com/services/T0/B0/XYZ"\n'
        '[[notify.pagerduty]]\nrouting_key_env = "PD_KEY"\n'
    )
    _write(tmp_path, text, "secret.toml")
    monkeypatch.setenv("HOOK_SECRET", "s3cr3t-value")
    monkeypatch.setenv("TAILWATCH_INGEST_TOKEN", "tok-value")
    shown = runner.invoke(main, ["config", "show", "--config", "secret.toml"])
    assert shown.exit_code == 0, shown.output
    for secret in ("hunter2", "pw@", "key=abc", "XYZ", "s3cr3t-value", "tok-value"):
        assert secret not in shown.output
    assert "http://reader:***@127.0.0.1:8123/db" in shown.output
    assert "HOOK_SECRET is set (value masked)" in shown.output
    assert "PD_KEY is not set" in shown.output
    assert tomllib.loads(shown.output)["notify"]["slack"][0]["url"] == "https://hooks.slack.com/***"


def test_config_show_invalid_is_one_line_exit_2(tmp_path: Path) -> None:
    path = _write(tmp_path, '[schedule]\nevaluate = "soon"\n')
    result = subprocess.run(
        [sys.executable, "-m", "tailwatch", "config", "show", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "tailwatch: error: invalid configuration: schedule.evaluate"
    )


def test_notify_entries_become_slo_rules_notifiers(tmp_path: Path) -> None:
    from slo_rules import PagerDutyConfig, SlackConfig, WebhookConfig

    path = _write(
        tmp_path,
        '[[notify.webhook]]\nurl = "http://127.0.0.1:9/a"\nsecret_env = "S1"\ntimeout = "3s"\n'
        '[[notify.slack]]\nurl_env = "SLACK_URL"\n'
        '[[notify.pagerduty]]\nrouting_key_env = "PD"\nname = "pd"\n',
    )
    config = load_config(path, env={})
    assert config.notifiers() == [
        WebhookConfig(url="http://127.0.0.1:9/a", secret_env="S1", timeout_s=3.0),
        SlackConfig(url="", url_env="SLACK_URL"),
        PagerDutyConfig(routing_key_env="PD", name="pd"),
    ]
    bad = _write(tmp_path, '[[notify.slack]]\nname = "x"\n', "bad.toml")
    with pytest.raises(ConfigError, match=r"notify.slack\[0\]: set exactly one of url or url_env"):
        load_config(bad, env={})


def test_analysis_conventions_are_checked_against_the_analytics(tmp_path: Path) -> None:
    from analytics import Conventions

    path = _write(
        tmp_path,
        '[analysis]\nwindow = "30m"\n'
        'conventions = { min_release_requests = 50, abandon_status_codes = ["499", "408"] }\n',
    )
    config = load_config(path, env={})
    assert config.analysis.window == 1800.0
    assert config.analysis.conventions_object() == Conventions(
        min_release_requests=50, abandon_status_codes=("499", "408")
    )
    bad = _write(tmp_path, "[analysis]\nconventions = { min_release_request = 50 }\n", "bad.toml")
    with pytest.raises(ConfigError, match=r"analysis.conventions: unknown convention 'min_release_request'"):
        load_config(bad, env={})


def test_the_price_table_reaches_the_analytics_and_its_mistakes_name_the_line(tmp_path: Path) -> None:
    from analytics import Conventions, Price

    text = (
        '[analysis]\nwindow = "1h"\n\n'
        '[[analysis.prices]]\nprovider = "openai"\nmodel = "gpt-4o"\n'
        "input = 2.5\ncached_input = 1.25\noutput = 10\n\n"
        '[[analysis.prices]]\nprovider = "*"\nmodel = "claude-sonnet-4"\ninput = 3\noutput = 15\n'
    )
    config = load_config(_write(tmp_path, text), env={})
    assert config.analysis.conventions_object() == Conventions(
        llm_prices=(
            Price("openai", "gpt-4o", input=2.5, output=10.0, cached_input=1.25),
            Price("*", "claude-sonnet-4", input=3.0, output=15.0),
        )
    )
    shown = tomllib.loads(render_config(config))
    assert shown["analysis"]["prices"][1] == {
        "provider": "*",
        "model": "claude-sonnet-4",
        "input": 3.0,
        "output": 15.0,
    }
    bad = _write(tmp_path, text.replace("output = 15", 'output = "fifteen"'), "bad.toml")
    lines = text.splitlines()
    second = [n for n, line in enumerate(lines, start=1) if line == "[[analysis.prices]]"][1]
    with pytest.raises(ConfigError, match=rf"analysis.prices\[1\].output: .* line {second}\)"):
        load_config(bad, env={})
    negative = _write(tmp_path, text.replace("input = 2.5", "input = -1"), "neg.toml")
    with pytest.raises(ConfigError, match=r"analysis.prices\[0\].input: .*greater than or equal to 0"):
        load_config(negative, env={})


def test_schedules_become_apscheduler_triggers() -> None:
    from datetime import UTC, datetime

    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    every = parse_schedule("500ms").trigger()
    assert isinstance(every, IntervalTrigger) and every.interval.total_seconds() == 0.5
    cron = parse_schedule({"cron": "*/5 * * * *"}).trigger()
    assert isinstance(cron, CronTrigger)
    now = datetime(2026, 12, 2, 16, 42, 10, tzinfo=UTC)
    assert cron.get_next_fire_time(None, now) == datetime(2026, 12, 2, 16, 45, tzinfo=UTC)
    assert parse_schedule("off").trigger() is None


def test_missing_notifier_secrets_are_start_up_errors(tmp_path: Path) -> None:
    path = _write(tmp_path, CONTRACT_TOML.replace('store = "chdb:///var/lib/tailwatch/store"\n', ""))
    config = load_config(path, env={})
    with pytest.raises(ConfigError) as info:
        config.check_environment({})
    assert str(info.value) == (
        "invalid configuration: notify.webhook[0].secret_env: environment variable TAILWATCH_WEBHOOK_SECRET "
        f"is not set (file {path}); set it or remove the key"
    )
    config.check_environment({"TAILWATCH_WEBHOOK_SECRET": "x"})
