"""Shared actors: an owner and a teammate in one workspace, an outsider in
another, and an operator (a member granted agent_sessions.approve_credentials)."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from sessions.models import Agent, ApiToken, Workspace
from tests.fault_report import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 (hooks)


#: Fixtures through which a test reaches the database (pytest-django's).
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences",
               "django_db_serialized_rollback", "live_server"}


def touches_database(item) -> bool:
    """Whether a test can reach the database: pytest-django refuses any query
    from a test without its django_db marker or a db fixture, so one with
    neither runs the same code on every engine."""
    return (item.get_closest_marker("django_db") is not None
            or bool(DB_FIXTURES & set(getattr(item, "fixturenames", ()))))


#: The live test files that take the longest (seconds, summed over their tests
#: in a `make test` run on 3 xdist workers: `--junitxml`, grouped by file).
#: `--dist loadfile` hands files out in collection order, so these go first:
#: the longest last would leave one worker running it while the others idle.
LONGEST_FILES = {
    "tests/faults/test_pi_faults.py": 252,
    "tests/faults/test_kill_control_plane.py": 220,
    "tests/integration/test_pi_agent.py": 182,
    "tests/faults/test_reboot.py": 179,
    "tests/integration/test_worker.py": 113,
    "tests/integration/test_rebuild_reasons.py": 112,
    "tests/integration/test_ladder.py": 89,
    "tests/upgrade/test_upgrade_in_place.py": 88,
    "tests/integration/test_sandbox_sessions.py": 88,
    "tests/integration/test_backup_restore.py": 81,
    "tests/integration/test_idle_unload.py": 74,
    "tests/browser/test_transcript_turns.py": 72,
}


def longest_first(items: list) -> None:
    """Reorder ``items`` so the files of :data:`LONGEST_FILES` come first,
    longest first; the order within a file, and of the rest, is kept."""
    if not LONGEST_FILES:
        return
    def weight(item) -> float:
        rel = os.path.relpath(str(item.fspath), os.path.dirname(os.path.dirname(__file__)))
        return -LONGEST_FILES.get(rel.replace(os.sep, "/"), 0.0)
    items.sort(key=weight)  # stable: a file's own order stays


def pytest_collection_modifyitems(config, items):
    longest_first(items)
    deselect_engine_independent(config, items)


def deselect_engine_independent(config, items):
    """`make test`'s PostgreSQL pass (ALINEO_TEST_PASS=postgresql) runs only the
    unit tests that touch the database: the others (the bridge, the gateway,
    parsers, pure functions …) cannot behave differently on another engine and
    ran in the SQLite pass. (By hand, on PostgreSQL without ALINEO_TEST_PASS,
    every unit test runs.)"""
    if os.environ.get("ALINEO_TEST_PASS") != "postgresql":
        return
    unit = os.sep + os.path.join("tests", "unit") + os.sep
    kept, dropped = [], []
    for item in items:
        (dropped if unit in str(item.fspath) and not touches_database(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        print(f"\nPostgreSQL pass: {len(dropped)} unit tests that cannot reach the database "
              "deselected (they ran in the SQLite pass)")


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    # Hashing test users' passwords with PBKDF2 costs ~0.5 s per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _keep_the_umask():
    """`serve`, `runworker` and `backup` set umask 077 for their process (a
    private data dir); a test that calls one must not hand it to the next."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture(scope="session", autouse=True)
def _flush_agents_before_events():
    """Django's test flush deletes tables in no fixed order, but the transcript's
    append-only trigger refuses deleting the events of an agent that still
    exists. Delete agent rows first (foreign keys are checked at commit)."""
    from django.db import connection

    if connection.vendor != "sqlite":  # PostgreSQL flushes with TRUNCATE: no row triggers fire
        yield
        return
    from django.db.backends.sqlite3.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, **kwargs):
        statements = original(self, style, tables, **kwargs)
        return sorted(statements, key=lambda sql: "agent_sessions_agent" not in sql)

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = original


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """pytest-django's, plus: on PostgreSQL the test database can only be
    dropped when nobody else is connected, and the journal's committer thread
    (it closes its connection after 1 s idle) or a process just stopped may
    still be. End those sessions before pytest-django drops it."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    except Exception:  # best effort: the worst case is pytest-django's warning
        pass


@pytest.fixture
def workspace(db):
    return Workspace.objects.create(name="acme")


@pytest.fixture
def other_workspace(db):
    return Workspace.objects.create(name="globex")


def _user(name, ws):
    user = get_user_model().objects.create_user(name, password=f"{name}-password-123")
    ws.members.add(user)
    return user


@pytest.fixture
def owner(workspace):
    return _user("olivia", workspace)


@pytest.fixture
def teammate(workspace):
    return _user("tomas", workspace)


@pytest.fixture
def outsider(other_workspace):
    return _user("oscar", other_workspace)


def grant_approve(user):
    """Grant the permission that approves held credentials (as an admin does
    in the admin); returns the user re-read, since Django caches permissions."""
    user.user_permissions.add(approve_permission())
    return get_user_model().objects.get(pk=user.pk)


def approve_permission() -> Permission:
    return Permission.objects.get(codename="approve_credentials",
                                  content_type__app_label="agent_sessions")


@pytest.fixture
def operator(workspace):
    """A member of the owner's workspace who may approve held credentials."""
    return grant_approve(_user("opal", workspace))


@pytest.fixture
def owner_token(owner):
    return ApiToken.issue(owner)[1]


@pytest.fixture
def agent(workspace, owner):
    """An agent row with no transcript yet (journal tests append to it)."""
    return Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
