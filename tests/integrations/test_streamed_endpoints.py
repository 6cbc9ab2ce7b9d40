"""Streamed endpoints (issue 35): time to first byte beside total duration, and abandonment read
against it, as FastAPI's instrumentation records a real ``StreamingResponse``.

``apps/streamed_chat.py`` serves ``POST /chat/stream`` (a ``StreamingResponse`` relaying an
``openai.AsyncOpenAI`` stream from the mock provider, one server-sent event per token) and ``POST
/chat`` (JSON once the completion is done) under ``FastAPIInstrumentor`` and openai-v2; streaming
clients that see no body byte within ``STREAM_PATIENCE_S`` disconnect and the app marks the request
abandoned. The spans go over OTLP/HTTP into tailwatch's receiver and, beside that, into an in-memory
exporter whose dump is the truth, computed here without tailwatch:

* a request: a SERVER root, keyed by (``service.name``, span name), in the window by its start;
  duration = end − start;
* its **first byte**: the earliest-starting span of its trace and service with ``asgi.event.type`` =
  ``http.response.body`` (the ASGI instrumentation's ``"<route> http send"`` span, one per
  ``send()``), minus the root's start; **streamed**: two or more such spans;
* ``first_byte_requests``, ``streamed_requests``, ``ttfb_p50_ms``/``ttfb_p99_ms`` (type 7, over the
  requests with a first byte) per operation;
* abandoned: ``tailwatch.abandoned`` = ``"true"`` on the root (or HTTP status 499); per
  ``bucket_ms`` bucket of the operation's abandonment latency — the time to first byte where
  ``abandonment_latency`` says ``first_byte`` (the duration for a request without one), else the
  duration — requests, abandoned and rate; the cliff: among buckets of at least
  ``cliff_min_requests`` requests, the lower edge of the one whose rate rises most over the one
  before it, when that rise is at least ``cliff_min_jump``.

``analyze(...).to_dict()`` must equal it: over the run's window (under the exact horizon) counts
exactly and percentiles to 1e-6, with ``abandonment_latency`` first_byte for ``/chat/stream`` and
without; over whole minutes around the run, after :func:`analytics.build_summaries`, with a
one-minute ``exact_horizon`` (the per-minute aggregates) counts, buckets and cliffs exactly and
percentiles within the sketch's 0.5%.

What the instrumentation writes (FastAPI/ASGI instrumentation 0.66b2, Starlette 1.10, uvicorn 0.55,
openai-v2 2.4b0), pinned by :data:`SPAN_FACTS`: per request one ``http receive`` span
(``http.request``) under the SERVER root; ``/chat`` sends ``http.response.start`` then one
``http.response.body``, both children of the root; ``/chat/stream`` sends ``http.response.start``,
one body per relayed token and a last empty one — **children of openai-v2's ``chat`` span, not of the
root** (openai-v2 leaves its call's span current in the request's context while the stream is open,
and Starlette runs the response in a task that copies that context), beside the ``http.disconnect``
receive span Starlette's disconnect listener opens. A first byte is therefore looked for in the whole
trace, not among the root's children.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analytics import Conventions, analyze, build_summaries
from tests.integrations.apps.streamed_chat import ABANDONED_ATTRIBUTE, SERVICE, STREAM_PATIENCE_S
from tests.integrations.ingest import FlavourRun, dt, ingested_run

STREAM_OP, CHAT_OP = "POST /chat/stream", "POST /chat"
REQUESTS = 160  # /chat/stream requests (and 64 /chat): about 22 s of load
FIRST_BYTE_ATTRIBUTE, FIRST_BYTE_EVENTS = "asgi.event.type", frozenset({"http.response.body"})
BUCKET_MS = 100
# Small buckets (100 ms) of a few dozen requests: the cliff needs 10 of them.
BASE = {"bucket_ms": BUCKET_MS, "cliff_min_requests": 10}
BY_FIRST_BYTE = (("*", STREAM_OP, "first_byte"),)
EXACT_REL = 1e-6  # percentiles of a window under the exact horizon
SKETCH_REL = 0.005  # … read from the per-minute aggregates

Span = Mapping[str, Any]

# (operation, span name, asgi.event.type, parent's name and kind) of every ASGI span.
SPAN_FACTS: frozenset[tuple[str, str, str, tuple[str, str]]] = frozenset(
    {
        (CHAT_OP, "POST /chat http receive", "http.request", (CHAT_OP, "SERVER")),
        (CHAT_OP, "POST /chat http send", "http.response.start", (CHAT_OP, "SERVER")),
        (CHAT_OP, "POST /chat http send", "http.response.body", (CHAT_OP, "SERVER")),
        (STREAM_OP, "POST /chat/stream http receive", "http.request", (STREAM_OP, "SERVER")),
        (STREAM_OP, "POST /chat/stream http receive", "http.disconnect", ("chat gpt-4o-mini", "CLIENT")),
        (STREAM_OP, "POST /chat/stream http send", "http.response.start", ("chat gpt-4o-mini", "CLIENT")),
        (STREAM_OP, "POST /chat/stream http send", "http.response.body", ("chat gpt-4o-mini", "CLIENT")),
    }
)


# --- the truth, from the spans ------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    trace_id: str
    operation: str
    start_ns: int
    duration_ms: float
    first_byte_ms: float | None
    body_sends: int
    abandoned: bool


def _requests(spans: Sequence[Span]) -> list[Request]:
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_trace[s["trace_id"]].append(s)
    out = []
    for trace_spans in by_trace.values():
        for root in trace_spans:
            if root["parent_span_id"] or root["kind"] != "SERVER":
                continue
            service = root["resource"].get("service.name")
            sends = sorted(
                s["start_ns"]
                for s in trace_spans
                if s["resource"].get("service.name") == service
                and s["attributes"].get(FIRST_BYTE_ATTRIBUTE) in FIRST_BYTE_EVENTS
            )
            status = root["attributes"].get(
                "http.response.status_code", root["attributes"].get("http.status_code")
            )
            out.append(
                Request(
                    trace_id=root["trace_id"],
                    operation=root["name"],
                    start_ns=root["start_ns"],
                    duration_ms=(root["end_ns"] - root["start_ns"]) / 1e6,
                    first_byte_ms=(sends[0] - root["start_ns"]) / 1e6 if sends else None,
                    body_sends=len(sends),
                    abandoned=str(root["attributes"].get(ABANDONED_ATTRIBUTE, "")).lower() == "true"
                    or str(status) == "499",
                )
            )
    return out


def _quantile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q * 100, method="linear")) if values else None


def _in(requests: Sequence[Request], window: tuple[int, int]) -> list[Request]:
    return [r for r in requests if window[0] <= r.start_ns < window[1]]


def _hot_path_truth(requests: Sequence[Request]) -> dict[str, dict[str, Any]]:
    out = {}
    for op in sorted({r.operation for r in requests}):
        rows = [r for r in requests if r.operation == op]
        ttfb = [r.first_byte_ms for r in rows if r.first_byte_ms is not None]
        out[op] = {
            "requests": len(rows),
            "first_byte_requests": len(ttfb),
            "streamed_requests": sum(r.body_sends >= 2 for r in rows),
            "ttfb_p50_ms": _quantile(ttfb, 0.5),
            "ttfb_p99_ms": _quantile(ttfb, 0.99),
            "p50_ms": _quantile([r.duration_ms for r in rows], 0.5),
            "p99_ms": _quantile([r.duration_ms for r in rows], 0.99),
        }
    return out


def _latency_ms(r: Request, by_first_byte: bool) -> float:
    return r.first_byte_ms if by_first_byte and r.first_byte_ms is not None else r.duration_ms


def _abandonment_truth(
    requests: Sequence[Request], first_byte_ops: frozenset[str]
) -> dict[str, dict[str, Any]]:
    """Per operation: what its buckets read, the buckets (lo, hi, requests, abandoned, rate) and the cliff."""
    out = {}
    for op in sorted({r.operation for r in requests}):
        by_first_byte = op in first_byte_ops
        counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for r in requests:
            if r.operation == op:
                bucket = int(_latency_ms(r, by_first_byte) // BUCKET_MS)
                counts[bucket][0] += 1
                counts[bucket][1] += r.abandoned
        buckets = [(b * BUCKET_MS, (b + 1) * BUCKET_MS, n, a, a / n) for b, (n, a) in sorted(counts.items())]
        out[op] = {
            "latency": "first_byte" if by_first_byte else "duration",
            "buckets": buckets,
            "cliff_ms": _cliff(buckets),
        }
    return out


def _cliff(buckets: Sequence[tuple[int, int, int, int, float]]) -> int | None:
    conv = Conventions(**BASE)
    eligible = [b for b in buckets if b[2] >= conv.cliff_min_requests]
    jumps = [(cur[4] - prev[4], cur[0]) for prev, cur in pairwise(eligible)]
    best: tuple[float, int] | None = None
    for jump, lo in jumps:  # the first of equal rises
        if best is None or jump > best[0]:
            best = (jump, lo)
    if best is None or best[0] < conv.cliff_min_jump or best[0] <= 0:
        return None
    return best[1]


# --- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlavourRun]:
    tmp: Path = tmp_path_factory.mktemp("streamed-chat")
    with ingested_run("streamed_chat", tmp, requests=REQUESTS, app="streamed_chat") as run:
        yield run


@pytest.fixture(scope="module")
def requests(chat_run: FlavourRun) -> list[Request]:
    return _requests(chat_run.spans)


def _analysis(run: FlavourRun, start: datetime, end: datetime, **conventions: Any) -> dict[str, Any]:
    return analyze(run.store, start, end, conventions=Conventions(**BASE, **conventions)).to_dict()


@pytest.fixture(scope="module")
def exact(chat_run: FlavourRun) -> dict[str, dict[str, Any]]:
    """The run's window (under the exact horizon), abandonment by duration and by first byte."""
    start, end = chat_run.current
    return {
        "duration": _analysis(chat_run, start, end),
        "first_byte": _analysis(chat_run, start, end, abandonment_latency=BY_FIRST_BYTE),
    }


