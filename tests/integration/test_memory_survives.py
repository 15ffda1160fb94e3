"""Agent memory is keyed by agent identity, not sandbox: a note written
through the `memory` tool is read back after the sandbox was lost and the
agent rebuilt on a fresh one (a real provider's wire format against a fake
model server; the worker answers the bridge's memory requests)."""

from __future__ import annotations

import json
import uuid

from tests.integration.worlds import events_of, remove_sandbox
from tests.unit.bridge.fake_models import FakeModelServer, openai_completion


def _memory_call(call_id: str, args: dict) -> SSE:
    return openai_completion([], [(call_id, "memory", [json.dumps(args)])])


def test_memory_survives_the_loss_of_the_sandbox(world):
    note = "note-" + uuid.uuid4().hex[:8]
    with FakeModelServer() as fake:
        fake.script = [
            _memory_call("m1", {"op": "set", "key": "plan", "value": note}),
            openai_completion(["Saved."]),
        ]
        world.server.django(
            "from sessions.models import Workspace\nfrom sessions.credentials import set_secret\n"
            f"ws = Workspace.objects.get(name={world.actor.workspace!r})\n"
            "set_secret(ws, 'k', 'sk-fake-key-123456')\n"
            f"set_secret(ws, 'u', {fake.url + '/v1'!r})\nresult = 1\n")
        spec = {"model": "openai:fake", "network": "host",
                "credentials": [{"name": "k", "env": "OPENAI_API_KEY"},
                                {"name": "u", "env": "OPENAI_BASE_URL"}]}
        agent = world.spawn(spec, "remember the plan")
        world.wait_turns(agent, 1)
        sandbox = world.get(f"/api/agents/{agent}")["sandbox_id"]
        remove_sandbox(world, sandbox)  # no checkpoint: the agent is rebuilt on a fresh disk

        fake.script += [
            _memory_call("m2", {"op": "get", "key": "plan"}),
            openai_completion(["Recalled."]),
        ]
        world.send(agent, "prompt", "what was the plan?")
        events = world.wait_turns(agent, 2)
    assert world.get(f"/api/agents/{agent}")["sandbox_id"] != sandbox
    assert events_of(events, "agent.restored")[-1]["data"]["rung"] == "rebuild"
    got = next(e["data"] for e in events_of(events, "tool.result") if e["data"]["tool_call_id"] == "m2")
    assert json.loads(got["output"]) == {"key": "plan", "found": True, "value": note}
