"""The worker's retention sweep, live: a checkpoint whose expiry passes is
removed by the running server without anyone asking, and the agent's
transcript says so."""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

import httpx

from tests.integration.worlds import LABEL, WAIT, cleanup_sandboxes, events_of
from tests.live import LiveServer


def _events(server, actor, agent):
    r = httpx.get(f"{server.url}/api/agents/{agent}/events?after=0&limit=500", headers=actor.auth)
    return r.json()["events"]


def _wait(predicate, what):
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_the_sweep_removes_an_expired_checkpoint_by_itself():
    server = LiveServer(env={"ALINEO_SANDBOX": "local", "ALINEO_SANDBOX_LABELS": LABEL,
                             "ALINEO_SWEEP_S": "1"})
    server.start()
    try:
        actor = server.create_actor("olivia")
        r = httpx.post(f"{server.url}/api/agents", headers=actor.auth,
                       json={"spec": {"model": "demo", "checkpoint": True}, "prompt": "write a.txt: x"})
        agent = r.json()["id"]
        _wait(lambda: events_of(_events(server, actor, agent), "agent.checkpointed"), "a checkpoint")
        cp = server.django(
            "from sessions.models import Checkpoint\n"
            f"c = Checkpoint.objects.get(agent_id={agent!r})\n"
            "result = {'id': c.pk, 'path': c.path}\n")
        assert Path(cp["path"]).exists()
        server.django(  # what the admin's "Expire now" does
            "from django.utils import timezone\nfrom sessions.models import Checkpoint\n"
            f"Checkpoint.objects.filter(pk={cp['id']}).update(expires_at=timezone.now())\nresult = 1\n")
        _wait(lambda: events_of(_events(server, actor, agent), "agent.checkpoint_expired"), "the sweep")
        fact = events_of(_events(server, actor, agent), "agent.checkpoint_expired")[0]["data"]
        assert fact == {"checkpoint": cp["id"], "turn": 1, "reason": "expired"}
        assert not Path(cp["path"]).exists()
        listed = httpx.get(f"{server.url}/api/agents/{agent}/checkpoints", headers=actor.auth).json()
        assert [c["state"] for c in listed["checkpoints"]] == ["deleted"]
    finally:
        server.stop()
        cleanup_sandboxes(server, "local")
        server.__exit__(None, None, None)


def test_the_worker_takes_scheduled_backups_keeping_the_newest(tmp_path):
    target = tmp_path / "backups"
    server = LiveServer(env={"ALINEO_SANDBOX": "local", "ALINEO_SANDBOX_LABELS": LABEL,
                             "ALINEO_SWEEP_S": "1", "ALINEO_BACKUP_DIR": str(target),
                             "ALINEO_BACKUP_EVERY_S": "1", "ALINEO_BACKUP_KEEP": "2"})
    server.start()
    try:
        seen: set[str] = set()

        def bundles():
            found = sorted(p for p in target.glob("alineo-backup-*") if (p / "manifest.json").exists())
            seen.update(p.name for p in found)
            return found

        _wait(lambda: len(bundles()) and len(seen) >= 3, "three scheduled backups")
        # Counted between two backups (the worker holds the directory's lock
        # from writing a bundle to pruning the old ones; one is due every second).
        with open(target / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            kept = bundles()
            fcntl.flock(lock, fcntl.LOCK_UN)
        assert len(kept) <= 2  # a third was written, and only the newest 2 are kept
        verified = server.manage("restore", "--from", str(bundles()[-1]), "--verify-only")
        assert verified.returncode == 0
    finally:
        server.stop()
        cleanup_sandboxes(server, "local")
        server.__exit__(None, None, None)

