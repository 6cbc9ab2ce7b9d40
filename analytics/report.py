"""The analysis as readable text: ``tailwatch analyze --format table``, one function per section.

It renders the JSON object of :meth:`Analysis.to_dict` (not the frames), so the text a command
prints from a remote service's answer and from a local analysis is the same.
"""

from __future__ import annotations

from typing import Any

__all__ = ["render_table"]


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return lines


def _sampled(row: dict[str, Any]) -> bool:
    """Whether a hot-path row's figures come from sampled data (its requests are a weighted count)."""
    stored = row.get("sampled_requests")
    return stored is not None and (stored != row["requests"] or bool(row.get("p99_warning")))


def _hot_path(data: dict[str, Any]) -> list[str]:
    """Per operation latency percentiles, then the releases that moved them. Sampled data adds the
    stored requests and the effective sample size behind each row, and a note under the table for
    each p99 resting on too few of them; unsampled data prints as it always has."""
    out: list[str] = []
    sampled = any(_sampled(h) for h in data["hot_path"])
    title = "HOT PATH (latency ms; exact percentiles, linear interpolation)"
    if sampled:
        title = "HOT PATH (latency ms; percentiles and requests weighted by the sample rate)"
    out += [title]
    extra = ["sampled", "n_eff"] if sampled else []
    out += _table(
        [
            "service",
            "operation",
            "requests",
            "p50",
            "p95",
            "p99",
            "p99.9",
            "sync LLM/req",
            "releases",
            "coupled",
            *extra,
        ],
        [
            [
                h["service"],
                h["operation"],
                _fmt(h["requests"]),
                _fmt(h["p50_ms"]),
                _fmt(h["p95_ms"]),
                _fmt(h["p99_ms"]) + ("!" if h.get("p99_warning") else ""),
                _fmt(h["p999_ms"]),
                _fmt(h["sync_llm_calls_per_request"], 2),
                _fmt(h["release_coupling"]["releases"]),
                _fmt(h["release_coupling"]["coupled"]),
                *(
                    [_fmt(h.get("sampled_requests")), _fmt(h.get("effective_sample_size"), 0)]
                    if sampled
                    else []
                ),
            ]
            for h in data["hot_path"]
        ],
    )
    out += [
        f"  ! {h['service']} {h['operation']}: the p99 rests on {_fmt(h.get('p99_tail_samples'))} sampled "
        f"request(s) at or above it (of {_fmt(h.get('sampled_requests'))} stored): read it as rough"
        for h in data["hot_path"]
        if h.get("p99_warning")
    ]
    streamed = [h for h in data["hot_path"] if h.get("first_byte_requests") and h.get("streamed_requests")]
    if streamed:
        out += ["", "STREAMED ENDPOINTS (ms; the first byte of the body, as the server sent it)"]
        out += _table(
            [
                "service",
                "operation",
                "requests",
                "streamed",
                "first byte p50",
                "first byte p99",
                "p99 (last)",
            ],
            [
                [
                    h["service"],
                    h["operation"],
                    _fmt(h["requests"]),
                    _fmt(h["streamed_requests"]),
                    _fmt(h["ttfb_p50_ms"]),
                    _fmt(h["ttfb_p99_ms"]),
                    _fmt(h["p99_ms"]),
                ]
                for h in streamed
            ],
        )
    release_rows = [
        [
            h["service"],
            h["operation"],
            r["version"],
            _fmt(r["released_at"]),
            _fmt(r["p99_before_ms"]),
            _fmt(r["p99_after_ms"]),
            _fmt(r["p99_delta_ms"]),
            _fmt(r["significant"]),
            f"{_fmt(r['sync_llm_calls_per_request_before'], 2)} → "
            f"{_fmt(r['sync_llm_calls_per_request_after'], 2)}",
        ]
        for h in data["hot_path"]
        for r in h["releases"]
    ]
    if release_rows:
        out += ["", "RELEASES"]
        out += _table(
            [
                "service",
                "operation",
                "version",
                "released",
                "p99 before",
                "p99 after",
                "Δp99",
                "significant",
                "sync LLM/req",
            ],
            release_rows,
        )
    return out


