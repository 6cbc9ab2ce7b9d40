"""No secret reaches a log: webhook URLs, passwords and API keys in URLs are masked whoever logs them."""

from __future__ import annotations

import logging

import httpx
import pytest

from tailwatch.logs import redact_urls, setup_logging
from tests.tailwatch.otlp_send import webhook_sink

SLACK = "https://hooks.slack.com/services/T0SECRET/B0SECRET/xoxSECRETPATH"


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_no_secret_in_logs_at_debug(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    try:
        setup_logging(fmt, "debug")  # type: ignore[arg-type]
        # httpx logs each request URL at INFO; a webhook URL with credentials and an API key.
        with webhook_sink() as sink:
            httpx.post(sink.url.replace("http://", "http://alice:pa55word@") + "?apikey=k3y", content=b"{}")
            assert len(sink.received) == 1
        # A delivery error that names the Slack webhook, with its traceback.
        try:
            raise RuntimeError(f"POST {SLACK} failed")
        except RuntimeError:
            logging.getLogger("slo_rules.outbox").exception("notifier slack failed to send to %s", SLACK)
        logging.getLogger("tailwatch.test").info("store http://default:s3cret@127.0.0.1:8123/db ok")
    finally:
        root.setLevel(saved[0])
        for h in list(root.handlers):
            if h not in saved[1]:
                root.removeHandler(h)
    err = capsys.readouterr().err
    assert "notifier slack failed" in err and "hooks.slack.com" in err
    for secret in ("pa55word", "k3y", "xoxSECRETPATH", "T0SECRET", "s3cret"):
        assert secret not in err, secret


def test_redact_urls_keeps_what_helps_and_drops_what_authenticates() -> None:
    text = "to http://u:p@127.0.0.1:9093/api/v2/alerts?token=t and https://hooks.slack.com/services/A/B/C."
    out = redact_urls(text)
    assert "127.0.0.1:9093/api/v2/alerts" in out and "hooks.slack.com" in out
    assert ":p@" not in out and "token=t" not in out and "/services/A/B/C" not in out
