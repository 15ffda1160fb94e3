from django.contrib import admin

from .models import Agent, ApiToken, Checkpoint, Command, Event, Snapshot, Workspace


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "checkpoint_max_age_days", "keep_newest_checkpoints", "zero_data_retention"]
    filter_horizontal = ["members"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written by the journal or the worker: looked at, never edited here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdmin):
    list_display = ["id", "workspace", "parent", "status", "sandbox_id", "last_seq", "created_at"]
    list_filter = ["workspace", "status"]
    search_fields = ["id", "sandbox_id"]


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["agent", "seq", "type", "ts"]
    list_filter = ["type"]
    search_fields = ["agent__id"]


@admin.register(Command)
class CommandAdmin(ReadOnlyAdmin):
    list_display = ["id", "verb", "agent", "user", "state", "response_status", "created_at"]
    list_filter = ["verb", "state"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "turn", "through_seq", "bytes", "created_at", "expires_at"]


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ["agent", "through_seq", "version", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "label", "created_at"]
    readonly_fields = ["digest", "prefix"]

    def has_add_permission(self, request):
        return False  # tokens are issued by `manage.py issue_token`, which shows the secret once
