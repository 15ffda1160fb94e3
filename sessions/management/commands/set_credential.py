"""manage.py set_credential WORKSPACE NAME — store a secret agents can bind by name.

The value is read from standard input (or --from-env VAR), never from the
command line, so it stays out of shell history and `ps`."""

import os
import sys

from django.core.management.base import BaseCommand, CommandError

from sessions.credentials import set_secret
from sessions.models import Workspace


class Command(BaseCommand):
    help = "Store (or replace) a credential of a workspace. The value comes from stdin or --from-env."

    def add_arguments(self, parser):
        parser.add_argument("workspace")
        parser.add_argument("name")
        parser.add_argument("--from-env", metavar="VAR", help="read the value from this environment variable")

    def handle(self, workspace, name, from_env=None, **options):
        ws = Workspace.objects.filter(name=workspace).first()
        if ws is None:
            raise CommandError(f"no workspace named {workspace!r}")
        if not name or len(name) > 100:
            raise CommandError("the name must be 1 to 100 characters")
        if from_env:
            value = os.environ.get(from_env)
            if value is None:
                raise CommandError(f"the environment variable {from_env} is not set")
        else:
            if sys.stdin.isatty():
                self.stderr.write("Paste the secret, then press Enter:")
            value = sys.stdin.readline().rstrip("\n")
        if not value:
            raise CommandError("the secret is empty; nothing was stored")
        set_secret(ws, name, value)
        self.stdout.write(f"stored credential {name!r} in workspace {ws.name!r}")
