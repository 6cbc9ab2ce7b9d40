"""The ground truth of the integration tests, computed in pure Python from the spans the SDK produced.

Nothing here imports tailwatch: these are the definitions the analytics must meet, written out
independently, over the span dump of an app run (``apps/base.py``: one dict per span with ``trace_id``,
``span_id``, ``parent_span_id``, ``name``, ``kind``, ``start_ns``, ``end_ns``, ``attributes``,
``status``, ``links``, ``resource``). Windows are ``[lo, hi)`` in ns; percentiles are type 7
(``numpy.quantile(method="linear")``), as tailwatch computes them.

Definitions:

- **Request**: a root span (no parent) of kind SERVER, keyed by (resource ``service.name``, span
  name), in a window by its start.
- **LLM span**: ``gen_ai.operation.name`` or ``llm.request.type`` in :data:`LLM_OPERATIONS`; or
  ``openinference.span.kind`` in {LLM, EMBEDDING}; or ``gen_ai.operation.name=invoke_agent`` of kind
  CLIENT. Provider: first non-empty of ``gen_ai.provider.name``, ``gen_ai.system``, ``llm.provider``,
  ``llm.system``, lowercased, ``azure`` → ``azure.ai.openai``. Model: first non-empty of
  ``gen_ai.request.model``, ``gen_ai.response.model``, ``llm.model_name``. Tokens: input (first of
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.prompt_tokens``, ``llm.token_count.prompt``) + output
  (first of ``gen_ai.usage.output_tokens``, ``gen_ai.usage.completion_tokens``,
  ``llm.token_count.completion``); any span may carry them.
- **Boundary span** (the cold side of a queue): kind CONSUMER, or ``messaging.operation.type`` /
  ``messaging.operation`` in {process, receive}.
- **Logical LLM call**: same-name LLM spans under one parent, by start; a span continues the previous
  one's call only when that one failed and it starts at or after it ended (an application calling
  again after the SDK gave up). Its provider and model: the first non-empty among its spans.
- **Synchronous LLM call** of a request: a logical call of its trace whose first span's parent chain
  reaches the SERVER root without passing a boundary span.
- **Attempts** of an LLM call: its direct CLIENT children carrying ``http.method`` or
  ``http.request.method``; with none, the LLM span itself is the one attempt. Failed: status ERROR
  or HTTP status (``http.response.status_code`` / ``http.status_code``) ≥ 400 (the one attempt: the
  LLM span's status ERROR, ``error.type``, or HTTP status ≥ 400). Throttled: HTTP status 429. Backoff:
  Σ over consecutive HTTP attempts (by start) of max(0, next start − previous end).
- **Workflow**: a trace's earliest workflow span (``gen_ai.operation.name`` invoke_workflow, or
  invoke_agent when not CLIENT; ``traceloop.span.kind`` workflow/agent; ``openinference.span.kind``
  AGENT/CHAIN), named by ``gen_ai.workflow.name``, ``gen_ai.agent.name``,
  ``traceloop.workflow.name``, ``traceloop.entity.name``, else the span name; in a window by its
  start. Hops: the names of its direct children. Same-name children by start: a child continues the
  previous child's call only when that one failed (status ERROR, HTTP status ≥ 400, or
  ``error.type``) and this one starts at or after it ended. Attempts of a call: its sibling spans +
  Σ over LLM spans in their subtrees of (HTTP attempts − 1). Tokens: Σ over every span of the
  subtrees. ``attempt_amplification`` = Σ attempts / Σ calls; ``token_amplification`` = Σ tokens /
  Σ tokens of each call's final (latest-starting) sibling's subtree.
- **Model-call anatomy** (per provider, model, over the logical LLM calls whose first span starts in
  the window; each call read off its last span, the one that answered): ``calls``;
  ``streamed_calls``: calls whose span says it streamed — ``gen_ai.request.stream``,
  ``gen_ai.is_streaming`` or ``llm.is_streaming`` true, ``"stream": true`` in the JSON of
  ``llm.invocation_parameters``, or a time to first token; **TTFT** (ms): the first of
  :data:`TTFT_ATTRIBUTES` (seconds), else the time of the first event named in :data:`TTFT_EVENTS`
  minus the span's start; ``ttft_p50_ms``/``ttft_p99_ms`` over calls with one, ``ttft_source``
  ``attribute`` when any call has one, else None (tailwatch may then estimate it);
  ``ms_per_output_token_p50``: p50 over calls with a TTFT and output tokens of (duration − TTFT) /
  output tokens; ``input_tokens_p50``/``output_tokens_p50`` over calls carrying them;
  ``cached_input_ratio``: Σ cached input tokens (:data:`CACHED_INPUT_TOKENS`) / Σ input tokens over
  calls carrying input tokens, None when no call carries a cached count.
- **Queued job**: PRODUCER spans sharing ``messaging.message.id`` (one without is its own job);
  queue: ``messaging.destination.name``, ``messaging.destination``, else the span name. Runs: boundary
  spans linking to one of its producers or, without links, parented by one. Enqueued: earliest
  producer start. Ready: end of the latest successful run (status not ERROR, ``celery.state`` not
  FAILURE/RETRY), else the latest run end; no run: pending. Per queue over jobs enqueued in the
  window: jobs, completed, pending, runs, p50/p99 of enqueue→ready (s) over completed jobs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

import numpy as np

__all__ = ["LLM_OPERATIONS", "Truth", "quantile", "streamed", "ttft_ms"]

Span = Mapping[str, Any]

LLM_OPERATIONS = frozenset(
    {"chat", "text_completion", "completion", "generate_content", "embeddings", "embedding"}
)
OPENINFERENCE_LLM_KINDS = frozenset({"LLM", "EMBEDDING"})
WORKFLOW_OPERATIONS = frozenset({"invoke_workflow", "invoke_agent"})
TRACELOOP_WORKFLOW_KINDS = frozenset({"workflow", "agent"})
OPENINFERENCE_WORKFLOW_KINDS = frozenset({"AGENT", "CHAIN"})
CONSUMER_OPERATIONS = frozenset({"process", "receive"})
FAILED_RUN_STATES = frozenset({"FAILURE", "RETRY"})

PROVIDER_ATTRIBUTES = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")
MODEL_ATTRIBUTES = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
INPUT_TOKENS = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_TOKENS = ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion")
WORKFLOW_NAME_ATTRIBUTES = (
    "gen_ai.workflow.name",
    "gen_ai.agent.name",
    "traceloop.workflow.name",
    "traceloop.entity.name",
)
TTFT_ATTRIBUTES = (
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.response.time_to_first_token",
    "gen_ai.latency.time_to_first_token",
)
TTFT_EVENTS = ("gen_ai.content.completion.chunk", "First Token Stream Event", "llm.content.completion.chunk")
CACHED_INPUT_TOKENS = ("gen_ai.usage.cache_read.input_tokens", "llm.token_count.prompt_details.cache_read")
STREAM_ATTRIBUTES = ("gen_ai.request.stream", "gen_ai.is_streaming", "llm.is_streaming")
HTTP_STATUS_ATTRIBUTES = ("http.response.status_code", "http.status_code")
HTTP_METHOD_ATTRIBUTES = ("http.method", "http.request.method")


def quantile(values: Iterable[float], q: float) -> float | None:
    arr = np.asarray(list(values), dtype=float)
    return float(np.quantile(arr, q, method="linear")) if arr.size else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


# --- span predicates ---------------------------------------------------------------------------
def attr(span: Span, *keys: str) -> Any:
    """The first of ``keys`` the span carries with a non-empty value, else None."""
    attributes = span["attributes"]
    for key in keys:
        value = attributes.get(key)
        if value is not None and value != "":
            return value
    return None


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def http_status(span: Span) -> int | None:
    value = attr(span, *HTTP_STATUS_ATTRIBUTES)
    return _int(value) if value is not None else None


def is_llm(span: Span) -> bool:
    op = attr(span, "gen_ai.operation.name")
    if op in LLM_OPERATIONS or attr(span, "llm.request.type") in LLM_OPERATIONS:
        return True
    if attr(span, "openinference.span.kind") in OPENINFERENCE_LLM_KINDS:
        return True
    return op == "invoke_agent" and span["kind"] == "CLIENT"


def is_workflow(span: Span) -> bool:
    op = attr(span, "gen_ai.operation.name")
    if op == "invoke_workflow" or (op == "invoke_agent" and span["kind"] != "CLIENT"):
        return True
    return (
        attr(span, "traceloop.span.kind") in TRACELOOP_WORKFLOW_KINDS
        or attr(span, "openinference.span.kind") in OPENINFERENCE_WORKFLOW_KINDS
    )


def workflow_name(span: Span) -> str:
    return str(attr(span, *WORKFLOW_NAME_ATTRIBUTES) or span["name"])


def is_boundary(span: Span) -> bool:
    return (
        span["kind"] == "CONSUMER"
        or attr(span, "messaging.operation.type", "messaging.operation") in CONSUMER_OPERATIONS
    )


def is_http_attempt(span: Span) -> bool:
    return span["kind"] == "CLIENT" and attr(span, *HTTP_METHOD_ATTRIBUTES) is not None


def provider(span: Span) -> str:
    value = str(attr(span, *PROVIDER_ATTRIBUTES) or "").lower()
    return "azure.ai.openai" if value == "azure" else value


def model(span: Span) -> str:
    return str(attr(span, *MODEL_ATTRIBUTES) or "")


def tokens(span: Span) -> int:
    return _int(attr(span, *INPUT_TOKENS)) + _int(attr(span, *OUTPUT_TOKENS))


def ttft_ms(span: Span) -> float | None:
    """The call's time to first token: an attribute (seconds), else the first chunk event's offset.
    Needs the dump's ``event_times`` (``apps/model_calls.py``) for the events."""
    value = attr(span, *TTFT_ATTRIBUTES)
    if value is not None:
        return float(value) * 1000.0
    for name, time_ns in span.get("event_times", ()):
        if name in TTFT_EVENTS:
            return (int(time_ns) - span["start_ns"]) / 1e6
    return None


