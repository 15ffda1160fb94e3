"""Issue 12 finding 7, as the attack it was, on both real backends: a
checkpoint crafted to fill the disk (a 96-byte sparse member that unpacks to
1.1 GB; a stream of zeros past the cap) is refused before anything is written,
the refusal naming the setting; and a sandbox that makes its own home huge (a
sparse file) gets no checkpoint rather than costing the host a read and
compress of every hole."""

from __future__ import annotations

import io
import tarfile

import pytest
import zstandard

from sandboxes import archive
from sandboxes.errors import UnsafeArchive
from tests.integration.sandboxes.conftest import (  # noqa: F401 - fixtures, by name
    docker_cleanup,
    docker_base_image,
    sandboxes,
)


def _checkpoint(tmp_path, *members: tuple[tarfile.TarInfo, bytes]):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "sb-turn-1.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info, data


def _sparse_bomb(name: str) -> tuple[tarfile.TarInfo, bytes]:
    """GNU sparse 0.1 in pax: one data byte, a map that says 1.1 GB."""
    info, data = _file(name, b"x")
    info.pax_headers = {"GNU.sparse.map": f"{1_100_000_000},1",
                        "GNU.sparse.size": str(1_100_000_001)}
    return info, data


def _listing(backend, sid) -> str:
    return backend.exec(sid, ["sh", "-c", "cd \"$HOME\" && ls -A && du -sk ."]).stdout.decode()


def _names_and_kb(backend, sid) -> tuple[list[str], int]:
    *names, du = _listing(backend, sid).splitlines()
    return names, int(du.split()[0])


def test_a_sparse_bomb_is_refused_and_writes_nothing(sandboxes, tmp_path):
    b = sandboxes.backend
    sid = sandboxes.started()
    path = _checkpoint(tmp_path, _file("ok.txt", b"fine"), _sparse_bomb("bomb"))
    assert path.stat().st_size < 400
    with pytest.raises(UnsafeArchive, match="sparse"):
        archive.restore_checkpoint(b, sid, path)
    # The bomb was never written (a member before it may have been: a refused
    # restore's sandbox is removed whole, sandboxes/launch.py build_fresh).
    names, used_kb = _names_and_kb(b, sid)
    assert "bomb" not in names and used_kb < 1024


def test_a_home_past_the_byte_cap_is_refused_naming_the_setting(sandboxes, tmp_path, settings):
    settings.ALINEO_RESTORE_MAX_BYTES = 1_000_000
    b = sandboxes.backend
    sid = sandboxes.started()
    before = _listing(b, sid)
    path = _checkpoint(tmp_path, _file("zeros", b"\0" * 2_000_000))
    assert path.stat().st_size < 2_000  # zeros compress: the file says nothing of its size
    with pytest.raises(UnsafeArchive, match="ALINEO_RESTORE_MAX_BYTES"):
        archive.restore_checkpoint(b, sid, path)
    assert _listing(b, sid) == before


def test_a_home_made_huge_by_its_sandbox_is_not_checkpointed(sandboxes, tmp_path, settings):
    settings.ALINEO_RESTORE_MAX_BYTES = 5_000_000
    b = sandboxes.backend
    sid = sandboxes.started()
    assert b.exec(sid, ["sh", "-c", "truncate -s 4G \"$HOME/holes\" && echo small > \"$HOME/a\""]).ok
    with pytest.raises(archive.HomeTooLarge, match="ALINEO_RESTORE_MAX_BYTES"):
        archive.store_checkpoint(b, sid, "agent-1", 1, root=tmp_path / "cps")
    assert not list((tmp_path / "cps").rglob("*"))[1:]  # the agent dir at most, no file
    # Under the cap the same home checkpoints: it is the size, not the file, refused.
    assert b.exec(sid, ["sh", "-c", "rm \"$HOME/holes\""]).ok
    stored = archive.store_checkpoint(b, sid, "agent-1", 1, root=tmp_path / "cps")
    assert stored.path.exists()
