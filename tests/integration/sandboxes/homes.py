"""Homes as tar and as checkpoint files, for the tests of restored and forked
homes (test_host_home.py, test_tree_home.py, test_tree_home_local.py)."""

from __future__ import annotations

import io
import tarfile

import zstandard

LISTING = ("find /root -path /root/.alineo -prune -o -printf '%P %U %G %m %y %l\\n' | sort; "
           "cat /root/w/a.txt /root/w/hard")


def tar_of(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, data, kw in entries:
            info = tarfile.TarInfo(name)
            info.type, info.mtime, info.size = kind, 1_700_000_000, len(data)
            for key, value in {"mode": 0o644, **kw}.items():
                setattr(info, key, value)
            tf.addfile(info, io.BytesIO(data) if data else None)
    return buf.getvalue()


def home_tar() -> bytes:
    return tar_of([
        (".", tarfile.DIRTYPE, b"", {"mode": 0o700}),
        ("./w", tarfile.DIRTYPE, b"", {"mode": 0o755, "uid": 1000, "gid": 1000}),
        ("./w/a.txt", tarfile.REGTYPE, b"alpha\n", {"mode": 0o604, "uid": 1000, "gid": 1000}),
        ("./w/hard", tarfile.LNKTYPE, b"", {"linkname": "./w/a.txt", "mode": 0o604,
                                            "uid": 1000, "gid": 1000}),
        ("./w/link", tarfile.SYMTYPE, b"", {"linkname": "a.txt", "mode": 0o777}),
    ])


def checkpoint_of(tmp_path, data: bytes, name: str = "home") -> str:
    path = tmp_path / f"{name}-turn-1.tar.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(data))
    return str(path)
