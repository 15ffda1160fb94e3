from datetime import timedelta
from pathlib import Path

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from sandboxes import config

from . import journal
from .gateway import budget
from .models import (
    ENDED, Agent, ApiToken, Checkpoint, Command, Credential, Event, RetentionSweep, Snapshot, Workspace,
)
from .specs import LIMIT_MAX

MAX_DAYS = settings.ALINEO_CHECKPOINT_MAX_DAYS
#: Workspace quotas (docs/SECURITY.md#children-approvals-and-quotas), edited on its page.
#: Daily budgets (docs/GATEWAY.md#budgets): the model gateway refuses calls beyond them.
BUDGET_FIELDS = ["budget_tokens_per_day", "budget_usd_per_day"]
QUOTA_FIELDS = ["max_agents", "max_depth", "max_sandboxes", "max_memory_mb", "max_pids",
                "max_cpus", "max_streams_per_user"]


class WorkspaceForm(forms.ModelForm):
    class Meta:
        model = Workspace
        fields = ["name", "members", "checkpoint_max_age_days", "keep_newest_checkpoints",
                  "zero_data_retention", *QUOTA_FIELDS, *BUDGET_FIELDS]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # No browser-side max: an over-long value must reach us and get the clear message.
        # (A view-only admin's form has no editable fields at all.)
        if "checkpoint_max_age_days" in self.fields:
            self.fields["checkpoint_max_age_days"].widget.attrs.pop("max", None)

    def clean_checkpoint_max_age_days(self):
        days = self.cleaned_data["checkpoint_max_age_days"]
        if days is not None and days > MAX_DAYS:
            raise forms.ValidationError(
                f"Checkpoints can be kept at most {MAX_DAYS} days; {days} is too long. "
                f"Choose 1 to {MAX_DAYS} days: retention may be shortened, never lengthened beyond {MAX_DAYS}."
            )
        if days is not None and days < 1:
            raise forms.ValidationError("Keep checkpoints at least 1 day (or set zero data retention).")
        return days


def retention_effect(workspace: Workspace, now=None) -> dict:
    """What the worker's sweep removes under this workspace's policy, now:
    checkpoints past their age, and those beyond the newest N per agent."""
    now = now or timezone.now()
    live = Checkpoint.objects.filter(agent__workspace=workspace, deleted_at=None)
    cutoff = now - timedelta(days=workspace.checkpoint_max_age_days)
    too_old = live.filter(Q(created_at__lt=cutoff) | Q(expires_at__lte=now))
    beyond_newest = 0
    for agent_id in live.order_by().values_list("agent_id", flat=True).distinct():
        beyond_newest += max(0, live.filter(agent_id=agent_id).count() - workspace.keep_newest_checkpoints)
    zdr = live.count() if workspace.zero_data_retention else 0
    return {"live": live.count(), "too_old": too_old.count(), "beyond_newest": beyond_newest,
            "zero_data_retention": zdr, "cutoff": cutoff}


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    form = WorkspaceForm
    list_display = ["name", "checkpoint_max_age_days", "keep_newest_checkpoints", "zero_data_retention",
                    "checkpoints_kept"]
    filter_horizontal = ["members"]
    readonly_fields = ["sweep_effect", "quota_usage", "budget_spent"]
    fieldsets = [
        (None, {"fields": ["name", "members"]}),
        ("Quotas", {
            "fields": [*QUOTA_FIELDS, "quota_usage"],
            "description": "What this workspace's agents and members may use at once. A spawn "
                           "beyond a quota is refused with a quota.* error that names the field "
                           "to raise here; an agent beyond the concurrent sandboxes waits for a "
                           f"slot. Spec limits are capped here within the global maximum "
                           f"({LIMIT_MAX['memory_mb']} MB, {LIMIT_MAX['pids']} processes, "
                           f"{LIMIT_MAX['cpus']} CPUs).",
        }),
        ("Budget", {
            "fields": [*BUDGET_FIELDS, "budget_spent"],
            "description": "What this workspace's agents may spend on models per UTC day, in "
                           "tokens or in USD (at ALINEO_MODEL_PRICES). Once either is reached "
                           "the model gateway refuses further calls until 00:00 UTC "
                           "(budget.exceeded in the agent's transcript; its turn ends). Leave "
                           "empty for no budget.",
        }),
        ("Retention policy", {
            "fields": ["checkpoint_max_age_days", "keep_newest_checkpoints", "zero_data_retention",
                       "sweep_effect"],
            "description": f"Checkpoint max age is at most {MAX_DAYS} days. The worker's retention "
                           "sweep applies a change: it deletes what the policy no longer keeps.",
        }),
    ]

    @admin.display(description="In use now")
    def quota_usage(self, obj):
        if obj is None or obj.pk is None:
            return "Saved workspaces show what their agents use."
        live = Agent.objects.filter(workspace=obj).exclude(status__in=ENDED)
        # A sandbox slot as sessions/worker/slots.py counts it.
        sandboxes = live.filter(sandbox_slot=True).count()
        return format_html("{} of {} live agents, {} of {} sandboxes", live.count(),
                           obj.max_agents, sandboxes, obj.max_sandboxes)

    @admin.display(description="Spent today")
    def budget_spent(self, obj):
        if obj is None or obj.pk is None:
            return "Saved workspaces show what their agents spent today."
        b = budget.summary(obj)
        return format_html("{} tokens, ${} in {} model calls on {} UTC{}", f"{b['today']['tokens']:,}",
                           f"{b['today']['cost_usd']:.4f}", b["today"]["calls"], b["today"]["day"],
                           " — budget reached: calls are refused" if b["exceeded"] else "")

    @admin.display(description="Live checkpoints")
    def checkpoints_kept(self, obj):
        return Checkpoint.objects.filter(agent__workspace=obj, deleted_at=None).count()

    @admin.display(description="Effect of this policy (as saved)")
    def sweep_effect(self, obj):
        if obj is None or obj.pk is None:
            return "Saved workspaces show what the sweep removes under their policy."
        e = retention_effect(obj)
        lines = [
            ("Live checkpoints", e["live"]),
            (f"Older than {obj.checkpoint_max_age_days} days or expired (removed by the next sweep)",
             e["too_old"]),
            (f"Beyond the newest {obj.keep_newest_checkpoints} per agent (removed by the next sweep)",
             e["beyond_newest"]),
        ]
        if obj.zero_data_retention:
            lines.append(("Zero data retention: every checkpoint is removed, none taken", e["zero_data_retention"]))
        last = RetentionSweep.objects.first()
        lines.append(("Last sweep (all workspaces)",
                      f"{last.finished_at:%Y-%m-%d %H:%M:%S} UTC, removed {last.removed}"
                      f"{' ' + str(last.by_reason) if last.by_reason else ''}" if last else "not run yet"))
        return format_html("<ul class='sweep-effect'>{}</ul>",
                           format_html_join("", "<li>{}: <strong>{}</strong></li>", lines))


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


