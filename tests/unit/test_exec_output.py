"""Output handed over while an exec runs (sandboxes/backends/procs.py
communicate, base.py collect_output): every chunk once, in order, per stream,
the whole output still returned; a timeout still raised."""

import subprocess
import sys

import pytest

from sandboxes.backends import procs
from sandboxes.backends.base import TAIL_KEEP, Tail, collect_output


def popen(code: str):
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_communicate_hands_over_each_chunk():
    proc = popen("import sys,time\nprint('a', flush=True)\ntime.sleep(0.3)\n"
                 "print('b', file=sys.stderr, flush=True)\nprint('c', flush=True)")
    seen = []
    out, err = procs.communicate(proc, 30, lambda s, b: seen.append((s, b)))
    assert (out, err) == (b"a\nc\n", b"b\n")
    assert b"".join(b for s, b in seen if s == "stdout") == out
    assert seen[0] == ("stdout", b"a") or seen[0] == ("stdout", b"a\n")
    assert proc.returncode == 0


def test_communicate_without_a_callback_is_plain():
    assert procs.communicate(popen("print(1)"), 30) == (b"1\n", b"")


def test_communicate_times_out():
    proc = popen("import time\nprint('x', flush=True)\ntime.sleep(30)")
    with pytest.raises(subprocess.TimeoutExpired):
        procs.communicate(proc, 0.5, lambda s, b: None)
    proc.kill()
    proc.wait()


def test_collect_output_demuxes_docker_frames():
    seen = []
    out, err = collect_output([(b"a", None), (None, b"e"), (b"b", b"f")],
                              lambda s, b: seen.append((s, b)))
    assert (out, err) == (b"ab", b"ef")
    assert seen == [("stdout", b"a"), ("stderr", b"e"), ("stdout", b"b"), ("stderr", b"f")]


def test_an_exec_printing_without_end_keeps_only_its_tail():
    proc = popen("import sys\nfor i in range(40):\n    sys.stdout.write(str(i % 10) * 100000)\n"
                 "sys.stdout.write('END')")
    seen = [0]
    out, _err = procs.communicate(proc, 60, lambda s, b: seen.__setitem__(0, seen[0] + len(b)))
    assert seen[0] == 4_000_003  # every byte handed over …
    assert len(out) == TAIL_KEEP and out.endswith(b"END")  # … only the tail kept


def test_tail_keeps_the_last_bytes():
    tail = Tail()
    for i in range(30):
        tail.add(bytes([65 + i % 26]) * 100_000)
    assert len(tail.value()) == TAIL_KEEP and tail.value().endswith(b"D" * 100_000)
