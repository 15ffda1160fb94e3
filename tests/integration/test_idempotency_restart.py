"""An acknowledged command keeps its Idempotency-Key across a server crash: the
same key after a kill -9 and restart returns the first response and has no
second effect."""

import httpx


def _events(server, actor, agent_id):
    r = httpx.get(f"{server.url}/api/agents/{agent_id}/events?after=0&limit=1000", headers=actor.auth)
    assert r.status_code == 200
    return r.json()["events"]


def test_same_key_after_a_hard_restart_acts_once(alineo_server):
    olivia = alineo_server.create_actor("olivia", "acme")
    spawn_headers = {**olivia.auth, "Idempotency-Key": "spawn-1"}
    first = httpx.post(f"{alineo_server.url}/api/agents", json={"spec": {"model": "demo"}}, headers=spawn_headers)
    assert first.status_code == 201
    agent_id = first.json()["id"]
    prompt_headers = {**olivia.auth, "Idempotency-Key": "prompt-1"}
    url = f"{alineo_server.url}/api/agents/{agent_id}/prompt"
    acked = httpx.post(url, json={"text": "hello"}, headers=prompt_headers)
    assert acked.status_code == 202

    alineo_server.restart(hard=True)  # kill -9, then start again on the same data dir

    again = httpx.post(url, json={"text": "hello"}, headers=prompt_headers)
    assert again.status_code == 202 and again.json() == acked.json()
    respawn = httpx.post(f"{alineo_server.url}/api/agents", json={"spec": {"model": "demo"}}, headers=spawn_headers)
    assert respawn.status_code == 201 and respawn.json() == first.json()
    listed = httpx.get(f"{alineo_server.url}/api/agents", headers=olivia.auth).json()
    assert [a["id"] for a in listed["agents"]] == [agent_id]  # no second agent
    prompts = [e for e in _events(alineo_server, olivia, agent_id) if e["type"] == "command.prompt"]
    assert len(prompts) == 1

    changed = httpx.post(url, json={"text": "something else"}, headers=prompt_headers)
    assert changed.status_code == 422 and changed.json()["code"] == "idempotency.key_reused"
