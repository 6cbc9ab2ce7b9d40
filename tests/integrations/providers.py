"""Mock model providers: real HTTP servers on 127.0.0.1 speaking the OpenAI and Anthropic APIs.

The SDKs (``openai``, ``anthropic``) talk to them exactly as to the real services — same paths, same
JSON, same error shapes, same retry headers — so their instrumentations emit production spans::

    script = {"gpt-4o-mini": ModelScript(latency_s=0.02, plan=FailurePlan(rules=(Every(5),)))}
    with MockProviders(script) as providers:
        client = openai.OpenAI(base_url=providers.openai_base_url, api_key="test")
        ...
        providers.set_latency("gpt-4o-mini", 0.3)  # a provider slowdown, at runtime

Endpoints: ``POST /v1/chat/completions`` and ``POST /v1/embeddings`` (OpenAI), ``POST /v1/messages``
(Anthropic), ``POST /_mock/models/{model}`` (change a model's script from another process, JSON of
:meth:`ModelScript.to_dict` keys) and ``GET /_mock/stats``.

**Failures are decided per logical call, not per HTTP request.** Both SDKs send
``x-stainless-retry-count`` (0 on the first attempt, 1, 2 … on their own retries) and resend the
same body. On a first attempt the model's call counter advances and the :class:`FailurePlan` picks
the statuses of that call's attempts (e.g. ``(429,)``: the first attempt is throttled, the SDK's
retry succeeds; ``(500, 500, 500)``: every attempt of an SDK with ``max_retries=2`` fails); later
attempts (same body, retry count > 0) are answered from that list, 200 past its end. Every failure
carries ``retry-after-ms`` / ``retry-after`` (default 0.05 s) so the SDKs' backoff is short.

Token counts are a pure function of the request: prompt tokens = Σ over messages of (words + 4) + 3;
completion tokens = 5 + prompt tokens × 7 mod 23, capped by ``max_tokens``; cached input tokens =
⌊prompt tokens × ``cached_input_share``⌋ (OpenAI counts them inside ``prompt_tokens`` and reports
them in ``prompt_tokens_details.cached_tokens``; Anthropic's ``input_tokens`` leaves them out and
reports them in ``cache_read_input_tokens``, as the real APIs do).

**Generation.** An answer of ``c`` completion tokens is generated after the attempt's ``latency_s``:
its first token ``first_token_s`` (× a lognormal(0, ``first_token_sigma``) quantile, spread evenly
over the model's calls) later, each further token ``token_s`` after the previous one. A non-streamed
answer is sent whole once generated; a streamed one (``"stream": true``) as server-sent events, one
per token as it is generated:

* OpenAI ``chat.completion.chunk`` objects — a chunk with the assistant role and no content, then
  the first token's (the real API sends its role chunk as generation starts), one per further token, one
  with ``finish_reason``; with ``stream_options.include_usage`` every chunk has ``"usage": null``
  and a last chunk with no choices carries the usage; then ``data: [DONE]``.
* Anthropic events — ``message_start`` (usage: input, cache read, ``output_tokens`` 1) and
  ``content_block_start`` at once with the headers, one ``content_block_delta`` per token from the
  first token on, then ``content_block_stop``, ``message_delta`` (``stop_reason``, usage
  ``output_tokens``) and ``message_stop``.

Failures are answered as JSON errors before any event, like the real APIs' (the SDKs raise from
``create(..., stream=True)`` and retry as for any call).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import NormalDist
from typing import Any

__all__ = [
    "Every",
    "FailurePlan",
    "MockProviders",
    "ModelScript",
    "WhenPrompt",
    "cached_tokens",
    "completion_tokens",
    "mock_providers",
    "prompt_tokens",
]


# --- scripts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Every:
    """Logical calls ``i`` (0-based, per model) with ``i % n == offset`` get ``statuses``."""

    n: int
    statuses: tuple[int, ...] = (429,)
    offset: int = 0

    def matches(self, index: int, prompt: str) -> bool:
        return self.n > 0 and index % self.n == self.offset % self.n


@dataclass(frozen=True)
class WhenPrompt:
    """Logical calls whose prompt text contains ``contains`` get ``statuses``."""

    contains: str
    statuses: tuple[int, ...] = (500, 500, 500)

    def matches(self, index: int, prompt: str) -> bool:
        return self.contains in prompt


@dataclass(frozen=True)
class FailurePlan:
    """The statuses of each logical call's attempts.

    ``sequence[i]`` (when present and non-empty) wins for call ``i``; otherwise the first matching
    rule; otherwise the call succeeds at once."""

    rules: tuple[Every | WhenPrompt, ...] = ()
    sequence: tuple[tuple[int, ...], ...] = ()

    def statuses_for(self, index: int, prompt: str) -> tuple[int, ...]:
        if index < len(self.sequence) and self.sequence[index]:
            return self.sequence[index]
        for rule in self.rules:
            if rule.matches(index, prompt):
                return rule.statuses
        return ()

    def to_dict(self) -> dict[str, Any]:
        rules = []
        for rule in self.rules:
            if isinstance(rule, Every):
                rules.append({"every": rule.n, "offset": rule.offset, "statuses": list(rule.statuses)})
            else:
                rules.append({"prompt_contains": rule.contains, "statuses": list(rule.statuses)})
        return {"rules": rules, "sequence": [list(s) for s in self.sequence]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FailurePlan:
        rules: list[Every | WhenPrompt] = []
        for r in data.get("rules", ()):
            statuses = tuple(int(s) for s in r.get("statuses", (429,)))
            if "every" in r:
                rules.append(Every(int(r["every"]), statuses, int(r.get("offset", 0))))
            else:
                rules.append(WhenPrompt(str(r["prompt_contains"]), statuses))
        sequence = tuple(tuple(int(s) for s in item) for item in data.get("sequence", ()))
        return cls(rules=tuple(rules), sequence=sequence)


@dataclass(frozen=True)
class ModelScript:
    """How one model behaves: latency of every attempt, failures, retry header, response model."""

    latency_s: float = 0.02
    # Heavy-tailed latency: each attempt takes latency_s × a lognormal(0, latency_sigma) draw from
    # the server's seeded generator (0: every attempt takes latency_s).
    latency_sigma: float = 0.0
    plan: FailurePlan = field(default_factory=FailurePlan)
    retry_after_s: float = 0.05
    response_model: str | None = None  # e.g. a dated snapshot, as the real APIs answer
    # Generation of a successful answer, after latency_s (see the module's docstring): the first
    # token after first_token_s × a lognormal(0, first_token_sigma) quantile (one per logical call,
    # spread evenly), each further one token_s later. 0 (the default): the answer comes at once.
    first_token_s: float = 0.0
    first_token_sigma: float = 0.0
    token_s: float = 0.0
    cached_input_share: float = 0.0  # share of the prompt tokens reported as read from the cache

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency_s": self.latency_s,
            "latency_sigma": self.latency_sigma,
            "plan": self.plan.to_dict(),
            "retry_after_s": self.retry_after_s,
            "response_model": self.response_model,
            "first_token_s": self.first_token_s,
            "first_token_sigma": self.first_token_sigma,
            "token_s": self.token_s,
            "cached_input_share": self.cached_input_share,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelScript:
        return cls(
            latency_s=float(data.get("latency_s", 0.02)),
            latency_sigma=float(data.get("latency_sigma", 0.0)),
            plan=FailurePlan.from_dict(data.get("plan", {})),
            retry_after_s=float(data.get("retry_after_s", 0.05)),
            response_model=data.get("response_model"),
            first_token_s=float(data.get("first_token_s", 0.0)),
            first_token_sigma=float(data.get("first_token_sigma", 0.0)),
            token_s=float(data.get("token_s", 0.0)),
            cached_input_share=float(data.get("cached_input_share", 0.0)),
        )


# --- token counts ------------------------------------------------------------------------------
def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks: [{"type": "text", "text": ...}, ...]
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def prompt_tokens(messages: list[Any], system: Any = None) -> int:
    texts = [_content_text(m.get("content")) for m in messages if isinstance(m, dict)]
    if system:
        texts.append(_content_text(system))
    return sum(len(t.split()) + 4 for t in texts) + 3


def completion_tokens(prompt: int, max_tokens: int | None = None) -> int:
    n = 5 + (prompt * 7) % 23
    return min(n, max_tokens) if max_tokens else n


def cached_tokens(prompt: int, share: float) -> int:
    """The prompt tokens reported as read from the provider's prompt cache."""
    return int(prompt * share)


