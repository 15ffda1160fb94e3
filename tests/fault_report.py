"""The fault-injection summary table, printed at the end of the run.

Each fault scenario's `fault_row` fixture (tests/faults/conftest.py) attaches
its row to the test's report as a user property. The rows are gathered here,
from the reports, so the table is whole also when the live suites run on
pytest-xdist workers (`make test`'s LIVE_JOBS): the hooks run where the
reports arrive (the controller), not where the scenarios ran.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

PROPERTY = "alineo_fault_row"


def row_property(row) -> tuple[str, dict]:
    """A fault row as a report user property (plain JSON, for xdist)."""
    data = asdict(row)
    data["rungs"] = dict(row.rungs)
    data["placements"] = dict(row.placements)
    data["violations"] = [str(v) for v in row.violations]
    data["seed"] = None if row.seed is None else str(row.seed)
    return PROPERTY, data


def pytest_runtest_logreport(report):
    if report.when != "teardown":
        return
    from tests.faults import harness

    for name, data in getattr(report, "user_properties", ()):
        if name == PROPERTY:
            harness.REPORT.append(harness.Row(**{**data, "rungs": Counter(data["rungs"]),
                                                 "placements": Counter(data.get("placements") or {})}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.faults import harness

    rows = harness.REPORT
    if not rows:
        return
    tr = terminalreporter
    tr.section("fault-injection summary")
    head = f"{'scenario':<52} {'iter':>4}  {'rungs taken':<40} {'violations':>10}  {'outcome':<8} {'time':>7}"
    tr.write_line(head)
    tr.write_line("-" * len(head))
    for r in rows:
        rungs = ", ".join(f"{k}×{v}" for k, v in sorted(r.rungs.items())) or "-"
        tr.write_line(f"{r.scenario[:52]:<52} {r.iterations:>4}  {rungs[:40]:<40} "
                      f"{len(r.violations):>10}  {r.outcome:<8} {r.seconds:>6.1f}s")
    for r in rows:
        if r.placements:
            landed = ", ".join(f"{k}×{v}" for k, v in sorted(r.placements.items()))
            tr.write_line(f"kills landed [{r.scenario}]: {landed}")
    seeds = sorted({str(r.seed) for r in rows if r.seed is not None})
    if seeds:
        tr.write_line(f"seed(s): {', '.join(seeds)} (rerun with ALINEO_FAULT_SEED=<seed>)")
    for r in rows:
        for v in r.violations[:20]:
            tr.write_line(f"VIOLATION [{r.scenario}] {v}")
