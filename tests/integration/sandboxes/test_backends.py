"""One suite, both backends (docker and local): lifecycle, exec, home tar, commit."""

from __future__ import annotations

import io
import os
import tarfile
import time

import pytest

from sandboxes.backends.base import SandboxStatus
from sandboxes.backends import docker_engine_answers, get_backend, reset
from sandboxes.archive import pack_home, unpack_home
from sandboxes.errors import (
    ExecTimeout,
    ImageMissing,
    SandboxError,
    SandboxNotFound,
    SandboxNotRunning,
    UnsafeArchive,
)


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _names(tar_bytes: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r") as tf:
        return set(tf.getnames())


def _member(tar_bytes: bytes, name: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r") as tf:
        return tf.extractfile(name).read()


def test_create_start_status(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.create("agent-status")
    assert b.status(sid) is SandboxStatus.EXITED  # created, not started
    b.start(sid)
    assert b.status(sid) is SandboxStatus.RUNNING
    b.start(sid)  # starting a running sandbox is a no-op
    assert b.status(sid) is SandboxStatus.RUNNING
    listed = {h.id: h for h in b.list({"alineo.agent": "agent-status"})}
    assert sid in listed and listed[sid].status is SandboxStatus.RUNNING
    assert listed[sid].agent_id == "agent-status"


def test_exec_output_exit_code_env_and_cwd(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started(env={"FROM_CREATE": "c1"})
    res = b.exec(sid, ["sh", "-c", 'echo "out $FROM_EXEC $FROM_CREATE"; echo err >&2; exit 3'],
                 env={"FROM_EXEC": "e1"}, timeout=30)
    assert res.exit_code == 3
    assert res.stdout == b"out e1 c1\n"
    assert res.stderr == b"err\n"
    res = b.exec(sid, ["sh", "-c", 'pwd; echo "$HOME"; echo "$ALINEO_RUN_DIR"'])
    cwd, home, run_dir = res.text.splitlines()
    assert cwd == home == b.home(sid)
    assert run_dir
    assert b.exec(sid, ["true"]).ok
    missing = b.exec(sid, ["no-such-command-here"])
    assert missing.exit_code in (126, 127)


def test_exec_timeout_kills_the_command(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started()
    t0 = time.monotonic()
    with pytest.raises(ExecTimeout) as info:
        b.exec(sid, ["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert time.monotonic() - t0 < 10
    assert info.value.result.stdout == b"started\n"
    assert not info.value.permanent


def test_home_roundtrip_through_tar(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started()
    script = (
        "mkdir -p work/pkg/__pycache__ .cache/pip .npm .cargo/registry go/pkg/mod .rustup && "
        "echo hello > work/a.txt && echo cached > .cache/pip/big && echo x > .npm/y && "
        "echo c > .cargo/registry/c && echo g > go/pkg/mod/g && echo t > .rustup/toolchain && "
        "echo pyc > work/pkg/__pycache__/m.pyc && ln -s a.txt work/link"
    )
    assert b.exec(sid, ["sh", "-c", script]).ok
    tar_bytes = b"".join(b.read_home(sid))
    names = _names(tar_bytes)
    assert "./work/a.txt" in names and "./work/link" in names
    assert "./.rustup/toolchain" in names  # toolchains are kept, only caches go
    assert _member(tar_bytes, "./work/a.txt") == b"hello\n"
    for excluded in ("./.cache", "./.npm", "./.cargo/registry", "./go/pkg/mod",
                     "./work/pkg/__pycache__"):
        assert not any(n == excluded or n.startswith(excluded + "/") for n in names), excluded

    # write a tar in, read it back through exec and through the home tar
    b.write_home(sid, [_tar({"./notes/new.txt": b"written from the host\n"})])
    assert b.exec(sid, ["cat", "notes/new.txt"]).stdout == b"written from the host\n"
    assert _member(b"".join(b.read_home(sid)), "./notes/new.txt") == b"written from the host\n"


def test_the_session_file_comes_first_in_a_home_tar(sandboxes):
    """A restore reads the bridge's session file out of the checkpoint
    (sandboxes/archive.py session_in) before and beside the extraction: the
    host's tar orders entries by name, so it is found in the first entries
    and not after every file of a big home (issue 17)."""
    b = sandboxes.backend
    sid = sandboxes.started()
    script = ("mkdir -p a w && for i in $(seq 1 300); do echo $i > w/f$i; echo $i > a/$i; done && "
              "mkdir -p .alineo && echo '{}' > .alineo/session.json && echo late > 0late")
    assert b.exec(sid, ["sh", "-c", script]).ok
    with tarfile.open(fileobj=io.BytesIO(b"".join(b.read_home(sid))), mode="r") as tf:
        names = tf.getnames()
    assert names.index("./.alineo/session.json") < 5, names[:10]
    assert names.index("./.alineo/session.json") < names.index("./0late") < names.index("./a/1")


def test_pack_and_unpack_home_zstd(sandboxes):
    b = sandboxes.backend
    src = sandboxes.started("agent-src")
    assert b.exec(src, ["sh", "-c", "mkdir -p w && for i in 1 2 3; do echo $i > w/f$i; done"]).ok
    packed = pack_home(b, src)
    assert packed[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic
    dst = sandboxes.started("agent-dst")
    unpack_home(b, dst, packed)
    assert b.exec(dst, ["cat", "w/f1", "w/f2", "w/f3"]).stdout == b"1\n2\n3\n"


def test_write_home_refuses_an_escaping_tar(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started()
    with pytest.raises(UnsafeArchive):
        b.write_home(sid, [_tar({"../escaped.txt": b"no"})])
    res = b.exec(sid, ["sh", "-c", 'ls "$HOME/.." | grep -c escaped.txt || true'])
    assert res.stdout.strip() == b"0"


def test_stop_restart_keeps_home_then_remove(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started()
    assert b.exec(sid, ["sh", "-c", "echo kept > kept.txt"]).ok
    t0 = time.monotonic()
    b.stop(sid)
    # init=True / process group: no 10 s SIGTERM wait (9 s: a margin for two busy cores)
    assert time.monotonic() - t0 < 9
    assert b.status(sid) is SandboxStatus.EXITED
    with pytest.raises(SandboxNotRunning) as info:
        b.exec(sid, ["true"])
    assert not info.value.permanent
    b.stop(sid)  # stopping a stopped sandbox is a no-op
    b.start(sid)  # rung 3 of the ladder: the disk is intact
    assert b.status(sid) is SandboxStatus.RUNNING
    assert b.exec(sid, ["cat", "kept.txt"]).stdout == b"kept\n"
    b.remove(sid)
    assert b.status(sid) is SandboxStatus.MISSING
    with pytest.raises(SandboxNotFound) as info:
        b.exec(sid, ["true"])
    assert info.value.permanent
    with pytest.raises(SandboxNotFound):
        b.start(sid)
    b.remove(sid)  # removing a missing sandbox is a no-op


def test_command_exit_is_seen_as_exited(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started(command=["sh", "-c", "exit 3"])
    deadline = time.monotonic() + 10
    while b.status(sid) is SandboxStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b.status(sid) is SandboxStatus.EXITED


def test_commit_then_create_from_the_snapshot(sandboxes):
    b = sandboxes.backend
    sid = sandboxes.started()
    assert b.exec(sid, ["sh", "-c", "echo from-setup > setup.txt"]).ok
    ref = sandboxes.commit(sid, f"alineo-test-snap:{os.getpid()}-{time.monotonic_ns()}")
    assert b.image_exists(ref)
    child = sandboxes.started("agent-2", image=ref)
    assert b.exec(child, ["cat", "setup.txt"]).stdout == b"from-setup\n"


def test_missing_image_and_bad_arguments(sandboxes):
    b = sandboxes.backend
    missing = ("alineo-no-such-image:0" if b.name == "docker"
               else "local-snapshot/no-such-snapshot")
    assert not b.image_exists(missing)
    with pytest.raises(ImageMissing) as info:
        sandboxes.create(image=missing)
    assert info.value.permanent
    with pytest.raises(SandboxError, match="network"):
        sandboxes.create(network="bridge")
    with pytest.raises(SandboxError, match="limits.pids"):
        sandboxes.create(limits={"pids": -1})
    assert b.status("0" * 12 if b.name == "docker" else "local-000000000000") \
        is SandboxStatus.MISSING


def test_run_dir_is_shared_with_the_host(sandboxes, tmp_path):
    b = sandboxes.backend
    run_dir = tmp_path / "run"
    sid = sandboxes.started(run_dir=str(run_dir))
    assert b.exec(sid, ["sh", "-c", 'echo hi > "$ALINEO_RUN_DIR/from-inside"']).ok
    assert (run_dir / "from-inside").read_text() == "hi\n"


# --- docker only ------------------------------------------------------------------------
def test_docker_container_is_locked_down(docker_sandboxes, tmp_path):
    sandboxes = docker_sandboxes
    b = sandboxes.backend
    sid = sandboxes.started("agent-lock", run_dir=str(tmp_path / "run"),
                            limits={"pids": 128, "memory_mb": 300}, labels={"team": "t1"})
    info = b.inspect(sid)
    host = info["HostConfig"]
    assert host["Init"] is True
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["PidsLimit"] == 128
    assert host["Memory"] == 300 * 1024 * 1024
    assert host["Privileged"] is False
    labels = info["Config"]["Labels"]
    assert labels["alineo.agent"] == "agent-lock" and labels["team"] == "t1"
    assert labels["alineo.managed"] == "1"
    assert not info["Config"].get("Volumes")  # mounts=, never volumes=
    assert [(m["Type"], m["Destination"]) for m in info["Mounts"]] == [("bind", "/run/alineo")]
    assert set(info["NetworkSettings"]["Networks"]) == {"none"}
    # only the loopback interface inside
    res = b.exec(sid, ["python3", "-c", "import socket; print(sorted(n for _, n in socket.if_nameindex()))"])
    assert res.text.strip() == "['lo']"
    # capabilities really are gone: root cannot chown a file
    res = b.exec(sid, ["sh", "-c", "touch f && chown 1000 f"])
    assert res.exit_code != 0


def test_docker_host_network_only_when_asked(docker_sandboxes):
    sandboxes = docker_sandboxes
    sid = sandboxes.create(network="host")
    assert sandboxes.backend.inspect(sid)["HostConfig"]["NetworkMode"] == "host"


def test_local_process_outlives_its_parent_group(local_sandboxes):
    sandboxes = local_sandboxes
    b = sandboxes.backend
    sid = sandboxes.started()
    pid = b._pid(sid)  # the init of its PID namespace
    assert pid and os.getpgid(pid) != os.getpgrp()  # not in our process group
    assert os.getsid(pid) != os.getsid(0)  # nor our session: no controlling terminal of ours


# --- the factory ------------------------------------------------------------------------------
def test_get_backend_honours_the_setting(settings):
    reset()
    try:
        settings.ALINEO_SANDBOX = "local"
        local = get_backend()
        assert local.name == "local"
        assert str(local.root) == str(settings.DATA_DIR / "sandboxes")
        settings.ALINEO_SANDBOX = "docker"
        assert get_backend().name == "docker"
        settings.ALINEO_SANDBOX = "auto"
        assert get_backend().name == ("docker" if docker_engine_answers() else "local")
        settings.ALINEO_SANDBOX = "kubernetes"
        with pytest.raises(SandboxError, match="ALINEO_SANDBOX"):
            get_backend()
    finally:
        reset()


def test_local_sandbox_outlives_the_process_that_started_it(local_sandboxes):
    """A control plane that exits (or crashes) leaves its sandboxes running; the
    next one sees them through the recorded pid and can stop them."""
    import subprocess
    import sys

    from sandboxes.backends.local import LocalBackend

    b = local_sandboxes.backend
    sid = local_sandboxes.create("agent-outlive")
    code = (
        "import sys; from sandboxes.backends.local import LocalBackend; "
        "LocalBackend(root=sys.argv[1]).start(sys.argv[2])"
    )
    subprocess.run([sys.executable, "-c", code, str(b.root), sid], check=True, timeout=30,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    fresh = LocalBackend(root=b.root)  # another control plane
    assert fresh.status(sid) is SandboxStatus.RUNNING
    assert fresh.exec(sid, ["echo", "still here"]).stdout == b"still here\n"
    fresh.stop(sid, timeout=5)
    assert fresh.status(sid) is SandboxStatus.EXITED


def test_write_home_before_start_then_start(sandboxes):
    """The restore rung: load a checkpoint into a created sandbox, then start it."""
    b = sandboxes.backend
    sid = sandboxes.create("agent-restore")
    b.write_home(sid, [_tar({"./restored/state.json": b'{"turn": 3}'})])
    b.start(sid)
    assert b.exec(sid, ["cat", "restored/state.json"]).stdout == b'{"turn": 3}'


def test_the_default_image_is_the_base_image(sandboxes):
    """Specs say "default" (sessions.specs.DEFAULT_IMAGE): docker runs the base
    image built by `manage.py build_base_image`, local runs on the host."""
    b = sandboxes.backend
    assert b.image_exists("default")
    sid = sandboxes.started(image="default")
    assert b.exec(sid, ["python3", "-c", "print('py ok')"]).stdout == b"py ok\n"


def test_an_unisolated_sandbox_is_moved_into_bubblewrap_and_back(tmp_path):
    """A data dir upgraded in place (docs/LOCAL_SANDBOX.md): a running sandbox of
    the unisolated backend is one the local backend will not exec into and asks
    to restart; its next start runs it under bubblewrap, home intact. Switching
    to unisolated again moves it out the same way."""
    import sys

    from sandboxes.backends.local import LocalBackend
    from sandboxes.backends.unisolated import UnisolatedBackend

    root, run = tmp_path / "sandboxes", tmp_path / "run"
    unisolated, local = UnisolatedBackend(root=root), LocalBackend(root=root)
    sid = unisolated.create("agent-move", "default", run_dir=str(run), env={"PYTHONPATH": str(run)},
                            command=[sys.executable, "-S", "-c", "import time; time.sleep(600)"])
    try:
        unisolated.start(sid)
        assert unisolated.exec(sid, ["sh", "-c", "echo kept > kept.txt"]).ok
        assert local.restart_reason(sid) == "isolation_changed:none->bwrap"
        with pytest.raises(SandboxNotRunning, match="without bubblewrap"):
            local.exec(sid, ["true"])
        local.stop(sid, 5)
        local.start(sid)
        assert local.restart_reason(sid) is None
        res = local.exec(sid, ["sh", "-c", 'id -u; cat kept.txt; echo "$PYTHONPATH"'])
        assert res.text.split() == ["1000", "kept", "/run/alineo"], res
        assert unisolated.restart_reason(sid) == "isolation_changed:bwrap->none"
        unisolated.stop(sid, 5)
        assert unisolated.status(sid) is SandboxStatus.EXITED
        unisolated.start(sid)
        res = unisolated.exec(sid, ["sh", "-c", 'cat kept.txt; echo "$PYTHONPATH"'])
        assert res.text.split() == ["kept", str(run)], res
    finally:
        local.remove(sid)
