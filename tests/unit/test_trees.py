"""sandboxes/backends/trees.py (issue 17): which checkpoint a prepared tree
is, that it is the checkpoint's home, that an unsafe or truncated one leaves
nothing, which trees the sweep removes (and never one a home uses), and the
background preparer (newest first, superseded ones skipped). No engine: GNU
tar into a temp data dir."""

from __future__ import annotations

import os
import tarfile
import time

import pytest
import zstandard

from sandboxes.backends import trees
from sandboxes.errors import UnsafeArchive
from tests.unit.tars import tar_of


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.DATA_DIR = str(tmp_path / "data")
    os.makedirs(settings.DATA_DIR, mode=0o700)
    return tmp_path / "data"


HOME = tar_of((".", tarfile.DIRTYPE, b""), ("./w", tarfile.DIRTYPE, b""),
            ("./w/a.txt", tarfile.REGTYPE, b"alpha\n"), ("./w/l", tarfile.SYMTYPE, "a.txt"))


def _checkpoint(folder, name: str, data: bytes = HOME, mtime: int | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-turn-1.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_a_tree_is_the_checkpoint_extracted(data_dir, tmp_path):
    ckpt = _checkpoint(tmp_path / "cp" / "ag1", "sb")
    assert trees.find(ckpt) is None
    tree = trees.prepare(ckpt)
    assert (tree.root / "w" / "a.txt").read_text() == "alpha\n"
    assert os.readlink(tree.root / "w" / "l") == "a.txt"
    assert trees.find(ckpt) == tree and trees.prepare(ckpt) == tree
    assert tree.path.parent == data_dir / "trees"
    assert oct(os.stat(data_dir / "trees").st_mode & 0o777) == "0o700"


def test_a_checkpoint_written_again_is_another_tree(data_dir, tmp_path):
    """The key is the file as it is: a checkpoint file replaced by another
    (same name) must never find the old tree."""
    folder = tmp_path / "cp" / "ag1"
    ckpt = _checkpoint(folder, "sb")
    old = trees.prepare(ckpt)
    ckpt.unlink()
    _checkpoint(folder, "sb", tar_of((".", tarfile.DIRTYPE, b""), ("./b.txt", tarfile.REGTYPE, b"beta\n")))
    assert trees.find(ckpt) is None
    new = trees.prepare(ckpt)
    assert new.key != old.key and (new.root / "b.txt").read_text() == "beta\n"


@pytest.mark.parametrize("members", [
    [("./out", tarfile.SYMTYPE, "/etc"), ("./out/passwd", tarfile.REGTYPE, b"x")],
    [("../escape.txt", tarfile.REGTYPE, b"x")],
])
def test_an_unsafe_checkpoint_leaves_no_tree(data_dir, tmp_path, members):
    ckpt = _checkpoint(tmp_path / "cp" / "ag1", "sb", tar_of((".", tarfile.DIRTYPE, b""), *members))
    with pytest.raises(UnsafeArchive):
        trees.prepare(ckpt)
    assert trees.find(ckpt) is None and list(trees.top().iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


def test_a_truncated_checkpoint_leaves_no_tree(data_dir, tmp_path):
    ckpt = _checkpoint(tmp_path / "cp" / "ag1", "sb")
    ckpt.write_bytes(ckpt.read_bytes()[:20])
    with pytest.raises(Exception):
        trees.prepare(ckpt)
    assert list(trees.top().iterdir()) == []


def test_the_sweep_keeps_the_newest_and_what_homes_use(data_dir, tmp_path):
    folder = tmp_path / "cp" / "ag1"
    older = trees.prepare(_checkpoint(folder, "s1", mtime=1_000))
    used = trees.prepare(_checkpoint(folder, "s2", mtime=2_000))
    newest = trees.prepare(_checkpoint(folder, "s3", mtime=3_000))
    seed = trees.prepare_seed(HOME)
    gone_ckpt = _checkpoint(tmp_path / "cp" / "ag2", "s1")
    orphan = trees.prepare(gone_ckpt)
    gone_ckpt.unlink()
    removed = trees.sweep(lambda: {used.key, seed.key})
    assert sorted(removed) == sorted([older.key, orphan.key])
    assert used.path.exists() and newest.path.exists() and seed.path.exists()
    assert not [p for p in trees.top().iterdir() if p.name.startswith(trees.TRASH)]
    assert trees.sweep(lambda: {used.key}) == [seed.key]  # an image's home no home uses


def test_the_sweep_skips_a_tree_held_by_a_restore(data_dir, tmp_path):
    """A home being laid over a tree holds it (shared lock): the sweep leaves
    it even though no volume names it yet."""
    folder = tmp_path / "cp" / "ag1"
    held = trees.prepare(_checkpoint(folder, "s1", mtime=1_000))
    trees.prepare(_checkpoint(folder, "s2", mtime=2_000))
    with trees.using(held) as ok:
        assert ok
        assert trees.sweep(set) == []
    assert trees.sweep(set) == [held.key]
    with trees.using(held) as ok:
        assert not ok  # removed: a restore must not lay a home over it


def test_the_sweep_removes_what_a_dead_process_left(data_dir, tmp_path):
    top = trees.top()
    stale, fresh = top / f"{trees.TMP}abc-1", top / f"{trees.TMP}abc-2"
    stale.mkdir()
    fresh.mkdir()
    os.utime(stale, (time.time() - trees.STALE_TMP_S - 5,) * 2)
    trees.sweep(set)
    assert not stale.exists() and fresh.exists()


def test_the_preparer_skips_a_checkpoint_superseded_before_its_turn(data_dir, tmp_path):
    folder = tmp_path / "cp" / "ag1"
    first = _checkpoint(folder, "s1", mtime=1_000)
    second = _checkpoint(folder, "s2", mtime=2_000)
    preparer = trees.Preparer(set)
    preparer.submit(first)
    preparer.submit(second)
    preparer.drain()
    assert trees.find(first) is None
    assert preparer.done == [trees.find(second).key]


def test_a_sweep_touches_only_its_own_kind(data_dir, tmp_path):
    """The docker backend's sweep cannot see the local backend's homes (and
    the other way round): it leaves the other kind's trees alone."""
    gone = _checkpoint(tmp_path / "cp" / "ag1", "s1")
    kept = trees.prepare(gone, trees.ROOT)
    gone.unlink()
    assert trees.sweep(set, trees.KEEP) == []
    assert kept.path.exists()
    assert trees.sweep(set, trees.ROOT) == [kept.key]


def test_no_tree_is_prepared_where_it_would_fill_the_disk(data_dir, tmp_path, monkeypatch):
    ckpt = _checkpoint(tmp_path / "cp" / "ag1", "s1")
    monkeypatch.setattr(trees, "MIN_FREE", 1 << 60)
    assert "MiB" in trees.room_short(ckpt)
    preparer = trees.Preparer(set)
    preparer.submit(ckpt)
    preparer.drain()
    assert trees.find(ckpt) is None and preparer.done == []
