"""manage.py note AGENT_ID TEXT: append an operator's note to an agent's transcript.

An operator tool, and the simplest commit from another process: an open stream
in the server must receive it (through the data_version watcher on SQLite, or
the channel layer on Redis)."""

from django.core.management.base import BaseCommand, CommandError

from sessions import journal


class Command(BaseCommand):
    help = "Append an operator.note fact {\"text\": TEXT} to an agent's transcript and print its seq."

    def add_arguments(self, parser):
        parser.add_argument("agent_id")
        parser.add_argument("text")

    def handle(self, *args, agent_id, text, **options):
        try:
            record = journal.append(agent_id, "operator.note", {"text": text})
        except journal.UnknownAgent:
            raise CommandError(f"No agent {agent_id}.")
        except journal.JournalError as exc:
            raise CommandError(str(exc))
        self.stdout.write(str(record.seq))
