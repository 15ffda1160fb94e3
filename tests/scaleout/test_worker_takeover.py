"""Two workers, 20 agents, `kill -9` of one worker mid-turn: its agents are
taken over by the other through the ladder once their leases time out; every
turn settles exactly once and no agent is driven by two workers — all read
from the transcript.

Worker w1 drives all 20 agents (it is the only worker while they are made);
w2 starts, finds every lease held and drives nothing; each agent gets a
prompt whose turn sleeps; w1 is killed while the turns run. w2 must wait out
the leases (the workers are named, ALINEO_WORKER_ID, so the dead one is known
only by its lease expiring — the path a worker on another machine takes),
then reattach to each still-running bridge and relay the rest of the turn.
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
        tmp_path, web_server, owner, owner_token):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    web = web_server(env={"ALINEO_SANDBOX": "local"})
    api = Api(web.url, owner_token)
    w1 = WorkerProcess("w1", data_dir, {"ALINEO_SANDBOX": "local"}).start()
    w2 = WorkerProcess("w2", data_dir, {"ALINEO_SANDBOX": "local"})
    logs = lambda: f"--- w1\n{w1.log()[-3000:]}\n--- w2\n{w2.log()[-3000:]}"  # noqa: E731
    try:
        ids = [api.call("POST", "/api/agents", {"spec": {"model": "demo"},
                                                "prompt": f"say: hello {i}"})["id"]
               for i in range(AGENTS)]
        _wait("every first turn", lambda: all(_finished_turns(api.events(a)) == [1] for a in ids),
              120, logs)
        w2.start()
        time.sleep(2)  # a scan of w2's: every lease is live, it must take nothing
        for i, agent_id in enumerate(ids):
            api.call("POST", f"/api/agents/{agent_id}/prompt",
                     {"text": f"say: before {i}\nsleep: 6\nsay: after {i}"})
        _wait("every second turn to start",
              lambda: all(any(e["type"] == "turn.started" and e["data"].get("turn") == 2
                              for e in api.events(a)) for a in ids), 60, logs)
        w1.kill()
        _wait("every second turn to settle",
              lambda: all(_finished_turns(api.events(a)) == [1, 2] for a in ids), 120, logs)
        for i, agent_id in enumerate(ids):  # w2 now drives them: a third turn
            api.call("POST", f"/api/agents/{agent_id}/prompt", {"text": f"say: third {i}"})
        _wait("every third turn", lambda: all(_finished_turns(api.events(a)) == [1, 2, 3]
                                              for a in ids), 120, logs)
        for i, agent_id in enumerate(ids):
            _assert_driven_once(api.events(agent_id), i)
    finally:
        w2.stop()
        w1.stop()


def _assert_driven_once(events: list[dict], i: int) -> None:
    kinds = [e["type"] for e in events]
    workers = [e["data"] for e in events if e["type"] == "agent.worker"]
    # w1 held it from the start; w2 took it over once, from w1, at the next epoch.
    assert [(w["worker"], w["epoch"], w["previous"]) for w in workers] == [
        ("w1", 1, None), ("w2", 2, "w1")], workers
    takeover = next(e["seq"] for e in events if e["type"] == "agent.worker" and e["data"]["worker"] == "w2")
    restored = [e["data"] for e in events if e["type"] == "agent.restored"]
    assert [(r["rung"], r["reason"]) for r in restored] == [("reattach", "worker_takeover")], restored
    # Every turn started once and settled once (finished: the bridge kept running).
    for turn in (1, 2, 3):
        started = [e for e in events if e["type"] == "turn.started" and e["data"].get("turn") == turn]
        settled = [e for e in events if e["type"] in ("turn.finished", "turn.interrupted")
                   and e["data"].get("turn") == turn]
        assert len(started) == 1 and len(settled) == 1, (turn, kinds)
        assert settled[0]["type"] == "turn.finished"
    # The second turn began under w1 and ended under w2, its reply whole and once.
    second_start = next(e["seq"] for e in events if e["type"] == "turn.started" and e["data"].get("turn") == 2)
    second_end = next(e["seq"] for e in events if e["type"] == "turn.finished" and e["data"].get("turn") == 2)
    assert second_start < takeover < second_end
    replies = " ".join(e["data"].get("text", "") for e in events if e["type"] == "message.assistant")
    for word in (f"before {i}", f"after {i}", f"third {i}"):
        assert replies.count(word) == 1, (word, replies)
    # Nothing the bridge emitted was relayed twice (one bridge session throughout).
    bseqs = [e["data"]["bseq"] for e in events if "bseq" in e["data"]]
    assert bseqs == sorted(set(bseqs))
    assert os.environ.get("DATABASE_URL", "").startswith("postgres")
