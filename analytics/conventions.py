"""Span conventions: which spans are hot-path requests, cold-path jobs, LLM calls, attempts, workflows.

Every rule the analysis applies to raw spans is a field of :class:`Conventions`, with defaults that
follow the OpenTelemetry semantic conventions (GenAI, HTTP, messaging). The ``*_sql`` helpers turn
them into ClickHouse expressions over ``otel_traces`` columns; the values travel as server-side
parameters (see :meth:`Conventions.sql_parameters`), never as SQL text.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import Any, Literal, cast

from collectors import span_kind_sql, status_code_sql
from storage import TailwatchError, parse_duration

__all__ = ["Conventions", "ConventionsError", "Price", "SpanClass", "Verdict"]

Verdict = Literal["llm", "internal", "mixed", "none"]
SpanClass = Literal["llm", "internal"]


class ConventionsError(TailwatchError, ValueError):
    """A convention value is out of range."""


# Conventions the summaries are reduced with (see Conventions.summary_key): every span convention
# (the fields before ``trace_margin``, _ATTRIBUTE_FIELDS, set below the class) and these.
_REDUCED_WITH = frozenset(
    {
        "trace_margin",
        "bucket_ms",
        "flag_key_attributes",
        "flag_variant_attributes",
        "flag_events",
        "slice_attributes",
        "summary_walk_share",
        "abandonment_latency",
    }
)

# Settings of the HdrHistogram rollups the per-minute aggregates replaced: still accepted (a config
# file or a persisted run may name them), without effect.
_RETIRED = frozenset({"rollup_min_window", "rollup_significant_digits"})


@dataclass(frozen=True)
class Price:
    """A model's prices in USD per million tokens (:attr:`Conventions.llm_prices`, read by
    :mod:`analytics.llm_anatomy`): input, cached input (the input price when not given), output."""

    provider: str
    model: str
    input: float
    output: float
    cached_input: float | None = None

    def matches(self, provider: str, model: str) -> bool:
        return self.provider in ("*", provider) and self.model == model


@dataclass(frozen=True)
class Conventions:
    """How tailwatch reads meaning out of spans, and the thresholds of its verdicts.

    Usage::

        conv = Conventions(min_delta_ms=200.0, starvation_ratio=30.0)
        analysis = analyze(store, start, end, conventions=conv)
    """

    # --- span classification -------------------------------------------------------------
    # Attribute lists are read in order, the first non-empty value wins; every list may have any
    # length. The defaults cover the official OpenTelemetry instrumentations (openai-v2 with and
    # without the GenAI opt-in, HTTP, Celery), Traceloop/OpenLLMetry before and after 0.55, and
    # OpenInference (docs/analytics.md, "What tailwatch reads from each instrumentation").
    path_attribute: str = "tailwatch.path"  # span or resource attribute: "hot" / "cold"
    hot_value: str = "hot"
    cold_value: str = "cold"
    hot_root_kinds: tuple[str, ...] = ("Server",)
    operation_attributes: tuple[str, ...] = ("gen_ai.operation.name", "llm.request.type")
    llm_operations: tuple[str, ...] = (
        "chat",
        "text_completion",
        "completion",
        "generate_content",
        "embeddings",
        "embedding",
    )
    # Span-kind attributes of the LLM frameworks (OpenInference's LLM/CHAIN/AGENT/TOOL…, Traceloop's
    # workflow/task/agent/tool): which values make a model call, which a workflow.
    kind_attributes: tuple[str, ...] = ("openinference.span.kind", "traceloop.span.kind")
    llm_kinds: tuple[str, ...] = ("LLM", "EMBEDDING")
    workflow_kinds: tuple[str, ...] = ("workflow", "agent", "AGENT", "CHAIN")
    # invoke_agent is an LLM call when remote (kind Client), structure when in-process.
    remote_agent_operation: str = "invoke_agent"
    structure_operations: tuple[str, ...] = (
        "invoke_workflow",
        "invoke_agent",
        "execute_tool",
        "create_agent",
    )
    workflow_operations: tuple[str, ...] = ("invoke_workflow", "invoke_agent")
    provider_attributes: tuple[str, ...] = (
        "gen_ai.provider.name",
        "gen_ai.system",
        "llm.provider",
        "llm.system",
    )
    # Provider names are lower-cased, then renamed by this table (from, to): Traceloop's "Azure" and
    # the old "az.ai.openai" are the GenAI conventions' "azure.ai.openai".
    provider_aliases: tuple[tuple[str, str], ...] = (
        ("azure", "azure.ai.openai"),
        ("az.ai.openai", "azure.ai.openai"),
        ("azure_openai", "azure.ai.openai"),
        ("google", "gcp.vertex_ai"),
        ("bedrock", "aws.bedrock"),
    )
    model_attributes: tuple[str, ...] = ("gen_ai.request.model", "gen_ai.response.model", "llm.model_name")
    workflow_name_attributes: tuple[str, ...] = (
        "gen_ai.workflow.name",
        "gen_ai.agent.name",
        "traceloop.workflow.name",
        "traceloop.entity.name",
    )
    version_attribute: str = "service.version"
    # Celery writes the routing key to the pre-1.24 messaging.destination.
    queue_attributes: tuple[str, ...] = ("messaging.destination.name", "messaging.destination")
    # A span of these messaging operations starts cold-path work, whatever its kind (a pull
    # consumer's receive span is a Client span); so does every Consumer span.
    messaging_operation_attributes: tuple[str, ...] = ("messaging.operation.type", "messaging.operation")
    consumer_operations: tuple[str, ...] = ("process", "receive")
    message_id_attribute: str = "messaging.message.id"
    # A consumer run that did not finish its job (Celery: a failure or a retry).
    run_state_attribute: str = "celery.state"
    failed_run_states: tuple[str, ...] = ("FAILURE", "RETRY")
    # HTTP: the stable names first, the pre-1.21 ones the instrumentations still emit by default.
    http_status_attributes: tuple[str, ...] = ("http.response.status_code", "http.status_code")
    http_method_attributes: tuple[str, ...] = ("http.request.method", "http.method")
    abandon_status_codes: tuple[str, ...] = ("499",)
    abandon_attribute: str = "tailwatch.abandoned"
    # Sampled data: a root span stands for this many requests when its attribute holds a 1-in-N rate
    # above 1 (ClickStack/HyperDX); else 1/p of the OpenTelemetry threshold in TraceState (ot=th:…).
    sample_rate_attribute: str = "SampleRate"
    throttle_status_codes: tuple[str, ...] = ("429",)
    error_type_attribute: str = "error.type"
    # Retry numbers of an HTTP attempt: the HTTP convention's resend count, and the OpenAI/Anthropic
    # SDKs' retry header when request headers are captured (recorded as a one-element array).
    resend_attributes: tuple[str, ...] = (
        "http.request.resend_count",
        "http.request.header.x-stainless-retry-count",
    )
    input_token_attributes: tuple[str, ...] = (
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.prompt_tokens",
        "llm.token_count.prompt",
    )
    output_token_attributes: tuple[str, ...] = (
        "gen_ai.usage.output_tokens",
        "gen_ai.usage.completion_tokens",
        "llm.token_count.completion",
    )
    # Input tokens read from the provider's prompt cache (a part of the input tokens): the GenAI
    # convention's (openai-v2, OpenLLMetry), OpenInference's.
    cached_input_token_attributes: tuple[str, ...] = (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "llm.token_count.prompt_details.cache_read",
    )
    # A call's time to its first token (seconds): the GenAI convention's time to first chunk,
    # Sentry's SDKs' time to first token, vLLM's server-side span.
    first_token_attributes: tuple[str, ...] = (
        "gen_ai.response.time_to_first_chunk",
        "gen_ai.response.time_to_first_token",
        "gen_ai.latency.time_to_first_token",
    )
    # …else the first of these span events on the call's span (its time minus the span's start):
    # OpenLLMetry adds one per streamed chunk, OpenInference one at the first token.
    first_token_events: tuple[str, ...] = (
        "gen_ai.content.completion.chunk",
        "llm.content.completion.chunk",
        "First Token Stream Event",
    )
    # A streamed call: one of these attributes is true (or the call has a first-token time).
    # (OpenLLMetry writes gen_ai.is_streaming, llm.is_streaming before; the Anthropic SDK's own
    # spans gen_ai.request.stream.)
    streaming_attributes: tuple[str, ...] = (
        "gen_ai.request.stream",
        "gen_ai.is_streaming",
        "llm.is_streaming",
    )
    # A streamed endpoint's first byte: the earliest span of the root's trace and service whose
    # attribute ``first_byte_attribute`` holds one of ``first_byte_events`` (the ASGI instrumentation's
    # "<route> http send" span per send() call; Starlette's StreamingResponse sends
    # http.response.start before it produces its body, so the first *body* send is the first byte of
    # content the user sees). Two or more such sends make the response streamed. "" reads none.
    first_byte_attribute: str = "asgi.event.type"
    first_byte_events: tuple[str, ...] = ("http.response.body",)
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
    # A release's own step is measured right after it, not over the version's whole life: its
    # first ``release_step_requests`` requests or ``release_step_window``, whichever comes first,
    # against the requests of the same length of time just before it (at most as many).
    release_step_window: timedelta = timedelta(hours=1)
    release_step_requests: int = 1000

    # --- cold path -----------------------------------------------------------------------
    starvation_ratio: float = 20.0
    cdf_points: int = 200

    # --- abandonment ---------------------------------------------------------------------
    bucket_ms: int = 500
    cliff_min_requests: int = 30  # a bucket needs this many requests to take part in the cliff
    cliff_min_jump: float = 0.05  # the cliff's rise in abandonment rate over the bucket before it
    # Which latency an operation's abandonment is read against: (service glob, operation glob,
    # "duration" | "first_byte"), the first match wins, else "duration"; config files give tables
    # {service = "*", operation = "POST /chat/stream", latency = "first_byte"}. A streamed answer's
    # user waits for its first byte, not its last; a request without a first byte keeps its duration.
    abandonment_latency: tuple[tuple[str, str, str], ...] = ()

    # --- attribution ---------------------------------------------------------------------
    tail_quantile: float = 0.99
    max_tail_traces: int = 1000  # per operation and window; the slowest are kept
    attribution_min_delta_ms: float = 50.0
    attribution_dominance: float = 0.7  # share of the delta one side needs for its verdict
    attribution_min_requests: int = 20  # per window, for a verdict other than "none"
    exemplars: int = 5
    top_spans: int = 10

    # --- the hot/cold boundary (analytics.boundary) ---------------------------------------
    # Latency budgets per operation: (service glob, operation glob, budget ms), the first match
    # wins; config files give a list of tables {service = "*", operation = "POST /chat",
    # budget = "2s"}. An operation without one takes its abandonment cliff as its budget.
    latency_budgets: tuple[tuple[str, str, float], ...] = ()
    # What each synchronous model call would cost instead when moved off the hot path (e.g. a warm
    # cache's lookup p50): added per call removed in the counterfactual.
    sync_llm_replacement_ms: float = 0.0
    # The what-if options (analytics.what_if): the fallback a timed-out call is cut to costs this
    # much (a cache read's time); hedge and timeout delays tried beside each model's own p95; the
    # seed of the draws from the observed call latencies.
    what_if_fallback_ms: float = 50.0
    # Per operation (service glob, operation glob, fallback ms; config files give tables
    # {service = "*", operation = "POST /chat", fallback = "20ms"}): the first match wins, else
    # what_if_fallback_ms — a rule-based answer and a cache read cost different times.
    what_if_fallbacks: tuple[tuple[str, str, float], ...] = ()
    what_if_delays_ms: tuple[float, ...] = ()
    # The extra tokens (a share of the operation's) the hedge with the lowest p99 may cost.
    what_if_max_extra_tokens: float = 0.1
    what_if_seed: int = 0
    # The options are simulated on the requests of the window's most recent what_if_horizon (or its
    # exact_horizon when shorter): enough requests for a p99 at modest traffic, and a simulation
    # whose cost does not grow with the window.
    what_if_horizon: timedelta = timedelta(hours=1)

    # --- model prices (analytics.llm_anatomy) ------------------------------------------------
    # USD per million tokens per provider and model: config files give a list of tables
    # {provider = "openai", model = "gpt-4o", input = 2.5, cached_input = 1.25, output = 10.0}
    # (provider "*" matches any; cached_input defaults to input). None are shipped: prices are the
    # team's. A model without a price has no cost (null, never 0).
    llm_prices: tuple[Price, ...] = ()

    # --- slices (analytics.slices) ---------------------------------------------------------
    # OpenTelemetry feature flags: the flag key and variant as attributes of a span of the request's
    # trace, or on a flag-evaluation span event (semconv 1.27+ "feature_flag.evaluation" with
    # feature_flag.result.variant; the older "feature_flag" event with feature_flag.variant; the
    # evaluated value when the provider has no variants).
    flag_key_attributes: tuple[str, ...] = ("feature_flag.key",)
    flag_variant_attributes: tuple[str, ...] = (
        "feature_flag.result.variant",
        "feature_flag.variant",
        "feature_flag.result.value",
    )
    flag_events: tuple[str, ...] = ("feature_flag.evaluation", "feature_flag")
    # Any other attributes that split requests (a cohort, a rollout stage): the attribute's name is
    # the "flag", its value the variant.
    slice_attributes: tuple[str, ...] = ()
    # The control of a flag: the first of these variants present (case-insensitive), else the variant
    # with the most requests.
    slice_control_variants: tuple[str, ...] = ("control", "off", "false", "disabled")
    # Practical significance of a variant's abandonment difference (absolute rate).
    slice_min_abandonment_delta: float = 0.01

    # --- series and aggregates -------------------------------------------------------------
    series_buckets: int = 120  # target number of time buckets per window
    # Windows longer than this read the hot-path percentiles, series and abandonment curve from the
    # per-minute aggregates (analytics.aggregates: percentiles within 0.5%, counts exact) instead of
    # one row per request; shorter ones (the rules' hour) stay exact.
    exact_horizon: timedelta = timedelta(hours=6)

    # --- summaries (analytics.summaries) ---------------------------------------------------
    # When a minute is summarised, the critical path of its slowest requests per operation is walked
    # once: those at or above this share's quantile (a window's tail traces are read, not walked).
    summary_walk_share: float = 0.02
    summary_chunk_spans: int = 5_000_000  # span rows summarised per read (whole minutes)
    # Minutes this recent are counted again at every build; changed ones are summarised again.
    summary_late_horizon: timedelta = timedelta(hours=6)
    # Summaries outlive the raw spans: a 30- or 90-day view keeps working after their TTL.
    summary_retention: timedelta = timedelta(days=90)

    # --- architecture drift (analytics.drift) ---------------------------------------------
    # The drift report reads raw spans by day over its own window (``--drift-days``), compares the
    # first ``drift_edge_days`` days ("then") with the last ones ("now"), and names these findings.
    drift_days: int = 14
    drift_edge_days: int = 3
    # A function is recognised by its span name and these attributes (the first non-empty wins; the
    # namespace is prepended when the function name does not carry it).
    code_function_attributes: tuple[str, ...] = ("code.function.name", "code.function")
    code_namespace_attributes: tuple[str, ...] = ("code.namespace",)
    # shared_operation: reached from hot requests and from jobs, its hot-path share rising from below
    # this share "then" to at or above it "now"; at least ``drift_min_calls`` calls over the window.
    drift_hot_share: float = 0.10
    drift_min_calls: int = 50
    # batch_shrinking: items per run (the first of these attributes on a run span) falling and runs
    # per day climbing, each by at least this factor between then and now.
    batch_size_attributes: tuple[str, ...] = ("messaging.batch.message_count",)
    drift_batch_factor: float = 2.0
    # unit_cost_rising: model calls or tokens per unit of work (a hot request, a run's item, or a
    # run) rising by at least this factor between then and now.
    drift_cost_factor: float = 1.5
    # whole_batch_retry: the retries of a failed run (same message id) reprocess at least this many
    # items per item that failed ("just retry" the whole batch).
    drift_retry_reprocessed: float = 2.0
    # queue_unbounded: the backlog (enqueued − completed, summed by day) grows over the last
    # ``drift_edge_days`` days by more than this share of a day's enqueues, per day.
    drift_backlog_growth: float = 0.05
    # no_latency_target: a hot operation reaching a shared function, with at least this many requests
    # over the window and no latency budget or latency_slo rule covering it.
    drift_min_requests: int = 100

    # --- sampled data (docs/analytics.md, "Sampled data") ---------------------------------
    # A p99 of sampled requests is flagged (p99_warning) when fewer stored requests than this lie at
    # or above it: the figure then rests on a handful of spans, each standing for many requests.
    min_sampled_tail: int = 10

    def __post_init__(self) -> None:
        # Config files give the alias table as a TOML table or a list of pairs.
        aliases: Any = self.provider_aliases
        if isinstance(aliases, Mapping):
            aliases = list(aliases.items())
        try:
            pairs = tuple((str(a).lower(), str(b)) for a, b in aliases)
        except (TypeError, ValueError):
            raise ConventionsError(
                'conventions: provider_aliases must map names to names, e.g. { Azure = "azure.ai.openai" }'
            ) from None
        object.__setattr__(self, "provider_aliases", pairs)
        object.__setattr__(self, "latency_budgets", _budgets(self.latency_budgets))
        object.__setattr__(
            self,
            "what_if_fallbacks",
            _per_operation_ms(self.what_if_fallbacks, "what_if_fallbacks", "fallback", "20ms"),
        )
        object.__setattr__(self, "llm_prices", _prices(self.llm_prices))
        object.__setattr__(self, "abandonment_latency", _abandonment_latency(self.abandonment_latency))
        try:
            # Milliseconds as numbers, or durations in the one grammar ("2s", "1500ms").
            delays = tuple(
                parse_duration(d).total_seconds() * 1000.0 if isinstance(d, str) else float(d)
                for d in self.what_if_delays_ms
            )
        except (TypeError, ValueError):
            raise ConventionsError(
                "conventions: what_if_delays_ms takes a list of milliseconds, e.g. [1000, 2000]"
            ) from None
        if any(not math.isfinite(d) or d <= 0 for d in delays):
            raise ConventionsError(f"conventions: what_if_delays_ms must be positive, got {list(delays)}")
        object.__setattr__(self, "what_if_delays_ms", delays)
        _positive = (
            "min_release_requests",
            "release_step_requests",
            "bootstrap_samples",
            "starvation_ratio",
            "cdf_points",
            "bucket_ms",
            "max_tail_traces",
            "series_buckets",
            "coupling_min_releases",
            "min_sampled_tail",
            "summary_chunk_spans",
            "drift_days",
            "drift_edge_days",
            "drift_min_calls",
            "drift_min_requests",
        )
        for name in _positive:
            if getattr(self, name) <= 0:
                raise ConventionsError(f"conventions: {name} must be positive, got {getattr(self, name)}")
        if self.release_step_window <= timedelta(0):
            raise ConventionsError(
                f"conventions: release_step_window must be positive, got {self.release_step_window}"
            )
        if self.drift_days < 2 * self.drift_edge_days:
            raise ConventionsError(
                f"conventions: drift_days ({self.drift_days}) must be at least twice drift_edge_days "
                f"({self.drift_edge_days}): the report compares the first days with the last"
            )
        for name in ("drift_batch_factor", "drift_cost_factor"):
            if getattr(self, name) <= 1.0:
                raise ConventionsError(f"conventions: {name} must be above 1, got {getattr(self, name)}")
        for name in (
            "bootstrap_confidence",
            "tail_quantile",
            "attribution_dominance",
            "summary_walk_share",
            "drift_hot_share",
        ):
            value = getattr(self, name)
            if not 0.0 < value < 1.0:
                raise ConventionsError(f"conventions: {name} must be in (0, 1), got {value}")
        for name in (
            "min_delta_ms",
            "min_delta_ratio",
            "attribution_min_delta_ms",
            "cliff_min_requests",
            "cliff_min_jump",
            "attribution_min_requests",
            "sync_llm_replacement_ms",
            "slice_min_abandonment_delta",
            "what_if_fallback_ms",
            "drift_backlog_growth",
            "what_if_max_extra_tokens",
        ):
            if getattr(self, name) < 0:
                raise ConventionsError(f"conventions: {name} must not be negative")

    # ------------------------------------------------------------------------------------
    def abandonment_latency_of(self, service: str, operation: str) -> str:
        """``"first_byte"`` or ``"duration"``: the latency ``operation``'s abandonment is read
        against (:attr:`abandonment_latency`, the first match)."""
        for service_glob, operation_glob, latency in self.abandonment_latency:
            if fnmatchcase(service, service_glob) and fnmatchcase(operation, operation_glob):
                return latency
        return "duration"

    def summary_key(self) -> str:
        """A digest of the conventions the summaries are reduced with (which spans are requests,
        calls, jobs; their attributes; the trace margin; the abandonment buckets; the flags; the
        share of each minute walked): summaries built with other values answer other questions,
        so an analysis reads only those built with its own key (:mod:`analytics.summaries`).
        Thresholds and windows applied when reading are not part of it."""
        values = self.to_dict()
        chosen = {k: values[k] for k in sorted(values) if k in _REDUCED_WITH or k in _ATTRIBUTE_FIELDS}
        return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, timedelta):
                value = value.total_seconds()
            elif f.name == "llm_prices":
                value = [asdict(p) for p in value]
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Conventions:
        """Conventions from plain data (TOML, JSON, a persisted run): durations in the one grammar
        (``"5m"``, or seconds), lists for the attribute tuples. Unknown keys and bad values raise
        :class:`ConventionsError` naming them."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in _RETIRED:
                continue  # a setting of the HdrHistogram rollups the aggregates replaced: no effect
            if key not in known:
                raise ConventionsError(f"unknown convention {key!r}; known: {', '.join(sorted(known))}")
            default = getattr(cls, key, None)
            try:
                if isinstance(default, timedelta):
                    value = parse_duration(value)
                elif key.endswith("_ms") and isinstance(value, str):
                    # Milliseconds as a number, or a duration in the one grammar ("1.5s", "250ms").
                    value = parse_duration(value).total_seconds() * 1000.0
                elif isinstance(default, tuple) and isinstance(value, list | tuple):
                    value = tuple(value)
            except ValueError as exc:
                raise ConventionsError(f"convention {key}: {exc}") from None
            kwargs[key] = value
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise ConventionsError(f"conventions: {exc}") from None

    # --- SQL ------------------------------------------------------------------------------
    def sql_parameters(self) -> dict[str, Any]:
        """Server-side parameters the ``*_sql`` expressions refer to (``{cv_…:Type}``)."""
        return {
            "cv_path_attr": self.path_attribute,
            "cv_hot": self.hot_value,
            "cv_cold": self.cold_value,
            "cv_hot_kinds": list(self.hot_root_kinds),
            "cv_op_attrs": list(self.operation_attributes),
            "cv_llm_ops": list(self.llm_operations),
            "cv_kind_attrs": list(self.kind_attributes),
            "cv_llm_kinds": list(self.llm_kinds),
            "cv_workflow_kinds": list(self.workflow_kinds),
            "cv_remote_agent": self.remote_agent_operation,
            "cv_structure_ops": list(self.structure_operations),
            "cv_workflow_ops": list(self.workflow_operations),
            "cv_provider_attrs": list(self.provider_attributes),
            "cv_provider_from": [a.lower() for a, _ in self.provider_aliases],
            "cv_provider_to": [b for _, b in self.provider_aliases],
            "cv_model_attrs": list(self.model_attributes),
            "cv_wf_attrs": list(self.workflow_name_attributes),
            "cv_version_attr": self.version_attribute,
            "cv_queue_attrs": list(self.queue_attributes),
            "cv_msg_op_attrs": list(self.messaging_operation_attributes),
            "cv_consumer_ops": list(self.consumer_operations),
            "cv_msg_id_attr": self.message_id_attribute,
            "cv_run_state_attr": self.run_state_attribute,
            "cv_failed_states": list(self.failed_run_states),
            "cv_http_status_attrs": list(self.http_status_attributes),
            "cv_http_method_attrs": list(self.http_method_attributes),
            "cv_abandon_codes": list(self.abandon_status_codes),
            "cv_abandon_attr": self.abandon_attribute,
            "cv_sample_rate_attr": self.sample_rate_attribute,
            "cv_throttle_codes": list(self.throttle_status_codes),
            "cv_error_type_attr": self.error_type_attribute,
            "cv_resend_attrs": list(self.resend_attributes),
            "cv_in_toks": list(self.input_token_attributes),
            "cv_out_toks": list(self.output_token_attributes),
            "cv_cached_toks": list(self.cached_input_token_attributes),
            "cv_ttft_attrs": list(self.first_token_attributes),
            "cv_ttft_events": list(self.first_token_events),
            "cv_stream_attrs": list(self.streaming_attributes),
            "cv_flag_key_attrs": list(self.flag_key_attributes),
            "cv_flag_variant_attrs": list(self.flag_variant_attributes),
            "cv_flag_events": list(self.flag_events),
            "cv_slice_attrs": list(self.slice_attributes),
            "cv_code_fn_attrs": list(self.code_function_attributes),
            "cv_code_ns_attrs": list(self.code_namespace_attributes),
            "cv_batch_attrs": list(self.batch_size_attributes),
            "cv_first_byte_attr": self.first_byte_attribute,
            "cv_first_byte_events": list(self.first_byte_events),
        }


