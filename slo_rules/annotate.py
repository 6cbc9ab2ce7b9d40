"""What an alert says: the one-line summary and the attribution annotations, from analysis frames.

Pure functions (frames in, strings out) so each sentence is tested against a known answer. The
first thing on-call reads is ``summary``, e.g.::

    p99 of POST /chat 1.2 s → 3.4 s; 87% of the increase is in LLM spans (openai gpt-4o), internal +0.3 s

Annotation values are strings (Alertmanager's model); numbers are plain decimals so receivers can
parse them back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import polars as pl

from analytics import Analysis

__all__ = ["attribution_annotations", "fmt_ms", "fmt_pct", "fmt_s", "signed_ms"]


def fmt_ms(ms: float | None) -> str:
    """Milliseconds for people: ``850 ms``, ``1.2 s``, ``180 s``, ``12.5 min``."""
    if ms is None:
        return "n/a"
    if abs(ms) < 1000:
        return f"{ms:.0f} ms"
    if abs(ms) < 100_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 600_000:
        return f"{ms / 1000:.0f} s"
    return f"{ms / 60_000:.1f} min"


def fmt_s(seconds: float | None) -> str:
    return fmt_ms(None if seconds is None else seconds * 1000)


def signed_ms(ms: float) -> str:
    return ("+" if ms >= 0 else "−") + fmt_ms(abs(ms))


def fmt_pct(fraction: float | None, digits: int = 0) -> str:
    if fraction is None:
        return "n/a"
    return f"{fraction * 100:.{digits}f}%"


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value == value else ""
    return str(value)


def _rows(frame: pl.DataFrame, service: str, operation: str) -> list[dict[str, Any]]:
    if frame.is_empty():
        return []
    return frame.filter((pl.col("service") == service) & (pl.col("operation") == operation)).to_dicts()


def _model_name(provider: Any, model: Any) -> str:
    parts = [str(p) for p in (provider, model) if p]
    return " ".join(parts)


def attribution_annotations(analysis: Analysis, service: str, operation: str) -> dict[str, str]:
    """Cause, shares, top spans, exemplars and LLM signals of one hot-path operation.

    Returns ``{}`` when the analysis has no attribution row for it. ``summary_tail`` is the
    attribution sentence the rules append to their own summary.
    """
    rows = _rows(analysis.attribution, service, operation)
    if not rows:
        return {}
    row = rows[0]
    base, cur = row.get("baseline_p99_ms"), row.get("current_p99_ms")
    delta = float(row.get("delta_ms") or 0.0)
    verdict = str(row.get("verdict") or "none")
    llm_share = float(row.get("llm_share") or 0.0)
    internal_share = float(row.get("internal_share") or 0.0)
    llm_delta = float(row.get("llm_delta_ms") or 0.0)
    internal_delta = float(row.get("internal_delta_ms") or 0.0)

    spans = _rows(analysis.attribution_spans, service, operation)
    spans.sort(key=lambda s: -float(s.get("delta_ms") or 0.0))
    top = spans[:5]
    llm_models: list[str] = []
    for s in spans:
        if s.get("class") == "llm" and float(s.get("delta_ms") or 0.0) > 0:
            name = _model_name(s.get("provider"), s.get("model"))
            if name and name not in llm_models:
                llm_models.append(name)
    internal_names = [
        str(s["span_name"])
        for s in spans
        if s.get("class") == "internal" and float(s.get("delta_ms") or 0.0) > 0
    ][:3]

    p99_part = f"p99 of {operation} {fmt_ms(base)} → {fmt_ms(cur)}"
    if verdict == "llm":
        where = f" ({', '.join(llm_models[:2])})" if llm_models else ""
        tail = f"{fmt_pct(llm_share)} of the increase is in LLM spans{where}, "
        tail += f"internal {signed_ms(internal_delta)}"
    elif verdict == "internal":
        where = f" ({', '.join(internal_names)})" if internal_names else ""
        tail = f"{fmt_pct(internal_share)} of the increase is in internal spans{where}, "
        tail += f"LLM {signed_ms(llm_delta)}"
    elif verdict == "mixed":
        tail = (
            f"the increase is split: LLM {signed_ms(llm_delta)} ({fmt_pct(llm_share)}), "
            f"internal {signed_ms(internal_delta)} ({fmt_pct(internal_share)})"
        )
    else:
        tail = "no significant change in the tail" if delta > 0 else "p99 did not increase"

    out: dict[str, str] = {
        "summary_tail": f"{p99_part}; {tail}",
        "cause": verdict,
        "llm_share": _num(llm_share, 3),
        "internal_share": _num(internal_share, 3),
        "baseline_p99_ms": _num(base, 1),
        "current_p99_ms": _num(cur, 1),
        "delta_ms": _num(delta, 1),
        "llm_delta_ms": _num(llm_delta, 1),
        "internal_delta_ms": _num(internal_delta, 1),
        "top_spans": "; ".join(
            f"{s['span_name']} ({s.get('class')}"
            + (f", {_model_name(s.get('provider'), s.get('model'))}" if s.get("class") == "llm" else "")
            + f") {signed_ms(float(s.get('delta_ms') or 0.0))}"
            for s in top
        ),
        "top_spans_json": json.dumps(
            [
                {
                    "span_name": s["span_name"],
                    "class": s.get("class"),
                    "provider": s.get("provider") or "",
                    "model": s.get("model") or "",
                    "delta_ms": round(float(s.get("delta_ms") or 0.0), 1),
                }
                for s in top
            ],
            ensure_ascii=False,
        ),
        "exemplar_trace_ids": ",".join(str(t) for t in (row.get("exemplar_trace_ids") or [])[:5]),
    }
    signals = _llm_signal_annotations(analysis, service, operation, llm_models)
    out.update(signals)
    if verdict in ("llm", "mixed") and signals.get("signals_changed"):
        # What tells a throttled or crowded model pool from a slow provider, in the first line.
        out["summary_tail"] += f"; {signals['llm_model']}: {signals['signals_changed']}"
    out.pop("signals_changed", None)
    return out


def _llm_signal_annotations(
    analysis: Analysis, service: str, operation: str, preferred: list[str]
) -> dict[str, str]:
    signals = _rows(analysis.llm_signals, service, operation)
    if not signals:
        return {}

    def rank(s: Mapping[str, Any]) -> int:
        name = _model_name(s.get("provider"), s.get("model"))
        return preferred.index(name) if name in preferred else len(preferred)

    signals.sort(key=rank)
    texts = []
    for s in signals:

        def change(name: str, digits: int = 1, s: Mapping[str, Any] = s) -> str:
            return f"{fmt_pct(s.get(name + '_baseline'), digits)}→{fmt_pct(s.get(name + '_current'), digits)}"

        texts.append(
            f"{_model_name(s.get('provider'), s.get('model'))}: errors {change('error_rate')}, "
            f"429s {change('throttle_rate')}, retries {change('retry_rate')}, "
            f"cold-path share {change('cold_share', 0)}"
        )
    main = signals[0]

    def pair(name: str) -> str:
        return f"{_num(main.get(name + '_baseline'))} → {_num(main.get(name + '_current'))}"

    changed = []
    for name, label, digits, notable in (
        ("throttle_rate", "429s", 1, 0.02),
        ("error_rate", "errors", 1, 0.02),
        ("retry_rate", "retries", 1, 0.02),
        ("cold_share", "cold-path share", 0, 0.10),
    ):
        was, now = main.get(name + "_baseline"), main.get(name + "_current")
        if was is not None and now is not None and float(now) - float(was) >= notable:
            changed.append(f"{label} {fmt_pct(float(was), digits)} → {fmt_pct(float(now), digits)}")

    return {
        "signals_changed": ", ".join(changed),
        "llm_signals": " | ".join(texts),
        "llm_model": _model_name(main.get("provider"), main.get("model")),
        "llm_error_rate": pair("error_rate"),
        "llm_429_rate": pair("throttle_rate"),
        "llm_retry_rate": pair("retry_rate"),
        "llm_cold_share": pair("cold_share"),
    }
