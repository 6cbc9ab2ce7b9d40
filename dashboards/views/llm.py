"""LLM calls: per provider and model the anatomy of a call — time to first token, time per output
token, prompt and output length, prompt cache, calls and cost — the current window beside the
baseline; then, for each regression whose verdict is ``llm``, the anatomy bar of its delta: which
part of the model call moved (first token, generation, backoff, more calls) and whether that is our
change or the provider's.

Read the model panels as dumbbells: per model (one row each, busiest first) a grey circle at the
baseline window's figure, a dark blue one at the current window's, a line between them. A figure the
analysis **estimated** (no call of the model recorded its first token, so the fixed part and the
time per output token come from a robust line through duration against output tokens,
``analytics.llm_anatomy``) is an open diamond with its 95% interval as error bars. The anatomy bars
share one scale: the LLM delta on the tail's critical path, split into its parts.

Between the two, per model, the current window over time (``llm_anatomy_series``): time to first
token p50 and p99, time per output token and tokens per call, each with the baseline window's p50
dotted across. The series holds measured calls only (an estimate needs a window's calls, not a
bucket's): a model whose calls record no first token draws its tokens over time, and says so.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, naive_utc
from dashboards.views._common import (
    DT_HOVER,
    MAX_PANELS,
    VIEW_TITLES,
    count_of,
    empty_figure,
    left_out,
    op_label,
    window_subtitle,
)

__all__ = [
    "ANATOMY_PARTS",
    "NO_CALLS_TEXT",
    "NO_CURRENT_CALLS_TEXT",
    "NO_LLM_REGRESSION_TEXT",
    "NO_PRICES_TEXT",
    "NO_SERIES_TEXT",
    "NO_TTFT_SERIES_TEXT",
    "PANELS",
    "SERIES_PANELS",
    "Panel",
    "cause_side",
    "llm_figure",
    "llm_headline",
    "model_label",
]

NO_CALLS_TEXT: Final = "no model calls in this window or its baseline"
NO_PRICES_TEXT: Final = (
    "no prices configured, so no cost:<br>add a <b>[[analysis.prices]]</b> table per model to tailwatch.toml"
    "<br>(provider, model, input, cached_input and output in USD per million tokens)"
)
NO_LLM_REGRESSION_TEXT: Final = (
    "no p99 regression with the verdict llm in this window: no anatomy bar to draw"
)
NO_SERIES_TEXT: Final = (
    "no series over time with this analysis (llm_anatomy_series is empty: a run stored before it existed)"
)
NO_TTFT_SERIES_TEXT: Final = "no call recorded its first token:<br>estimated per window only (above)"
NO_CURRENT_CALLS_TEXT: Final = "no calls in the current window (the baseline's are above)"
SERIES_PANELS: Final = (
    "time to first token over time",
    "time per output token over time, p50",
    "tokens per call over time, p50",
)
OUTPUT_TOKENS: Final = style.TOKENS

CURRENT: Final = style.OBSERVED  # dark blue
BASELINE: Final = "#9aa0a6"
# The parts of a model call's delta: shades of purple for the model's own time (never the LLM
# colour itself, which names the whole LLM share elsewhere), orange for calls we added.
ANATOMY_PARTS: Final[tuple[tuple[str, str, str], ...]] = (
    ("llm_first_token_ms", "first token", "#4a235a"),
    ("llm_generation_ms", "generation", "#a569bd"),
    ("llm_backoff_ms", "backoff (throttling, retries)", "#d7bde2"),
    ("llm_more_calls_ms", "more calls", "#f0b27a"),
)


@dataclass(frozen=True)
class Panel:
    """One model panel: the anatomy column it draws (``baseline_`` + it on the baseline side), its
    title, the axis and how a value reads; ``estimate``: the interval columns of an estimated figure."""

    column: str
    title: str
    axis: str
    fmt: Callable[[float], str]
    estimate: tuple[str, str] | None = None
    percent: bool = False
    money: bool = False


def _ms(v: float) -> str:
    return f"{v / 1000:,.2f} s" if abs(v) >= 1000 else f"{v:,.0f} ms"


def _ms_fine(v: float) -> str:
    return f"{v:,.1f} ms"


def _tokens(v: float) -> str:
    return f"{v:,.0f} tokens"


def _usd(v: float) -> str:
    return f"${v:,.2f}" if abs(v) >= 1 else f"${v:,.4f}"


PANELS: Final[tuple[tuple[Panel, Panel, Panel], ...]] = (
    (
        Panel(
            "ttft_p50_ms",
            "time to first token, p50",
            "ms",
            _ms,
            ("ttft_estimate_low_ms", "ttft_estimate_high_ms"),
        ),
        Panel("ttft_p99_ms", "time to first token, p99 (measured only)", "ms", _ms),
        Panel(
            "ms_per_output_token_p50",
            "time per output token, p50",
            "ms per token",
            _ms_fine,
            ("per_token_estimate_low_ms", "per_token_estimate_high_ms"),
        ),
    ),
    (
        Panel("input_tokens_p50", "input tokens per call, p50", "tokens", _tokens),
        Panel("output_tokens_p50", "output tokens per call, p50", "tokens", _tokens),
        Panel(
            "cached_input_ratio", "cached share of input tokens", "share", lambda v: f"{v:.1%}", percent=True
        ),
    ),
    (
        Panel("calls", "calls in the window", "calls", lambda v: f"{v:,.0f} calls"),
        Panel("cost_per_1k_calls", "cost per 1,000 calls", "USD", _usd, money=True),
        Panel("cost_per_day", "cost per day", "USD a day", _usd, money=True),
    ),
)

# Pixels: one line of text, a panel's title line, a model row of a panel, the x ticks and axis title
# under a panel, an anatomy bar.
LINE_PX: Final = 20
TITLE_PX: Final = 26
MODEL_PX: Final = 34
AXIS_PX: Final = 62
BAR_PX: Final = 70
SERIES_PX: Final = 150
SECTION_GAP_PX: Final = 30
TOP_TITLE_PX: Final = 16
COLUMNS: Final = ((0.0, 0.28), (0.36, 0.64), (0.72, 1.0))
# Regressions or models named on the landing page's line before "and N more".
HEADLINE_NAMES: Final = 3
# Characters of a model label before it is cut (the y tick labels sit in the left margin).
LABEL_CHARS: Final = 44


def model_label(provider: str | None, model: str | None) -> str:
    """``provider / model``, escaped, cut to :data:`LABEL_CHARS` characters before escaping."""
    text = f"{provider or '—'} / {model or '—'}"
    if len(text) > LABEL_CHARS:
        text = text[: LABEL_CHARS - 1] + "…"
    return esc(text)


def cause_side(row: dict[str, Any]) -> str:
    """Whose change an llm cause is: "our change" (the prompt, the output or the calls grew), "the
    provider", or "several parts" when no part dominates (``mixed``)."""
    if row.get("llm_cause_ours"):
        return "our change"
    return "several parts" if row.get("llm_cause") == "mixed" else "the provider"


