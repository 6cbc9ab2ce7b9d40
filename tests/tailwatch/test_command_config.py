"""One configuration for every command (issue 39): --config and ./tailwatch.toml on each command that
reads the store or a setting, --last on the windowed commands, one --format vocabulary and the exit
statuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from collectors import insert_spans
from slo_rules import load_rules
from storage import ensure_schema, iso_z, open_store, parse_time
from tailwatch.cli import main
from tailwatch.commands._common import OUTPUT_FORMATS
from tests.analytics.builders import scenario_llm_regression

# The commands that read neither the store nor a setting: the demo's store, rules and webhook are
# its own (a tailwatch.toml must never point it at a real store), generate writes a file, and
# config init writes the configuration itself.
NO_CONFIG = {("demo",), ("generate",), ("config", "init")}
# --format options that choose a file format, not the table|json of a listing or report.
FILE_FORMATS = {("dashboard", "export"), ("generate",)}


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in group.commands.items():
        path = (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, path)
        else:
            yield path, command


def _cli(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)


def test_every_command_takes_config_and_one_format_vocabulary() -> None:
    for path, command in _commands(main):
        options = {opt: param for param in command.params for opt in param.opts}
        if path not in NO_CONFIG:
            assert "--config" in options, path
        fmt = options.get("--format")
        if fmt is not None and path not in FILE_FORMATS:
            assert isinstance(fmt.type, click.Choice), path
            assert tuple(fmt.type.choices) == OUTPUT_FORMATS, (path, fmt.type.choices)
        if "--start" in options and path[0] != "alerts":
            assert "--last" in options, path
    # Each option with a configured default says where it comes from.
    help_text = " ".join(_cli("analyze", "--help").output.split())
    assert "analysis.window of the config, else 1h" in help_text
    assert "analysis.baseline of the config" in help_text
    assert "store of the config" in help_text and "TAILWATCH_CONFIG" in help_text
    export_help = " ".join(_cli("dashboard", "export", "--help").output.split())
    assert (
        "dashboards.out_dir of the config" in export_help
        and "dashboards.formats of the config" in export_help
    )
    assert "ingest.batch_rows of the config" in " ".join(_cli("ingest", "--help").output.split())


@pytest.fixture
def scenario_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A store with an LLM regression in it, and the working directory a fresh one."""
    monkeypatch.chdir(tmp_path)
    dsn = "chdb://" + str(tmp_path / "store")
    with open_store(dsn) as store:  # closed before the commands open the same embedded store
        ensure_schema(store)
        insert_spans(store, scenario_llm_regression(requests=120).spans)
    return dsn


def _window(result: Result) -> tuple[datetime, datetime, datetime, datetime]:
    assert result.exit_code == 0, result.output
    window = json.loads(result.stdout)["window"]
    return tuple(parse_time(window[k]) for k in ("start", "end", "baseline_start", "baseline_end"))  # type: ignore[return-value]


def test_analyze_takes_store_conventions_window_and_baseline_from_the_config(
    scenario_store: str, tmp_path: Path
) -> None:
    scenario = scenario_llm_regression(requests=120)
    window = ["--start", iso_z(scenario.start), "--end", iso_z(scenario.end)]
    plain = _cli("analyze", "--store", scenario_store, *window)
    assert plain.exit_code == 0, plain.output
    assert [row["operation"] for row in json.loads(plain.stdout)["hot_path"]] == [scenario.operation]

    # The store and the conventions from ./tailwatch.toml: no hot-path request has a Consumer root.
    (tmp_path / "tailwatch.toml").write_text(
        f'store = "{scenario_store}"\n[analysis]\nconventions = {{ hot_root_kinds = ["Consumer"] }}\n'
    )
    configured = _cli("analyze", *window)
    assert configured.exit_code == 0, configured.output
    assert json.loads(configured.stdout)["hot_path"] == []

    # --config names another file; analysis.window and analysis.baseline set the default window.
    other = tmp_path / "other.toml"
    other.write_text(f'store = "{scenario_store}"\n[analysis]\nwindow = "30m"\nbaseline = "2h"\n')
    end = scenario.end
    start, stop, base_start, base_end = _window(_cli("analyze", "--config", str(other), "--end", iso_z(end)))
    assert (start, stop) == (end - timedelta(minutes=30), end)
    assert (base_start, base_end) == (start - timedelta(hours=2), start)
    assert json.loads(_cli("analyze", "--config", str(other), "--end", iso_z(end)).stdout)["hot_path"]

    # Precedence: --last over TAILWATCH_ANALYSIS_WINDOW over the file over the default (1h).
    env = {"TAILWATCH_CONFIG": str(other), "TAILWATCH_ANALYSIS_WINDOW": "20m"}
    start, stop, _, _ = _window(_cli("analyze", "--end", iso_z(end), env=env))
    assert stop - start == timedelta(minutes=20)
    start, stop, _, _ = _window(_cli("analyze", "--end", iso_z(end), "--last", "45m", env=env))
    assert (start, stop) == (end - timedelta(minutes=45), end)
    before = datetime.now().astimezone()
    start, stop, _, _ = _window(_cli("analyze", "--last", "2h", env=env))
    assert stop - start == timedelta(hours=2) and before <= stop <= datetime.now().astimezone()
    (tmp_path / "tailwatch.toml").unlink()
    start, stop, _, _ = _window(_cli("analyze", "--store", scenario_store, "--end", iso_z(end)))
    assert stop - start == timedelta(hours=1)

    both = _cli("analyze", "--store", scenario_store, "--start", iso_z(scenario.start), "--last", "1h")
    assert both.exit_code == 2 and "give --start or --last, not both" in both.output


