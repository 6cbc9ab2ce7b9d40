"""Notifications and the notifiers that deliver them: Alertmanager webhook, Slack, PagerDuty, and
Alertmanager itself (its ``/api/v2/alerts`` push API).

One small protocol, :class:`Notifier` (``send(notification) -> DeliveryResult``): a notifier never
raises into the outbox; it returns what happened. Every request carries

- ``Idempotency-Key``: the notification id, the same on every retry and after a restart, so a
  receiver can drop the duplicate an at-least-once sender produces when it crashes between the
  receiver's 2xx and recording the delivery;
- with a secret: ``X-Tailwatch-Timestamp`` (Unix seconds) and ``X-Tailwatch-Signature:
  sha256=<hex HMAC-SHA256(secret, "<timestamp>." + raw body)>`` — the timestamp is signed, so a
  captured request cannot be replayed later under a fresh one.

Retries inside one ``send``: 429, 5xx and network errors, exponential backoff with full jitter,
``Retry-After`` first (when it is short enough to wait for; a longer one is handed back to the
outbox, which schedules the next attempt no earlier than it asks).

The Alertmanager notifier is different in kind: it is not told about transitions but handed, on
every evaluation, the whole set of firing and recently resolved alerts (snapshots,
:func:`slo_rules.fanout.alertmanager_items`), the way Prometheus's rule manager pushes them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import random
import re
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, Protocol, TypeAlias
from urllib.parse import urlsplit

import httpx

from slo_rules.errors import DeliveryError
from storage import as_utc, format_duration, parse_time, utc_now

__all__ = [
    "RETRYABLE_STATUS",
    "AlertPayload",
    "AlertmanagerConfig",
    "AlertmanagerNotifier",
    "DeliveryResult",
    "Notification",
    "Notifier",
    "NotifierConfig",
    "PagerDutyConfig",
    "PagerDutyNotifier",
    "SlackConfig",
    "SlackNotifier",
    "WebhookConfig",
    "WebhookNotifier",
    "alertmanager_alerts",
    "alertmanager_body",
    "build_notifier",
    "pagerduty_body",
    "sign",
    "slack_body",
    "verify_signature",
]

ZERO_TIME = "0001-01-01T00:00:00Z"
SIGNATURE_HEADER = "X-Tailwatch-Signature"
TIMESTAMP_HEADER = "X-Tailwatch-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
Status = Literal["firing", "resolved"]


def _iso(value: datetime | None) -> str:
    # Not storage.iso_z (whole seconds, or microseconds when there are any): the webhook bodies keep
    # Alertmanager's millisecond form, and "no time" is Go's zero time as Alertmanager sends it.
    if value is None:
        return ZERO_TIME
    return as_utc(value).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_iso(value: str | None) -> datetime | None:
    if not value or value == ZERO_TIME:
        return None
    return parse_time(value)


@dataclass(frozen=True)
class AlertPayload:
    """One alert inside a notification, in Alertmanager's terms."""

    status: Status
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: datetime
    ends_at: datetime | None
    fingerprint: str
    generator_url: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": _iso(self.starts_at),
            "endsAt": _iso(self.ends_at),
            "generatorURL": self.generator_url,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AlertPayload:
        starts = _parse_iso(data["startsAt"])
        assert starts is not None
        return cls(
            status=data["status"],
            labels=dict(data["labels"]),
            annotations=dict(data["annotations"]),
            starts_at=starts,
            ends_at=_parse_iso(data.get("endsAt")),
            fingerprint=data["fingerprint"],
            generator_url=data.get("generatorURL", ""),
        )


@dataclass(frozen=True)
class Notification:
    """What one notifier is told about one group of alert transitions. ``id`` is the idempotency key."""

    id: str
    status: Status
    group_key: str
    group_labels: Mapping[str, str]
    alerts: tuple[AlertPayload, ...]
    external_url: str = ""
    created_at: datetime = field(default_factory=utc_now)

    @property
    def common_labels(self) -> dict[str, str]:
        return _common([a.labels for a in self.alerts])

    @property
    def common_annotations(self) -> dict[str, str]:
        return _common([a.annotations for a in self.alerts])

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.id,
                "status": self.status,
                "groupKey": self.group_key,
                "groupLabels": dict(self.group_labels),
                "alerts": [a.to_dict() for a in self.alerts],
                "externalURL": self.external_url,
                "createdAt": _iso(self.created_at),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Notification:
        data = json.loads(text)
        created = _parse_iso(data.get("createdAt")) or utc_now()
        return cls(
            id=data["id"],
            status=data["status"],
            group_key=data["groupKey"],
            group_labels=dict(data["groupLabels"]),
            alerts=tuple(AlertPayload.from_dict(a) for a in data["alerts"]),
            external_url=data.get("externalURL", ""),
            created_at=created,
        )


