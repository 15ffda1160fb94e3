"""The fault scenarios on the scale-out engines: the kill -9 of the control
plane, the loss of sandboxes (restore and rebuild, at each placed moment) from
tests/faults, and the backup / wipe / restore of tests/integration, run against
servers on PostgreSQL + Redis (this pass's test database; the restore into a
second, empty database), checked by the same invariants
(tests/faults/invariants.py) and assertions. Local backend; fewer repetitions
than the SQLite pass (`ALINEO_FAULT_PG_ITERATIONS` kills, default 4: one at
each placed moment; one round of sandbox losses) — the same code, so the point
is the engine, not the count."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from tests.engines import database_url
from tests.integration.test_backup_restore import backup_wipe_restore
from tests.live import parent_dir
from tests.scaleout.test_backup_pg import target_db  # noqa: F401 - a fixture
from tests.fault_report import row_property
from tests.faults.harness import Row, make_server
from tests.faults.test_container_loss import loss_scenario
from tests.faults.test_kill_control_plane import kill_scenario

pytestmark = pytest.mark.django_db(transaction=True)

ITERATIONS = int(os.environ.get("ALINEO_FAULT_PG_ITERATIONS") or 4)


def _server(db: str | None = None, data_dir=None, migrated: bool = True):
    """A server on this pass's PostgreSQL test database (migrated by
    pytest-django), or on database `db` of the same cluster, and Redis."""
    server = make_server("local", env={"DATABASE_URL": database_url(db),
                                       "REDIS_URL": os.environ["REDIS_URL"]}, data_dir=data_dir)
    server._migrated = migrated  # never the SQLite template over this database
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


def test_sandbox_removed_on_postgresql(row):
    loss_scenario("local", row, _server(), 1, label=", PostgreSQL")


def test_backup_wipe_restore_on_postgresql(tmp_path, target_db):
    """tests/integration/test_backup_restore.py's scenario: the bundle (a
    pg_dump) restored into an empty database, as on a new machine."""
    new_dir = Path(tempfile.mkdtemp(prefix="restored-", dir=parent_dir()))
    backup_wipe_restore("local", _server(), _server(target_db, new_dir, migrated=False),
                        tmp_path / "backups", engine="postgresql", refused="--force")
