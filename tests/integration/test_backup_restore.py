"""Durable beyond one machine: a live server with a
checkpointing agent is backed up ONLINE (`manage.py backup` while it serves),
then the machine is "lost" — server stopped, its sandboxes removed, its data
dir wiped — and `manage.py restore` rebuilds the deployment in a fresh data
dir at another path. A server started there brings the agent back through the
restore ladder (its sandbox does not exist here: the restore rung, from its
newest checkpoint), and the agent answers a prompt and finds the files it
wrote before the loss.

Both backends (the docker half is skipped loudly without an engine, as in
tests/integration/worlds.py). The docker half also "wipes" the images (their tags; a
keep-tag holds the layers, since other suites share the engine), and the
restore must load them back.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.integration.test_ladder import assert_sound, restored, settled_once
from tests.integration.worlds import (
    LABEL,
    World,
    cleanup_sandboxes,
    count_of,
    ensure_docker,
    events_of,
)
from tests.live import LiveServer, parent_dir

CHECKPOINTED = {"model": "demo", "checkpoint": True}

pytestmark = pytest.mark.live


def _bash_outputs(events) -> list[str]:
    return [e["data"].get("output", "") for e in events_of(events, "tool.result") if e["data"].get("name") == "bash"]


# The engine is shared with the rest of the suite: "wiping" an image removes
# its tag while a keep-tag holds its layers, so a failed restore can put it back.
_KEPT: dict[str, str] = {}


def _untag_images(tags: list[str]) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        for i, tag in enumerate(tags):
            keep = f"alineo-test-keep:{LABEL.split('=')[-1]}-{i}"
            client.images.get(tag).tag(keep)
            client.images.remove(tag)
            _KEPT[tag] = keep
            assert not _image_exists(tag)
    finally:
        client.close()
    return tags


def _image_exists(tag: str) -> bool:
    import docker

    client = docker.from_env()
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    finally:
        client.close()


def _retag_kept() -> None:
    import docker

    client = docker.from_env()
    try:
        for tag, keep in list(_KEPT.items()):
            if not _image_exists(tag):
                repo, _, version = tag.partition(":")
                client.images.get(keep).tag(repo, version)
            client.images.remove(keep)
            _KEPT.pop(tag)
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["local", "docker"])
def test_backup_wipe_restore_and_the_agent_finds_its_files(kind, tmp_path):
    if kind == "docker":
        ensure_docker()
    env = {"ALINEO_SANDBOX": kind, "ALINEO_SANDBOX_LABELS": LABEL}
    backups = tmp_path / "backups"
    old = LiveServer(env=env)
    new_dir = Path(tempfile.mkdtemp(prefix="restored-", dir=parent_dir()))
    new = LiveServer(env=env, data_dir=new_dir)
    try:
        # --- the old machine: two turns, each checkpointed ---------------------------------------
        old.start()
        w = World(old, old.create_actor("olivia"), kind)
        agent = w.spawn(CHECKPOINTED, "write notes.txt: hello")
        w.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 1, "the first checkpoint")
        w.send(agent, "prompt", "write more.txt: second turn")
        before = w.wait_for(agent, lambda evs: count_of(evs, "agent.checkpointed") >= 2, "the second checkpoint")
        old_sandbox = w.get(f"/api/agents/{agent}")["sandbox_id"]

        # --- an online backup, the server still serving ------------------------------------------
        args = ["backup", "--to", str(backups)] + ([] if kind == "docker" else ["--no-images"])
        out = old.manage(*args, timeout=600).stdout
        bundle = Path(out.strip().splitlines()[-1])
        assert bundle.parent == backups and (bundle / "manifest.json").is_file(), out
        w.send(agent, "prompt", "say: still serving after the backup")  # it never stopped
        w.wait_turns(agent, 3)
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["database"]["engine"] == "sqlite"
        assert len([f for f in manifest["files"] if f["path"].startswith("data/checkpoints/")]) == 2
        if kind == "docker":
            assert [i["tag"] for i in manifest["images"]], manifest["images_note"]
            assert all(i["tag"].startswith("alineo-base:") for i in manifest["images"])

        # --- the machine is lost ------------------------------------------------------------------
        old.stop()
        cleanup_sandboxes(old, kind)
        shutil.rmtree(old.data_dir)
        if kind == "docker":  # and its images: the restore must bring the tags back
            wiped = _untag_images([i["tag"] for i in manifest["images"]])

        # --- restore into a fresh data dir at another path ---------------------------------------
        restored_out = new.manage("restore", "--from", str(backups), timeout=600).stdout
        assert "restored" in restored_out and str(new_dir) in restored_out, restored_out
        new.manage("migrate", "--noinput")  # what an operator runs after a restore; a no-op here
        new._migrated = True  # LiveServer would copy its template database over the restored one
        rows = new.django(
            "from sessions.models import Checkpoint\n"
            f"result = list(Checkpoint.objects.filter(agent_id={agent!r}, deleted_at=None)"
            ".values_list('path', flat=True))\n")
        assert len(rows) == 2 and all(Path(p).is_relative_to(new_dir) and Path(p).is_file() for p in rows), rows
        if kind == "docker":
            assert all(_image_exists(tag) for tag in wiped), "restore did not load the images back"

        # A restore into the now non-empty data dir is refused without --force.
        again = new.manage("restore", "--from", str(backups), check=False)
        assert again.returncode != 0 and "not empty" in again.stderr

        # --- the new machine: the transcript is there; the agent comes back and works -------------
        new.start()
        w2 = World(new, w.actor, kind)  # same user and token: they were in the database
        events = w2.events(agent)
        # `before` was read before the backup was taken: all of it is in the
        # bundle, so the restored transcript starts with all of it — a restore
        # that lost the tail (and renumbered the head to match) fails here.
        assert len(events) >= len(before) and events[:len(before)] == before, (
            "the restored transcript differs from the original (or lost its tail)")
        assert count_of(events, "turn.finished") >= 2

        w2.send(agent, "prompt", "run: cat notes.txt\nrun: cat more.txt")
        head = len(events)
        events = w2.wait_for(agent, lambda evs: any(e["type"] == "turn.finished" and e["seq"] > head
                                                    for e in evs), "a turn after the restore")
        after = [e for e in events if e["seq"] > head]
        outputs = _bash_outputs(after)
        assert any("hello" in o for o in outputs), outputs
        assert any("second turn" in o for o in outputs), outputs
        rungs = restored(events)
        assert [r["data"]["rung"] for r in rungs] == ["restore"], rungs
        assert rungs[0]["data"]["old_sandbox_id"] == old_sandbox
        assert rungs[0]["data"]["new_sandbox_id"] != old_sandbox
        settled_once(events)
        assert_sound(events)
    finally:
        if kind == "docker":
            _retag_kept()
        for server in (old, new):
            server.stop()
            cleanup_sandboxes(server, kind)
        shutil.rmtree(old.data_dir, ignore_errors=True)
        shutil.rmtree(new_dir, ignore_errors=True)
