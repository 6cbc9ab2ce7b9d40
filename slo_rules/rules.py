"""Rule files: YAML validated against a pydantic schema, every problem reported with file and line.

A rule file is a mapping with ``rules:`` (a list of rules) and an optional ``route:`` (grouping,
repeat interval, resolved notifications). Each rule has a ``kind`` that selects its schema::

    rules:
      - name: reply-latency-slo
        kind: latency_slo
        service: support-chat
        operation: "POST /reply"
        threshold_ms: 1500
        target: 0.99
        window: 30d
        severity: page

YAML is composed into nodes first (``yaml.compose``) so every value keeps the line it came from;
pydantic's error locations are then mapped back to those lines. That is why a typo on line 40 is
reported as ``rules.yaml:40: …`` and not as a traceback.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from analytics import DriftKind
from slo_rules.errors import RuleError, RuleProblem
from storage import format_duration, parse_duration

__all__ = [
    "DEFAULT_RULES_PATH",
    "AbandonmentRule",
    "AnyRule",
    "ArchitectureDriftRule",
    "BurnRateTier",
    "ColdPathStarvationRule",
    "LatencySloRule",
    "LlmCacheDropRule",
    "LlmCostRegressionRule",
    "P99RegressionRule",
    "ReleaseCouplingRule",
    "RetryAmplificationRule",
    "Route",
    "Rule",
    "RuleKind",
    "RuleSet",
    "Severity",
    "SliceRegressionRule",
    "check_rule_files",
    "load_rules",
]

DEFAULT_RULES_PATH = Path(__file__).with_name("default.yaml")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

Severity = Literal["page", "ticket", "info"]
SEVERITIES: tuple[Severity, ...] = ("page", "ticket", "info")
RuleKind = Literal[
    "latency_slo",
    "p99_regression",
    "release_coupling",
    "cold_path_starvation",
    "abandonment",
    "retry_amplification",
    "slice_regression",
    "architecture_drift",
    "llm_cost_regression",
    "llm_cache_drop",
]
RULE_KINDS: tuple[str, ...] = RuleKind.__args__  # type: ignore[attr-defined]

# The grammar every stage shares (storage.parse_duration): "30d", "1h30m", "500ms", a number of seconds.
Duration = Annotated[
    timedelta, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)
]
Glob = Annotated[str, Field(min_length=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class BurnRateTier(_Model):
    """One multiwindow burn-rate alert: both windows must burn faster than ``factor``."""

    long: Duration
    short: Duration | None = None  # default: 1/12 of the long window (SRE Workbook)
    factor: float = Field(gt=0)
    severity: Severity = "page"

    @property
    def short_window(self) -> timedelta:
        return self.short if self.short is not None else self.long / 12

    @model_validator(mode="after")
    def _short_below_long(self) -> BurnRateTier:
        if self.short is not None and self.short >= self.long:
            raise ValueError(
                f"short window {format_duration(self.short)} must be shorter than "
                f"long window {format_duration(self.long)}"
            )
        return self


# SRE Workbook, "Alerting on SLOs", table 5-8 (REFERENCE.md §5).
DEFAULT_BURN_RATES: tuple[BurnRateTier, ...] = (
    BurnRateTier(long=timedelta(hours=1), short=timedelta(minutes=5), factor=14.4, severity="page"),
    BurnRateTier(long=timedelta(hours=6), short=timedelta(minutes=30), factor=6.0, severity="page"),
    BurnRateTier(long=timedelta(days=1), short=timedelta(hours=2), factor=3.0, severity="ticket"),
    BurnRateTier(long=timedelta(days=3), short=timedelta(hours=6), factor=1.0, severity="ticket"),
)


class _RuleBase(_Model):
    name: str = Field(min_length=1, max_length=200)
    severity: Severity = "ticket"
    # ``for`` is a Python keyword: the field is ``for_`` and the YAML key ``for``.
    for_: Duration | None = Field(default=None, alias="for")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    description: str | None = None

    @model_validator(mode="after")
    def _reserved_labels(self) -> _RuleBase:
        # ``cause`` is the label Alertmanager receives the attribution verdict under.
        reserved = {"alertname", "severity", "service", "operation", "queue", "workflow", "path", "cause"}
        clash = sorted(reserved & set(self.labels))
        if clash:
            raise ValueError(f"labels {clash} are set by the rule engine; choose other label names")
        # Alertmanager refuses a whole request over one invalid name; refuse it here instead.
        invalid = sorted(n for n in (*self.labels, *self.annotations) if not _LABEL_NAME.match(n))
        if invalid:
            raise ValueError(
                f"label and annotation names must match [a-zA-Z_][a-zA-Z0-9_]* (Alertmanager's rule), "
                f"got {', '.join(repr(n) for n in invalid)}"
            )
        return self


class _HotSelector(_Model):
    service: Glob = "*"
    operation: Glob = "*"

    def selects(self, service: str, operation: str) -> bool:
        return fnmatch.fnmatchcase(service, self.service) and fnmatch.fnmatchcase(operation, self.operation)


class LatencySloRule(_RuleBase, _HotSelector):
    """At least ``target`` of hot-path requests finish under ``threshold_ms`` over ``window``."""

    kind: Literal["latency_slo"]
    severity: Severity = "page"
    threshold_ms: float = Field(gt=0)
    target: float = Field(gt=0, lt=1)
    window: Duration = timedelta(days=30)
    burn_rates: tuple[BurnRateTier, ...] = DEFAULT_BURN_RATES
    min_events: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _tiers(self) -> LatencySloRule:
        if not self.burn_rates:
            raise ValueError("burn_rates needs at least one tier")
        for tier in self.burn_rates:
            if tier.long > self.window:
                raise ValueError(
                    f"burn-rate long window {format_duration(tier.long)} exceeds the SLO window "
                    f"{format_duration(self.window)}"
                )
        longs = [t.long for t in self.burn_rates]
        if len(set(longs)) != len(longs):
            raise ValueError("burn_rates: two tiers share a long window")
        return self

    def tiers(self) -> list[BurnRateTier]:
        """Tiers fastest first (highest factor), with severities capped at the rule's ``severity``."""
        cap = SEVERITIES.index(self.severity)
        out = []
        for tier in sorted(self.burn_rates, key=lambda t: (-t.factor, t.long)):
            severity = SEVERITIES[max(cap, SEVERITIES.index(tier.severity))]
            out.append(tier.model_copy(update={"severity": severity}))
        return out


