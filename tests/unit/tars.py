"""Small tar archives for the unit tests of what reads them
(test_overlay_home.py, test_trees.py)."""

from __future__ import annotations

import io
import tarfile


def tar_of(*members, uid: int = 0, dir_mode: int = 0o755, file_mode: int = 0o644) -> bytes:
    """A PAX tar of ``(name, type, payload)`` members: a link's payload is
    its target, a regular file's its bytes; owners by number only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type, info.mtime, info.uid, info.gid = kind, 1_700_000_000, uid, uid
            info.uname = info.gname = "root"  # by number: never the host's user of that name
            info.mode = dir_mode if kind == tarfile.DIRTYPE else file_mode
            if kind == tarfile.SYMTYPE:
                info.linkname = payload
                tf.addfile(info)
            elif kind == tarfile.REGTYPE:
                info.size = len(payload)
                tf.addfile(info, io.BytesIO(payload))
            else:
                tf.addfile(info)
    return buf.getvalue()
