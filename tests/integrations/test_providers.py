"""The mock providers answer the real SDKs as the real APIs do: retries, failures, usage, latency."""

from __future__ import annotations

import json
import time
import urllib.request

import anthropic
import openai
import pytest

from tests.integrations.providers import (
    Every,
    FailurePlan,
    ModelScript,
    WhenPrompt,
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