class MinIncrease(_Model):
    relative: float = Field(default=0.2, ge=0)
    absolute_ms: float = Field(default=100.0, ge=0)


class P99RegressionRule(_RuleBase, _HotSelector):
    """p99 of a hot-path operation against the previous window or the previous release."""

    kind: Literal["p99_regression"]
    window: Duration = timedelta(days=1)
    baseline: Literal["previous", "previous_release"] = "previous"
    min_increase: MinIncrease = MinIncrease()
    min_requests: int = Field(default=200, ge=1)
    # Hysteresis: a firing alert resolves once the increase over its frozen baseline is below
    # either of these (default: half of ``min_increase``), not as soon as it dips under the bar.
    resolve_increase: MinIncrease | None = None

    @model_validator(mode="after")
    def _resolve_below_fire(self) -> P99RegressionRule:
        r = self.resolve_increase
        if r is not None and (
            r.relative > self.min_increase.relative or r.absolute_ms > self.min_increase.absolute_ms
        ):
            raise ValueError(
                "resolve_increase must not exceed min_increase (an alert would resolve while its "
                "condition to fire still holds)"
            )
        return self

    @property
    def resolve(self) -> MinIncrease:
        """The increase below which a firing alert resolves."""
        if self.resolve_increase is not None:
            return self.resolve_increase
        return MinIncrease(
            relative=self.min_increase.relative / 2, absolute_ms=self.min_increase.absolute_ms / 2
        )


