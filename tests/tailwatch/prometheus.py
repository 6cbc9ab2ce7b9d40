"""A real Prometheus for the tests: Debian's ``prometheus`` on a free loopback port.

``make test`` installs it (target ``alerting-stack``); the package's own service is not used. Each
instance gets a temporary config, its TSDB under the test's ``tmp_path`` and its log beside it::

    with running_prometheus(tmp_path, ["127.0.0.1:4318"], bearer_token_file=token_file) as prom:
        [sample] = prom.wait_for('tailwatch_hot_path_latency_seconds{quantile="0.99"}')
        float(sample["value"][1])
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

Sample = dict[str, Any]  # {"metric": {label: value}, "value": [unix_time, "text value"]}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def query(self, expr: str) -> list[Sample]:
        """The instant vector of ``expr`` (``/api/v1/query``)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert body.get("status") == "success", body
        assert body["data"]["resultType"] == "vector", body
        result: list[Sample] = body["data"]["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error."""
        active: list[dict[str, Any]] = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"][
            "activeTargets"
        ]
        return active

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[Sample]], bool] = bool,
        timeout: float = 20.0,
    ) -> list[Sample]:
        """Query ``expr`` until ``predicate`` holds for its result (by default: not empty)."""
        deadline = time.monotonic() + timeout
        result: list[Sample] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.2)
        raise AssertionError(
            f"Prometheus: {expr} did not reach the expected result within {timeout}s; last {result}; "
            f"targets {[(t['scrapeUrl'], t['health'], t['lastError']) for t in self.targets()]}"
        )


def _config(targets: Sequence[str], scrape_interval: str, bearer_token_file: Path | None) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {scrape_interval}",
        f"  scrape_timeout: {scrape_interval}",
        "scrape_configs:",
        "  - job_name: tailwatch",
        "    metrics_path: /metrics",
        "    static_configs:",
        f"      - targets: [{', '.join(repr(t) for t in targets)}]",
    ]
    if bearer_token_file is not None:
        lines += [
            "    authorization:",
            "      type: Bearer",
            f"      credentials_file: {bearer_token_file}",
        ]
    return "\n".join(lines) + "\n"


@contextmanager
def running_prometheus(
    tmp_path: Path,
    targets: Sequence[str],
    *,
    bearer_token_file: Path | None = None,
    scrape_interval: str = "1s",
    timeout: float = 30.0,
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (``host:port``) until the block ends; ready when yielded."""
    if not Path(PROMETHEUS).is_file():
        pytest.fail(f"{PROMETHEUS} not found: install Debian's prometheus (`make alerting-stack`)")
    home = tmp_path / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    config.write_text(_config(targets, scrape_interval, bearer_token_file))
    log_path = home / "prometheus.log"
    prometheus = _start(home, config, log_path, timeout)
    try:
        yield prometheus
    finally:
        _stop(prometheus.process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _start(home: Path, config: Path, log_path: Path, timeout: float) -> Prometheus:
    # The free port can be taken between the probe and Prometheus's bind: then another one.
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={home / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=home,
            )
        prometheus = Prometheus(url, process, log_path)
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None:
                try:
                    if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                        return prometheus
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"prometheus not ready within {timeout}s: {prometheus.log()}")
                time.sleep(0.1)
        except BaseException:
            _stop(process)
            raise
        if "address already in use" not in prometheus.log() or attempt == 2:
            break
    raise AssertionError(f"prometheus exited with {process.returncode}: {prometheus.log()}")