_PRICE_KEYS = ("provider", "model", "input", "cached_input", "output")


def _prices(entries: Any) -> tuple[Price, ...]:
    """``llm_prices`` as :class:`~analytics.llm_anatomy.Price` objects, from those or from the tables
    of a config file; a malformed entry raises :class:`ConventionsError` naming it and the key."""
    hint = 'e.g. { provider = "openai", model = "gpt-4o", input = 2.5, cached_input = 1.25, output = 10.0 }'
    out = []
    for i, entry in enumerate(entries or ()):
        if isinstance(entry, Price):
            out.append(entry)
            continue
        where = f"llm_prices[{i}]"
        if not isinstance(entry, Mapping):
            raise ConventionsError(f"{where}: a price is a table, {hint}")
        unknown = sorted(set(entry) - set(_PRICE_KEYS))
        if unknown:
            raise ConventionsError(
                f"{where}: unknown key {unknown[0]!r}; a price has {', '.join(_PRICE_KEYS)}"
            )
        for key in ("provider", "model"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConventionsError(f"{where}.{key}: a non-empty string is required, {hint}")
        numbers: dict[str, float | None] = {}
        for key in ("input", "cached_input", "output"):
            value = entry.get(key)
            if value is None and key == "cached_input":
                numbers[key] = None
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConventionsError(
                    f"{where}.{key}: USD per million tokens, a number >= 0 (got {value!r}), {hint}"
                )
            numbers[key] = float(value)
        out.append(
            Price(
                provider=entry["provider"].lower(),
                model=entry["model"],
                input=cast(float, numbers["input"]),
                output=cast(float, numbers["output"]),
                cached_input=numbers["cached_input"],
            )
        )
    return tuple(out)


ABANDONMENT_LATENCIES = ("duration", "first_byte")


def _abandonment_latency(entries: Any) -> tuple[tuple[str, str, str], ...]:
    """``abandonment_latency`` as (service glob, operation glob, latency) triples, from triples or
    from tables ``{service, operation, latency}`` (``service``/``operation`` default ``"*"``)."""
    hint = (
        'conventions: abandonment_latency takes tables like { service = "*", operation = '
        '"POST /chat/stream", latency = "first_byte" } (latency: duration or first_byte)'
    )
    if isinstance(entries, Mapping | str):
        raise ConventionsError(hint)
    out: list[tuple[str, str, str]] = []
    for entry in entries:
        if isinstance(entry, Mapping):
            if set(entry) - {"service", "operation", "latency"} or "latency" not in entry:
                raise ConventionsError(f"{hint}; got {dict(entry)!r}")
            service, operation = entry.get("service", "*"), entry.get("operation", "*")
            latency = entry["latency"]
        else:
            try:
                service, operation, latency = entry
            except (TypeError, ValueError):
                raise ConventionsError(f"{hint}; got {entry!r}") from None
        values = (service, operation, latency)
        if not all(isinstance(v, str) for v in values) or latency not in ABANDONMENT_LATENCIES:
            raise ConventionsError(f"{hint}; got {entry!r}")
        out.append((service, operation, latency))
    return tuple(out)


def _budgets(entries: Any) -> tuple[tuple[str, str, float], ...]:
    """``latency_budgets`` as (service glob, operation glob, budget ms) triples, from triples or from
    the tables of a config file (``service``/``operation`` default ``"*"``; ``budget`` a duration,
    ``"2s"``, or ``budget_ms`` a number)."""
    return _per_operation_ms(entries, "latency_budgets", "budget", "2s")


def _per_operation_ms(entries: Any, name: str, key: str, example: str) -> tuple[tuple[str, str, float], ...]:
    """A per-operation duration convention (``name``) as (service glob, operation glob, ms) triples,
    from triples or from tables ``{service, operation, <key> = "<duration>"}`` (or ``<key>_ms``, a
    number); the first match wins where it is read."""
    hint = (
        f'conventions: {name} takes tables like {{ service = "*", operation = "POST /chat", '
        f'{key} = "{example}" }}'
    )
    if isinstance(entries, Mapping | str):
        raise ConventionsError(hint)
    ms_key = f"{key}_ms"
    out: list[tuple[str, str, float]] = []
    for entry in entries:
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"service", "operation", key, ms_key})
            if unknown or (key in entry) == (ms_key in entry):
                raise ConventionsError(f"{hint}; got {dict(entry)!r}")
            try:
                value_ms = (
                    parse_duration(entry[key]).total_seconds() * 1000.0
                    if key in entry
                    else float(entry[ms_key])
                )
            except (TypeError, ValueError) as exc:
                raise ConventionsError(f"conventions: {name}: {exc}") from None
            service, operation = entry.get("service", "*"), entry.get("operation", "*")
        else:
            try:
                service, operation, value = entry
                value_ms = float(value)
            except (TypeError, ValueError):
                raise ConventionsError(f"{hint}; got {entry!r}") from None
        if not isinstance(service, str) or not isinstance(operation, str):
            raise ConventionsError(f"{hint}; got {entry!r}")
        if not (math.isfinite(value_ms) and value_ms > 0):
            raise ConventionsError(f"conventions: {name} for {service} {operation} must be positive")
        out.append((service, operation, value_ms))
    return tuple(out)


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