def _common(maps: list[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = dict(maps[0])
    return {k: v for k, v in sorted(first.items()) if all(m.get(k) == v for m in maps[1:])}


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class WebhookConfig:
    """A generic receiver of Alertmanager-format webhooks (version "4")."""

    url: str
    secret_env: str | None = None
    name: str = "webhook"
    timeout_s: float = 10.0

    kind = "webhook"


@dataclass(frozen=True)
class SlackConfig:
    """A Slack incoming webhook; ``url`` or the name of an environment variable holding it."""

    url: str = ""
    name: str = "slack"
    timeout_s: float = 10.0
    url_env: str | None = None
    secret_env: str | None = None

    kind = "slack"


@dataclass(frozen=True)
class PagerDutyConfig:
    """PagerDuty Events API v2; the routing (integration) key is read from ``routing_key_env``."""

    routing_key_env: str
    url: str = "https://events.pagerduty.com/v2/enqueue"
    name: str = "pagerduty"
    timeout_s: float = 10.0
    source: str = "tailwatch"
    secret_env: str | None = None

    kind = "pagerduty"


@dataclass(frozen=True)
class AlertmanagerConfig:
    """An Alertmanager (one per instance of an HA pair) fed through its ``/api/v2/alerts`` API.

    ``url`` is its base URL (``http://host:9093``, with the route prefix if it has one). Credentials
    come from the environment only: ``username`` with the password in ``password_env`` (basic
    auth), or the token in ``bearer_token_env``. ``ca_file`` verifies an https Alertmanager whose
    certificate the system store does not know. ``name`` defaults to ``alertmanager@host:port``,
    so the two instances of a pair keep their own outbox rows, retries and metrics.
    """

    url: str
    name: str = ""
    timeout_s: float = 10.0
    username: str | None = None
    password_env: str | None = None
    bearer_token_env: str | None = None
    ca_file: str | None = None

    kind = "alertmanager"

    def __post_init__(self) -> None:
        if not self.name:
            parts = urlsplit(self.url)
            where = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
            object.__setattr__(self, "name", f"alertmanager@{where}" if where else "alertmanager")

    @property
    def alerts_url(self) -> str:
        """``<url>/api/v2/alerts`` (a URL that already ends there is kept)."""
        base = self.url.rstrip("/")
        return base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"


NotifierConfig: TypeAlias = WebhookConfig | SlackConfig | PagerDutyConfig | AlertmanagerConfig


@dataclass(frozen=True)
class DeliveryResult:
    """The outcome of one ``send``: delivered, or why not and whether trying later can help."""

    ok: bool
    status_code: int | None = None
    attempts: int = 1
    error: str = ""
    retryable: bool = False
    retry_after_s: float | None = None


class Notifier(Protocol):
    """Anything that can deliver a notification and say how it went."""

    name: str
    kind: str

    def send(self, notification: Notification) -> DeliveryResult: ...


# ---------------------------------------------------------------------------------------------
# Bodies


def alertmanager_body(notification: Notification, receiver: str) -> dict[str, Any]:
    """The Alertmanager webhook body (version "4"), field for field."""
    return {
        "version": "4",
        "groupKey": notification.group_key,
        "truncatedAlerts": 0,
        "status": notification.status,
        "receiver": receiver,
        "groupLabels": dict(notification.group_labels),
        "commonLabels": notification.common_labels,
        "commonAnnotations": notification.common_annotations,
        "externalURL": notification.external_url,
        "alerts": [a.to_dict() for a in notification.alerts],
    }


_SLACK_ICON = {"firing": ":red_circle:", "resolved": ":large_green_circle:"}


def slack_body(notification: Notification) -> dict[str, Any]:
    """``text`` (the fallback every client shows) plus ``blocks`` with one section per alert."""
    lines = []
    blocks: list[dict[str, Any]] = []
    for alert in notification.alerts[:20]:
        labels = alert.labels
        head = (
            f"{_SLACK_ICON[alert.status]} [{alert.status.upper()}] {labels.get('alertname', '')} "
            f"({labels.get('severity', '')})"
        )
        summary = alert.annotations.get("summary", "")
        lasted = _lasted(alert)
        # What resolved it, in numbers, beside the summary it fired with.
        why = alert.annotations.get("resolved", "") if alert.status == "resolved" else ""
        lines.append(
            f"{head}: {summary}" + (f" ({lasted})" if lasted else "") + (f"; now {why}" if why else "")
        )
        detail = [f"*{_mrkdwn(head)}*", _mrkdwn(summary)]
        if lasted:
            detail.append(lasted + (f": {_mrkdwn(why)}" if why else ""))
        cause = alert.annotations.get("cause")
        if cause:
            detail.append(f"cause: *{_mrkdwn(cause)}*")
        links = [f"<{_slack_url(url)}|{text}>" for url, text in _links(alert)]
        if links:
            detail.append(" · ".join(links))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(detail)[:2900]}})
    if len(notification.alerts) > 20:
        more = len(notification.alerts) - 20
        lines.append(f"… and {more} more")
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"and {more} more"}]})
    return {"text": "\n".join(lines)[:3900], "blocks": blocks}


