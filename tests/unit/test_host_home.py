"""sandboxes/backends/hosthome.py (issue 17): which directories count as host
homes, what an image's home seeds one with, the sweep of orphans, and the
bridge's wait for the seal. No engine: the data dir is a temp dir."""

from __future__ import annotations

import io
import os
import tarfile
import time

import pytest

from sandboxes.backends import hosthome
from sandboxes.bridge import config as bridge_config
from tests.unit.tars import tar_of


@pytest.fixture
def data_dir(tmp_path, settings):
    settings.DATA_DIR = str(tmp_path / "data")
    os.makedirs(settings.DATA_DIR, mode=0o700)
    return tmp_path / "data"


def _engine_archive(*members) -> list[bytes]:
    """An archive as the engine's get_archive of /root gives it: ``root``, ``root/…``."""
    data = tar_of(*members)
    return [data[:700], data[700:]]


def test_an_image_home_of_plain_files_becomes_a_home_tar():
    seed = hosthome.image_home_tar(_engine_archive(
        ("root", tarfile.DIRTYPE, None), ("root/.bashrc", tarfile.REGTYPE, b"PS1=x\n"),
        ("root/d", tarfile.DIRTYPE, None), ("root/d/f", tarfile.REGTYPE, b"f")))
    with tarfile.open(fileobj=io.BytesIO(seed)) as tf:
        names = [(m.name, tf.extractfile(m).read() if m.isreg() else None) for m in tf]
    assert names == [(".", None), ("./.bashrc", b"PS1=x\n"), ("./d", None), ("./d/f", b"f")]


@pytest.mark.parametrize("member", [("root/l", tarfile.SYMTYPE, "/etc"),
                                    ("root/h", tarfile.LNKTYPE, "root/.bashrc"),
                                    ("root/fifo", tarfile.FIFOTYPE, None)])
def test_an_image_home_with_anything_else_is_not_used(member):
    """On disk before a checkpoint goes over it, only what its entries replace."""
    assert hosthome.image_home_tar(_engine_archive(
        ("root", tarfile.DIRTYPE, None), ("root/.bashrc", tarfile.REGTYPE, b"x"), member)) is None


def test_an_image_home_too_big_to_keep_is_not_used(monkeypatch):
    monkeypatch.setattr(hosthome, "IMAGE_HOME_MAX", 1000)
    assert hosthome.image_home_tar(_engine_archive(
        ("root", tarfile.DIRTYPE, None), ("root/big", tarfile.REGTYPE, bytes(3 << 20)))) is None


def test_only_directories_made_under_homes_count(data_dir, tmp_path):
    home = hosthome.fresh("agent-1")
    assert hosthome.owned(home) == home and oct(home.stat().st_mode & 0o777) == "0o700"
    assert hosthome.owned(tmp_path) is None  # anywhere else
    assert hosthome.owned(home / "sub") is None
    (hosthome.root() / "link").symlink_to(tmp_path)
    assert hosthome.owned(hosthome.root() / "link") is None
    assert hosthome.of_mounts([{"Type": "bind", "Destination": "/root", "Source": str(tmp_path)}],
                              "/root") is None
    assert hosthome.of_mounts([{"Type": "bind", "Destination": "/root/", "Source": str(home)}],
                              "/root") == home
    with pytest.raises(ValueError):
        hosthome.path_for("../etc")


def test_a_fresh_home_sets_the_old_one_aside_and_removal_follows_no_link(data_dir, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    home = hosthome.fresh("agent-1")
    (home / "work").mkdir()
    (home / "work" / "f").write_text("old")
    (home / "escape").symlink_to(outside)
    again = hosthome.fresh("agent-1")
    assert again == home and os.listdir(again) == []
    deadline = time.monotonic() + 30
    while any(p.name.startswith(hosthome.TRASH) for p in hosthome.root().iterdir()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    hosthome.remove(again)
    assert not again.exists() and (outside / "keep.txt").read_text() == "keep"


def test_the_sweep_removes_old_orphans_only(data_dir):
    used, old = hosthome.fresh("used"), hosthome.fresh("old")
    stale_trash = hosthome.root() / f"{hosthome.TRASH}gone-1234"
    stale_trash.mkdir()
    later = time.time() + hosthome.ORPHAN_AGE_S + 5
    assert hosthome.sweep([used], now=later) == ["old"]
    assert used.exists() and not old.exists() and not stale_trash.exists()


def test_a_just_restored_home_is_young_whatever_mtime_tar_gave_it(data_dir):
    """tar sets the home's mtime to the checkpoint's (years old): the age
    the sweep goes by is when the home was made, or the restore still
    creating its container would lose it."""
    young = hosthome.fresh("young")
    past = time.time() - 10 * hosthome.ORPHAN_AGE_S
    os.utime(young, (past, past))
    assert hosthome.sweep([]) == []
    assert young.exists()


def test_the_bridge_waits_for_the_seal_and_gives_up(tmp_path):
    assert bridge_config.wait_for_home(str(tmp_path), limit_s=0.2) is False
    hosthome.seal(tmp_path)
    assert bridge_config.wait_for_home(str(tmp_path), limit_s=0.2) is True
    assert bridge_config.parse_args(["--run-dir", str(tmp_path), "--home", str(tmp_path),
                                     "--wait-home"]).wait_home