class ReleaseCouplingRule(_RuleBase, _HotSelector):
    """A release that added synchronous LLM calls or stepped p99 up, or p99 coupled to releases."""

    kind: Literal["release_coupling"]
    window: Duration = timedelta(days=2)
    min_sync_llm_increase: float = Field(default=0.5, gt=0)
    significant_step: bool = True
    coupled_trend: bool = True


class ColdPathStarvationRule(_RuleBase):
    """Enqueue-to-ready of a queue: p99/p50 ratio, p99 limit, pending backlog or its growth, or the
    analytics' starved verdict when no limit is set."""

    kind: Literal["cold_path_starvation"]
    queue: Glob = "*"
    window: Duration = timedelta(days=1)
    max_p99_over_p50: float | None = Field(default=None, gt=0)
    max_p99_s: float | None = Field(default=None, gt=0)
    max_pending: int | None = Field(default=None, ge=0)
    # A growing backlog: pending jobs at the window's end over those at the previous window's end.
    max_pending_growth: float | None = Field(default=None, gt=0)
    min_jobs: int = Field(default=20, ge=1)

    def selects(self, queue: str) -> bool:
        return fnmatch.fnmatchcase(queue, self.queue)


class AbandonmentRule(_RuleBase, _HotSelector):
    """The abandonment rate of an operation above ``max_rate``, or its p99 beyond its cliff."""

    kind: Literal["abandonment"]
    window: Duration = timedelta(days=1)
    max_rate: float | None = Field(default=None, gt=0, le=1)
    p99_beyond_cliff: bool = False
    min_requests: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _one_condition(self) -> AbandonmentRule:
        if self.max_rate is None and not self.p99_beyond_cliff:
            raise ValueError("set max_rate, p99_beyond_cliff: true, or both")
        return self


class RetryAmplificationRule(_RuleBase):
    """Attempt or token amplification of a workflow above a threshold."""

    kind: Literal["retry_amplification"]
    workflow: Glob = "*"
    window: Duration = timedelta(days=1)
    max_attempt_amplification: float | None = Field(default=None, ge=1)
    max_token_amplification: float | None = Field(default=None, ge=1)
    min_runs: int = Field(default=20, ge=1)

    @model_validator(mode="after")
    def _one_condition(self) -> RetryAmplificationRule:
        if self.max_attempt_amplification is None and self.max_token_amplification is None:
            raise ValueError("set max_attempt_amplification, max_token_amplification, or both")
        return self

    def selects(self, workflow: str) -> bool:
        return fnmatch.fnmatchcase(workflow, self.workflow)


class SliceRegressionRule(_RuleBase, _HotSelector):
    """A feature-flag variant worse than its flag's control: p99 or abandonment, significantly.

    One alert per (service, operation, flag, variant) of the analysis' ``slices`` frame; the control
    is the analytics' (``Conventions.slice_control_variants``, else the variant with most requests).
    A limit set to ``null`` turns its condition off.
    """

    kind: Literal["slice_regression"]
    flag: Glob = "*"
    variant: Glob = "*"
    window: Duration = timedelta(hours=1)
    # How much worse than control a variant may be before it alerts, when the analytics also find
    # the difference significant (the release-step test for p99, Newcombe's interval for abandonment).
    max_p99_delta_ms: float | None = Field(default=0.0, ge=0)
    max_abandonment_delta: float | None = Field(default=0.01, ge=0, lt=1)
    min_requests: int = Field(default=100, ge=1)  # on each side: the variant and its control

    @model_validator(mode="after")
    def _one_condition(self) -> SliceRegressionRule:
        if self.max_p99_delta_ms is None and self.max_abandonment_delta is None:
            raise ValueError("set max_p99_delta_ms, max_abandonment_delta, or both")
        clash = sorted({"flag", "variant"} & set(self.labels))
        if clash:
            raise ValueError(f"labels {clash} are set by the rule engine; choose other label names")
        return self

    def selects_slice(self, service: str, operation: str, flag: str, variant: str) -> bool:
        return (
            self.selects(service, operation)
            and fnmatch.fnmatchcase(flag, self.flag)
            and fnmatch.fnmatchcase(variant, self.variant)
        )