def _mrkdwn(text: str) -> str:
    # Slack mrkdwn needs only these three escaped; span names are user data.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_url(url: str) -> str:
    # Inside <url|text> a "|" or ">" would end the URL early; percent-encoding them keeps it whole.
    return url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")


def _lasted(alert: AlertPayload) -> str:
    """``resolved after 2h`` for a resolved alert, else ``""``."""
    if alert.status != "resolved" or alert.ends_at is None:
        return ""
    seconds = max(0.0, (as_utc(alert.ends_at) - as_utc(alert.starts_at)).total_seconds())
    return f"resolved after {format_duration(round(seconds))}" if seconds >= 1 else "resolved"


def _links(alert: AlertPayload, traces: int = 3) -> list[tuple[str, str]]:
    """(url, text) of the alert's dashboard and of its first exemplar traces."""
    out: list[tuple[str, str]] = []
    if alert.annotations.get("dashboard"):
        out.append((alert.annotations["dashboard"], "dashboard"))
    urls = alert.annotations.get("exemplar_urls", "").split()
    ids = [t for t in alert.annotations.get("exemplar_trace_ids", "").split(",") if t]
    for i, url in enumerate(urls[:traces]):
        trace_id = ids[i] if i < len(ids) else ""
        out.append((url, f"trace {trace_id[:8]}" if trace_id else f"trace {i + 1}"))
    return out


_PD_SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}


def pagerduty_body(notification: Notification, routing_key: str, source: str = "tailwatch") -> dict[str, Any]:
    """One Events API v2 event for the notification's (single) alert; dedup_key = its fingerprint."""
    alert = notification.alerts[0]
    if alert.status == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": alert.fingerprint}
    summary = alert.annotations.get("summary") or alert.labels.get("alertname", "tailwatch alert")
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.fingerprint,
        "payload": {
            "summary": summary[:1024],
            "source": alert.labels.get("service") or alert.labels.get("queue") or source,
            "severity": _PD_SEVERITY.get(alert.labels.get("severity", ""), "error"),
            "timestamp": _iso(alert.starts_at),
            "component": alert.labels.get("operation")
            or alert.labels.get("queue")
            or alert.labels.get("workflow")
            or "",
            "group": alert.labels.get("alertname", ""),
            "class": alert.annotations.get("cause", ""),
            "custom_details": {"labels": dict(alert.labels), "annotations": dict(alert.annotations)},
        },
        "client": "tailwatch",
    }
    links = [
        {"href": url, "text": "tailwatch dashboard" if text == "dashboard" else f"exemplar {text}"}
        for url, text in _links(alert, traces=5)
    ]
    if links:
        body["links"] = links
    if alert.annotations.get("dashboard"):
        body["client_url"] = alert.annotations["dashboard"]
    return body


_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _label_name(name: str) -> str:
    # Rule files only accept valid names; this keeps one odd label of an old stored alert from
    # making Alertmanager refuse the whole batch (a 400 for every alert in it).
    if _LABEL_NAME.match(name):
        return name
    return re.sub(r"[^A-Za-z0-9_]", "_", name).lstrip("0123456789") or "_"


