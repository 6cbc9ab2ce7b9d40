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
from storage import TailwatchError, format_duration, iso_z, utc_now
from tailwatch.commands._common import DURATION, ISO_TIME, require_traces, store_option
from tailwatch.config import (
    ALERTMANAGER_URL_ENV,
    DASHBOARDS_URL_ENV,
    TRACE_URL_ENV,
    WEBHOOK_SECRET_ENV,
    WEBHOOK_URL_ENV,
)
from tailwatch.remote import RemoteService, store_or_service


def _notifiers(webhook: str | None, alertmanagers: tuple[str, ...] = ()) -> list[NotifierConfig]:
    out: list[NotifierConfig] = []
    if webhook:
        # The secret is optional: set TAILWATCH_WEBHOOK_SECRET to sign the requests.
        secret_env = WEBHOOK_SECRET_ENV if os.environ.get(WEBHOOK_SECRET_ENV) else None
        out.append(WebhookConfig(url=webhook, secret_env=secret_env, name="webhook"))
    # Named after host:port, so `evaluate` and a later `deliver` agree on which rows are whose.
    out += [AlertmanagerConfig(url=u) for u in dict.fromkeys(alertmanagers)]
    return out


def _alertmanager_url(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """The URLs, one each: an option repeated, or the variable's comma-separated list."""
    urls = tuple(u for v in value for u in v.replace(",", " ").split())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise click.BadParameter(f"expected an http:// or https:// URL, got {url!r}", ctx, param)
    return urls


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


# An --at further ahead than this is a typo or a test, not a late evaluation: it would resolve
# real alerts (their condition is not met in an empty future window) and notify on-call of it.
MAX_FUTURE_AT = timedelta(minutes=5)


def _ahead(delta: timedelta) -> str:
    minutes = delta.total_seconds() / 60
    return f"{minutes:.0f} min" if minutes < 120 else f"{minutes / 60:.1f} h"


def _refuse_options(ctx: click.Context, service: RemoteService, does: str, params: tuple[str, ...]) -> None:
    """Options given on the command line that the running service cannot honour: one line naming them.

    A value from the environment is not refused: the service reads the same variables itself."""
    spelled = {p.name: p.opts[0] for p in ctx.command.params}
    given = [
        spelled[p] for p in params if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        service.close()
        them = "it" if len(given) == 1 else "them"
        raise TailwatchError(
            f"store {service.dsn} is owned by the running tailwatch service (pid {service.endpoint.pid}), "
            f"which {does}: {', '.join(given)} cannot apply there; run the command without "
            f"{them}, or stop the service to use {them}"
        )


def _run_evaluate_job(service: RemoteService, what: str) -> None:
    """Run the service's ``evaluate`` job now and report its outcome (exit 1 unless it ran ok)."""
    try:
        run = service.run_job("evaluate")
    finally:
        service.close()
    status = str(run.get("status", ""))
    head = (
        f"the tailwatch service (pid {service.endpoint.pid}) owns store {service.dsn}: "
        f"ran its evaluate job now (run {run.get('run_id', '?')})"
    )
    if status == "ok":
        click.echo(f"{head}: {what} with its configured rules and notifiers")
        click.echo("its alerts: `tailwatch alerts list`; its delivery counters: /metrics")
        return
    click.echo(f"{head}: {status or 'unknown'}: {run.get('error') or 'no reason given'}", err=True)
    sys.exit(1)


# How to give `alerts evaluate|deliver` a notifier of each kind; the others only `serve` has.
_CONFIGURE = {
    "webhook": f"pass --webhook URL (or set {WEBHOOK_URL_ENV})",
    "alertmanager": f"pass --alertmanager URL (or set {ALERTMANAGER_URL_ENV})",
}


def _report_undelivered(report: DeliveryReport) -> None:
    for error in report.errors:
        click.echo(f"error    {error}", err=True)
    for name, kind in report.unconfigured_notifiers.items():
        waiting = sum(1 for row in report.undelivered if row.notifier == name)
        how = _CONFIGURE.get(
            kind,
            f"it is a [[notify.{kind}]] notifier of the service's configuration, which "
            "`tailwatch serve` delivers",
        )
        if kind == "alertmanager" and name.startswith("alertmanager@"):
            how = f"pass --alertmanager http://{name.removeprefix('alertmanager@')} (the instance it names)"
        click.echo(
            f"no {kind} notifier named {name!r} is configured for {waiting} pending "
            f"notification{'s' if waiting != 1 else ''}: {how}; they stay queued until then"
        )
    for row in report.undelivered:
        click.echo(f"undelivered  {row.notifier}  {row.id}  {report.reason(row)}")


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
@click.option(
    "--force",
    is_flag=True,
    help=f"Evaluate at an --at more than {format_duration(MAX_FUTURE_AT)} in the future (it resolves "
    "every alert whose condition is not met then, and notifies the resolutions).",
)
@click.pass_context
def evaluate_command(
    ctx: click.Context,
    store_dsn: str | None,
    at: datetime | None,
    rule_files: tuple[Path, ...],
    webhook: str | None,
    alertmanagers: tuple[str, ...],
    dashboard_url: str | None,
    trace_url: str | None,
    interval: timedelta,
    force: bool,
) -> None:
    """Evaluate the rules once, record alert state, and deliver the notifications.

    While `tailwatch serve` owns the store, this runs the service's own evaluate job now instead:
    with its configured rules and notifiers, at its own clock.

    Exits 1 when a rule could not be evaluated (its alerts keep their state).
    """
    now = utc_now()
    if at is not None and at - now > MAX_FUTURE_AT and not force:
        raise TailwatchError(
            f"--at {iso_z(at)} is {_ahead(at - now)} in the future: evaluating then would "
            "resolve every alert whose condition is not met at that time and notify the "
            "resolutions; pass --force to do it anyway"
        )
    at = at or now
    target = store_or_service(store_dsn, create=True)
    if isinstance(target, RemoteService):
        _refuse_options(
            ctx,
            target,
            "evaluates at its own time with the rules, notifiers and links of its configuration",
            ("at", "rule_files", "webhook", "alertmanagers", "dashboard_url", "trace_url", "interval"),
        )
        _run_evaluate_job(target, "evaluated the rules and delivered the notifications")
        return
    with target as store:
        rules = load_rules(list(rule_files) or None)
        notifiers = _notifiers(webhook, alertmanagers)
        # After the rules and notifiers, so a mistake there is named first. A store without spans
        # at all is left to the rules (each reports it cannot run, exit status 1); a span table
        # lacking columns would fail every rule with a SQL error: one clear error instead.
        require_traces(store, allow_missing=True)
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
@click.pass_context
def deliver_command(
    ctx: click.Context, store_dsn: str | None, webhook: str | None, alertmanagers: tuple[str, ...]
) -> None:
    """Drain the outbox now: every pending notification is attempted at once, whatever its backoff.

    While `tailwatch serve` owns the store, this runs the service's evaluate job now instead,
    which delivers the outbox to the notifiers of its configuration.

    Exits 1 when notifications remain undelivered (listed one per line).
    """
    target = store_or_service(store_dsn, create=True)
    if isinstance(target, RemoteService):
        _refuse_options(
            ctx, target, "delivers to the notifiers of its configuration", ("webhook", "alertmanagers")
        )
        _run_evaluate_job(target, "delivered the outbox (after evaluating the rules)")
        return
    with target as store:
        notifiers = _notifiers(webhook, alertmanagers)
        report = deliver(store, notifiers, force=True)
    click.echo(f"delivery: {report}")
    _report_undelivered(report)
    if report.undelivered:
        sys.exit(1)
