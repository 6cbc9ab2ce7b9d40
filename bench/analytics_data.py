"""Benchmark data for the analytics: millions of realistic spans generated inside ClickHouse.

Everything is ``INSERT … SELECT … FROM numbers(n)`` (about a second per 10M rows), deterministic
from the row number (cityHash64), spread over two days: the baseline day and the current day. Longer
data (``days=8``, :mod:`bench.scale`) keeps the same shapes, with the slowdown from the start of its
last day and, optionally, one insert per day.

Span mix (by count): 80% hot-path requests of 5 spans (Server root → auth, db.query, chat LLM
call, render) over three services; 10% cold-path jobs of 3 spans (Producer, linked Consumer, its
LLM call) over two queues, one of them starved; 10% agent workflow runs of 5 spans (workflow,
3 hops, and either a retry attempt or a tool call). The current day's tail is slower in the LLM
call for chat-api and in db.query for search-api; versions change every 12 hours.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from storage import Store

__all__ = ["BASELINE_START", "CURRENT_END", "CURRENT_START", "generate"]

BASELINE_START = datetime(2026, 11, 1, tzinfo=UTC)
CURRENT_START = BASELINE_START + timedelta(days=1)
CURRENT_END = CURRENT_START + timedelta(days=1)

_COLUMNS = (
    "Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName, "
    "ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode, StatusMessage, "
    "`Events.Timestamp`, `Events.Name`, `Events.Attributes`, "
    "`Links.TraceId`, `Links.SpanId`, `Links.TraceState`, `Links.Attributes`"
)

_DAY_NS = 86_400 * 1_000_000_000

# Per-trace random draws: independent bit fields of one 64-bit hash.
_COMMON = """
    number AS n, intDiv(n, {per}) AS t, n % {per} AS k,
    cityHash64(t, {salt}) AS h,
    toInt64({{t0:Int64}}) + toInt64(t * {{spacing:Float64}}) AS t0_ns,
    t0_ns >= {{current_ns:Int64}} AS current,
    lower(hex(MD5(concat('{salt}-', toString(t))))) AS trace_id,
    substring(lower(hex(MD5(concat('{salt}-', toString(t), '-', toString(k))))), 1, 16) AS span_id,
    substring(lower(hex(MD5(concat('{salt}-', toString(t), '-0')))), 1, 16) AS root_id
