"""Every call is a fact: `model.call` with provider, request hash, usage, cost,
latency, status and response; a repeat of a completed call of the same agent
and turn is answered from the journal (`model.replayed`), and the upstream —
a fake server on 127.0.0.1 that counts requests — never gets it twice."""

from __future__ import annotations

import json

import openai
import pytest

from sessions.gateway.calls import CallStatus, cost_usd, request_hash
from sessions.gateway.demo import DemoUpstream
from sessions.gateway.journaled import CallJournal
from sessions.gateway.messages import Usage
from sessions.gateway.server import GatewayServer, Route
from sessions.gateway.upstreams import OpenAIUpstream, Target
from sessions.gateway import openai_wire
from tests.unit.bridge.fake_models import Raw, openai_completion

from .conftest import anthropic_client, facts, openai_client, turn

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"openai:gpt-fake": {"input": 2.0, "output": 10.0}}
ASK = [{"role": "user", "content": "list the files"}]


def test_a_call_is_journaled_with_usage_cost_and_response(listen, fake, agent):
    turn(agent, 1)
    fake.script = [openai_completion(["Looking."], [("call_1", "bash", ['{"command": "ls"}'])])]
    sock = listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", "sk-secret-1234")))
    openai_client(sock).chat.completions.create(model="gpt-4o", messages=ASK)
    [call] = facts(agent, "model.call")
    data = call.data
    assert (data["provider"], data["model"], data["api"], data["status"], data["turn"]) == (
        "openai:gpt-fake", "gpt-4o", "openai", "ok", 1)
    assert data["request_hash"].startswith("sha256:") and data["latency_ms"] >= 0
    assert data["usage"] == {"input_tokens": 11, "output_tokens": 5, "cache_read_tokens": 0,
                             "cache_write_tokens": 0}
    assert data["cost_usd"] == pytest.approx((11 * 2.0 + 5 * 10.0) / 1e6)
    assert data["response"] == {"text": "Looking.", "stop": "tool_use", "tool_calls": [
        {"id": "call_1", "name": "bash", "input": {"command": "ls"}}]}
    assert "list the files" not in json.dumps(data)  # the request is not stored again
    assert "sk-secret-1234" not in json.dumps(data)


def test_a_repeat_in_the_same_turn_is_answered_from_the_journal(listen, fake, agent):
    turn(agent, 1)
    fake.script = [openai_completion(["first"], [("call_1", "bash", ['{"command": "ls"}'])]),
                   openai_completion(["second"])]
    client = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    first = client.chat.completions.create(model="m", messages=ASK)
    again = client.chat.completions.create(model="m", messages=ASK, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in again if c.choices)
    assert len(fake.requests) == 1  # the completed call was not re-sent
    assert text == "first" == first.choices[0].message.content
    [replayed] = facts(agent, "model.replayed")
    [call] = facts(agent, "model.call")
    assert replayed.data["of_seq"] == call.seq
    assert replayed.data["request_hash"] == call.data["request_hash"]
    turn(agent, 2)  # a new turn asks again
    assert client.chat.completions.create(model="m", messages=ASK).choices[0].message.content \
        == "second"
    assert len(fake.requests) == 2


def test_a_bound_value_the_model_repeats_is_redacted_in_the_fact(loop, short_dir, fake, agent):
    from sandboxes.launch import Secret

    turn(agent, 1)
    token = "ghp-canary-0123456789"
    fake.script = [openai_completion([f"the token is {token}"])]
    journal_ = CallJournal(agent.id, secrets=(Secret("gh", "GH_TOKEN", token),))
    server = GatewayServer(Route(agent.id, OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", "")),
                                 journal_), short_dir / "r.sock", max_body=1 << 20)
    loop.run(server.start())
    try:
        openai_client(server.socket_path).chat.completions.create(model="m", messages=ASK)
    finally:
        loop.run(server.close())
    [call] = facts(agent, "model.call")
    assert call.data["response"]["text"] == "the token is [redacted:gh]"


def test_an_upstream_error_is_a_fact_and_is_not_replayed(listen, fake, agent):
    turn(agent, 1)
    fake.script = [Raw(429, b'{"error": {"message": "slow down"}}'), openai_completion(["ok"])]
    client = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=ASK)
    assert client.chat.completions.create(model="m", messages=ASK).choices[0].message.content == "ok"
    calls = facts(agent, "model.call")
    assert [c.data["status"] for c in calls] == ["error", "ok"]
    assert calls[0].data["error"] == {"status": 429, "message": "upstream 429: slow down"}
    assert "response" not in calls[0].data and len(fake.requests) == 2


