"""slo_rules: SLO rules as YAML, alert lifecycle with LLM-vs-internal attribution, exactly-once delivery.

Public surface::

    from slo_rules import load_rules, evaluate, deliver, AlertmanagerConfig, WebhookConfig

    rules = load_rules()                                   # the default pack (slo_rules/default.yaml)
    notifiers = [WebhookConfig("http://127.0.0.1:8080/hook"), AlertmanagerConfig("http://127.0.0.1:9093")]
    result = evaluate(store, rules, notifiers=notifiers, trace_url="http://127.0.0.1:16686/trace/{trace_id}")
    report = deliver(store, notifiers)                     # registry=…: delivery counters for /metrics

A notifier of your own implements :class:`Notifier` (``send(notification) -> DeliveryResult``) and
is passed to :func:`deliver` through ``notifier_factory``; receivers check requests with
:func:`verify_signature`.
"""

from slo_rules.engine import (
    DEFAULT_DASHBOARD_URL,
    EvaluationResult,
    RuleExplanation,
    evaluate,
    last_evaluation,
)
from slo_rules.errors import DeliveryError, RuleError
from slo_rules.kinds.architecture_drift import drift_symptom
from slo_rules.links import check_trace_url, trace_link
from slo_rules.notifiers import (
    AlertmanagerConfig,
    DeliveryResult,
    Notification,
    Notifier,
    NotifierConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
    verify_signature,
)
from slo_rules.outbox import DeliveryReport, NotifierStatus, deliver, delivery_status
from slo_rules.rules import DEFAULT_RULES_PATH, RuleSet, check_rule_files, load_rules
from slo_rules.state import AlertState, alert_history, list_alerts

__all__ = [
    "DEFAULT_DASHBOARD_URL",
    "DEFAULT_RULES_PATH",
    "AlertState",
    "AlertmanagerConfig",
    "DeliveryError",
    "DeliveryReport",
    "DeliveryResult",
    "EvaluationResult",
    "Notification",
    "Notifier",
    "NotifierConfig",
    "NotifierStatus",
    "PagerDutyConfig",
    "RuleError",
    "RuleExplanation",
    "RuleSet",
    "SlackConfig",
    "WebhookConfig",
    "alert_history",
    "check_rule_files",
    "check_trace_url",
    "deliver",
    "delivery_status",
    "drift_symptom",
    "evaluate",
    "last_evaluation",
    "list_alerts",
    "load_rules",
    "trace_link",
    "verify_signature",
]
