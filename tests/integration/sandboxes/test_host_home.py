"""Issue 17: a restored or forked docker sandbox's home is a host directory
(sandboxes/backends/hosthome.py) bind-mounted at /root, written from the host
while the container starts, its bridge waiting for the seal.

What must hold, for real on the engine: the home is the checkpoint's (owners,
modes, links: as the engine's put_archive would make it), the sandbox user
writes into it after the restore and reaches nothing of the host through it,
the restore caps and the checkpoint's size cap still apply, `docker commit`
carries no home, and the directory goes with its sandbox (or at the sweep)."""

from __future__ import annotations

import os
import tarfile
import time
import uuid

import pytest
import zstandard

from sandboxes import archive, launch
from sandboxes.backends import hosthome
from sandboxes.backends.base import LABEL_AGENT
from sandboxes.backends.docker import HOME
from tests.integration.sandboxes.conftest import TEST_LABELS
from tests.integration.sandboxes.homes import LISTING, checkpoint_of, home_tar, tar_of


@pytest.fixture
def fresh(docker_sandboxes):
    """build_fresh for a new agent from a checkpoint path; sandboxes removed after."""
    def build(checkpoint: str, agent: str | None = None) -> tuple[str, str]:
        agent = agent or f"hh-{uuid.uuid4().hex[:8]}"
        sid = launch.build_fresh(docker_sandboxes.backend, launch.Launch(agent, {"model": "demo"}),
                                 launch.Fresh(checkpoint=checkpoint, labels=TEST_LABELS))
        docker_sandboxes.created.append(sid)
        return sid, agent
    return build


def _home_of(backend, sid):
    return hosthome.of_mounts(backend.inspect(sid)["Mounts"], HOME)


def test_a_restored_home_is_the_checkpoint_in_a_host_dir(docker_sandboxes, fresh, tmp_path, settings):
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    sid, agent = fresh(ckpt)
    home = _home_of(b, sid)
    assert home == hosthome.path_for(agent) and (home / "w" / "a.txt").read_bytes() == b"alpha\n"
    assert (launch.run_dir_for(agent) / hosthome.READY).exists()
    fast = b.exec(sid, ["sh", "-c", LISTING]).text
    # The same checkpoint through the engine (no host-dir home): the same home.
    settings.ALINEO_DOCKER_HOST_TAR = False
    slow_sid, _ = fresh(ckpt)
    assert _home_of(b, slow_sid) is None
    assert b.exec(slow_sid, ["sh", "-c", LISTING]).text == fast
    assert "w 1000 1000 755 d" in fast and "w/a.txt 1000 1000 604 f" in fast
    assert "w/link 0 0 777 l a.txt" in fast and fast.endswith("alpha\nalpha\n")


def test_the_sandbox_writes_its_host_home_and_reaches_nothing_beyond_it(docker_sandboxes, fresh,
                                                                        tmp_path):
    b = docker_sandboxes.backend
    sid, agent = fresh(checkpoint_of(tmp_path, home_tar()))
    home = _home_of(b, sid)
    neighbour = hosthome.path_for("hh-neighbour")
    neighbour.mkdir(exist_ok=True)
    (neighbour / "secret.txt").write_text("not yours")
    try:
        out = b.exec(sid, ["sh", "-c",
                           "echo mine > /root/new.txt && cat /root/new.txt; "
                           "ls /root/.. | grep -c hh-neighbour; "
                           "cat /root/../hh-neighbour/secret.txt 2>/dev/null; "
                           "ln -s /etc/shadow /root/shadow; ln -s ../../.. /root/up; "
                           "grep ' /root ' /proc/self/mountinfo | wc -l"])
        assert out.text.split() == ["mine", "0", "1"], out
        assert (home / "new.txt").read_text() == "mine\n"
        # Links the sandbox planted are kept as links by the next checkpoint ...
        stored = archive.store_checkpoint(b, sid, agent, 2, root=tmp_path / "cps")
        with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(
                open(stored.path, "rb")), mode="r|") as tf:
            kinds = {m.name: (m.type, m.linkname) for m in tf}
        assert kinds["./shadow"] == (tarfile.SYMTYPE, "/etc/shadow")
        # ... which no restore extracts, and removing the sandbox follows none.
        with pytest.raises(Exception, match="shadow|link"):
            fresh(stored.path)
        b.remove(sid)
        assert not home.exists() and (neighbour / "secret.txt").exists()
        assert os.path.exists("/etc/shadow")
    finally:
        hosthome.remove(neighbour)


