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
    DEFAULT_DASHBOARD_URL,
    AlertmanagerConfig,
    AlertState,
    DeliveryReport,
    EvaluationResult,
    NotifierConfig,
    NotifierStatus,
    WebhookConfig,
    check_trace_url,
    deliver,
    delivery_status,
    evaluate,
    last_evaluation,
    list_alerts,
    load_rules,
)
from storage import TailwatchError, format_duration, iso_z, utc_now
from tailwatch.commands._common import (
    DURATION,
    ISO_TIME,
    command_config,
    format_option,
    refresh_summaries,
    require_traces,
    store_config_options,
)
from tailwatch.config import (
    ALERTMANAGER_URL_ENV,
    CONFIG_ENV,
    DASHBOARDS_URL_ENV,
    TRACE_URL_ENV,
    WEBHOOK_SECRET_ENV,
    WEBHOOK_URL_ENV,
    TailwatchConfig,
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
            f"name it in a [[notify.{kind}]] entry of the configuration this command reads "
            f"(--config, ${CONFIG_ENV} or ./tailwatch.toml)",
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
@store_config_options
@click.option("--at", "at", type=ISO_TIME, default=None, help="Evaluation time [default: now].")
@click.option(
    "--rules",
    "rule_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Rule file (repeatable) [default: rules.files of the config, else the shipped pack].",
)
@_webhook_option
@_alertmanager_option
@click.option(
    "--dashboard-url",
    envvar=DASHBOARDS_URL_ENV,
    metavar="URL",
    help=f"Base URL of the dashboards, linked from every alert [env {DASHBOARDS_URL_ENV}; default "
    f"dashboards.public_url of the config, else {DEFAULT_DASHBOARD_URL}].",
)
@click.option(
    "--trace-url",
    envvar=TRACE_URL_ENV,
    metavar="TEMPLATE",
    callback=_trace_url,
    help="Your trace viewer's URL of one trace, with {trace_id} (and optionally {start}, {end}, "
    "{start_ms}, {end_ms}): alerts link their exemplar traces there "
    f"[env {TRACE_URL_ENV}; default links.trace_url of the config].",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what would fire, resolve and be sent; write, persist and send nothing.",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Per rule and alert: fired, firing, pending, quiet, skipped or error, with the reason in numbers.",
)
@format_option()
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
    "every alert whose condition is not met then, and notifies the resolutions), or before the last "
    "evaluation (it rewinds live alert state and notifies again).",
)
@click.pass_context
def evaluate_command(
    ctx: click.Context,
    store_dsn: str | None,
    config_path: Path | None,
    at: datetime | None,
    rule_files: tuple[Path, ...],
    webhook: str | None,
    alertmanagers: tuple[str, ...],
    dashboard_url: str | None,
    trace_url: str | None,
    dry_run: bool,
    explain: bool,
    output_format: str,
    interval: timedelta,
    force: bool,
) -> None:
    """Evaluate the rules once, record alert state, and deliver the notifications.

    The store, rule files, notifiers, links and span conventions come from the configuration
    (--config, TAILWATCH_CONFIG or ./tailwatch.toml), as `tailwatch serve` reads them; options
    given here come first.

    While `tailwatch serve` owns the store, this runs the service's own evaluate job now instead:
    with its configured rules and notifiers, at its own clock.

    Exits 1 when a rule could not be evaluated (its alerts keep their state), 2 on a usage or
    configuration error.
    """
    now = utc_now()
    if at is not None and at - now > MAX_FUTURE_AT and not force and not dry_run:
        raise TailwatchError(
            f"--at {iso_z(at)} is {_ahead(at - now)} in the future: evaluating then would "
            "resolve every alert whose condition is not met at that time and notify the "
            "resolutions; pass --dry-run to see what it would do, or --force to do it anyway"
        )
    config = command_config(store_dsn, config_path)
    target = store_or_service(config.store, create=True)
    if isinstance(target, RemoteService):
        _refuse_options(
            ctx,
            target,
            "evaluates at its own time with the rules, notifiers and links of its configuration",
            (
                "at",
                "rule_files",
                "webhook",
                "alertmanagers",
                "dashboard_url",
                "trace_url",
                "interval",
                "dry_run",
                "explain",
            ),
        )
        _run_evaluate_job(target, "evaluated the rules and delivered the notifications")
        return
    with target as store:
        rules = load_rules(list(rule_files) or list(config.rules.files) or None)
        notifiers = _configured_notifiers(config, webhook, alertmanagers)
        # After the rules and notifiers, so a mistake there is named first. A store without spans
        # at all is left to the rules (each reports it cannot run, exit status 1); a span table
        # lacking columns would fail every rule with a SQL error: one clear error instead.
        layout = require_traces(store, allow_missing=True)
        last = last_evaluation(store)
        if at is not None and last is not None and at < last and not force and not dry_run:
            raise TailwatchError(
                f"--at {iso_z(at)} is before the last evaluation of this store ({iso_z(last)}): "
                "evaluating then would rewind live alert state and notify again; pass --dry-run "
                "to see what it would do, or --force to do it anyway"
            )
        at = at or now
        if layout.exists and not dry_run:
            refresh_summaries(store, config)
        result = evaluate(
            store,
            rules,
            at,
            notifiers=notifiers,
            dashboard_url=dashboard_url or config.dashboards.public_url,
            trace_url=trace_url or config.links.trace_url,
            conventions=config.analysis.conventions_object(),
            evaluation_interval=interval,
            dry_run=dry_run,
        )
        report = deliver(store, notifiers) if notifiers and not dry_run else None
    if output_format == "json":
        click.echo(json.dumps(_evaluation_json(result, len(rules), report), indent=2, ensure_ascii=False))
    else:
        _print_evaluation(result, len(rules), explain, report)
    if result.errors:
        # Undelivered notifications are retried later; a rule that could not run needs a person.
        sys.exit(1)


