"""``tailwatch generate``: the demo's simulated traffic written as OTLP files."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click
from tqdm import tqdm

from demo import FILE_FORMATS, SCENARIOS, Workload, parse_scenarios, write_otlp_file
from tailwatch.commands._common import ISO_TIME

SCENARIO_HELP = (
    f"Scenario to switch on (repeatable or comma-separated): {', '.join(SCENARIOS)}; "
    "'all' (the default) or 'none' for healthy traffic only."
)


@click.command("generate")
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="File to write: *.jsonl[.gz] = OTLP/JSON lines, anything else (*.pb[.gz]) = OTLP protobuf.",
)
@click.option("--scale", type=click.FloatRange(min=0.01, max=1000), default=1.0, show_default=True)
@click.option("--scenario", "scenario_names", multiple=True, metavar="NAME", help=SCENARIO_HELP)
@click.option("--seed", type=int, default=7, show_default=True, help="Same seed, same spans.")
@click.option("--end", "end", type=ISO_TIME, default=None, help="End of the simulated period [default: now].")
@click.option("--days", type=click.IntRange(min=2, max=60), default=3, show_default=True)
@click.option("--format", "file_format", type=click.Choice(FILE_FORMATS), help="Override the extension.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def generate(
    out: Path,
    scale: float,
    scenario_names: tuple[str, ...],
    seed: int,
    end: datetime | None,
    days: int,
    file_format: str | None,
    quiet: bool,
) -> None:
    """Write simulated AI-product traffic (the demo's scenarios) as OTLP files for `tailwatch ingest`."""
    scenarios = parse_scenarios(scenario_names or None)
    workload = Workload(scenarios, scale=scale, seed=seed, end=end, days=days)
    with tqdm(
        total=workload.estimated_traces(), unit="trace", desc="generate", disable=quiet, leave=False
    ) as bar:
        stats = write_otlp_file(
            workload,
            out,
            file_format=None if file_format is None else FILE_FORMATS[FILE_FORMATS.index(file_format)],
            progress=bar.update,
        )
    tl = workload.timeline
    click.echo(
        f"wrote {stats.spans} spans to {out} in {stats.seconds:.1f} s ({stats.spans_per_s:,.0f} spans/s); "
        f"period {tl.start.isoformat()} .. {tl.end.isoformat()}, "
        f"scenarios: {', '.join(workload.scenarios) or 'none'}"
    )
