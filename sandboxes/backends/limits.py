"""How the local backend enforces a sandbox's limits (pids, memory, CPU).

**cgroup v2**, where the machine delegates it: the unified hierarchy is
mounted at /sys/fs/cgroup, this process's cgroup offers the memory, pids and
cpu controllers and is writable by us. Each sandbox then gets
``<our cgroup>/alineo/<id>`` with ``pids.max``, ``memory.max`` (no swap) and
``cpu.max``: totals for the whole sandbox, as docker's are. A cgroup with
processes cannot hand controllers to its children, so the first launch moves
this process into the leaf ``<our cgroup>/alineo-control`` (systemd's rule for
delegated services) when it is the only one there.

**rlimits** otherwise (this machine: /sys/fs/cgroup is a cgroup v1 tmpfs):
``RLIMIT_NPROC`` = pids, set inside the sandbox's own user namespace, where
the kernel counts the processes of that namespace only (so it is a total for
the sandbox, and a uid shared with other sandboxes does not matter);
``RLIMIT_AS`` = memory_mb for *each process* (not a total); ``cpus`` rounded
up to whole CPUs the sandbox may run on (affinity), not a share of time.

:func:`decide` is pure (tests/unit/test_local_limits.py); :func:`enforcement`
looks at this machine once per process.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "memory", "pids")
SANDBOXES_DIR = "alineo"
LEAF_DIR = "alineo-control"


@dataclass(frozen=True)
class Enforcement:
    """``mode`` is "cgroup2" (``base``: the cgroup whose children the
    sandboxes' cgroups are; ``move_self``: enter the leaf first) or "rlimit"."""

    mode: str
    reason: str
    base: str | None = None
    move_self: bool = False

    def describe(self) -> str:
        if self.mode == "cgroup2":
            return f"cgroup v2 under {self.base} ({self.reason})"
        return f"rlimits: {self.reason}"


@dataclass(frozen=True)
class CgroupFacts:
    """What :func:`decide` needs to know about this machine."""

    fs_type: str                      # of /sys/fs/cgroup: "cgroup2", "tmpfs" (v1/hybrid) …
    own: str | None                   # our cgroup v2 path ("0::<path>" in /proc/self/cgroup)
    controllers: frozenset[str] = frozenset()      # <own>/cgroup.controllers
    subtree_control: frozenset[str] = frozenset()  # <own>/cgroup.subtree_control
    writable: bool = False            # we may create cgroups in <own> and write its files
    others_inside: bool = False       # processes other than ours are in <own>


def decide(facts: CgroupFacts) -> Enforcement:
    """cgroup v2 where delegated, else rlimits, with the reason either way."""
    if facts.fs_type != "cgroup2":
        return Enforcement("rlimit", f"{CGROUP_ROOT} is {facts.fs_type or 'missing'}, "
                                     "not a cgroup v2 hierarchy")
    if facts.own is None:
        return Enforcement("rlimit", "this process is in no cgroup v2 cgroup")
    missing = [c for c in CONTROLLERS if c not in facts.controllers]
    if missing:
        return Enforcement("rlimit", f"cgroup {facts.own} does not offer the "
                                     f"{', '.join(missing)} controller(s)")
    if not facts.writable:
        return Enforcement("rlimit", f"cgroup {facts.own} is not delegated to this user")
    base = str(CGROUP_ROOT / facts.own.lstrip("/"))
    if all(c in facts.subtree_control for c in CONTROLLERS):
        return Enforcement("cgroup2", "delegated", base=base)
    if facts.others_inside:
        return Enforcement("rlimit", f"cgroup {facts.own} holds other processes, so it "
                                     "cannot enable controllers for sandboxes")
    return Enforcement("cgroup2", "delegated; this process moves to the leaf "
                                  f"{LEAF_DIR}", base=base, move_self=True)


def _read_set(path: Path) -> frozenset[str]:
    try:
        return frozenset(path.read_text().split())
    except OSError:
        return frozenset()


def _fs_type(path: Path) -> str:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    kind = ""
    for line in mounts:  # the last mount on the path is the one seen
        fields = line.split()
        if len(fields) > 2 and fields[1] == str(path):
            kind = fields[2]
    return kind


def observe(root: Path = CGROUP_ROOT) -> CgroupFacts:
    fs_type = _fs_type(root)
    own = None
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                own = line[3:] or "/"
    except OSError:
        pass
    if fs_type != "cgroup2" or own is None:
        return CgroupFacts(fs_type, own)
    here = root / own.lstrip("/")
    members = _read_set(here / "cgroup.procs")
    return CgroupFacts(
        fs_type, own, _read_set(here / "cgroup.controllers"), _read_set(here / "cgroup.subtree_control"),
        writable=os.access(here, os.W_OK) and os.access(here / "cgroup.subtree_control", os.W_OK),
        others_inside=bool(members - {str(os.getpid())}),
    )


@functools.lru_cache(maxsize=1)
def enforcement() -> Enforcement:
    return decide(observe())


# --- cgroup v2 --------------------------------------------------------------------------------


def cgroup_values(pids: int, memory_mb: int, cpus: float | None) -> dict[str, str]:
    values = {"pids.max": str(pids), "memory.max": str(memory_mb * 1024 * 1024),
              "memory.swap.max": "0"}
    if cpus:
        values["cpu.max"] = f"{max(1000, int(cpus * 100000))} 100000"
    return values


def make_cgroup(plan: Enforcement, sandbox_id: str, values: dict[str, str]) -> str:
    """The sandbox's cgroup with its limits written (made once; kept while it exists)."""
    base = Path(plan.base)
    enable = " ".join(f"+{c}" for c in CONTROLLERS)
    if plan.move_self and not (base / LEAF_DIR).is_dir():
        (base / LEAF_DIR).mkdir(exist_ok=True)
        (base / LEAF_DIR / "cgroup.procs").write_text(str(os.getpid()))
        (base / "cgroup.subtree_control").write_text(enable)
    parent = base / SANDBOXES_DIR
    if not parent.is_dir():
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text(enable)
    path = parent / sandbox_id
    path.mkdir(exist_ok=True)
    for name, value in values.items():
        try:
            (path / name).write_text(value)
        except FileNotFoundError:
            if name != "memory.swap.max":  # a kernel without swap accounting
                raise
    return str(path)


def remove_cgroup(plan: Enforcement, sandbox_id: str) -> None:
    if plan.mode == "cgroup2":
        try:
            (Path(plan.base) / SANDBOXES_DIR / sandbox_id).rmdir()
        except OSError:
            pass


# --- rlimits ----------------------------------------------------------------------------------


def rlimits(pids: int, memory_mb: int) -> dict[str, int]:
    """The rlimits of every process in a sandbox: ``nproc`` and ``as`` (bytes)."""
    return {"nproc": pids, "as": memory_mb * 1024 * 1024}


def prlimit_argv(values: dict[str, int]) -> list[str]:
    """util-linux prlimit (on the sandbox's /usr) setting soft = hard limits."""
    return ["prlimit", *(f"--{name}={value}:{value}" for name, value in values.items()), "--"]


def cpu_set(cpus: float | None, sandbox_id: str, available: list[int] | None = None) -> list[int] | None:
    """Whole CPUs for ``cpus`` (rounded up), spread over the machine by the
    sandbox id; None when no limit is asked for or it covers every CPU."""
    if not cpus:
        return None
    available = sorted(available if available is not None else os.sched_getaffinity(0))
    count = min(len(available), max(1, math.ceil(cpus)))
    if count >= len(available):
        return None
    start = int.from_bytes(sandbox_id.encode(), "big") % len(available)
    return sorted(available[(start + i) % len(available)] for i in range(count))