def test_the_demo_costs_nothing_and_the_hash_ignores_the_api_and_stream(listen, agent):
    turn(agent, 1)
    sock = listen(DemoUpstream())
    openai_client(sock).chat.completions.create(model="demo", max_tokens=50, messages=[
        {"role": "user", "content": "say: hi"}])
    anthropic_client(sock).messages.create(model="demo", max_tokens=50, messages=[
        {"role": "user", "content": "say: hi"}])
    [call] = facts(agent, "model.call")  # the second was the same call: replayed
    assert call.data["cost_usd"] == 0.0 and call.data["provider"] == "demo"
    assert len(facts(agent, "model.replayed")) == 1


def test_a_model_without_a_price_has_no_cost_and_the_hash_is_stable():
    assert cost_usd("openai:unpriced", Usage(10, 10), PRICES) is None
    one = openai_wire.parse({"model": "a", "messages": ASK})
    two = openai_wire.parse({"model": "b", "messages": ASK, "stream": True})
    assert request_hash(one) == request_hash(two)
    assert request_hash(one) != request_hash(openai_wire.parse(
        {"model": "a", "messages": ASK + [{"role": "user", "content": "more"}]}))
    assert CallStatus.OK == "ok"


def test_usage_per_agent_and_turn_in_the_api(listen, fake, agent, owner, client):
    turn(agent, 1)
    fake.script = [openai_completion(["a"]), openai_completion(["b"])]
    api = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    api.chat.completions.create(model="m", messages=ASK)
    api.chat.completions.create(model="m", messages=ASK)  # replayed: no cost, not counted
    turn(agent, 2)
    api.chat.completions.create(model="m", messages=ASK + [{"role": "user", "content": "more"}])
    client.force_login(owner)
    usage = client.get(f"/api/agents/{agent.id}").json()["usage"]
    one = (11 * 2.0 + 5 * 10.0) / 1e6
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (2, 22, 10)
    assert usage["cost_usd"] == pytest.approx(2 * one) and usage["unpriced_calls"] == 0
    assert [(t["turn"], t["calls"]) for t in usage["turns"]] == [(1, 1), (2, 1)]


def test_another_workspaces_agent_shows_no_usage(agent, outsider, client):
    client.force_login(outsider)
    answer = client.get(f"/api/agents/{agent.id}")
    assert answer.status_code == 404 and "usage" not in answer.json()


def test_a_paused_agents_call_is_held_until_resume(listen, fake, agent):
    import threading
    import time

    from sessions.models import Agent

    turn(agent, 1)
    Agent.objects.filter(pk=agent.id).update(status="paused")
    fake.script = [openai_completion(["after the pause"])]
    api = openai_client(listen(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", ""))))
    answers = []
    caller = threading.Thread(target=lambda: answers.append(
        api.chat.completions.create(model="m", messages=ASK).choices[0].message.content))
    caller.start()
    time.sleep(1.5)  # several hold polls
    assert fake.requests == [] and answers == []  # held at the gateway
    Agent.objects.filter(pk=agent.id).update(status="idle")
    caller.join(20)
    assert answers == ["after the pause"] and len(fake.requests) == 1


def test_the_dashboard_shows_a_call_with_its_usage_and_cost():
    from types import SimpleNamespace

    from sessions.templatetags.alineo import event_view

    view = event_view(SimpleNamespace(type="model.call", data={
        "provider": "openai:gpt-fake", "status": "ok", "latency_ms": 12, "cost_usd": 0.000072,
        "usage": {"input_tokens": 11, "output_tokens": 5},
        "response": {"text": "hi", "stop": "end", "tool_calls": []}}))
    assert view["title"] == "Model call" and not view["failed"]
    assert view["meta"] == "openai:gpt-fake · 11 in / 5 out tokens · $0.000072 · 12 ms"
    failed = event_view(SimpleNamespace(type="model.call", data={
        "provider": "demo", "status": "error", "error": {"status": 502, "message": "x"}}))
    assert failed["failed"] and failed["blocks"][0]["label"] == "error"
