"""demo: simulated AI-product traffic and the end-to-end demo, beside ``bench/``.

Not a stage: the simulator writes the span shapes the real instrumentation libraries write (for the
demo, the benchmarks and the notebooks), and the demo drives every stage through its public surface
and scores the six scenarios from the analysis frames and the labels of the alerts it received.

Usage::

    from demo import Workload, export_otlp_http, run_demo
    Workload(days=3, seed=7).spans()                  # OpenTelemetry SDK spans, in memory
    result = run_demo(out_dir=Path("demo-out"))       # what `tailwatch demo` runs
"""

from demo.generator import (
    FILE_FORMATS,
    SCENARIO_INFO,
    SCENARIOS,
    GeneratorError,
    Scenario,
    Workload,
    export_otlp_http,
    export_to_exporter,
    parse_scenarios,
    write_otlp_file,
)
from demo.scenarios import DEMO_RULES_PATH, DemoError, DemoResult, format_summary, run_demo

__all__ = [
    "DEMO_RULES_PATH",
    "FILE_FORMATS",
    "SCENARIOS",
    "SCENARIO_INFO",
    "DemoError",
    "DemoResult",
    "GeneratorError",
    "Scenario",
    "Workload",
    "export_otlp_http",
    "export_to_exporter",
    "format_summary",
    "parse_scenarios",
    "run_demo",
    "write_otlp_file",
]