# Attribute lists are looked up one key at a time for their first entries (plain lookups are
# cheaper per row than a lambda over the list), the rest through a lambda; each value appears once
# in the text, as the planning of these expressions is a fixed cost of every read.
_UNROLLED_KEYS = 4


def _first(keys: str, column: str = "SpanAttributes") -> str:
    """The value of the first key of the ``Array(String)`` parameter ``keys`` present in ``column``
    with a non-empty value ('' when none): an attribute list of any length, still one parameter."""
    param = f"{{{keys}:Array(String)}}"
    # An index past the list's end gives '', which no key equals.
    lookups = [
        f"nullIf({column}.values[indexOf({column}.keys, {param}[{i}])], '')"
        for i in range(1, _UNROLLED_KEYS + 1)
    ]
    rest = (
        f"nullIf(arrayFirst(v -> v != '', arrayMap(k -> {column}.values[indexOf({column}.keys, k)], "
        f"arraySlice({param}, {_UNROLLED_KEYS + 1}))), '')"
    )
    return f"coalesce({', '.join(lookups)}, {rest}, '')"


def _has_any(keys: str) -> str:
    """Whether a span carries any key of the parameter ``keys``: reads the key subcolumn only."""
    return f"hasAny(SpanAttributes.keys, {{{keys}:Array(String)}})"


