"""Two workers, 20 agents, `kill -9` of one worker mid-turn: its agents are
taken over by the other through the ladder once their leases time out; every
turn settles exactly once and no agent is driven by two workers — all read
from the transcript.

Both workers run from the start and race for the 20 agents as they are made
(a wake-up reaches one of them, both scan every 3 s): each agent must end up
with exactly one. Each agent then gets a prompt whose turn sleeps, and the
worker that drives more of them is killed while the turns run. The other
must wait out the leases (the workers are named, ALINEO_WORKER_ID, so the dead
one is known only by its lease expiring — the path a worker on another
machine takes), then reattach to each still-running bridge and relay the rest
of the turn; its own agents never change hands.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.scaleout.processes import Api, WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = 20


def _wait(what: str, check, timeout: float, logs) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}\n{logs()}")
        time.sleep(0.5)


def _finished_turns(events: list[dict]) -> list[int]:
    return [e["data"].get("turn") for e in events if e["type"] == "turn.finished"]


def test_a_killed_workers_agents_are_taken_over_and_every_turn_settles_once(
        tmp_path, web_server, workspace, owner, owner_token):
    # All 20 run at once: more than the default quota of concurrent sandboxes.
    workspace.max_sandboxes = AGENTS
    workspace.save(update_fields=["max_sandboxes"])
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    web = web_server(env={"ALINEO_SANDBOX": "local"})
    api = Api(web.url, owner_token)
    workers = {name: WorkerProcess(name, data_dir, {"ALINEO_SANDBOX": "local"}).start()
               for name in ("w1", "w2")}
    logs = lambda: "\n".join(f"--- {n}\n{w.log()[-3000:]}" for n, w in workers.items())  # noqa: E731
    try:
        ids = [api.call("POST", "/api/agents", {"spec": {"model": "demo"},
                                                "prompt": f"say: hello {i}"})["id"]
               for i in range(AGENTS)]
        _wait("every first turn", lambda: all(_finished_turns(api.events(a)) == [1] for a in ids),
              120, logs)
        first = {a: _workers(api.events(a)) for a in ids}
        # The race: every agent was leased once, by one of the two, at epoch 1.
        assert all(len(w) == 1 and w[0]["epoch"] == 1 and w[0]["previous"] is None
                   for w in first.values()), first
        holder = {a: w[0]["worker"] for a, w in first.items()}
        counts = {n: sum(h == n for h in holder.values()) for n in workers}
        print(f"[takeover] leases after the race: {counts}")
        killed = max(counts, key=counts.get)
        survivor = "w2" if killed == "w1" else "w1"
        for i, agent_id in enumerate(ids):
            api.call("POST", f"/api/agents/{agent_id}/prompt",
                     {"text": f"say: before {i}\nsleep: 6\nsay: after {i}"})
        _wait("every second turn to start",
              lambda: all(any(e["type"] == "turn.started" and e["data"].get("turn") == 2
                              for e in api.events(a)) for a in ids), 60, logs)
        workers[killed].kill()
        _wait("every second turn to settle",
              lambda: all(_finished_turns(api.events(a)) == [1, 2] for a in ids), 120, logs)
        for i, agent_id in enumerate(ids):  # the survivor drives them all now: a third turn
            api.call("POST", f"/api/agents/{agent_id}/prompt", {"text": f"say: third {i}"})
        _wait("every third turn", lambda: all(_finished_turns(api.events(a)) == [1, 2, 3]
                                              for a in ids), 120, logs)
        for i, agent_id in enumerate(ids):
            taken = holder[agent_id] == killed
            _assert_driven_once(api.events(agent_id), i, holder[agent_id],
                                survivor if taken else None)
    finally:
        for w in workers.values():
            w.stop()


def _workers(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["type"] == "agent.worker"]


def _assert_driven_once(events: list[dict], i: int, first: str, taker: str | None) -> None:
    """`first` leased the agent; `taker` took it over once its lease expired
    (None: the agent never changed hands)."""
    kinds = [e["type"] for e in events]
    workers = [(w["worker"], w["epoch"], w["previous"]) for w in _workers(events)]
    restored = [(r["rung"], r["reason"]) for r in
                (e["data"] for e in events if e["type"] == "agent.restored")]
    if taker is None:
        assert workers == [(first, 1, None)], workers
        assert restored == [], restored
    else:
        assert workers == [(first, 1, None), (taker, 2, first)], workers
        assert restored == [("reattach", "worker_takeover")], restored
    # Every turn started once and settled once (finished: the bridge kept running).
    for turn in (1, 2, 3):
        started = [e for e in events if e["type"] == "turn.started" and e["data"].get("turn") == turn]
        settled = [e for e in events if e["type"] in ("turn.finished", "turn.interrupted")
                   and e["data"].get("turn") == turn]
        assert len(started) == 1 and len(settled) == 1, (turn, kinds)
        assert settled[0]["type"] == "turn.finished"
    if taker is not None:  # the second turn began under one worker and ended under the other
        takeover = next(e["seq"] for e in events if e["type"] == "agent.worker"
                        and e["data"]["worker"] == taker)
        second_start = next(e["seq"] for e in events
                            if e["type"] == "turn.started" and e["data"].get("turn") == 2)
        second_end = next(e["seq"] for e in events
                          if e["type"] == "turn.finished" and e["data"].get("turn") == 2)
        assert second_start < takeover < second_end
    replies = " ".join(e["data"].get("text", "") for e in events if e["type"] == "message.assistant")
    for word in (f"before {i}", f"after {i}", f"third {i}"):
        assert replies.count(word) == 1, (word, replies)
    # Nothing the bridge emitted was relayed twice (one bridge session throughout).
    bseqs = [e["data"]["bseq"] for e in events if "bseq" in e["data"]]
    assert bseqs == sorted(set(bseqs))
    assert os.environ.get("DATABASE_URL", "").startswith("postgres")
