"""The local sandbox is a boundary, tried as an attacker would: a live server
on the local (bubblewrap) backend, agents driven through the JSON API with the
demo model's `run:` and `read:` directives, and the host looked at from here.

Each refusal has a control beside it (the agent's own file is readable, a
`network: host` agent reaches the server, an unlimited agent allocates), so a
test cannot pass because the probe itself is broken. docs/LOCAL_SANDBOX.md
cites these tests claim by claim.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from sandboxes.backends.local import bwrap_problem
from tests.integration.worlds import (
    DEMO,
    LABEL,
    WAIT,
    World,
    cleanup_sandboxes,
    count_of,
    events_of,
)
from tests.live import LiveServer

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def world():
    problem = bwrap_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"CI must test the local sandbox: {problem}", pytrace=False)
        pytest.skip(f"!!! LOCAL SANDBOX NOT TESTED: {problem} !!!")
    server = LiveServer(env={"ALINEO_SANDBOX": "local", "ALINEO_SANDBOX_LABELS": LABEL})
    server.start()
    try:
        yield World(server, server.create_actor("mallory"), "local")
    finally:
        server.stop()
        cleanup_sandboxes(server, "local")
        server.__exit__(None, None, None)


# --- helpers ----------------------------------------------------------------------------------


def turn(w: World, agent: str, prompt: str) -> list[dict]:
    """Send ``prompt`` and return the tool results of the turn it starts."""
    before = count_of(w.events(agent), "turn.finished")
    w.send(agent, "prompt", prompt)
    events = w.wait_turns(agent, before + 1)
    start = [i for i, e in enumerate(events) if e["type"] == "turn.started"][-1]
    return [e["data"] for e in events[start:] if e["type"] == "tool.result"]


def first_turn(w: World, spec: dict, prompt: str) -> tuple[str, list[dict]]:
    agent = w.spawn(spec, prompt)
    events = w.wait_turns(agent, 1)
    return agent, [e["data"] for e in events_of(events, "tool.result")]


def sandbox_of(w: World, agent: str) -> str:
    return w.get(f"/api/agents/{agent}")["sandbox_id"]


def sandbox_dir(w: World, agent: str) -> Path:
    return w.server.data_dir / "sandboxes" / sandbox_of(w, agent)


def init_pid(w: World, agent: str) -> int:
    return json.loads((sandbox_dir(w, agent) / "pid").read_text())["pid"]


def host_pids_of(sandbox_id: str) -> list[int]:
    """Processes on this machine that belong to the sandbox (by its environment)."""
    needle = f"ALINEO_SANDBOX_ID={sandbox_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def wait_until(predicate, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def said(result: dict) -> str:
    """All a tool call printed: its stdout and its stderr (kept apart in tool.result)."""
    return result["output"] + "\n" + (result.get("stderr") or "")


def py(code: str) -> str:
    """A `run:` line that runs python code on the sandbox's python3 (base64: no quoting)."""
    return f"run: echo {base64.b64encode(code.encode()).decode()} | base64 -d | python3"


# --- who the agent is -------------------------------------------------------------------------


def test_the_agent_is_not_root(world):
    _, results = first_turn(world, DEMO, "run: id -u\nrun: id -g\nrun: cat /proc/self/status")
    uid, gid, status = results
    assert uid["output"].strip() == "1000" and gid["output"].strip() == "1000", (uid, gid)
    assert "CapEff:\t0000000000000000" in status["output"]
    assert "NoNewPrivs:\t1" in status["output"]


# --- what the agent can read ------------------------------------------------------------------


