"""safe_extract / check_tar: crafted tarballs are refused and nothing is written
outside the destination."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from sandboxes.safe_tar import check_tar, safe_extract
from sandboxes.errors import UnsafeArchive


def _info(name, kind=tarfile.REGTYPE, *, data=b"", linkname="", mode=0o644):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = linkname
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    info.mtime = 1_700_000_000
    return info, (io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def make_tar(*entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for entry in entries:
            tf.addfile(*entry)
    return buf.getvalue()


def f(name, data=b"x", mode=0o644):
    return _info(name, data=data, mode=mode)


def d(name, mode=0o755):
    return _info(name, tarfile.DIRTYPE, mode=mode)


def sym(name, target):
    return _info(name, tarfile.SYMTYPE, linkname=target, mode=0o777)


def hard(name, target):
    return _info(name, tarfile.LNKTYPE, linkname=target)


@pytest.fixture
def box(tmp_path):
    """tmp/box/dest is the destination; tmp/box/outside holds a sentinel."""
    root = tmp_path / "box"
    (root / "outside").mkdir(parents=True)
    (root / "outside" / "secret.txt").write_text("original")
    (root / "dest").mkdir()
    return root


def tree(root: Path, skip: Path) -> dict[str, tuple]:
    """Every path under root except ``skip``, with its type and content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path == skip or skip in path.parents:
                continue
            st = os.lstat(path)
            body = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), body)
    return out


BAD = {
    "dotdot": lambda out: make_tar(f("ok.txt"), f("../evil.txt")),
    "dotdot-nested": lambda out: make_tar(f("a/../../evil.txt")),
    "dotdot-dot-slash": lambda out: make_tar(f("./../outside/secret.txt", b"pwned")),
    "absolute": lambda out: make_tar(f(str(out / "abs-evil.txt"))),
    "absolute-over-sentinel": lambda out: make_tar(f(str(out / "secret.txt"), b"pwned")),
    "symlink-dotdot": lambda out: make_tar(sym("link", "../outside"), f("link/evil.txt")),
    "symlink-absolute": lambda out: make_tar(sym("link", str(out)), f("link/evil.txt")),
    "symlink-etc": lambda out: make_tar(sym("etc", "/etc")),
    "symlink-deep-dotdot": lambda out: make_tar(d("a"), d("a/b"), sym("a/b/up", "../../..")),
    # lexically "sub/.." is ".", but sub -> . makes it the parent of dest
    "symlink-chain": lambda out: make_tar(sym("sub", "."), sym("x", "sub/..")),
    # an earlier inside link made to point outside by a later one
    "symlink-retarget": lambda out: make_tar(sym("p", "q/.."), sym("q", ".")),
    "write-through-inside-symlink": lambda out: make_tar(d("real"), sym("alias", "real"),
                                                         f("alias/file.txt")),
    "hardlink-dotdot": lambda out: make_tar(hard("h", "../outside/secret.txt")),
    "hardlink-absolute": lambda out: make_tar(hard("h", str(out / "secret.txt"))),
    "hardlink-etc-passwd": lambda out: make_tar(hard("h", "/etc/passwd")),
    "hardlink-through-symlink": lambda out: make_tar(d("real"), f("real/file"),
                                                     sym("alias", "real"),
                                                     hard("h", "alias/file")),
    "chardev": lambda out: make_tar(_info("null", tarfile.CHRTYPE)),
    "blockdev": lambda out: make_tar(_info("sda", tarfile.BLKTYPE)),
    "fifo": lambda out: make_tar(_info("pipe", tarfile.FIFOTYPE)),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_crafted_tar_is_refused_and_nothing_escapes(box, case):
    dest, outside = box / "dest", box / "outside"
    data = BAD[case](outside)
    before = tree(box.parent, skip=dest)
    with pytest.raises(UnsafeArchive) as info:
        safe_extract(data, dest)
    assert "unsafe archive entry" in str(info.value)
    assert info.value.permanent
    assert tree(box.parent, skip=dest) == before
    assert (outside / "secret.txt").read_text() == "original"
    assert not (outside / "abs-evil.txt").exists()
    # everything that was extracted stays inside dest, resolved
    for path in dest.rglob("*"):
        real = os.path.realpath(path)
        assert real == str(dest) or real.startswith(str(dest) + os.sep), path


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_tar_refuses_the_same(case, tmp_path):
    with pytest.raises(UnsafeArchive):
        check_tar(BAD[case](tmp_path / "outside"))


def test_existing_symlink_in_dest_is_not_written_through(box):
    dest, outside = box / "dest", box / "outside"
    (dest / "pre").symlink_to(outside)
    with pytest.raises(UnsafeArchive, match="symlink"):
        safe_extract(make_tar(f("pre/evil.txt", b"pwned")), dest)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_link_to_an_existing_outward_symlink_is_refused(box):
    dest, outside = box / "dest", box / "outside"
    (dest / "pre").symlink_to(outside)
    with pytest.raises(UnsafeArchive, match="outside"):
        safe_extract(make_tar(sym("x", "pre")), dest)
    assert not os.path.lexists(dest / "x")


def test_existing_hardlink_in_dest_is_replaced_not_written_through(box):
    dest, outside = box / "dest", box / "outside"
    os.link(outside / "secret.txt", dest / "hl")
    safe_extract(make_tar(f("hl", b"new content")), dest)
    assert (dest / "hl").read_bytes() == b"new content"
    assert (outside / "secret.txt").read_text() == "original"


def test_a_good_archive_extracts_fully(box):
    dest = box / "dest"
    data = make_tar(
        d("."),
        d("./work"),
        f("./work/a.txt", b"alpha", mode=0o640),
        f("./work/run.sh", b"#!/bin/sh\n", mode=0o4755),  # setuid is dropped
        sym("./work/link", "a.txt"),
        sym("./up", "work/../work/a.txt"),
        hard("./work/hard", "./work/a.txt"),
        d("./ro", mode=0o555),
        f("./ro/inner.txt", b"inner"),
        f("./deep/er/file", b"parents are made"),
    )
    stats = safe_extract(iter([data[i:i + 1000] for i in range(0, len(data), 1000)]), dest)
    assert (dest / "work" / "a.txt").read_bytes() == b"alpha"
    assert stat.S_IMODE(os.stat(dest / "work" / "a.txt").st_mode) == 0o640
    assert stat.S_IMODE(os.stat(dest / "work" / "run.sh").st_mode) == 0o755
    assert os.readlink(dest / "work" / "link") == "a.txt"
    assert (dest / "up").read_bytes() == b"alpha"
    assert os.stat(dest / "work" / "hard").st_ino == os.stat(dest / "work" / "a.txt").st_ino
    assert (dest / "ro" / "inner.txt").read_bytes() == b"inner"
    assert stat.S_IMODE(os.stat(dest / "ro").st_mode) == 0o755  # owner keeps write
    assert (dest / "deep" / "er" / "file").read_bytes() == b"parents are made"
    assert os.stat(dest / "work" / "a.txt").st_mtime == 1_700_000_000
    assert stats.files == 4 and stats.links == 3
    check_tar(data)  # the read-only pass agrees


def test_extracting_twice_overwrites(box):
    dest = box / "dest"
    safe_extract(make_tar(f("a.txt", b"one"), sym("l", "a.txt")), dest)
    safe_extract(make_tar(f("a.txt", b"two"), f("l", b"now a file")), dest)
    assert (dest / "a.txt").read_bytes() == b"two"
    assert not (dest / "l").is_symlink() and (dest / "l").read_bytes() == b"now a file"
