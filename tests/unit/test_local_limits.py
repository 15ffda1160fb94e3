"""How the local backend enforces limits (sandboxes/backends/limits.py): the
decision between cgroup v2 and rlimits, the files a delegated cgroup gets,
and the rlimit and CPU arguments. The cgroup part runs against a directory
laid out like cgroupfs (this machine's /sys/fs/cgroup is a v1 hybrid)."""

from __future__ import annotations

import os

import pytest

from sandboxes.backends import limits
from sandboxes.backends.limits import CgroupFacts, Enforcement, decide

ALL = frozenset({"cpu", "memory", "pids", "io"})


def test_cgroup_v1_or_hybrid_means_rlimits():
    plan = decide(CgroupFacts("tmpfs", "/user.slice"))
    assert plan.mode == "rlimit" and "not a cgroup v2 hierarchy" in plan.reason
    assert decide(CgroupFacts("", None)).mode == "rlimit"


def test_v2_without_our_cgroup_or_controllers_or_rights_means_rlimits():
    assert "no cgroup v2" in decide(CgroupFacts("cgroup2", None)).reason
    plan = decide(CgroupFacts("cgroup2", "/a", controllers=frozenset({"cpu", "pids"}), writable=True))
    assert plan.mode == "rlimit" and "memory" in plan.reason
    plan = decide(CgroupFacts("cgroup2", "/a", controllers=ALL, writable=False))
    assert plan.mode == "rlimit" and "not delegated" in plan.reason


def test_a_delegated_cgroup_with_controllers_handed_down_is_used_as_it_is():
    plan = decide(CgroupFacts("cgroup2", "/system.slice/alineo.service", controllers=ALL,
                              subtree_control=frozenset({"cpu", "memory", "pids"}), writable=True))
    assert plan == Enforcement("cgroup2", "delegated",
                               base="/sys/fs/cgroup/system.slice/alineo.service")


def test_a_delegated_cgroup_we_are_alone_in_is_used_after_moving_to_a_leaf():
    plan = decide(CgroupFacts("cgroup2", "/svc", controllers=ALL, writable=True))
    assert plan.mode == "cgroup2" and plan.move_self and plan.base == "/sys/fs/cgroup/svc"


def test_a_delegated_cgroup_shared_with_other_processes_means_rlimits():
    plan = decide(CgroupFacts("cgroup2", "/svc", controllers=ALL, writable=True, others_inside=True))
    assert plan.mode == "rlimit" and "other processes" in plan.reason


def test_describe_says_which():
    assert decide(CgroupFacts("tmpfs", "/")).describe().startswith("rlimits: ")
    assert "cgroup v2 under" in decide(CgroupFacts("cgroup2", "/svc", controllers=ALL,
                                                   writable=True)).describe()


def test_this_machine_is_observed_without_error():
    plan = limits.enforcement()
    assert plan.mode in ("cgroup2", "rlimit") and plan.reason


def test_make_cgroup_writes_the_limits_and_moves_us_to_the_leaf(tmp_path, monkeypatch):
    """cgroupfs stand-in: directories and plain files where the kernel has its own."""
    base = tmp_path / "svc"
    base.mkdir()
    (base / "cgroup.subtree_control").write_text("")
    made = []
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777, *a, **k):  # the kernel fills a new cgroup with its files
        real_mkdir(path, mode)
        made.append(str(path))
        for name in ("cgroup.procs", "cgroup.subtree_control", "pids.max", "memory.max",
                     "memory.swap.max", "cpu.max"):
            open(os.path.join(path, name), "w").close()

    monkeypatch.setattr(os, "mkdir", mkdir)
    plan = Enforcement("cgroup2", "delegated", base=str(base), move_self=True)
    path = limits.make_cgroup(plan, "local-abc", limits.cgroup_values(64, 256, 1.5))
    assert path == str(base / "alineo" / "local-abc")
    assert (base / "alineo-control" / "cgroup.procs").read_text() == str(os.getpid())
    assert (base / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (base / "alineo" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    sandbox = base / "alineo" / "local-abc"
    assert (sandbox / "pids.max").read_text() == "64"
    assert (sandbox / "memory.max").read_text() == str(256 * 1024 * 1024)
    assert (sandbox / "memory.swap.max").read_text() == "0"
    assert (sandbox / "cpu.max").read_text() == "150000 100000"
    # A second sandbox: the leaf and the parent are made once.
    limits.make_cgroup(plan, "local-def", limits.cgroup_values(10, 10, None))
    assert made.count(str(base / "alineo-control")) == 1
    assert not (base / "alineo" / "local-def" / "cpu.max").read_text()  # no cpus asked: unset


def test_rlimits_and_their_prlimit_argv():
    values = limits.rlimits(pids=40, memory_mb=64)
    assert values == {"nproc": 40, "as": 64 * 1024 * 1024}
    assert limits.prlimit_argv(values) == ["prlimit", "--nproc=40:40", f"--as={64 << 20}:{64 << 20}",
                                           "--"]


@pytest.mark.parametrize("cpus,expected", [(None, None), (0.5, 1), (1.0, 1), (1.2, 2), (8, None)])
def test_cpus_become_whole_cpus_spread_by_sandbox(cpus, expected):
    got = limits.cpu_set(cpus, "local-0123456789ab", available=[0, 1, 2, 3])
    assert (got if got is None else len(got)) == expected
    if got:
        assert set(got) <= {0, 1, 2, 3}
    spread = {tuple(limits.cpu_set(1, f"local-{i:012x}", available=[0, 1, 2, 3])) for i in range(16)}
    assert len(spread) > 1  # not every sandbox on CPU 0