def _configured_notifiers(
    config: TailwatchConfig, webhook: str | None, alertmanagers: tuple[str, ...]
) -> list[NotifierConfig]:
    """The notifiers of the options (or their variables), then every ``[[notify.*]]`` entry of the
    configuration not already among them."""
    out = _notifiers(webhook, alertmanagers)
    names = {n.name for n in out}
    # TAILWATCH_WEBHOOK_URL reaches the configuration as "env-webhook" and the option as "webhook".
    out += [n for n in config.notifiers() if n.name not in names and n.name != "env-webhook"]
    return out


def _print_evaluation(
    result: EvaluationResult, rules: int, explain: bool, report: DeliveryReport | None
) -> None:
    fire, resolve = ("WOULD FIRE     ", "WOULD RESOLVE  ") if result.dry_run else ("FIRING   ", "RESOLVED ")
    for error in result.errors:
        click.echo(f"error    {error}", err=True)
    for state in result.fired:
        click.echo(
            f"{fire}{state.alertname}  [{state.severity}]  cause={state.cause}  "
            f"{state.annotations.get('summary', '')}"
        )
    for state in result.resolved:
        now = state.annotations.get("resolved")
        click.echo(
            f"{resolve}{state.alertname}  {state.annotations.get('summary', '')}"
            + (f"; now {now}" if now else "")
        )
    if result.dry_run and result.notifications and not result.would_send:
        click.echo("no notifier is configured: nothing would be sent")
    elif result.dry_run:
        for n in result.notifications:
            names = ", ".join(a.labels.get("alertname", "") for a in n.alerts)
            click.echo(f"WOULD SEND     {n.status} notification: {names}")
    if explain:
        for line in result.explanations:
            click.echo(f"  {line}")
    click.echo(f"evaluated {rules} rules at {iso_z(result.at)}: {result}")
    if report is not None:
        click.echo(f"delivery: {report}")
        _report_undelivered(report)


def _evaluation_json(result: EvaluationResult, rules: int, report: DeliveryReport | None) -> dict[str, Any]:
    def alert(state: AlertState) -> dict[str, Any]:
        return {
            "alertname": state.alertname,
            "fingerprint": state.fingerprint,
            "severity": state.severity,
            "labels": dict(state.labels),
            "annotations": dict(state.annotations),
        }

    return {
        "at": iso_z(result.at),
        "dry_run": result.dry_run,
        "rules": rules,
        "fired": [alert(s) for s in result.fired],
        "resolved": [alert(s) for s in result.resolved],
        "firing": [alert(s) for s in result.firing],
        "notifications": result.would_send if result.dry_run else result.enqueued,
        "explanations": [e.to_dict() for e in result.explanations],
        "errors": result.errors,
        "delivery": None if report is None else str(report),
    }


@alerts.command("list")
@store_config_options
@click.option(
    "--since",
    default="24h",
    show_default=True,
    type=DURATION,
    help="Also show alerts resolved within this long (e.g. 1h, 7d).",
)
@format_option()
def list_command(
    store_dsn: str | None, config_path: Path | None, since: timedelta, output_format: str
) -> None:
    """Firing, pending and recently resolved alerts with their cause, then one line per notifier
    on the delivery of what the alerts notified within ``--since`` (failures and their last error)."""
    cutoff = utc_now() - since
    frame, delivery = _list(command_config(store_dsn, config_path).store, cutoff)
    if output_format == "json":
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
@store_config_options
@_webhook_option
@_alertmanager_option
@click.pass_context
def deliver_command(
    ctx: click.Context,
    store_dsn: str | None,
    config_path: Path | None,
    webhook: str | None,
    alertmanagers: tuple[str, ...],
) -> None:
    """Drain the outbox now: every pending notification is attempted at once, whatever its backoff.

    While `tailwatch serve` owns the store, this runs the service's evaluate job now instead,
    which delivers the outbox to the notifiers of its configuration.

    Exits 1 when notifications remain undelivered (listed one per line).
    """
    config = command_config(store_dsn, config_path)
    target = store_or_service(config.store, create=True)
    if isinstance(target, RemoteService):
        _refuse_options(
            ctx, target, "delivers to the notifiers of its configuration", ("webhook", "alertmanagers")
        )
        _run_evaluate_job(target, "delivered the outbox (after evaluating the rules)")
        return
    with target as store:
        notifiers = _configured_notifiers(config, webhook, alertmanagers)
        report = deliver(store, notifiers, force=True)
    click.echo(f"delivery: {report}")
    _report_undelivered(report)
    if report.undelivered:
        sys.exit(1)
