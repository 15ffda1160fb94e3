"""sandboxes/backends/overlay.py: when a checkpoint may be written straight
into a container's writable layer from the host, and how. The engine is not
needed: the container's description is a dict, its upper dir a temp dir."""

from __future__ import annotations

import os
import tarfile

import pytest

from sandboxes.backends import overlay
from sandboxes.errors import UnsafeArchive
from tests.unit.tars import tar_of

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the host-side paths are root's")


def _info(upper, *, status="created", started="0001-01-01T00:00:00Z", mounts=(),
          driver="overlay2"):
    return {"State": {"Status": status, "StartedAt": started},
            "GraphDriver": {"Name": driver, "Data": {"UpperDir": str(upper)}},
            "Mounts": [{"Destination": m} for m in mounts]}


def _tar(*members) -> bytes:
    return tar_of(*members, uid=1000, dir_mode=0o750, file_mode=0o640)


@needs_root
def test_a_fresh_created_container_gets_an_empty_home_in_its_upper_dir(tmp_path):
    fd = overlay.upper_home_fd(_info(tmp_path), "/root")
    assert fd is not None
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "root"))
        assert oct((tmp_path / "root").stat().st_mode & 0o777) == "0o700"
    finally:
        os.close(fd)


@needs_root
@pytest.mark.parametrize("why", ["running", "ran once", "volume over the home", "volume at /",
                                 "not overlay2", "not empty", "remapped root", "nested home"])
def test_any_doubt_is_the_engines_path(tmp_path, why):
    info, home = _info(tmp_path), "/root"
    if why == "running":
        info = _info(tmp_path, status="running")
    elif why == "ran once":
        info = _info(tmp_path, started="2026-12-01T10:00:00Z")
    elif why == "volume over the home":
        info = _info(tmp_path, mounts=["/run/alineo", "/root/"])
    elif why == "volume at /":
        info = _info(tmp_path, mounts=["/"])
    elif why == "not overlay2":
        info = _info(tmp_path, driver="vfs")
    elif why == "not empty":
        (tmp_path / "etc").mkdir()
    elif why == "remapped root":
        os.chown(tmp_path, 100000, 100000)
    else:
        home = "/home/agent"
    assert overlay.upper_home_fd(info, home) is None
    assert not (tmp_path / "root").exists()


@needs_root
def test_tar_in_keeps_owners_modes_and_links_by_number(tmp_path):
    fd = overlay.upper_home_fd(_info(tmp_path), "/root")
    overlay.tar_in("sid", fd, [_tar(("./w", tarfile.DIRTYPE, None),
                                    ("./w/a.txt", tarfile.REGTYPE, b"hello"),
                                    ("./w/link", tarfile.SYMTYPE, "a.txt"))], (None, None))
    home = tmp_path / "root"
    st = (home / "w" / "a.txt").stat()
    assert (home / "w" / "link").read_bytes() == b"hello" and os.readlink(home / "w" / "link") == "a.txt"
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1000, 1000, 0o640)
    assert (home / "w").stat().st_mode & 0o777 == 0o750


@needs_root
@pytest.mark.parametrize("evil", [
    [("./out", tarfile.SYMTYPE, "../../.."), ("./out/escaped", tarfile.REGTYPE, b"x")],
    [("../escaped", tarfile.REGTYPE, b"x")],
    [("./abs", tarfile.SYMTYPE, "/etc")],
])
def test_tar_in_refuses_what_would_leave_the_home(tmp_path, evil):
    upper = tmp_path / "upper"
    upper.mkdir()
    fd = overlay.upper_home_fd(_info(upper), "/root")
    archive = _tar(("./ok.txt", tarfile.REGTYPE, b"ok"), *evil)
    with pytest.raises(UnsafeArchive):
        overlay.tar_in("sid", fd, [archive], (None, None))
    assert sorted(os.listdir(tmp_path)) == ["upper"] and os.listdir(upper) == ["root"]
    assert not (upper / "root" / "out").exists() and not (upper / "root" / "abs").exists()
    assert not (upper / "escaped").exists()


@needs_root
def test_tar_in_honours_the_restore_caps(tmp_path):
    fd = overlay.upper_home_fd(_info(tmp_path), "/root")
    archive = _tar(*[(f"./f{i}", tarfile.REGTYPE, b"x") for i in range(5)])
    with pytest.raises(UnsafeArchive):
        overlay.tar_in("sid", fd, [archive], (None, 3))
