from django.core.management.base import BaseCommand

from sessions.worker.retention import sweep


class Command(BaseCommand):
    help = "Apply the workspaces' checkpoint retention policies now (the worker also does this periodically)."

    def handle(self, **options):
        run = sweep()
        self.stdout.write(f"removed {run.removed} checkpoint(s) {run.by_reason or ''}".rstrip())
