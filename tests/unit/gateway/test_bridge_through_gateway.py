"""A real bridge (stdlib only, `python -S`) whose demo model is the gateway:
its forwarder on 127.0.0.1 carries every model call to the gateway's unix
socket in the run dir, and tools see the usual base URLs and a placeholder key."""

from __future__ import annotations

import json
import os
import socket

import openai
import pytest

from tests.unit.bridge.harness import Bridge, kill_tool_processes

from .conftest import DemoUpstream, GatewayServer, Route


@pytest.fixture
def run_home(short_dir):
    run, home = short_dir / "run", short_dir / "home"
    run.mkdir()
    home.mkdir()
    yield str(run), str(home)
    kill_tool_processes(str(short_dir))


@pytest.fixture
def gateway(loop, run_home):
    server = GatewayServer(Route("a-1", DemoUpstream()), os.path.join(run_home[0], "gateway.sock"),
                           max_body=1 << 20)
    loop.run(server.start())
    yield server
    loop.run(server.close())


@pytest.fixture
def bridge(run_home):
    one = Bridge(*run_home)
    one.write_config(model="demo", gateway={"port": 0})
    yield one
    one.stop()


def _turn(bridge: Bridge, text: str) -> list[dict]:
    events = bridge.client.run_turn(text)
    assert events[-1]["type"] == "turn.finished", events[-1]
    return events


def test_a_turn_with_tool_calls_goes_through_the_gateway(gateway, bridge):
    bridge.start()
    events = _turn(bridge, "run: echo from-the-tool\nwrite note.txt: hi")
    calls = [e["data"] for e in events if e["type"] == "tool.dispatched"]
    assert [(c["name"], c["input"]) for c in calls] == [
        ("bash", {"command": "echo from-the-tool"}), ("write", {"path": "note.txt", "content": "hi"})]
    assert all(c["tool_call_id"].startswith("call_demo_") for c in calls)  # the gateway's ids
    assert events[-1]["data"]["text"].startswith("[demo] Done.\n- bash done: from-the-tool")
    assert bridge.client.ok("status")["model"] == "demo"
    assert "model gateway on 127.0.0.1:" in bridge.log_text()


def test_tools_see_the_base_urls_and_a_placeholder_key(gateway, bridge):
    bridge.start()
    events = _turn(bridge, "run: env")
    env = next(e["data"]["output"] for e in events if e["type"] == "tool.result")
    values = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert values["OPENAI_API_KEY"] == values["ANTHROPIC_API_KEY"] == "alineo-gateway"
    base = values["ANTHROPIC_BASE_URL"]
    assert base.startswith("http://127.0.0.1:") and values["OPENAI_BASE_URL"] == base + "/v1"
    # a harness inside would use them as they are: here, the real SDK on the same URL
    client = openai.OpenAI(base_url=values["OPENAI_BASE_URL"], api_key="x", max_retries=0)
    assert [m.id for m in client.models.list()] == ["demo"]


def test_a_call_waits_for_a_gateway_that_is_not_there_yet(loop, run_home, bridge):
    bridge.start()
    port = int(bridge.log_text().rsplit("model gateway on 127.0.0.1:", 1)[1].split()[0])
    with socket.create_connection(("127.0.0.1", port)) as held:  # the forwarder waits
        server = GatewayServer(Route("a-1", DemoUpstream()),
                               os.path.join(run_home[0], "gateway.sock"), max_body=1 << 20)
        loop.run(server.start())
        try:
            held.sendall(b"GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n")
            answer = held.makefile("rb").read()
        finally:
            loop.run(server.close())
    assert answer.startswith(b"HTTP/1.1 200") and b'"demo"' in answer


def test_without_a_gateway_the_model_call_is_a_model_error_not_a_hang(run_home, bridge):
    config = json.loads(open(os.path.join(run_home[0], "config.json")).read())
    bridge.write_config(**config, provider={"timeout": 2})
    bridge.start()
    # The forwarder would wait 60 s for the socket; the provider's own timeout ends it first.
    events = bridge.client.run_turn("say: hi")
    assert events[-1]["type"] == "turn.interrupted"
    assert events[-1]["data"]["reason"] == "model_error"


class _Blocking(DemoUpstream):
    """The demo model, except that its first call never answers (a model
    still thinking when the control plane dies)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    async def complete(self, request):
        import asyncio

        self.calls += 1
        if self.calls == 1:
            await asyncio.Event().wait()
        return await super().complete(request)


def test_a_call_cut_by_a_dying_gateway_is_asked_again_of_the_next(loop, run_home, bridge):
    import time

    sock = os.path.join(run_home[0], "gateway.sock")
    first = _Blocking()
    server = GatewayServer(Route("a-1", first), sock, max_body=1 << 20)
    loop.run(server.start())
    bridge.start()
    turn = bridge.client.ok("prompt", text="say: across the restart", command_id="c-1")["turn"]
    deadline = time.monotonic() + 30
    while first.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    loop.run(server.close())  # the call in flight is cut, as by a kill -9
    time.sleep(1.0)           # the bridge asks again meanwhile: the forwarder waits
    again = GatewayServer(Route("a-1", DemoUpstream()), sock, max_body=1 << 20)
    loop.run(again.start())
    try:
        events = bridge.client.wait_for(lambda e: e["type"] in ("turn.finished", "turn.interrupted")
                                        and e["data"]["turn"] == turn)
    finally:
        loop.run(again.close())
    assert events[-1]["type"] == "turn.finished", events[-1]
    assert "across the restart" in events[-1]["data"]["text"]
    assert not [e for e in events if e["type"] == "model.error"]


class _OverBudget:
    """A journal whose workspace has spent its budget (the real one:
    tests/unit/gateway/test_budget.py)."""

    def __init__(self):
        from sessions.gateway.budget import Limit, Refusal

        self.refusal = Refusal(Limit.TOKENS, 120, 100, "2026-12-01")
        self.exceeded_with = []

    async def paused(self):
        return False

    async def completed(self, request_hash):
        return None

    async def over_budget(self):
        return self.refusal

    async def exceeded(self, refusal):
        self.exceeded_with.append(refusal)


def test_a_spent_budget_ends_the_bridges_turn_as_budget_exceeded(loop, run_home, bridge):
    journal = _OverBudget()
    server = GatewayServer(Route("a-1", DemoUpstream(), journal),
                           os.path.join(run_home[0], "gateway.sock"), max_body=1 << 20)
    loop.run(server.start())
    try:
        bridge.start()
        events = bridge.client.run_turn("say: hi")
    finally:
        loop.run(server.close())
    assert events[-1]["type"] == "turn.interrupted"
    assert events[-1]["data"]["reason"] == "budget_exceeded"
    error = next(e for e in events if e["type"] == "model.error")["data"]["message"]
    assert "HTTP 429" in error and "120 of 100 tokens" in error
    assert journal.exceeded_with == [journal.refusal]
