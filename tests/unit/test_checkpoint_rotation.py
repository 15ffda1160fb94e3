"""Turn checkpoints: file names, atomic store, rotation of files and rows (newest 3 kept)."""

from __future__ import annotations

import io
import os
import tarfile
from datetime import timedelta
from types import SimpleNamespace

import pytest
import zstandard
from django.utils import timezone

from sandboxes import archive as cp
from sandboxes import safe_tar
from sessions.worker import checkpoints as worker_checkpoints
from sandboxes.backends.local import LocalBackend
from sandboxes.errors import UnsafeArchive


def _touch(folder, sid, turn, mtime=None):
    p = cp.checkpoint_path("agent1", sid, turn, root=folder)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x" * turn)
    if mtime is not None:
        os.utime(p, (mtime, mtime))
    return p


def test_checkpoint_path_layout_and_refusals(tmp_path):
    p = cp.checkpoint_path("ag_1", "abc123", 7, root=tmp_path)
    assert p == tmp_path / "ag_1" / "abc123-turn-7.tar.zst"
    assert cp.turn_of(p) == 7
    for bad in ("../x", "a/b", "", ".hidden"):
        with pytest.raises(ValueError):
            cp.checkpoint_path(bad, "abc", 1, root=tmp_path)
        with pytest.raises(ValueError):
            cp.checkpoint_path("ag", bad, 1, root=tmp_path)
    with pytest.raises(ValueError):
        cp.checkpoint_path("ag", "abc", -1, root=tmp_path)


def test_rotate_keeps_the_newest_three_by_turn(tmp_path):
    # mtimes deliberately disagree with the turns: the turn in the name decides.
    paths = [_touch(tmp_path, "sb", t, mtime=1_000_000 - t) for t in (1, 2, 10, 3, 11)]
    deleted = cp.rotate(paths, keep=3)
    assert [cp.turn_of(p) for p in deleted] == [1, 2]  # oldest first
    assert sorted(cp.turn_of(p) for p in paths if p.exists()) == [3, 10, 11]
    assert cp.rotate([p for p in paths if p.exists()], keep=3) == []  # idempotent


def test_rotate_tolerates_missing_files_and_keep_zero(tmp_path):
    paths = [_touch(tmp_path, "sb", t) for t in (1, 2)]
    paths[0].unlink()
    assert cp.rotate(paths, keep=1) == [paths[0]]
    assert paths[1].exists()
    assert cp.rotate(paths[1:], keep=0) == [paths[1]] and not paths[1].exists()
    with pytest.raises(ValueError):
        cp.rotate(paths, keep=-1)


def test_rotate_rows_skips_deleted_rows_and_orders_by_turn_then_time(tmp_path):
    now = timezone.now()
    rows = []
    for i, turn in enumerate([1, 2, 3, 4, 5]):
        p = _touch(tmp_path, "sb", turn)
        rows.append(SimpleNamespace(pk=i + 1, turn=turn, path=str(p), deleted_at=None,
                                    created_at=now + timedelta(seconds=i)))
    rows[4].deleted_at = now  # already rotated away: neither counted nor returned
    doomed = cp.rotate_rows(rows, keep=3)
    assert [r.turn for r in doomed] == [1]
    assert not os.path.exists(rows[0].path)
    assert all(os.path.exists(r.path) for r in rows[1:4])


@pytest.mark.django_db
def test_rotate_checkpoints_marks_rows_and_deletes_files(agent, tmp_path):
    from sessions.models import Checkpoint

    expires = timezone.now() + timedelta(days=30)
    for turn in range(1, 6):
        p = _touch(tmp_path, "sb1", turn)
        Checkpoint.objects.create(agent=agent, sandbox_id="sb1", turn=turn, through_seq=turn * 10,
                                  path=str(p), bytes=turn, expires_at=expires)
    other = _touch(tmp_path, "sb0", 1)  # another sandbox of the agent: not rotated with sb1
    Checkpoint.objects.create(agent=agent, sandbox_id="sb0", turn=1, through_seq=1,
                              path=str(other), expires_at=expires)
    ids = worker_checkpoints.rotate(agent.id, "sb1", keep=3)
    gone = Checkpoint.objects.filter(pk__in=ids)
    assert sorted(gone.values_list("turn", flat=True)) == [1, 2]
    assert all(r.deleted_at is not None and not os.path.exists(r.path) for r in gone)
    live = Checkpoint.objects.filter(sandbox_id="sb1", deleted_at__isnull=True)
    assert sorted(live.values_list("turn", flat=True)) == [3, 4, 5]
    assert other.exists()
    assert worker_checkpoints.rotate(agent.id, "sb1", keep=3) == []


