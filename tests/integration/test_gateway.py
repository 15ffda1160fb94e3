"""The model gateway for real, on both backends: a demo agent with network
`none` reaches the gateway through its bridge's forwarder on the sandbox's own
loopback and the run dir's unix socket, finishes a turn with tool calls, and
its tools see the base URLs and a placeholder key, never a credential."""

from __future__ import annotations

import io
import json
import tarfile
import uuid

import httpx
import zstandard

from tests.integration.test_credentials import nowhere_but_the_credential_table, store_secret
from tests.integration.worlds import DEMO, assert_sound, events_of
from tests.unit.bridge.fake_models import FakeModelServer, openai_completion


def test_a_demo_turn_goes_through_the_gateway_with_network_none(world):
    spec = {**DEMO, "network": "none"}
    agent = world.spawn(spec, "run: env\nwrite g.txt: through the gateway")
    events = world.wait_turns(agent, 1)
    assert_sound(events)
    dispatched = events_of(events, "tool.dispatched")
    assert [d["data"]["name"] for d in dispatched] == ["bash", "write"]
    assert all(d["data"]["tool_call_id"].startswith("call_demo_") for d in dispatched)
    env = next(r["data"]["output"] for r in events_of(events, "tool.result")
               if r["data"]["name"] == "bash")
    values = dict(line.split("=", 1) for line in env.splitlines() if "=" in line)
    assert values["OPENAI_BASE_URL"].startswith("http://127.0.0.1:")
    assert values["OPENAI_API_KEY"] == "alineo-gateway"
    finished = events_of(events, "turn.finished")[0]["data"]["text"]
    assert finished.startswith("[demo] Done.\n- bash done") and "- write done" in finished
    assert (world.server.data_dir / "run" / agent / "gateway.sock").exists()


def test_a_real_model_with_network_none_and_the_key_only_at_the_gateway(world):
    """The key is bound with the default `inject: gateway`: the fake upstream
    gets it, the sandbox never does (not `env`, not a file of its home or its
    checkpoint, not the transcript)."""
    key = "sk-canary-" + uuid.uuid4().hex
    with FakeModelServer() as fake:
        fake.script = [
            openai_completion(["Looking."], [("call_env", "bash", ['{"command": "env; ls -a"}'])]),
            openai_completion(["All ", "done."]),
        ]
        store_secret(world, "gw-key", key)
        store_secret(world, "gw-url", fake.url + "/v1")
        spec = {"model": "openai:fake-model", "network": "none", "checkpoint": True,
                "credentials": [{"name": "gw-key", "env": "OPENAI_API_KEY"},
                                {"name": "gw-url", "env": "OPENAI_BASE_URL"}]}
        agent = world.spawn(spec, "look around")
        events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"),
                                "a checkpoint")
    assert [r["headers"]["authorization"] for r in fake.requests] == [f"Bearer {key}"] * 2
    assert fake.requests[0]["body"]["model"] == "fake-model"
    assert fake.requests[1]["body"]["messages"][-1]["tool_call_id"] == "call_env"
    assert_sound(events)
    assert events_of(events, "turn.finished")[0]["data"]["text"].endswith("All done.")
    usage = events_of(events, "turn.finished")[0]["data"]["usage"]  # the turn's model calls
    assert usage["calls"] <= 2 and usage["cost_usd"] is not None  # (a call made before the
    # relay journaled turn.started counts for the turn before: docs/GATEWAY.md)
    env = events_of(events, "tool.result")[0]["data"]["output"]
    assert "OPENAI_API_KEY=alineo-gateway" in env and "redacted" not in env
    assert key not in json.dumps(world.events(agent))
    checkpoint = next((world.server.data_dir / "checkpoints" / agent).glob("*.tar.zst"))
    with tarfile.open(fileobj=io.BytesIO(zstandard.ZstdDecompressor().stream_reader(
            checkpoint.open("rb")).read())) as tar:
        leaked = [m.name for m in tar if m.isfile() and key.encode() in tar.extractfile(m).read()]
    assert leaked == []
    nowhere_but_the_credential_table(world, key)


def test_a_spent_budget_ends_the_turn_visibly(world):
    """Set over the API by an operator: the demo's tokens count, the call that
    crosses the budget is answered, the next is refused at the gateway and
    the turn ends as budget_exceeded. (Last in the module: the budget is the
    world's workspace's, removed again at the end.)"""
    world.server.grant(world.actor, "change_workspace")
    url = f"{world.url}/api/workspaces/{world.actor.workspace}/budget"
    spent = httpx.get(url, headers=world.actor.auth, timeout=30).json()["today"]["tokens"]
    budget = spent + 1  # the module's earlier agents spent some today: one token more
    answer = httpx.put(url, json={"tokens_per_day": budget}, headers=world.actor.auth, timeout=30)
    assert answer.status_code == 200, answer.text
    try:
        agent = world.spawn({**DEMO, "network": "none"}, "run: echo spent")
        events = world.wait_for(agent, lambda evs: events_of(evs, "turn.interrupted"),
                                "the turn to end")
        assert events_of(events, "turn.interrupted")[0]["data"]["reason"] == "budget_exceeded"
        [exceeded] = events_of(events, "budget.exceeded")
        assert exceeded["data"]["limit"] == "tokens" and exceeded["data"]["budget"] == budget
        assert len(events_of(events, "model.call")) == 1  # the refused call was not made
        assert len(events_of(events, "tool.result")) == 1  # the first call's tool ran
        today = httpx.get(url, headers=world.actor.auth, timeout=30).json()
        assert today["exceeded"] == "tokens" and today["today"]["calls"] >= 1
        page = httpx.get(f"{world.url}/agents/{agent}/", timeout=30,
                         cookies={"sessionid": world.server.session_cookie(world.actor)}).text
        assert "Budget exceeded" in page and "reached: model calls are refused" in page
    finally:
        httpx.put(url, json={"tokens_per_day": None}, headers=world.actor.auth, timeout=30)