class ArchitectureDriftRule(_RuleBase, _HotSelector):
    """A batch job drifting into an online service (analytics.drift): one alert per finding of the
    drift report over ``window`` (whole days, by day) ending at the evaluation.

    The ``kind`` label names the finding's kind; ``service``/``operation`` select the findings about
    functions, runs and hot operations, ``queue`` those about queues. A hot operation counts as
    having a latency target when a ``latency_slo`` rule of the same rule set selects it (or the
    conventions give it a latency budget).
    """

    kind: Literal["architecture_drift"]
    queue: Glob = "*"
    window: Duration = timedelta(days=14)
    kinds: tuple[DriftKind, ...] = DriftKind.__args__  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _whole_days(self) -> ArchitectureDriftRule:
        if self.window % timedelta(days=1) or self.window < timedelta(days=2):
            raise ValueError(f"window must be whole days, at least 2d, got {format_duration(self.window)}")
        if not self.kinds:
            raise ValueError("kinds needs at least one kind of drift")
        if "kind" in self.labels:
            raise ValueError("label 'kind' is set by the rule engine; choose another label name")
        return self

    @property
    def days(self) -> int:
        return self.window // timedelta(days=1)

    def selects_finding(self, kind: str, service: str, operation: str, queue: str) -> bool:
        if kind not in self.kinds:
            return False
        if queue:
            return fnmatch.fnmatchcase(queue, self.queue)
        return self.selects(service, operation)


class _ModelSelector(_Model):
    provider: Glob = "*"
    model: Glob = "*"

    def selects_model(self, provider: str, model: str) -> bool:
        return fnmatch.fnmatchcase(provider, self.provider) and fnmatch.fnmatchcase(model, self.model)


class LlmCostRegressionRule(_RuleBase, _ModelSelector, _HotSelector):
    """A model's cost up by more than ``max_increase`` (a share: 0.25 = +25%) against the window of
    equal length before: per day (``per: day``, what the calls of the window cost over its length)
    or per call (``per: call``, what a call costs: longer prompts, longer answers, a lost cache);
    or a hot operation's (``per: request``, what its requests' synchronous model calls cost per
    request; ``service``/``operation`` select, ``min_calls`` counts requests). Needs the models'
    prices (``[[analysis.prices]]``): a model without one raises nothing."""

    kind: Literal["llm_cost_regression"]
    window: Duration = timedelta(days=1)
    per: Literal["day", "call", "request"] = "day"
    max_increase: float = Field(default=0.25, gt=0)
    min_calls: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _selectors_fit_per(self) -> LlmCostRegressionRule:
        # A model's cost has no operation, an operation's cost per request spans its models.
        if self.per == "request" and (self.provider, self.model) != ("*", "*"):
            raise ValueError("per: request selects hot operations (service, operation), not provider/model")
        if self.per != "request" and (self.service, self.operation) != ("*", "*"):
            raise ValueError(
                f"per: {self.per} selects models (provider, model); service/operation need per: request"
            )
        return self


class LlmCacheDropRule(_RuleBase, _ModelSelector):
    """A model's prompt-cache hits dropped: the share of input tokens read from the cache fell by
    more than ``max_drop`` (absolute: 0.2 = 20 points) against the window of equal length before,
    where it was at least ``min_baseline_ratio`` (a model that never hit the cache raises nothing)."""

    kind: Literal["llm_cache_drop"]
    window: Duration = timedelta(hours=1)
    max_drop: float = Field(default=0.2, gt=0, le=1)
    min_baseline_ratio: float = Field(default=0.1, ge=0, le=1)
    min_calls: int = Field(default=100, ge=1)


