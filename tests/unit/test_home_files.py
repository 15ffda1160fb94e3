"""Reading a checkpoint for the Files view (sandboxes/home_files.py): the tar
came from inside a sandbox, so names that leave the home are skipped (never
followed), links are shown not followed, a file is read no further than the
limit, binary is told apart, a broken file is HomeUnreadable — and what a turn
changed is the difference of two listings."""

from __future__ import annotations

import io
import tarfile

import pytest
import zstandard

from sandboxes import home_files


def make_checkpoint(path, members: dict[str, bytes | str | None], links: dict[str, str] | None = None):
    """A zstd tar like a turn checkpoint: bytes are files, None a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            data = data.encode() if isinstance(data, str) else data
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    path.write_bytes(zstandard.ZstdCompressor().compress(buf.getvalue()))
    return path


def test_unsafe_names_are_skipped_and_links_not_followed(tmp_path):
    cp = make_checkpoint(tmp_path / "a.tar.zst", {
        "./": None, "./notes.txt": "hello\n", "./src": None, "./src/app.py": "print(1)\n",
        "../escape": "x", "/etc/passwd": "root", "./a/../../up": "x"},
        links={"./out": "/etc/shadow"})
    listing = home_files.listing(cp)
    assert set(listing.entries) == {"notes.txt", "src", "src/app.py", "out"}
    assert listing.skipped == 3
    assert listing.entries["out"].kind == "link" and listing.entries["out"].target == "/etc/shadow"
    assert home_files.read_file(cp, "out") is None  # a link is not a file: never read through
    assert home_files.read_file(cp, "../escape") is None


def test_a_file_is_read_up_to_the_limit_and_binary_is_told(tmp_path):
    cp = make_checkpoint(tmp_path / "b.tar.zst", {"big.txt": "a" * 5000, "blob.bin": b"\x00\x01\xff" * 10,
                                                 "utf8.txt": "héllo"})
    view = home_files.read_file(cp, "big.txt", limit=1000)
    assert len(view.data) == 1000 and view.truncated and not view.binary and view.entry.size == 5000
    assert home_files.read_file(cp, "blob.bin").binary
    assert not home_files.read_file(cp, "utf8.txt").binary
    assert home_files.read_file(cp, "missing") is None


def test_what_a_turn_changed(tmp_path):
    before = home_files.listing(make_checkpoint(tmp_path / "1.tar.zst", {
        "keep.txt": "same", "edit.txt": "v1", "gone.txt": "bye", "d": None}))
    after = home_files.listing(make_checkpoint(tmp_path / "2.tar.zst", {
        "keep.txt": "same", "edit.txt": "v2", "new.txt": "hi", "d": None}))
    found = [(c.name, c.what) for c in home_files.changes(before, after)]
    assert found == [("edit.txt", "changed"), ("gone.txt", "removed"), ("new.txt", "added")]
    assert [c.what for c in home_files.changes(None, after)] == ["added"] * 3


def test_a_broken_or_missing_checkpoint_is_unreadable(tmp_path):
    bad = tmp_path / "bad.tar.zst"
    bad.write_bytes(b"not zstd at all")
    with pytest.raises(home_files.HomeUnreadable):
        home_files.listing(bad)
    with pytest.raises(home_files.HomeUnreadable):
        home_files.listing(tmp_path / "nope.tar.zst")
    with pytest.raises(home_files.HomeUnreadable):
        home_files.read_file(bad, "x")


def test_the_listing_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(home_files, "MAX_MEMBERS", 3)
    cp = make_checkpoint(tmp_path / "many.tar.zst", {f"f{i}": "x" for i in range(10)})
    listing = home_files.listing(cp)
    assert len(listing.entries) == 3 and listing.truncated
