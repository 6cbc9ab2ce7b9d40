"""Times and durations, spelled one way across every stage.

The UTC policy: every instant inside tailwatch is a timezone-aware UTC ``datetime``. A naive value
is UTC — ClickHouse returns ``DateTime64`` columns naive in UTC, and a time typed without an offset
(``--start 2026-11-02T08:00``) means UTC, as it does in ClickHouse and Prometheus.

The duration grammar (rule files, config, command options, environment variables): a number and a
unit, or several (``500ms``, ``30s``, ``5m``, ``1h30m``, ``1d``, ``2w``); a bare number is seconds.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

__all__ = [
    "DURATION_HINT",
    "MAX_DURATION",
    "as_utc",
    "format_duration",
    "iso_z",
    "parse_duration",
    "parse_time",
    "utc_now",
]

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_BARE_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")

# Longer windows or intervals are typos (and overflow date arithmetic).
MAX_DURATION = timedelta(days=3650)
DURATION_HINT = "a number and a unit, e.g. 500ms, 30s, 5m, 1h, 1d"


def utc_now() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """``value`` in UTC; a naive value is taken as UTC (the policy above)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def parse_time(text: str) -> datetime:
    """An ISO 8601 instant (``2026-11-02T08:00:00Z``, ``…+01:00``, or naive = UTC) as UTC.

    Raises ``ValueError`` naming the accepted form; callers add which option or field it was.
    """
    value = str(text).strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-02T08:00:00Z)") from None
    return as_utc(parsed)


def iso_z(value: datetime) -> str:
    """``2026-11-02T08:00:00Z``: UTC, with the ``Z`` designator (JSON, webhooks, links)."""
    return as_utc(value).isoformat().replace("+00:00", "Z")


def parse_duration(value: object) -> timedelta:
    """``"30d"``, ``"1h30m"``, ``"500ms"``, ``"2"`` or a number of seconds → :class:`timedelta`.

    Raises ``ValueError`` (pydantic and click both turn it into a message naming the field).
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: use {DURATION_HINT}")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if _BARE_NUMBER.match(text):
            seconds = float(text)
        else:
            pos, seconds = 0, 0.0
            for match in _DURATION_PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
                pos = match.end()
            if not text or pos != len(text):
                raise ValueError(f"invalid duration {value!r}: use {DURATION_HINT}")
    else:
        raise ValueError(f"invalid duration {value!r}: use {DURATION_HINT}")
    if seconds <= 0:
        raise ValueError(f"duration {value!r} must be positive")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"duration {value!r} is longer than 10 years")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta | float) -> str:
    """The shortest spelling in one unit when exact (``1h``, ``30m``, ``3d``), else milliseconds."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    for unit in ("w", "d", "h", "m", "s"):
        size = _UNIT_SECONDS[unit]
        if seconds >= size and abs(seconds / size - round(seconds / size)) < 1e-9:
            return f"{round(seconds / size)}{unit}"
    return f"{round(seconds * 1000)}ms"