AnyRule: TypeAlias = (
    LatencySloRule
    | P99RegressionRule
    | ReleaseCouplingRule
    | ColdPathStarvationRule
    | AbandonmentRule
    | RetryAmplificationRule
    | SliceRegressionRule
    | ArchitectureDriftRule
    | LlmCostRegressionRule
    | LlmCacheDropRule
)
# The schema of one list entry: ``kind`` selects the model.
Rule: TypeAlias = Annotated[AnyRule, Field(discriminator="kind")]


class Route(_Model):
    """How transitions become notifications (Alertmanager's route, reduced to what tailwatch uses)."""

    group_by: tuple[str, ...] = ("alertname",)
    repeat_interval: Duration = timedelta(hours=4)
    send_resolved: bool = True


class _RuleFile(_Model):
    rules: list[Rule] = Field(default_factory=list)
    route: Route | None = None


@functools.cache
def _rule_file_adapter() -> TypeAdapter[_RuleFile]:
    # Built on first use: compiling the validators costs a noticeable part of a second at import.
    return TypeAdapter(_RuleFile)


@dataclass(frozen=True)
class RuleSet:
    """Validated rules from one or more files, plus the route that groups their notifications."""

    rules: tuple[AnyRule, ...]
    route: Route = field(default_factory=Route)
    sources: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.rules)

    def names(self) -> list[str]:
        return [rule.name for rule in self.rules]


# ---------------------------------------------------------------------------------------------
# YAML with line numbers


NodePath = tuple[str | int, ...]


class _LineMap:
    """Which line each value (by its path of keys and indexes) starts on, 1-based."""

    def __init__(self) -> None:
        self.lines: dict[NodePath, int] = {}
        self.key_lines: dict[NodePath, int] = {}

    def line_for(self, loc: Sequence[str | int]) -> int:
        """The line of the deepest known node on ``loc``; pydantic's union tags are skipped."""
        path: NodePath = ()
        best = self.lines.get((), 1)
        for part in loc:
            candidate = (*path, part)
            if candidate in self.lines:
                path = candidate
                best = self.key_lines.get(path, self.lines[path])
        return best


# A rule file expanding past this many values is refused: YAML aliases can repeat an anchor
# exponentially ("billion laughs") while the text stays a few hundred bytes.
_MAX_VALUES = 100_000


class _TooLarge(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


def _construct(node: yaml.Node, path: NodePath, lines: _LineMap, problems: list[tuple[int, str]]) -> Any:
    lines.lines[path] = node.start_mark.line + 1
    if len(lines.lines) > _MAX_VALUES:
        raise _TooLarge(node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _construct(key_node, (*path, "<key>"), lines, problems)
            if not isinstance(key, str | int | float | bool) or key is None:
                problems.append((key_node.start_mark.line + 1, "mapping keys must be plain scalars"))
                continue
            if key_node.tag == "tag:yaml.org,2002:merge":
                problems.append((key_node.start_mark.line + 1, "YAML merge keys (<<) are not supported"))
                continue
            skey = str(key)
            if skey in out:
                problems.append((key_node.start_mark.line + 1, f"duplicate key {skey!r}"))
            lines.key_lines[(*path, skey)] = key_node.start_mark.line + 1
            out[skey] = _construct(value_node, (*path, skey), lines, problems)
        lines.lines.pop((*path, "<key>"), None)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, (*path, i), lines, problems) for i, item in enumerate(node.value)]
    # Scalars resolve through SafeLoader's constructors so types match yaml.safe_load exactly.
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.constructor.ConstructorError as exc:
        problems.append((node.start_mark.line + 1, str(exc.problem or exc)))
        return None
    finally:
        loader.dispose()