def _key(colour: str, symbol: str = "●") -> str:
    """A coloured mark naming a series in a text line (the view has no legend)."""
    return f'<span style="color:{colour}">{symbol}</span>'


class _Layout:
    """Stacks blocks of the figure top to bottom in pixels, then maps them to paper fractions."""

    def __init__(self) -> None:
        self.px = 0.0
        self.axes = 0

    def take(self, px: float) -> tuple[float, float]:
        top = self.px
        self.px += px
        return top, self.px

    def axis(self) -> tuple[str, str]:
        self.axes += 1
        n = "" if self.axes == 1 else str(self.axes)
        return f"x{n}", f"y{n}"


def llm_figure(analysis: Analysis) -> go.Figure:
    """Per model the anatomy of its calls, baseline → current, and over time; per llm regression its
    anatomy bar."""
    anatomy = analysis.llm_anatomy
    if not anatomy.height:
        return empty_figure("llm", analysis, NO_CALLS_TEXT)
    models = anatomy.with_columns(
        (pl.col("calls").fill_null(0) + pl.col("baseline_calls").fill_null(0)).alias("_busy")
    ).sort(["_busy", "provider", "model"], descending=[True, False, False])
    shown = models.head(MAX_PANELS)
    rows = list(shown.iter_rows(named=True))
    labels = [model_label(r["provider"], r["model"]) for r in rows]
    regressions = _regressions(analysis.attribution)

    fig = go.Figure()
    layout = _Layout()
    texts: list[tuple[float, str, dict[str, Any]]] = []  # (px from the top, text, annotation options)
    axes: dict[str, Any] = {}
    domains: list[tuple[str, str, tuple[float, float], tuple[float, float]]] = []

    # Section 1: the model panels.
    header = [
        f"<b>Per model</b>: {_key(BASELINE)} baseline → {_key(CURRENT)} current; "
        f"{_key(CURRENT, '◇')} estimated from call durations (no first token recorded), "
        "with its 95% interval",
    ]
    top, _ = layout.take(LINE_PX * len(header))
    texts.append((top, "<br>".join(header), {"x": 0.0, "xanchor": "left", "align": "left"}))
    panel_px = max(2, len(rows)) * MODEL_PX
    priced = any(r[c] is not None for r in rows for c in ("cost_per_1k_calls", "baseline_cost_per_1k_calls"))
    unpriced = [labels[i] for i, r in enumerate(rows) if r["calls"] and r["cost_per_1k_calls"] is None]
    for panel_row in PANELS:
        title_top, _ = layout.take(TITLE_PX)
        y_domain_px = layout.take(panel_px)
        layout.take(AXIS_PX)
        if priced and unpriced and any(p.money for p in panel_row):
            # Some models have a price, some not: name those without, under both cost panels.
            top, _ = layout.take(LINE_PX * 2)
            names = ", ".join(unpriced[:2]) + (f" and {len(unpriced) - 2} more" if len(unpriced) > 2 else "")
            texts.append(
                (
                    top,
                    f"no price for {names}:<br>add {'it' if len(unpriced) == 1 else 'them'} to "
                    "[[analysis.prices]]",
                    {"x": (COLUMNS[1][0] + COLUMNS[2][1]) / 2, "xanchor": "center", "align": "center"},
                )
            )
        for col, panel in enumerate(panel_row):
            if panel.money and not priced:
                if col == 1:
                    # No price for any model: say how to get one, across both cost panels.
                    texts.append(
                        (
                            y_domain_px[0] + panel_px / 2 - 1.5 * LINE_PX,
                            NO_PRICES_TEXT,
                            {
                                "x": (COLUMNS[1][0] + COLUMNS[2][1]) / 2,
                                "xanchor": "center",
                                "align": "center",
                            },
                        )
                    )
                continue
            xa, ya = layout.axis()
            domains.append((xa, ya, COLUMNS[col], y_domain_px))
            texts.append(
                (
                    title_top + 4,
                    f"<b>{panel.title}</b>",
                    {"x": sum(COLUMNS[col]) / 2, "xanchor": "center", "align": "center"},
                )
            )
            axes[xa] = _x_axis(panel)
            axes[ya] = {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": labels,
                "autorange": "reversed",
                "showticklabels": col == 0,
                "showgrid": False,
            }
            for trace in _dumbbells(panel, rows, labels, xa, ya):
                fig.add_trace(trace)

    # Section 2: per model, the current window's series with the baseline window's figure.
    layout.take(SECTION_GAP_PX)
    top, _ = layout.take(LINE_PX * 2)
    texts.append(
        (
            top,
            "<b>Over time</b>, current window: "
            f"{_key(CURRENT, '━')} p50 {_key(CURRENT, '╍')} p99 (first token) · "
            f"{_key(CURRENT, '━')} input {_key(OUTPUT_TOKENS, '━')} output (tokens) · "
            f"{_key(BASELINE, '┈')} the baseline window's p50<br>"
            "measured calls only: a model whose calls record no first token has its tokens over time, "
            "not its first token",
            {"x": 0.0, "xanchor": "left", "align": "left"},
        )
    )
    series = analysis.llm_anatomy_series
    if not series.height:
        top, _ = layout.take(LINE_PX * 2)
        texts.append((top + 4, NO_SERIES_TEXT, {"x": 0.0, "xanchor": "left", "align": "left"}))
    for row, label in zip(rows, labels, strict=True) if series.height else ():
        mine = series.filter(
            (pl.col("provider") == row["provider"]) & (pl.col("model") == row["model"])
        ).sort("bucket_start")
        top, _ = layout.take(LINE_PX + 4)
        if not mine.height:
            # Called in the baseline window only: nothing to draw over the current one.
            texts.append(
                (
                    top + 2,
                    f"<b>{label}</b>: {NO_CURRENT_CALLS_TEXT}",
                    {"x": 0.0, "xanchor": "left", "align": "left"},
                )
            )
            layout.take(LINE_PX)
            continue
        texts.append((top + 2, f"<b>{label}</b>", {"x": 0.0, "xanchor": "left", "align": "left"}))
        title_top, _ = layout.take(TITLE_PX)
        y_domain_px = layout.take(SERIES_PX)
        layout.take(AXIS_PX)
        measured = mine.filter(pl.col("ttft_p50_ms").is_not_null()).height > 0
        for col, title in enumerate(SERIES_PANELS):
            texts.append(
                (
                    title_top + 4,
                    f"<b>{title}</b>",
                    {"x": sum(COLUMNS[col]) / 2, "xanchor": "center", "align": "center"},
                )
            )
            xa, ya = layout.axis()
            domains.append((xa, ya, COLUMNS[col], y_domain_px))
            axes[xa] = {
                "type": "date",
                "range": [naive_utc(analysis.start), naive_utc(analysis.end)],
                "title": {"text": "time (UTC)", "standoff": 4},
                "nticks": 5,
                # Hours only (the day is in the subtitle), pushed below the y axis' 0 at the corner.
                "tickformat": "%H:%M",
                "ticks": "outside",
                "ticklen": 10,
                "tickcolor": "rgba(0,0,0,0)",
            }
            axes[ya] = {"rangemode": "tozero", "title": {"text": ("ms", "ms per token", "tokens")[col]}}
            if col < 2 and not measured:
                texts.append(
                    (
                        y_domain_px[0] + SERIES_PX / 2 - LINE_PX,
                        NO_TTFT_SERIES_TEXT,
                        {"x": sum(COLUMNS[col]) / 2, "xanchor": "center", "align": "center"},
                    )
                )
                axes[ya]["range"] = [0, 1]
                axes[ya]["showticklabels"] = False
                continue
            for trace in _series_traces(col, row, label, mine, analysis, xa, ya):
                fig.add_trace(trace)

    # Section 3: the anatomy bar of each llm regression.
    layout.take(SECTION_GAP_PX)
    top, _ = layout.take(LINE_PX * 2)
    parts = " ".join(f"{_key(colour, '■')} {name}" for _, name, colour in ANATOMY_PARTS)
    texts.append(
        (
            top,
            "<b>Anatomy of each llm regression</b>: the LLM delta on the tail's critical path, by part<br>"
            + parts,
            {"x": 0.0, "xanchor": "left", "align": "left"},
        )
    )
    if not regressions:
        top, _ = layout.take(LINE_PX * 2)
        texts.append((top + 4, NO_LLM_REGRESSION_TEXT, {"x": 0.0, "xanchor": "left", "align": "left"}))
    bar_range = _shared_range(regressions)
    for r in regressions[:MAX_PANELS]:
        top, _ = layout.take(LINE_PX * 2 + 6)
        texts.append((top + 2, _bar_headline(r), {"x": 0.0, "xanchor": "left", "align": "left"}))
        y_domain_px = layout.take(BAR_PX)
        layout.take(AXIS_PX)
        xa, ya = layout.axis()
        domains.append((xa, ya, (0.0, 1.0), y_domain_px))
        label = model_label(r.get("llm_cause_provider"), r.get("llm_cause_model"))
        for trace in _anatomy_bar(r, label, xa, ya):
            fig.add_trace(trace)
        axes[xa] = {
            "title": {"text": "Δ ms on the tail's critical path, baseline → current", "standoff": 4},
            "range": bar_range,
            "zeroline": True,
            "ticksuffix": " ms",
        }
        axes[ya] = {"type": "category", "showgrid": False}

    total = layout.px
    for xa, ya, (x0, x1), (top, bottom) in domains:
        axes[xa]["domain"] = [x0, x1]
        axes[xa]["anchor"] = ya
        axes[ya]["domain"] = [1.0 - bottom / total, 1.0 - top / total]
        axes[ya]["anchor"] = xa
    for px, text, options in texts:
        fig.add_annotation(
            text=text,
            xref="paper",
            yref="paper",
            y=1.0 - px / total,
            yanchor="top",
            showarrow=False,
            font={"size": 13},
            **options,
        )
    extra = ", ".join(
        t
        for t in (
            left_out(len(rows), anatomy.height, "models"),
            left_out(min(len(regressions), MAX_PANELS), len(regressions), "llm regressions"),
        )
        if t
    )
    subtitle = (
        f"{style.fmt_window(analysis.start, analysis.end)} vs baseline "
        f"{style.fmt_window(analysis.baseline_start, analysis.baseline_end)} · "
        f"{count_of(anatomy.height, 'model')}"
    )
    if extra:
        subtitle += f" · {extra}"
    margin = dict(style.base_layout(VIEW_TITLES["llm"], window_subtitle(analysis), 1)["margin"])
    margin["l"] = max(margin["l"], 20 + 7 * max(len(_plain(lb)) for lb in labels))
    margin["t"] = 80
    height = int(margin["t"] + margin["b"] + total)
    fig.update_layout(**style.base_layout(VIEW_TITLES["llm"], subtitle, height), showlegend=False)
    fig.update_layout(
        margin=margin,
        barmode="relative",
        title={"yref": "container", "y": 1.0 - TOP_TITLE_PX / height, "yanchor": "top"},
        **{_layout_key(k): v for k, v in axes.items()},
    )
    return fig


