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


def make_tar(*entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
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


def _with_pax(entry, records):
    info, body = entry
    info.pax_headers = dict(records)
    return info, body


def pax_named(name, data=b"x"):
    """A file whose name is carried by a pax header (where any byte can stand)."""
    info, body = _info("placeholder", data=data)
    info.pax_headers = {"path": name}
    return info, body


def sparse(name, data=b"x"):
    """A sparse file in the pax format (GNU sparse 0.1)."""
    info, body = _info(name, data=data)
    info.pax_headers = {"GNU.sparse.map": f"0,{len(data)}", "GNU.sparse.size": str(len(data))}
    return info, body


def sparse_gnu_old(name):
    """A sparse file as an old GNU sparse header (type 'S')."""
    info, body = _info(name, data=bytes(512))
    info.type = tarfile.GNUTYPE_SPARSE
    return info, body


def sparse_pax_10(name):
    """A sparse file in the pax format 1.0 (GNU tar -S --format=posix): the map leads the data."""
    data = b"1\n0\n1\n".ljust(512, b"\0") + b"x"
    info, body = _info("GNUSparseFile.0/" + name, data=data)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": name, "GNU.sparse.realsize": "1"}
    return info, body


def sized(name, size):
    """A regular file whose header claims ``size`` but carries no data (tarfile
    writes a negative size as a pax record; a base-256 size field can hold one too)."""
    info, _ = _info(name)
    info.size = size
    return info, None


def claims_data(name, kind, linkname=""):
    """A header-only type (directory, link) whose header claims a block of data."""
    info, _ = _info(name, kind, linkname=linkname)
    info.size = 512
    return info, io.BytesIO(bytes(512))


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
    "nul-in-name": lambda out: make_tar(pax_named("ok\x00evil.txt")),
    "absolute-backslash": lambda out: make_tar(f("\\evil.txt")),
    "unknown-type": lambda out: make_tar(_info("volume", b"V")),
    "symlink-empty-target": lambda out: make_tar(sym("l", "")),
    "symlink-loop": lambda out: make_tar(sym("a", "b"), sym("b", "a")),
    # p stays inside while q is a link to a/b; once q is a plain directory, p leads out
    "symlink-replaced-by-dir": lambda out: make_tar(d("a"), d("a/b"), sym("q", "a/b"),
                                                    sym("p", "q/../.."), d("q")),
    "hardlink-to-dest": lambda out: make_tar(hard("h", ".")),
    "sparse-pax": lambda out: make_tar(f("ok.txt"), sparse("holes")),
    "sparse-pax-1.0": lambda out: make_tar(f("ok.txt"), sparse_pax_10("holes")),
    "sparse-gnu-old": lambda out: make_tar(f("ok.txt"), sparse_gnu_old("holes"), fmt=tarfile.GNU_FORMAT),
    # tarfile takes this record for the size even without a sparse map; other
    # readers do not, and the next entry would hide in what tarfile skips
    "sparse-realsize": lambda out: make_tar(_with_pax(f("ok.txt", b""), {"GNU.sparse.realsize": "1024"}),
                                            f("hidden.txt")),
    "sparse-name": lambda out: make_tar(_with_pax(f("../evil.txt"), {"GNU.sparse.name": "ok.txt"})),
    "negative-size": lambda out: make_tar(f("ok.txt"), sized("neg", -256)),
    "dir-claims-data": lambda out: make_tar(claims_data("d", tarfile.DIRTYPE)),
    "symlink-claims-data": lambda out: make_tar(claims_data("l", tarfile.SYMTYPE, "ok.txt")),
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


@pytest.mark.parametrize("target", ["pre", "pre/secret.txt", "missing", "adir"])
def test_hardlink_to_anything_but_a_regular_file_inside_is_refused(box, target):
    dest, outside = box / "dest", box / "outside"
    (dest / "pre").symlink_to(outside if "/" in target else outside / "secret.txt")
    (dest / "adir").mkdir()
    with pytest.raises(UnsafeArchive):
        safe_extract(make_tar(hard("h", target)), dest)
    assert not os.path.lexists(dest / "h")
    assert os.stat(outside / "secret.txt").st_nlink == 1


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


# --- size caps: a restore must not fill the host's disk -------------------------------------


@pytest.mark.parametrize("reader", ["safe_extract", "check_tar", "validated_tar"])
def test_an_archive_past_the_byte_cap_is_refused_naming_it(tmp_path, reader):
    from sandboxes.safe_tar import validated_tar

    data = make_tar(f("a.bin", b"a" * 600), f("b.bin", b"b" * 600))
    caps = (1000, None)
    with pytest.raises(UnsafeArchive, match="ALINEO_RESTORE_MAX_BYTES"):
        if reader == "safe_extract":
            safe_extract(data, tmp_path / "home", caps)
        elif reader == "check_tar":
            check_tar(data, caps=caps)
        else:
            list(validated_tar([data], caps))
    if reader == "safe_extract":  # what came before the refusal stays, nothing past the cap
        assert sorted(p.name for p in (tmp_path / "home").iterdir()) == ["a.bin"]
    assert check_tar(data, caps=(1200, None)).bytes == 1200  # at the cap is fine


def test_an_archive_past_the_entry_cap_is_refused_naming_it(tmp_path):
    data = make_tar(*(f(f"f{i}.txt") for i in range(5)))
    with pytest.raises(UnsafeArchive, match="ALINEO_RESTORE_MAX_ENTRIES"):
        safe_extract(data, tmp_path / "home", (None, 4))
    assert safe_extract(data, tmp_path / "other", (None, 5)).files == 5


def test_a_backend_restore_applies_the_deployment_cap(tmp_path, settings):
    from sandboxes.backends.local import LocalBackend

    settings.ALINEO_RESTORE_MAX_BYTES = 100
    backend = LocalBackend(root=tmp_path / "sandboxes")
    sid = backend.create("agent1", "default")
    try:
        with pytest.raises(UnsafeArchive, match="ALINEO_RESTORE_MAX_BYTES"):
            backend.write_home(sid, [make_tar(f("big.bin", b"x" * 101))])
    finally:
        backend.remove(sid)
