"""Span conventions: which spans are hot-path requests, cold-path jobs, LLM calls, attempts, workflows.

Every rule the analysis applies to raw spans is a field of :class:`Conventions`, with defaults that
follow the OpenTelemetry semantic conventions (GenAI, HTTP, messaging). The ``*_sql`` helpers turn
them into ClickHouse expressions over ``otel_traces`` columns; the values travel as server-side
parameters (see :meth:`Conventions.sql_parameters`), never as SQL text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal

from collectors.errors import TailwatchError
from collectors.schema import span_kind_sql, status_code_sql

__all__ = ["Conventions", "ConventionsError", "SpanClass", "Verdict"]

Verdict = Literal["llm", "internal", "mixed", "none"]
SpanClass = Literal["llm", "internal"]


class ConventionsError(TailwatchError, ValueError):
    """A convention value is out of range."""


@dataclass(frozen=True)
class Conventions:
    """How tailwatch reads meaning out of spans, and the thresholds of its verdicts.

    Usage::

        conv = Conventions(min_delta_ms=200.0, starvation_ratio=30.0)
        analysis = analyze(store, start, end, conventions=conv)
    """

    # --- span classification -------------------------------------------------------------
    path_attribute: str = "tailwatch.path"  # span or resource attribute: "hot" / "cold"
    hot_value: str = "hot"
    cold_value: str = "cold"
    hot_root_kinds: tuple[str, ...] = ("Server",)
    operation_attribute: str = "gen_ai.operation.name"
    llm_operations: tuple[str, ...] = ("chat", "text_completion", "generate_content", "embeddings")
    # invoke_agent is an LLM call when remote (kind Client), structure when in-process.
    remote_agent_operation: str = "invoke_agent"
    structure_operations: tuple[str, ...] = (
        "invoke_workflow",
        "invoke_agent",
        "execute_tool",
        "create_agent",
    )
    workflow_operations: tuple[str, ...] = ("invoke_workflow", "invoke_agent")
    provider_attributes: tuple[str, ...] = ("gen_ai.provider.name", "gen_ai.system")
    model_attribute: str = "gen_ai.request.model"
    workflow_name_attributes: tuple[str, ...] = ("gen_ai.workflow.name", "gen_ai.agent.name")
    version_attribute: str = "service.version"
    queue_attribute: str = "messaging.destination.name"
    http_status_attribute: str = "http.response.status_code"
    abandon_status_codes: tuple[str, ...] = ("499",)
    abandon_attribute: str = "tailwatch.abandoned"
    throttle_status_codes: tuple[str, ...] = ("429",)
    error_type_attribute: str = "error.type"
    resend_attribute: str = "http.request.resend_count"
    input_token_attributes: tuple[str, ...] = ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
    output_token_attributes: tuple[str, ...] = (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
    )
    # Spans of a trace may start after the analysis window closes (the request began inside it):
    # per-trace reductions read this much past the end.
    trace_margin: timedelta = timedelta(minutes=5)

    # --- releases ------------------------------------------------------------------------
    min_release_requests: int = 100  # per side of a release, for a significance test
    min_delta_ms: float = 100.0  # practical significance: smaller p99 steps are never flagged
    min_delta_ratio: float = 0.10  # … nor steps below this fraction of the p99 before
    bootstrap_samples: int = 2000
    bootstrap_confidence: float = 0.95
    bootstrap_seed: int = 20240601
    coupling_min_releases: int = 3
    coupling_min_rho: float = 0.5
    coupling_min_slope_ms: float = 50.0
    # A version's release time is its first span; look this far back before the window for it.
    release_lookback: timedelta = timedelta(days=30)

    # --- cold path -----------------------------------------------------------------------
    starvation_ratio: float = 20.0
    cdf_points: int = 200

    # --- abandonment ---------------------------------------------------------------------
    bucket_ms: int = 500
    cliff_min_requests: int = 30  # a bucket needs this many requests to take part in the cliff
    cliff_min_jump: float = 0.05  # the cliff's rise in abandonment rate over the bucket before it

    # --- attribution ---------------------------------------------------------------------
    tail_quantile: float = 0.99
    max_tail_traces: int = 1000  # per operation and window; the slowest are kept
    attribution_min_delta_ms: float = 50.0
    attribution_dominance: float = 0.7  # share of the delta one side needs for its verdict
    attribution_min_requests: int = 20  # per window, for a verdict other than "none"
    exemplars: int = 5
    top_spans: int = 10

    # --- series and rollups --------------------------------------------------------------
    series_buckets: int = 120  # target number of time buckets per window
    rollup_min_window: timedelta = timedelta(days=7)
    rollup_significant_digits: int = 3

    def __post_init__(self) -> None:
        _positive = (
            "min_release_requests",
            "bootstrap_samples",
            "starvation_ratio",
            "cdf_points",
            "bucket_ms",
            "max_tail_traces",
            "series_buckets",
            "coupling_min_releases",
        )
        for name in _positive:
            if getattr(self, name) <= 0:
                raise ConventionsError(f"conventions: {name} must be positive, got {getattr(self, name)}")
        for name in ("bootstrap_confidence", "tail_quantile", "attribution_dominance"):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ConventionsError(f"conventions: {name} must be in (0, 1), got {value}")
        if not 1 <= self.rollup_significant_digits <= 5:
            raise ConventionsError(
                f"conventions: rollup_significant_digits must be 1..5, got {self.rollup_significant_digits}"
            )
        for name in (
            "min_delta_ms",
            "min_delta_ratio",
            "attribution_min_delta_ms",
            "cliff_min_requests",
            "cliff_min_jump",
            "attribution_min_requests",
        ):
            if getattr(self, name) < 0:
                raise ConventionsError(f"conventions: {name} must not be negative")

    # ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.total_seconds() if isinstance(value, timedelta) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Conventions:
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConventionsError(f"conventions: unknown key {key!r}; known: {', '.join(sorted(known))}")
            default = getattr(cls, key, None)
            if isinstance(default, timedelta):
                value = timedelta(seconds=float(value))
            elif isinstance(default, tuple):
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs)

    # --- SQL ------------------------------------------------------------------------------
    def sql_parameters(self) -> dict[str, Any]:
        """Server-side parameters the ``*_sql`` expressions refer to (``{cv_…:Type}``)."""
        return {
            "cv_path_attr": self.path_attribute,
            "cv_hot": self.hot_value,
            "cv_cold": self.cold_value,
            "cv_hot_kinds": list(self.hot_root_kinds),
            "cv_op_attr": self.operation_attribute,
            "cv_llm_ops": list(self.llm_operations),
            "cv_remote_agent": self.remote_agent_operation,
            "cv_structure_ops": list(self.structure_operations),
            "cv_workflow_ops": list(self.workflow_operations),
            "cv_provider_attr0": self.provider_attributes[0] if self.provider_attributes else "",
            "cv_provider_attr1": self.provider_attributes[1] if len(self.provider_attributes) > 1 else "",
            "cv_model_attr": self.model_attribute,
            "cv_wf_attr0": self.workflow_name_attributes[0] if self.workflow_name_attributes else "",
            "cv_wf_attr1": self.workflow_name_attributes[1] if len(self.workflow_name_attributes) > 1 else "",
            "cv_version_attr": self.version_attribute,
            "cv_queue_attr": self.queue_attribute,
            "cv_http_status_attr": self.http_status_attribute,
            "cv_abandon_codes": list(self.abandon_status_codes),
            "cv_abandon_attr": self.abandon_attribute,
            "cv_throttle_codes": list(self.throttle_status_codes),
            "cv_error_type_attr": self.error_type_attribute,
            "cv_resend_attr": self.resend_attribute,
            "cv_in_tok0": self.input_token_attributes[0] if self.input_token_attributes else "",
            "cv_in_tok1": self.input_token_attributes[1] if len(self.input_token_attributes) > 1 else "",
            "cv_out_tok0": self.output_token_attributes[0] if self.output_token_attributes else "",
            "cv_out_tok1": self.output_token_attributes[1] if len(self.output_token_attributes) > 1 else "",
        }


# SQL fragments over otel_traces columns. They only reference parameters from
# Conventions.sql_parameters(), so user-chosen attribute names never become SQL text.
KIND = span_kind_sql()
STATUS = status_code_sql()


def _attr(column: str, key: str) -> str:
    """``column[key]`` ('' when absent) as a lookup in the map's key and value subcolumns: the
    first matching key wins, as with ``column[key]``, but the map is not materialized per lookup."""
    return f"{column}.values[indexOf({column}.keys, {{{key}:String}})]"


def _span(key: str) -> str:
    return _attr("SpanAttributes", key)


OP = _span("cv_op_attr")
PATH = (
    f"if({_span('cv_path_attr')} != '', {_span('cv_path_attr')}, "
    f"{_attr('ResourceAttributes', 'cv_path_attr')})"
)
PROVIDER = (
    f"if({_span('cv_provider_attr0')} != '', {_span('cv_provider_attr0')}, {_span('cv_provider_attr1')})"
)
MODEL = _span("cv_model_attr")
VERSION = _attr("ResourceAttributes", "cv_version_attr")
IS_ROOT = "ParentSpanId = ''"
IS_HOT_ROOT = (
    f"(ParentSpanId = '' AND ({KIND} IN {{cv_hot_kinds:Array(String)}} OR {PATH} = {{cv_hot:String}}))"
)
IS_COLD_MARKED = f"({PATH} = {{cv_cold:String}})"
# A root is hot by its kind or by its path mark; the mark needs the key in one of the two maps
# (unless the hot value is empty). PREWHERE on this reads the maps of marked roots only.
MAYBE_MARKED_HOT = (
    "(has(SpanAttributes.keys, {cv_path_attr:String}) OR has(ResourceAttributes.keys, {cv_path_attr:String}) "
    "OR {cv_hot:String} = '')"
)
# An LLM span: a model call by operation name, a remote agent call, or a provider without operation.
IS_LLM = (
    f"({OP} IN {{cv_llm_ops:Array(String)}} "
    f"OR ({OP} = {{cv_remote_agent:String}} AND {KIND} = 'Client') "
    f"OR ({OP} = '' AND {PROVIDER} != ''))"
)
IS_WORKFLOW = f"({OP} IN {{cv_workflow_ops:Array(String)}})"
WORKFLOW_NAME = (
    f"multiIf({_span('cv_wf_attr0')} != '', {_span('cv_wf_attr0')}, "
    f"{_span('cv_wf_attr1')} != '', {_span('cv_wf_attr1')}, SpanName)"
)
ABANDONED = (
    f"({_span('cv_http_status_attr')} IN {{cv_abandon_codes:Array(String)}} "
    f"OR lower({_span('cv_abandon_attr')}) = 'true')"
)
THROTTLED = (
    f"({_span('cv_http_status_attr')} IN {{cv_throttle_codes:Array(String)}} "
    f"OR {_span('cv_error_type_attr')} IN {{cv_throttle_codes:Array(String)}})"
)
ERRORED = f"({STATUS} = 'Error' OR {_span('cv_error_type_attr')} != '')"
RESEND = f"toUInt32OrZero({_span('cv_resend_attr')})"
TOKENS = (
    f"(toUInt64OrZero(if({_span('cv_in_tok0')} != '', {_span('cv_in_tok0')}, {_span('cv_in_tok1')})) + "
    f"toUInt64OrZero(if({_span('cv_out_tok0')} != '', {_span('cv_out_tok0')}, {_span('cv_out_tok1')})))"
)
QUEUE = f"if({_span('cv_queue_attr')} != '', {_span('cv_queue_attr')}, SpanName)"

# Cheap necessary conditions, for PREWHERE: they read only the maps' key subcolumns (a key lookup
# reads the whole map column), so the maps of spans that cannot match are never decompressed.
# IS_LLM needs the operation key or a provider key (unless a convention matches the empty value).
MAYBE_LLM = (
    "(has(SpanAttributes.keys, {cv_op_attr:String}) "
    "OR has(SpanAttributes.keys, {cv_provider_attr0:String}) "
    "OR has(SpanAttributes.keys, {cv_provider_attr1:String}) "
    "OR has({cv_llm_ops:Array(String)}, '') OR {cv_remote_agent:String} = '')"
)
# Token or resend counts need their keys.
MAYBE_COUNTED = (
    "(has(SpanAttributes.keys, {cv_resend_attr:String}) "
    "OR has(SpanAttributes.keys, {cv_in_tok0:String}) OR has(SpanAttributes.keys, {cv_in_tok1:String}) "
    "OR has(SpanAttributes.keys, {cv_out_tok0:String}) OR has(SpanAttributes.keys, {cv_out_tok1:String}))"
)
# IS_WORKFLOW needs the operation key (unless a workflow operation is the empty value).
MAYBE_WORKFLOW = "(has(SpanAttributes.keys, {cv_op_attr:String}) OR has({cv_workflow_ops:Array(String)}, ''))"
