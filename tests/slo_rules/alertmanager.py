"""Real Alertmanager instances on loopback for the alerting tests (Debian's prometheus-alertmanager).

Each instance gets free ports, a temporary config routing everything to a webhook receiver the test
started, its own ``--storage.path``, and either no cluster (``--cluster.listen-address=``) or
loopback cluster ports peered with the other instance of an HA pair. ``start`` returns once
``/-/ready`` answers (and, for a pair, once both instances see each other); ``stop`` terminates it.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

# Short enough that a test waits about a second for a notification; the HA pair's peer timeout is
# how long the second instance waits for the first one's notification log before sending itself.
GROUP_WAIT = "1s"
GROUP_INTERVAL = "1s"
PEER_TIMEOUT = "1s"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_yaml(
    receiver_url: str, *, resolve_timeout: str = "5m", group_by: Sequence[str] = ("alertname",)
) -> str:
    """One route, grouped by ``group_by``, to one webhook receiver that also gets resolutions."""
    return json.dumps(
        {
            "global": {"resolve_timeout": resolve_timeout},
            "route": {
                "receiver": "hook",
                "group_by": list(group_by),
                "group_wait": GROUP_WAIT,
                "group_interval": GROUP_INTERVAL,
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "hook", "webhook_configs": [{"url": receiver_url, "send_resolved": True}]}
            ],
        },
        indent=2,
    )  # JSON is YAML


@dataclass
class Alertmanager:
    """One ``prometheus-alertmanager`` process on 127.0.0.1."""

    directory: Path
    config: str
    cluster: bool = False
    peer_addresses: Sequence[str] = ()
    port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cluster_address(self) -> str:
        return f"127.0.0.1:{self.cluster_port}"

    def start(self) -> Alertmanager:
        assert BINARY is not None, "prometheus-alertmanager is not installed (make alerting-stack)"
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "alertmanager.yml"
        config.write_text(self.config)
        args = [
            BINARY,
            f"--config.file={config}",
            f"--storage.path={self.directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=debug",
        ]
        if self.cluster:
            args += [
                f"--cluster.listen-address={self.cluster_address}",
                f"--cluster.peer-timeout={PEER_TIMEOUT}",
                "--cluster.gossip-interval=50ms",
                "--cluster.pushpull-interval=1s",
                "--cluster.probe-interval=200ms",
                "--cluster.settle-timeout=0s",
                *(f"--cluster.peer={p}" for p in self.peer_addresses),
            ]
        else:
            args.append("--cluster.listen-address=")
        log = (self.directory / "alertmanager.log").open("wb")
        self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"alertmanager exited {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"alertmanager on {self.url} not ready after {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        path = self.directory / "alertmanager.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    # The API the tests check Alertmanager's view through.

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (active, silenced and inhibited ones; ``filter`` matchers optional)."""
        params = [("filter", f'{k}="{v}"') for k, v in filters.items()]
        response = httpx.get(self.url + "/api/v2/alerts", params=params, timeout=5)
        response.raise_for_status()
        body = response.json()
        assert isinstance(body, list)
        return body

    def silence(self, matchers: dict[str, str], *, duration_s: float = 3600) -> str:
        """POST /api/v2/silences with equality matchers; the new silence's id."""
        now = time.time()
        body = {
            "matchers": [
                {"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in matchers.items()
            ],
            "startsAt": _rfc3339(now - 1),
            "endsAt": _rfc3339(now + duration_s),
            "createdBy": "tailwatch tests",
            "comment": "maintenance",
        }
        response = httpx.post(self.url + "/api/v2/silences", json=body, timeout=5)
        response.raise_for_status()
        return str(response.json()["silenceID"])

    def members(self) -> int:
        """How many instances this one sees in its cluster, itself included."""
        status = httpx.get(self.url + "/api/v2/status", timeout=5).json()
        return len(status["cluster"].get("peers") or [])


def _rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"


def start_pair(directory: Path, config: str, timeout_s: float = 20.0) -> tuple[Alertmanager, Alertmanager]:
    """Two instances gossiping on loopback, returned once each lists both as cluster members."""
    first = Alertmanager(directory / "am-0", config, cluster=True)
    second = Alertmanager(directory / "am-1", config, cluster=True)
    first.peer_addresses = [second.cluster_address]
    second.peer_addresses = [first.cluster_address]
    first.start()
    try:
        second.start()
        deadline = time.monotonic() + timeout_s
        while first.members() < 2 or second.members() < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pair did not form:\n{first.log()}\n{second.log()}")
            time.sleep(0.05)
    except BaseException:
        first.stop()
        second.stop()
        raise
    return first, second
