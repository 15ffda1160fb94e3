"""Process helpers shared by the host-directory backends (sandboxes/backends/
hostdir.py and its subclasses): pids checked against the kernel's start time,
process groups, exit codes, small atomic files."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Generator, Iterator

from sandboxes.backends.base import Tail


def proc_stat(pid: int) -> tuple[str | None, int | None]:
    """(state letter, start time in clock ticks) of a pid; (None, None) if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None, None
    except OSError:
        try:  # not Linux: existence only
            os.kill(pid, 0)
            return "R", None
        except ProcessLookupError:
            return None, None
        except PermissionError:
            return "R", None
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[19])


def starttime(pid: int) -> int | None:
    return proc_stat(pid)[1]


def alive(pid: int | None, start: int | None = None) -> bool:
    """The pid runs (not a zombie) and, when ``start`` is known, is still the
    process that started then: a reused pid is never taken for it."""
    if not pid:
        return False
    state, now = proc_stat(pid)
    if state is None or state in ("Z", "X"):
        return False
    return start is None or now is None or now == start


def killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc; [] when it is gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def pids_with_env(name: str, value: str) -> Iterator[int]:
    """Pids whose environment holds ``name=value`` (those this user may read)."""
    needle = f"{name}={value}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            yield int(entry.name)


def drain(proc: subprocess.Popen, wait_s: float = 10) -> Generator[bytes, None, int]:
    """Yield a child's stdout in 1 MiB chunks, then close it and wait for the
    child (killed after ``wait_s``); also when the consumer stops early (the
    child gets SIGPIPE). ``code = yield from drain(proc)`` is its exit status."""
    try:
        while True:
            chunk = proc.stdout.read(1 << 20)
            if not chunk:
                break
            yield chunk
    finally:
        proc.stdout.close()
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def reap(proc: subprocess.Popen, path: Path) -> None:
    """Wait for ``proc`` (no zombie while we live) and keep its exit code in ``path``."""
    code = proc.wait()
    try:
        if path.parent.is_dir():
            path.write_text(str(exit_code(code)))
    except OSError:
        pass


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def rmtree(path: Path) -> None:
    def onerror(func, p, exc_info):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give a tree to ``uid``:``gid`` without following a symlink anywhere:
    directory fds all the way down (os.fwalk), so a sandbox that swaps a
    directory for a link while this runs cannot make it chown a host file."""
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.chown(top, uid, gid)
        for _root, dirs, files, dirfd in os.fwalk(".", follow_symlinks=False, dir_fd=top):
            for name in dirs + files:
                try:
                    os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    pass
    finally:
        os.close(top)


def communicate(proc: subprocess.Popen, timeout: float | None,
                on_output: Callable[[str, bytes], None] | None = None) -> tuple[bytes, bytes]:
    """``proc.communicate(timeout=…)`` that also hands each chunk of output to
    ``on_output("stdout" | "stderr", chunk)`` as it arrives (in this thread),
    and then keeps only the last base.TAIL_KEEP bytes a stream. Raises
    subprocess.TimeoutExpired like communicate."""
    if on_output is None:
        return proc.communicate(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    kept = {"stdout": Tail(), "stderr": Tail()}
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                kept[key.data].add(chunk)
                on_output(key.data, chunk)
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    proc.wait(timeout=left)
    return kept["stdout"].value(), kept["stderr"].value()