def _cold_path(data: dict[str, Any]) -> list[str]:
    """Per queue enqueue-to-ready percentiles, wait and processing split."""
    out: list[str] = []
    out += ["COLD PATH (enqueue-to-ready s)"]
    out += _table(
        [
            "queue",
            "jobs",
            "pending",
            "p50",
            "p95",
            "p99",
            "p99.9",
            "wait p99",
            "proc p99",
            "p99/p50",
            "starved",
            "base jobs",
            "base p99",
        ],
        [
            [
                c["queue"],
                _fmt(c["jobs"]),
                _fmt(c["pending"]),
                _fmt(c["p50_s"], 2),
                _fmt(c["p95_s"], 2),
                _fmt(c["p99_s"], 2),
                _fmt(c["p999_s"], 2),
                _fmt(c["queue_wait_p99_s"], 2),
                _fmt(c["processing_p99_s"], 2),
                _fmt(c["p99_over_p50"]),
                _fmt(c["starved"]),
                _fmt(c["baseline_jobs"]),
                _fmt(c["baseline_p99_s"], 2),
            ]
            for c in data["cold_path"]
        ],
    )
    return out


def _abandonment(data: dict[str, Any]) -> list[str]:
    """Per operation abandonment curve and cliff."""
    out: list[str] = []
    out += ["ABANDONMENT (rate by response-time bucket)"]
    for a in data["abandonment"]:
        curve = "  ".join(
            f"{b['lo_ms']}:{b['rate'] * 100:.1f}%" for b in a["buckets"] if b["rate"] is not None
        )
        against = "  (by time to first byte)" if a.get("latency") == "first_byte" else ""
        out.append(f"{a['service']} {a['operation']}  cliff_ms={_fmt(a['cliff_ms'])}{against}  {curve}")
    return out


def _retries(data: dict[str, Any]) -> list[str]:
    """Per workflow retry, token and modeled amplification."""
    out: list[str] = []
    out += ["RETRY AMPLIFICATION"]
    for r in data["retry_amplification"]:
        hops = ", ".join(f"{h['hop']} {h['retry_rate'] * 100:.1f}%" for h in r["hops"])
        out.append(
            f"{r['workflow']}  runs={r['runs']}  attempts×{_fmt(r['attempt_amplification'], 3)}  "
            f"tokens×{_fmt(r['token_amplification'], 3)}  "
            f"modeled×{_fmt(r['modeled_amplification'], 3)}  "
            f"baseline attempts×{_fmt(r['baseline_attempt_amplification'], 3)}  [{hops}]"
        )
    return out


def _llm_calls(data: dict[str, Any]) -> list[str]:
    """Per provider/model calls and attempts as sent over the wire."""
    out: list[str] = []
    out += [
        "LLM CALLS (attempts as sent over the wire; failed calls: failed after their retries, per call;"
        " failed (5xx, timeout) and 429 attempts per attempt; retries per call)"
    ]
    out += _table(
        [
            "provider",
            "model",
            "calls",
            "sync",
            "cold share",
            "attempts",
            "failed calls",
            "failed attempts",
            "429 attempts",
            "retries",
            "backoff s",
            "tokens",
        ],
        [
            [
                c["provider"],
                c["model"],
                _fmt(c["calls"]),
                _fmt(c["sync_calls"]),
                _fmt(c["cold_share"], 3),
                _fmt(c["attempts"]),
                _fmt(c["error_rate"], 3),
                _fmt(c["failed_attempt_rate"], 3),
                _fmt(c["throttle_rate"], 3),
                _fmt(c["retry_rate"], 3),
                _fmt(c["backoff_ms"] / 1000.0 if c["backoff_ms"] is not None else None, 1),
                _fmt(c["tokens"]),
            ]
            for c in data.get("llm_calls", [])
        ],
    )
    return out


def _pair(before: Any, after: Any, digits: int = 1) -> str:
    return f"{_fmt(before, digits)}→{_fmt(after, digits)}"


