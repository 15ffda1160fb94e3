"""`manage.py issue_token USERNAME [--label L]`: print a new API token.

Only the token goes to stdout, so scripts can do TOKEN=$(… issue_token bob).
The token is shown once: only its SHA-256 is stored.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection, transaction

from sessions.models import ApiToken, Workspace

from .ensure_admin import DEFAULT_WORKSPACE

LABEL_MAX = ApiToken._meta.get_field("label").max_length


class Command(BaseCommand):
    help = ("Print a new API token for USERNAME (Authorization: Bearer <token>). It is written to "
            "the server's database, in ALINEO_DATA_DIR (default ./var, which `make run` uses): run "
            "this with the server's ALINEO_DATA_DIR.")

    def add_arguments(self, parser):
        parser.add_argument("username", help="an existing user of the server (e.g. admin)")
        parser.add_argument("--label", default="", help="A note to tell tokens apart (e.g. 'ci').")

    def handle(self, *args, username, label, **options):
        if len(label) > LABEL_MAX:
            raise CommandError(f"--label is longer than {LABEL_MAX} characters.")
        why = no_database()
        if why:
            if settings.DATA_DIR_MADE_NOW:  # made by this very command: take it back
                shutil.rmtree(settings.DATA_DIR, ignore_errors=True)
            raise CommandError(
                f"{why}. ALINEO_DATA_DIR is {settings.DATA_DIR}: run this command with the "
                "server's ALINEO_DATA_DIR (`make run` uses ./var), or run `make migrate` first.")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}. Create one with `manage.py createsuperuser`.")
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: a token for it would not authenticate.")
        with transaction.atomic():
            if not Workspace.objects.filter(members=user).exists():
                # A token for a user in no workspace would see nothing at all.
                workspace, _ = Workspace.objects.get_or_create(name=DEFAULT_WORKSPACE)
                workspace.members.add(user)
                self.stderr.write(f"{username} was in no workspace: added to '{workspace.name}'.")
            _, raw = ApiToken.issue(user, label=label)
        self.stdout.write(raw)


def no_database() -> str | None:
    """Why there is no migrated database to issue a token in, or None. Checked
    before the first query, so a wrong data dir is a sentence, not a traceback
    ("no such table: auth_user") — and SQLite is not asked to create a file."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3") and not Path(db["NAME"]).exists():
        return f"No database at {db['NAME']}"
    try:
        tables = connection.introspection.table_names()
    except DatabaseError as exc:
        return f"The database cannot be read ({exc})"
    if get_user_model()._meta.db_table not in tables:
        return "The database has no tables yet (it was never migrated)"
    return None
