"""`manage.py ensure_admin`: the first admin user and the "default" workspace.

Idempotent, so `make run` calls it on every start. A generated password is
printed only when the user is created: it is stored hashed, so no later run
could print it again, and none tries.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from sessions.models import Workspace

ADMIN_USERNAME = "admin"
DEFAULT_WORKSPACE = "default"
PASSWORD_ENV = "ALINEO_ADMIN_PASSWORD"


class Command(BaseCommand):
    help = "Create the superuser 'admin' (once) and the 'default' workspace with admin as a member."

    def handle(self, *args, **options):
        with transaction.atomic():
            user, password, created = ensure_admin_user()
            workspace = ensure_default_workspace(user)
        if created and password is not None:
            self.stdout.write(
                f"Created superuser '{ADMIN_USERNAME}' with password: {password}\n"
                f"  (shown once; it is not stored in clear. Set {PASSWORD_ENV} to choose it.)"
            )
        elif created:
            self.stdout.write(f"Created superuser '{ADMIN_USERNAME}' with the password from {PASSWORD_ENV}.")
        elif settings.ALINEO_ADMIN_PASSWORD and not user.check_password(settings.ALINEO_ADMIN_PASSWORD):
            # Never overwrite a password someone may have changed since.
            self.stderr.write(
                f"'{ADMIN_USERNAME}' already exists: {PASSWORD_ENV} is ignored "
                f"(use `manage.py changepassword {ADMIN_USERNAME}`)."
            )
        self.stdout.write(f"Workspace '{workspace.name}' has '{ADMIN_USERNAME}' as a member.")


def ensure_admin_user():
    """Return (user, generated password or None, created)."""
    User = get_user_model()
    user = User.objects.filter(username=ADMIN_USERNAME).first()
    if user is not None:
        return user, None, False
    chosen = settings.ALINEO_ADMIN_PASSWORD or None
    password = chosen or secrets.token_urlsafe(12)
    user = User.objects.create_superuser(ADMIN_USERNAME, email="", password=password)
    return user, (None if chosen else password), True


def ensure_default_workspace(user) -> Workspace:
    workspace, _ = Workspace.objects.get_or_create(name=DEFAULT_WORKSPACE)
    workspace.members.add(user)  # a no-op when already a member
    return workspace