def test_the_control_plane_files_and_other_homes_are_not_there(world):
    data = world.server.data_dir
    other, _ = first_turn(world, DEMO, "write secret.txt: other-agents-secret-4711")
    other_home = sandbox_dir(world, other) / "home"
    assert (other_home / "secret.txt").read_text() == "other-agents-secret-4711"
    secret_key = (data / "secret_key").read_text().strip()
    host_home = next(p for p in sorted(Path.home().iterdir()) if p.is_file())
    targets = [data / "alineo.sqlite3", data / "secret_key", other_home / "secret.txt",
               Path("/etc/shadow"), host_home]
    assert all(t.exists() for t in targets)  # on the host they are there
    lines = ([f"run: cat {t}" for t in targets] + [f"read: {t}" for t in targets[:3]]
             + [f"run: ls {data}", "run: ls -a /", "write mine.txt: my-own-file", "read: mine.txt"])
    agent, results = first_turn(world, DEMO, "\n".join(lines))
    output = json.dumps(results)
    for needle in ("SQLite format", secret_key, "other-agents-secret-4711", "root:"):
        assert needle not in output, f"the sandbox read {needle!r}: {output[:3000]}"
    cats, reads = results[:len(targets)], results[len(targets):len(targets) + 3]
    for target, result in zip(targets, cats):
        assert result["exit_code"] != 0 and "No such file" in said(result), (target, result)
    assert all(r["is_error"] for r in reads), reads
    ls_data, ls_root = results[len(targets) + 3:len(targets) + 5]
    assert ls_data["exit_code"] != 0, ls_data
    assert set(ls_root["output"].split()) <= {".", "..", "bin", "dev", "etc", "lib", "lib64",
                                              "proc", "root", "run", "sbin", "tmp", "usr"}, ls_root
    assert "my-own-file" in str(results[-1]["output"])  # the control: its own file


def test_the_home_and_run_dir_are_the_only_writable_places(world):
    _, results = first_turn(world, {**DEMO, "limits": {"memory_mb": 64}}, "\n".join([
        "run: touch /usr/x", "run: touch /etc/x", "run: touch /x", "run: touch /root/ok",
        "run: touch /run/alineo/ok", "run: touch /tmp/ok",
        "run: dd if=/dev/zero of=/tmp/big bs=1M count=100"]))
    usr, etc, top, home, run, tmp, big = (r["exit_code"] for r in results)
    assert usr and etc and top, results[:3]
    assert home == run == tmp == 0, results[3:6]
    assert big != 0 and "No space left" in said(results[-1]), results[-1]  # /tmp: memory_mb


# --- network ----------------------------------------------------------------------------------


def connect_line(port: int) -> str:
    return py("import socket\n"
              "try:\n"
              f"  socket.create_connection(('127.0.0.1', {port}), 3).close(); print('CONNECTED')\n"
              "except OSError as e:\n"
              "  print('REFUSED', e)")


def test_network_none_cannot_reach_the_control_plane(world):
    port = world.server.port
    _, results = first_turn(world, DEMO, connect_line(port) + "\nrun: cat /proc/net/dev")
    assert "REFUSED" in results[0]["output"], results[0]
    interfaces = [line.split(":")[0].strip() for line in results[1]["output"].splitlines()[2:]]
    assert interfaces == ["lo"], results[1]["output"]


def test_network_host_reaches_it_as_asked(world):
    """The control: the same probe connects when the spec asks for the host's network."""
    _, results = first_turn(world, {**DEMO, "network": "host"}, connect_line(world.server.port))
    assert "CONNECTED" in results[0]["output"], results[0]


# --- limits -----------------------------------------------------------------------------------


ALLOCATE = py("b = bytearray(300 * 1024 * 1024)\nprint('ALLOCATED', len(b))")


def refused_memory(exit_code: int, output: str) -> bool:
    """rlimits: the allocation fails (MemoryError); cgroup v2: the OOM killer (SIGKILL)."""
    return exit_code != 0 and ("MemoryError" in output or exit_code == 137)


def test_memory_limit_holds(world):
    _, results = first_turn(world, {**DEMO, "limits": {"memory_mb": 64}}, ALLOCATE)
    assert refused_memory(results[0]["exit_code"], said(results[0])), results[0]
    _, results = first_turn(world, {**DEMO, "limits": {"memory_mb": 1024}}, ALLOCATE)
    assert "ALLOCATED" in results[0]["output"], results[0]  # the control


