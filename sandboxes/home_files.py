"""Reading an agent's home out of a turn checkpoint (a zstd tar that came from
inside a sandbox: untrusted), for the dashboard's Files view, without a sandbox.

* :func:`listing` — every member: a clean relative name (no ``..``, not
  absolute, no NUL), its kind, size and a digest of its content, bounded in
  members and in bytes read. Members that break the rules are skipped and
  counted, never followed: nothing here touches the file system but the
  checkpoint file itself.
* :func:`read_file` — one regular file's first bytes (at most ``limit``), and
  whether it looks binary.
* :func:`changes` — what changed between two listings (added, removed, changed).

Listings are cached by (path, size, mtime): a checkpoint file never changes.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import threading
from collections import OrderedDict
from typing import NamedTuple

from sandboxes.errors import SandboxError, UnsafeArchive
from sandboxes.tar_rules import clean_name

MAX_MEMBERS = 50_000
MAX_READ_BYTES = 2 << 30  # decompressed bytes read for one listing
NAME_MAX = 1024
VIEW_LIMIT = 256 << 10  # the most of one file shown
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 8
_LOCK = threading.Lock()


class HomeUnreadable(SandboxError):
    """The checkpoint file cannot be read as a zstd tar (or is gone)."""

    permanent_default = True


class Entry(NamedTuple):
    name: str  # relative to the home, "/"-separated, no leading "./"
    kind: str  # "file", "dir", "link", "other"
    size: int
    digest: str  # sha256 of a file's content ("" for others; a link: its target)
    target: str = ""  # a link's target, as written (shown, never followed)


class Listing(NamedTuple):
    entries: dict[str, Entry]
    skipped: int  # members refused (unsafe names, past the bounds)
    truncated: bool  # MAX_MEMBERS or MAX_READ_BYTES reached


class FileView(NamedTuple):
    entry: Entry
    data: bytes
    truncated: bool
    binary: bool


def _kind(member: tarfile.TarInfo) -> str:
    if member.isfile():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym() or member.islnk():
        return "link"
    return "other"


def _name(member: tarfile.TarInfo) -> str | None:
    """The member's clean name ("" for the home itself), None when it is unsafe."""
    try:
        name = clean_name(member.name)
    except UnsafeArchive:
        return None
    return name if len(name) <= NAME_MAX else None


def _open(path):
    import zstandard

    fh = open(path, "rb")
    return fh, tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(fh), mode="r|")


def _errors():
    import zstandard

    return (OSError, tarfile.TarError, zstandard.ZstdError, EOFError)


def listing(path: str | os.PathLike) -> Listing:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise HomeUnreadable(f"the checkpoint file is gone: {exc}") from exc
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    result = _read_listing(path)
    with _LOCK:
        _CACHE[key] = result
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def _read_listing(path) -> Listing:
    entries: dict[str, Entry] = {}
    skipped, read, truncated = 0, 0, False
    try:
        fh, tar = _open(path)
        with fh, tar:
            for member in tar:
                name = _name(member)
                if not name:
                    skipped += name is None  # the home itself ("./") is no entry
                    continue
                if len(entries) >= MAX_MEMBERS or read + max(member.size, 0) > MAX_READ_BYTES:
                    truncated = True
                    break
                kind, digest = _kind(member), ""
                if kind == "file":
                    digest, n = _digest(tar.extractfile(member))
                    read += n
                elif kind == "link":
                    digest = "link:" + member.linkname[:NAME_MAX]
                entries[name] = Entry(name, kind, max(member.size, 0) if kind == "file" else 0,
                                      digest, member.linkname[:NAME_MAX] if kind == "link" else "")
    except _errors() as exc:
        raise HomeUnreadable(f"cannot read the checkpoint: {exc}") from exc
    return Listing(entries, skipped, truncated)


def _digest(fileobj) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    while chunk := fileobj.read(1 << 20):
        h.update(chunk)
        n += len(chunk)
    return h.hexdigest(), n


def looks_binary(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return True
    try:
        data[:8192].decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(data[:8192]) - 4  # a character cut at the end is still text
    return False


def read_file(path: str | os.PathLike, name: str, limit: int = VIEW_LIMIT) -> FileView | None:
    """The regular file `name` of the checkpoint (its first `limit` bytes), or None."""
    try:
        fh, tar = _open(path)
        with fh, tar:
            for member in tar:
                if _name(member) != name:
                    continue
                if not member.isfile():
                    return None
                data = tar.extractfile(member).read(limit + 1)
                entry = Entry(name, "file", max(member.size, 0), "")
                return FileView(entry, data[:limit], len(data) > limit or member.size > limit,
                                looks_binary(data[:limit]))
    except _errors() as exc:
        raise HomeUnreadable(f"cannot read the checkpoint: {exc}") from exc
    return None


class Change(NamedTuple):
    name: str
    what: str  # "added", "removed", "changed"
    before: Entry | None
    after: Entry | None


def changes(before: Listing | None, after: Listing) -> list[Change]:
    """What `after` changed from `before` (None: everything is new), by name, files and links."""
    old = before.entries if before is not None else {}
    out = []
    for name in sorted(set(old) | set(after.entries)):
        a, b = old.get(name), after.entries.get(name)
        if (a or b).kind == "dir" and (a is None or b is None or a.kind == b.kind):
            continue  # directories show through their files
        if a is None:
            out.append(Change(name, "added", None, b))
        elif b is None:
            out.append(Change(name, "removed", a, None))
        elif (a.kind, a.digest) != (b.kind, b.digest):
            out.append(Change(name, "changed", a, b))
    return out
