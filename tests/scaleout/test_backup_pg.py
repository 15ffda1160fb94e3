"""Backup and restore on PostgreSQL (the unit tests' round trips restore into
SQLite files and are skipped on PostgreSQL): a bundle written from the test
database (pg_dump) is restored by `manage.py restore` into a second, empty
database of the same cluster, as on a new machine; the transcript, the
append-only triggers, the checkpoint paths and the data dir come back, and a
second restore into the now non-empty database needs --force and saves the old
contents first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from sessions import journal
from sessions.backup import write_bundle
from sessions.models import Agent, AgentLease, Checkpoint
from tests.engines import database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def target_db():
    """An empty database on the same server, dropped afterwards."""
    name = f"alineo_restore_{uuid.uuid4().hex[:10]}"
    with connection.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    yield name
    with connection.cursor() as cur:
        # Client sessions only: an autovacuum worker on the new database is a
        # superuser's process, not ours to end, and DROP DATABASE ends it itself.
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND backend_type = 'client backend'", [name])
        cur.execute(f'DROP DATABASE IF EXISTS "{name}"')


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _django(env: dict[str, str], code: str):
    out = _manage(env, "shell", "--no-startup", "-c", f"import json\n{code}\nprint('@@' + json.dumps(result))")
    assert out.returncode == 0, out.stderr
    return json.loads(next(line[2:] for line in out.stdout.splitlines() if line.startswith("@@")))


def test_a_bundle_restores_into_another_postgres_database(workspace, owner, tmp_path, target_db):
    src = tmp_path / "src"
    src.mkdir()
    (src / "secret_key").write_text("s3cret-key")
    agent = Agent.objects.create(workspace=workspace, created_by=owner,
                                 spec={"model": "demo", "checkpoint": True}, sandbox_id="sb0")
    journal.append_many(agent.id, [("message.user", {"text": f"hello {i}"}) for i in range(12)])
    folder = src / "checkpoints" / agent.id
    folder.mkdir(parents=True)
    for turn in (1, 2):
        path = folder / f"sb0-t{turn}.tar.zst"
        path.write_bytes(os.urandom(1000 + turn))
        Checkpoint.objects.create(agent=agent, sandbox_id="sb0", turn=turn, through_seq=turn * 4,
                                  path=str(path), bytes=path.stat().st_size,
                                  expires_at=timezone.now() + timedelta(days=30))

    AgentLease.objects.create(agent=agent, holder="old-box/1:2:3", acquired_at=timezone.now(),
                              expires_at=timezone.now() + timedelta(seconds=20))

    bundle = write_bundle(tmp_path / "backups", images=False, data_dir=src)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["database"]["engine"] == "postgresql" and manifest["database"]["events"] == 12
    assert manifest["database"]["file"].endswith(".pgdump")

    dst = tmp_path / "dst"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DATABASE_URL=database_url(target_db), ALINEO_DATA_DIR=str(dst))
    done = _manage(env, "restore", "--from", str(bundle), "--no-images")
    assert done.returncode == 0, done.stdout + done.stderr

    got = _django(env, (
        "from django.db import connection, transaction\n"
        "from sessions.models import Agent, AgentLease, Checkpoint, Event\n"
        f"a = Agent.objects.get(pk={agent.id!r})\n"
        "seqs = list(Event.objects.filter(agent=a).order_by('seq').values_list('seq', flat=True))\n"
        "refused = False\n"
        "try:\n"
        "    with transaction.atomic():\n"
        "        Event.objects.filter(agent=a).update(type='x')\n"
        "except Exception:\n"
        "    refused = True\n"
        "result = {'seqs': seqs, 'last_seq': a.last_seq, 'refused': refused,\n"
        "          'leases': AgentLease.objects.count(),\n"
        "          'paths': sorted(Checkpoint.objects.filter(agent=a).values_list('path', flat=True))}\n"
    ))
    assert got["seqs"] == list(range(1, 13)) and got["last_seq"] == 12
    assert got["refused"], "the restored transcript is not append-only (trigger missing)"
    assert got["leases"] == 0  # the old deployment's workers do not hold the agents here
    assert got["paths"] == [str(dst / "checkpoints" / agent.id / f"sb0-t{t}.tar.zst") for t in (1, 2)]
    assert all(Path(p).is_file() for p in got["paths"])
    assert (dst / "secret_key").read_text() == "s3cret-key"
    # The source database was not touched by the restore.
    assert sorted(Checkpoint.objects.values_list("path", flat=True)) == sorted(
        str(folder / f"sb0-t{t}.tar.zst") for t in (1, 2))

    # Again, into the database that now holds data: refused without --force …
    again = _manage(env, "restore", "--from", str(bundle), "--no-images")
    assert again.returncode != 0 and "--force" in (again.stdout + again.stderr)
    # … and with it, the current contents are dumped aside first.
    forced = _manage(env, "restore", "--from", str(bundle), "--no-images", "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert list(tmp_path.glob("dst.before-restore-*/database-before-restore.pgdump"))
