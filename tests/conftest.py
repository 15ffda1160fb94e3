"""Shared actors: an owner and a teammate in one workspace, an outsider in
another, and an operator (a member granted agent_sessions.approve_credentials)."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from sessions.models import Agent, ApiToken, Workspace
from tests.fault_report import pytest_runtest_logreport, pytest_terminal_summary  # noqa: F401 (hooks)


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