OP = _first("cv_op_attrs")
FRAMEWORK_KIND = _first("cv_kind_attrs")
PATH = (
    f"if({_span('cv_path_attr')} != '', {_span('cv_path_attr')}, "
    f"{_attr('ResourceAttributes', 'cv_path_attr')})"
)
_RAW_PROVIDER = f"lower({_first('cv_provider_attrs')})"
PROVIDER = (
    f"transform({_RAW_PROVIDER}, {{cv_provider_from:Array(String)}}, {{cv_provider_to:Array(String)}}, "
    f"{_RAW_PROVIDER})"
)
MODEL = _first("cv_model_attrs")
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
# An LLM span: a model call by operation name or framework span kind, a remote agent call, or a
# provider without operation.
IS_LLM = (
    f"({OP} IN {{cv_llm_ops:Array(String)}} "
    f"OR {FRAMEWORK_KIND} IN {{cv_llm_kinds:Array(String)}} "
    f"OR ({OP} = {{cv_remote_agent:String}} AND {KIND} = 'Client') "
    f"OR ({OP} = '' AND {FRAMEWORK_KIND} = '' AND {_RAW_PROVIDER} != ''))"
)
IS_WORKFLOW = (
    f"(({OP} IN {{cv_workflow_ops:Array(String)}} "
    f"AND NOT ({OP} = {{cv_remote_agent:String}} AND {KIND} = 'Client')) "
    f"OR {FRAMEWORK_KIND} IN {{cv_workflow_kinds:Array(String)}})"
)
WORKFLOW_NAME = f"if({_first('cv_wf_attrs')} != '', {_first('cv_wf_attrs')}, SpanName)"
HTTP_STATUS = f"toUInt16OrZero({_first('cv_http_status_attrs')})"
# Where cold-path work starts: a consumer span, or a messaging process/receive span of any kind.
IS_BOUNDARY = f"({KIND} = 'Consumer' OR {_first('cv_msg_op_attrs')} IN {{cv_consumer_ops:Array(String)}})"
MAYBE_BOUNDARY = f"({KIND} = 'Consumer' OR {_has_any('cv_msg_op_attrs')})"
# An HTTP client span: a physical attempt when its parent is an LLM span.
IS_HTTP_CLIENT = f"({KIND} = 'Client' AND {_first('cv_http_method_attrs')} != '')"
MAYBE_HTTP_CLIENT = f"({KIND} = 'Client' AND {_has_any('cv_http_method_attrs')})"
ABANDONED = (
    f"({_first('cv_http_status_attrs')} IN {{cv_abandon_codes:Array(String)}} "
    f"OR lower({_span('cv_abandon_attr')}) = 'true')"
)
THROTTLED = (
    f"({_first('cv_http_status_attrs')} IN {{cv_throttle_codes:Array(String)}} "
    f"OR {_span('cv_error_type_attr')} IN {{cv_throttle_codes:Array(String)}})"
)
# Failed: an error status, an error type, or an HTTP error status (the HTTP instrumentations set the
# status on 4xx of a client span; older ones only the status code).
ERRORED = f"({STATUS} = 'Error' OR {_span('cv_error_type_attr')} != '' OR {HTTP_STATUS} >= 400)"
# The captured retry header is recorded as a one-element array ('["1"]'): the digits are the number.
RESEND = f"toUInt32OrZero(extract({_first('cv_resend_attrs')}, '[0-9]+'))"
TOKENS = f"(toUInt64OrZero({_first('cv_in_toks')}) + toUInt64OrZero({_first('cv_out_toks')}))"
# A model call's anatomy, read once per span by analytics.llm_spans (in its WITH clause, so each
# attribute lookup appears once in the text): the token counts, the cached input tokens' value ('' when
# the span reports none: 0 is a report), the time to first token's attribute (seconds) and, without
# it, the first named event's time after the span's start (ns, NULL without one).
INPUT_TOKENS = f"toUInt64OrZero({_first('cv_in_toks')})"
OUTPUT_TOKENS = f"toUInt64OrZero({_first('cv_out_toks')})"
CACHED_INPUT_TEXT = _first("cv_cached_toks")
TTFT_TEXT = _first("cv_ttft_attrs")
TTFT_EVENT_NS = (
    "if(hasAny(`Events.Name`, {cv_ttft_events:Array(String)}), "
    "arrayMin(arrayMap(t -> toUnixTimestamp64Nano(t) - toUnixTimestamp64Nano(Timestamp), "
    "arrayFilter((t, n) -> has({cv_ttft_events:Array(String)}, n), `Events.Timestamp`, `Events.Name`))), "
    "NULL)"
)
STREAMED = f"(lower({_first('cv_stream_attrs')}) IN ('true', '1'))"
# A server's send of its response's first byte (analytics.llm_spans.first_bytes_sql): the key for
# PREWHERE (the key subcolumn only), then the value.
MAYBE_FIRST_BYTE = "has(SpanAttributes.keys, {cv_first_byte_attr:String})"
IS_FIRST_BYTE = f"({_span('cv_first_byte_attr')} IN {{cv_first_byte_events:Array(String)}})"
# A function's name: the code attributes' function, its namespace prepended when not already in it
# ('' without code attributes: the span name alone names it).
_CODE_FN = _first("cv_code_fn_attrs")
_CODE_NS = _first("cv_code_ns_attrs")
CODE_FUNCTION = (
    f"if({_CODE_NS} != '' AND {_CODE_FN} != '' AND NOT startsWith({_CODE_FN}, concat({_CODE_NS}, '.')), "
    f"concat({_CODE_NS}, '.', {_CODE_FN}), {_CODE_FN})"
)
BATCH_SIZE = f"toFloat64OrNull({_first('cv_batch_attrs')})"
QUEUE = f"if({_first('cv_queue_attrs')} != '', {_first('cv_queue_attrs')}, SpanName)"
MESSAGE_ID = _span("cv_msg_id_attr")
# A feature flag evaluated on a span, as its attributes (analytics.slices reads the events too).
FLAG_KEY = _first("cv_flag_key_attrs")
FLAG_VARIANT = _first("cv_flag_variant_attrs")
# The weight of a root span: how many requests it stands for in sampled data. ClickStack's 1-in-N
# rate attribute when above 1 (read as ClickStack materializes it: an unsigned integer, else 0), else
# the inverse of the probability of OpenTelemetry's consistent sampling: TraceState's ot=th:<hex> is
# a rejection threshold T of 1–14 hex digits, right-padded with zeros to 56 bits, p = (2^56 − T) / 2^56
# (th:0 keeps everything). The digits padded to 16 make a big-endian UInt64 (unhex, reversed for
# reinterpretAsUInt64) that is T shifted left by 8. A malformed threshold (no digits, more than 14)
# is ignored, as the specification says. Unsampled spans weigh exactly 1.0.
SAMPLE_RATE = f"toUInt64OrZero({_span('cv_sample_rate_attr')})"
# The ot entry of a W3C tracestate list (members split by commas, optional blanks around them), then
# its th sub-key among the ';'-separated ones. No braces or backslashes: the text is a SQL literal
# inside a query with {name:Type} parameters.
_TH_DIGITS = "extract(TraceState, '(?:^|,)[[:blank:]]*ot=(?:[^,;]*;)*th:([0-9a-f]+)(?:[;,[:blank:]]|$)')"
_TWO_56 = "72057594037927936"
_TH_THRESHOLD = f"bitShiftRight(reinterpretAsUInt64(reverse(unhex(rightPad({_TH_DIGITS}, 16, '0')))), 8)"
WEIGHT = (
    f"if({SAMPLE_RATE} > 1, toFloat64({SAMPLE_RATE}), "
    f"if(length({_TH_DIGITS}) BETWEEN 1 AND 14, {_TWO_56} / toFloat64({_TWO_56} - {_TH_THRESHOLD}), 1.0))"
)
RUN_FAILED = f"({STATUS} = 'Error' OR {_span('cv_run_state_attr')} IN {{cv_failed_states:Array(String)}})"