def _plain(label: str) -> str:
    """A label as drawn (its length: an entity is one character)."""
    return html.unescape(label)


def _layout_key(ref: str) -> str:
    return ref.replace("x", "xaxis").replace("y", "yaxis")


def _x_axis(panel: Panel) -> dict[str, Any]:
    axis: dict[str, Any] = {
        "title": {"text": panel.axis, "standoff": 4},
        "rangemode": "tozero",
        "zeroline": True,
    }
    if panel.percent:
        axis.update(range=[0, 1.05], tickformat=".0%")
    if panel.money:
        axis.update(tickprefix="$")
    return axis


def _side(row: dict[str, Any], prefix: str, panel: Panel) -> tuple[float | None, tuple[float, float] | None]:
    """The panel's value on one side and, when the figure is estimated, its 95% interval."""
    value = row.get(prefix + panel.column)
    if value is None:
        return None, None
    if panel.estimate is not None and row.get(prefix + "ttft_source") == "estimated":
        lo, hi = (row.get(prefix + c) for c in panel.estimate)
        return float(value), (float(lo if lo is not None else value), float(hi if hi is not None else value))
    return float(value), None


def _dumbbells(
    panel: Panel, rows: list[dict[str, Any]], labels: list[str], xa: str, ya: str
) -> list[go.Scatter]:
    """Per model a line from the baseline to the current figure, and a mark at each (an open diamond
    with error bars where estimated)."""
    lines_x: list[float | None] = []
    lines_y: list[str | None] = []
    marks: dict[tuple[str, bool], dict[str, list[Any]]] = {}
    for row, label in zip(rows, labels, strict=True):
        sides = {}
        for side, prefix in (("baseline", "baseline_"), ("current", "")):
            value, interval = _side(row, prefix, panel)
            sides[side] = value
            if value is None:
                continue
            what = "estimated" if interval else ("measured" if panel.estimate else "")
            text = panel.fmt(value)
            if interval:
                text += f" (95% interval {panel.fmt(interval[0])} – {panel.fmt(interval[1])})"
            other = row.get(("" if side == "baseline" else "baseline_") + panel.column)
            other_text = panel.fmt(other) if other is not None else "n/a"
            change = f"{'current' if side == 'baseline' else 'baseline'}: {other_text}"
            m = marks.setdefault(
                (side, interval is not None), {"x": [], "y": [], "lo": [], "hi": [], "cd": []}
            )
            m["x"].append(value)
            m["y"].append(label)
            m["lo"].append(value - interval[0] if interval else 0.0)
            m["hi"].append(interval[1] - value if interval else 0.0)
            m["cd"].append([label, esc(panel.title), side, text + (f", {what}" if what else ""), change])
        if sides["baseline"] is not None and sides["current"] is not None:
            lines_x += [sides["baseline"], sides["current"], None]
            lines_y += [label, label, None]
    traces: list[go.Scatter] = []
    if lines_x:
        traces.append(
            go.Scatter(
                x=lines_x,
                y=lines_y,
                mode="lines",
                line={"color": "#cfd4da", "width": 3},
                hoverinfo="skip",
                name="baseline → current",
                xaxis=xa,
                yaxis=ya,
            )
        )
    for (side, estimated), m in sorted(marks.items()):
        colour = CURRENT if side == "current" else BASELINE
        trace: dict[str, Any] = {
            "x": m["x"],
            "y": m["y"],
            "mode": "markers",
            "name": f"{side}, estimated" if estimated else side,
            "marker": {
                "color": colour,
                "size": 11,
                "symbol": "diamond-open" if estimated else "circle",
                "line": {"width": 2, "color": colour},
            },
            "customdata": m["cd"],
            "hovertemplate": (
                "%{customdata[0]}<br>%{customdata[1]}, %{customdata[2]}: %{customdata[3]}<br>"
                "%{customdata[4]}<extra></extra>"
            ),
            "xaxis": xa,
            "yaxis": ya,
        }
        if estimated:
            trace["error_x"] = {
                "type": "data",
                "symmetric": False,
                "array": m["hi"],
                "arrayminus": m["lo"],
                "color": colour,
                "thickness": 1.5,
                "width": 5,
            }
        traces.append(go.Scatter(**trace))
    return traces


