"""The durable state of Alineo. Events are the truth; every other row is either
identity (Workspace, Agent), bookkeeping (Command, ApiToken, Checkpoint) or a
cache of a replay (Snapshot)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from sandboxes.archive import KEEP_CHECKPOINTS

from .specs import LIMIT_MAX


#: The largest budgets an operator may set (a typo of many zeros is refused, not obeyed).
BUDGET_MAX_TOKENS = 10**15
BUDGET_MAX_USD = 10**9


def new_agent_id() -> str:
    return "ag_" + secrets.token_hex(8)


class Workspace(models.Model):
    """A tenant: its users, agents and retention policy."""

    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="workspaces", blank=True)
    checkpoint_max_age_days = models.PositiveSmallIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(30)],
        help_text="Checkpoints expire this many days after they are taken (at most 30).",
    )
    keep_newest_checkpoints = models.PositiveSmallIntegerField(
        default=KEEP_CHECKPOINTS, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    zero_data_retention = models.BooleanField(
        default=False, help_text="Take no checkpoints and no snapshots for this workspace's agents."
    )
    # Quotas (docs/SECURITY.md#children-approvals-and-quotas). The defaults fit a 2-core machine; an
    # admin raises them on the workspace's admin page.
    max_agents = models.PositiveIntegerField(
        "max live agents", default=32, validators=[MinValueValidator(1)],
        help_text="Agents that have not ended (stopped, lost, unrecoverable). "
                  "A spawn beyond it is refused (quota.agents).")
    max_depth = models.PositiveSmallIntegerField(
        "max tree depth", default=4, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="A root agent is at depth 1, its child at 2 … A spawn deeper is refused "
                  "(quota.depth).")
    max_sandboxes = models.PositiveIntegerField(
        "max concurrent sandboxes", default=8, validators=[MinValueValidator(1)],
        help_text="Agents with a live sandbox. Beyond it a new or unloaded agent waits for a "
                  "slot (its status says so) instead of starting.")
    max_memory_mb = models.PositiveIntegerField(
        "max memory per agent (MB)", default=4096,
        validators=[MinValueValidator(1), MaxValueValidator(LIMIT_MAX["memory_mb"])],
        help_text="The largest spec limits.memory_mb (quota.limits).")
    max_pids = models.PositiveIntegerField(
        "max processes per agent", default=1024,
        validators=[MinValueValidator(1), MaxValueValidator(LIMIT_MAX["pids"])],
        help_text="The largest spec limits.pids (quota.limits).")
    max_cpus = models.FloatField(
        "max CPUs per agent", default=2.0,
        validators=[MinValueValidator(0.01), MaxValueValidator(LIMIT_MAX["cpus"])],
        help_text="The largest spec limits.cpus (quota.limits).")
    max_streams_per_user = models.PositiveSmallIntegerField(
        "max open streams per user", default=16, validators=[MinValueValidator(1)],
        help_text="Open SSE streams one member may hold on this workspace's agents, per serving "
                  "process (quota.streams, 429).")
    # Budgets per UTC day (docs/GATEWAY.md#budgets): empty is no budget. The gateway refuses a
    # model call once the day's model.call facts of the workspace's agents reach either.
    budget_tokens_per_day = models.PositiveBigIntegerField(
        "token budget per day", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(BUDGET_MAX_TOKENS)],
        help_text="Input, output and cache tokens of all agents per UTC day. Empty: no budget.")
    budget_usd_per_day = models.FloatField(
        "cost budget per day (USD)", null=True, blank=True,
        validators=[MinValueValidator(0.0001), MaxValueValidator(BUDGET_MAX_USD)],
        help_text="Cost (ALINEO_MODEL_PRICES) of all agents' model calls per UTC day. "
                  "Empty: no budget.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(checkpoint_max_age_days__gte=1, checkpoint_max_age_days__lte=30),
                name="workspace_checkpoint_age_1_30",
            )
        ]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A bearer token for scripts. Only its SHA-256 is stored."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    PREFIX = "aln_"

    @staticmethod
    def hash(raw: str) -> str:
        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def issue(cls, user, label: str = "") -> tuple["ApiToken", str]:
        raw = cls.PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, digest=cls.hash(raw), prefix=raw[:12], label=label)
        return token, raw

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class AgentStatus(models.TextChoices):
    STARTING = "starting"
    RUNNING = "running"
    IDLE = "idle"
    PAUSED = "paused"
    INTERRUPTED = "interrupted"
    RESTORING = "restoring"
    STOPPED = "stopped"
    LOST = "lost"
    UNRECOVERABLE = "unrecoverable"


#: Statuses an agent never leaves: it and its sandbox have ended.
ENDED = (AgentStatus.STOPPED, AgentStatus.LOST, AgentStatus.UNRECOVERABLE)
#: The status reason of an idle agent whose sandbox idle unload stopped.
UNLOADED = "unloaded"


class Agent(models.Model):
    """A stable identity in the tree. Its sandbox id changes when it is restored;
    its id never does."""

    id = models.CharField(primary_key=True, max_length=32, default=new_agent_id, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="agents")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    spec = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=AgentStatus.choices, default=AgentStatus.STARTING)
    status_reason = models.TextField(blank=True)
    sandbox_id = models.CharField(max_length=128, blank=True)
    # Which sandbox engine holds sandbox_id (the Docker engine's DOCKER_HOST, or
    # "local:<host name>"), so a worker on another machine can reach it.
    sandbox_host = models.CharField(max_length=255, blank=True)
    # The head of the transcript. The journal bumps it in the same transaction
    # as the rows it appends; on PostgreSQL that row lock is the per-agent lock
    # that keeps commit order equal to seq order.
    last_seq = models.BigIntegerField(default=0)
    # The bridge cursor: the last bridge event (bseq) journaled, and the bridge
    # session it belongs to. The worker advances it in the same transaction as
    # the facts it appends, so each bridge event is journaled exactly once.
    bridge_cursor = models.BigIntegerField(default=0)
    bridge_session = models.CharField(max_length=64, blank=True)
    # One of its workspace's concurrent sandbox slots (Workspace.max_sandboxes):
    # taken by the worker before it starts a sandbox (sessions/worker/slots.py),
    # given back at idle unload; an ended agent holds none, whatever this says.
    sandbox_slot = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.id


class Event(models.Model):
    """One fact of an agent's transcript. Append-only: database triggers refuse
    UPDATE and DELETE (see migration 0002); sessions.journal is the only writer."""

    agent = models.ForeignKey(Agent, on_delete=models.DO_NOTHING, related_name="events", db_constraint=True)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    ts = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "seq"], name="event_agent_seq_unique")]
        ordering = ["agent", "seq"]
        # A budget's "what was spent today" (sessions/gateway/budget.py) reads the day's model
        # calls before each call: only model.call rows are in this index, so other facts pay nothing.
        indexes = [models.Index(fields=["ts"], condition=models.Q(type="model.call"),
                                name="event_model_call_ts")]

    def as_dict(self) -> dict:
        return {"seq": self.seq, "type": self.type, "ts": iso_ts(self.ts), "data": self.data}


def iso_ts(value) -> str:
    """ISO 8601 UTC with microseconds and a Z, e.g. 2026-11-29T08:31:02.123456Z."""
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class CommandVerb(models.TextChoices):
    SPAWN = "spawn"
    PROMPT = "prompt"
    STEER = "steer"
    INTERRUPT = "interrupt"
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    FORK = "fork"
    APPROVE = "approve"
    DENY = "deny"  # an operator refuses held credentials: the agent cannot start
    REATTACH = "reattach"  # the client's reattach: the bridge must answer within 5 s
    REBRIDGE = "rebridge"  # the client's resume: restart the bridge on its session
    CHECKPOINT = "checkpoint"  # take a turn checkpoint now
    HOME_SNAPSHOT = "home_snapshot"  # a look at the live home of a running sandbox (never a checkpoint)
    SB_CREATE = "sb_create"  # sandbox sessions (sessions/commands/sandbox.py)
    SB_EXEC = "sb_exec"
    SB_CHECKPOINT = "sb_checkpoint"
    SB_RESUME = "sb_resume"
    SB_REMOVE = "sb_remove"


class CommandState(models.TextChoices):
    PENDING = "pending"  # journaled and acknowledged, not yet acted on
    DONE = "done"
    FAILED = "failed"


class Command(models.Model):
    """An acknowledged request. Keyed by (user, idempotency key) so that the same
    key returns the first response with no second effect, also across restarts."""

    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="commands")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.PROTECT, related_name="commands")
    sandbox_session = models.ForeignKey("SandboxSession", null=True, blank=True,
                                        on_delete=models.PROTECT, related_name="commands")
    verb = models.CharField(max_length=16, choices=CommandVerb.choices)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_hash = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField(default=dict)
    state = models.CharField(max_length=16, choices=CommandState.choices, default=CommandState.PENDING)
    seq = models.BigIntegerField(null=True, blank=True, help_text="The transcript fact that records it.")
    # What acting on it produced, for verbs whose caller waits for an outcome
    # (reattach, rebridge, checkpoint): e.g. {"sandbox_id": …} or {"code", "message"}.
    result = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    acted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="command_user_key_unique",
            )
        ]
        indexes = [models.Index(fields=["state", "created_at"], name="command_state_idx")]


class Checkpoint(models.Model):
    """Metadata of a turn checkpoint (a tar+zstd of the agent's home). Secret-free."""

    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="checkpoints")
    sandbox_id = models.CharField(max_length=128)
    turn = models.PositiveIntegerField()
    through_seq = models.BigIntegerField()
    path = models.CharField(max_length=512, blank=True)
    bytes = models.BigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    harness_revision = models.CharField(max_length=64, blank=True)
    profile_revision = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["agent", "-created_at"]

    def expires_under(self, max_age_days: int):
        """When it expires: its own date, or sooner under a shortened policy
        (a lengthened one never lengthens a checkpoint)."""
        return min(self.expires_at, self.created_at + timedelta(days=max_age_days))

    @property
    def expires(self):
        """When it expires under its workspace's policy now (what the API says)."""
        return self.expires_under(self.agent.workspace.checkpoint_max_age_days)


