"""``[[notify.alertmanager]]``, ``TAILWATCH_ALERTMANAGER_URL`` and ``[links] trace_url`` in the
service configuration, down to the ``slo_rules`` notifier configurations and the evaluate job."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from slo_rules import AlertmanagerConfig
from tailwatch.cli import main
from tailwatch.config import ConfigError, example_config, load_config, render_config
from tailwatch.service import _Evaluate


def _write(tmp_path: Path, text: str, name: str = "tailwatch.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_alertmanager_entries_become_notifiers(tmp_path: Path) -> None:
    ca = _write(tmp_path, "not checked at load", "ca.pem")
    path = _write(
        tmp_path,
        '[[notify.alertmanager]]\nurl = "http://am-0:9093"\nbearer_token_env = "AM_TOKEN"\n'
        '[[notify.alertmanager]]\nurl = "https://am-1:9093/am"\nusername = "tw"\npassword_env = "AM_PW"\n'
        f'ca_file = "{ca}"\ntimeout = "3s"\n'
        '[links]\ntrace_url = "http://jaeger:16686/trace/{trace_id}"\n',
    )
    config = load_config(path, env={})
    assert config.notifiers() == [
        AlertmanagerConfig(url="http://am-0:9093", bearer_token_env="AM_TOKEN"),
        AlertmanagerConfig(
            url="https://am-1:9093/am", username="tw", password_env="AM_PW", ca_file=str(ca), timeout_s=3.0
        ),
    ]
    names = [n.name for n in config.notifiers()]
    assert names == ["alertmanager@am-0:9093", "alertmanager@am-1:9093"]
    assert config.links.trace_url == "http://jaeger:16686/trace/{trace_id}"
    with pytest.raises(
        ConfigError, match=r"notify.alertmanager\[0\].bearer_token_env: environment variable AM_TOKEN"
    ):
        config.check_environment({"AM_PW": "x"})
    config.check_environment({"AM_TOKEN": "t", "AM_PW": "x"})
    shown = render_config(config)
    assert '[[notify.alertmanager]]\nurl = "http://am-0:9093"\nbearer_token_env = "AM_TOKEN"' in shown
    ca.unlink()
    with pytest.raises(ConfigError, match=r"notify.alertmanager\[1\].ca_file: .* is not a file"):
        config.check_environment({"AM_TOKEN": "t", "AM_PW": "x"})


def test_the_environment_names_an_ha_pair(tmp_path: Path) -> None:
    config = load_config(
        env={"TAILWATCH_ALERTMANAGER_URL": "http://am-0:9093, http://am-1:9093"}, use_default_file=False
    )
    assert [n.name for n in config.notifiers()] == ["alertmanager@am-0:9093", "alertmanager@am-1:9093"]
    with pytest.raises(ConfigError, match=r"environment TAILWATCH_ALERTMANAGER_URL"):
        load_config(env={"TAILWATCH_ALERTMANAGER_URL": "am-0:9093"}, use_default_file=False)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('url = "http://tw:secret@am:9093"', "no password in the URL"),
        ('url = "http://am:9093"\nusername = "tw"', "basic auth takes both username and password_env"),
        (
            'url = "http://am:9093"\nusername = "tw"\npassword_env = "P"\nbearer_token_env = "T"',
            "not both",
        ),
        ('url = "http://am:9093"\ntoken = "x"', "unknown key"),
    ],
)
def test_credentials_stay_out_of_the_file(tmp_path: Path, entry: str, message: str) -> None:
    path = _write(tmp_path, f"[[notify.alertmanager]]\n{entry}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


def test_notifier_names_are_unique(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '[[notify.alertmanager]]\nurl = "http://am:9093"\n[[notify.alertmanager]]\nurl = "http://am:9093/"\n',
    )
    with pytest.raises(
        ConfigError, match="notifier names must be unique; give each a name: alertmanager@am:9093"
    ):
        load_config(path, env={})


def test_the_example_config_loads_and_no_longer_points_a_webhook_at_alertmanager(tmp_path: Path) -> None:
    text = example_config()
    assert "9093/hook" not in text and "# [[notify.alertmanager]]" in text
    assert "TAILWATCH_ALERTMANAGER_URL" in text
    enabled = text.replace("# [[notify.alertmanager]]", "[[notify.alertmanager]]").replace(
        '# url = "http://127.0.0.1:9093"', 'url = "http://127.0.0.1:9093"'
    )
    enabled = enabled.replace("# bearer_token_env", "bearer_token_env")
    config = load_config(_write(tmp_path, enabled), env={})
    # The example's webhook stays commented out (it needs a receiver and a secret): only Alertmanager.
    assert [n.kind for n in config.notifiers()] == ["alertmanager"]


def test_cli_options(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(main, ["alerts", "evaluate", "--trace-url", "http://jaeger/trace/{id}"])
    assert bad.exit_code == 2 and "must contain {trace_id}" in bad.output
    bad = runner.invoke(main, ["alerts", "evaluate", "--alertmanager", "am:9093"])
    assert bad.exit_code == 2 and "expected an http:// or https:// URL" in bad.output


def test_the_evaluate_job_tells_alertmanager_its_own_interval() -> None:
    from tailwatch.config import parse_schedule

    now = datetime(2026, 12, 2, 16, 42, 10, tzinfo=UTC)
    assert _Evaluate.interval(parse_schedule("30s"), now) == timedelta(seconds=30)
    assert _Evaluate.interval(parse_schedule("*/5 * * * *"), now) == timedelta(minutes=5)
    # Weekdays at 09:00: the longest gap ahead (over a weekend) is what endsAt must outlast.
    assert _Evaluate.interval(parse_schedule("0 9 * * 1-5"), now) == timedelta(days=3)
