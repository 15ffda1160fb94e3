from django.core.management.base import BaseCommand, CommandError

from sessions.backup import BackupError, BundleRefused, restore_bundle, verify_bundle


class Command(BaseCommand):
    help = ("Restore a backup bundle into this deployment's data dir (and database). The bundle is "
            "verified completely first; a truncated, altered or unknown-version bundle is refused "
            "and nothing changes. Stop the server first.")

    def add_arguments(self, parser):
        parser.add_argument("--from", required=True, dest="source", metavar="DIR",
                            help="a bundle, or the directory `backup --to` wrote into (its newest bundle)")
        parser.add_argument("--force", action="store_true",
                            help="restore over a data dir that holds data, moving it aside first")
        parser.add_argument("--no-images", action="store_true", help="do not docker load the images")
        parser.add_argument("--verify-only", action="store_true", help="check the bundle, change nothing")

    def handle(self, **options):
        say = lambda m: self.stdout.write(m)
        try:
            if options["verify_only"]:
                v = verify_bundle(options["source"], images=not options["no_images"])
                say(f"{v.bundle}: ok (version {v.manifest['version']}, {len(v.checked)} file(s) checked)")
                return
            restore_bundle(options["source"], force=options["force"], images=not options["no_images"],
                           say=say)
        except BundleRefused as exc:
            raise CommandError(f"refused: {exc}. Nothing was changed.") from exc
        except (BackupError, OSError) as exc:
            raise CommandError(f"restore failed: {exc}") from exc
