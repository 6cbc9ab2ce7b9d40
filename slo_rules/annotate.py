"""What an alert says: the one-line summary, the attribution annotations of latency alerts and the
cause and provider signal of retry alerts, from analysis frames.

Pure functions (frames in, strings out) so each sentence is tested against a known answer. The
first thing on-call reads is ``summary``, e.g.::

    p99 of POST /chat 1.2 s → 3.4 s; 87% of the increase is in LLM spans (openai gpt-4o), internal +0.3 s

Annotation values are strings (Alertmanager's model); numbers are plain decimals so receivers can
parse them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import polars as pl

from analytics import Analysis

__all__ = [
    "RETRY_DOMINANCE",
    "attribution_annotations",
    "fmt_ms",
    "fmt_pct",
    "fmt_s",
    "retry_annotations",
    "signed_ms",
]


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
    attribution sentence the rules append to their own summary (the p99 change, then its cause);
    ``summary_cause`` the cause alone, for a rule that states its own p99 figures.
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
        # The same without the p99 change, for a rule that states its own p99 figures.
        "summary_cause": tail,
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
    cause = row.get("llm_cause")
    if verdict == "llm" and cause:
        # Which part of the model call moved, and whether it was the provider or our change.
        out["llm_cause"] = str(cause)
        out["llm_cause_owner"] = "ours" if row.get("llm_cause_ours") else "provider"
        out["llm_cause_text"] = str(row.get("llm_cause_text") or "")
        out["llm_breakdown_ms"] = json.dumps(
            {p: row.get(f"llm_{p}_ms") for p in ("first_token", "generation", "backoff", "more_calls")}
        )
        out["summary_tail"] += f"; {out['llm_cause_text']}"
        out["summary_cause"] += f"; {out['llm_cause_text']}"
    signals = _llm_signal_annotations(analysis, service, operation, llm_models)
    out.update(signals)
    if verdict in ("llm", "mixed") and signals.get("signals_changed"):
        # What tells a throttled or crowded model pool from a slow provider, in the first line.
        out["summary_tail"] += f"; {signals['llm_model']}: {signals['signals_changed']}"
        out["summary_cause"] += f"; {signals['llm_model']}: {signals['signals_changed']}"
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
            f"{_model_name(s.get('provider'), s.get('model'))}: failed calls {change('error_rate')}, "
            f"failed attempts {change('failed_attempt_rate')}, 429s {change('throttle_rate')}, "
            f"retries {change('retry_rate')}, "
            f"cold-path share {change('cold_share', 0)}"
        )
    main = signals[0]

    def pair(name: str) -> str:
        return f"{_num(main.get(name + '_baseline'))} → {_num(main.get(name + '_current'))}"

    changed = []
    for name, label, digits, notable in (
        ("throttle_rate", "429s", 1, 0.02),
        ("error_rate", "failed calls", 1, 0.02),
        ("failed_attempt_rate", "failed attempts", 1, 0.02),
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
        "llm_failed_attempt_rate": pair("failed_attempt_rate"),
        "llm_429_rate": pair("throttle_rate"),
        "llm_retry_rate": pair("retry_rate"),
        "llm_cold_share": pair("cold_share"),
    }


# A cause wins when it holds at least this share of a workflow's retries (at most 1 − it, the other
# cause wins; in between, ``mixed``): the analytics' ``attribution_dominance`` default, so a retry
# alert's cause reads like a latency alert's.
RETRY_DOMINANCE = 0.7

ModelKey = tuple[str, str]


def _model_key(row: Mapping[str, Any]) -> ModelKey:
    return str(row.get("provider") or ""), str(row.get("model") or "")


def _failures(call: Mapping[str, Any]) -> int:
    # A 429 is a failed attempt too; the larger count guards a source that counts them apart.
    return max(int(call.get("failed_attempts") or 0), int(call.get("throttled_attempts") or 0))


def _named_models(hop: str, calls: Mapping[ModelKey, Mapping[str, Any]]) -> list[ModelKey]:
    """The models a hop's name names: GenAI spans are named ``{operation} {model}`` (``chat
    gpt-4o``; the longest model name wins, so ``gpt-4o-mini`` is not also ``gpt-4o``),
    instrumentations ``{provider}.{operation}`` (``openai.chat``, ``anthropic.messages.create``)."""
    name = hop.lower()
    by_model = [k for k in calls if k[1] and k[1].lower() in name]
    if by_model:
        longest = max(len(k[1]) for k in by_model)
        return [k for k in by_model if len(k[1]) == longest]
    return [k for k in calls if k[0] and k[0].lower() in name]


def retry_annotations(
    workflow: str,
    hops: pl.DataFrame,
    llm_calls: pl.DataFrame | None,
    previous_llm_calls: Callable[[], pl.DataFrame | None] | None = None,
) -> dict[str, str]:
    """Cause, retried hops and provider signal of one workflow's retries; ``summary_tail`` is the
    sentence the rule appends to its own.

    ``hops`` is the analysis' ``retry_hops``, ``llm_calls`` its per-model summary of the same window;
    ``previous_llm_calls`` returns that summary for the window before (the baselines of ``llm_*``),
    and is called only when a retried hop reached a model.

    The analysis does not say which model a hop called, so the cause is read from what the hop
    shows. A retried hop that spent tokens, or whose name names a model of the window, reached a
    model: the ones its name names, else any model of the window. Its retries are the provider's
    when those models have failed attempts (429s, 5xx, timeouts), up to the number of failures (a
    retry follows a failed attempt); every other retry, and every retry of a hop that spent no
    tokens, is the workflow's own. ``llm`` when the provider's share of the retries is at least
    :data:`RETRY_DOMINANCE`, ``internal`` when it is at most 1 − that, else ``mixed``; ``none`` when
    no hop retried (or the hops carry neither tokens nor a model's name).
    """
    mine = (
        hops.filter(pl.col("workflow") == workflow).sort("retry_rate", descending=True, nulls_last=True)
        if "workflow" in hops.columns
        else hops.clear()
    ).to_dicts()
    counted = {"calls", "attempts"} <= set(hops.columns)
    calls = {_model_key(c): c for c in ([] if llm_calls is None else llm_calls.to_dicts())}

    retried: dict[str, float] = {}  # hop → its retries (its retry rate when the counts are missing)
    reached: dict[str, list[ModelKey]] = {}  # retried hop → the models it may have called
    for h in mine:
        name = str(h["hop"])
        rate = float(h.get("retry_rate") or 0.0)
        retries = float(int(h.get("attempts") or 0) - int(h.get("calls") or 0)) if counted else rate
        if retries <= 0:
            continue
        named = _named_models(name, calls)
        tokens = h.get("tokens")
        if named or (tokens is not None and int(tokens) > 0):
            reached[name] = named or list(calls)
        elif tokens is None:
            continue
        retried[name] = retries
    kind = {
        name: "llm" if any(_failures(calls[k]) for k in reached.get(name, [])) else "internal"
        for name in retried
    }
    provider_hops = [n for n in retried if kind[n] == "llm"]
    llm = sum(retried[n] for n in provider_hops)
    if counted:
        failing = {k for n in provider_hops for k in reached[n]}
        llm = min(llm, float(sum(_failures(calls[k]) for k in failing)))
    total = sum(retried.values())
    share = llm / total if total else 0.0
    if not total:
        cause = "none"
    elif share >= RETRY_DOMINANCE:
        cause = "llm"
    elif share <= 1 - RETRY_DOMINANCE:
        cause = "internal"
    else:
        cause = "mixed"

    out = {"cause": cause}
    if total:
        out["llm_retry_share"] = _num(share, 3)

    def hop_text(h: Mapping[str, Any]) -> str:
        name = str(h["hop"])
        tag = f" ({kind[name]})" if name in kind else ""
        return f"{name} {fmt_pct(float(h.get('retry_rate') or 0.0), 1)}{tag}"

    out["retried_hops"] = ", ".join(hop_text(h) for h in mine if str(h["hop"]) in retried)
    keys = {k for ks in reached.values() for k in ks}
    models = sorted((calls[k] for k in keys), key=lambda c: (-_failures(c), -int(c.get("calls") or 0)))
    signal = ""
    if models:
        earlier = previous_llm_calls() if previous_llm_calls is not None else None
        before = {_model_key(c): c for c in ([] if earlier is None else earlier.to_dicts())}
        out.update(_provider_signal(models, before))
        signal = _model_text(models[0], before.get(_model_key(models[0])), short=True)

    own = ", ".join([n for n in retried if kind[n] == "internal"][:3])
    if cause == "llm":
        sentence = f"cause llm: {fmt_pct(share)} of the retries follow failed model calls ({signal})"
    elif cause == "internal":
        sentence = "cause internal: the retries are the workflow's own steps" + (f" ({own})" if own else "")
        sentence += f", not the provider ({signal})" if signal else ""
    elif cause == "mixed":
        sentence = (
            f"cause mixed: {fmt_pct(share)} of the retries follow failed model calls ({signal}), "
            f"{fmt_pct(1 - share)} are the workflow's own steps" + (f" ({own})" if own else "")
        )
    else:
        sentence = ""
    by_hop = ", ".join(hop_text(h) for h in mine[:5])
    out["summary_tail"] = "; ".join(p for p in (sentence, by_hop and f"retries by hop: {by_hop}") if p)
    return out


def _backoff_s(call: Mapping[str, Any] | None) -> float | None:
    return None if call is None or call.get("backoff_ms") is None else float(call["backoff_ms"]) / 1000


def _model_text(call: Mapping[str, Any], before: Mapping[str, Any] | None, short: bool = False) -> str:
    """``openai gpt-4o: 429s 0.4%→12.0%, failed attempts …, failed calls …, retries …, backoff 3.0 s→5.2 min``
    (failed calls: failed after their retries; failed attempts: 5xx, timeouts; the current
    value alone when the window before did not call the model)."""

    def change(column: str) -> str:
        now, was = call.get(column), None if before is None else before.get(column)
        return fmt_pct(now, 1) if was is None else f"{fmt_pct(was, 1)}→{fmt_pct(now, 1)}"

    backoff = fmt_s(_backoff_s(call))
    if before is not None:
        backoff = f"{fmt_s(_backoff_s(before))}→{backoff}"
    parts = [
        f"429s {change('throttle_rate')}",
        f"failed attempts {change('failed_attempt_rate')}",
        f"failed calls {change('error_rate')}",
    ]
    if not short:
        parts.append(f"retries {change('retry_rate')}")
    parts.append(f"backoff {backoff}")
    return f"{_model_name(call.get('provider'), call.get('model'))}: {', '.join(parts)}"


def _provider_signal(
    models: list[dict[str, Any]], before: Mapping[ModelKey, Mapping[str, Any]]
) -> dict[str, str]:
    """The ``llm_*`` annotations of a workflow's retried models, the one that failed most first:
    ``baseline → current`` (the current value alone when the window before did not call it)."""
    main = models[0]
    was = before.get(_model_key(main))

    def pair(now: float | None, then: float | None, digits: int = 4) -> str:
        return _num(now, digits) if was is None else f"{_num(then, digits)} → {_num(now, digits)}"

    def rate(column: str) -> str:
        return pair(main.get(column), None if was is None else was.get(column))

    return {
        "llm_model": _model_name(main.get("provider"), main.get("model")),
        "llm_429_rate": rate("throttle_rate"),
        "llm_failed_attempt_rate": rate("failed_attempt_rate"),
        "llm_error_rate": rate("error_rate"),
        "llm_retry_rate": rate("retry_rate"),
        "llm_backoff_s": pair(_backoff_s(main), _backoff_s(was), 1),
        "llm_signals": " | ".join(_model_text(c, before.get(_model_key(c))) for c in models[:3]),
    }
