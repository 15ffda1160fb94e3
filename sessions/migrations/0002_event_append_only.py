"""The transcript is append-only, enforced by the database itself.

UPDATE of an event is always refused. DELETE is refused while the event's
agent exists: the only way to drop a transcript is to purge the whole agent
(journal.purge_agent deletes the agent row first, in one transaction)."""

from django.db import migrations

SQLITE_UP = [
    """CREATE TRIGGER agent_sessions_event_no_update BEFORE UPDATE ON agent_sessions_event
       BEGIN SELECT RAISE(ABORT, 'transcript events are append-only: UPDATE refused'); END""",
    """CREATE TRIGGER agent_sessions_event_no_delete BEFORE DELETE ON agent_sessions_event
       WHEN EXISTS (SELECT 1 FROM agent_sessions_agent WHERE id = OLD.agent_id)
       BEGIN SELECT RAISE(ABORT, 'transcript events are append-only: DELETE refused'); END""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS agent_sessions_event_no_update",
    "DROP TRIGGER IF EXISTS agent_sessions_event_no_delete",
]
PG_UP = [
    """CREATE OR REPLACE FUNCTION agent_sessions_event_append_only() RETURNS trigger AS $$
       BEGIN
         IF TG_OP = 'UPDATE' THEN
           RAISE EXCEPTION 'transcript events are append-only: UPDATE refused';
         END IF;
         IF EXISTS (SELECT 1 FROM agent_sessions_agent WHERE id = OLD.agent_id) THEN
           RAISE EXCEPTION 'transcript events are append-only: DELETE refused';
         END IF;
         RETURN OLD;
       END $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER agent_sessions_event_append_only BEFORE UPDATE OR DELETE
       ON agent_sessions_event FOR EACH ROW EXECUTE FUNCTION agent_sessions_event_append_only()""",
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS agent_sessions_event_append_only ON agent_sessions_event",
    "DROP FUNCTION IF EXISTS agent_sessions_event_append_only()",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        for sql in statements_by_vendor.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("agent_sessions", "0001_initial")]

    operations = [
        migrations.RunPython(
            _run({"sqlite": SQLITE_UP, "postgresql": PG_UP}),
            _run({"sqlite": SQLITE_DOWN, "postgresql": PG_DOWN}),
        )
    ]
