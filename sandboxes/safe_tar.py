"""Safe extraction of tar streams that come from code we do not trust.

* :func:`safe_extract` — extract an uncompressed tar stream into a directory,
  refusing every entry that would escape it: ``..`` components, absolute
  paths, symlinks or hardlinks that point outside (also through chains of
  links), members that would be written *through* a symlink, and device or
  fifo files. Nothing is ever written outside ``dest``.
* :func:`check_tar` — the same rules as a read-only pass; :func:`validated_tar`
  checks a stream while passing it on (the docker backend validates before
  handing a stream to the engine).
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
from dataclasses import dataclass
from typing import IO, Iterable, Iterator

from sandboxes.errors import UnsafeArchive

_MAX_LINK_HOPS = 40


@dataclass
class ExtractStats:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0


# --- stream helpers -----------------------------------------------------------------
class _IterReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            try:
                self._buf = bytes(next(self._it))
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def as_fileobj(stream) -> IO[bytes]:
    """bytes, a binary file object or an iterable of byte chunks → a file object."""
    if isinstance(stream, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(stream))
    if hasattr(stream, "read"):
        return stream
    return io.BufferedReader(_IterReader(stream), buffer_size=1 << 20)


def iter_chunks(fileobj, size: int = 1 << 20) -> Iterator[bytes]:
    while True:
        chunk = fileobj.read(size)
        if not chunk:
            return
        yield chunk


# --- rules --------------------------------------------------------------------------
def _refuse(name: str, why: str) -> UnsafeArchive:
    return UnsafeArchive(f"unsafe archive entry {name!r}: {why}; nothing was written outside the destination")


def clean_name(name: str) -> str:
    """A member name as a normalised path relative to the destination ('' is the
    destination itself). Absolute names and any ``..`` component are refused."""
    if "\x00" in name:
        raise _refuse(name, "NUL byte in the name")
    if name.startswith("/") or name.startswith("\\"):
        raise _refuse(name, "absolute path")
    parts = name.split("/")
    if ".." in parts:
        raise _refuse(name, "'..' component escapes the destination")
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
        raise _refuse(name, "symlink with an empty target")
    if target.startswith("/"):
        raise _refuse(name, f"symlink to the absolute path {target!r} points outside")
    if _resolve(posixpath.join(posixpath.dirname(name), target), links, seen) is None:
        raise _refuse(name, f"symlink to {target!r} points outside the destination")


def _check_member_type(member: tarfile.TarInfo, name: str) -> None:
    if member.ischr() or member.isblk():
        raise _refuse(member.name, "device files are not allowed")
    if member.isfifo():
        raise _refuse(member.name, "fifos are not allowed")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _refuse(member.name, f"unsupported member type {member.type!r}")


def _under_link(name: str, links: dict[str, str]) -> str | None:
    """The first parent of ``name`` that the archive made a symlink, if any."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in links:
            return parent
    return None


class _Checker:
    """The extraction rules as a read-only, incremental pass over members.

    After every :meth:`check` all symlinks seen so far are known to stay inside
    the destination: a later entry that changes a path some earlier link's
    resolution went through (a new link there, or a link replaced) re-checks
    every link. So a stream can be forwarded member by member, each one only
    after it passed (:func:`validated_tar`)."""

    def __init__(self):
        self.stats = ExtractStats()
        self.links: dict[str, str] = {}
        self.traversed: set[str] = set()

    def _check_link(self, name: str, target: str) -> None:
        _check_symlink(name, target, self.links, self.traversed)

    def _links_changed(self, name: str) -> None:
        if name in self.traversed:
            self.traversed = set()
            for link, target in self.links.items():
                self._check_link(link, target)

    def check(self, member: tarfile.TarInfo) -> None:
        name = clean_name(member.name)
        _check_member_type(member, name)
        if getattr(member, "sparse", None):
            raise _refuse(member.name, "sparse files are not supported")
        if not member.isreg() and member.size:
            raise _refuse(member.name, "a header-only entry claims data")
        if name == "":
            return
        via = _under_link(name, self.links)
        if via is not None:
            raise _refuse(member.name, f"would be written through the symlink {via!r}")
        if member.issym():
            self.links[name] = member.linkname
            self._check_link(name, member.linkname)
            self._links_changed(name)
            self.stats.links += 1
            return
        if member.islnk():
            _check_hardlink(member, self.links)
            self.stats.links += 1
        elif member.isdir():
            self.stats.dirs += 1
        else:
            self.stats.files += 1
            self.stats.bytes += member.size
        if self.links.pop(name, None) is not None:
            self._links_changed(name)


