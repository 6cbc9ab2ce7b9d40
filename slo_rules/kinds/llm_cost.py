"""``llm_cost_regression`` and ``llm_cache_drop``: a model's cost up, or its prompt-cache hits down,
against the window of equal length before (the analysis' ``llm_anatomy``, one row per provider and
model).

Cost needs the model's price (``[[analysis.prices]]``): a model without one has no cost and raises
nothing (a team without prices gets no noise). The summary says what moved with it — prompt or output
length, the cached share, calls — so the alert reads "our prompt grew" or "we lost the cache" rather
than "the bill went up".
"""

from __future__ import annotations

from typing import Any

from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import LlmCacheDropRule, LlmCostRegressionRule
from storage import format_duration

__all__ = ["cache_candidates", "cost_candidates"]


def _usd(value: Any) -> str:
    if value is None:
        return "?"
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _tokens(row: dict[str, Any], name: str) -> str:
    before, after = row.get(f"baseline_{name}"), row.get(name)
    if before is None or after is None:
        return ""
    return f"{name.replace('_p50', '').replace('_', ' ')} p50 {before:,.0f} → {after:,.0f}"


def _moved_with(row: dict[str, Any]) -> str:
    """What moved beside the cost: prompt and output length, the cached share, calls."""
    parts = [_tokens(row, "input_tokens_p50"), _tokens(row, "output_tokens_p50")]
    before, after = row.get("baseline_cached_input_ratio"), row.get("cached_input_ratio")
    if before is not None and after is not None:
        parts.append(f"cached input {before:.0%} → {after:.0%}")
    parts.append(f"calls {row.get('baseline_calls') or 0:,} → {row.get('calls') or 0:,}")
    return ", ".join(p for p in parts if p)


def _request_candidates(rule: LlmCostRegressionRule, ctx: Context, analysis: Any) -> list[Candidate]:
    """``per: request``: one candidate per hot operation whose requests make model calls."""
    costs = getattr(analysis, "llm_costs", None)  # absent from analyses that predate it
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in [] if costs is None else costs.iter_rows(named=True):
        if row["version"] == "" and rule.selects(str(row["service"]), str(row["operation"])):
            rows.setdefault((str(row["service"]), str(row["operation"])), {})[str(row["window"])] = row
    out: list[Candidate] = []
    unpriced: list[str] = []
    for (service, operation), windows in sorted(rows.items()):
        now, then = windows.get("current", {}), windows.get("baseline", {})
        if not now.get("sync_llm_calls_per_request") and not then.get("sync_llm_calls_per_request"):
            continue  # no model calls on its requests: nothing to cost
        before, after = then.get("llm_cost_per_request"), now.get("llm_cost_per_request")
        if before is None and after is None:
            unpriced.append(f"{service} {operation}")
            continue
        requests, baseline_requests = int(now.get("requests") or 0), int(then.get("requests") or 0)
        fewest = min(requests, baseline_requests)
        skipped = fewest < rule.min_calls or not before or after is None
        increase = (after / before - 1.0) if (before and after is not None) else None
        reason = (
            f"{fewest} requests < {rule.min_calls} in a window"
            if fewest < rule.min_calls
            else f"cost per request {_usd(before)} → {_usd(after)}"
            + (f" ({increase:+.0%}, limit +{rule.max_increase:.0%})" if increase is not None else "")
        )
        active = not skipped and increase is not None and increase > rule.max_increase
        labels = alert_labels(rule, rule.severity, service=service, operation=operation)

        def annotate(
            service: str = service, operation: str = operation, now: Any = now, then: Any = then
        ) -> dict[str, str]:
            calls = (
                f"model calls per request {then.get('sync_llm_calls_per_request') or 0:.2f} → "
                f"{now.get('sync_llm_calls_per_request') or 0:.2f}"
            )
            tokens = (
                f"tokens per request {then.get('llm_tokens_per_request') or 0:,.0f} → "
                f"{now.get('llm_tokens_per_request') or 0:,.0f}"
            )
            head = (
                f"{service} {operation}: cost per request {_usd(then.get('llm_cost_per_request'))} → "
                f"{_usd(now.get('llm_cost_per_request'))} over {format_duration(rule.window)}; "
                f"{tokens}, {calls}"
            )
            extra = {
                "cause": "llm",
                "baseline_cost_per_request": f"{then.get('llm_cost_per_request') or 0:.6f}",
                "cost_per_request": f"{now.get('llm_cost_per_request') or 0:.6f}",
                "dashboard": ctx.dashboard("llm"),
            }
            return finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, active, annotate, reason=reason, skipped=skipped))
    if not out:
        why = (
            f"no price for a model {', '.join(unpriced)} calls (add it under [[analysis.prices]])"
            if unpriced
            else f"no hot request with model calls in the last {format_duration(rule.window)}"
        )
        ctx.note(rule, why)
    return out


