"""Both receivers in background threads: uvicorn for OTLP/HTTP, grpc for OTLP/gRPC.

``start()`` returns once both are listening (so ``http_port``/``grpc_port`` are the real ports, also
with port 0); ``stop()`` stops accepting and lets in-flight requests finish. The pipeline is the
caller's: stop it after the receivers so their last acknowledged exports are flushed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.routing import BaseRoute
from uvicorn.protocols.http.h11_impl import H11Protocol

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


# Connection hygiene (uvicorn has neither a limit on open connections nor a deadline for a request
# head): a client that connects and sends nothing, or a header a byte at a time, would hold a file
# descriptor forever, and 20,000 of them made valid exports and /healthz time out.
HEAD_TIMEOUT_S = 10.0  # a request head must arrive whole this long after the connection or the last response
MAX_CONNECTIONS = 512  # open connections; more are closed at once (below a 1,024 descriptor limit)


class _GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a connection cap and a deadline for each request head."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= MAX_CONNECTIONS:
            # Make room by dropping the connection that has waited longest for its head: a
            # client that sends its request at once is served even while a flood of stalled
            # connections holds every slot.
            waiting = [c for c in self.connections if isinstance(c, _GuardedH11Protocol) and c._head_timer]
            if not waiting:
                _flood_log.warning(
                    "OTLP/HTTP: %d requests in progress; refusing new connections", MAX_CONNECTIONS
                )
                transport.abort()
                return
            _flood_log.warning(
                "OTLP/HTTP: %d connections open; dropping the ones stalled longest", MAX_CONNECTIONS
            )
            oldest = min(waiting, key=lambda c: c._head_since)
            oldest._cancel_head_timer()
            oldest.transport.abort()
            self.connections.discard(oldest)
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_since = time.monotonic()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # Only a connection still waiting for a head: a request being served is the app's business.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.abort()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a whole head arrived: a request started
            self._cancel_head_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self.transport is not None:
            super().connection_lost(exc)


_VARYING = re.compile(r"0x[0-9a-fA-F]+|\d+")


class _RepeatFilter(logging.Filter):
    """Lets one record a minute through for each message of the loggers a flood of connections makes
    repeat (asyncio's "socket.accept() out of system resource", logged per attempt while descriptors
    run out; uvicorn's; the connection cap's own warnings)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # Keyed on the message without its numbers and addresses: asyncio's "Exception in callback
        # BaseSelectorEventLoop._start_serving(<function … at 0x7f…>, …)" differs only in those, and
        # every accept that ran out of descriptors schedules one (thousands at a shutdown).
        key = f"{record.name}:{_VARYING.sub('#', str(record.msg))[:200]}"
        now = time.monotonic()
        if now - self._seen.get(key, -1e9) < 60.0:
            return False
        self._seen[key] = now
        return True


_REPEAT_FILTER = _RepeatFilter()
# The connection cap's warnings go through their own logger, rate-limited like the libraries'.
_flood_log = logging.getLogger(f"{__name__}.connections")
for _name in ("asyncio", "uvicorn.error", _flood_log.name):
    if _REPEAT_FILTER not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_REPEAT_FILTER)


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
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.http_address = parse_address(http, what="the OTLP/HTTP address") if http else None
        self.grpc_address = parse_address(grpc, what="the OTLP/gRPC address") if grpc else None
        self.token = token or None
        self.app = create_http_app(
            pipeline, token=self.token, extra_routes=extra_routes, registry=registry, ready=ready
        )
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
            http=_GuardedH11Protocol,
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
