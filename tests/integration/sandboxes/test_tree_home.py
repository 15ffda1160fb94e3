"""Issue 17: a restore or a fork from a prepared checkpoint lays the new home
over the checkpoint kept extracted (sandboxes/backends/trees.py), an overlay
volume of the engine (sandboxes/backends/docker_trees.py): nothing is
extracted, and the tree is never written.

What must hold, for real on the engine: the home is the checkpoint's (the
same listing as a restore that extracts), nothing is extracted, a sandbox's
writes and deletions stay in its own layer (a second fork of the same tree
sees the checkpoint), the next checkpoint carries them, the session file is
moved on in the layer only, the home survives a stop and a start (the engine
mounts the volume again), an unsafe checkpoint makes no tree, and the volume,
its layer and the trees no home uses go (at removal or at the sweep)."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import uuid

import pytest
import zstandard

from sandboxes import archive, launch
from sandboxes.backends import docker_trees, hosthome, trees
from sandboxes.backends.docker import HOME
from sandboxes.bridge.session import new_state
from sandboxes.errors import UnsafeArchive
from tests.integration.sandboxes.conftest import TEST_LABELS
from tests.integration.sandboxes.homes import LISTING, checkpoint_of, home_tar, tar_of


@pytest.fixture
def fresh(docker_sandboxes):
    """build_fresh for a new agent from a checkpoint; sandboxes removed after."""
    def build(checkpoint: str, agent: str | None = None, **kw) -> tuple[str, str]:
        agent = agent or f"th-{uuid.uuid4().hex[:8]}"
        sid = launch.build_fresh(docker_sandboxes.backend, launch.Launch(agent, {"model": "demo"}),
                                 launch.Fresh(checkpoint=checkpoint, labels=TEST_LABELS, **kw))
        docker_sandboxes.created.append(sid)
        return sid, agent
    return build


def _volume(backend, sid):
    return docker_trees.volume_of(backend.inspect(sid)["Mounts"], HOME)


def _no_extraction(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError("the checkpoint was extracted")
    monkeypatch.setattr(archive, "restore_checkpoint", refuse)


def test_a_restore_lays_the_home_over_the_tree_and_extracts_nothing(
        docker_sandboxes, fresh, tmp_path, settings, monkeypatch):
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    settings.ALINEO_PREPARED_TREES = False
    extracted_sid, _ = fresh(ckpt)
    assert _volume(b, extracted_sid) is None
    extracted = b.exec(extracted_sid, ["sh", "-c", LISTING]).text
    settings.ALINEO_PREPARED_TREES = True
    tree = trees.prepare(ckpt)
    _no_extraction(monkeypatch)
    sid, agent = fresh(ckpt)
    volume = _volume(b, sid)
    assert volume and volume.startswith(f"alineo-home-{agent}-")
    assert hosthome.of_mounts(b.inspect(sid)["Mounts"], HOME) is None
    assert b.exec(sid, ["sh", "-c", LISTING]).text == extracted
    assert "w/a.txt 1000 1000 604 f" in extracted and extracted.endswith("alpha\nalpha\n")
    labels = b.client.api.inspect_volume(volume)["Labels"]
    assert labels[docker_trees.LABEL_TREE] == tree.key and labels["alineo.test"] == TEST_LABELS["alineo.test"]


def _root_home_tar() -> bytes:
    """A home of the sandbox's own user (root in the container)."""
    return tar_of([(".", tarfile.DIRTYPE, b"", {"mode": 0o700}),
                 ("./w", tarfile.DIRTYPE, b"", {"mode": 0o755}),
                 ("./w/a.txt", tarfile.REGTYPE, b"alpha\n", {"mode": 0o604}),
                 ("./w/hard", tarfile.REGTYPE, b"hard\n", {}),
                 ("./w/link", tarfile.SYMTYPE, b"", {"linkname": "a.txt", "mode": 0o777})])


def test_writes_stay_in_the_sandbox_layer_and_the_tree_is_never_written(docker_sandboxes, fresh,
                                                                        tmp_path):
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, _root_home_tar())
    tree = trees.prepare(ckpt)
    one, agent = fresh(ckpt)
    two, _ = fresh(ckpt)
    # The mount's options name the layers' host paths (as a container's own
    # root shows docker's); none of them is reachable from inside.
    out = b.exec(one, ["sh", "-c",
                       "chmod 666 /root/w/a.txt && echo changed > /root/w/a.txt"
                       f" && rm /root/w/link && echo new > /root/new.txt; ls {tree.root} {trees.top()}"
                       " 2>/dev/null | wc -l; cat /root/w/a.txt"])
    assert out.text.split()[-2:] == ["0", "changed"], out
    assert (tree.root / "w" / "a.txt").read_text() == "alpha\n"
    assert oct((tree.root / "w" / "a.txt").stat().st_mode & 0o777) == "0o604"
    assert (tree.root / "w" / "link").is_symlink() and not (tree.root / "new.txt").exists()
    assert b.exec(two, ["sh", "-c", "cat /root/w/a.txt; ls /root/w"]).text.split() == [
        "alpha", "a.txt", "hard", "link"]
    # The next checkpoint is the home as the sandbox left it.
    stored = archive.store_checkpoint(b, one, agent, 2, root=tmp_path / "cps")
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(
            open(stored.path, "rb")), mode="r|") as tf:
        names = {m.name: (tf.extractfile(m).read() if m.isfile() else m.type) for m in tf}
    assert names["./new.txt"] == b"new\n" and "./w/link" not in names
    assert names["./w/a.txt"] == b"changed\n"


