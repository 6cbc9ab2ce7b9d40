"""The same spans in every trace-table layout users arrive with give the same analysis.

Each store's ``otel_traces`` is created from its upstream DDL (tests/collectors/tables/) and filled
the way the writer of that layout fills it: the Map layouts through a plain columnar INSERT, the
JSON layout through ``INSERT … FORMAT JSONEachRow`` with typed attribute values and the key lists
the Collector's JSON exporter writes beside them. The analysis of the table tailwatch creates
itself is the reference; every other layout must give the identical JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from analytics import analyze
from collectors import SpanRow, insert_spans, inspect_traces
from storage import Store, ensure_schema, open_store
from tests.analytics.builders import (
    Scenario,
    scenario_cold_queues,
    scenario_flag_split,
    scenario_llm_regression,
    scenario_retries,
)
from tests.collectors.tables import create_variant

_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")


def _typed(attributes: dict[str, str]) -> dict[str, Any]:
    # The Collector's JSON exporter writes attribute values with their OTLP type: integers as
    # numbers. Our spans carry strings; integer-looking ones go in as numbers, as an SDK's int
    # attribute would.
    return {k: int(v) if _INT.fullmatch(v) else v for k, v in attributes.items()}


def _iso(ns: int) -> str:
    seconds, frac = divmod(ns, 1_000_000_000)
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S") + f".{frac:09d}"


def _resource(span: SpanRow) -> dict[str, str]:
    # As insert_spans writes it: service.name in the resource attributes too.
    return (
        {"service.name": span.service, **span.resource_attributes}
        if span.service
        else dict(span.resource_attributes)
    )


def _json_rows(spans: list[SpanRow], *, with_keys: bool) -> bytes:
    lines = []
    for s in spans:
        row: dict[str, Any] = {
            "Timestamp": _iso(s.start_ns),
            "TraceId": s.trace_id,
            "SpanId": s.span_id,
            "ParentSpanId": s.parent_span_id,
            "TraceState": s.trace_state,
            "SpanName": s.name,
            "SpanKind": s.kind,
            "ServiceName": s.service,
            "ResourceAttributes": _typed(_resource(s)),
            "ScopeName": s.scope_name,
            "ScopeVersion": s.scope_version,
            "SpanAttributes": _typed(dict(s.attributes)),
            "Duration": s.duration_ns,
            "StatusCode": s.status_code,
            "StatusMessage": s.status_message,
            "Events.Timestamp": [_iso(e.timestamp_ns) for e in s.events],
            "Events.Name": [e.name for e in s.events],
            "Events.Attributes": [_typed(dict(e.attributes)) for e in s.events],
            "Links.TraceId": [link.trace_id for link in s.links],
            "Links.SpanId": [link.span_id for link in s.links],
            "Links.TraceState": [link.trace_state for link in s.links],
            "Links.Attributes": [_typed(dict(link.attributes)) for link in s.links],
        }
        if with_keys:
            row["ResourceAttributesKeys"] = sorted(_resource(s))
            row["SpanAttributesKeys"] = sorted(s.attributes)
        lines.append(json.dumps(row))
    return ("\n".join(lines) + "\n").encode()


def _fill(store: Store, spans: list[SpanRow]) -> None:
    layout = inspect_traces(store, refresh=True)
    if not layout.json:
        insert_spans(store, spans)
        return
    with_keys = "SpanAttributesKeys" in layout.extra_columns
    data = _json_rows(spans, with_keys=with_keys)
    columns = list(json.loads(data.split(b"\n", 1)[0]))
    store.client.raw_insert(
        store.table("otel_traces"),
        columns,
        data,
        fmt="JSONEachRow",
        settings={"input_format_import_nested_json": 0},
    )


def _dataset() -> tuple[list[SpanRow], Scenario]:
    """Several scenarios in one store: hot-path requests with LLM calls and a regression, queued
    jobs, workflow retries and flag evaluations (as attributes and as events), so every read of
    the analysis has rows to read."""
    parts = [scenario_llm_regression(requests=150), scenario_cold_queues(jobs=150), scenario_retries(runs=60)]
    parts.append(scenario_flag_split(requests=300))
    spans = [span for part in parts for span in part.spans]
    start = min(p.start for p in parts)
    end = max(p.end for p in parts)
    window = end - start
    return spans, Scenario(
        spans=spans, start=start, end=end, baseline_start=start - window, baseline_end=start
    )


@pytest.fixture(scope="module")
def dataset() -> tuple[list[SpanRow], Scenario]:
    return _dataset()


def _analysis_json(store: Store, scenario: Scenario) -> dict[str, Any]:
    analysis = analyze(
        store,
        scenario.start,
        scenario.end,
        baseline_start=scenario.baseline_start,
        baseline_end=scenario.baseline_end,
    )
    return json.loads(analysis.to_json())


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, dataset: tuple[list[SpanRow], Scenario]
) -> dict[str, Any]:
    spans, scenario = dataset
    store = open_store("chdb://" + str(tmp_path_factory.mktemp("reference") / "store"))
    try:
        ensure_schema(store)
        insert_spans(store, spans)
        result = _analysis_json(store, scenario)
    finally:
        store.close()
    return result


@pytest.fixture
def variant_store(tmp_path: Path) -> Iterator[Store]:
    store = open_store("chdb://" + str(tmp_path / "store"))
    try:
        yield store
    finally:
        store.close()


def test_reference_reads_every_kind_of_row(reference: dict[str, Any]) -> None:
    # The comparison below means something only if each read returned rows.
    assert reference["hot_path"], "no hot-path rows"
    assert reference["cold_path"], "no cold-path rows"
    assert reference["retry_amplification"], "no workflow rows"
    assert reference["attribution"], "no attribution rows"
    assert reference["llm_calls"], "no LLM call rows"
    assert reference["slices"], "no flag slices"


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("collector_2024", "collector"),
        ("collector_2026", "collector-2026"),
        ("collector_json", "collector-json"),
        ("clickstack", "clickstack"),
    ],
)
def test_every_layout_gives_the_reference_analysis(
    variant: str,
    expected: str,
    variant_store: Store,
    dataset: tuple[list[SpanRow], Scenario],
    reference: dict[str, Any],
) -> None:
    spans, scenario = dataset
    create_variant(variant_store, variant)
    # The spans are from a fixed date in the past: the upstream TTLs would drop them.
    variant_store.command("ALTER TABLE otel_traces REMOVE TTL")
    layout = inspect_traces(variant_store, refresh=True)
    assert layout.variant == expected
    assert not layout.missing_columns
    _fill(variant_store, spans)
    stored = variant_store.query_value("SELECT count() FROM otel_traces")
    assert stored == len(spans)
    got = _analysis_json(variant_store, scenario)
    for section in reference:
        assert got[section] == reference[section], f"{variant}: section {section} differs"


def test_json_reads_span_attributes_by_path(
    variant_store: Store, dataset: tuple[list[SpanRow], Scenario]
) -> None:
    spans, scenario = dataset
    create_variant(variant_store, "collector_json")
    variant_store.command("ALTER TABLE otel_traces REMOVE TTL")
    _fill(variant_store, spans[:200])
    layout = inspect_traces(variant_store, refresh=True)
    sql = layout.adapt(
        "SELECT SpanAttributes.values[indexOf(SpanAttributes.keys, {k:String})] AS v, "
        "has(SpanAttributes.keys, {k:String}) AS present FROM otel_traces ORDER BY SpanId"
    )
    rows = variant_store.query_rows(sql, {"k": "gen_ai.operation.name"})
    expected = sorted((s.span_id, s.attributes.get("gen_ai.operation.name", "")) for s in spans[:200])
    assert [(v, present) for v, present in rows] == [(v, v != "") for _, v in expected]
    assert any(v for _, v in expected)
    assert scenario.end - scenario.start > timedelta(0)
