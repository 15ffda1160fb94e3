"""manage.py build_base_image: build the sandbox base image offline, print its tag."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from sandboxes import images
from sandboxes.errors import SandboxError


class Command(BaseCommand):
    help = (
        "Build the minimal Debian base image for docker sandboxes (mmdebstrap | docker import), "
        "tagged alineo-base:<hash of the build inputs>; skipped when it exists. Prints the tag."
    )

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
        parser.add_argument("--print-tag", action="store_true",
                            help="print the tag the inputs give, build nothing")

    def handle(self, *args, force=False, print_tag=False, **options):
        try:
            if print_tag:
                self.stdout.write(images.base_image_tag())
                return
            tag, built = images.ensure_base_image(
                force=force, log=lambda msg: self.stderr.write(msg)
            )
        except SandboxError as exc:
            raise CommandError(str(exc)) from exc
        if not built:
            self.stderr.write(f"{tag} is present; nothing to build")
        self.stdout.write(tag)