FORK_BOMB = py("import os, time\n"
               "n = 0\n"
               "while n < 10000:\n"
               "  try:\n"
               "    pid = os.fork()\n"
               "  except OSError:\n"
               "    break\n"
               "  if pid == 0:\n"
               "    time.sleep(600)\n"
               "    os._exit(0)\n"
               "  n += 1\n"
               "print('FORKED', n)")


def test_a_fork_bomb_is_bounded_and_killed_with_the_sandbox(world):
    agent, results = first_turn(world, {**DEMO, "limits": {"pids": 40}}, FORK_BOMB)
    forked = int(results[0]["output"].split("FORKED")[1].split()[0])
    assert 0 < forked < 40, results[0]
    sid = sandbox_of(world, agent)
    assert len(host_pids_of(sid)) <= 40
    # Another sandbox is not starved: the count is per sandbox.
    _, others = first_turn(world, DEMO, "run: echo still-forking")
    assert "still-forking" in others[0]["output"]
    world.send(agent, "stop")
    wait_until(lambda: not host_pids_of(sid), f"the forked processes of {sid} to die")


def test_stopping_the_sandbox_kills_the_tools_it_started(world):
    agent, results = first_turn(world, DEMO, "run: sleep 1000 &\nrun: echo started")
    assert "started" in results[1]["output"]
    sid = sandbox_of(world, agent)
    sleeping = [p for p in host_pids_of(sid) if cmdline(p).startswith("sleep 1000")]
    assert sleeping, f"no `sleep 1000` of {sid} on the host: {[cmdline(p) for p in host_pids_of(sid)]}"
    world.send(agent, "stop")
    world.wait_for(agent, lambda evs: any(e["type"] == "agent.status" and
                                          e["data"].get("status") == "stopped" for e in evs),
                   "the agent to stop")
    wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and cmdline(p).startswith("sleep")
                               for p in sleeping), "the background sleep to die")


def test_exec_runs_inside_the_same_sandbox(world):
    """The backend's exec (setup steps, inputs) enters the agent's namespaces,
    uid and limits: it sees the agent's /root and not the host."""
    from sandboxes.backends.local import LocalBackend

    agent, _ = first_turn(world, {**DEMO, "limits": {"memory_mb": 64}}, "write probe.txt: from-agent")
    backend = LocalBackend(root=world.server.data_dir / "sandboxes")
    sid = sandbox_of(world, agent)
    res = backend.exec(sid, ["sh", "-c", "id -u; cat /root/probe.txt; echo; ls /; cat /proc/1/cmdline"])
    assert res.ok, res
    uid, probe, *rest = res.text.splitlines()
    assert uid == "1000" and probe == "from-agent"
    assert "work" not in rest and rest[-1].startswith("bwrap"), rest
    mem = backend.exec(sid, ["python3", "-c", "bytearray(300 * 1024 * 1024)"])
    assert refused_memory(mem.exit_code, mem.stderr.decode()), mem


# --- the sandbox outlives the control plane ---------------------------------------------------


def test_the_sandbox_outlives_a_kill_9_and_is_reattached(world):
    agent, _ = first_turn(world, DEMO, "write before.txt: before-the-crash")
    pid = init_pid(world, agent)
    mark = world.events(agent)[-1]["seq"]
    world.server.kill()  # SIGKILL: no shutdown code runs
    time.sleep(0.5)
    assert os.path.exists(f"/proc/{pid}") and cmdline(pid).startswith("bwrap"), \
        "the sandbox died with the control plane"
    world.server.start()
    events = world.wait_for(agent, lambda evs: any(
        e["type"] == "agent.restored" and e["seq"] > mark for e in evs), "the boot rung")
    rungs = [(e["data"]["rung"], e["data"]["reason"]) for e in events
             if e["type"] == "agent.restored" and e["seq"] > mark]
    assert rungs == [("reattach", "control_plane_restart")], rungs
    results = turn(world, agent, "read: before.txt")
    assert "before-the-crash" in str(results[0]["output"])
    assert init_pid(world, agent) == pid


