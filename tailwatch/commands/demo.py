"""``tailwatch demo``: simulated AI traffic through the whole pipeline, ending in alerts and dashboards."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click
from tqdm import tqdm

from demo import format_summary, parse_scenarios, run_demo
from tailwatch.commands._common import EXIT_PROBLEM, ISO_TIME
from tailwatch.commands.generate import SCENARIO_HELP
from tailwatch.config import STORE_ENV


@click.command("demo")
@click.option(
    "--store",
    "store_dsn",
    metavar="DSN",
    envvar=STORE_ENV,
    default=None,
    help=f"Use this store, not wiped (the demo's spans land in their own time range) [env {STORE_ENV}; "
    "default: OUT/store, wiped first].",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="alerts.jsonl, dashboards/, summary.json and (without --store) the store go here.",
)
@click.option(
    "--scale", type=click.FloatRange(min=0.01, max=1000), default=1.0, show_default=True, help="Traffic x N."
)
@click.option("--scenario", "scenario_names", multiple=True, metavar="NAME", help=SCENARIO_HELP)
@click.option("--seed", type=int, default=7, show_default=True, help="Same seed, same traffic.")
@click.option("--end", "end", type=ISO_TIME, default=None, help="End of the simulated period [default: now].")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def demo(
    store_dsn: str | None,
    out_dir: Path,
    scale: float,
    scenario_names: tuple[str, ...],
    seed: int,
    end: datetime | None,
    quiet: bool,
) -> None:
    """Run tailwatch end to end on simulated traffic: OTLP in, analysis, alerts, dashboards.

    Three simulated days of an AI product (chat, assistant, search, support bot, a document
    summary queue, an agent workflow) are sent over OTLP/HTTP to an in-process receiver; the last
    day is analysed against the day before, the demo rules fire, the alerts go to a local webhook
    (OUT/alerts.jsonl) and the dashboards to OUT/dashboards/. Without --store the embedded store
    OUT/store is wiped first.

    The demo reads no configuration file: its store, rules and webhook are its own, so a
    tailwatch.toml in the working directory never points it at a real store. Exits 1 when a
    scenario did not raise its expected alert.
    """
    scenarios = parse_scenarios(scenario_names or None)
    bars: list[tqdm[None]] = []

    def progress(total_traces: int) -> tqdm[None]:
        bar: tqdm[None] = tqdm(
            total=total_traces, unit="trace", desc="generate + export", disable=quiet, leave=False
        )
        bars.append(bar)
        return bar

    try:
        result = run_demo(
            out_dir=out_dir,
            store_dsn=store_dsn,
            scenarios=scenarios,
            scale=scale,
            seed=seed,
            end=end,
            progress=progress,
            echo=click.echo,
        )
    finally:
        for bar in bars:
            bar.close()
    click.echo("")
    click.echo(format_summary(result))
    click.echo("")
    t = result.timings
    click.echo(
        "timings: "
        + ", ".join(f"{step} {seconds:.1f} s" for step, seconds in t.items())
        + f"; {result.spans:,} spans"
    )
    click.echo(
        f"alerts: {result.out_dir / 'alerts.jsonl'} ({result.alerts_delivered} delivered); "
        f"dashboards: {result.out_dir / 'dashboards' / 'index.html'}"
    )
    sys.stdout.flush()
    if not result.ok:
        # The demo ran; its check failed (exit 1, like any command that finds a problem).
        click.echo(
            "tailwatch: some scenarios did not raise their expected alert (see the table above)", err=True
        )
        sys.exit(EXIT_PROBLEM)