# Per series panel: (column, name, colour, dash, the baseline column drawn dotted across).
_SERIES: Final[tuple[tuple[tuple[str, str, str, str, str | None], ...], ...]] = (
    (
        ("ttft_p50_ms", "first token p50", CURRENT, "solid", "baseline_ttft_p50_ms"),
        ("ttft_p99_ms", "first token p99", CURRENT, "dash", None),
    ),
    (
        (
            "ms_per_output_token_p50",
            "time per output token p50",
            CURRENT,
            "solid",
            "baseline_ms_per_output_token_p50",
        ),
    ),
    (
        ("input_tokens_p50", "input tokens p50", CURRENT, "solid", "baseline_input_tokens_p50"),
        ("output_tokens_p50", "output tokens p50", OUTPUT_TOKENS, "solid", "baseline_output_tokens_p50"),
    ),
)


def _series_traces(
    col: int, row: dict[str, Any], label: str, series: pl.DataFrame, analysis: Analysis, xa: str, ya: str
) -> list[go.Scatter]:
    """One series panel of a model: its lines per bucket and the baseline window's p50 across."""
    traces = []
    times = [naive_utc(t) for t in series["bucket_start"].to_list()]
    window = [naive_utc(analysis.start), naive_utc(analysis.end)]
    for column, name, colour, dash, baseline in _SERIES[col]:
        values = series[column].to_list()
        traces.append(
            go.Scatter(
                x=times,
                y=values,
                mode="lines+markers",
                name=name,
                line={"color": colour, "dash": dash, "width": 2},
                marker={"size": 4, "color": colour},
                customdata=[[label, name] for _ in values],
                hovertemplate="%{customdata[0]}<br>%{customdata[1]}: %{y:,.1f}<br>"
                + DT_HOVER
                + "<extra></extra>",
                xaxis=xa,
                yaxis=ya,
            )
        )
        before = row.get(baseline) if baseline else None
        if before is not None:
            estimated = col < 2 and row.get("baseline_ttft_source") == "estimated"
            what = f"baseline window: {name}" + (" (estimated)" if estimated else "")
            traces.append(
                go.Scatter(
                    x=window,
                    y=[before, before],
                    mode="lines",
                    name=f"baseline {name}",
                    line={"color": BASELINE if colour == CURRENT else colour, "dash": "dot", "width": 1.5},
                    customdata=[[label, what]] * 2,
                    hovertemplate="%{customdata[0]}<br>%{customdata[1]}: %{y:,.1f}<extra></extra>",
                    xaxis=xa,
                    yaxis=ya,
                )
            )
    return traces


