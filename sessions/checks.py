"""System checks for configuration mistakes a user cannot see."""

import difflib
import os
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Info, Warning, register

from sandboxes import config


@register()
def channel_layer_check(app_configs, **kwargs):
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    if settings.ALINEO_WORKERS > 1 and backend.endswith("InMemoryChannelLayer"):
        return [
            Warning(
                "ALINEO_WORKERS is %d but the channel layer is in-memory." % settings.ALINEO_WORKERS,
                hint="The in-memory layer does not cross processes: set REDIS_URL so that "
                "several worker processes receive commands and wake-ups.",
                id="alineo.W001",
            )
        ]
    return []


@register()
def database_check(app_configs, **kwargs):
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine not in ("django.db.backends.sqlite3", "django.db.backends.postgresql"):
        return [
            Error(
                "Unsupported database engine %s." % engine,
                hint="Use SQLite (the default) or DATABASE_URL=postgres://…",
                id="alineo.E001",
            )
        ]
    if settings.ALINEO_WORKERS > 1 and engine.endswith("sqlite3"):
        return [
            Warning(
                "Several workers on SQLite.",
                hint="SQLite serialises every writer; use PostgreSQL (DATABASE_URL) to scale out.",
                id="alineo.W002",
            )
        ]
    return []


@register()
def sandbox_choice_check(app_configs, **kwargs):
    if settings.ALINEO_SANDBOX not in ("auto", "docker", "local", "unisolated"):
        return [
            Error(
                "ALINEO_SANDBOX=%r is not one of auto, docker, local, unisolated."
                % settings.ALINEO_SANDBOX,
                id="alineo.E002",
            )
        ]
    return []


@register()
def sandbox_isolation_check(app_configs, **kwargs):
    """Which backend agents get, said where an operator looks: unisolated
    (W006), none at all (W007: the server serves, spawning is refused), and
    for the local backend how its limits are enforced (I001)."""
    from sandboxes.backends import get_backend, resolve_backend_name
    from sandboxes.backends.limits import enforcement

    if settings.ALINEO_SANDBOX not in ("auto", "docker", "local", "unisolated"):
        return []  # E002 says it
    name = resolve_backend_name(settings.ALINEO_SANDBOX)
    backend = get_backend(name)
    if not backend.isolated:
        return [Warning(
            "ALINEO_SANDBOX=unisolated: agents run as this server's user, with its files "
            "and network, and no limits.",
            hint="An agent can read the database, the secret key and other agents' homes. "
            "For development only; use the local (bubblewrap) or docker backend "
            "(docs/LOCAL_SANDBOX.md).",
            id="alineo.W006",
        )]
    reason = backend.unavailable_reason()
    if reason:
        return [Warning(
            "Agents cannot be spawned: %s." % reason,
            hint="The server starts and serves transcripts; POST /api/agents answers 409 "
            "sandbox.unavailable until a backend works (docs/LOCAL_SANDBOX.md).",
            id="alineo.W007",
        )]
    if name == "local":
        return [Info("Local sandboxes (bubblewrap) enforce their limits through %s."
                     % enforcement().describe(), id="alineo.I001")]
    return []


@register()
def snapshot_interval_check(app_configs, **kwargs):
    if settings.ALINEO_SNAPSHOT_EVERY < 1:
        return [Error("ALINEO_SNAPSHOT_EVERY must be at least 1.", id="alineo.E003")]
    return []


@register()
def scale_out_check(app_configs, **kwargs):
    """PostgreSQL means several processes; without Redis their wake-ups and
    commands stay inside each process (streams and workers wait for polls)."""
    out = []
    engine = settings.DATABASES["default"]["ENGINE"]
    layer = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    if engine.endswith("postgresql") and layer.endswith("InMemoryChannelLayer"):
        out.append(Warning(
            "DATABASE_URL is PostgreSQL but REDIS_URL is not set.",
            hint="Web and worker processes reach each other only through Redis: set REDIS_URL "
            "(docs/DEPLOYMENT.md), or run one `manage.py serve` process only.",
            id="alineo.W003",
        ))
    if settings.ALINEO_LEASE_S < 5:
        out.append(Error(
            "ALINEO_LEASE_S is %s; it must be at least 5 seconds." % settings.ALINEO_LEASE_S,
            hint="Workers renew every quarter of it; a shorter lease expires under an ordinary "
            "pause (a slow query, a busy machine) and agents would change hands for nothing.",
            id="alineo.E004",
        ))
    return out