def _human_loc(loc: Sequence[str | int]) -> str:
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part in RULE_KINDS or part.startswith("function-") or part == "<key>":
            continue
        else:
            parts.append(("." if parts else "") + part)
    return "".join(parts)


_MODELS: dict[str, type[_Model]] = {
    "latency_slo": LatencySloRule,
    "p99_regression": P99RegressionRule,
    "release_coupling": ReleaseCouplingRule,
    "cold_path_starvation": ColdPathStarvationRule,
    "abandonment": AbandonmentRule,
    "retry_amplification": RetryAmplificationRule,
    "slice_regression": SliceRegressionRule,
}


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted((f.alias or name) for name, f in model.model_fields.items())


def _model_at(loc: Sequence[str | int], data: Any) -> type[BaseModel] | None:
    """The model that owns the mapping at ``loc`` (for 'unknown key' suggestions)."""
    if len(loc) >= 3 and loc[0] == "rules" and isinstance(loc[1], int) and isinstance(loc[2], str):
        model: type[BaseModel] | None = _MODELS.get(loc[2])
        rest = list(loc[3:-1])
        if rest == ["min_increase"]:
            return MinIncrease
        if rest[:1] == ["burn_rates"]:
            return BurnRateTier
        return model if not rest else None
    if len(loc) == 2 and loc[0] == "route":
        return Route
    if len(loc) == 1:
        return _RuleFile
    return None


