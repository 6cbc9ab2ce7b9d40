"""slo_rules: SLO rules as YAML, alert lifecycle with LLM-vs-internal attribution, exactly-once delivery.

Public surface::

    from slo_rules import load_rules, evaluate, deliver, WebhookConfig

    rules = load_rules()                                   # the default pack (slo_rules/default.yaml)
    result = evaluate(store, rules, notifiers=[WebhookConfig("http://127.0.0.1:9093/hook")])
    report = deliver(store, [WebhookConfig("http://127.0.0.1:9093/hook")])

A notifier of your own implements :class:`Notifier` (``send(notification) -> DeliveryResult``) and
is passed to :func:`deliver` through ``notifier_factory``; receivers check requests with
:func:`verify_signature`.
"""

from slo_rules.engine import EvaluationResult, evaluate
from slo_rules.errors import DeliveryError, RuleError
from slo_rules.notifiers import (
    DeliveryResult,
    Notification,
    Notifier,
    NotifierConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
    verify_signature,
)
from slo_rules.outbox import DeliveryReport, deliver
from slo_rules.rules import DEFAULT_RULES_PATH, RuleSet, check_rule_files, load_rules
from slo_rules.state import alert_history, list_alerts

__all__ = [
    "DEFAULT_RULES_PATH",
    "DeliveryError",
    "DeliveryReport",
    "DeliveryResult",
    "EvaluationResult",
    "Notification",
    "Notifier",
    "NotifierConfig",
    "PagerDutyConfig",
    "RuleError",
    "RuleSet",
    "SlackConfig",
    "WebhookConfig",
    "alert_history",
    "check_rule_files",
    "deliver",
    "evaluate",
    "list_alerts",
    "load_rules",
    "verify_signature",
]
