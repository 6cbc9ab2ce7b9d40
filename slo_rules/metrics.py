"""Prometheus series of notification delivery, on the registry the caller passes to ``deliver``.

The service passes the registry it serves on ``/metrics``; every notifier, Alertmanager included,
is a label value, so an alert on tailwatch's own delivery is one PromQL expression::

    increase(tailwatch_notifications_total{outcome=~"retry|dead"}[15m]) > 0
    time() - tailwatch_notifier_last_success_timestamp_seconds > 600
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["DeliveryMetrics", "delivery_metrics"]


class DeliveryMetrics:
    """What each drain of the outbox did, per notifier.

    Usage::

        registry = CollectorRegistry()
        deliver(store, notifiers, registry=registry)
        registry.get_sample_value(
            "tailwatch_notifications_total",
            {"notifier": "webhook", "kind": "webhook", "outcome": "delivered"},
        )
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sent = Counter(
            "tailwatch_notifications",
            "Outbox items by notifier and outcome: delivered; retry (a failure tried again later); "
            "dead (refused with a 4xx, or undelivered for a day); superseded (an Alertmanager "
            "snapshot replaced by a newer one before it was delivered).",
            ["notifier", "kind", "outcome"],
            registry=registry,
        )
        self.requests = Counter(
            "tailwatch_notifier_requests",
            "HTTP requests to notifiers, retries inside one delivery included, by result.",
            ["notifier", "kind", "result"],
            registry=registry,
        )
        self.pending = Gauge(
            "tailwatch_notifications_pending",
            "Outbox items waiting for delivery after the last drain, per notifier.",
            ["notifier", "kind"],
            registry=registry,
        )
        self.last_success = Gauge(
            "tailwatch_notifier_last_success_timestamp_seconds",
            "Unix time of the last delivery each notifier accepted.",
            ["notifier", "kind"],
            registry=registry,
        )


_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, DeliveryMetrics] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def delivery_metrics(registry: CollectorRegistry) -> DeliveryMetrics:
    """The series on ``registry``, registered on first use (a registry takes each name once)."""
    with _lock:
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = DeliveryMetrics(registry)
            _by_registry[registry] = metrics
        return metrics