def test_the_session_file_moves_on_in_the_layer_only(docker_sandboxes, fresh, tmp_path,
                                                     monkeypatch):
    b = docker_sandboxes.backend
    # A session a bridge can run on (it goes on running, and may number an event or two).
    session = {**new_state(), "bseq": 4, "turns": 2}
    home = tar_of([(".", tarfile.DIRTYPE, b"", {"mode": 0o700}),
                 ("./.alineo", tarfile.DIRTYPE, b"", {"mode": 0o700}),
                 (f"./{archive.SESSION_MEMBER}", tarfile.REGTYPE, json.dumps(session).encode(),
                  {"mode": 0o600}),
                 ("./kept.txt", tarfile.REGTYPE, b"kept\n", {})])
    ckpt = checkpoint_of(tmp_path, home)
    tree = trees.prepare(ckpt)
    _no_extraction(monkeypatch)
    sid, _ = fresh(ckpt, max_turn=7, bseq_floor=40)
    got = json.loads(b.exec(sid, ["cat", f"/root/{archive.SESSION_MEMBER}"]).stdout)
    assert got["turns"] == 7 and got["bseq"] >= 40 and got["session_id"] == session["session_id"]
    assert b.exec(sid, ["cat", "/root/kept.txt"]).text == "kept\n"
    assert json.loads((tree.root / archive.SESSION_MEMBER).read_text())["turns"] == 2


def test_the_home_survives_a_stop_and_a_start(docker_sandboxes, fresh, tmp_path):
    """As after a reboot: the engine unmounts the volume at the stop and
    mounts it again at the start; what the sandbox wrote is in its layer."""
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    trees.prepare(ckpt)
    sid, _ = fresh(ckpt)
    b.exec(sid, ["sh", "-c", "echo before > /root/written.txt"])
    source = next(m["Source"] for m in b.inspect(sid)["Mounts"] if m["Destination"] == HOME)
    assert os.path.ismount(source)
    b.stop(sid, timeout=2)
    assert not os.path.ismount(source)
    b.start(sid)
    assert b.exec(sid, ["sh", "-c", "cat /root/written.txt /root/w/a.txt"]).text == "before\nalpha\n"


def test_an_unsafe_checkpoint_makes_no_tree(docker_sandboxes, tmp_path):
    ckpt = checkpoint_of(tmp_path, tar_of([
        (".", tarfile.DIRTYPE, b"", {"mode": 0o700}),
        ("./out", tarfile.SYMTYPE, b"", {"linkname": "/etc"}),
        ("./out/passwd", tarfile.REGTYPE, b"root::0:0::/:/bin/sh\n", {}),
    ]))
    with pytest.raises(UnsafeArchive):
        trees.prepare(ckpt)
    assert trees.find(ckpt) is None
    assert not [p for p in trees.top().iterdir() if p.name.startswith(trees.TMP)]


def test_removal_takes_the_volume_and_its_layer(docker_sandboxes, fresh, tmp_path):
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    trees.prepare(ckpt)
    sid, _ = fresh(ckpt)
    volume = _volume(b, sid)
    layer = docker_trees.layer_dir(volume)
    assert (layer / "upper").is_dir()
    b.remove(sid)
    assert volume not in {v["Name"] for v in b.client.api.volumes()["Volumes"] or []}
    assert not layer.exists()


def test_the_sweep_removes_what_no_home_uses(docker_sandboxes, fresh, tmp_path, monkeypatch):
    """A tree stays while a home is laid over it or its checkpoint is its
    agent's newest; a home left by ``docker rm -f`` goes with its layer."""
    b = docker_sandboxes.backend
    folder = tmp_path / "agent"
    folder.mkdir()
    old = checkpoint_of(folder, home_tar(), name="old")
    old_tree = trees.prepare(old)
    sid, _ = fresh(old)
    os.utime(old, ns=(1, 1))
    newer = checkpoint_of(folder, home_tar(), name="newer")
    new_tree = trees.prepare(newer)
    unused = trees.prepare(checkpoint_of(tmp_path, home_tar(), name="gone"))
    os.unlink(tmp_path / "gone-turn-1.tar.zst")
    monkeypatch.setattr(hosthome, "ORPHAN_AGE_S", 0)
    b.sweep_homes()
    assert old_tree.path.exists(), "in use by a home"
    assert new_tree.path.exists(), "its agent's newest checkpoint"
    assert not unused.path.exists()
    volume = _volume(b, sid)
    b.client.api.remove_container(sid, force=True)  # docker rm -f, behind our back
    b.sweep_homes()
    assert volume not in {v["Name"] for v in b.client.api.volumes()["Volumes"] or []}
    assert not docker_trees.layer_dir(volume).exists()
    assert not old_tree.path.exists() and new_tree.path.exists()


def test_a_home_that_cannot_be_laid_over_its_tree_is_extracted(docker_sandboxes, fresh, tmp_path,
                                                               monkeypatch):
    """The engine cannot mount the volume (its lower layer vanished after the
    volume was made): the restore extracts the checkpoint instead, and the
    failed container and volume are gone."""
    b = docker_sandboxes.backend
    ckpt = checkpoint_of(tmp_path, home_tar())
    tree = trees.prepare(ckpt)
    made = []
    real = type(b).new_tree_home

    def vanishing(self, *args, **kwargs):
        volume = real(self, *args, **kwargs)
        made.append(volume)
        shutil.rmtree(tree.root)
        return volume
    monkeypatch.setattr(type(b), "new_tree_home", vanishing)
    sid, _ = fresh(ckpt)
    assert made and _volume(b, sid) is None
    assert b.exec(sid, ["cat", "/root/w/a.txt"]).text == "alpha\n"
    assert made[0] not in {v["Name"] for v in b.client.api.volumes()["Volumes"] or []}