def expired_q(now) -> Q:
    """Checkpoints past their own date or past their workspace's policy."""
    q = Q(expires_at__lte=now)
    for ws_id, days in Workspace.objects.values_list("id", "checkpoint_max_age_days"):
        q |= Q(agent__workspace_id=ws_id, created_at__lte=now - timedelta(days=days))
    return q


class ExpiredFilter(admin.SimpleListFilter):
    title = "expired"
    parameter_name = "expired"

    def lookups(self, request, model_admin):
        return [("yes", "Expired or deleted"), ("no", "Live")]

    def queryset(self, request, queryset):
        gone = expired_q(timezone.now()) | Q(deleted_at__isnull=False)
        if self.value() == "yes":
            return queryset.filter(gone)
        if self.value() == "no":
            return queryset.exclude(gone)
        return queryset


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "workspace", "turn", "through_seq", "bytes", "created_at",
                    "expires", "deleted_at"]
    list_select_related = ["agent__workspace"]
    list_filter = [("agent__workspace", admin.RelatedOnlyFieldListFilter), ExpiredFilter, "agent"]
    search_fields = ["agent__id", "sandbox_id"]
    actions = ["expire_now", "delete_now"]

    @admin.display(description="Workspace")
    def workspace(self, obj):
        return obj.agent.workspace

    @admin.display(description="Expires")
    def expires(self, obj):
        """Under the workspace's policy now: a shortened one expires it sooner."""
        return obj.expires

    @admin.action(description="Expire now (the next sweep deletes them)")
    def expire_now(self, request, queryset):
        n = queryset.filter(deleted_at=None).update(expires_at=timezone.now())
        self.message_user(request, f"{n} checkpoint(s) expire now; the worker's sweep deletes them.",
                          messages.SUCCESS)

    @admin.action(description="Delete now (archive file and all)")
    def delete_now(self, request, queryset):
        """The file goes, the row keeps its metadata, and the agent's transcript
        says who deleted it (``agent.checkpoint_deleted``): a restore after it
        can tell an operator's deletion from an expiry."""
        root = config.data_dir().checkpoints.resolve()
        now, n = timezone.now(), 0
        for cp in queryset.filter(deleted_at=None):
            if cp.path:
                path = Path(cp.path).resolve()
                if path.is_relative_to(root):
                    path.unlink(missing_ok=True)
            with transaction.atomic():
                if Checkpoint.objects.filter(pk=cp.pk, deleted_at=None).update(
                        deleted_at=now, expires_at=min(cp.expires_at, now)):
                    journal.append(cp.agent_id, "agent.checkpoint_deleted", {
                        "checkpoint": cp.pk, "turn": cp.turn, "by": request.user.get_username()})
                    n += 1
        self.message_user(request, f"{n} checkpoint(s) deleted.", messages.SUCCESS)


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ["agent", "through_seq", "version", "created_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "label", "created_at"]
    readonly_fields = ["digest", "prefix"]

    def has_add_permission(self, request):
        return False  # tokens are issued by `manage.py issue_token`, which shows the secret once


class CredentialForm(forms.ModelForm):
    # Write-only: the stored value is never rendered back into the page.
    secret = forms.CharField(widget=forms.PasswordInput(render_value=False), required=False,
                             help_text="Leave empty to keep the stored value.")

    class Meta:
        model = Credential
        fields = ["workspace", "name", "secret"]

    def clean_secret(self):
        value = self.cleaned_data.get("secret")
        if not value:
            if self.instance.pk:
                return self.instance.secret
            raise forms.ValidationError("A new credential needs a value.")
        return value


@admin.register(Credential)
class CredentialAdmin(admin.ModelAdmin):
    form = CredentialForm
    list_display = ["name", "workspace", "updated_at"]
    list_filter = ["workspace"]
    search_fields = ["name"]