# --- an unprivileged control plane -------------------------------------------------------------

UNPRIVILEGED = """
import json, sys
sys.path.insert(0, sys.argv[1])
from sandboxes.backends.local import LocalBackend
b = LocalBackend(root=sys.argv[2])
sid = b.create("agent-u", "default", limits={"pids": 30, "memory_mb": 64})
b.start(sid)
out = {"id": b.exec(sid, ["id", "-u"]).text.strip(),
       "ls": b.exec(sid, ["ls", "/"]).text.split(),
       "mem": b.exec(sid, ["python3", "-c", "bytearray(300 * 1024 * 1024)"]).exit_code,
       "status": open("/proc/self/status").read().count("Uid:")}
b.stop(sid, 5)
out["after_stop"] = str(b.status(sid))
b.remove(sid)
print(json.dumps(out))
"""


def test_an_unprivileged_control_plane_runs_and_enters_sandboxes_too():
    """As a user without privilege bubblewrap runs as that user, and exec enters
    the outer user namespace it owns before the one bubblewrap nests inside
    (sandboxes/backends/nsexec.py). Run here as a uid with nothing of its own."""
    import subprocess
    import sys

    if os.geteuid() != 0:
        pytest.skip("needs root to become an unprivileged user for the test")
    code_dir = str(Path(__file__).resolve().parent.parent.parent)
    python = "/usr/bin/python3"
    uid = 1_300_000
    probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                            python, "-c", f"import sys; sys.path.insert(0, {code_dir!r}); "
                            "import sandboxes.backends.local"], capture_output=True, timeout=60)
    if probe.returncode != 0:
        pytest.skip(f"uid {uid} cannot import this checkout with {python}: {probe.stderr[-300:]!r}")
    root = Path(tempfile.mkdtemp(prefix="alineo-unprivileged-"))  # pytest's tmp is root's alone
    try:
        os.chown(root, uid, uid)
        res = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                              "--", python, "-c", UNPRIVILEGED, code_dir, str(root / "sb")],
                             capture_output=True, text=True, timeout=120, cwd="/")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["id"] == "1000" and "usr" in out["ls"] and "work" not in out["ls"], out
    assert out["mem"] != 0 and out["after_stop"] == "exited", out


# --- the host side of a running sandbox -------------------------------------------------------


def test_a_home_swapping_directories_for_host_links_leaks_nothing(tmp_path):
    """The control plane reads a running sandbox's home from the host (checkpoint
    tar, commit) while the agent swaps a directory for a link to a host
    directory in a loop. The tar runs as the sandbox's uid and the commit with
    the sandbox stopped (as `docker commit` pauses): no host file gets in, and
    the copy never trips over the swap."""
    from sandboxes.backends.local import LocalBackend

    secret = Path(tempfile.mkdtemp(prefix="alineo-host-secret-"))
    try:
        secret.chmod(0o700)
        for i in range(20):
            (secret / f"f{i}").write_text("HOST-SECRET\n")
        backend = LocalBackend(root=tmp_path / "sandboxes")
        sid = backend.create("agent-swap", "default")
        try:
            backend.start(sid)
            swap = (f"mkdir -p d; for i in $(seq 20); do echo x > d/f$i; done; while true; do "
                    f"mv d d2; ln -s {secret} d; rm d; mv d2 d; done")
            assert backend.exec(sid, ["sh", "-c", f"({swap}) >/dev/null 2>&1 &"]).ok
            for _ in range(15):
                assert b"HOST-SECRET" not in b"".join(backend.read_home(sid))
            for i in range(8):
                ref = backend.commit(sid, f"swap-{i}")
                copied = tmp_path / "sandboxes" / "_snapshots" / f"swap-{i}" / "home"
                assert backend.image_exists(ref)
                assert not [p for p in copied.rglob("*") if p.is_file() and not p.is_symlink()
                            and "HOST-SECRET" in p.read_text()]
        finally:
            backend.remove(sid)
    finally:
        shutil.rmtree(secret, ignore_errors=True)