def _llm_anatomy(data: dict[str, Any]) -> list[str]:
    """Per provider/model the model call taken apart, baseline → current."""
    rows = data.get("llm_anatomy", [])
    if not rows:
        return []
    out = [
        "LLM ANATOMY (baseline→current; ttft: time to first token, 'est' when fitted from duration "
        "against output tokens; ms/tok: generation time per output token; cost in USD, '-' without a price)"
    ]
    out += _table(
        [
            "provider",
            "model",
            "calls",
            "streamed",
            "ttft p50 ms",
            "ttft p99 ms",
            "ms/tok",
            "in tok p50",
            "out tok p50",
            "cached in",
            "cost/1k calls",
            "cost/day",
        ],
        [
            [
                a["provider"],
                a["model"],
                _pair(a["baseline_calls"], a["calls"]),
                _pair(a["baseline_streamed_calls"], a["streamed_calls"]),
                _pair(a["baseline_ttft_p50_ms"], a["ttft_p50_ms"])
                + (" est" if "estimated" in (a["ttft_source"], a["baseline_ttft_source"]) else ""),
                _pair(a["baseline_ttft_p99_ms"], a["ttft_p99_ms"]),
                _pair(a["baseline_ms_per_output_token_p50"], a["ms_per_output_token_p50"], 2),
                _pair(a["baseline_input_tokens_p50"], a["input_tokens_p50"], 0),
                _pair(a["baseline_output_tokens_p50"], a["output_tokens_p50"], 0),
                _pair(a["baseline_cached_input_ratio"], a["cached_input_ratio"], 2),
                _pair(a["baseline_cost_per_1k_calls"], a["cost_per_1k_calls"], 3),
                _pair(a["baseline_cost_per_day"], a["cost_per_day"], 2),
            ]
            for a in rows
        ],
    )
    return out


def _attribution(data: dict[str, Any]) -> list[str]:
    """Per operation p99 change split into LLM and internal time."""
    out: list[str] = []
    out += ["ATTRIBUTION (p99 change vs baseline, critical path of tail traces)"]
    for a in data["attribution"]:
        out.append(
            f"{a['service']} {a['operation']}  "
            f"p99 {_fmt(a['baseline_p99_ms'])} → {_fmt(a['current_p99_ms'])} ms "
            f"(Δ {_fmt(a['delta_ms'])})  verdict={a['verdict']}  llm {a['llm_share'] * 100:.0f}% / "
            f"internal {a['internal_share'] * 100:.0f}%"
        )
        for s in a["top_spans"][:5]:
            model = f" [{s['provider']}/{s['model']}]" if s["model"] else ""
            out.append(f"    {s['class']:<8} {s['span_name']}{model}  Δ {_fmt(s['delta_ms'])} ms")
        for g in a["llm_signals"]:
            out.append(
                f"    {g['provider']}/{g['model']}: failed calls {_fmt(g['error_rate_baseline'], 3)}→"
                f"{_fmt(g['error_rate_current'], 3)}  failed attempts "
                f"{_fmt(g.get('failed_attempt_rate_baseline'), 3)}→"
                f"{_fmt(g.get('failed_attempt_rate_current'), 3)}"
                f"  429 attempts {_fmt(g['throttle_rate_baseline'], 3)}→"
                f"{_fmt(g['throttle_rate_current'], 3)}  retries {_fmt(g['retry_rate_baseline'], 3)}→"
                f"{_fmt(g['retry_rate_current'], 3)}  cold share {_fmt(g['cold_share_baseline'], 3)}→"
                f"{_fmt(g['cold_share_current'], 3)}"
            )
        if a.get("llm_cause"):
            parts = ", ".join(
                f"{k.replace('_', ' ')} {v:+.0f}" for k, v in a["llm_breakdown_ms"].items() if v
            )
            out.append(f"    inside llm: {a['llm_cause_text']}  [{parts} ms]")
        if a["exemplar_trace_ids"]:
            out.append(f"    exemplars: {' '.join(a['exemplar_trace_ids'])}")
    return out