def test_a_config_mistake_is_one_line_naming_key_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tailwatch.toml").write_text('[analysis]\nwindow = "an hour"\n')
    for command in (["analyze"], ["summaries", "status"], ["schema", "inspect"], ["rules", "check"]):
        result = _cli(*command)
        assert result.exit_code == 2, (command, result.output)
        [line] = result.output.strip().splitlines()
        assert line.startswith("tailwatch: error: invalid configuration: analysis.window: ")
        assert line.endswith(f"(file {tmp_path / 'tailwatch.toml'})"), line


def test_rules_check_without_files_checks_the_configured_rule_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shipped = _cli("rules", "check")
    assert shipped.exit_code == 0 and shipped.output.startswith(f"ok: {len(load_rules())} rules in 1 file"), (
        shipped.output
    )
    rules = tmp_path / "team" / "rules.yaml"
    rules.parent.mkdir()
    rules.write_text(
        "rules:\n"
        "  - name: chat-p99\n"
        "    kind: p99_regression\n"
        "    service: chat-api\n"
        '    operation: "*"\n'
        "    window: 1h\n"
        "    baseline: previous\n"
        "    min_requests: 50\n"
    )
    (tmp_path / "tailwatch.toml").write_text('[rules]\nfiles = ["team/rules.yaml"]\n')
    mine = _cli("rules", "check")
    assert mine.exit_code == 0, mine.output
    assert mine.output.strip() == "ok: 1 rules in 1 file"
    as_json = json.loads(_cli("rules", "check", "--format", "json").output)
    assert as_json == {"files": [str(rules)], "rules": 1, "problems": []}

    rules.write_text(rules.read_text().replace("min_requests: 50", "min_requests: -5"))
    broken = _cli("rules", "check")
    assert broken.exit_code == 1
    assert broken.stdout.startswith(f"{rules}:") and "1 problem found" in broken.output
    [problem] = json.loads(_cli("rules", "check", "--format", "json").stdout)["problems"]
    assert problem["file"] == str(rules) and problem["line"] > 0
    # A FILE given is what is checked, whatever the configuration names.
    assert _cli("rules", "check", str(tmp_path / "missing.yaml")).exit_code == 1


def test_schema_and_summaries_read_the_configured_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tailwatch.toml").write_text('store = "http://reader@clickhouse.internal:8123/traces_db"\n')
    printed = _cli("schema", "print")
    assert printed.exit_code == 0, printed.output
    assert "CREATE TABLE IF NOT EXISTS `traces_db`.`otel_traces`" in printed.output
    wanted = tmp_path / "configured" / "store"
    config = tmp_path / "embedded.toml"
    config.write_text(f'store = "chdb://{wanted}"\n')
    applied = _cli("schema", "apply", "--config", str(config))
    assert applied.exit_code == 0 and applied.output.strip().endswith(f"in chdb://{wanted}"), applied.output
    status = _cli("summaries", "status", "--config", str(config), "--format", "text")  # `text` = `table`
    assert status.exit_code == 0 and "no summaries yet" in status.output, status.output
    inspected = _cli("schema", "inspect", "--config", str(config), "--format", "json")
    assert json.loads(inspected.output)["store"] == f"chdb://{wanted}"
    shown = _cli("config", "show", "--config", str(config), "--store", "chdb:///elsewhere")
    assert 'store = "chdb:///elsewhere"' in shown.output


def test_dashboard_export_takes_out_dir_formats_and_window_from_the_config(
    scenario_store: str, tmp_path: Path
) -> None:
    scenario = scenario_llm_regression(requests=120)
    (tmp_path / "tailwatch.toml").write_text(
        f'store = "{scenario_store}"\n[dashboards]\nout_dir = "pages"\nwindow = "30m"\n'
        '[links]\ntrace_url = "https://traces.example.com/trace/{trace_id}"\n'
    )
    result = _cli("dashboard", "export", "--end", iso_z(scenario.end))
    assert result.exit_code == 0, result.output
    start = scenario.end - timedelta(minutes=30)
    assert f"window {start:%Y-%m-%dT%H:%M:%SZ} → {scenario.end:%Y-%m-%dT%H:%M:%SZ}" in result.output
    assert (tmp_path / "pages" / "index.html").is_file()
    assert "https://traces.example.com/trace/" in (tmp_path / "pages" / "attribution.html").read_text()
    last = _cli(
        "dashboard", "export", "--out", str(tmp_path / "last"), "--last", "2h", "--end", iso_z(scenario.end)
    )
    assert last.exit_code == 0, last.output
    assert f"window {scenario.end - timedelta(hours=2):%Y-%m-%dT%H:%M:%SZ} →" in last.output
    both = _cli("dashboard", "export", "--start", iso_z(scenario.start), "--last", "1h")
    assert both.exit_code == 2 and "give --start or --last, not both" in both.output


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("tailwatch.commands.schema.render_ddl", interrupted)
    result = _cli("schema", "print")
    assert result.exit_code == 130
    assert result.output.strip() == "tailwatch: interrupted" and "Aborted!" not in result.output
