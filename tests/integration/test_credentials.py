"""Credential bindings, for real: a bound secret reaches the sandbox's
environment and the real provider code, and never the transcript, checkpoint
rows, command rows or logs (grep for a canary), on both backends.

The OpenAI-compatible provider talks to a fake model server on 127.0.0.1
(network "host" so a docker sandbox reaches the host's loopback); nothing is
mocked between the worker, the bridge and the HTTP wire.
"""

from __future__ import annotations

import json
import sqlite3
import uuid

import httpx

from tests.integration.worlds import events_of, assert_sound
from tests.unit.bridge.fake_models import FakeModelServer, openai_completion


def store_secret(world, name: str, value: str) -> None:
    world.server.django(
        "from sessions.models import Workspace\n"
        "from sessions.credentials import set_secret\n"
        f"set_secret(Workspace.objects.get(name={world.actor.workspace!r}), {name!r}, {value!r})\n"
        "result = True\n"
    )


def nowhere_but_the_credential_table(world, canary: str) -> None:
    db = sqlite3.connect(world.server.data_dir / "alineo.sqlite3")
    try:
        for table in ("agent_sessions_event", "agent_sessions_checkpoint", "agent_sessions_command",
                      "agent_sessions_agent", "agent_sessions_snapshot"):
            rows = db.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608 - fixed names
            assert canary not in json.dumps(rows, default=str), f"the secret is in {table}"
    finally:
        db.close()
    assert canary not in world.server.log(), "the secret is in the server log"
    for log in (world.server.data_dir / "run").rglob("*.log"):
        assert canary not in log.read_text(errors="replace"), f"the secret is in {log}"
    for config in (world.server.data_dir / "run").rglob("config.json"):
        assert canary not in config.read_text(), f"the secret is in {config}"


def test_a_bound_secret_is_in_the_sandbox_env_and_redacted_everywhere(world):
    canary = "canary-" + uuid.uuid4().hex
    store_secret(world, "deploy-token", canary)
    spec = {"model": "demo", "checkpoint": True,
            "credentials": [{"name": "deploy-token", "env": "DEPLOY_TOKEN"}]}
    agent = world.spawn(spec, "run: echo token=$DEPLOY_TOKEN")
    events = world.wait_turns(agent, 1)
    result = next(e for e in events_of(events, "tool.result") if e["data"]["name"] == "bash")
    # The tool saw the value (so it was injected), and the transcript shows only its name.
    assert "token=[redacted:deploy-token]" in result["data"]["output"]
    assert canary not in json.dumps(events)
    assert_sound(events)
    world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    checkpoints = httpx.get(f"{world.url}/api/agents/{agent}/checkpoints", headers=world.actor.auth)
    assert canary not in checkpoints.text
    nowhere_but_the_credential_table(world, canary)


def test_an_unknown_credential_is_refused_at_spawn(world):
    spec = {"model": "demo", "credentials": [{"name": "no-such-secret", "env": "X_TOKEN"}]}
    before = world.get("/api/agents?limit=500")["agents"]
    r = world.post("/api/agents", {"spec": spec})
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == "spec.invalid" and body["field"] == "credentials[0].name"
    assert "no-such-secret" in body["message"]
    assert world.get("/api/agents?limit=500")["agents"] == before  # nothing half-created


def test_openai_compatible_provider_with_a_bound_key_runs_a_turn(world):
    key = "sk-canary-" + uuid.uuid4().hex
    with FakeModelServer() as fake:
        fake.script = [
            openai_completion(["Let me check."],
                              [("call_1", "bash", ['{"command": ', '"echo hi-from-tool"}'])]),
            openai_completion(["All ", "done."]),
        ]
        store_secret(world, "openai-key", key)
        store_secret(world, "openai-url", fake.url + "/v1")
        spec = {"model": "openai:fake-model", "network": "host",
                "credentials": [{"name": "openai-key", "env": "OPENAI_API_KEY"},
                                {"name": "openai-url", "env": "OPENAI_BASE_URL"}]}
        agent = world.spawn(spec, "say hi with a tool")
        events = world.wait_turns(agent, 1)
    assert len(fake.requests) == 2
    assert fake.requests[0]["headers"]["authorization"] == f"Bearer {key}"
    assert fake.requests[0]["body"]["model"] == "fake-model"
    result = next(e for e in events_of(events, "tool.result"))
    assert "hi-from-tool" in result["data"]["output"]
    finished = events_of(events, "turn.finished")[0]
    assert finished["data"]["text"].endswith("All done.")
    assert key not in json.dumps(events)
    assert_sound(events)
    nowhere_but_the_credential_table(world, key)