def _boundary(data: dict[str, Any]) -> list[str]:
    """Per hot operation its latency budget, the counterfactual without its synchronous model calls
    and the recommendation with its reasons."""
    out: list[str] = []
    out += ["BOUNDARY (latency ms against the budget; 'without' = without the synchronous model calls)"]
    rows = data.get("boundary", [])
    out += _table(
        [
            "service",
            "operation",
            "requests",
            "p99",
            "budget",
            "source",
            "over",
            "over/day",
            "sync LLM/req",
            "p99 without",
            "over without",
            "recommendation",
        ],
        [
            [
                b["service"],
                b["operation"],
                _fmt(b["requests"]),
                _fmt(b["p99_ms"]),
                _fmt(b["budget_ms"], 0),
                _fmt(b["budget_source"]),
                _fmt(b["requests_over_budget"]),
                _fmt(b["requests_over_budget_per_day"], 0),
                _fmt(b["sync_llm_calls_per_request"], 2),
                _fmt(b["p99_without_sync_llm_ms"]),
                _fmt(b["requests_over_budget_without_sync_llm"]),
                _fmt(b["recommendation"]),
            ]
            for b in rows
        ],
    )
    for b in rows:
        if b["reasons"]:
            out.append(f"  {b['service']} {b['operation']}:")
            out += [f"    - {reason}" for reason in b["reasons"]]
    return out


def _what_if(data: dict[str, Any]) -> list[str]:
    """Per hot operation each simulated option: its p99 against the budget and its price."""
    out: list[str] = []
    out += ["WHAT IF (latency ms; each option simulated per request on the most recent exact horizon)"]
    rows = data.get("what_if", [])
    out += _table(
        [
            "service",
            "operation",
            "option",
            "parameter",
            "requests",
            "p99",
            "Δp99",
            "budget",
            "over/day",
            "abandoned saved/day",
            "extra calls",
            "extra tokens",
            "extra cost/day",
        ],
        [
            [
                r["service"],
                r["operation"],
                r["option"],
                r["parameter"],
                _fmt(r["requests"]),
                _fmt(r["p99_ms"]),
                _fmt(r["p99_delta_ms"]),
                _fmt(r["budget_ms"], 0),
                _fmt(r["requests_over_budget"], 0),
                _fmt(r["abandoned_saved_per_day"], 0),
                _percent(r["extra_calls_ratio"]),
                _percent(r["extra_tokens_ratio"]),
                _fmt(r["extra_cost_per_day"], 2),
            ]
            for r in rows
        ],
    )
    assumptions = dict.fromkeys(f"{r['option']}: {r['assumption']}" for r in rows if r["assumption"])
    out += [f"  - {line}" for line in assumptions]
    return out


def _percent(value: Any) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _slices(data: dict[str, Any]) -> list[str]:
    """Per flag of an operation, each variant against the control."""
    out: list[str] = []
    out += ["SLICES (each variant against the control; latency ms, abandonment with its 95% interval)"]
    for s in data.get("slices", []):
        out.append(f"{s['service']} {s['operation']}  flag={s['flag']}  control={s['control']}")
        out += [
            "  " + line
            for line in _table(
                [
                    "variant",
                    "requests",
                    "p50",
                    "p99",
                    "Δp99",
                    "abandoned",
                    "95% interval",
                    "Δabandoned",
                    "sync LLM/req",
                    "cold p99 s",
                    "significant",
                ],
                [
                    [
                        v["variant"],
                        _fmt(v["requests"]),
                        _fmt(v["p50_ms"]),
                        _fmt(v["p99_ms"]),
                        _fmt(v["p99_delta_ms"]),
                        _percent(v["abandonment_rate"]),
                        f"{_percent(v['abandonment_rate_low'])}–{_percent(v['abandonment_rate_high'])}",
                        "-" if v["abandonment_delta"] is None else f"{v['abandonment_delta'] * 100:+.1f} pt",
                        _fmt(v["sync_llm_calls_per_request"], 2),
                        _fmt(v["cold_p99_s"], 2),
                        _fmt(v["significant"]),
                    ]
                    for v in s["variants"]
                ],
            )
        ]
    return out


