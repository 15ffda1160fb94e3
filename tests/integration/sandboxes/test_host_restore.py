"""A checkpoint written into a created, never-started container from the host
(sandboxes/backends/overlay.py) gives the home the engine's put_archive gives,
and refuses what put_archive's checked stream refuses."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sandboxes.backends import overlay
from sandboxes.errors import UnsafeArchive

LISTING = "find /root -path /root/.alineo -prune -o -printf '%P %U %G %m %y %l\\n' | sort; " \
          "cat /root/w/a.txt /root/w/hard"


def _home_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def add(name, kind=tarfile.REGTYPE, data=b"", **kw):
            info = tarfile.TarInfo(name)
            info.type, info.mtime, info.size = kind, 1_700_000_000, len(data)
            for key, value in {"mode": 0o644, **kw}.items():
                setattr(info, key, value)
            tf.addfile(info, io.BytesIO(data) if data else None)
        add(".", tarfile.DIRTYPE, mode=0o700)
        add("./w", tarfile.DIRTYPE, mode=0o755, uid=1000, gid=1000, uname="root")
        add("./w/a.txt", data=b"alpha\n", mode=0o604, uid=1000, gid=1000)
        add("./w/hard", tarfile.LNKTYPE, linkname="./w/a.txt", mode=0o604, uid=1000, gid=1000)
        add("./w/link", tarfile.SYMTYPE, linkname="a.txt", mode=0o777)
        add("./w/run.sh", data=b"#!/bin/sh\necho run\n", mode=0o755)
    return buf.getvalue()


@pytest.fixture
def spy(monkeypatch):
    calls = []
    real = overlay.tar_in

    def tar_in(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(overlay, "tar_in", tar_in)
    return calls


def test_the_host_side_restore_gives_the_home_put_archive_gives(docker_sandboxes, spy, settings):
    b = docker_sandboxes.backend
    fast = docker_sandboxes.create("agent-fast")
    b.write_home(fast, [_home_tar()])
    assert spy == [fast]
    # A second write into the same created container (the session file after
    # the checkpoint) finds the layer written: the engine's path takes it.
    b.write_home(fast, [_session_tar()])
    assert spy == [fast]
    settings.ALINEO_DOCKER_HOST_TAR = False
    slow = docker_sandboxes.create("agent-slow")
    b.write_home(slow, [_home_tar()])
    b.write_home(slow, [_session_tar()])
    assert spy == [fast]
    listings = []
    for sid in (fast, slow):
        b.start(sid)
        listings.append(b.exec(sid, ["sh", "-c", LISTING]).text)
        assert b.exec(sid, ["cat", ".alineo/session.json"]).stdout == b"{}"
    assert listings[0] == listings[1]
    assert "w 1000 1000 755 d" in listings[0] and "w/a.txt 1000 1000 604 f" in listings[0]
    assert "w/link 0 0 777 l a.txt" in listings[0] and listings[0].endswith("alpha\nalpha\n")


def test_a_container_that_runs_or_ran_takes_the_engines_path(docker_sandboxes, spy):
    b = docker_sandboxes.backend
    sid = docker_sandboxes.started("agent-running")
    b.write_home(sid, [_home_tar()])
    b.stop(sid, timeout=2)
    b.write_home(sid, [_session_tar()])
    assert spy == []
    b.start(sid)
    assert b.exec(sid, ["cat", "w/a.txt", ".alineo/session.json"]).stdout == b"alpha\n{}"


def test_the_host_side_restore_refuses_an_escaping_archive(docker_sandboxes, spy):
    b = docker_sandboxes.backend
    sid = docker_sandboxes.create("agent-evil")
    upper = b.inspect(sid)["GraphDriver"]["Data"]["UpperDir"]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        link = tarfile.TarInfo("./etc")
        link.type, link.linkname = tarfile.SYMTYPE, "../../etc"
        tf.addfile(link)
        evil = tarfile.TarInfo("./etc/escaped")
        evil.size = 1
        tf.addfile(evil, io.BytesIO(b"x"))
    with pytest.raises(UnsafeArchive):
        b.write_home(sid, [buf.getvalue()])
    assert spy == [sid]
    assert os.listdir(upper) == ["root"] and os.listdir(os.path.join(upper, "root")) == []
    b.start(sid)
    assert not b.exec(sid, ["test", "-e", "/etc/escaped"]).ok


def _session_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        d = tarfile.TarInfo("./.alineo")
        d.type, d.mode = tarfile.DIRTYPE, 0o700
        tf.addfile(d)
        f = tarfile.TarInfo("./.alineo/session.json")
        f.size = 2
        tf.addfile(f, io.BytesIO(b"{}"))
    return buf.getvalue()


def test_the_host_side_restore_refuses_bombs_before_writing_them(docker_sandboxes, spy, settings,
                                                                 tmp_path):
    """tests/security/test_restore_bombs.py's checkpoints, into created containers."""
    import zstandard

    from sandboxes import archive

    def checkpoint(info, data):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            tf.addfile(info, io.BytesIO(data))
        path = tmp_path / f"{info.name}-turn-1.tar.zst"
        path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
        return path

    b = docker_sandboxes.backend
    sparse = tarfile.TarInfo("bomb")
    sparse.size = 1
    sparse.pax_headers = {"GNU.sparse.map": "1100000000,1", "GNU.sparse.size": "1100000001"}
    zeros = tarfile.TarInfo("zeros")
    zeros.size = 2_000_000
    settings.ALINEO_RESTORE_MAX_BYTES = 1_000_000
    for info, data, match in ((sparse, b"x", "sparse"), (zeros, bytes(2_000_000), "ALINEO_RESTORE_MAX_BYTES")):
        sid = docker_sandboxes.create(f"agent-{info.name}")
        upper = b.inspect(sid)["GraphDriver"]["Data"]["UpperDir"]
        with pytest.raises(UnsafeArchive, match=match):
            archive.restore_checkpoint(b, sid, checkpoint(info, data))
        assert os.listdir(os.path.join(upper, "root")) == []
    assert len(spy) == 2
