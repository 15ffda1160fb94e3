"""Credential values stay out of backup bundles: the bundle keeps which
credentials existed (workspace and name, in the manifest's
``database.credentials_left_out``) but never a value, so a bundle copied elsewhere
leaks no secret. After a restore an operator sets them again
(`manage.py set_credential WORKSPACE NAME`); until then an agent's binding
to one is skipped, as for a deleted credential (sessions/credentials.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessions.models import Credential, Workspace

TABLE = Credential._meta.db_table
#: pg_dump's argument that keeps the table (its schema) but none of its rows.
PG_DUMP_ARGS = (f"--exclude-table-data={TABLE}",)


def left_out_of_sqlite(copy: Path) -> list[dict]:
    """Delete every credential row from the bundle's SQLite copy (and VACUUM,
    so no freed page keeps a value); returns what was left out."""
    conn = sqlite3.connect(copy)
    try:
        names = [{"workspace": ws, "name": name} for ws, name in conn.execute(
            f"SELECT w.name, c.name FROM {TABLE} c JOIN {Workspace._meta.db_table} w "
            "ON w.id = c.workspace_id ORDER BY w.name, c.name")]
        conn.execute("PRAGMA secure_delete = ON")  # deleted cells are zeroed, not just freed
        conn.execute(f"DELETE FROM {TABLE}")
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()
    return names


def left_out_of_postgres() -> list[dict]:
    """What pg_dump leaves out with PG_DUMP_ARGS (read from the live database)."""
    return [{"workspace": ws, "name": name} for ws, name in
            Credential.objects.order_by("workspace__name", "name")
            .values_list("workspace__name", "name")]


def note(database: dict) -> str | None:
    """The restore's reminder of what to set again (from the manifest's
    ``database`` entry), or None."""
    names = database.get("credentials_left_out") or []
    if not names:
        return None
    listed = ", ".join(f"{n['workspace']}/{n['name']}" for n in names[:20])
    more = f" and {len(names) - 20} more" if len(names) > 20 else ""
    return (f"{len(names)} credential value(s) are never in a bundle; set them again with "
            f"`manage.py set_credential WORKSPACE NAME`: {listed}{more}")