def _existing_hedges(data: dict[str, Any]) -> list[str]:
    """Hedges already in the traces (overlapping sibling calls to one model), per model."""
    rows = data.get("existing_hedges", [])
    if not rows:
        return []
    out = ["EXISTING HEDGES (overlapping sibling calls to one model; most recent exact horizon)"]
    out += _table(
        ["service", "model", "hedges", "wins", "win rate", "losers cut", "saved ms", "extra tokens"],
        [
            [
                r["service"],
                f"{r['provider']}/{r['model']}",
                _fmt(r["hedges"]),
                _fmt(r["wins"]),
                _percent(r["win_rate"]),
                _fmt(r["losers_cut"]),
                _fmt(r["latency_saved_ms"]),
                _percent(r["extra_tokens_ratio"]),
            ]
            for r in rows
        ],
    )
    return out


def _drift(data: dict[str, Any]) -> list[str]:
    """Architecture drift findings (analytics.drift), when the report has them."""
    if "drift" not in data:
        return []
    out = [f"ARCHITECTURE DRIFT (last {data.get('drift_days', '?')} days, by day)"]
    out += _table(
        ["kind", "service", "operation / queue", "since", "severity", "evidence"],
        [
            [
                f["kind"],
                f["service"] or "-",
                f["operation"] or f["queue"],
                str(f["since"])[:10] + (f" ({f['since_release']})" if f.get("since_release") else ""),
                f["severity"],
                ", ".join(f"{k}={_fmt(v, 2)}" for k, v in f["evidence"].items()),
            ]
            for f in data["drift"]
        ],
    )
    return out


def _llm_costs(data: dict[str, Any]) -> list[str]:
    """Per hot operation what a request costs in model calls, baseline → current, and per release
    the step."""
    rows = [c for c in data.get("llm_costs", []) if c["version"] == ""]
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for c in rows:
        by_key.setdefault((c["service"], c["operation"]), {})[c["window"]] = c
    table = []
    for (service, operation), windows in sorted(by_key.items()):
        now, then = windows.get("current", {}), windows.get("baseline", {})
        if not now.get("sync_llm_calls_per_request") and not then.get("sync_llm_calls_per_request"):
            continue
        table.append(
            [
                service,
                operation,
                _pair(then.get("sync_llm_calls_per_request"), now.get("sync_llm_calls_per_request"), 2),
                _pair(then.get("llm_tokens_per_request"), now.get("llm_tokens_per_request"), 0),
                _pair(then.get("llm_cost_per_request"), now.get("llm_cost_per_request"), 5),
                _fmt(now.get("llm_cost_per_day"), 2),
            ]
        )
    if not table:
        return []
    out = ["LLM COST PER HOT REQUEST (baseline→current; synchronous model calls; USD, '-' without a price)"]
    out += _table(["service", "operation", "calls/req", "tokens/req", "USD/req", "USD/day"], table)
    steps = []
    for h in data["hot_path"]:
        for r in h["releases"]:
            if not (r.get("llm_tokens_per_request_before") or r.get("llm_tokens_per_request_after")):
                continue  # no model call on either side: nothing to cost
            line = (
                f"  {h['service']} {h['operation']} {r['version']}: "
                f"{_fmt(r['llm_tokens_per_request_before'], 0)} → "
                f"{_fmt(r['llm_tokens_per_request_after'], 0)} tokens/req"
            )
            if (
                r.get("llm_cost_per_request_before") is not None
                or r.get("llm_cost_per_request_after") is not None
            ):
                line += (
                    f", USD {_fmt(r['llm_cost_per_request_before'], 5)} → "
                    f"{_fmt(r['llm_cost_per_request_after'], 5)}/req"
                )
            steps.append(line)
    if steps:
        out += ["  per release (the version before → this one):", *steps]
    return out


_SECTIONS = (
    _hot_path,
    _boundary,
    _what_if,
    _existing_hedges,
    _slices,
    _cold_path,
    _abandonment,
    _retries,
    _llm_calls,
    _llm_anatomy,
    _llm_costs,
    _attribution,
    _drift,
)


def render_table(data: dict[str, Any]) -> str:
    """The JSON object of one analysis (:meth:`Analysis.to_dict`) as plain text sections."""
    w = data["window"]
    out = [f"window   {w['start']} → {w['end']}", f"baseline {w['baseline_start']} → {w['baseline_end']}"]
    for section in _SECTIONS:
        lines = section(data)
        if lines:
            out += ["", *lines]
    return "\n".join(out)