def check_tar(stream, dest: str = "the destination") -> ExtractStats:
    """Validate a whole tar stream without writing anything; raises UnsafeArchive."""
    checker = _Checker()
    fileobj = as_fileobj(stream)
    seekable = getattr(fileobj, "seekable", lambda: False)()
    # A seekable file is read header by header, seeking over the data.
    with tarfile.open(fileobj=fileobj, mode="r:" if seekable else "r|") as tf:
        for member in tf:
            checker.check(member)
    return checker.stats


_EXTENSION_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK,
                    tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_MAX_EXTENSION = 1 << 20
_ZERO_BLOCK = bytes(512)


def _blocks(size: int) -> int:
    return (size + 511) // 512 * 512


def validated_tar(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Pass an uncompressed tar stream through, member by member, each one only
    after its header passed the extraction rules (the same as :func:`check_tar`);
    raise UnsafeArchive at the first entry that fails, before any of its bytes
    were yielded. Lets a consumer (docker's put_archive) extract while the stream
    is checked, instead of spooling and checking it first. Stops after the
    end-of-archive marker; a stream that ends without one raises."""
    checker = _Checker()
    it = iter(chunks)
    buf, pos, out = b"", 0, 0
    group: int | None = None  # where pending extension headers (long names, pax) began

    def refill(need: int):
        """More bytes until ``need`` are available at pos; returns the validated
        bytes that can go out first (b"" if none)."""
        nonlocal buf, pos, out, group
        safe = pos if group is None else group
        ready = buf[out:safe]
        parts = [buf[safe:]]
        have = len(buf) - safe
        target = pos - safe + need
        while have < target:
            try:
                chunk = next(it)
            except StopIteration:
                raise UnsafeArchive("truncated tar stream: it ends inside an entry or "
                                    "without an end-of-archive marker") from None
            parts.append(bytes(chunk))
            have += len(chunk)
        buf = b"".join(parts)
        pos -= safe
        if group is not None:
            group -= safe
        out = 0
        return ready

    while True:
        if len(buf) - pos < 512:
            ready = refill(512)
            if ready:
                yield ready
        block = buf[pos:pos + 512]
        if block == _ZERO_BLOCK:
            if group is not None:
                raise UnsafeArchive("tar stream ends inside an entry's extension headers")
            if pos > out:
                yield buf[out:pos]
            yield _ZERO_BLOCK * 2
            return
        try:
            header = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
        except tarfile.HeaderError as exc:
            raise UnsafeArchive(f"not a valid tar header at an entry boundary ({exc})") from exc
        if header.type in _EXTENSION_TYPES:
            if header.size > _MAX_EXTENSION:
                raise UnsafeArchive(f"tar extension header of {header.size} bytes refused")
            if group is None:
                group = pos
            total = 512 + _blocks(header.size)
            if len(buf) - pos < total:
                ready = refill(total)
                if ready:
                    yield ready
            pos += total
            continue
        if group is not None:
            try:
                with tarfile.open(fileobj=io.BytesIO(buf[group:pos + 512]), mode="r:") as tf:
                    member = tf.firstmember
            except tarfile.TarError as exc:
                raise UnsafeArchive(f"unreadable tar extension headers ({exc})") from exc
            if member is None:
                raise UnsafeArchive("tar extension headers without an entry")
            group = None
        else:
            member = header
        checker.check(member)
        pos += 512
        skip = _blocks(member.size) if member.isreg() else 0
        while skip:
            avail = len(buf) - pos
            if avail >= skip:
                pos += skip
                break
            pos = len(buf)
            skip -= avail
            if pos > out:
                yield buf[out:pos]
            try:
                buf = bytes(next(it))
            except StopIteration:
                raise UnsafeArchive("truncated tar stream: it ends inside a file's data") from None
            pos = out = 0
        if pos - out >= 1 << 20:
            yield buf[out:pos]
            out = pos


def _check_hardlink(member: tarfile.TarInfo, links: dict[str, str]) -> str:
    source = clean_name(member.linkname)
    if not source:
        raise _refuse(member.name, "hardlink to the destination itself")
    via = _under_link(source, links) or (source if source in links else None)
    if via is not None:
        raise _refuse(member.name, f"hardlink through the symlink {via!r}")
    return source


# --- extraction ----------------------------------------------------------------------
def _safe_dir(dest: str, rel: str, *, create: bool) -> str:
    """The real directory ``dest/rel``, every component checked to be a directory
    and not a symlink (created when missing and ``create``)."""
    path = dest
    for part in [p for p in rel.split("/") if p]:
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(path, 0o700)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(rel, f"{path!r} is a symlink: refusing to write through it")
        if not stat.S_ISDIR(st.st_mode):
            raise _refuse(rel, f"{path!r} exists and is not a directory")
    return path


def _clear(path: str, name: str) -> None:
    """Make room for a new non-directory entry at ``path`` without following
    anything there (an existing file may be a hardlink to something outside)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(path)
        except OSError as exc:
            raise _refuse(name, "would replace a non-empty directory") from exc
    else:
        os.unlink(path)


def safe_extract(stream, dest: str | os.PathLike) -> ExtractStats:
    """Extract an uncompressed tar (bytes, a file object or an iterable of
    chunks) into ``dest``. Raises UnsafeArchive at the first entry that would
    escape ``dest``; what was extracted before it stays, all of it inside
    ``dest``. Callers that need all-or-nothing extract into a fresh directory
    and rename it. Setuid/setgid bits are dropped; ownership is not restored.
    ``dest`` must not be changed by others while this runs."""
    dest = os.path.realpath(os.fspath(dest))
    os.makedirs(dest, exist_ok=True)
    stats = ExtractStats()
    links: dict[str, str] = {}
    created_links: list[str] = []
    dir_attrs: list[tuple[str, int, float]] = []
    with tarfile.open(fileobj=as_fileobj(stream), mode="r|") as tf:
        for member in tf:
            name = clean_name(member.name)
            _check_member_type(member, name)
            if name == "":
                continue
            via = _under_link(name, links)
            if via is not None:
                raise _refuse(member.name, f"would be written through the symlink {via!r}")
            parent = _safe_dir(dest, posixpath.dirname(name), create=True)
            path = os.path.join(parent, posixpath.basename(name))
            if member.isdir():
                links.pop(name, None)
                try:
                    st = os.lstat(path)
                    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                        _clear(path, member.name)
                        os.mkdir(path, 0o700)
                except FileNotFoundError:
                    os.mkdir(path, 0o700)
                dir_attrs.append((path, member.mode & 0o1777 | 0o700, member.mtime))
                stats.dirs += 1
            elif member.issym():
                links[name] = member.linkname
                _check_symlink(name, member.linkname, links)
                _clear(path, member.name)
                os.symlink(member.linkname, path)
                created_links.append(path)
                stats.links += 1
            elif member.islnk():
                source_rel = _check_hardlink(member, links)
                try:
                    source_dir = _safe_dir(dest, posixpath.dirname(source_rel), create=False)
                    source = os.path.join(source_dir, posixpath.basename(source_rel))
                    st = os.lstat(source)
                except FileNotFoundError as exc:
                    raise _refuse(member.name, f"hardlink to {member.linkname!r}, which is not in the archive") from exc
                if not stat.S_ISREG(st.st_mode):
                    raise _refuse(member.name, f"hardlink to {member.linkname!r}, which is not a regular file")
                links.pop(name, None)
                _clear(path, member.name)
                os.link(source, path, follow_symlinks=False)
                stats.links += 1
            else:  # regular file
                links.pop(name, None)
                _clear(path, member.name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    src = tf.extractfile(member)
                    if src is not None:
                        for chunk in iter_chunks(src):
                            out.write(chunk)
                os.chmod(path, member.mode & 0o777)
                os.utime(path, (member.mtime, member.mtime))
                stats.files += 1
                stats.bytes += member.size
    # A later entry can change where an earlier link leads: check them all, on disk.
    for path in created_links:
        real = os.path.realpath(path)
        if real != dest and not real.startswith(dest + os.sep):
            rel = os.path.relpath(path, dest)
            os.unlink(path)
            raise _refuse(rel, f"symlink resolves to {real!r}, outside the destination")
    for path, mode, mtime in reversed(dir_attrs):
        os.chmod(path, mode)
        os.utime(path, (mtime, mtime))
    return stats
