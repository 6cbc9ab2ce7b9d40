"""Stalled clients cannot take the receiver down: a head or a body that never completes is cut off,
connections are capped below the descriptor limit, and repeated errors are logged once a minute."""

from __future__ import annotations

import collections
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import collectors.grpc_receiver as grpc_receiver_module
import collectors.receiver as receiver_module
import collectors.receivers as receivers_module
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from storage import Store
from tests.collectors.otlp_samples import make_request
from tests.collectors.processes import start_collector


def _export(port: int, n: int = 5, seed: int = 1) -> httpx.Response:
    body = make_request(n, seed=seed)[0].SerializeToString()
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/traces",
        content=body,
        headers={"Content-Type": "application/x-protobuf"},
        timeout=10,
    )


@pytest.fixture
def fast_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(receivers_module, "HEAD_TIMEOUT_S", 0.5)
    monkeypatch.setattr(receiver_module, "BODY_IDLE_TIMEOUT_S", 0.5)


@pytest.fixture
def http_port(pipeline: IngestPipeline, fast_deadlines: None) -> Iterator[int]:
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    receivers.start()
    try:
        assert receivers.http_port is not None
        yield receivers.http_port
    finally:
        receivers.stop()


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before closing, waiting at most ``seconds``; fails if it stays open."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        return received
    except TimeoutError:
        raise AssertionError(f"the connection stayed open for {seconds} s") from None
    return received


def test_a_head_that_never_completes_is_cut_off(http_port: int) -> None:
    with socket.create_connection(("127.0.0.1", http_port)) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        started = time.monotonic()
        assert _closed_within(sock, 5.0) == b""
        assert time.monotonic() - started < 3.0
    assert _export(http_port).status_code == 200


def test_a_body_that_stops_arriving_gets_a_408(http_port: int, store: Store) -> None:
    with socket.create_connection(("127.0.0.1", http_port)) as sock:
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            b"Content-Length: 1000\r\n\r\n" + b"\x0a" * 10
        )
        answer = _closed_within(sock, 5.0)
    assert answer.startswith(b"HTTP/1.1 408")
    assert _export(http_port).status_code == 200


def test_thousands_of_stalled_connections_under_a_1024_descriptor_limit(tmp_path: Path) -> None:
    # Regression: 20,000 connections sending partial headers made a valid export and /healthz time
    # out, and the log grew 218 MB in 90 s. The collector runs as a process of its own, with the
    # descriptor limit of a default Linux shell.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2_300:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4_096), hard))

    def limit_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    proc, port, lines = start_collector("chdb://" + str(tmp_path / "store"), preexec_fn=limit_descriptors)
    try:
        stalled: list[socket.socket] = []
        try:
            for _ in range(2_000):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                    sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
                    stalled.append(sock)
                except OSError:
                    pass  # refused or reset: the receiver keeps its descriptors
            started = time.monotonic()
            health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
            export = _export(port, seed=7)
            assert health.status_code == 200 and export.status_code == 200
            assert time.monotonic() - started < 10
        finally:
            for sock in stalled:
                sock.close()
    finally:
        proc.terminate()
        proc.wait(30)
    logged = sum(len(line) for line in lines)
    common = collections.Counter(line[:160] for line in lines).most_common(5)
    assert logged < 5 * 1024 * 1024, f"{logged} bytes logged; most repeated lines: {common}"


def test_a_grpc_connection_that_never_finishes_its_preface_is_closed(
    pipeline: IngestPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grpc_receiver_module, "HANDSHAKE_TIMEOUT_S", 0.5)
    receivers = Receivers(pipeline, http=None, grpc="127.0.0.1:0")
    receivers.start()
    try:
        assert receivers.grpc_port is not None
        for payload in (b"", b"PRI * HTTP/2.0\r\n"):
            with socket.create_connection(("127.0.0.1", receivers.grpc_port)) as sock:
                sock.sendall(payload)
                started = time.monotonic()
                _closed_within(sock, 5.0)
                assert time.monotonic() - started < 3.0
    finally:
        receivers.stop()