_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_NORMAL = NormalDist()


# --- the server --------------------------------------------------------------------------------
_ERROR_TYPES_OPENAI = {
    400: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", "service_unavailable"),
}
_ERROR_TYPES_ANTHROPIC = {
    400: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class MockProviders:
    """OpenAI- and Anthropic-compatible servers (one threaded HTTP server; both APIs' paths).

    ``scripts`` maps a model name to its :class:`ModelScript`; unknown models get ``default``."""

    def __init__(
        self,
        scripts: Mapping[str, ModelScript] | None = None,
        default: ModelScript | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(0)
        self._scripts: dict[str, ModelScript] = dict(scripts or {})
        self._default = default or ModelScript()
        self._calls: dict[str, int] = {}  # model → logical calls started
        self._attempts: dict[str, dict[str, int]] = {}  # model → status → attempts answered
        # body digest → (index, statuses) of that logical call
        self._pending: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._host = host
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- lifecycle
    def start(self) -> MockProviders:
        handler = _make_handler(self)
        server = ThreadingHTTPServer((self._host, 0), handler)
        server.daemon_threads = True
        self._server = server
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, name="mock-providers", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> MockProviders:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses
    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:  # the Anthropic SDK appends /v1/messages itself
        return self.base_url

    # -- scripting at runtime
    def script(self, model: str) -> ModelScript:
        with self._lock:
            return self._scripts.get(model, self._default)

    def set_script(self, model: str, script: ModelScript) -> None:
        with self._lock:
            self._scripts[model] = script

    def _latency_s(self, script: ModelScript) -> float:
        if script.latency_sigma <= 0:
            return script.latency_s
        with self._lock:
            return script.latency_s * self._rng.lognormvariate(0.0, script.latency_sigma)

    @staticmethod
    def _first_token_s(script: ModelScript, index: int) -> float:
        """Logical call ``index``'s time to first token: the lognormal's quantile frac(0.5 + index·φ),
        evenly spread over its range, so that any dozen calls of a model span it (a seeded draw
        would leave a dozen calls all above the median now and then)."""
        if script.first_token_sigma <= 0:
            return script.first_token_s
        u = min(max((0.5 + index * _GOLDEN) % 1.0, 0.01), 0.99)
        return script.first_token_s * math.exp(script.first_token_sigma * _NORMAL.inv_cdf(u))

    def set_latency(self, model: str, latency_s: float) -> None:
        with self._lock:
            self._scripts[model] = replace(self._scripts.get(model, self._default), latency_s=latency_s)

    def set_plan(self, model: str, plan: FailurePlan) -> None:
        with self._lock:
            self._scripts[model] = replace(self._scripts.get(model, self._default), plan=plan)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": dict(self._calls),
                "attempts": {m: dict(s) for m, s in self._attempts.items()},
            }

    # -- one attempt
    def _decide(
        self, model: str, body: bytes, retry_count: int | None, prompt: str
    ) -> tuple[int, ModelScript, int]:
        """The status of one HTTP attempt and the index of its logical call. A first attempt (retry
        count 0 or absent) starts a new logical call; a resend (same model and body, retry count
        k > 0) is that call's attempt k."""
        digest = hashlib.sha256(model.encode() + b"\0" + body).hexdigest()
        with self._lock:
            script = self._scripts.get(model, self._default)
            attempt = retry_count or 0
            pending = self._pending.get(digest) if attempt > 0 else None
            if pending is None:
                index = self._calls.get(model, 0)
                self._calls[model] = index + 1
                statuses = script.plan.statuses_for(index, prompt)
                self._pending[digest] = (index, statuses)
                attempt = 0
            else:
                index, statuses = pending
            status = statuses[attempt] if attempt < len(statuses) else 200
            if status == 200:
                self._pending.pop(digest, None)
            counts = self._attempts.setdefault(model, {})
            counts[str(status)] = counts.get(str(status), 0) + 1
        return status, script, index


def _make_handler(providers: MockProviders) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go in separate writes
        server_version = "mock-providers/1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        # -- plumbing
        def _body(self) -> bytes:
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def _send(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        # -- server-sent events (chunked transfer encoding: the connection stays open for the next call)
        def _start_events(self, headers: Mapping[str, str]) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("cache-control", "no-cache")
            self.send_header("transfer-encoding", "chunked")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()

        def _event(self, payload: Any, event: str | None = None) -> None:
            data = json.dumps(payload) if not isinstance(payload, str) else payload
            frame = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
            raw = frame.encode()
            self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")

        def _end_events(self) -> None:
            self.wfile.write(b"0\r\n\r\n")

        @staticmethod
        def _token_waits(script: ModelScript, index: int, tokens: int) -> list[float]:
            """Seconds to wait before each generated token (the first: the time to first token)."""
            return [providers._first_token_s(script, index)] + [script.token_s] * (tokens - 1)

        def do_GET(self) -> None:
            if self.path == "/_mock/stats":
                self._send(200, providers.stats())
            else:
                self._send(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

        def do_POST(self) -> None:
            body = self._body()
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                self._send(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
                return
            path = self.path.split("?", 1)[0]
            if path.startswith("/_mock/models/"):
                model = path.removeprefix("/_mock/models/")
                current = providers.script(model).to_dict()
                providers.set_script(model, ModelScript.from_dict({**current, **request}))
                self._send(200, providers.script(model).to_dict())
                return
            if path in ("/v1/chat/completions", "/v1/embeddings"):
                self._openai(path, body, request)
            elif path == "/v1/messages":
                self._anthropic(body, request)
            else:
                self._send(
                    404, {"error": {"message": f"unknown path {path}", "type": "invalid_request_error"}}
                )

        def _attempt(self, model: str, body: bytes, prompt: str) -> tuple[int, ModelScript, int]:
            raw = self.headers.get("x-stainless-retry-count")
            retry_count = int(raw) if raw and raw.isdigit() else None
            status, script, index = providers._decide(model, body, retry_count, prompt)
            time.sleep(providers._latency_s(script))
            return status, script, index

        @staticmethod
        def _retry_headers(script: ModelScript) -> dict[str, str]:
            return {
                "retry-after-ms": str(round(script.retry_after_s * 1000)),
                "retry-after": f"{script.retry_after_s:g}",
                "x-request-id": "req_" + uuid.uuid4().hex[:24],
            }

        # -- OpenAI
        def _openai(self, path: str, body: bytes, request: dict[str, Any]) -> None:
            model = str(request.get("model", ""))
            if path.endswith("/embeddings"):
                inputs = request.get("input", "")
                items = inputs if isinstance(inputs, list) else [inputs]
                prompt = " ".join(str(i) for i in items)
            else:
                messages = request.get("messages") or []
                prompt = " ".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
            status, script, index = self._attempt(model, body, prompt)
            if status != 200:
                etype, code = _ERROR_TYPES_OPENAI.get(status, ("server_error", None))
                self._send(
                    status,
                    {
                        "error": {
                            "message": f"mock {status} for {model}",
                            "type": etype,
                            "param": None,
                            "code": code,
                        }
                    },
                    self._retry_headers(script),
                )
                return
            served = script.response_model or model
            if path.endswith("/embeddings"):
                n = sum(len(str(i).split()) for i in items) + len(items)
                self._send(
                    200,
                    {
                        "object": "list",
                        "model": served,
                        "data": [
                            {"object": "embedding", "index": i, "embedding": [0.125 * (i + 1)] * 8}
                            for i in range(len(items))
                        ],
                        "usage": {"prompt_tokens": n, "total_tokens": n},
                    },
                    {"x-request-id": "req_" + uuid.uuid4().hex[:24]},
                )
                return
            p = prompt_tokens(request.get("messages") or [])
            c = completion_tokens(p, request.get("max_completion_tokens") or request.get("max_tokens"))
            usage = {
                "prompt_tokens": p,
                "completion_tokens": c,
                "total_tokens": p + c,
                "prompt_tokens_details": {
                    "cached_tokens": cached_tokens(p, script.cached_input_share),
                    "audio_tokens": 0,
                },
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            }
            waits = self._token_waits(script, index, c)
            if request.get("stream"):
                options = request.get("stream_options") or {}
                self._openai_stream(served, waits, usage if options.get("include_usage") else None)
                return
            time.sleep(sum(waits))
            self._send(
                200,
                {
                    "id": "chatcmpl-" + uuid.uuid4().hex[:24],
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": served,
                    "system_fingerprint": "fp_mock",
                    "service_tier": "default",
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": " ".join(["ok"] * c),
                                "refusal": None,
                                "annotations": [],
                            },
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                },
                {"x-request-id": "req_" + uuid.uuid4().hex[:24], "openai-processing-ms": "1"},
            )

        def _openai_stream(self, served: str, waits: list[float], usage: dict[str, Any] | None) -> None:
            """``chat.completion.chunk`` events, one per token as generated; ``usage`` (when the request
            asked for it) in a last chunk without choices."""
            head = {
                "id": "chatcmpl-" + uuid.uuid4().hex[:24],
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": served,
                "system_fingerprint": "fp_mock",
                "service_tier": "default",
            }

            def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
                out: dict[str, Any] = {**head, "choices": [choice]}
                if usage is not None:
                    out["usage"] = None
                return out

            self._start_events({"x-request-id": "req_" + uuid.uuid4().hex[:24], "openai-processing-ms": "1"})
            for i, wait in enumerate(waits):
                time.sleep(wait)
                if i == 0:
                    self._event(chunk({"role": "assistant", "content": "", "refusal": None}))
                self._event(chunk({"content": "ok" if i == 0 else " ok"}))
            self._event(chunk({}, "stop"))
            if usage is not None:
                self._event({**head, "choices": [], "usage": usage})
            self._event("[DONE]")
            self._end_events()

        # -- Anthropic
        def _anthropic(self, body: bytes, request: dict[str, Any]) -> None:
            model = str(request.get("model", ""))
            messages = request.get("messages") or []
            system = request.get("system")
            prompt = " ".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
            status, script, index = self._attempt(model, body, prompt)
            if status != 200:
                etype = _ERROR_TYPES_ANTHROPIC.get(status, "api_error")
                self._send(
                    status,
                    {"type": "error", "error": {"type": etype, "message": f"mock {status} for {model}"}},
                    self._retry_headers(script),
                )
                return
            p = prompt_tokens(messages, system)
            c = completion_tokens(p, request.get("max_tokens"))
            cached = cached_tokens(p, script.cached_input_share)
            message = {
                "id": "msg_" + uuid.uuid4().hex[:24],
                "type": "message",
                "role": "assistant",
                "model": script.response_model or model,
                "content": [{"type": "text", "text": " ".join(["ok"] * c)}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {
                    # Anthropic's input_tokens leaves out the tokens read from (or written to) the cache.
                    "input_tokens": p - cached,
                    "output_tokens": c,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": cached,
                },
            }
            waits = self._token_waits(script, index, c)
            if request.get("stream"):
                self._anthropic_stream(message, waits)
                return
            time.sleep(sum(waits))
            self._send(200, message, {"request-id": "req_" + uuid.uuid4().hex[:24]})

        def _anthropic_stream(self, message: dict[str, Any], waits: list[float]) -> None:
            """The Messages API's events: the message's start at once, one text delta per token as
            generated, then its end with the output token count."""
            usage = message["usage"]
            self._start_events({"request-id": "req_" + uuid.uuid4().hex[:24]})
            start = {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {**usage, "output_tokens": 1},  # the real API's placeholder
            }
            self._event({"type": "message_start", "message": start}, "message_start")
            block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            self._event(block, "content_block_start")
            self._event({"type": "ping"}, "ping")
            for i, wait in enumerate(waits):
                time.sleep(wait)
                delta = {"type": "text_delta", "text": "ok" if i == 0 else " ok"}
                self._event(
                    {"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"
                )
            self._event({"type": "content_block_stop", "index": 0}, "content_block_stop")
            end = {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            }
            self._event(end, "message_delta")
            self._event({"type": "message_stop"}, "message_stop")
            self._end_events()

    return Handler


@contextmanager
def mock_providers(
    scripts: Mapping[str, ModelScript] | None = None, default: ModelScript | None = None
) -> Iterator[MockProviders]:
    """``with mock_providers({...}) as providers:`` — started on a free loopback port, stopped after."""
    providers = MockProviders(scripts, default)
    providers.start()
    try:
        yield providers
    finally:
        providers.stop()
