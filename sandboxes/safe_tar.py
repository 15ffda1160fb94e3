"""Safe extraction of tar streams that come from code we do not trust.

* :func:`safe_extract` — extract an uncompressed tar stream into a directory,
  refusing every entry that would escape it: ``..`` components, absolute
  paths, symlinks or hardlinks that point outside (also through chains of
  links), members that would be written *through* a symlink, and device or
  fifo files. Nothing is ever written outside ``dest``.
* :func:`check_tar` — the same rules as a read-only pass; :func:`validated_tar`
  checks a stream while passing it on (the docker backend validates before
  handing a stream to the engine).

All three apply the rules of sandboxes/tar_rules.py (:class:`TarRules`), one
member at a time; safe_extract adds the checks of what is already on disk.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import struct
import tarfile
import threading
from typing import IO, Iterable, Iterator

from sandboxes.errors import UnsafeArchive
from sandboxes.tar_rules import ExtractStats, TarRules, clean_name, unsafe_entry

__all__ = ["ExtractStats", "as_fileobj", "check_tar", "clean_name", "iter_chunks",
           "safe_extract", "validated_tar"]


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


def check_tar(stream, dest: str = "the destination", caps: tuple = (None, None)) -> ExtractStats:
    """Validate a whole tar stream without writing anything; raises UnsafeArchive.
    ``caps``: (the most bytes of files, the most entries) it may hold, or None."""
    rules = TarRules(*caps)
    fileobj = as_fileobj(stream)
    seekable = getattr(fileobj, "seekable", lambda: False)()
    # A seekable file is read header by header, seeking over the data.
    with tarfile.open(fileobj=fileobj, mode="r:" if seekable else "r|") as tf:
        for member in tf:
            rules.check(member)
    return rules.stats


# --- checking while streaming ---------------------------------------------------------
# Headers that describe the entry after them. A global pax header ('g') or a
# Solaris one ('X') is not among them: tarfile applies them to the entry, the
# Docker engine does not, so they are refused like any other unknown type.
_EXTENSION_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE)
# What a GNU long name or long link and a pax record would both set: with both,
# tarfile and the Docker engine disagree on which one wins.
_SET_TWICE = {tarfile.GNUTYPE_LONGNAME: "path", tarfile.GNUTYPE_LONGLINK: "linkpath"}
_MAX_EXTENSION = 1 << 20
_ZERO_BLOCK = bytes(512)
_FLUSH_AT = 1 << 20  # validated bytes held back at most before they go out


def _blocks(size: int) -> int:
    return (size + 511) // 512 * 512


def _parse_header(block: bytes) -> tarfile.TarInfo:
    try:
        member = _plain_header(block)
        if member is None:
            member = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
        return member
    except tarfile.HeaderError as exc:
        raise UnsafeArchive(f"not a valid tar header at an entry boundary ({exc})") from exc


# A ustar/GNU header as tarfile.TarInfo.frombuf reads it: name, mode, uid, gid,
# size, mtime, chksum, type, linkname, magic+version, uname, gname, devmajor,
# devminor, prefix (and 12 bytes it ignores).
_HEADER = struct.Struct("100s8s8s8s12s12s8sc100s8x32s32s8s8s155s12x")


def _text(field: bytes) -> str:
    """tarfile.nts: up to the first NUL."""
    end = field.find(b"\0")
    return (field if end == -1 else field[:end]).decode(tarfile.ENCODING, "surrogateescape")


def _octal(field: bytes) -> int:
    """tarfile.nti for an octal field; ValueError for anything else (a
    base-256 number's first byte is not ASCII)."""
    end = field.find(b"\0")
    return int((field if end == -1 else field[:end]).decode("ascii").strip() or "0", 8)


def _plain_header(block: bytes) -> tarfile.TarInfo | None:
    """``TarInfo.frombuf(block)`` for the common header — octal numbers, the
    unsigned checksum, not sparse — at a fraction of its cost: frombuf sums
    the block twice through a 504-item tuple and converts each field through
    two calls (most of a 30,000-entry restore's Python time, docs/
    PERFORMANCE.md). The same fields by the same conversions; None for
    anything else, which frombuf then reads (and refuses) itself."""
    (name, mode, uid, gid, size, mtime, chk, kind, linkname,
     uname, gname, devmajor, devminor, prefix) = _HEADER.unpack(block)
    if kind == tarfile.GNUTYPE_SPARSE:
        return None
    try:
        chksum = _octal(chk)
        if chksum != 256 + sum(block) - sum(chk):
            return None  # the signed checksum of old tars, or a bad one: frombuf decides
        member = tarfile.TarInfo(_text(name))
        member.mode, member.uid, member.gid = _octal(mode), _octal(uid), _octal(gid)
        member.size, member.mtime = _octal(size), _octal(mtime)
        member.devmajor, member.devminor = _octal(devmajor), _octal(devminor)
    except ValueError:
        return None  # a base-256 number (GNU), or not a number: frombuf decides
    member.chksum, member.type = chksum, kind
    member.linkname, member.uname, member.gname = _text(linkname), _text(uname), _text(gname)
    if kind == tarfile.AREGTYPE and member.name.endswith("/"):
        member.type = tarfile.DIRTYPE  # the old V7 way of writing a directory
    if member.isdir():
        member.name = member.name.rstrip("/")
    prefix = _text(prefix)
    if prefix and member.type not in tarfile.GNU_TYPES:
        member.name = prefix + "/" + member.name  # a ustar long name
    return member


def _member_of_group(group: bytes) -> tarfile.TarInfo:
    """The entry that extension headers (long names, pax) and its own header
    describe together, read the way tarfile reads them."""
    try:
        with tarfile.open(fileobj=io.BytesIO(group), mode="r:") as tf:
            member = tf.firstmember
    except (tarfile.TarError, ValueError) as exc:  # ValueError: a pax record tarfile cannot parse
        raise UnsafeArchive(f"unreadable tar extension headers ({exc})") from exc
    if member is None:
        raise UnsafeArchive("tar extension headers without an entry")
    return member


class _StreamValidator:
    """The state of one :func:`validated_tar` pass. ``buf`` holds the bytes
    not yet yielded from ``out`` on; ``pos`` is where the next header starts;
    ``group`` is where pending extension headers began (they go out only
    together with the entry they describe, once it passed)."""

    def __init__(self, chunks: Iterable[bytes], caps: tuple = (None, None)):
        self.rules = TarRules(*caps)
        self.chunks = iter(chunks)
        self.buf, self.pos, self.out = b"", 0, 0
        self.group: int | None = None
        self.group_types: set[bytes] = set()

    def run(self) -> Iterator[bytes]:
        while True:
            yield from self._fill(512)
            block = self.buf[self.pos:self.pos + 512]
            if block == _ZERO_BLOCK:
                yield from self._end()
                return
            header = _parse_header(block)
            if header.type in _EXTENSION_TYPES:
                yield from self._hold_extension(header)
                continue
            member = self._member(header)
            self.rules.check(member)
            self.pos += 512
            yield from self._pass_data(_blocks(member.size) if member.isreg() else 0)
            yield from self._flush_large()

    def _next_chunk(self, why: str) -> bytes:
        try:
            return bytes(next(self.chunks))
        except StopIteration:
            raise UnsafeArchive(f"truncated tar stream: it ends {why}") from None

    def _fill(self, need: int) -> Iterator[bytes]:
        """Read on until ``need`` bytes are available at pos, yielding first
        the validated bytes that can go out (everything before pos, or before
        pending extension headers)."""
        if len(self.buf) - self.pos >= need:
            return
        safe = self.pos if self.group is None else self.group
        ready = self.buf[self.out:safe]
        parts = [self.buf[safe:]]
        have, target = len(self.buf) - safe, self.pos - safe + need
        while have < target:
            parts.append(self._next_chunk("inside an entry or without an end-of-archive marker"))
            have += len(parts[-1])
        self.buf = b"".join(parts)
        self.pos -= safe
        if self.group is not None:
            self.group -= safe
        self.out = 0
        if ready:
            yield ready

    def _end(self) -> Iterator[bytes]:
        if self.group is not None:
            raise UnsafeArchive("tar stream ends inside an entry's extension headers")
        if self.pos > self.out:
            yield self.buf[self.out:self.pos]
        yield _ZERO_BLOCK * 2

    def _hold_extension(self, header: tarfile.TarInfo) -> Iterator[bytes]:
        if header.size > _MAX_EXTENSION:
            raise UnsafeArchive(f"tar extension header of {header.size} bytes refused")
        if header.type in self.group_types:
            # tarfile keeps the first of two, the Docker engine the last.
            raise UnsafeArchive(f"two tar extension headers of type {header.type!r} for one entry")
        self.group_types.add(header.type)
        if self.group is None:
            self.group = self.pos
        total = 512 + _blocks(header.size)
        yield from self._fill(total)
        self.pos += total

    def _member(self, header: tarfile.TarInfo) -> tarfile.TarInfo:
        if self.group is None:
            return header
        member = _member_of_group(self.buf[self.group:self.pos + 512])
        for kind, key in _SET_TWICE.items():
            if kind in self.group_types and key in member.pax_headers:
                raise UnsafeArchive(f"tar entry {member.name!r} has its {key} twice "
                                    "(a GNU extension header and a pax record)")
        self.group, self.group_types = None, set()
        return member

    def _pass_data(self, skip: int) -> Iterator[bytes]:
        """Step over ``skip`` bytes of a checked entry's data, letting them go
        out as they come."""
        while skip:
            avail = len(self.buf) - self.pos
            if avail >= skip:
                self.pos += skip
                return
            self.pos = len(self.buf)
            skip -= avail
            if self.pos > self.out:
                yield self.buf[self.out:self.pos]
            self.buf = self._next_chunk("inside a file's data")
            self.pos = self.out = 0

    def _flush_large(self) -> Iterator[bytes]:
        if self.pos - self.out >= _FLUSH_AT:
            yield self.buf[self.out:self.pos]
            self.out = self.pos


def validated_tar(chunks: Iterable[bytes], caps: tuple = (None, None)) -> Iterator[bytes]:
    """Pass an uncompressed tar stream through, member by member, each one only
    after its header passed the extraction rules (the same as :func:`check_tar`);
    raise UnsafeArchive at the first entry that fails, before any of its bytes
    were yielded. Lets a consumer (docker's put_archive) extract while the stream
    is checked, instead of spooling and checking it first. Stops after the
    end-of-archive marker; a stream that ends without one raises. ``caps`` as
    for :func:`check_tar`."""
    yield from _StreamValidator(chunks, caps).run()


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
            raise unsafe_entry(rel, f"{path!r} is a symlink: refusing to write through it")
        if not stat.S_ISDIR(st.st_mode):
            raise unsafe_entry(rel, f"{path!r} exists and is not a directory")
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
            raise unsafe_entry(name, "would replace a non-empty directory") from exc
    else:
        os.unlink(path)


class _Extractor:
    """The state of one :func:`safe_extract`: every member passes the shared
    rules (:class:`TarRules`) first, then is written with checks of what is on
    disk (a directory in ``dest`` may already be a symlink, placed there by an
    earlier extraction or by the sandbox itself)."""

    def __init__(self, dest: str, caps: tuple = (None, None)):
        self.dest = dest
        self.rules = TarRules(*caps)
        self.created_links: list[str] = []
        self.dir_attrs: list[tuple[str, int, float]] = []

    def extract(self, tf: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        name = self.rules.check(member)
        if name == "":
            return
        parent = _safe_dir(self.dest, posixpath.dirname(name), create=True)
        path = os.path.join(parent, posixpath.basename(name))
        if member.isdir():
            self._make_dir(path, member)
        elif member.issym():
            _clear(path, member.name)
            os.symlink(member.linkname, path)
            self.created_links.append(path)
        elif member.islnk():
            self._make_hardlink(path, member)
        else:
            self._write_file(tf, path, member)

    def _make_dir(self, path: str, member: tarfile.TarInfo) -> None:
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                _clear(path, member.name)
                os.mkdir(path, 0o700)
        except FileNotFoundError:
            os.mkdir(path, 0o700)
        # Applied at the end (finish): a read-only directory must stay writable
        # until its contents are in, and the owner always keeps write access.
        self.dir_attrs.append((path, member.mode & 0o1777 | 0o700, member.mtime))

    def _make_hardlink(self, path: str, member: tarfile.TarInfo) -> None:
        source_rel = clean_name(member.linkname)
        try:
            source_dir = _safe_dir(self.dest, posixpath.dirname(source_rel), create=False)
            source = os.path.join(source_dir, posixpath.basename(source_rel))
            st = os.lstat(source)
        except FileNotFoundError as exc:
            raise unsafe_entry(member.name, f"hardlink to {member.linkname!r}, which is not in the archive") from exc
        if not stat.S_ISREG(st.st_mode):
            raise unsafe_entry(member.name, f"hardlink to {member.linkname!r}, which is not a regular file")
        _clear(path, member.name)
        os.link(source, path, follow_symlinks=False)

    def _write_file(self, tf: tarfile.TarFile, path: str, member: tarfile.TarInfo) -> None:
        _clear(path, member.name)
        # O_EXCL | O_NOFOLLOW: a file or link that appeared at path since _clear
        # is never written through.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            src = tf.extractfile(member)
            if src is not None:
                for chunk in iter_chunks(src):
                    out.write(chunk)
        os.chmod(path, member.mode & 0o777)  # without setuid, setgid and sticky bits
        os.utime(path, (member.mtime, member.mtime))

    def finish(self) -> None:
        self._check_links_on_disk()
        for path, mode, mtime in reversed(self.dir_attrs):
            os.chmod(path, mode)
            os.utime(path, (mtime, mtime))

    def _check_links_on_disk(self) -> None:
        """The archive's links were checked against the archive; what they
        resolve to on disk is checked here, once all of them are in (a link may
        lead through a symlink that was in ``dest`` before)."""
        for path in self.created_links:
            real = os.path.realpath(path)
            if real != self.dest and not real.startswith(self.dest + os.sep):
                rel = os.path.relpath(path, self.dest)
                os.unlink(path)
                raise unsafe_entry(rel, f"symlink resolves to {real!r}, outside the destination")


def safe_extract(stream, dest: str | os.PathLike, caps: tuple = (None, None)) -> ExtractStats:
    """Extract an uncompressed tar (bytes, a file object or an iterable of
    chunks) into ``dest``. Raises UnsafeArchive at the first entry that would
    escape ``dest``; what was extracted before it stays, all of it inside
    ``dest``. Callers that need all-or-nothing extract into a fresh directory
    and rename it. Setuid/setgid bits are dropped; ownership is not restored.
    ``dest`` must not be changed by others while this runs. ``caps`` as for
    :func:`check_tar`."""
    dest = os.path.realpath(os.fspath(dest))
    os.makedirs(dest, exist_ok=True)
    extractor = _Extractor(dest, caps)
    with tarfile.open(fileobj=as_fileobj(stream), mode="r|") as tf:
        for member in tf:
            extractor.extract(tf, member)
    extractor.finish()
    return extractor.rules.stats


def tar_of(host_dir: str, inside: str, chunk: int = 1 << 20) -> Iterator[bytes]:
    """A tar of ``host_dir`` named ``inside`` (relative to /), in chunks,
    written by a thread into a pipe (a harness is ~350 MB: never in memory)."""
    read_fd, write_fd = os.pipe()

    def write() -> None:
        with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
            tar.add(host_dir, arcname=inside.lstrip("/"))

    threading.Thread(target=write, name="tar-of", daemon=True).start()
    with os.fdopen(read_fd, "rb") as src:
        while data := src.read(chunk):
            yield data
