"""Links from an alert or a dashboard table to the trace in the user's own trace viewer.

A template is the viewer's URL for one trace with ``{trace_id}`` and optionally the window the
viewer should search: ``{start}``/``{end}`` (ISO 8601 UTC) or ``{start_ms}``/``{end_ms}`` (Unix
epoch milliseconds, what Grafana's and HyperDX's time pickers read). Examples, checked in
tests/slo_rules/test_trace_links.py (docs/alerting.md#trace-links)::

    http://jaeger:16686/trace/{trace_id}
    http://hyperdx:8080/search?where=TraceId%3A{trace_id}&whereLanguage=lucene&from={start_ms}&to={end_ms}
    http://signoz:8080/trace/{trace_id}

Literal braces are doubled (``{{`` ``}}``), as in :meth:`str.format`; percent-encoding them
(``%7B`` ``%7D``, as Grafana's own share links do) avoids that.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from datetime import datetime, timedelta
from urllib.parse import quote

from storage import as_utc, iso_z

__all__ = ["check_trace_url", "trace_link", "trace_links"]

_FIELDS = {"trace_id", "start", "end", "start_ms", "end_ms"}
# The window a viewer searches around a trace whose own start and end are not known here.
_AROUND = timedelta(minutes=15)


def check_trace_url(template: str) -> str:
    """``template`` if it is an http(s) URL naming only the known fields, else ``ValueError``."""
    if not template.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL template, got {template!r}")
    if any(c.isspace() for c in template):
        # Notifications list several links separated by spaces; a URL never contains one (%20).
        raise ValueError(f"trace URL template {template!r} contains whitespace; write it as %20")
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise ValueError(f"trace URL template {template!r}: {exc}") from None
    unknown = ", ".join(sorted(names - _FIELDS))
    if unknown or "trace_id" not in names:
        raise ValueError(
            f"trace URL template {template!r} must contain {{trace_id}} and may contain "
            f"{{start}}, {{end}}, {{start_ms}} and {{end_ms}}; unknown: {unknown or 'none'}"
        )
    return template


def trace_link(
    template: str | None,
    trace_id: str,
    at: datetime | None = None,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> str | None:
    """The viewer's URL of ``trace_id`` (``None`` without a template).

    The window the viewer searches is ``start``–``end`` when given (the analysed window the trace
    was picked from), else 15 minutes either side of ``at``, a time inside the trace (default: now).
    """
    if not template or not trace_id:
        return None
    middle = as_utc(at) if at is not None else datetime.now().astimezone()
    first = as_utc(start) if start is not None else middle - _AROUND
    last = as_utc(end) if end is not None else middle + _AROUND
    return template.format(
        trace_id=quote(trace_id, safe=""),
        # ":" stays as is: a browser (and plotly.js) re-encodes "%3A" to "%253A", which viewers misread.
        start=quote(iso_z(first), safe=":"),
        end=quote(iso_z(last), safe=":"),
        start_ms=int(first.timestamp() * 1000),
        end_ms=int(last.timestamp() * 1000),
    )


def trace_links(
    template: str | None, trace_ids: Iterable[str], start: datetime, end: datetime
) -> dict[str, str]:
    """The link annotations of an alert's exemplar traces, picked from the window ``start``–``end``:
    ``exemplar_url`` (the first) and ``exemplar_urls`` (all, space-separated, in the order of
    ``exemplar_trace_ids``). Empty without a template or exemplars.

    The window's end is extended by 15 minutes: a slow trace that started near the end of the
    window finishes after it, and a viewer filtering spans by start time would cut it short.
    """
    ids = [t.strip() for t in trace_ids if t.strip()]
    urls = [u for u in (trace_link(template, t, start=start, end=end + _AROUND) for t in ids) if u]
    if not urls:
        return {}
    return {"exemplar_url": urls[0], "exemplar_urls": " ".join(urls)}