def cost_candidates(rule: LlmCostRegressionRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    if rule.per == "request":
        return _request_candidates(rule, ctx, analysis)
    anatomy = getattr(analysis, "llm_anatomy", None)  # absent from analyses that predate it
    measure = "cost_per_day" if rule.per == "day" else "cost_per_1k_calls"
    unit = "a day" if rule.per == "day" else "per 1,000 calls"
    out: list[Candidate] = []
    unpriced: list[str] = []
    for row in [] if anatomy is None else anatomy.iter_rows(named=True):
        provider, model = str(row["provider"]), str(row["model"])
        if not rule.selects_model(provider, model):
            continue
        before, after = row.get(f"baseline_{measure}"), row.get(measure)
        if after is None and before is None:
            unpriced.append(f"{provider} {model}")
            continue
        calls, baseline_calls = int(row.get("calls") or 0), int(row.get("baseline_calls") or 0)
        skipped = min(calls, baseline_calls) < rule.min_calls or not before or after is None
        increase = (after / before - 1.0) if (before and after is not None) else None
        reason = (
            f"{min(calls, baseline_calls)} calls < {rule.min_calls} in a window"
            if min(calls, baseline_calls) < rule.min_calls
            else f"cost {unit} {_usd(before)} → {_usd(after)}"
            + (f" ({increase:+.0%}, limit +{rule.max_increase:.0%})" if increase is not None else "")
        )
        active = not skipped and increase is not None and increase > rule.max_increase
        labels = alert_labels(rule, rule.severity, provider=provider, model=model)

        def annotate(row: dict[str, Any] = row, before: Any = before, after: Any = after) -> dict[str, str]:
            head = (
                f"{row['provider']} {row['model']}: cost {unit} {_usd(before)} → {_usd(after)} "
                f"over {format_duration(rule.window)}; {_moved_with(row)}"
            )
            extra = {
                "cause": "llm",
                "provider": str(row["provider"]),
                "model": str(row["model"]),
                f"baseline_{measure}": f"{before:.6f}" if before is not None else "",
                measure: f"{after:.6f}" if after is not None else "",
                "dashboard": ctx.dashboard("llm"),
            }
            return finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, active, annotate, reason=reason, skipped=skipped))
    if not out:
        why = (
            f"no price for {', '.join(unpriced)} (add it under [[analysis.prices]])"
            if unpriced
            else f"no call to a selected model in the last {format_duration(rule.window)}"
        )
        ctx.note(rule, why)
    return out


def cache_candidates(rule: LlmCacheDropRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    anatomy = getattr(analysis, "llm_anatomy", None)
    out: list[Candidate] = []
    for row in [] if anatomy is None else anatomy.iter_rows(named=True):
        provider, model = str(row["provider"]), str(row["model"])
        if not rule.selects_model(provider, model):
            continue
        before, after = row.get("baseline_cached_input_ratio"), row.get("cached_input_ratio")
        if before is None or before < rule.min_baseline_ratio:
            continue  # a model that did not use the cache has none to lose
        calls, baseline_calls = int(row.get("calls") or 0), int(row.get("baseline_calls") or 0)
        skipped = min(calls, baseline_calls) < rule.min_calls or after is None
        drop = before - after if after is not None else None
        reason = (
            f"{min(calls, baseline_calls)} calls < {rule.min_calls} in a window"
            if min(calls, baseline_calls) < rule.min_calls
            else f"cached input {before:.0%} → {after:.0%} (limit −{rule.max_drop:.0%})"
            if after is not None
            else "no input tokens now"
        )
        active = not skipped and drop is not None and drop > rule.max_drop
        labels = alert_labels(rule, rule.severity, provider=provider, model=model)

        def annotate(row: dict[str, Any] = row, before: float = before, after: Any = after) -> dict[str, str]:
            cost = ""
            if row.get("cost_per_1k_calls") is not None and row.get("baseline_cost_per_1k_calls") is not None:
                cost = (
                    f"; cost per 1,000 calls {_usd(row['baseline_cost_per_1k_calls'])} → "
                    f"{_usd(row['cost_per_1k_calls'])}"
                )
            ttft = ""
            if row.get("ttft_p50_ms") is not None and row.get("baseline_ttft_p50_ms") is not None:
                ttft = (
                    f"; time to first token p50 {row['baseline_ttft_p50_ms']:.0f} → "
                    f"{row['ttft_p50_ms']:.0f} ms"
                )
            head = (
                f"{row['provider']} {row['model']}: prompt-cache hits dropped, cached input "
                f"{before:.0%} → {after:.0%} of input tokens over {format_duration(rule.window)}{cost}{ttft} "
                "(a changed prompt prefix, a new system prompt or tool list, or an expired cache)"
            )
            extra = {
                "cause": "llm",
                "provider": str(row["provider"]),
                "model": str(row["model"]),
                "baseline_cached_input_ratio": f"{before:.4f}",
                "cached_input_ratio": f"{after:.4f}" if after is not None else "",
                "dashboard": ctx.dashboard("llm"),
            }
            return finish(extra, head, {}, rule)

        out.append(Candidate(rule, labels, active, annotate, reason=reason, skipped=skipped))
    if not out:
        ctx.note(
            rule,
            "no selected model read from its prompt cache in the window before the last "
            + format_duration(rule.window),
        )
    return out
