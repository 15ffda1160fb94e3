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

from tests.fault_report import row_property
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
    # Gathered from the reports by tests/fault_report.py (also under xdist).
    request.node.user_properties.append(row_property(row))
