"""The durability settings read back from live connections (sessions/durability.py):
this process's, a fresh thread's (as the group committer's), and a connection
asking for less is refused before it can acknowledge anything."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections

from sessions import durability

pytestmark = pytest.mark.django_db(transaction=True)


def _raw(conn) -> dict[str, str]:
    """Straight from the database, not through sessions/durability.py."""
    with conn.cursor() as c:
        if conn.vendor == "sqlite":
            return {p: str(c.execute(f"PRAGMA {p}").fetchone()[0])
                    for p in ("journal_mode", "synchronous", "busy_timeout")}
        out = {}
        for name in ("synchronous_commit", "fsync"):
            c.execute(f"SHOW {name}")
            out[name] = c.fetchone()[0]
        return out


def _wanted(conn) -> dict[str, str]:
    if conn.vendor == "sqlite":
        return {"journal_mode": "wal", "synchronous": "2", "busy_timeout": "20000"}
    # fsync is the server's own (.ci/services-up's throwaway cluster runs without):
    # read back and reported, not asked for here.
    return {"synchronous_commit": "on", "fsync": _raw(conn)["fsync"]}


def test_this_process_and_a_fresh_thread_read_back_durable_settings():
    assert _raw(connection) == _wanted(connection)
    seen = {}

    def in_thread():  # a new thread opens its own connection, as the committer's does
        try:
            seen["settings"] = _raw(connections["default"])
        finally:
            connections.close_all()
    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert seen["settings"] == _wanted(connection)


@pytest.mark.sqlite_only
def test_a_connection_asking_for_less_than_full_is_refused():
    params = connections["default"].settings_dict
    weak = connections.create_connection("default")
    weak.settings_dict = {**params, "OPTIONS": {
        **params["OPTIONS"], "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}}
    with pytest.raises(ImproperlyConfigured, match="synchronous is NORMAL"):
        weak.ensure_connection()
    assert weak.connection is None
    weak.close()


def test_what_is_refused():
    sqlite = {"vendor": "sqlite", "journal_mode": "wal", "synchronous": "FULL"}
    assert durability.refusal(sqlite) is None
    assert "synchronous" in durability.refusal({**sqlite, "synchronous": "OFF"})
    assert "journal_mode" in durability.refusal({**sqlite, "journal_mode": "delete"})
    pg = {"vendor": "postgresql", "synchronous_commit": "on", "fsync": "on"}
    assert durability.refusal(pg) is None
    assert durability.refusal({**pg, "synchronous_commit": "off"})
    assert durability.refusal({**pg, "fsync": "off"}) is None  # the server's: warned, not refused