# Cheap necessary conditions, for PREWHERE: they read only the maps' key subcolumns (a key lookup
# reads the whole map column), so the maps of spans that cannot match are never decompressed.
# IS_LLM needs an operation, framework-kind or provider key (unless a convention matches the empty
# value).
MAYBE_LLM = (
    f"({_has_any('cv_op_attrs')} OR {_has_any('cv_kind_attrs')} OR {_has_any('cv_provider_attrs')} "
    "OR has({cv_llm_ops:Array(String)}, '') OR has({cv_llm_kinds:Array(String)}, '') "
    "OR {cv_remote_agent:String} = '')"
)
# Token or resend counts need their keys.
MAYBE_COUNTED = f"({_has_any('cv_resend_attrs')} OR {_has_any('cv_in_toks')} OR {_has_any('cv_out_toks')})"
# IS_WORKFLOW needs an operation or framework-kind key (unless a workflow value is the empty one).
MAYBE_WORKFLOW = (
    f"({_has_any('cv_op_attrs')} OR {_has_any('cv_kind_attrs')} "
    "OR has({cv_workflow_ops:Array(String)}, '') OR has({cv_workflow_kinds:Array(String)}, ''))"
)


# The span conventions: every field declared before ``trace_margin``.
_ATTRIBUTE_FIELDS = frozenset(
    f.name for f in fields(Conventions)[: [f.name for f in fields(Conventions)].index("trace_margin")]
)