def _floor_minute(ns: int) -> datetime:
    return dt(ns).replace(second=0, microsecond=0)


@pytest.fixture(scope="module")
def aggregated(chat_run: FlavourRun, exact: dict[str, Any]) -> tuple[tuple[int, int], dict[str, Any]]:
    """Whole minutes around the run, longer than a one-minute exact horizon: read from the per-minute
    aggregates once the minutes are summarised (after the exact analyses, which read the spans)."""
    lo = _floor_minute(chat_run.current_ns[0])
    hi = _floor_minute(chat_run.current_ns[1]) + timedelta(minutes=2)
    # Series of whole minutes too (three buckets over two or three minutes): the aggregates serve
    # only windows whose series buckets are whole minutes.
    conv = Conventions(
        **BASE, abandonment_latency=BY_FIRST_BYTE, exact_horizon=timedelta(minutes=1), series_buckets=3
    )
    build_summaries(chat_run.store, until=hi, conventions=conv)
    window = (int(lo.timestamp()) * 10**9, int(hi.timestamp()) * 10**9)
    return window, analyze(chat_run.store, lo, hi, conventions=conv).to_dict()


# --- comparisons ---------------------------------------------------------------------------------
def _hot_rows(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    rows = {row["operation"]: row for row in result["hot_path"] if row["service"] == SERVICE}
    assert len(rows) == len(result["hot_path"]), result["hot_path"]
    return rows


def _hot_problems(
    got: Mapping[str, Mapping[str, Any]], want: Mapping[str, Mapping[str, Any]], rel: float
) -> list[str]:
    out = []
    assert set(got) == set(want), (sorted(got), sorted(want))
    for op, fields in want.items():
        for field, value in fields.items():
            mine = got[op].get(field, "absent")
            if isinstance(value, float) and isinstance(mine, float):
                ok = math.isclose(mine, value, rel_tol=rel)
            else:
                ok = mine == value
            if not ok:
                out.append(f"{op} {field}: tailwatch {mine!r}, spans {value!r}")
    return out


def _abandonment_rows(result: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for row in result["abandonment"]:
        assert row["service"] == SERVICE and row["bucket_ms"] == BUCKET_MS, row
        buckets = [(b["lo_ms"], b["hi_ms"], b["requests"], b["abandoned"], b["rate"]) for b in row["buckets"]]
        out[row["operation"]] = {
            "latency": row.get("latency", "absent"),
            "buckets": buckets,
            "cliff_ms": row["cliff_ms"],
        }
    return out


def _same_abandonment(got: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    out = []
    assert set(got) == set(want), (sorted(got), sorted(want))
    for op in want:
        for field in ("latency", "cliff_ms"):
            if got[op][field] != want[op][field]:
                out.append(f"{op} {field}: tailwatch {got[op][field]!r}, spans {want[op][field]!r}")
        g, w = got[op]["buckets"], want[op]["buckets"]
        if [b[:4] for b in g] != [b[:4] for b in w] or not all(
            math.isclose(a[4], b[4], rel_tol=1e-12) for a, b in zip(g, w, strict=True)
        ):
            out.append(f"{op} buckets:\n  tailwatch {g}\n  spans     {w}")
    return out


# --- tests ---------------------------------------------------------------------------------------
def test_what_the_instrumentation_writes(chat_run: FlavourRun) -> None:
    """Every ASGI span's name, event and parent are those of :data:`SPAN_FACTS`; a /chat request
    sends one body, a completed /chat/stream request one per token the model generated (its chat
    span's output tokens) and a last empty one."""
    spans = chat_run.spans
    by_id = {(s["trace_id"], s["span_id"]): s for s in spans}
    roots = {s["trace_id"]: s for s in spans if not s["parent_span_id"]}
    seen = set()
    for s in spans:
        event = s["attributes"].get("asgi.event.type")
        if event is not None:
            parent = by_id[(s["trace_id"], s["parent_span_id"])]
            seen.add((roots[s["trace_id"]]["name"], s["name"], event, (parent["name"], parent["kind"])))
    assert seen == SPAN_FACTS
    for r in _requests(spans):
        if r.operation == CHAT_OP:
            assert r.body_sends == 1 and not r.abandoned, r
        elif not r.abandoned:
            (call,) = [s for s in spans if s["trace_id"] == r.trace_id and s["kind"] == "CLIENT"]
            assert r.body_sends == call["attributes"]["gen_ai.usage.output_tokens"] + 1, r


def test_the_run_has_what_the_checks_need(chat_run: FlavourRun, requests: list[Request]) -> None:
    """Requests of both kinds in the window; some streaming clients gave up (as many abandoned
    requests as the driver counted), some of them before any body byte (those are read by their
    duration) — how many depends on the machine's load, as a first byte sent after its client left
    is still recorded; the others streamed."""
    window = _in(requests, chat_run.current_ns)
    outcomes = chat_run.info["outcomes"]
    streams = [r for r in window if r.operation == STREAM_OP]
    abandoned = [r for r in streams if r.abandoned]
    assert len(streams) == REQUESTS and len([r for r in window if r.operation == CHAT_OP]) > 0
    assert len(abandoned) == outcomes.get("/chat/stream abandoned", 0) >= 5, outcomes
    assert any(r.first_byte_ms is None for r in abandoned), abandoned
    assert all(r.body_sends >= 2 for r in streams if not r.abandoned)
    # A completed stream sent a first byte, nearly always within its client's patience: the client
    # waits for the headers without that timer, so on a loaded machine a late answer whose first
    # body bytes came with its headers still completes.
    completed = [r.first_byte_ms for r in streams if not r.abandoned]
    assert all(ms is not None for ms in completed), completed
    in_time = sum(ms is not None and ms < STREAM_PATIENCE_S * 1000 for ms in completed)
    assert in_time >= 0.9 * len(completed), sorted(ms for ms in completed if ms is not None)[-10:]


def test_hot_path_reports_time_to_first_byte(
    chat_run: FlavourRun, requests: list[Request], exact: dict[str, Any]
) -> None:
    """Counts exact, percentiles to 1e-6 (exact type-7), for both operations; the streamed endpoint's
    p99 time to first byte is well below its p99 duration; /chat is not streamed."""
    want = _hot_path_truth(_in(requests, chat_run.current_ns))
    for result in exact.values():
        got = _hot_rows(result)
        assert not (problems := _hot_problems(got, want, EXACT_REL)), "\n".join(problems)
    stream, chat = want[STREAM_OP], want[CHAT_OP]
    assert stream["ttfb_p99_ms"] < 0.5 * stream["p99_ms"], stream
    assert stream["streamed_requests"] > 0 and chat["streamed_requests"] == 0
    assert chat["first_byte_requests"] == chat["requests"]


def test_hot_path_from_the_aggregates(
    chat_run: FlavourRun, requests: list[Request], aggregated: tuple[tuple[int, int], dict[str, Any]]
) -> None:
    """A window longer than the exact horizon, read from the per-minute aggregates: counts exact,
    percentiles within the sketch's 0.5%."""
    window, result = aggregated
    want = _hot_path_truth(_in(requests, window))
    got = _hot_rows(result)
    assert not (problems := _hot_problems(got, want, SKETCH_REL)), "\n".join(problems)
    # The sketches' figures, not the exact ones: the aggregates were read.
    assert _hot_problems(got, want, EXACT_REL), (got, want)


def test_abandonment_by_first_byte(
    chat_run: FlavourRun, requests: list[Request], exact: dict[str, Any]
) -> None:
    """With ``abandonment_latency`` first_byte for /chat/stream its buckets and cliff are by time to
    first byte; /chat's stay by duration; without the setting both are by duration — and the two
    bucketings of /chat/stream differ."""
    window = _in(requests, chat_run.current_ns)
    by_first_byte = _abandonment_truth(window, frozenset({STREAM_OP}))
    by_duration = _abandonment_truth(window, frozenset())
    assert by_first_byte[STREAM_OP]["buckets"] != by_duration[STREAM_OP]["buckets"]
    problems = _same_abandonment(_abandonment_rows(exact["first_byte"]), by_first_byte)
    problems += _same_abandonment(_abandonment_rows(exact["duration"]), by_duration)
    assert not problems, "\n".join(problems)


def test_abandonment_by_first_byte_from_the_aggregates(
    requests: list[Request], aggregated: tuple[tuple[int, int], dict[str, Any]]
) -> None:
    window, result = aggregated
    want = _abandonment_truth(_in(requests, window), frozenset({STREAM_OP}))
    problems = _same_abandonment(_abandonment_rows(result), want)
    assert not problems, "\n".join(problems)
