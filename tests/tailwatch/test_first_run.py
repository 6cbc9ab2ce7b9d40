"""A new user's first run, end to end: `config init` → `serve` as an ordinary user → spans over
OTLP → an alert from the shipped rules → its link fetched → the page shows the alert's window, p99s
and cause, before any dashboards job, and still after an ad-hoc export of another window.

The user changes nothing in the written config; the environment moves the receivers to free
loopback ports and evaluates every few seconds, as a user could with the documented variables.
When the tests run as root, `serve` and the commands run as ``nobody`` (setpriv), with an
interpreter and packages that user can read; where none is readable by it they run as the
current user, and the test says so in a warning.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from slo_rules.annotate import fmt_ms
from storage import parse_time
from tailwatch.remote import SERVICE_FILE
from tests.tailwatch.otlp_send import export_rows
from tests.tailwatch.test_alert_links import _mentions, _unescaped
from tests.tailwatch.test_serve_e2e import _regression_now
from tests.tailwatch.test_service import _wait

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
RUN_LINK = r"/dashboards/runs/([0-9a-f]{32})/attribution\.html"


class User:
    """How the commands of the test are run: a command prefix, an interpreter, an environment."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.prefix: list[str] = []
        self.python = sys.executable
        self.ordinary = os.geteuid() != 0
        base = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")}
        self.env = {**base, "HOME": str(workdir)}
        if not self.ordinary:
            self._become_nobody()

    def _become_nobody(self) -> None:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            warnings.warn("no setpriv: the first run is tested as root", stacklevel=2)
            return
        prefix = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        path = os.pathsep.join([str(REPO), *site.getsitepackages()])
        env = {**self.env, "PYTHONPATH": path}
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        for python in (sys.executable, f"/usr/bin/python{version}"):
            probe = subprocess.run(
                [*prefix, python, "-c", "import tailwatch.cli"], env=env, capture_output=True, timeout=120
            )
            if probe.returncode == 0:
                os.chown(self.workdir, NOBODY, NOBODY)
                self.prefix, self.python, self.env, self.ordinary = prefix, python, env, True
                return
        warnings.warn(
            "no interpreter and packages readable by an unprivileged user: the first run is tested as root",
            stacklevel=2,
        )

    def argv(self, *args: str) -> list[str]:
        # -P: the working directory is not put first on the path, as with the installed `tailwatch`
        # script (the directories serve writes there, such as dashboards/, must not shadow packages).
        return [*self.prefix, self.python, "-P", "-m", "tailwatch", *args]

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=180,
            env={**self.env, **(env or {})},
            cwd=self.workdir,
        )


@pytest.fixture
def workdir() -> Iterator[Path]:
    # Not under pytest's tmp_path: an unprivileged user cannot enter root's 0700 temp tree.
    path = Path(tempfile.mkdtemp(prefix="tailwatch-first-run-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _serving(user: User, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        user.argv("serve"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**user.env, **env},
        cwd=user.workdir,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _text(page: str) -> str:
    # The figure JSON's \uXXXX escapes decoded (plotly writes the data inline), then the HTML's.
    return html.unescape(_unescaped(page))


@pytest.mark.slow
def test_first_run_from_config_init_to_the_alert_page(workdir: Path) -> None:
    user = User(workdir)
    init = user.run("config", "init")
    assert init.returncode == 0, init.stderr
    assert (workdir / "tailwatch.toml").is_file()
    checked = user.run("config", "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr

    env = {
        "TAILWATCH_OTLP_HTTP": "127.0.0.1:0",
        "TAILWATCH_OTLP_GRPC": "off",
        "TAILWATCH_SCHEDULE_EVALUATE": "3s",
    }
    with _serving(user, env) as proc:
        service_file = workdir / ".tailwatch" / "store" / SERVICE_FILE

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited early: {proc.communicate()[1]}")
            return service_file.exists()

        _wait(ready, timeout=90, what="serve to start")
        if user.ordinary and os.geteuid() == 0:
            # The store and everything serve wrote belong to the ordinary user.
            assert (workdir / ".tailwatch" / "store").stat().st_uid == NOBODY
        api = str(json.loads(service_file.read_text())["api_url"])
        rows = _regression_now()
        assert export_rows(api, rows) == len(rows)

        def firing() -> dict[str, object] | None:
            alerts = httpx.get(f"{api}/api/v1/alerts", timeout=60).json()["alerts"]
            for alert in alerts:
                if alert["alertname"] == "hot-path-p99-regression" and alert["state"] == "firing":
                    return dict(alert)
            return None

        _wait(firing, timeout=90, what="the shipped p99 rule to fire")
        alert = firing()
        assert alert is not None
        notes = alert["annotations"]
        annotations = json.loads(notes) if isinstance(notes, str) else dict(notes)  # type: ignore[arg-type]
        assert annotations["cause"] == "llm"
        link = str(annotations["dashboard"])
        matched = re.fullmatch(re.escape(api) + RUN_LINK, link)
        assert matched is not None, link
        # No dashboards job has run yet (the config's is hourly): the link is the alert's own run.
        assert not (workdir / "dashboards" / "index.html").exists()

        page = httpx.get(link, timeout=180)
        assert page.status_code == 200
        text = _text(page.text)
        assert f"analysis run {matched[1]}" in text
        fired = parse_time(str(alert["starts_at"]))
        for instant in (fired - timedelta(hours=1), fired):
            assert instant.strftime("%Y-%m-%d %H:%M") in text
        # The alert's p99s (its summary says "855 ms → 2.1 s"), shown on the page.
        before, after = float(annotations["baseline_p99_ms"]), float(annotations["current_p99_ms"])
        assert f"{fmt_ms(before)} → {fmt_ms(after)}" in str(annotations["summary"])
        assert _mentions(text, before) and _mentions(text, after), "the page lacks the alert's p99s"
        assert "cause llm" in text or "verdict llm" in text

        # An ad-hoc export of another window (through the running service) changes neither the
        # alert's page nor what the link shows.
        start = (datetime.now(UTC) - timedelta(days=2)).isoformat()
        end = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        exported = user.run("dashboard", "export", "--out", "adhoc", "--start", start, "--end", end)
        assert exported.returncode == 0, exported.stderr
        assert (workdir / "adhoc" / "index.html").is_file()
        again = httpx.get(link, timeout=180)
        assert again.status_code == 200 and again.text == page.text

        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
