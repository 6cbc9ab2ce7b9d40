"""slo_rules: SLO rules as YAML, alert lifecycle with LLM-vs-internal attribution, exactly-once delivery.

Public surface::

    from slo_rules import load_rules, evaluate, deliver, WebhookConfig

    rules = load_rules()                                   # the default pack (slo_rules/default.yaml)
    result = evaluate(store, rules, notifiers=[WebhookConfig("http://127.0.0.1:9093/hook")])
    report = deliver(store, [WebhookConfig("http://127.0.0.1:9093/hook")])
"""

from slo_rules.engine import EvaluationResult, burn_rate, evaluate
from slo_rules.errors import DeliveryError, RuleError, RuleProblem
from slo_rules.notifiers import (
    DeliveryResult,
    Notification,
    Notifier,
    NotifierConfig,
    PagerDutyConfig,
    SlackConfig,
    WebhookConfig,
    build_notifier,
    sign,
    verify_signature,
)
from slo_rules.outbox import DeliveryReport, deliver
from slo_rules.rules import DEFAULT_RULES_PATH, Route, Rule, RuleSet, check_rule_files, load_rules
from slo_rules.state import alert_history, fingerprint, list_alerts

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
    "Route",
    "Rule",
    "RuleError",
    "RuleProblem",
    "RuleSet",
    "SlackConfig",
    "WebhookConfig",
    "alert_history",
    "build_notifier",
    "burn_rate",
    "check_rule_files",
    "deliver",
    "evaluate",
    "fingerprint",
    "list_alerts",
    "load_rules",
    "sign",
    "verify_signature",
]
