"""Sandbox snapshots with exec replay (sandboxes.snapshots), on docker and local."""

from __future__ import annotations

import os
import uuid

import pytest

from sandboxes.backends import overlay
from sandboxes.backends.base import SandboxStatus
from sandboxes.errors import SandboxError
from sandboxes.snapshots import SandboxSession

from .conftest import TEST_LABELS


@pytest.fixture
def session_factory(sandboxes, tmp_path):
    made = []

    def make(**kw):
        name = f"t{uuid.uuid4().hex[:10]}"
        s = SandboxSession.create(sandboxes.backend, name, sandboxes.image, agent_id="agent-snap",
                                  root=tmp_path / "journals", labels=TEST_LABELS, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        try:
            SandboxSession(sandboxes.backend, s.name, "", root=tmp_path / "journals").delete()
        except SandboxError:
            pass


def _sh(cmd):
    return ["sh", "-c", cmd]


def test_resume_recreates_from_the_newest_snapshot_and_replays_only_later_execs(
        sandboxes, session_factory, tmp_path):
    b = sandboxes.backend
    s = session_factory()
    assert s.exec(_sh('mkdir -p "$HOME/w" && echo a1 >> "$HOME/w/log"')).ok
    assert s.exec(_sh('echo phase-a > "$HOME/w/a.txt"')).ok
    ref = s.checkpoint("a")
    assert b.image_exists(ref)
    assert s.pending_execs() == []  # truncated to after the snapshot
    assert s.exec(_sh('echo b1 >> "$HOME/w/log"')).ok
    assert s.exec(_sh('echo phase-b > "$HOME/w/b.txt"; exit 3')).exit_code == 3
    assert [r["argv"][2][:7] for r in s.pending_execs()] == ["echo b1", "echo ph"]
    old = s.sandbox_id
    b.remove(old)  # the sandbox is lost
    assert b.status(old) is SandboxStatus.MISSING

    r = SandboxSession.resume(b, s.name, root=tmp_path / "journals")
    assert r.sandbox_id != old and b.status(r.sandbox_id) is SandboxStatus.RUNNING
    assert [x.recorded_exit_code for x in r.replayed] == [0, 3]
    assert all(x.same for x in r.replayed)
    out = r.exec(_sh('cat "$HOME/w/log" "$HOME/w/a.txt" "$HOME/w/b.txt"')).text.split()
    # a1 came with the snapshot (not replayed), b1 was replayed exactly once.
    assert out == ["a1", "b1", "phase-a", "phase-b"]
    r.remove()


def test_resume_without_a_snapshot_replays_everything_and_twice_is_stable(
        sandboxes, session_factory, tmp_path):
    b = sandboxes.backend
    s = session_factory()
    s.exec(_sh('echo x >> "$HOME/count"'))
    first = SandboxSession.resume(b, s.name, root=tmp_path / "journals")  # removes the old one
    assert b.status(s.sandbox_id) is SandboxStatus.MISSING
    second = SandboxSession.resume(b, s.name, root=tmp_path / "journals")
    assert b.status(first.sandbox_id) is SandboxStatus.MISSING
    assert second.exec(_sh('cat "$HOME/count"')).text.split() == ["x"]
    second.checkpoint("one")
    second.exec(_sh('echo y >> "$HOME/count"'))
    second.checkpoint("two")  # the newest snapshot wins
    third = SandboxSession.resume(b, s.name, root=tmp_path / "journals")
    assert third.replayed == []
    assert third.exec(_sh('cat "$HOME/count"')).text.split() == ["x", "y"]
    assert [x["name"] for x in third.snapshots()] == ["one", "two"]


def test_names_are_checked_and_a_session_is_not_created_twice(sandboxes, session_factory, tmp_path):
    s = session_factory()
    with pytest.raises(SandboxError):
        s.checkpoint("Bad Name")
    with pytest.raises(SandboxError):
        SandboxSession.create(sandboxes.backend, s.name, sandboxes.image, agent_id="x",
                              root=tmp_path / "journals")
    with pytest.raises(SandboxError):
        SandboxSession.resume(sandboxes.backend, "no-such-session", root=tmp_path / "journals")


def test_docker_home_tar_fast_path_matches_exec_tar_and_refuses_a_symlinked_home(
        docker_sandboxes, settings):
    """read_home's host-side fast path (root, overlay2, running) gives the same
    members as exec'd tar, and a /root turned into a symlink (to /etc, which the
    host would resolve to its own /etc) is never followed."""
    import io
    import tarfile

    b = docker_sandboxes.backend
    sid = docker_sandboxes.started("agent-fast")
    assert b.exec(sid, ["sh", "-c", "mkdir -p w/__pycache__ .cache .npm; echo a > w/a; "
                                    "echo p > w/__pycache__/x.pyc; echo c > .cache/c; "
                                    "ln -s a w/link"]).ok

    def names():
        return sorted(tarfile.open(fileobj=io.BytesIO(b"".join(b.read_home(sid)))).getnames())

    fast = names()
    settings.ALINEO_DOCKER_HOST_TAR = False  # exec'd tar
    assert b._host_fd(sid, overlay.merged_home_fd) is None
    assert names() == fast and "./w/link" in fast and not any("cache" in n for n in fast)
    settings.ALINEO_DOCKER_HOST_TAR = True
    fd = b._host_fd(sid, overlay.merged_home_fd)
    assert fd is not None
    os.close(fd)
    assert b.exec(sid, ["sh", "-c", "mv /root /root.real && ln -s /etc /root"]).ok
    assert b._host_fd(sid, overlay.merged_home_fd) is None
    b"".join(b.read_home(sid))  # falls back to exec'd tar, inside the container
