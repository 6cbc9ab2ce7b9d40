"""Run a flavour's app in a subprocess against tailwatch's real OTLP/HTTP receiver on loopback.

::

    with ingested_run("openai_v2", tmp_dir) as run:
        run.store       # a fresh embedded store holding every span the app produced
        run.spans       # those spans as the SDK saw them (the InMemorySpanExporter dump)
        run.baseline, run.current   # (start, end) datetimes of the two phases

The store, pipeline and receivers live in this process (one embedded store per process: the context
manager opens it and closes it on exit, so open no other store inside it); the app — whose
instrumentations patch libraries globally — is the subprocess. Its official OTLP/HTTP exporter sends
the spans when the run ends (``--stream`` in the app sends them during the run instead; see
``apps/base.py``). After the app exits, the pipeline is flushed until the store holds every dumped
(TraceId, SpanId); the count is ``SELECT count() FROM (SELECT DISTINCT TraceId, SpanId FROM
otel_traces)``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings
from storage import Store, ensure_schema, open_store

__all__ = ["REPO_ROOT", "FlavourRun", "dt", "ingested_run", "load_spans", "run_app", "stored_span_count"]

REPO_ROOT = Path(__file__).resolve().parents[2]
DISTINCT_SPANS_SQL = "SELECT count() FROM (SELECT DISTINCT TraceId, SpanId FROM otel_traces)"


def dt(ns: int) -> datetime:
    """An ns timestamp as an aware datetime (exact when ``ns`` is whole microseconds)."""
    return datetime.fromtimestamp(ns // 1000 / 1e6, tz=UTC).replace(microsecond=ns // 1000 % 1_000_000)


@dataclass(frozen=True)
class FlavourRun:
    flavour: str
    store: Store
    spans: list[dict[str, Any]]
    info: dict[str, Any]  # run.json of the app

    @property
    def baseline_ns(self) -> tuple[int, int]:
        lo, hi = self.info["phases"]["baseline"]
        return int(lo), int(hi)

    @property
    def current_ns(self) -> tuple[int, int]:
        lo, hi = self.info["phases"]["current"]
        return int(lo), int(hi)

    @property
    def baseline(self) -> tuple[datetime, datetime]:
        return dt(self.baseline_ns[0]), dt(self.baseline_ns[1])

    @property
    def current(self) -> tuple[datetime, datetime]:
        return dt(self.current_ns[0]), dt(self.current_ns[1])


def load_spans(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def stored_span_count(store: Store) -> int:
    return int(store.query_value(DISTINCT_SPANS_SQL))


def run_app(
    flavour: str,
    otlp_endpoint: str,
    out: Path,
    *,
    requests: int = 30,
    timeout_s: float = 120.0,
    app: str | None = None,
    app_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``tests.integrations.apps.<flavour>`` (or ``tests.integrations.apps.<app>`` with
    ``app_args`` before the common ones) to completion; returns its run.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAILWATCH_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            f"tests.integrations.apps.{app or flavour}",
            *app_args,
            "--otlp",
            otlp_endpoint,
            "--out",
            str(out),
            "--requests",
            str(requests),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    (out / "app.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(
            f"app {flavour} exited {proc.returncode}; stderr tail:\n"
            + "\n".join(proc.stderr.splitlines()[-40:])
        )
    return json.loads((out / "run.json").read_text())


@contextmanager
def ingested_run(
    flavour: str,
    tmp: Path,
    *,
    requests: int = 30,
    wait_s: float = 60.0,
    app: str | None = None,
    app_args: Sequence[str] = (),
) -> Iterator[FlavourRun]:
    """A fresh store and receiver, the flavour's app run against it (``app``, ``app_args``: see
    :func:`run_app`), every dumped span stored."""
    store = open_store("chdb://" + str(tmp / "store"))
    try:
        ensure_schema(store)
        pipeline = IngestPipeline(
            store, PipelineSettings(batch_rows=5_000, flush_interval_s=0.1, spool_dir=tmp / "spool")
        )
        pipeline.start()
        receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
        receivers.start()
        try:
            out = tmp / "app"
            out.mkdir(parents=True, exist_ok=True)
            info = run_app(
                flavour,
                f"http://127.0.0.1:{receivers.http_port}/v1/traces",
                out,
                requests=requests,
                app=app,
                app_args=app_args,
            )
            spans = load_spans(out / "spans.jsonl")
            expected = len({(s["trace_id"], s["span_id"]) for s in spans})
            deadline = time.monotonic() + wait_s
            while True:
                pipeline.flush(10)
                stored = stored_span_count(store)
                if stored >= expected or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if stored != expected:
                raise AssertionError(f"{flavour}: the store holds {stored} spans, the app dumped {expected}")
            yield FlavourRun(flavour=flavour, store=store, spans=spans, info=info)
        finally:
            receivers.stop()
            pipeline.stop(timeout_s=30)
    finally:
        store.close()