def test_the_bridge_waits_for_the_seal(docker_sandboxes, tmp_path):
    b = docker_sandboxes.backend
    agent = f"hh-{uuid.uuid4().hex[:8]}"
    # build_fresh seals at its end; here the same steps, with a look before the seal.
    home = b.new_host_home(agent, docker_sandboxes.image)
    run = launch.run_dir_for(agent)
    command = launch.prepare_run_dir(b, launch.Launch(agent, {"model": "demo"}), None)
    sid = docker_sandboxes.create(agent, run_dir=str(run), command=command + ["--wait-home"],
                                  home_dir=home, env={"PYTHONPATH": "/run/alineo"})
    b.start(sid)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        assert not (run / "bridge.sock").exists()
        time.sleep(0.1)
    b.seal_home(sid, str(run))
    deadline = time.monotonic() + 60
    while not (run / "bridge.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (run / "bridge.sock").exists()


def test_caps_and_bombs_are_refused_before_the_host_home_takes_them(docker_sandboxes, fresh,
                                                                   tmp_path, settings):
    b = docker_sandboxes.backend
    settings.ALINEO_RESTORE_MAX_BYTES = 1_000_000
    bombs = {
        "zeros": tar_of([("zeros", tarfile.REGTYPE, bytes(2_000_000), {})]),
        "escape": tar_of([("./etc", tarfile.SYMTYPE, b"", {"linkname": "../../etc"}),
                        ("./etc/escaped", tarfile.REGTYPE, b"x", {})]),
        "device": tar_of([("./null", tarfile.CHRTYPE, b"", {"devmajor": 1, "devminor": 3})]),
        "dotdot": tar_of([("../outside.txt", tarfile.REGTYPE, b"x", {})]),
    }
    for name, data in bombs.items():
        agent = f"hh-bomb-{name}"
        with pytest.raises(launch.CheckpointUnusable):
            fresh(checkpoint_of(tmp_path, data, name), agent)
        # Nothing left: no container, no home, nothing written beside it.
        assert b.list({LABEL_AGENT: agent}) == []
        assert not hosthome.path_for(agent).exists()
        assert not (hosthome.root() / "outside.txt").exists()
        assert not (hosthome.root().parent / "etc").exists()


def test_a_host_home_grown_past_the_cap_is_not_checkpointed(docker_sandboxes, fresh, tmp_path,
                                                            settings):
    b = docker_sandboxes.backend
    sid, agent = fresh(checkpoint_of(tmp_path, home_tar()))
    assert b.exec(sid, ["sh", "-c", "head -c 3000000 /dev/urandom > /root/big"]).ok
    settings.ALINEO_RESTORE_MAX_BYTES = 1_000_000
    with pytest.raises(archive.HomeTooLarge):
        archive.store_checkpoint(b, sid, agent, 3, root=tmp_path / "cps")


def test_commit_carries_no_host_home(docker_sandboxes, fresh, tmp_path):
    b = docker_sandboxes.backend
    sid, _ = fresh(checkpoint_of(tmp_path, home_tar()))
    ref = docker_sandboxes.commit(sid, f"alineo-test-hh:{uuid.uuid4().hex[:8]}")
    plain = docker_sandboxes.started("hh-from-commit", image=ref)
    assert b.exec(plain, ["test", "-e", "/root/w/a.txt"]).exit_code == 1


def test_the_home_goes_with_its_sandbox_or_at_the_sweep(docker_sandboxes, fresh, tmp_path,
                                                        monkeypatch):
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    kept, _ = fresh(ckpt)
    vanished, _ = fresh(ckpt)
    removed, _ = fresh(ckpt)
    homes = {sid: _home_of(b, sid) for sid in (kept, vanished, removed)}
    b.remove(removed)
    assert not homes[removed].exists()
    b.client.api.remove_container(vanished, force=True, v=True)  # docker rm -f, behind our back
    assert homes[vanished].exists()
    assert b.sweep_homes() == []  # too young: it may be a restore still creating its container
    monkeypatch.setattr(hosthome, "ORPHAN_AGE_S", 0)
    assert homes[vanished].name in b.sweep_homes()
    assert not homes[vanished].exists() and homes[kept].exists()
    # A restore of the same agent sets an older home aside and starts empty.
    again, agent = fresh(ckpt, agent=homes[kept].name)
    assert _home_of(b, again) == homes[kept] and (homes[kept] / "w" / "a.txt").exists()
