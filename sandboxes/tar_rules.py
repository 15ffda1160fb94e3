"""The extraction rules for tar archives that come from code we do not trust:
what one entry may be, judged from the archive alone (nothing here reads or
writes the disk). :class:`TarRules` is the one implementation of them; every
reader in sandboxes/safe_tar.py (``check_tar``, ``validated_tar``,
``safe_extract``) passes each member through it.

An entry is refused when its name is absolute, has a ``..`` component or a
NUL byte; when it is a device file, a fifo or of an unknown type; when it is
sparse, has a negative size, or is a header-only type that claims data; when
it would be written through a symlink the archive made; when it is a symlink
that leads outside the destination (also through chains of the archive's own
links, and also when a later entry changes where an earlier link leads); or
when it is a hardlink to the destination itself or through a symlink.
"""

from __future__ import annotations

import posixpath
import tarfile
from dataclasses import dataclass

from sandboxes.errors import UnsafeArchive

_MAX_LINK_HOPS = 40


@dataclass
class ExtractStats:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0


def unsafe_entry(name: str, why: str) -> UnsafeArchive:
    return UnsafeArchive(f"unsafe archive entry {name!r}: {why}; nothing was written outside the destination")


def clean_name(name: str) -> str:
    """A member name as a normalised path relative to the destination ('' is the
    destination itself). Absolute names and any ``..`` component are refused."""
    if "\x00" in name:
        raise unsafe_entry(name, "NUL byte in the name")
    if name.startswith("/") or name.startswith("\\"):
        raise unsafe_entry(name, "absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise unsafe_entry(name, "'..' component escapes the destination")
    return "/".join(p for p in parts if p not in ("", "."))


def _resolve(path: str, links: dict[str, str], seen: set[str] | None = None) -> str | None:
    """Resolve ``path`` (relative to the destination) following the archive's own
    symlinks, purely lexically. None when it leaves the destination or loops."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if not stack:
                return None
            stack.pop()
            continue
        current = "/".join([*stack, part])
        if seen is not None:
            seen.add(current)
        target = links.get(current)
        if target is not None:
            hops += 1
            if hops > _MAX_LINK_HOPS or target.startswith("/"):
                return None
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        stack.append(part)
    return "/".join(stack)


def _check_symlink(name: str, target: str, links: dict[str, str],
                   seen: set[str] | None = None) -> None:
    if not target:
        raise unsafe_entry(name, "symlink with an empty target")
    if target.startswith("/"):
        raise unsafe_entry(name, f"symlink to the absolute path {target!r} points outside")
    if _resolve(posixpath.join(posixpath.dirname(name), target), links, seen) is None:
        raise unsafe_entry(name, f"symlink to {target!r} points outside the destination")


def _check_member_type(member: tarfile.TarInfo, name: str) -> None:
    if member.ischr() or member.isblk():
        raise unsafe_entry(member.name, "device files are not allowed")
    if member.isfifo():
        raise unsafe_entry(member.name, "fifos are not allowed")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise unsafe_entry(member.name, f"unsupported member type {member.type!r}")


def _under_link(name: str, links: dict[str, str]) -> str | None:
    """The first parent of ``name`` that the archive made a symlink, if any."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in links:
            return parent
    return None


def _check_hardlink(member: tarfile.TarInfo, links: dict[str, str]) -> str:
    source = clean_name(member.linkname)
    if not source:
        raise unsafe_entry(member.name, "hardlink to the destination itself")
    via = _under_link(source, links) or (source if source in links else None)
    if via is not None:
        raise unsafe_entry(member.name, f"hardlink through the symlink {via!r}")
    return source


def _is_sparse(member: tarfile.TarInfo) -> bool:
    """Sparse in any of its encodings: an old GNU sparse header, a sparse map
    that tarfile read, or GNU.sparse.* pax records. tarfile applies some of
    those records (a name, a size) even without a sparse map, where the Docker
    engine ignores them: the entry would have another name or length there."""
    return (member.type == tarfile.GNUTYPE_SPARSE
            or getattr(member, "sparse", None) is not None
            or any(key.startswith("GNU.sparse.") for key in getattr(member, "pax_headers", {})))


def _check_header(member: tarfile.TarInfo) -> str:
    """The rules one header can be judged by alone; returns the member's clean name."""
    name = clean_name(member.name)
    _check_member_type(member, name)
    if member.size < 0:
        # A base-256 size field or a pax record can be negative: validated_tar,
        # stepping over the data by that size, would step back and loop.
        raise unsafe_entry(member.name, f"negative size {member.size}")
    if _is_sparse(member):
        raise unsafe_entry(member.name, "sparse files are not supported")
    if not member.isreg() and member.size:
        # Only a regular file's data is skipped by a reader; anything else that
        # claims data would have that data read as the next header.
        raise unsafe_entry(member.name, "a header-only entry claims data")
    return name


def _count(stats: ExtractStats, member: tarfile.TarInfo) -> None:
    if member.issym() or member.islnk():
        stats.links += 1
    elif member.isdir():
        stats.dirs += 1
    else:
        stats.files += 1
        stats.bytes += member.size


class TarRules:
    """The extraction rules as a read-only, incremental pass over members: the
    one implementation that :func:`check_tar`, :func:`validated_tar` and
    :func:`safe_extract` all apply.

    After every :meth:`check` all symlinks seen so far are known to stay inside
    the destination: a later entry that changes a path some earlier link's
    resolution went through (a new link there, or a link replaced) re-checks
    every link. So a stream can be forwarded member by member, each one only
    after it passed (:func:`validated_tar`)."""

    def __init__(self, max_bytes: int | None = None, max_members: int | None = None):
        self.stats = ExtractStats()
        self.links: dict[str, str] = {}
        self.traversed: set[str] = set()
        # A home is the sandbox's to fill: a restore must not fill the host's disk.
        self.max_bytes, self.max_members = max_bytes, max_members

    def check(self, member: tarfile.TarInfo) -> str:
        """Refuse ``member`` (UnsafeArchive) or record it; returns its clean
        name ('' for the destination itself, which is otherwise ignored)."""
        name = _check_header(member)
        if name == "":
            return name
        via = _under_link(name, self.links)
        if via is not None:
            raise unsafe_entry(member.name, f"would be written through the symlink {via!r}")
        if member.islnk():
            _check_hardlink(member, self.links)
        if member.issym():
            self._add_symlink(name, member.linkname)
        elif self.links.pop(name, None) is not None:  # a symlink replaced by another entry
            self._links_changed(name)
        _count(self.stats, member)
        self._check_size(member)
        return name

    def _check_size(self, member: tarfile.TarInfo) -> None:
        s = self.stats
        if self.max_bytes is not None and s.bytes > self.max_bytes:
            raise unsafe_entry(member.name, f"takes the archive past {self.max_bytes} bytes of "
                                            "files (the restore size cap, ALINEO_RESTORE_MAX_BYTES)")
        if self.max_members is not None and s.files + s.dirs + s.links > self.max_members:
            raise unsafe_entry(member.name, f"is past {self.max_members} entries (the restore "
                                            "cap, ALINEO_RESTORE_MAX_ENTRIES)")

    def _add_symlink(self, name: str, target: str) -> None:
        self.links[name] = target
        self._check_link(name, target)
        self._links_changed(name)

    def _check_link(self, name: str, target: str) -> None:
        _check_symlink(name, target, self.links, self.traversed)

    def _links_changed(self, name: str) -> None:
        if name in self.traversed:
            self.traversed = set()
            for link, target in self.links.items():
                self._check_link(link, target)
