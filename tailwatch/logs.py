"""Logging for the long-running commands: plain lines for people, JSON lines for log pipelines."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

from tailwatch.config import LogFormat, mask_url

__all__ = ["JsonFormatter", "RedactingFormatter", "redact_urls", "setup_logging"]

_URL = re.compile(r"""\bhttps?://[^\s'"<>\\]+""")


def redact_urls(text: str) -> str:
    """Every URL in ``text`` masked (:func:`tailwatch.config.mask_url`): a webhook URL, a
    ``user:password@`` store or an ``?apikey=`` never reaches a log, whoever logged it."""
    return _URL.sub(lambda m: mask_url(m.group(0)), text)


# Attributes every LogRecord has; anything else was passed through ``extra=`` and is kept in JSON.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RedactingFormatter(logging.Formatter):
    """The plain line format, URLs masked (messages of other libraries and tracebacks too)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_urls(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the ``extra`` fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                body[key] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return redact_urls(json.dumps(body, ensure_ascii=False))


def setup_logging(fmt: LogFormat = "plain", level: str = "info") -> None:
    """Configure the root logger on stderr (idempotent: replaces handlers set here before)."""
    if fmt not in ("plain", "json"):
        raise ValueError(f"log format must be one of plain, json; got {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else RedactingFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_tailwatch", False)]:
        root.removeHandler(old)
    handler._tailwatch = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    # APScheduler logs every run at INFO; our own job log lines say more, once.
    logging.getLogger("apscheduler").setLevel(max(logging.WARNING, root.level))
    # httpx logs every request's full URL at INFO: for a Slack webhook the URL is the secret. The
    # formatter masks URLs anyway; the request lines say nothing our delivery log does not.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