def streamed(span: Span) -> bool:
    if any(attr(span, key) is True for key in STREAM_ATTRIBUTES):
        return True
    parameters = attr(span, "llm.invocation_parameters")
    if isinstance(parameters, str):
        try:
            if json.loads(parameters).get("stream") is True:
                return True
        except (ValueError, AttributeError):
            pass
    return ttft_ms(span) is not None


def attempt_failed(span: Span) -> bool:
    """An HTTP attempt: status ERROR or HTTP status ≥ 400."""
    status = http_status(span)
    return span["status"] == "ERROR" or (status is not None and status >= 400)


def span_failed(span: Span) -> bool:
    """A span as one attempt or a workflow sibling: status ERROR, HTTP status ≥ 400, or error.type."""
    return attempt_failed(span) or attr(span, "error.type") is not None


def _in(ns: int, window: tuple[int, int]) -> bool:
    return window[0] <= ns < window[1]


# --- the truth ---------------------------------------------------------------------------------
class Truth:
    """Indexes the dumped spans once; each method is one metric over a window ``(lo_ns, hi_ns)``."""

    def __init__(self, spans: Iterable[Span]) -> None:
        unique: dict[tuple[str, str], Span] = {}
        for s in spans:
            unique.setdefault((s["trace_id"], s["span_id"]), s)
        self.spans = list(unique.values())
        self.by_id = unique
        self.children: dict[tuple[str, str], list[Span]] = defaultdict(list)
        self.traces: dict[str, list[Span]] = defaultdict(list)
        for s in self.spans:
            self.traces[s["trace_id"]].append(s)
            if s["parent_span_id"]:
                self.children[(s["trace_id"], s["parent_span_id"])].append(s)
        for kids in self.children.values():
            kids.sort(key=lambda k: (k["start_ns"], k["end_ns"], k["span_id"]))

    # -- structure
    def parent(self, span: Span) -> Span | None:
        if not span["parent_span_id"]:
            return None
        return self.by_id.get((span["trace_id"], span["parent_span_id"]))

    def kids(self, span: Span) -> list[Span]:
        return self.children.get((span["trace_id"], span["span_id"]), [])

    def subtree(self, span: Span) -> list[Span]:
        out, stack = [], [span]
        while stack:
            s = stack.pop()
            out.append(s)
            stack.extend(self.kids(s))
        return out

    def http_attempts(self, llm: Span) -> list[Span]:
        return [k for k in self.kids(llm) if is_http_attempt(k)]

    def is_sync(self, llm: Span) -> bool:
        """Reached from a SERVER root through parents without passing a boundary span."""
        cur = llm
        while True:
            if not cur["parent_span_id"]:
                return cur is not llm and cur["kind"] == "SERVER"
            up = self.parent(cur)
            if up is None:  # a broken chain reaches no root
                return False
            if up["parent_span_id"] and is_boundary(up):
                return False
            cur = up

    # -- requests
    def requests(self, window: tuple[int, int]) -> dict[tuple[str, str], list[Span]]:
        out: dict[tuple[str, str], list[Span]] = defaultdict(list)
        for s in self.spans:
            if not s["parent_span_id"] and s["kind"] == "SERVER" and _in(s["start_ns"], window):
                out[(str(s["resource"].get("service.name", "")), s["name"])].append(s)
        return dict(out)

    def sync_llm_calls(self, root: Span) -> int:
        """Logical calls (see :meth:`logical_llm_calls`) whose first span is on the request path."""
        calls = self.calls_by_trace().get(root["trace_id"], [])
        return sum(1 for call in calls if self.is_sync(call[0]))

    def mirrors(self) -> tuple[set[tuple[str, str]], dict[tuple[str, str], int]]:
        """Two instrumentations on one call: LLM spans under one parent, of one provider and model (or
        none), overlapping in time, with different names, are one call. Returns the spans that do not
        stand for their call, and the token count of each span that does (the group's largest)."""
        if hasattr(self, "_mirrors"):
            return self._mirrors
        hidden: set[tuple[str, str]] = set()
        group_tokens: dict[tuple[str, str], int] = {}
        by_parent: dict[tuple[str, str, str], list[Span]] = defaultdict(list)
        for s in self.spans:
            if is_llm(s):
                by_parent[(s["trace_id"], s["parent_span_id"], provider(s))].append(s)
        for spans in by_parent.values():
            spans.sort(key=lambda k: (k["start_ns"], k["end_ns"]))
            groups: list[list[Span]] = []
            latest_end = None
            for s in spans:
                prev = groups[-1][-1] if groups else None
                same_model = prev is not None and (model(s) == model(prev) or not model(s) or not model(prev))
                if (
                    prev is not None
                    and latest_end is not None
                    and s["start_ns"] < latest_end
                    and s["name"] != prev["name"]
                    and same_model
                ):
                    groups[-1].append(s)
                else:
                    groups.append([s])
                latest_end = s["end_ns"] if latest_end is None else max(latest_end, s["end_ns"])
            for group in groups:
                if len(group) == 1:
                    continue
                keep = max(group, key=lambda k: (max(len(self.http_attempts(k)), 1), -k["start_ns"]))
                group_tokens[(keep["trace_id"], keep["span_id"])] = max(tokens(k) for k in group)
                hidden |= {(k["trace_id"], k["span_id"]) for k in group if k is not keep}
        self._mirrors = (hidden, group_tokens)
        return self._mirrors

    def call_tokens(self, span: Span) -> int:
        return self.mirrors()[1].get((span["trace_id"], span["span_id"]), tokens(span))

    def logical_llm_calls(self) -> list[list[Span]]:
        """LLM spans grouped into logical calls (one span per instrumented call, :meth:`mirrors`):
        same-name siblings (same parent) by start, a span continuing the previous one's call only
        after that one failed (:meth:`calls_of`)."""
        hidden = self.mirrors()[0]
        groups: dict[tuple[str, str, str], list[Span]] = defaultdict(list)
        for s in self.spans:
            if is_llm(s) and (s["trace_id"], s["span_id"]) not in hidden:
                groups[(s["trace_id"], s["parent_span_id"], s["name"])].append(s)
        out: list[list[Span]] = []
        for siblings in groups.values():
            out += self.calls_of(sorted(siblings, key=lambda k: (k["start_ns"], k["end_ns"], k["span_id"])))
        return out

    def calls_by_trace(self) -> dict[str, list[list[Span]]]:
        if not hasattr(self, "_calls_by_trace"):
            by_trace: dict[str, list[list[Span]]] = defaultdict(list)
            for call in self.logical_llm_calls():
                by_trace[call[0]["trace_id"]].append(call)
            self._calls_by_trace = dict(by_trace)
        return self._calls_by_trace

    def hot_path(self, window: tuple[int, int]) -> dict[tuple[str, str], dict[str, Any]]:
        out = {}
        for key, roots in self.requests(window).items():
            durations = [(r["end_ns"] - r["start_ns"]) / 1e6 for r in roots]
            out[key] = {
                "requests": len(roots),
                "p50_ms": quantile(durations, 0.5),
                "p95_ms": quantile(durations, 0.95),
                "p99_ms": quantile(durations, 0.99),
                "p999_ms": quantile(durations, 0.999),
                "sync_llm_calls_per_request": sum(self.sync_llm_calls(r) for r in roots) / len(roots),
            }
        return out

    # -- LLM calls
    def llm_calls(self, window: tuple[int, int]) -> dict[tuple[str, str], dict[str, Any]]:
        acc: dict[tuple[str, str], dict[str, Any]] = {}
        for call in self.logical_llm_calls():
            first = call[0]
            if not _in(first["start_ns"], window):
                continue
            # A call's provider and model: the first non-empty among its spans.
            call_provider = next((provider(s) for s in call if provider(s)), "")
            call_model = next((model(s) for s in call if model(s)), "")
            row = acc.setdefault(
                (call_provider, call_model),
                {
                    "calls": 0,
                    "sync_calls": 0,
                    "attempts": 0,
                    "failed_attempts": 0,
                    "throttled_attempts": 0,
                    "failed_not_throttled": 0,
                    "failed_calls": 0,
                    "tokens": 0,
                    "backoff_ms": 0.0,
                },
            )
            row["calls"] += 1
            # What the user met: the call's last span (by start) ended in failure.
            row["failed_calls"] += int(span_failed(call[-1]))
            row["sync_calls"] += int(self.is_sync(first))
            for s in call:
                row["tokens"] += self.call_tokens(s)
                attempts = sorted(self.http_attempts(s), key=lambda a: (a["start_ns"], a["end_ns"]))
                if attempts:
                    row["attempts"] += len(attempts)
                    row["failed_attempts"] += sum(attempt_failed(a) for a in attempts)
                    row["throttled_attempts"] += sum(http_status(a) == 429 for a in attempts)
                    row["failed_not_throttled"] += sum(
                        attempt_failed(a) and http_status(a) != 429 for a in attempts
                    )
                    row["backoff_ms"] += (
                        sum(max(0, b["start_ns"] - a["end_ns"]) for a, b in pairwise(attempts)) / 1e6
                    )
                else:
                    row["attempts"] += 1
                    row["failed_attempts"] += int(span_failed(s))
                    row["throttled_attempts"] += int(http_status(s) == 429)
                    row["failed_not_throttled"] += int(span_failed(s) and http_status(s) != 429)
        for row in acc.values():
            row["cold_calls"] = row["calls"] - row["sync_calls"]
            row["error_rate"] = _ratio(row["failed_calls"], row["calls"])
            row["failed_attempt_rate"] = _ratio(row.pop("failed_not_throttled"), row["attempts"])
            row["throttle_rate"] = _ratio(row["throttled_attempts"], row["attempts"])
            row["retry_rate"] = _ratio(row["attempts"] - row["calls"], row["calls"])
            row["cold_share"] = _ratio(row["cold_calls"], row["calls"])
        return acc

    def llm_anatomy(self, window: tuple[int, int]) -> dict[tuple[str, str], dict[str, Any]]:
        acc: dict[tuple[str, str], dict[str, Any]] = {}
        for call in self.logical_llm_calls():
            if not _in(call[0]["start_ns"], window):
                continue
            key = (
                next((provider(s) for s in call if provider(s)), ""),
                next((model(s) for s in call if model(s)), ""),
            )
            row = acc.setdefault(
                key,
                {
                    "calls": 0,
                    "streamed_calls": 0,
                    "_ttft": [],
                    "_per_token": [],
                    "_in": [],
                    "_out": [],
                    "_in_sum": 0,
                    "_cached": 0,
                    "_cached_seen": False,
                },
            )
            answered = call[-1]
            row["calls"] += 1
            row["streamed_calls"] += int(streamed(answered))
            ttft = ttft_ms(answered)
            input_tokens, output_tokens = attr(answered, *INPUT_TOKENS), attr(answered, *OUTPUT_TOKENS)
            if ttft is not None:
                row["_ttft"].append(ttft)
                if output_tokens:
                    duration_ms = (answered["end_ns"] - answered["start_ns"]) / 1e6
                    row["_per_token"].append((duration_ms - ttft) / _int(output_tokens))
            if output_tokens is not None:
                row["_out"].append(_int(output_tokens))
            if input_tokens is not None:
                row["_in"].append(_int(input_tokens))
                row["_in_sum"] += _int(input_tokens)
                cached = attr(answered, *CACHED_INPUT_TOKENS)
                row["_cached"] += _int(cached)
                row["_cached_seen"] |= cached is not None
        for row in acc.values():
            ttfts = row.pop("_ttft")
            row["ttft_p50_ms"] = quantile(ttfts, 0.5)
            row["ttft_p99_ms"] = quantile(ttfts, 0.99)
            row["ttft_source"] = "attribute" if ttfts else None
            row["ms_per_output_token_p50"] = quantile(row.pop("_per_token"), 0.5)
            row["input_tokens_p50"] = quantile(row.pop("_in"), 0.5)
            row["output_tokens_p50"] = quantile(row.pop("_out"), 0.5)
            cached, seen, total = row.pop("_cached"), row.pop("_cached_seen"), row.pop("_in_sum")
            row["cached_input_ratio"] = _ratio(cached, total) if seen else None
        return acc

    # -- workflows
    def workflow_spans(self, window: tuple[int, int]) -> list[Span]:
        out = []
        for spans in self.traces.values():
            candidates = [s for s in spans if is_workflow(s)]
            if candidates:
                first = min(candidates, key=lambda s: (s["start_ns"], s["span_id"]))
                if _in(first["start_ns"], window):
                    out.append(first)
        return out

    def calls_of(self, siblings: list[Span]) -> list[list[Span]]:
        """Same-name siblings (sorted by start) grouped into logical calls."""
        calls: list[list[Span]] = []
        for s in siblings:
            prev = calls[-1][-1] if calls else None
            if prev is not None and span_failed(prev) and s["start_ns"] >= prev["end_ns"]:
                calls[-1].append(s)
            else:
                calls.append([s])
        return calls

    def call_attempts(self, call: list[Span]) -> int:
        extra = 0
        for sibling in call:
            for s in self.subtree(sibling):
                if is_llm(s):
                    extra += max(len(self.http_attempts(s)), 1) - 1
        return len(call) + extra

    def subtree_tokens(self, span: Span) -> int:
        return sum(tokens(s) for s in self.subtree(span))

    def workflows(self, window: tuple[int, int]) -> dict[str, dict[str, Any]]:
        acc: dict[str, dict[str, Any]] = {}
        for wf in self.workflow_spans(window):
            row = acc.setdefault(workflow_name(wf), {"runs": 0, "hops": {}, "final_tokens": 0})
            row["runs"] += 1
            by_name: dict[str, list[Span]] = defaultdict(list)
            for child in self.kids(wf):
                by_name[child["name"]].append(child)
            for name, siblings in by_name.items():
                hop = row["hops"].setdefault(name, {"calls": 0, "attempts": 0, "tokens": 0})
                for call in self.calls_of(siblings):
                    hop["calls"] += 1
                    hop["attempts"] += self.call_attempts(call)
                    hop["tokens"] += sum(self.subtree_tokens(s) for s in call)
                    final = max(call, key=lambda s: (s["start_ns"], s["span_id"]))
                    row["final_tokens"] += self.subtree_tokens(final)
        for row in acc.values():
            for hop in row["hops"].values():
                hop["retry_rate"] = _ratio(hop["attempts"] - hop["calls"], hop["calls"])
            calls = sum(h["calls"] for h in row["hops"].values())
            attempts = sum(h["attempts"] for h in row["hops"].values())
            total_tokens = sum(h["tokens"] for h in row["hops"].values())
            row["attempt_amplification"] = _ratio(attempts, calls)
            row["token_amplification"] = _ratio(total_tokens, row.pop("final_tokens"))
        return acc

    # -- queued jobs
    def jobs(self) -> list[dict[str, Any]]:
        """Every job: queue, enqueued_ns, runs, ready_ns (None when pending)."""
        producers = [s for s in self.spans if s["kind"] == "PRODUCER"]
        job_of: dict[tuple[str, str], int] = {}
        groups: list[list[Span]] = []
        by_message: dict[str, int] = {}
        for p in sorted(producers, key=lambda s: s["start_ns"]):
            message_id = attr(p, "messaging.message.id")
            if message_id is None:
                index = len(groups)
                groups.append([p])
            elif str(message_id) in by_message:
                index = by_message[str(message_id)]
                groups[index].append(p)
            else:
                index = by_message[str(message_id)] = len(groups)
                groups.append([p])
            job_of[(p["trace_id"], p["span_id"])] = index
        runs: dict[int, list[Span]] = defaultdict(list)
        for s in self.spans:
            if not is_boundary(s):
                continue
            if s["links"]:
                hits = {
                    job_of[(li["trace_id"], li["span_id"])]
                    for li in s["links"]
                    if (li["trace_id"], li["span_id"]) in job_of
                }
            else:
                key = (s["trace_id"], s["parent_span_id"])
                hits = {job_of[key]} if key in job_of else set()
            for index in hits:
                runs[index].append(s)
        out = []
        for index, group in enumerate(groups):
            first = min(group, key=lambda s: s["start_ns"])
            queue = str(attr(first, "messaging.destination.name", "messaging.destination") or first["name"])
            job_runs = runs.get(index, [])
            ok = [
                r
                for r in job_runs
                if r["status"] != "ERROR" and attr(r, "celery.state") not in FAILED_RUN_STATES
            ]
            if ok:
                ready = max(r["end_ns"] for r in ok)
            elif job_runs:
                ready = max(r["end_ns"] for r in job_runs)
            else:
                ready = None
            out.append(
                {"queue": queue, "enqueued_ns": first["start_ns"], "runs": len(job_runs), "ready_ns": ready}
            )
        return out

    def queues(self, window: tuple[int, int]) -> dict[str, dict[str, Any]]:
        acc: dict[str, dict[str, Any]] = {}
        for job in self.jobs():
            if not _in(job["enqueued_ns"], window):
                continue
            row = acc.setdefault(job["queue"], {"jobs": 0, "completed": 0, "pending": 0, "runs": 0, "_s": []})
            row["jobs"] += 1
            row["runs"] += job["runs"]
            if job["ready_ns"] is None:
                row["pending"] += 1
            else:
                row["completed"] += 1
                row["_s"].append((job["ready_ns"] - job["enqueued_ns"]) / 1e9)
        for row in acc.values():
            seconds = row.pop("_s")
            row["p50_s"] = quantile(seconds, 0.5)
            row["p99_s"] = quantile(seconds, 0.99)
        return acc
