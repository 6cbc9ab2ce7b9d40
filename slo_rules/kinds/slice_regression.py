"""``slice_regression``: a feature-flag variant being rolled out that is worse than its control.

Reads the analysis' ``slices`` frame (one row per service, operation, flag and variant, each
non-control row compared with the flag's control). A variant alerts when its p99 is above the
control's by more than ``max_p99_delta_ms`` and the analytics find the step significant, or its
abandonment rate is above the control's by more than ``max_abandonment_delta`` and that difference
is significant; a variant that does better than control never alerts, however significant.

``cause`` says what the variant made worse: ``latency`` when its p99 regressed (a slower tail is
the first explanation of users giving up, so it names the alert even when abandonment rose too),
else ``abandonment``. The slices have no per-variant critical-path attribution, so the LLM/internal
verdict of the other hot-path kinds does not apply here; ``regressed`` lists every condition met.
"""

from __future__ import annotations

from typing import Any

from slo_rules.annotate import fmt_ms, fmt_pct, fmt_s, signed_ms
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish
from slo_rules.rules import SliceRegressionRule
from storage import format_duration

__all__ = ["candidates"]

Row = dict[str, Any]


def candidates(rule: SliceRegressionRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    rows = list(analysis.slices.iter_rows(named=True))
    controls = {_flag_key(r): r for r in rows if r.get("is_control")}
    out: list[Candidate] = []
    for row in rows:
        service, operation = str(row["service"]), str(row["operation"])
        flag, variant = str(row["flag"]), str(row["variant"])
        if row.get("is_control") or not rule.selects_slice(service, operation, flag, variant):
            continue
        control = controls.get(_flag_key(row), {})
        regressed = _regressed(rule, row, control)
        labels = alert_labels(
            rule,
            rule.severity,
            service=service,
            operation=operation,
            path="hot",
            flag=flag,
            variant=variant,
        )

        def annotate(
            row: Row = row, control: Row = control, regressed: list[str] = regressed
        ) -> dict[str, str]:
            return _annotations(rule, ctx, row, control, regressed)

        out.append(
            Candidate(rule, labels, bool(regressed), annotate, **_explained(rule, row, control, regressed))
        )
    if not out:
        ctx.note(rule, f"no variant of a selected flag in the last {format_duration(rule.window)}")
    return out


def _explained(rule: SliceRegressionRule, row: Row, control: Row, regressed: list[str]) -> dict[str, Any]:
    """The candidate's ``reason`` (and ``skipped``): the variant against control in numbers."""
    if not control:
        return {"reason": "no control variant to compare with", "skipped": True}
    n = min(int(row.get("requests") or 0), int(control.get("requests") or 0))
    if n < rule.min_requests:
        return {"reason": f"{n} requests on the smaller side < {rule.min_requests}", "skipped": True}
    p99_delta = float(row.get("p99_delta_ms") or 0.0)
    text = (
        f"p99 {fmt_ms(row.get('p99_ms'))} vs control {fmt_ms(control.get('p99_ms'))} "
        f"({signed_ms(p99_delta)}{'' if row.get('p99_significant') else ', not significant'}), "
        f"abandonment {_rate(row)} vs {_rate(control)}"
    )
    return {"reason": ("worse on " + " and ".join(regressed) + ": " if regressed else "") + text}


def _flag_key(row: Row) -> tuple[str, str, str]:
    return (str(row["service"]), str(row["operation"]), str(row["flag"]))


def _regressed(rule: SliceRegressionRule, row: Row, control: Row) -> list[str]:
    """What the variant made worse than control beyond the rule's limits: ``p99``, ``abandonment``."""
    if (
        not control
        or min(int(row.get("requests") or 0), int(control.get("requests") or 0)) < rule.min_requests
    ):
        return []
    out = []
    p99_delta = row.get("p99_delta_ms")
    if (
        rule.max_p99_delta_ms is not None
        and p99_delta is not None
        and float(p99_delta) > rule.max_p99_delta_ms
        and bool(row.get("p99_significant"))
    ):
        out.append("p99")
    abandonment_delta = row.get("abandonment_delta")
    if (
        rule.max_abandonment_delta is not None
        and abandonment_delta is not None
        and float(abandonment_delta) > rule.max_abandonment_delta
        and bool(row.get("abandonment_significant"))
    ):
        out.append("abandonment")
    return out


def _rate(row: Row) -> str:
    """An abandonment rate with its 95% interval: ``12.0% (10.1–14.2%)``."""
    low, high = row.get("abandonment_rate_low"), row.get("abandonment_rate_high")
    interval = f" ({fmt_pct(low, 1)}–{fmt_pct(high, 1)})" if low is not None and high is not None else ""
    return fmt_pct(row.get("abandonment_rate"), 1) + interval


def _num(value: Any, digits: int) -> str:
    return "n/a" if value is None else f"{float(value):.{digits}f}"


def _interval(row: Row) -> str:
    return f"[{_num(row.get('abandonment_rate_low'), 4)}, {_num(row.get('abandonment_rate_high'), 4)}]"


def _pair(control: Row, row: Row, column: str, digits: int) -> str:
    """``control → variant``, the way the release kinds write ``before → after``."""
    return f"{_num(control.get(column), digits)} → {_num(row.get(column), digits)}"


def _annotations(
    rule: SliceRegressionRule, ctx: Context, row: Row, control: Row, regressed: list[str]
) -> dict[str, str]:
    service, operation = row["service"], row["operation"]
    flag, variant, control_name = row["flag"], row["variant"], row.get("control") or ""
    p99_delta = float(row.get("p99_delta_ms") or 0.0)
    abandonment_delta = float(row.get("abandonment_delta") or 0.0)
    head = (
        f"{service} {operation}: variant {variant} of flag {flag} is worse than control {control_name} "
        f"on {' and '.join(regressed)}: "
        f"p99 {fmt_ms(row.get('p99_ms'))} vs {fmt_ms(control.get('p99_ms'))} ({signed_ms(p99_delta)}), "
        f"abandonment {_rate(row)} vs {_rate(control)} ({abandonment_delta * 100:+.1f} pp); "
        f"{row.get('requests')} vs {control.get('requests')} requests, "
        f"{_num(row.get('sync_llm_calls_per_request'), 2)} vs "
        f"{_num(control.get('sync_llm_calls_per_request'), 2)} sync LLM calls per request"
    )
    # Work moved to a queue: what those users now wait for instead of the response.
    for who, side in (("the work it queues", row), ("control's queued work", control)):
        if side.get("cold_p99_s") is not None:
            head += (
                f"; {who} is ready after {fmt_s(float(side['cold_p99_s']))} at p99 "
                f"({side.get('cold_jobs')} jobs)"
            )
    extra = {
        "cause": "latency" if "p99" in regressed else "abandonment",
        "regressed": ",".join(regressed),
        "control": str(control_name),
        "requests": f"{control.get('requests')} → {row.get('requests')}",
        "p50_ms": _pair(control, row, "p50_ms", 1),
        "p99_ms": _pair(control, row, "p99_ms", 1),
        "p99_delta_ms": f"{p99_delta:.1f}",
        "abandonment_rate": _pair(control, row, "abandonment_rate", 4),
        "abandonment_rate_interval": f"{_interval(control)} → {_interval(row)}",
        "abandonment_delta": f"{abandonment_delta:.4f}",
        "sync_llm_calls_per_request": _pair(control, row, "sync_llm_calls_per_request", 2),
        "dashboard": ctx.dashboard("boundary"),
    }
    if row.get("cold_p99_s") is not None or control.get("cold_p99_s") is not None:
        extra["cold_p99_s"] = _pair(control, row, "cold_p99_s", 3)
        extra["cold_jobs"] = f"{control.get('cold_jobs')} → {row.get('cold_jobs')}"
    return finish(extra, head, {}, rule)
