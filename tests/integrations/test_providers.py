"""The mock providers answer the real SDKs as the real APIs do: retries, failures, usage, latency."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import anthropic
import openai
import pytest

from tests.integrations.providers import (
    Every,
    FailurePlan,
    ModelScript,
    WhenPrompt,
    cached_tokens,
    completion_tokens,
    mock_providers,
    prompt_tokens,
)


def _openai(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-test")


def test_openai_sdk_retries_a_throttled_call_and_gives_up_on_persistent_failures() -> None:
    plan = FailurePlan(rules=(Every(3, (429,)), WhenPrompt("poison", (500, 500, 500))))
    with mock_providers({"m": ModelScript(latency_s=0.0, plan=plan)}) as providers:
        client = _openai(providers.openai_base_url)
        messages = [{"role": "user", "content": "one two three"}]
        r = client.chat.completions.create(model="m", messages=messages)  # call 0: 429, then 200
        assert r.usage is not None
        p = prompt_tokens(messages)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (p, completion_tokens(p))
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "poison"}])
        client.chat.completions.create(model="m", messages=messages)  # call 2: 200 at once
        assert providers.stats() == {"calls": {"m": 3}, "attempts": {"m": {"429": 1, "200": 2, "500": 3}}}


def test_anthropic_sdk_retries_an_overloaded_call() -> None:
    script = ModelScript(latency_s=0.0, plan=FailurePlan(sequence=((529,),)), response_model="c-2025")
    with mock_providers({"c": script}) as providers:
        client = anthropic.Anthropic(
            base_url=providers.anthropic_base_url, api_key="k", open_telemetry={"traces": False}
        )
        msg = client.messages.create(model="c", max_tokens=7, messages=[{"role": "user", "content": "a b"}])
        assert msg.model == "c-2025"
        assert msg.usage.output_tokens == completion_tokens(msg.usage.input_tokens, 7)
        assert providers.stats()["attempts"] == {"c": {"529": 1, "200": 1}}


def test_latency_and_plan_change_at_runtime_also_over_http() -> None:
    with mock_providers({"m": ModelScript(latency_s=0.0)}) as providers:
        client = _openai(providers.openai_base_url)
        messages = [{"role": "user", "content": "x"}]
        client.chat.completions.create(model="m", messages=messages)  # connection warm
        providers.set_latency("m", 0.2)
        t = time.monotonic()
        client.chat.completions.create(model="m", messages=messages)
        assert time.monotonic() - t >= 0.2
        body = json.dumps({"latency_s": 0.0, "plan": {"rules": [{"every": 1, "statuses": [400]}]}}).encode()
        request = urllib.request.Request(providers.base_url + "/_mock/models/m", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["plan"]["rules"][0]["statuses"] == [400]
        with pytest.raises(openai.BadRequestError):  # 400 is not retried
            client.chat.completions.create(model="m", messages=messages)
        emb = client.embeddings.create(model="e", input=["a b", "c"])
        assert [len(d.embedding) for d in emb.data] == [8, 8]


def test_streams_answer_token_by_token_after_the_first_token_delay() -> None:
    script = ModelScript(latency_s=0.0, first_token_s=0.06, token_s=0.004, cached_input_share=0.5)
    with mock_providers({"m": script, "c": script}) as providers:
        client = _openai(providers.openai_base_url)
        messages: Any = [{"role": "user", "content": "one two three four five"}]
        p = prompt_tokens(messages)
        c, cached = completion_tokens(p), cached_tokens(p, 0.5)
        whole = client.chat.completions.create(model="m", messages=messages)  # also warms the connection
        assert whole.usage is not None and whole.usage.prompt_tokens_details is not None
        assert whole.usage.prompt_tokens_details.cached_tokens == cached > 0

        sent = time.monotonic()
        stream = client.chat.completions.create(
            model="m", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        arrivals, chunks = [], []
        for chunk in stream:
            arrivals.append(time.monotonic() - sent)
            chunks.append(chunk)
        content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
        assert "".join(content) == whole.choices[0].message.content and len(content) == c
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [ch.usage for ch in chunks[:-1]] == [None] * (len(chunks) - 1)
        assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
        # The server sleeps before it writes: the first chunk cannot arrive before the first-token
        # delay, nor the last before every token's delay. (Gaps measured between arrivals are not
        # bounded below: a first chunk read late narrows them.)
        assert arrivals[0] >= 0.06
        assert arrivals[-1] >= 0.06 + 0.004 * (c - 1)
        assert len({round(a, 3) for a in arrivals}) > 2  # the tokens arrive over time, not at once
        plain = list(client.chat.completions.create(model="m", messages=messages, stream=True))
        assert all(ch.usage is None for ch in plain) and len(plain) == c + 2  # role, tokens, finish

        claude = anthropic.Anthropic(
            base_url=providers.anthropic_base_url, api_key="k", open_telemetry={"traces": False}
        )
        msg = claude.messages.create(model="c", max_tokens=64, messages=messages)
        assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens) == (p - cached, cached)
        events: list[Any] = list(
            claude.messages.create(model="c", max_tokens=64, messages=messages, stream=True)
        )
        kinds = [e.type for e in events]
        assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * c + [
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        start, delta = events[0], events[-2]
        assert start.type == "message_start" and delta.type == "message_delta"
        assert start.message.usage.cache_read_input_tokens == cached
        assert delta.usage.output_tokens == msg.usage.output_tokens == c
        with claude.messages.stream(model="c", max_tokens=64, messages=messages) as helper:
            final = helper.get_final_message()
        assert final.usage.input_tokens == p - cached and final.usage.output_tokens == c


def test_first_token_delays_spread_over_the_configured_distribution() -> None:
    script = ModelScript(latency_s=0.0, first_token_s=0.03, first_token_sigma=0.5)
    with mock_providers({"m": script}) as providers:
        client = _openai(providers.openai_base_url)
        messages: Any = [{"role": "user", "content": "x"}]
        client.chat.completions.create(model="m", messages=messages)  # connection warm
        took = []
        for _ in range(12):
            t = time.monotonic()
            client.chat.completions.create(model="m", messages=messages)
            took.append(time.monotonic() - t)
        # Any dozen calls span the lognormal's quantiles: some well below the median, some above.
        assert min(took) < 0.03 * 0.8 and max(took) > 0.03 * 1.5
