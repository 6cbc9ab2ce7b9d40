"""``latency_slo``: multiwindow burn-rate alerts on the good/total counts of a hot-path operation.

Each tier (SRE Workbook, "Alerting on SLOs") fires when both its long and its short window burn the
error budget faster than its factor. Tiers of one SLO share a candidate ``group`` and are ranked
fastest first, so the lifecycle keeps a slower tier quiet while a faster one already paged.
"""

from __future__ import annotations

from datetime import timedelta

import polars as pl

from slo_rules.annotate import fmt_ms, fmt_pct
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import BurnRateTier, LatencySloRule
from storage import format_duration

__all__ = ["burn_rate", "candidates"]

Counts = dict[tuple[str, str], tuple[float, float]]  # (service, operation) → (good, total)


def burn_rate(good: float, total: float, target: float) -> float:
    """How fast the error budget burns: (bad / total) / (1 − target); 0 without traffic."""
    if total <= 0:
        return 0.0
    return ((total - good) / total) / (1.0 - target)


def candidates(rule: LatencySloRule, ctx: Context) -> list[Candidate]:
    tiers = rule.tiers()
    counts = _counts(rule, ctx, [length for tier in tiers for length in (tier.long, tier.short_window)])
    keys = sorted({key for table in counts.values() for key in table})
    out: list[Candidate] = []
    for service, operation in keys:
        for rank, tier in enumerate(tiers):
            good_l, total_l = counts[tier.long].get((service, operation), (0.0, 0.0))
            good_s, total_s = counts[tier.short_window].get((service, operation), (0.0, 0.0))
            burn_l = burn_rate(good_l, total_l, rule.target)
            burn_s = burn_rate(good_s, total_s, rule.target)
            active = total_l >= rule.min_events and burn_l >= tier.factor and burn_s >= tier.factor
            labels = alert_labels(
                rule,
                tier.severity,
                service=service,
                operation=operation,
                path="hot",
                slo_window=format_duration(tier.long),
            )

            def annotate(
                tier: BurnRateTier = tier,
                service: str = service,
                operation: str = operation,
                burn_l: float = burn_l,
                burn_s: float = burn_s,
                total_l: float = total_l,
                good_l: float = good_l,
            ) -> dict[str, str]:
                long_w, short_w = format_duration(tier.long), format_duration(tier.short_window)
                head = (
                    f"{operation} ({service}): error budget burning {burn_l:.1f}× over {long_w} and "
                    f"{burn_s:.1f}× over {short_w} (limit {tier.factor:g}×; SLO {fmt_pct(rule.target, 1)} "
                    f"under {fmt_ms(rule.threshold_ms)} over {format_duration(rule.window)})"
                )
                start, end = ctx.window(tier.long)
                attribution = ctx.attribution(start, end, service, operation, None)
                budget_used = burn_l * tier.long / rule.window
                return finish(
                    {
                        "burn_rate_long": f"{burn_l:.2f}",
                        "burn_rate_short": f"{burn_s:.2f}",
                        "burn_rate_threshold": f"{tier.factor:g}",
                        "windows": f"{long_w}/{short_w}",
                        "slow_requests": f"{int(total_l - good_l)}/{int(total_l)}",
                        "error_budget_consumed": f"{budget_used:.3f}",
                        "dashboard": ctx.dashboard("attribution"),
                    },
                    head,
                    attribution,
                    rule,
                )

            out.append(
                Candidate(
                    rule,
                    labels,
                    active,
                    annotate,
                    group=f"{rule.name}\x00{service}\x00{operation}",
                    rank=rank,
                    long_window=tier.long,
                    reason=(
                        f"burn {burn_l:.1f}× over {format_duration(tier.long)}, {burn_s:.1f}× over "
                        f"{format_duration(tier.short_window)} (fires at {tier.factor:g}× on both); "
                        f"{int(total_l - good_l)}/{int(total_l)} requests slower than "
                        f"{fmt_ms(rule.threshold_ms)}"
                    )
                    if total_l >= rule.min_events
                    else f"{int(total_l)} requests over {format_duration(tier.long)} < {rule.min_events}",
                    skipped=total_l < rule.min_events,
                )
            )
    if not out:
        ctx.note(rule, f"no request of a selected operation in the last {format_duration(rule.window)}")
    return out


def _counts(rule: LatencySloRule, ctx: Context, lengths: list[timedelta]) -> dict[timedelta, Counts]:
    """Good/total per selected operation, read once per distinct window length (tiers share them)."""
    out: dict[timedelta, Counts] = {}
    for length in lengths:
        if length not in out:
            start, end = ctx.window(length)
            out[length] = _selected(rule, ctx.source.good_total(start, end, rule.threshold_ms))
    return out


def _selected(rule: LatencySloRule, frame: pl.DataFrame) -> Counts:
    table: Counts = {}
    for row in frame.iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        if rule.selects(*key):
            table[key] = (float(row["good"]), float(row["total"]))
    return table