def _regressions(attribution: pl.DataFrame) -> list[dict[str, Any]]:
    """The attribution rows with an llm cause (frames stored before the cause existed have none),
    the largest LLM delta first."""
    if "llm_cause" not in attribution.columns or not attribution.height:
        return []
    rows = attribution.filter(pl.col("llm_cause").is_not_null()).sort(
        ["llm_delta_ms", "service", "operation"], descending=[True, False, False], nulls_last=True
    )
    return list(rows.iter_rows(named=True))


def _bar_headline(r: dict[str, Any]) -> str:
    """Two lines: the operation, its LLM delta and whose change it is; the cause in words."""
    delta = r.get("llm_delta_ms")
    delta_text = "n/a" if delta is None else f"{delta:+,.0f} ms"
    return (
        f"{op_label(r['service'], r['operation'])}: LLM {delta_text} on the tail's critical path — "
        f"<b>{cause_side(r)}</b><br>{esc(r.get('llm_cause_text') or '')}"
    )


def _anatomy_bar(r: dict[str, Any], label: str, xa: str, ya: str) -> list[go.Bar]:
    total = sum(abs(r.get(c) or 0.0) for c, _, _ in ANATOMY_PARTS)
    who = op_label(r["service"], r["operation"])
    bars = []
    for column, name, colour in ANATOMY_PARTS:
        value = float(r.get(column) or 0.0)
        share = f"{abs(value) / total:.0%} of the LLM delta" if total else "no LLM delta"
        bars.append(
            go.Bar(
                x=[value],
                y=[label],
                orientation="h",
                name=name,
                marker={"color": colour},
                customdata=[[who, name, share, cause_side(r)]],
                hovertemplate=(
                    "%{customdata[0]}<br>%{customdata[1]}: %{x:+,.0f} ms (%{customdata[2]})<br>"
                    "cause: %{customdata[3]}<extra></extra>"
                ),
                xaxis=xa,
                yaxis=ya,
            )
        )
    return bars