@register()
def docker_host_check(app_configs, **kwargs):
    """The bridge's socket lives in a run dir bind-mounted from the engine's
    machine: a worker can drive only an engine on its own machine."""
    host = settings.DOCKER_HOST
    if not host or settings.ALINEO_SANDBOX in ("local", "unisolated") \
            or host.startswith(("unix://", "npipe://")):
        return []
    name = urlsplit(host).hostname or ""
    if name in ("127.0.0.1", "localhost", "::1"):
        return []
    return [Warning(
        "DOCKER_HOST=%s is an engine on another machine." % host,
        hint="A worker talks to each bridge through a unix socket in a run directory it "
        "bind-mounts from its own machine, so it must drive an engine on that machine (a unix "
        "socket, or tcp://127.0.0.1). Run a worker on the engine's machine instead "
        "(docs/DEPLOYMENT.md, Sandbox hosts).",
        id="alineo.W005",
    )]


#: ALINEO_* names that are not the server's settings: read by the Python
#: client, set by the server inside sandboxes, or used by the test suite and benches.
OTHER_ALINEO_NAMES = ("ALINEO_URL", "ALINEO_TOKEN", "ALINEO_AGENT_ID", "ALINEO_RUN_DIR",
                      "ALINEO_SANDBOX_ID", "ALINEO_TURN", "ALINEO_SESSION_START_SOURCE")
NOT_SETTINGS_PREFIXES = ("ALINEO_TEST_", "ALINEO_BENCH_", "ALINEO_FAULT_", "ALINEO_SERVICES_",
                         "ALINEO_TOOL_", "ALINEO_PG_", "ALINEO_REDIS_", "ALINEO_DOCKERD_")
#: How alike a name must be to a setting to be taken for a misspelling of it.
TYPO_SIMILARITY = 0.85


@register()
def misspelt_setting_check(app_configs, **kwargs):
    """An ALINEO_* variable that is almost the name of a setting is a typo
    (ALINEO_SANBOX=local would silently leave the backend on auto)."""
    known = set(settings.KNOWN_ENV)
    errors = []
    for name in sorted(os.environ):
        if (not name.startswith("ALINEO_") or name in known or name in OTHER_ALINEO_NAMES
                or name.startswith(NOT_SETTINGS_PREFIXES)):
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=TYPO_SIMILARITY)
        if close:
            errors.append(Error(
                f"{name} is not a setting; did you mean {close[0]}?",
                hint="Rename the environment variable (the settings are listed in "
                "docs/DEPLOYMENT.md); it is ignored as it is.",
                id="alineo.E005",
            ))
    return errors


@register()
def private_data_dir_check(app_configs, **kwargs):
    """The data dir holds the database (credential values), the secret key,
    checkpoints and the bridges' sockets: no other user may read it."""
    if not config.data_dir().exposed():
        return []
    return [Warning(
        f"ALINEO_DATA_DIR ({settings.DATA_DIR}) can be read by other users.",
        hint="`manage.py serve` and `runworker` make it private (0700, files 0600) at start; "
        f"or run: chmod -R go-rwx {settings.DATA_DIR}",
        id="alineo.W008",
    )]


@register()
def fault_test_hold_check(app_configs, **kwargs):
    """ALINEO_TEST_HOLD_DIR exists for the fault tests (tests/faults/placed.py):
    set on a real deployment, a file there silently holds an agent's commands."""
    if not settings.ALINEO_TEST_HOLD_DIR:
        return []
    return [Warning(
        f"ALINEO_TEST_HOLD_DIR is set ({settings.ALINEO_TEST_HOLD_DIR}): the worker holds "
        "undelivered the commands of every agent named by a file there.",
        hint="It is for the fault tests only; unset it on a real deployment.",
        id="alineo.W009",
    )]
