"""A second Docker engine of the tests' own (never the developer's): its own
data root, exec root, socket, pidfile and cgroup parent, started with no
bridge network, stopped by its PID and removed at the end. Used by the reboot
fault test and the sandbox-hosts test (an engine of "another machine", which
may also listen on tcp://127.0.0.1:<port>)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.faults.harness import RUN_ID, cannot_run
from tests.live import parent_dir


class SecondDockerd:
    def __init__(self, tcp_port: int | None = None):
        for tool in ("dockerd", "containerd", "docker"):
            if shutil.which(tool) is None:
                cannot_run(f"{tool} is not installed")
        self.root = Path(tempfile.mkdtemp(prefix="rb-", dir=parent_dir()))
        self.data_root = self.root / "data"
        self.exec_root = self.root / "exec"
        self.pidfile = self.root / "dockerd.pid"
        self.sock = self.root / "docker.sock"
        self.host = f"unix://{self.sock}"
        # Also on loopback TCP when asked: how an engine of another machine is reached.
        self.tcp_host = f"tcp://127.0.0.1:{tcp_port}" if tcp_port else None
        self.cgroup_parent = f"alineo-reboot-{RUN_ID}-{uuid.uuid4().hex[:6]}"
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "dockerd.log"

    # --- lifecycle -----------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        self.pidfile.unlink(missing_ok=True)  # a stale one (left by SIGKILL) blocks the start
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "--data-root", str(self.data_root), "--exec-root", str(self.exec_root),
                 "--pidfile", str(self.pidfile), "-H", self.host,
                 *(["-H", self.tcp_host] if self.tcp_host else []), "--bridge=none",
                 "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
                 "--cgroup-parent", self.cgroup_parent, "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the second dockerd exited:\n{self.log.read_text()[-3000:]}")
            if self.docker("info", check=False, timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"the second dockerd did not answer:\n{self.log.read_text()[-3000:]}")

    def docker(self, *args: str, check: bool = True, timeout: float = 300,
               **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(["docker", "-H", self.host, *args], capture_output=True,
                           timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {r.stderr.decode(errors='replace')}")
        return r

    def load_image(self, tag: str) -> None:
        save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
        try:
            r = subprocess.run(["docker", "-H", self.host, "load"], stdin=save.stdout,
                               capture_output=True, timeout=600)
        finally:
            save.stdout.close()
            save.wait(60)
        if r.returncode != 0 or save.returncode != 0:
            raise RuntimeError(f"docker save | load failed: {r.stderr.decode(errors='replace')}")

    # --- the processes of THIS engine only ------------------------------------------------
    def _dockerd_pid(self) -> int | None:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc.pid
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def processes(self) -> dict[str, list[int]]:
        """dockerd (its pidfile), containerd (its child), shims (whose -address
        lies in this exec-root) and container processes (this cgroup parent)."""
        dockerd = self._dockerd_pid()
        out: dict[str, list[int]] = {"dockerd": [dockerd] if dockerd else [], "containerd": [],
                                     "shim": [], "container": []}
        address = f"{self.exec_root}/".encode()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            pid = int(p.name)
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
                stat = (p / "stat").read_text()
                cgroup = (p / "cgroup").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            name = os.path.basename(argv[0]).decode(errors="replace") if argv and argv[0] else ""
            if dockerd and ppid == dockerd and name == "containerd":
                out["containerd"].append(pid)
            elif name.startswith("containerd-shim") and any(a.startswith(address) for a in argv):
                out["shim"].append(pid)
            elif f"/{self.cgroup_parent}/" in cgroup and pid not in out["dockerd"]:
                out["container"].append(pid)
        return out

    def reboot(self) -> dict[str, list[int]]:
        """SIGKILL everything of this engine at once, then clean up as a boot would."""
        procs = self.processes()
        for pids in procs.values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.proc is not None:
            self.proc.wait(30)
        for pids in procs.values():
            for pid in pids:
                _wait_gone(pid)
        self._unmount()
        shutil.rmtree(self.exec_root, ignore_errors=True)  # /run does not survive a reboot
        self.pidfile.unlink(missing_ok=True)
        return procs

    def _unmount(self) -> None:
        root = str(self.root) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(root)]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)

    def stop(self) -> None:
        """Remove its containers, stop it by PID, kill what is left of it, unmount, delete."""
        try:
            if self._dockerd_pid():
                ids = self.docker("ps", "-aq", check=False, timeout=30).stdout.decode().split()
                if ids:
                    self.docker("rm", "-f", *ids, check=False, timeout=60)
        except (subprocess.TimeoutExpired, OSError):
            pass
        pid = self._dockerd_pid()
        if pid:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if self.proc is not None and self.proc.pid == pid:
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            else:
                _wait_gone(pid, 30)
        for pids in self.processes().values():
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._unmount()
        shutil.rmtree(self.root, ignore_errors=True)


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
