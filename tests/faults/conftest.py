"""The fault-injection suite: each scenario drives a real server
through its JSON API, injects a fault, brings the system back and counts
invariant violations (tests.faults.invariants). At the end of the session a
summary table is printed: scenario, iterations, rungs taken (from
``agent.restored`` facts), violations (must be 0), outcome and time.
"""

from __future__ import annotations

import logging
import time

import pytest

from tests.faults import harness


logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the report


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.faults)
            item.add_marker(pytest.mark.live)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        item._fault_outcome = ("xfailed" if hasattr(rep, "wasxfail") and rep.skipped
                               else "xpassed" if hasattr(rep, "wasxfail") else rep.outcome)


@pytest.fixture
def fault_row(request):
    """A row of the summary table for this scenario; the test fills it in."""
    row = harness.Row(request.node.name.removeprefix("test_"))
    t0 = time.monotonic()
    yield row
    row.seconds = time.monotonic() - t0
    row.outcome = getattr(request.node, "_fault_outcome", "?")
    harness.REPORT.append(row)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
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
