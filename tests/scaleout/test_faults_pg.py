"""The fault scenarios on the scale-out engines: the kill -9 of the control
plane and the loss of a sandbox (restore and rebuild) from tests/faults, run
against a server on PostgreSQL + Redis (this pass's test database), checked by
the same invariants (tests/faults/invariants.py). Local backend; fewer
iterations than the SQLite pass (`ALINEO_FAULT_PG_ITERATIONS`, default 3) —
the same code, so the point is the engine, not the count."""

from __future__ import annotations

import os
import time

import pytest

from tests.engines import database_url
from tests.fault_report import row_property
from tests.faults.harness import Row, make_server
from tests.faults.test_container_loss import loss_scenario
from tests.faults.test_kill_control_plane import kill_scenario

pytestmark = pytest.mark.django_db(transaction=True)

ITERATIONS = int(os.environ.get("ALINEO_FAULT_PG_ITERATIONS") or 3)


def _server():
    """A server on this pass's PostgreSQL test database (migrated by
    pytest-django) and Redis."""
    server = make_server("local", env={"DATABASE_URL": database_url(),
                                       "REDIS_URL": os.environ["REDIS_URL"]})
    server._migrated = True  # the test database is migrated; the SQLite template is not it
    return server


@pytest.fixture
def row(request):
    """A row of the fault summary table (tests/fault_report.py gathers it)."""
    out = Row("")
    t0 = time.monotonic()
    yield out
    out.seconds = time.monotonic() - t0
    out.outcome = "passed" if not out.violations else "failed"
    request.node.user_properties.append(row_property(out))
    print(f"[faults] {out.scenario}: {out.iterations} iteration(s), rungs {dict(out.rungs)}, "
          f"kills landed {dict(out.placements)}, {len(out.violations)} violation(s)")


def test_kill_minus_nine_on_postgresql(row):
    kill_scenario("local", row, _server(), ITERATIONS, label="kill -9 control plane, PostgreSQL")


@pytest.mark.parametrize("checkpoint", [True, False], ids=["restore", "rebuild"])
def test_sandbox_removed_on_postgresql(checkpoint, row):
    loss_scenario("local", checkpoint, row, _server(), label=", PostgreSQL")
