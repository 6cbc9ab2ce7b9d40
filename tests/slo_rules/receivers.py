"""Real HTTP receivers on 127.0.0.1 for the delivery tests: they record every request as received."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


# (status, headers, body) answered for one request; None = the default 200/202.
Responder = Callable[["Receiver", Received], tuple[int, dict[str, str], bytes] | None]


@dataclass
class Receiver:
    """A threaded HTTP server on an ephemeral loopback port. ``stop()`` then ``start()`` keeps the port.
    With ``tls`` (a server-side SSL context) it speaks https."""

    status: int = 200
    responder: Responder | None = None
    delay_s: float = 0.0
    tls: ssl.SSLContext | None = None
    requests: list[Received] = field(default_factory=list)
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                got = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                answer = receiver.responder(receiver, got) if receiver.responder else None
                status, headers, payload = answer or (receiver.status, {}, b'{"status":"success"}')
                if 200 <= status < 300 or answer is not None:
                    with receiver._lock:
                        receiver.requests.append(got)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls is not None:
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def keys(self) -> list[str]:
        with self._lock:
            return [r.headers.get("idempotency-key", "") for r in self.requests]