def _shared_range(rows: list[dict[str, Any]]) -> list[float]:
    """One x range for every anatomy bar: a millisecond looks like one next to seconds."""
    lo = min((sum(min(r.get(c) or 0.0, 0.0) for c, _, _ in ANATOMY_PARTS) for r in rows), default=0.0)
    hi = max((sum(max(r.get(c) or 0.0, 0.0) for c, _, _ in ANATOMY_PARTS) for r in rows), default=0.0)
    if hi - lo < 1.0:
        return [-10.0, 10.0]
    pad = 0.05 * (hi - lo)
    return [min(lo, 0.0) - (pad if lo < 0 else 0.0), hi + pad]


def llm_headline(analysis: Analysis) -> str:
    """The landing page's line for this view (plain text; the caller escapes it): the models, then
    each llm regression's cause and whose change it is, else each model's time to first token."""
    anatomy = analysis.llm_anatomy
    if not anatomy.height:
        return NO_CALLS_TEXT
    regressions = _regressions(analysis.attribution)
    text = f"{count_of(anatomy.height, 'model')}; {count_of(len(regressions), 'llm regression')}"
    if regressions:
        items = [
            f"{r['service']} · {r['operation']} {str(r['llm_cause']).replace('_', ' ')} ({cause_side(r)})"
            for r in regressions
        ]
    else:
        items = []
        for r in anatomy.sort("calls", descending=True, nulls_last=True).iter_rows(named=True):
            before, after = r["baseline_ttft_p50_ms"], r["ttft_p50_ms"]
            if before is None and after is None:
                continue
            estimated = "estimated" in (r["ttft_source"], r["baseline_ttft_source"])
            was, now = (_ms(v) if v is not None else "n/a" for v in (before, after))
            items.append(
                f"{r['provider']} / {r['model']} first token {was} → {now}"
                + (" (estimated)" if estimated else "")
            )
    shown = items[:HEADLINE_NAMES]
    if shown:
        text += ": " + "; ".join(shown)
        if len(items) > len(shown):
            text += f"; and {len(items) - len(shown)} more"
    return text
