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
    DeliveryReport,
    NotifierConfig,
    WebhookConfig,
    deliver,
    evaluate,
    list_alerts,
    load_rules,
)
from storage import open_store, utc_now
from tailwatch.commands._common import DURATION, ISO_TIME, store_option
from tailwatch.config import DASHBOARDS_URL_ENV, WEBHOOK_SECRET_ENV, WEBHOOK_URL_ENV, resolve_dsn
from tailwatch.remote import RemoteService, store_or_service


def _notifiers(webhook: str | None) -> list[NotifierConfig]:
    if not webhook:
        return []
    # The secret is optional: set TAILWATCH_WEBHOOK_SECRET to sign the requests.
    secret_env = WEBHOOK_SECRET_ENV if os.environ.get(WEBHOOK_SECRET_ENV) else None
    return [WebhookConfig(url=webhook, secret_env=secret_env, name="webhook")]


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
@click.option(
    "--dashboard-url",
    envvar=DASHBOARDS_URL_ENV,
    metavar="URL",
    help=f"Base URL of the exported dashboards, linked from every alert [env {DASHBOARDS_URL_ENV}].",
)
def evaluate_command(
    store_dsn: str | None,
    at: datetime | None,
    rule_files: tuple[Path, ...],
    webhook: str | None,
    dashboard_url: str | None,
) -> None:
    """Evaluate the rules once, record alert state, and deliver the notifications.

    Exits 1 when a rule could not be evaluated (its alerts keep their state).
    """
    at = at or utc_now()
    rules = load_rules(list(rule_files) or None)
    notifiers = _notifiers(webhook)
    with open_store(resolve_dsn(store_dsn)) as store:
        result = evaluate(store, rules, at, notifiers=notifiers, dashboard_url=dashboard_url)
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
    """Firing, pending and recently resolved alerts with their cause."""
    cutoff = utc_now() - since
    frame = _list(store_dsn, cutoff)
    if fmt == "json":
        rows = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
            for row in frame.iter_rows(named=True)
        ]
        for row in rows:
            row["labels"] = json.loads(row["labels"] or "{}")
            row["annotations"] = json.loads(row["annotations"] or "{}")
        click.echo(json.dumps({"alerts": rows}, indent=2, ensure_ascii=False))
        return
    if frame.is_empty():
        click.echo("no firing or recent alerts")
        return
    for row in frame.iter_rows(named=True):
        target = row["operation"] or row["queue"] or row["workflow"]
        where = f"{row['service']} {target}".strip()
        started = row["starts_at"].strftime("%Y-%m-%d %H:%M") if row["starts_at"] else "-"
        click.echo(
            f"{row['state']:<9}{row['severity']:<7}{row['alertname']}  {where}  "
            f"cause={row['cause'] or 'none'}  since {started}\n         {row['summary']}"
        )


def _list(store_dsn: str | None, cutoff: datetime) -> pl.DataFrame:
    target = store_or_service(store_dsn)
    if isinstance(target, RemoteService):
        return target.list_alerts(cutoff)
    with target as store:
        return list_alerts(store, include_resolved_since=cutoff)


@alerts.command("deliver")
@store_option
@_webhook_option
def deliver_command(store_dsn: str | None, webhook: str | None) -> None:
    """Drain the outbox now: every pending notification is attempted at once, whatever its backoff.

    Exits 1 when notifications remain undelivered (listed one per line).
    """
    notifiers = _notifiers(webhook)
    with open_store(resolve_dsn(store_dsn)) as store:
        report = deliver(store, notifiers, force=True)
    click.echo(f"delivery: {report}")
    _report_undelivered(report)
    if report.undelivered:
        sys.exit(1)