def alertmanager_alerts(notification: Notification) -> list[dict[str, Any]]:
    """The postable alerts of Alertmanager's API v2 (``POST /api/v2/alerts``): labels (with
    ``cause``, already among them), annotations, ``startsAt``, ``endsAt`` and ``generatorURL``."""
    out = []
    for alert in notification.alerts:
        item: dict[str, Any] = {
            "labels": {_label_name(k): v for k, v in alert.labels.items() if v != ""},
            "annotations": {_label_name(k): v for k, v in alert.annotations.items()},
            "startsAt": _iso(alert.starts_at),
        }
        if alert.ends_at is not None:
            item["endsAt"] = _iso(alert.ends_at)
        if alert.generator_url:
            item["generatorURL"] = alert.generator_url
        out.append(item)
    return out


# ---------------------------------------------------------------------------------------------
# Signing


# How far a signed timestamp may be from the receiver's clock before a request counts as replayed.
SIGNATURE_TOLERANCE_S = 300


def sign(secret: str, body: bytes, timestamp: int | str) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``"<timestamp>." + raw body`` with the shared secret."""
    message = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str,
    body: bytes,
    header: str,
    timestamp: str,
    *,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
    now: float | None = None,
) -> bool:
    """What a receiver runs: the timestamp header within ``tolerance_s`` of its clock, and the HMAC
    recomputed over it and the raw bytes received, compared in constant time."""
    try:
        sent = int(timestamp.strip())
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, body, sent), header.strip())


# ---------------------------------------------------------------------------------------------
# HTTP delivery


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds: either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (as_utc(when) - utc_now()).total_seconds())


class _HttpNotifier:
    """JSON over HTTP POST with idempotency key, optional signature, bounded retries."""

    name: str
    kind: str

    def __init__(
        self,
        *,
        name: str,
        url: str,
        timeout_s: float,
        secret: str | None,
        retries: int = 2,
        backoff_s: float = 0.25,
        max_backoff_s: float = 5.0,
        max_wait_s: float = 10.0,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if not url:
            raise DeliveryError(f"notifier {name!r} has no URL")
        if not url.startswith(("http://", "https://")):
            raise DeliveryError(f"notifier {name!r}: URL {url!r} must start with http:// or https://")
        self.name = name
        self.url = url
        self.timeout_s = timeout_s
        self.secret = secret
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_wait_s = max_wait_s
        self._client = client or httpx.Client(timeout=httpx.Timeout(timeout_s), follow_redirects=False)
        self._own_client = client is None
        self.extra_headers: dict[str, str] = {}
        # Waits go through an Event so close() interrupts a sleeping retry instead of blocking shutdown.
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s) and None)

    def render(self, notification: Notification) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        if self._own_client:
            self._client.close()

    def __enter__(self) -> _HttpNotifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self, notification: Notification, body: bytes) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "tailwatch",
            IDEMPOTENCY_HEADER: notification.id,
            **self.extra_headers,
        }
        if self.secret:
            timestamp = str(int(time.time()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(self.secret, body, timestamp)
        return headers

    def send(self, notification: Notification) -> DeliveryResult:
        # The body is rendered once: every retry sends the same bytes under the same key.
        body = json.dumps(self.render(notification), separators=(",", ":"), ensure_ascii=False).encode()
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            try:
                response = self._client.post(
                    self.url, content=body, headers=self._headers(notification, body)
                )
            except httpx.HTTPError as exc:
                status: int | None = None
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                retryable = True
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return DeliveryResult(ok=True, status_code=status, attempts=attempt)
                error = f"HTTP {status}: {response.text[:200]}"
                retryable = status in RETRYABLE_STATUS or status >= 500
                retry_after = _retry_after(response.headers.get("Retry-After"))
            if not retryable:
                return DeliveryResult(ok=False, status_code=status, attempts=attempt, error=error)
            if attempt > self.retries or self._stop.is_set():
                return DeliveryResult(
                    ok=False,
                    status_code=status,
                    attempts=attempt,
                    error=error,
                    retryable=True,
                    retry_after_s=retry_after,
                )
            if retry_after is not None:
                if retry_after > self.max_wait_s:
                    # Too long to hold the drain: the outbox schedules the next try after it.
                    return DeliveryResult(
                        ok=False,
                        status_code=status,
                        attempts=attempt,
                        error=error,
                        retryable=True,
                        retry_after_s=retry_after,
                    )
                wait = retry_after
            else:
                cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
                wait = random.uniform(cap / 2, cap)
            self._sleep(wait)


class WebhookNotifier(_HttpNotifier):
    """Posts the Alertmanager webhook body; anything that consumes Alertmanager consumes this."""

    kind = "webhook"

    def render(self, notification: Notification) -> dict[str, Any]:
        return alertmanager_body(notification, self.name)


class SlackNotifier(_HttpNotifier):
    kind = "slack"

    def render(self, notification: Notification) -> dict[str, Any]:
        return slack_body(notification)


class AlertmanagerNotifier(_HttpNotifier):
    """Posts the snapshot's alerts to Alertmanager's ``/api/v2/alerts`` (a JSON array).

    Alertmanager identifies an alert by its label set, so posting the same alerts again (every
    evaluation, or the retry of a request that did arrive) only moves their ``endsAt``; grouping,
    silences, inhibition and the HA pair's deduplication all happen on its side.
    """

    kind = "alertmanager"

    def __init__(self, *, authorization: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if authorization:
            self.extra_headers["Authorization"] = authorization

    def render(self, notification: Notification) -> list[dict[str, Any]]:
        return alertmanager_alerts(notification)


class PagerDutyNotifier(_HttpNotifier):
    kind = "pagerduty"

    def __init__(self, *, routing_key: str, source: str = "tailwatch", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.routing_key = routing_key
        self.source = source

    def render(self, notification: Notification) -> dict[str, Any]:
        return pagerduty_body(notification, self.routing_key, self.source)


def _secret(env_name: str | None, notifier: str) -> str | None:
    if not env_name:
        return None
    value = os.environ.get(env_name)
    if not value:
        raise DeliveryError(f"notifier {notifier!r}: environment variable {env_name} (its secret) is not set")
    return value


def _authorization(config: AlertmanagerConfig) -> str | None:
    """The ``Authorization`` header value, credentials read from the environment now."""
    if config.bearer_token_env:
        token = _secret(config.bearer_token_env, config.name)
        return f"Bearer {token}"
    if config.username is not None or config.password_env:
        password = _secret(config.password_env, config.name) or ""
        pair = f"{config.username or ''}:{password}".encode()
        return "Basic " + base64.b64encode(pair).decode()
    return None


def _tls_client(config: AlertmanagerConfig) -> httpx.Client | None:
    """A client that trusts the CAs in ``ca_file`` (only those: not the system's as well)."""
    if not config.ca_file:
        return None
    try:
        context = ssl.create_default_context(cafile=config.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise DeliveryError(f"notifier {config.name!r}: CA file {config.ca_file}: {exc}") from None
    return httpx.Client(timeout=httpx.Timeout(config.timeout_s), follow_redirects=False, verify=context)


def build_notifier(config: NotifierConfig, **options: Any) -> _HttpNotifier:
    """The notifier for a configuration; secrets and keys are read from the environment now."""
    if isinstance(config, WebhookConfig):
        return WebhookNotifier(
            name=config.name,
            url=config.url,
            timeout_s=config.timeout_s,
            secret=_secret(config.secret_env, config.name),
            **options,
        )
    if isinstance(config, SlackConfig):
        url = config.url
        if config.url_env:
            url = os.environ.get(config.url_env, "") or url
            if not url:
                raise DeliveryError(
                    f"notifier {config.name!r}: environment variable {config.url_env} (its URL) is not set"
                )
        return SlackNotifier(
            name=config.name,
            url=url,
            timeout_s=config.timeout_s,
            secret=_secret(config.secret_env, config.name),
            **options,
        )
    if isinstance(config, AlertmanagerConfig):
        authorization = _authorization(config)
        tls = None if "client" in options else _tls_client(config)
        notifier = AlertmanagerNotifier(
            name=config.name,
            url=config.alerts_url,
            timeout_s=config.timeout_s,
            secret=None,
            authorization=authorization,
            **({"client": tls} if tls is not None else {}),
            **options,
        )
        if tls is not None:
            notifier._own_client = True  # built here, so closed with the notifier
        return notifier
    if isinstance(config, PagerDutyConfig):
        key = os.environ.get(config.routing_key_env, "")
        if not key:
            raise DeliveryError(
                f"notifier {config.name!r}: environment variable {config.routing_key_env} "
                "(the PagerDuty routing key) is not set"
            )
        return PagerDutyNotifier(
            name=config.name,
            url=config.url,
            timeout_s=config.timeout_s,
            secret=_secret(config.secret_env, config.name),
            routing_key=key,
            source=config.source,
            **options,
        )
    raise DeliveryError(f"unknown notifier configuration {config!r}")