class LiveHome(models.Model):
    """A look at a RUNNING sandbox's home, taken on request for the Files page
    (sessions/live_home.py): a zstd tar like a checkpoint's, in
    ``DATA_DIR/live-homes/`` — never a checkpoint: no restore, fork or checkpoint
    retention reads it, and a backup carries no live-home file. The newest per agent is kept, for an hour."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="live_homes")
    command = models.ForeignKey("Command", null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    sandbox_id = models.CharField(max_length=128)
    turn = models.PositiveIntegerField(default=0)  # the turns the bridge had finished then
    through_seq = models.BigIntegerField(default=0)  # the transcript's head when it was taken
    path = models.CharField(max_length=512)
    bytes = models.BigIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["agent", "-created_at", "-id"]


class Snapshot(models.Model):
    """The replayed state of an agent through `through_seq`, in format `version`.
    A cache: dropping every snapshot only makes the next replay slower."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="snapshots")
    through_seq = models.BigIntegerField()
    version = models.PositiveSmallIntegerField()
    state = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "through_seq"], name="snapshot_agent_seq_unique")
        ]


class AgentMemory(models.Model):
    """Notes an agent keeps through its `memory` tool (BRIDGE.md `request.memory`).
    Keyed by agent identity, not sandbox, so they survive any restore."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="memory")
    key = models.CharField(max_length=200)
    value = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["agent", "key"], name="memory_agent_key_unique")]
        ordering = ["agent", "key"]


class Credential(models.Model):
    """A secret a workspace's agents may be bound to by name (spec `credentials`).

    The value is injected into the sandbox's environment at start and never
    leaves the control plane otherwise: it is not in the spec, the transcript
    (the relay redacts it), checkpoint metadata, logs or any page."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="credentials")
    name = models.CharField(max_length=100)
    secret = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "name"], name="credential_workspace_name_unique")
        ]
        ordering = ["workspace", "name"]
        # Approving a held binding (POST /api/agents/{id}/approve) needs this
        # permission or staff status (sessions/access.py may_approve).
        permissions = [("approve_credentials", "Can approve held credentials for a sandbox start")]

    def __str__(self) -> str:
        return f"{self.workspace}/{self.name}"


