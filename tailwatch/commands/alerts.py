"""``tailwatch alerts evaluate|list|deliver``: run the rules once, show alerts, drain the outbox."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click
import polars as pl

from slo_rules import (
    AlertmanagerConfig,
    DeliveryReport,
    NotifierConfig,
    NotifierStatus,
    WebhookConfig,
    check_trace_url,
    deliver,
    delivery_status,
    evaluate,
    list_alerts,
    load_rules,
)
from storage import open_store, utc_now
from tailwatch.commands._common import DURATION, ISO_TIME, store_option
from tailwatch.config import (
    ALERTMANAGER_URL_ENV,
    DASHBOARDS_URL_ENV,
    TRACE_URL_ENV,
    WEBHOOK_SECRET_ENV,
    WEBHOOK_URL_ENV,
    resolve_dsn,
)
from tailwatch.remote import RemoteService, store_or_service


def _notifiers(webhook: str | None, alertmanagers: tuple[str, ...] = ()) -> list[NotifierConfig]:
    out: list[NotifierConfig] = []
    if webhook:
        # The secret is optional: set TAILWATCH_WEBHOOK_SECRET to sign the requests.
        secret_env = WEBHOOK_SECRET_ENV if os.environ.get(WEBHOOK_SECRET_ENV) else None
        out.append(WebhookConfig(url=webhook, secret_env=secret_env, name="webhook"))
    # Named after host:port, so `evaluate` and a later `deliver` agree on which rows are whose.
    urls = [u for value in alertmanagers for u in value.replace(",", " ").split()]
    out += [AlertmanagerConfig(url=u) for u in dict.fromkeys(urls)]
    return out


def _alertmanager_url(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for url in (u for v in value for u in v.replace(",", " ").split()):
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"expected an http:// or https:// URL, got {url!r}", ctx, param)
    return value


def _alertmanager_option(func: Any) -> Any:
    return click.option(
        "--alertmanager",
        "alertmanagers",
        metavar="URL",
        multiple=True,
        envvar=ALERTMANAGER_URL_ENV,
        callback=_alertmanager_url,
        help="Alertmanager base URL, e.g. http://127.0.0.1:9093 (repeatable: each instance of an HA "
        f"pair) [env {ALERTMANAGER_URL_ENV}, comma-separated].",
    )(func)


def _trace_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_trace_url(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _webhook_option(func: Any) -> Any:
    return click.option(
        "--webhook",
        metavar="URL",
        envvar=WEBHOOK_URL_ENV,
        default=None,
        help=f"Alertmanager-format webhook receiver [env {WEBHOOK_URL_ENV}; "
        f"signed with ${WEBHOOK_SECRET_ENV} if set].",
    )(func)


def _report_undelivered(report: DeliveryReport) -> None:
    for error in report.errors:
        click.echo(f"error    {error}", err=True)
    for row in report.undelivered:
        when = row.next_attempt_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        state = "dead" if row.status == "dead" else f"retry at {when}"
        click.echo(
            f"undelivered  {row.notifier}  {row.id}  attempts={row.attempts}  {state}  "
            f"{row.last_error}".rstrip()
        )


@click.group()
def alerts() -> None:
    """Evaluate alert rules, list alerts, deliver notifications."""


@alerts.command("evaluate")
@store_option
@click.option("--at", "at", type=ISO_TIME, default=None, help="Evaluation time [default: now].")
@click.option(
    "--rules",
    "rule_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Rule file (repeatable) [default: the shipped pack].",
)
@_webhook_option
@_alertmanager_option
@click.option(
    "--dashboard-url",
    envvar=DASHBOARDS_URL_ENV,
    metavar="URL",
    help=f"Base URL of the exported dashboards, linked from every alert [env {DASHBOARDS_URL_ENV}].",
)
@click.option(
    "--trace-url",
    envvar=TRACE_URL_ENV,
    metavar="TEMPLATE",
    callback=_trace_url,
    help="Your trace viewer's URL of one trace, with {trace_id} (and optionally {start}, {end}, "
    "{start_ms}, {end_ms}): alerts link their exemplar traces there "
    f"[env {TRACE_URL_ENV}].",
)
@click.option(
    "--interval",
    type=DURATION,
    default="60s",
    show_default=True,
    help="How often this command runs: Alertmanager keeps a firing alert for 4 intervals "
    "after each evaluation that sends it.",
)
def evaluate_command(
    store_dsn: str | None,
    at: datetime | None,
    rule_files: tuple[Path, ...],
    webhook: str | None,
    alertmanagers: tuple[str, ...],
    dashboard_url: str | None,
    trace_url: str | None,
    interval: timedelta,
) -> None:
    """Evaluate the rules once, record alert state, and deliver the notifications.

    Exits 1 when a rule could not be evaluated (its alerts keep their state).
    """
    if interval <= timedelta(0):
        raise click.BadParameter("must be positive", param_hint="--interval")
    at = at or utc_now()
    rules = load_rules(list(rule_files) or None)
    notifiers = _notifiers(webhook, alertmanagers)
    with open_store(resolve_dsn(store_dsn)) as store:
        result = evaluate(
            store,
            rules,
            at,
            notifiers=notifiers,
            dashboard_url=dashboard_url,
            trace_url=trace_url,
            evaluation_interval=interval,
        )
        report = deliver(store, notifiers) if notifiers else None
    for error in result.errors:
        click.echo(f"error    {error}", err=True)
    for state in result.fired:
        click.echo(
            f"FIRING   {state.alertname}  [{state.severity}]  cause={state.cause}  "
            f"{state.annotations.get('summary', '')}"
        )
    for state in result.resolved:
        click.echo(f"RESOLVED {state.alertname}  {state.annotations.get('summary', '')}")
    click.echo(f"evaluated {len(rules)} rules at {at.isoformat()}: {result}")
    if report is not None:
        click.echo(f"delivery: {report}")
        _report_undelivered(report)
    if result.errors:
        # Undelivered notifications are retried later; a rule that could not run needs a person.
        sys.exit(1)


@alerts.command("list")
@store_option
@click.option(
    "--since",
    default="24h",
    show_default=True,
    type=DURATION,
    help="Also show alerts resolved within this long (e.g. 1h, 7d).",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def list_command(store_dsn: str | None, since: timedelta, fmt: str) -> None:
    """Firing, pending and recently resolved alerts with their cause, then one line per notifier
    on the delivery of what the alerts notified within ``--since`` (failures and their last error)."""
    cutoff = utc_now() - since
    frame, delivery = _list(store_dsn, cutoff)
    if fmt == "json":
        rows = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
            for row in frame.iter_rows(named=True)
        ]
        for row in rows:
            row["labels"] = json.loads(row["labels"] or "{}")
            row["annotations"] = json.loads(row["annotations"] or "{}")
        body: dict[str, Any] = {"alerts": rows}
        if delivery is not None:
            body["delivery"] = [
                {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in vars(d).items()}
                for d in delivery
            ]
        click.echo(json.dumps(body, indent=2, ensure_ascii=False))
        return
    if frame.is_empty():
        click.echo("no firing or recent alerts")
    for row in frame.iter_rows(named=True):
        target = row["operation"] or row["queue"] or row["workflow"]
        where = f"{row['service']} {target}".strip()
        started = row["starts_at"].strftime("%Y-%m-%d %H:%M") if row["starts_at"] else "-"
        click.echo(
            f"{row['state']:<9}{row['severity']:<7}{row['alertname']}  {where}  "
            f"cause={row['cause'] or 'none'}  since {started}\n         {row['summary']}"
        )
    for d in delivery or []:
        click.echo(f"delivery {d.notifier}  {d}")


def _list(store_dsn: str | None, cutoff: datetime) -> tuple[pl.DataFrame, list[NotifierStatus] | None]:
    """The alerts, and the delivery status per notifier (``None`` through the service's API,
    which serves the alerts only; the service's ``/metrics`` has the delivery counters)."""
    target = store_or_service(store_dsn)
    if isinstance(target, RemoteService):
        return target.list_alerts(cutoff), None
    with target as store:
        return list_alerts(store, include_resolved_since=cutoff), delivery_status(store, cutoff)


@alerts.command("deliver")
@store_option
@_webhook_option
@_alertmanager_option
def deliver_command(store_dsn: str | None, webhook: str | None, alertmanagers: tuple[str, ...]) -> None:
    """Drain the outbox now: every pending notification is attempted at once, whatever its backoff.

    Exits 1 when notifications remain undelivered (listed one per line).
    """
    notifiers = _notifiers(webhook, alertmanagers)
    with open_store(resolve_dsn(store_dsn)) as store:
        report = deliver(store, notifiers, force=True)
    click.echo(f"delivery: {report}")
    _report_undelivered(report)
    if report.undelivered:
        sys.exit(1)
