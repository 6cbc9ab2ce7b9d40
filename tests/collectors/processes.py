"""A ``tailwatch collect`` process for the tests that need the receiver in a process of its own
(``kill -9``, descriptor limits, its own memory)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["start_collector"]

_LISTEN = re.compile(r"otlp/http listening on 127\.0\.0\.1:(\d+)")


def start_collector(
    dsn: str, *extra: str, preexec_fn: Callable[[], None] | None = None
) -> tuple[subprocess.Popen[str], int, list[str]]:
    """Start ``tailwatch collect`` on a free loopback port (no gRPC); returns the process, its
    OTLP/HTTP port and its stderr lines, which keep being collected while it runs."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailwatch",
            "collect",
            "--store",
            dsn,
            "--otlp-http",
            "127.0.0.1:0",
            "--otlp-grpc",
            "off",
            *extra,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=preexec_fn,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        match = _LISTEN.search(line)
        if match:
            # Keep draining stderr so the child never blocks on a full pipe.
            threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
            return proc, int(match.group(1)), lines
    proc.kill()
    raise AssertionError("collector did not start: " + "".join(lines))
