"""Sandbox hosts: the engine that holds a sandbox is recorded with it, and the
worker that takes an agent over reaches that engine — not its own.

A second dockerd of the test's own plays two parts: an engine on this machine
(its unix socket: the bridge is reachable, so a takeover REATTACHES there) and
an engine of "another machine" (the same daemon through tcp://127.0.0.1: the
bridge's socket is out of reach, so the sandbox is REMOVED there and the agent
restored on the new worker's engine from its checkpoint — never run twice).
"""

from __future__ import annotations

import time

import pytest

from tests.dockerd2 import SecondDockerd
from tests.faults.harness import ensure_docker, ensure_root
from tests.live import free_port
from tests.scaleout.processes import Api, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"model": "demo", "checkpoint": True}


def _wait_events(api: Api, agent_id: str, check, what: str, logs, timeout: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        events = api.events(agent_id)
        if check(events):
            return events
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {[e['type'] for e in events][-30:]}\n{logs()}")
        time.sleep(0.5)


def _turns(n: int):
    return lambda events: sum(e["type"] == "turn.finished" for e in events) >= n


def events_of(events, etype):
    return [e["data"] for e in events if e["type"] == etype]


def test_a_takeover_reaches_the_engine_recorded_with_the_sandbox(tmp_path, web_server, owner_token):
    ensure_root()
    ensure_docker()
    from sandboxes import images

    tag, _ = images.ensure_base_image()
    engine = SecondDockerd(tcp_port=free_port())
    data = tmp_path / "data"
    data.mkdir()
    workers: list[WorkerProcess] = []
    agents: list[str] = []
    logs = lambda: "\n".join(f"--- {w.name}\n{w.log()[-2500:]}" for w in workers)  # noqa: E731
    try:
        engine.start()
        engine.load_image(tag)
        api = Api(web_server().url, owner_token)

        def worker(name: str, docker_host: str | None) -> WorkerProcess:
            env = {"ALINEO_SANDBOX": "docker", **({"DOCKER_HOST": docker_host} if docker_host else {})}
            workers.append(WorkerProcess(name, data, env).start())
            return workers[-1]

        # Agent A lives on the second engine through its unix socket (this machine) …
        w1 = worker("w1", engine.host)
        a = api.call("POST", "/api/agents", {"spec": SPEC, "prompt": "write notes.txt: kept on A"})["id"]
        agents.append(a)
        _wait_events(api, a, _turns(1), "A's first turn", logs)
        w1.kill()
        # … agent B on the same engine reached as another machine's (tcp://).
        w1b = worker("w1b", engine.tcp_host)
        b = api.call("POST", "/api/agents", {"spec": SPEC, "prompt": "write notes.txt: kept on B"})["id"]
        agents.append(b)
        events_b = _wait_events(api, b, lambda ev: _turns(1)(ev) and events_of(ev, "agent.checkpointed"),
                                "B's first turn and checkpoint", logs)
        w1b.kill()
        a_sandbox, b_sandbox = (api.call("GET", f"/api/agents/{x}")["sandbox_id"] for x in (a, b))
        assert events_of(api.events(a), "agent.sandbox")[0]["host"] == engine.host
        assert events_of(events_b, "agent.sandbox")[0]["host"] == engine.tcp_host

        # w2 drives the default engine; once the leases expire it takes both over.
        worker("w2", None)
        for x in (a, b):
            api.call("POST", f"/api/agents/{x}/prompt", {"text": "read: notes.txt"})
        events_a = _wait_events(api, a, _turns(2), "A's second turn under w2", logs)
        events_b = _wait_events(api, b, _turns(2), "B's second turn under w2", logs)

        # A: reattached where it was — same sandbox, same engine, still running there.
        assert [(r["rung"], r["reason"]) for r in events_of(events_a, "agent.restored")] == [
            ("reattach", "worker_takeover")]
        detail = api.call("GET", f"/api/agents/{a}")
        assert (detail["sandbox_id"], detail["sandbox_host"]) == (a_sandbox, engine.host)
        assert engine.docker("inspect", "-f", "{{.State.Running}}", a_sandbox).stdout.strip() == b"true"
        assert "kept on A" in events_of(events_a, "turn.finished")[-1]["text"]

        # B: removed from the engine w2 cannot drive, restored on w2's own from the checkpoint.
        restored = events_of(events_b, "agent.restored")
        assert [(r["rung"], r.get("cause")) for r in restored] == [
            ("restore", "engine_unreachable_from_worker")], restored
        detail = api.call("GET", f"/api/agents/{b}")
        assert detail["sandbox_id"] != b_sandbox
        assert detail["sandbox_host"] == "unix:///var/run/docker.sock"
        gone = engine.docker("ps", "-aq", "--no-trunc", "--filter", f"id={b_sandbox}").stdout.strip()
        assert gone == b""
        assert "kept on B" in events_of(events_b, "turn.finished")[-1]["text"]
        for events in (events_a, events_b):
            assert [w["worker"] for w in events_of(events, "agent.worker")][-1] == "w2"
            assert len(events_of(events, "turn.started")) == len(events_of(events, "turn.finished")) == 2
    finally:
        for w in workers:
            w.stop()
        _remove_sandboxes_of(agents)  # on the default engine; engine.stop() clears its own
        engine.stop()


def _remove_sandboxes_of(agent_ids: list[str]) -> None:
    import docker

    from sandboxes.backends.base import LABEL_AGENT

    client = docker.from_env()
    try:
        for agent_id in agent_ids:
            for c in client.api.containers(all=True, filters={"label": f"{LABEL_AGENT}={agent_id}"}):
                client.api.remove_container(c["Id"], force=True, v=True)
    finally:
        client.close()