class RetentionSweep(models.Model):
    """One run of the worker's checkpoint retention sweep, shown in the admin."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    removed = models.PositiveIntegerField(default=0)
    by_reason = models.JSONField(default=dict)

    class Meta:
        ordering = ["-started_at"]


class AgentLease(models.Model):
    """Which worker drives an agent. Exactly one at a time: a worker drives an
    agent only while its row names it and has not expired; it renews the row
    (heartbeat) well inside the timeout. A worker that dies stops renewing, the
    row expires, and another worker takes the agent over through the ladder.
    ``epoch`` grows on every change of holder (a fencing token): the relay's
    writes check it, so a worker that lost its lease cannot journal any more."""

    agent = models.OneToOneField(Agent, primary_key=True, on_delete=models.CASCADE, related_name="lease")
    holder = models.CharField(max_length=200)
    epoch = models.BigIntegerField(default=1)
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.agent_id} → {self.holder} (epoch {self.epoch})"


# --- sandbox sessions (docs/API.md "Sandbox sessions") ---------------------------------------


def new_sandbox_session_id() -> str:
    return "sb_" + secrets.token_hex(8)


class SandboxSessionStatus(models.TextChoices):
    STARTING = "starting"  # created; the worker has not made its sandbox yet
    READY = "ready"        # its sandbox runs: exec, checkpoint
    LOST = "lost"          # its sandbox is gone (removed, reaped): resume it
    FAILED = "failed"      # its sandbox could not be made; resume tries again
    REMOVED = "removed"    # ended: sandbox and snapshots removed, the journal kept


class SandboxSession(models.Model):
    """A sandbox a script drives (create, exec, checkpoint, resume, remove).
    Its journal is :class:`SandboxSessionEvent`; sessions/sbjournal.py writes it."""

    id = models.CharField(primary_key=True, max_length=32, default=new_sandbox_session_id,
                          editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT,
                                  related_name="sandbox_sessions")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=63, blank=True)
    spec = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=SandboxSessionStatus.choices,
                              default=SandboxSessionStatus.STARTING)
    status_reason = models.TextField(blank=True)
    sandbox_id = models.CharField(max_length=128, blank=True)
    sandbox_host = models.CharField(max_length=255, blank=True)
    # One of the workspace's max_sandboxes slots, taken at create and held until remove.
    sandbox_slot = models.BooleanField(default=True)
    last_seq = models.BigIntegerField(default=0)
    # Which worker acts on its commands (one at a time; sessions/worker/sbrunner.py).
    lease_holder = models.CharField(max_length=200, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return self.id


def session_slots_in_use(workspace_id: int) -> int:
    """Sandbox slots the workspace's sandbox sessions hold (Workspace.max_sandboxes)."""
    rows = SandboxSession.objects.filter(workspace_id=workspace_id, sandbox_slot=True).exclude(
        status=SandboxSessionStatus.REMOVED)
    return rows.count()


class SandboxSessionEvent(models.Model):
    """One fact of a sandbox session's journal: seq 1, 2, 3 … with no gaps."""

    session = models.ForeignKey(SandboxSession, on_delete=models.CASCADE, related_name="events")
    seq = models.BigIntegerField()
    type = models.CharField(max_length=64)
    data = models.JSONField(default=dict)
    ts = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "seq"],
                                               name="sbevent_session_seq_unique")]
        ordering = ["session", "seq"]

    def as_dict(self) -> dict:
        return {"seq": self.seq, "type": self.type, "ts": iso_ts(self.ts), "data": self.data}