def _message(err: Any, data: Any) -> str:
    loc = tuple(err["loc"])
    where = _human_loc(loc)
    kind = err["type"]
    if kind == "missing":
        return f"{where}: required key is missing"
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc, data)
        hint = ""
        if model is not None:
            allowed = _allowed_keys(model)
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; allowed keys: {', '.join(allowed)}"
        return f"{where}: unknown key{hint}"
    if kind == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag", "")
        return f"{where}.kind: unknown rule kind {tag!r}; allowed kinds: {', '.join(RULE_KINDS)}"
    if kind == "union_tag_not_found":
        return f"{where}: rule has no 'kind'; allowed kinds: {', '.join(RULE_KINDS)}"
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"{where}: {err['input']!r} is not allowed; expected {expected}"
    msg = str(err["msg"])
    msg = msg.removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def _check_text(text: str, file: str) -> tuple[_RuleFile | None, list[RuleProblem]]:
    problems: list[RuleProblem] = []
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        # "found '<stream end>'" points past the last line; the problem is on the last one.
        line = max(1, min(line, len(text.rstrip("\n").splitlines()) or 1))
        what = " ".join(str(exc.problem or exc.context or "syntax error").split())
        return None, [RuleProblem(file, line, f"YAML syntax error: {what}")]
    except yaml.YAMLError as exc:
        return None, [RuleProblem(file, 1, f"YAML error: {' '.join(str(exc).split())}")]
    if node is None:
        return None, [RuleProblem(file, 1, "the file is empty; expected a mapping with 'rules:'")]
    lines = _LineMap()
    raw: list[tuple[int, str]] = []
    try:
        data = _construct(node, (), lines, raw)
    except _TooLarge as exc:
        message = (
            f"the file expands to more than {_MAX_VALUES:,} values (YAML aliases repeating an anchor?); "
            "write the rules out"
        )
        return None, [RuleProblem(file, exc.line, message)]
    problems.extend(RuleProblem(file, line, message) for line, message in raw)
    if not isinstance(data, dict):
        problems.append(RuleProblem(file, node.start_mark.line + 1, "expected a mapping with 'rules:'"))
        return None, problems
    if "rules" not in data:
        problems.append(RuleProblem(file, 1, "missing 'rules:' (a list of rules)"))
        return None, problems
    try:
        parsed = _rule_file_adapter().validate_python(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = tuple(err["loc"])
            path = _key_path(loc)
            if err["type"] == "union_tag_invalid":
                path = (*path, "kind")
            line = lines.line_for(path)
            problems.append(RuleProblem(file, line, _message(err, data)))
        parsed = None
    seen: dict[str, int] = {}
    raw_rules = data.get("rules")
    for i, raw_rule in enumerate(raw_rules if isinstance(raw_rules, list) else []):
        name = raw_rule.get("name") if isinstance(raw_rule, dict) else None
        if not isinstance(name, str):
            continue
        line = lines.key_lines.get(("rules", i, "name"), lines.lines.get(("rules", i), 1))
        if name in seen:
            problems.append(
                RuleProblem(file, line, f"rule name {name!r} is already used on line {seen[name]}")
            )
        else:
            seen[name] = line
    problems.sort(key=lambda p: p.line)
    return (parsed if not problems else None), problems


def _key_path(loc: Sequence[str | int]) -> tuple[str | int, ...]:
    # pydantic puts the union tag ('latency_slo') into the location; the YAML has no such level.
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if i == 2 and loc[0] == "rules" and part in RULE_KINDS:
            continue
        if isinstance(part, str) and part.startswith("function-"):
            continue
        out.append(part)
    return tuple(out)


def _read(path: Path) -> tuple[str | None, list[RuleProblem]]:
    try:
        return path.read_text(encoding="utf-8"), []
    except FileNotFoundError:
        return None, [RuleProblem(str(path), 0, "no such file")]
    except IsADirectoryError:
        return None, [RuleProblem(str(path), 0, "is a directory, not a rule file")]
    except UnicodeDecodeError as exc:
        return None, [RuleProblem(str(path), 0, f"not UTF-8 text ({exc.reason})")]
    except OSError as exc:
        return None, [RuleProblem(str(path), 0, f"cannot be read: {exc.strerror}")]


def _load(paths: Iterable[Path]) -> tuple[RuleSet | None, list[RuleProblem]]:
    problems: list[RuleProblem] = []
    rules: list[AnyRule] = []
    route: Route | None = None
    sources: list[str] = []
    names: dict[str, str] = {}
    for path in paths:
        text, read_problems = _read(path)
        problems.extend(read_problems)
        if text is None:
            continue
        parsed, file_problems = _check_text(text, str(path))
        problems.extend(file_problems)
        if parsed is None:
            continue
        sources.append(str(path))
        for rule in parsed.rules:
            if rule.name in names:
                problems.append(
                    RuleProblem(
                        str(path), 0, f"rule name {rule.name!r} is already defined in {names[rule.name]}"
                    )
                )
            names[rule.name] = str(path)
            rules.append(rule)
        if parsed.route is not None:
            if route is not None and route != parsed.route:
                problems.append(
                    RuleProblem(str(path), 0, "a different 'route:' is already set by another file")
                )
            route = parsed.route
    if problems:
        return None, problems
    return RuleSet(rules=tuple(rules), route=route or Route(), sources=tuple(sources)), []


def check_rule_files(paths: Sequence[Path | str]) -> list[RuleProblem]:
    """Every problem in the given rule files (empty when they all validate)."""
    return _load(Path(p) for p in paths)[1]


def load_rules(paths: Sequence[Path | str] | None = None) -> RuleSet:
    """Load and validate rule files; ``None`` (or an empty list) loads the default pack.

    Raises :class:`RuleError` listing every problem (file, line, message).
    """
    chosen = [Path(p) for p in paths] if paths else [DEFAULT_RULES_PATH]
    ruleset, problems = _load(chosen)
    if ruleset is None:
        raise RuleError(problems)
    return ruleset


def rules_from_text(text: str, file: str = "<rules>") -> RuleSet:
    """Validate rules given as YAML text (used by tests and the API)."""
    parsed, problems = _check_text(text, file)
    if parsed is None:
        raise RuleError(problems)
    return RuleSet(rules=tuple(parsed.rules), route=parsed.route or Route(), sources=(file,))
