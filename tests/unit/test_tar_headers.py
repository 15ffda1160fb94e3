"""The fast tar header reader of sandboxes/safe_tar.py against tarfile's own
(``TarInfo.frombuf``), which every check of an untrusted archive went
through before: for any 512 bytes, the fast path reads exactly what frombuf
reads, or leaves the block to frombuf. A header the two read differently
would be judged as one entry and extracted as another."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandboxes.errors import UnsafeArchive
from sandboxes.safe_tar import validated_tar
from sandboxes import safe_tar

FIELDS = ("name", "mode", "uid", "gid", "size", "mtime", "chksum", "type", "linkname",
          "uname", "gname", "devmajor", "devminor")


def _frombuf(block: bytes):
    try:
        return tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError:
        return None


def _fields(member) -> tuple:
    return tuple(getattr(member, f) for f in FIELDS)


def _header(name: str, kind: bytes, fmt: int, **kw) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in kw.items():
        setattr(info, key, value)
    return info.tobuf(fmt, tarfile.ENCODING, "surrogateescape")[-512:]


def _checked(block: bytes) -> None:
    """The fast path agrees with frombuf on ``block``, or declines it."""
    fast = safe_tar._plain_header(block)
    slow = _frombuf(block)
    if fast is not None:
        assert slow is not None, "the fast path read a header frombuf refuses"
        assert _fields(fast) == _fields(slow)


KINDS = [tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
         tarfile.CHRTYPE, tarfile.FIFOTYPE, tarfile.GNUTYPE_SPARSE, tarfile.CONTTYPE,
         tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("kind", KINDS)
def test_headers_tarfile_writes_are_read_the_same(fmt, kind):
    for name in ("./w/a.txt", "dir/", "x" * 99, "p" * 120 + "/" + "n" * 60, "é/ü"):
        try:
            block = _header(name, kind, fmt, size=0 if kind != tarfile.REGTYPE else 12345,
                            linkname="../t" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else "",
                            uid=1000, gid=1000, mode=0o4755, mtime=1_700_000_000)
        except ValueError:
            continue  # a name this format cannot hold
        _checked(block)
        assert safe_tar._plain_header(block) is not None or kind == tarfile.GNUTYPE_SPARSE \
            or _frombuf(block) is None


@pytest.mark.parametrize("kind", KINDS)
def test_the_ustar_prefix_is_joined_as_frombuf_joins_it(kind):
    block = _header("p" * 120 + "/" + "name", tarfile.REGTYPE, tarfile.USTAR_FORMAT)
    assert block[345:346] == b"p"  # the long name went into the prefix field
    block = bytearray(block)
    block[156:157] = kind
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    _checked(bytes(block))


def test_a_gnu_base256_number_is_left_to_frombuf():
    block = _header("big", tarfile.REGTYPE, tarfile.GNU_FORMAT, size=8 ** 11 + 5)
    assert block[124] == 0o200
    assert safe_tar._plain_header(block) is None
    assert safe_tar._parse_header(block).size == 8 ** 11 + 5


def test_a_bad_checksum_is_refused_as_before():
    block = bytearray(_header("f", tarfile.REGTYPE, tarfile.USTAR_FORMAT, size=1))
    block[0] ^= 1
    with pytest.raises(UnsafeArchive, match="bad checksum"):
        safe_tar._parse_header(bytes(block))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(kind=st.sampled_from(KINDS), fmt=st.sampled_from([tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
       edits=st.lists(st.tuples(st.integers(0, 511), st.integers(0, 255)), max_size=6),
       fix_checksum=st.booleans())
def test_any_mutated_header_is_read_the_same_or_left_to_frombuf(kind, fmt, edits, fix_checksum):
    block = bytearray(_header("home/w/file.txt", kind, fmt, size=700, linkname="a", uid=7,
                              mode=0o644, mtime=1_700_000_000))
    for at, value in edits:
        block[at] = value
    if fix_checksum:  # most edits would otherwise only test the checksum
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % sum(block)
    _checked(bytes(block))


def test_a_stream_passes_unchanged():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for i in range(300):
            info = tarfile.TarInfo(f"./d{i % 7}/f{i}.txt")
            info.size = i
            tf.addfile(info, io.BytesIO(b"x" * i))
    data = buf.getvalue()
    out = b"".join(validated_tar([data[i:i + 4096] for i in range(0, len(data), 4096)]))
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        assert [m.name for m in tf] == [f"./d{i % 7}/f{i}.txt" for i in range(300)]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_are_read_through_their_extension_headers(fmt):
    def tar(name: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"ok"))
        return buf.getvalue()

    long_ok = "./" + "d" * 150 + "/file.txt"
    out = b"".join(validated_tar([tar(long_ok)]))
    with tarfile.open(fileobj=io.BytesIO(out)) as tf:
        assert tf.getnames() == [long_ok]
    with pytest.raises(UnsafeArchive, match=r"'\.\.' component"):
        b"".join(validated_tar([tar("./" + "d" * 150 + "/../../escape.txt")]))
