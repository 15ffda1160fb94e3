import os

from django.core.management.base import BaseCommand, CommandError

from sessions.backup import BackupError, prune, write_bundle


class Command(BaseCommand):
    help = ("Write a consistent, versioned backup bundle to DIR/alineo-backup-<UTC time>/ while the "
            "server keeps running: the database (online copy), the checkpoint files, inputs, the "
            "secret key and the docker images in use, with a manifest of sha256 sums.")

    def add_arguments(self, parser):
        parser.add_argument("--to", required=True, metavar="DIR", help="where bundles are kept")
        parser.add_argument("--no-images", action="store_true", help="do not docker save the images")
        parser.add_argument("--keep", type=int, default=0, metavar="K",
                            help="afterwards remove all but the newest K bundles in DIR")

    def handle(self, **options):
        os.umask(0o077)  # a bundle holds transcripts and the secret key: private files
        try:
            bundle = write_bundle(options["to"], images=not options["no_images"],
                                  say=lambda m: self.stdout.write(m))
            if options["keep"] > 0:
                for old in prune(options["to"], options["keep"]):
                    self.stdout.write(f"removed the old bundle {old}")
        except (BackupError, OSError) as exc:
            raise CommandError(f"backup failed: {exc}") from exc
        self.stdout.write(str(bundle))
