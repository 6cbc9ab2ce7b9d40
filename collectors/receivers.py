"""Both receivers in background threads: uvicorn for OTLP/HTTP, grpc for OTLP/gRPC.

``start()`` returns once both are listening (so ``http_port``/``grpc_port`` are the real ports, also
with port 0); ``stop()`` stops accepting and lets in-flight requests finish. The pipeline is the
caller's: stop it after the receivers so their last acknowledged exports are flushed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
from collections.abc import Sequence

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute

from collectors.grpc_receiver import GrpcReceiver
from collectors.pipeline import IngestPipeline
from collectors.receiver import create_http_app
from collectors.settings import DEFAULT_GRPC_ADDRESS, DEFAULT_HTTP_ADDRESS, parse_address

__all__ = ["Receivers", "is_loopback"]

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _UvicornServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:
        # The embedding process (CLI, service, tests) owns signals; uvicorn must not take them.
        pass


class Receivers:
    """OTLP/HTTP and OTLP/gRPC receivers feeding one pipeline.

    Usage::

        receivers = Receivers(pipeline, http="127.0.0.1:0", grpc="127.0.0.1:0")
        receivers.start()
        print(receivers.http_port, receivers.grpc_port)
        receivers.stop(); pipeline.stop()
    """

    def __init__(
        self,
        pipeline: IngestPipeline,
        http: str | None = DEFAULT_HTTP_ADDRESS,
        grpc: str | None = DEFAULT_GRPC_ADDRESS,
        token: str | None = None,
        extra_routes: Sequence[BaseRoute] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.http_address = parse_address(http, what="the OTLP/HTTP address") if http else None
        self.grpc_address = parse_address(grpc, what="the OTLP/gRPC address") if grpc else None
        self.token = token or None
        self.app = create_http_app(pipeline, token=self.token, extra_routes=extra_routes, registry=registry)
        self.http_port = 0
        self.grpc_port = 0
        self._server: _UvicornServer | None = None
        self._thread: threading.Thread | None = None
        self._grpc: GrpcReceiver | None = None

    def start(self, timeout_s: float = 15.0) -> None:
        for address in (self.http_address, self.grpc_address):
            if address and not is_loopback(address[0]):
                log.warning("binding %s:%d: reachable from other hosts", *address)
        try:
            if self.http_address is not None:
                self._start_http(*self.http_address, timeout_s=timeout_s)
            if self.grpc_address is not None:
                self._grpc = GrpcReceiver(self.pipeline, *self.grpc_address, token=self.token)
                self.grpc_port = self._grpc.start()
        except BaseException:
            self.stop()
            raise

    def _start_http(self, host: str, port: int, *, timeout_s: float) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(2048)
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen for OTLP/HTTP on {host}:{port}: {exc.strerror}") from None
        self.http_port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
            timeout_graceful_shutdown=10,
        )
        server = _UvicornServer(config)
        self._server = server

        def run() -> None:
            try:
                asyncio.run(server.serve(sockets=[sock]))
            except Exception:  # logged: a dead receiver thread must be visible
                log.exception("OTLP/HTTP server stopped with an error")
            finally:
                sock.close()

        self._thread = threading.Thread(target=run, name="tailwatch-otlp-http", daemon=True)
        self._thread.start()
        ready = threading.Event()

        def poll() -> None:
            while not server.started and self._thread is not None and self._thread.is_alive():
                threading.Event().wait(0.01)
            ready.set()

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        if not ready.wait(timeout_s) or not server.started:
            raise OSError(f"the OTLP/HTTP server on {host}:{self.http_port} did not start")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop accepting on both receivers; in-flight requests finish first."""
        self.pipeline.drain()
        if self._grpc is not None:
            self._grpc.stop()
            self._grpc = None
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout_s)
            self._server = None
            self._thread = None