@pytest.fixture
def local_box(tmp_path):
    backend = LocalBackend(root=tmp_path / "sandboxes")
    sid = backend.create("agent1", "host")
    backend.start(sid)
    yield backend, sid
    backend.remove(sid)


def test_store_and_restore_a_checkpoint_locally(local_box, tmp_path):
    backend, sid = local_box
    home = backend.host_home(sid)
    os.makedirs(os.path.join(home, "work"))
    os.makedirs(os.path.join(home, ".cache"))
    with open(os.path.join(home, "work", "a.txt"), "w") as fh:
        fh.write("hello")
    with open(os.path.join(home, ".cache", "big"), "wb") as fh:
        fh.write(b"\0" * 100_000)
    root = tmp_path / "cps"
    stored = cp.store_checkpoint(backend, sid, "agent1", 4, root=root)
    path, size, ms = stored
    assert path == root / "agent1" / f"{sid}-turn-4.tar.zst" and path.stat().st_size == size
    assert ms >= 0 and not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb")).read()
    names = tarfile.open(fileobj=io.BytesIO(raw)).getnames()
    assert "./work/a.txt" in names and not any(".cache" in n for n in names)

    fresh = backend.create("agent1", "host")
    try:
        assert cp.restore_checkpoint(backend, fresh, path) >= 0
        with open(os.path.join(backend.host_home(fresh), "work", "a.txt")) as fh:
            assert fh.read() == "hello"
    finally:
        backend.remove(fresh)


def test_a_failed_store_leaves_no_file(tmp_path):
    class Broken:
        def read_home(self, sandbox_id):
            yield b"partial"
            raise RuntimeError("tar died")

    with pytest.raises(RuntimeError):
        cp.store_checkpoint(Broken(), "sb", "agent1", 1, root=tmp_path)
    assert list((tmp_path / "agent1").iterdir()) == []


def test_restoring_a_crafted_checkpoint_is_refused(local_box, tmp_path):
    backend, sid = local_box
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    with pytest.raises(UnsafeArchive):
        cp.restore_checkpoint(backend, sid, bad)
    assert not os.path.exists(os.path.join(os.path.dirname(backend.host_home(sid)), "escaped"))


# --- validated_tar: the check the docker backend runs while it streams --------------------
def _pieces(data: bytes, size: int):
    return [data[i:i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 511, 4096, 1 << 20])
def test_validated_tar_passes_a_good_archive_through_unchanged(tmp_path, size):
    from tests.unit.test_safe_extract import d, f, hard, make_tar, sym

    long = "deep/" + "x" * 150 + "/file.txt"  # a GNU long name / pax header group
    data = make_tar(d("w"), f("w/a.txt", b"a" * 1000), sym("w/l", "a.txt"), hard("w/h", "w/a.txt"),
                    f(long, b"long"), f("w/empty", b""))
    out = b"".join(safe_tar.validated_tar(_pieces(data, size)))
    names = tarfile.open(fileobj=io.BytesIO(out)).getnames()
    assert names == tarfile.open(fileobj=io.BytesIO(data)).getnames()
    assert tarfile.open(fileobj=io.BytesIO(out)).extractfile(long).read() == b"long"


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_validated_tar_reads_every_tar_format(fmt):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i in range(3):
            info = tarfile.TarInfo(f"dir{'y' * 60}/{'z' * 40}/f{i}")
            info.size = 5
            tf.addfile(info, io.BytesIO(b"hello"))
    out = b"".join(safe_tar.validated_tar([buf.getvalue()]))
    assert len(tarfile.open(fileobj=io.BytesIO(out)).getnames()) == 3