"""

_HOT = f"""
INSERT INTO {{table}} ({_COLUMNS})
SELECT
    fromUnixTimestamp64Nano(start_ns, 'UTC'), trace_id, span_id, if(k = 0, '', root_id), '',
    name, kind, service,
    map('service.version', concat('v', toString(intDiv(t0_ns - {{base:Int64}}, {_DAY_NS // 2})))),
    'bench', '1.0', attrs, toUInt64(dur), 'Unset', '', [], [], [], [], [], [], []
FROM (
    SELECT
        {_COMMON.format(per=5, salt=1)},
        multiIf(t % 3 = 0, 'chat-api', t % 3 = 1, 'search-api', 'doc-api') AS service,
        multiIf(t % 3 = 0, 'POST /chat', t % 3 = 1, 'GET /search', 'POST /summarize') AS operation,
        5000000 + h % 5000000 AS auth,
        20000000 + bitShiftRight(h, 8) % 40000000
            + if(bitShiftRight(h, 20) % 50 = 0, if(current AND t % 3 = 1, 1500000000, 400000000), 0) AS db,
        300000000 + bitShiftRight(h, 24) % 400000000
            + if(bitShiftRight(h, 40) % 50 = 0, if(current AND t % 3 = 0, 2500000000, 1200000000), 0) AS llm,
        auth + db + llm + 15000000 AS total,
        multiIf(k = 0, t0_ns, k = 1, t0_ns, k = 2, t0_ns + auth, k = 3, t0_ns + auth + db,
                t0_ns + auth + db + llm) AS start_ns,
        multiIf(k = 0, total, k = 1, auth, k = 2, db, k = 3, llm, 10000000) AS dur,
        multiIf(k = 0, operation, k = 1, 'auth', k = 2, 'db.query', k = 3, 'chat gpt-4o', 'render') AS name,
        multiIf(k = 0, 'Server', k = 3, 'Client', 'Internal') AS kind,
        multiIf(
            k = 0, map('http.response.status_code',
                       if(total > 2000000000 AND bitShiftRight(h, 50) % 3 = 0, '499', '200')),
            k = 3, map('gen_ai.operation.name', 'chat', 'gen_ai.provider.name', 'openai',
                       'gen_ai.request.model', 'gpt-4o', 'gen_ai.usage.input_tokens', '500',
                       'gen_ai.usage.output_tokens', '200', 'gen_ai.usage.cache_read.input_tokens', '200',
                       -- a streamed call: util-genai's time to its first chunk, 30% of the call
                       'gen_ai.response.time_to_first_chunk', toString(llm * 0.3 / 1e9)),
            k = 2, map('db.system.name', 'postgresql'),
            map()) AS attrs
    FROM numbers({{first:UInt64}}, {{rows:UInt64}})
)
"""

_COLD = f"""
INSERT INTO {{table}} ({_COLUMNS})
SELECT
    fromUnixTimestamp64Nano(start_ns, 'UTC'), tid, span_id_c, parent, '', name, kind, service,
    map('service.version', 'w1'), 'bench', '1.0', attrs, toUInt64(dur), 'Unset', '', [], [], [],
    if(k = 1, [trace_id], []), if(k = 1, [root_id], []), if(k = 1, [''], []), if(k = 1, [map()], [])
FROM (
    SELECT
        {_COMMON.format(per=3, salt=2)},
        if(t % 2 = 0, 'doc-summaries', 'emails') AS queue,
        concat(trace_id, 'c') AS consumer_trace,
        if(t % 2 = 0, if(bitShiftRight(h, 10) % 50 = 0, 179000000000, 2000000000 + h % 1000000000),
           300000000 + h % 200000000) AS wait,
        500000000 + bitShiftRight(h, 30) % 1000000000 AS processing,
        multiIf(k = 0, trace_id, substring(lower(hex(MD5(consumer_trace))), 1, 32)) AS tid,
        multiIf(k = 0, '', k = 1, '',
                substring(lower(hex(MD5(concat(consumer_trace, '-1')))), 1, 16)) AS parent,
        if(k = 1, substring(lower(hex(MD5(concat(consumer_trace, '-1')))), 1, 16), span_id) AS span_id_c,
        multiIf(k = 0, t0_ns, t0_ns + wait) AS start_ns,
        multiIf(k = 0, 2000000, k = 1, processing, intDiv(processing, 2)) AS dur,
        multiIf(k = 0, concat('send ', queue), k = 1, concat('process ', queue), 'chat gpt-4o') AS name,
        multiIf(k = 0, 'Producer', k = 1, 'Consumer', 'Client') AS kind,
        multiIf(k = 0, 'api', 'summary-worker') AS service,
        multiIf(k = 2, map('gen_ai.operation.name', 'chat', 'gen_ai.provider.name', 'openai',
                           'gen_ai.request.model', 'gpt-4o', 'gen_ai.usage.input_tokens', '800',
                           'gen_ai.usage.output_tokens', '300'),
                map('messaging.destination.name', queue)) AS attrs
    FROM numbers({{first:UInt64}}, {{rows:UInt64}})
)
"""

_WORKFLOW = f"""
INSERT INTO {{table}} ({_COLUMNS})
SELECT
    fromUnixTimestamp64Nano(start_ns, 'UTC'), trace_id, span_id, parent, '', name, kind, 'agent-runner',
    map('service.version', 'a1'), 'bench', '1.0', attrs, toUInt64(dur), status, '', [], [], [],
    [], [], [], []
FROM (
    SELECT
        {_COMMON.format(per=5, salt=3)},
        (h % 3) + 1 AS retried_hop,
        bitShiftRight(h, 8) % 20 = 0 AS has_retry,
        multiIf(k = 1, 'classify', k = 2, 'extract', k = 3, 'decide',
                has_retry, multiIf(retried_hop = 1, 'classify', retried_hop = 2, 'extract', 'decide'),
                'execute_tool lookup') AS hop,
        if(k = 0, 'invoke_workflow claims-triage', hop) AS name,
        if(k = 4 AND NOT has_retry,
           substring(lower(hex(MD5(concat('3-', toString(t), '-1')))), 1, 16), root_id) AS parent_id,
        if(k = 0, '', parent_id) AS parent,
        -- A re-sent hop starts after the attempt it repeats ended (350 ms in).
        multiIf(k = 0, t0_ns, k = 4 AND has_retry, t0_ns + (retried_hop - 1) * 400000000 + 360000000,
                k = 4, t0_ns, t0_ns + (k - 1) * 400000000) AS start_ns,
        if(k = 0, 1300000000, 350000000) AS dur,
        multiIf(k = 0, 'Internal', k = 4 AND NOT has_retry, 'Internal', 'Client') AS kind,
        if(k = 4 AND has_retry, 'Error', 'Unset') AS status,
        multiIf(
            k = 0, map('gen_ai.operation.name', 'invoke_workflow', 'gen_ai.workflow.name', 'claims-triage'),
            k = 4 AND NOT has_retry,
                map('gen_ai.operation.name', 'execute_tool', 'gen_ai.tool.name', 'lookup'),
            k = 4, map('gen_ai.operation.name', 'chat', 'gen_ai.provider.name', 'openai',
                       'gen_ai.request.model', 'gpt-4o-mini', 'gen_ai.usage.input_tokens', '600',
                       'gen_ai.usage.output_tokens', '400', 'http.request.resend_count', '1'),
            map('gen_ai.operation.name', 'chat', 'gen_ai.provider.name', 'openai',
                'gen_ai.request.model', 'gpt-4o-mini', 'gen_ai.usage.input_tokens', '600',
                'gen_ai.usage.output_tokens', '400')) AS attrs
    FROM numbers({{first:UInt64}}, {{rows:UInt64}})
)
"""


def generate(
    store: Store,
    spans: int,
    *,
    start: datetime = BASELINE_START,
    days: int = 2,
    slow_from: datetime | None = None,
    chunks: int = 1,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Insert about ``spans`` spans over ``days`` days from ``start`` (by default the baseline and the
    current day, [BASELINE_START, CURRENT_END)); returns the rows inserted.

    ``slow_from``: where the slower tail starts (default: the last day). ``chunks``: that many inserts
    per span shape, each of consecutive traces (one a day keeps an insert's memory and parts small at
    tens of millions of spans), with a ``progress`` line before each."""
    if days < 1 or chunks < 1:
        raise ValueError(f"days and chunks must be at least 1 (got days={days}, chunks={chunks})")
    table = store.table("otel_traces")
    base_ns = int(start.timestamp()) * 1_000_000_000
    slow = slow_from if slow_from is not None else start + timedelta(days=days - 1)
    current_ns = int(slow.timestamp()) * 1_000_000_000
    total = 0
    shapes = ((_HOT, 0.8, 5), (_COLD, 0.1, 3), (_WORKFLOW, 0.1, 5))
    for chunk in range(chunks):
        if progress is not None:
            progress(f"inserting chunk {chunk + 1}/{chunks}")
        for sql, share, per in shapes:
            traces = max(1, int(spans * share) // per)
            # Spread the traces evenly over the days (the last one starts a little before the end).
            spacing = (days * _DAY_NS - 10 * 60 * 1_000_000_000) / traces
            first, last = traces * chunk // chunks, traces * (chunk + 1) // chunks
            if last == first:
                continue
            store.command(
                sql.replace("{table}", table),
                {
                    "first": first * per,
                    "rows": (last - first) * per,
                    "t0": base_ns,
                    "base": base_ns,
                    "current_ns": current_ns,
                    "spacing": spacing,
                },
                settings={"max_insert_threads": 2, "max_threads": 2},
            )
            total += (last - first) * per
    return total
