"""`tailwatch summaries build|status` and `tailwatch analyze --no-summaries` on a real store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner, Result

from collectors import insert_spans
from storage import ensure_schema, iso_z, open_store
from tailwatch.cli import main
from tests.analytics.builders import scenario_llm_regression


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_build_status_and_analyze_read_the_same_figures(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "store")
    scenario = scenario_llm_regression(requests=300)
    with open_store(dsn) as store:  # closed before the commands open the same embedded store
        ensure_schema(store)
        insert_spans(store, scenario.spans)

    before = _cli("summaries", "status", "--store", dsn)
    assert before.exit_code == 0, before.output
    assert "no summaries yet" in before.output and "tailwatch summaries build" in before.output

    until = scenario.end + timedelta(minutes=10)
    built = _cli("summaries", "build", "--store", dsn, "--until", iso_z(until))
    assert built.exit_code == 0, built.output
    # Progress on stderr, one line per range summarised; the report last.
    assert "tailwatch: summarising " in built.output
    assert "new minutes" in built.output.splitlines()[-1]

    status = _cli("summaries", "status", "--store", dsn, "--format", "json")
    assert status.exit_code == 0, status.output
    [covered] = json.loads(status.output)
    assert covered["until"].startswith(until.strftime("%Y-%m-%dT%H:%M"))
    # From the minute of the first span on.
    first = datetime.fromtimestamp(min(span.start_ns for span in scenario.spans) // 10**9, UTC)
    assert covered["from"].startswith(first.strftime("%Y-%m-%dT%H:%M"))

    again = _cli("summaries", "build", "--store", dsn, "--until", iso_z(until))
    assert again.exit_code == 0 and again.output.strip().endswith("summaries up to date"), again.output

    window = ["--start", iso_z(scenario.start), "--end", iso_z(scenario.end)]
    window += [
        "--baseline-start",
        iso_z(scenario.baseline_start),
        "--baseline-end",
        iso_z(scenario.baseline_end),
    ]
    summarised = _cli("analyze", "--store", dsn, *window)
    full = _cli("analyze", "--store", dsn, *window, "--no-summaries")
    assert summarised.exit_code == 0 and full.exit_code == 0, summarised.output + full.output
    assert json.loads(summarised.output) == json.loads(full.output)
    [row] = [r for r in json.loads(full.output)["attribution"] if r["verdict"] != "none"]
    assert row["verdict"] == "llm"