def test_validated_tar_refuses_what_check_tar_refuses_before_yielding_the_entry(tmp_path):
    from tests.unit.test_safe_extract import BAD

    for case, build in sorted(BAD.items()):
        data = build(tmp_path / f"outside-{case}")
        got = []
        with pytest.raises(UnsafeArchive):
            for piece in safe_tar.validated_tar(_pieces(data, 700)):
                got.append(piece)
        # Whatever was yielded before the refusal checks clean on its own.
        if got:
            safe_tar.check_tar(b"".join(got) + bytes(1024))


def test_validated_tar_refuses_truncated_streams():
    from tests.unit.test_safe_extract import f, make_tar

    data = make_tar(f("a.txt", b"x" * 5000))
    with pytest.raises(UnsafeArchive):
        list(safe_tar.validated_tar([data[:2000]]))
    with pytest.raises(UnsafeArchive):
        list(safe_tar.validated_tar([data[:512 + 5120]]))  # no end-of-archive marker


def _extension_header(size: int, kind=tarfile.XHDTYPE, payload: bytes = b"") -> bytes:
    info = tarfile.TarInfo("././@LongLink" if kind in (b"L", b"K") else "././@PaxHeader")
    info.type, info.size = kind, size
    header = info.tobuf(tarfile.GNU_FORMAT if kind in (b"L", b"K") else tarfile.USTAR_FORMAT)
    return header + payload + bytes(-len(payload) % 512)


def _ext(kind, payload: bytes) -> bytes:
    return _extension_header(len(payload), kind, payload)


def _pax(kind=tarfile.XHDTYPE, **records) -> bytes:
    body = b""
    for key, value in records.items():
        record = f" {key}={value}\n".encode()
        n = len(record) + 1
        while len(str(n)) + len(record) != n:
            n += 1
        body += str(n).encode() + record
    return _ext(kind, body)


def _entry(name, kind=tarfile.REGTYPE, linkname="") -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    info.size = 5 if kind == tarfile.REGTYPE else 0
    return info.tobuf(tarfile.USTAR_FORMAT) + (b"hello" + bytes(507) if info.size else b"")


# Each one names its entry differently for tarfile than for the Docker engine
# (Go's archive/tar: a global header is ignored, of two extension headers the
# last one counts, a GNU long name or link beats a pax record).
AMBIGUOUS = {
    "global-pax-header": _pax(tarfile.XGLTYPE, path="checked.txt") + _entry("written.txt"),
    "two-pax-headers": _pax(path="checked.txt") + _pax(path="written.txt") + _entry("plain.txt"),
    "two-long-names": _ext(b"L", b"checked.txt\0") + _ext(b"L", b"written.txt\0") + _entry("plain"),
    "pax-path-then-long-name": _pax(path="checked.txt") + _ext(b"L", b"written.txt\0") + _entry("p"),
    "long-name-then-pax-path": _ext(b"L", b"written.txt\0") + _pax(path="checked.txt") + _entry("p"),
    "pax-linkpath-then-long-link": _pax(linkpath="inside") + _ext(b"K", b"/etc\0")
    + _entry("l", tarfile.SYMTYPE, "inside"),
}


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
def test_validated_tar_refuses_headers_that_other_readers_read_otherwise(case):
    with pytest.raises(UnsafeArchive):
        list(safe_tar.validated_tar([AMBIGUOUS[case] + bytes(1024)]))


def test_validated_tar_passes_a_long_name_with_a_long_link_target():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        tf.addfile(tarfile.TarInfo("d" * 120))
        link = tarfile.TarInfo("l" * 120)
        link.type, link.linkname = tarfile.SYMTYPE, "d" * 120
        tf.addfile(link)
    out = b"".join(safe_tar.validated_tar([buf.getvalue()]))
    assert [(m.name, m.linkname) for m in tarfile.open(fileobj=io.BytesIO(out))] == [
        ("d" * 120, ""), ("l" * 120, "d" * 120)]


def test_validated_tar_refuses_an_oversized_extension_header_before_reading_it():
    def stream():
        yield _extension_header(64 << 20)
        raise AssertionError("read past a refused extension header")

    with pytest.raises(UnsafeArchive, match="extension header of"):
        list(safe_tar.validated_tar(stream()))


def test_validated_tar_refuses_extension_headers_that_describe_no_entry():
    with pytest.raises(UnsafeArchive, match="extension headers"):
        list(safe_tar.validated_tar([_extension_header(0) + bytes(1024)]))
