"""Alineo settings: everything comes from environment variables with defaults
that work on a fresh clone (SQLite under ALINEO_DATA_DIR, in-memory channel
layer). This is the only module that reads the environment for the server;
a value that cannot be what its variable means stops the start with an error
naming it, and a misspelt ALINEO_* name is refused by the system check
alineo.E005 (sessions/checks.py)."""

from __future__ import annotations

import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: Every ALINEO_* variable the server reads (the check alineo.E005 compares against it).
KNOWN_ENV: set[str] = set()


def _raw(name: str) -> str:
    if name.startswith("ALINEO_"):
        KNOWN_ENV.add(name)
    return os.environ.get(name, "").strip()


def envbool(name: str, default: bool = False) -> bool:
    value = _raw(name).lower()
    if not value:
        return default
    if value not in TRUE + FALSE:
        raise ImproperlyConfigured(f"{name}={os.environ[name]!r}: use one of {', '.join(TRUE + FALSE)}")
    return value in TRUE


def envint(name: str, default: int) -> int:
    value = _raw(name)
    try:
        return int(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number") from None


def envfloat(name: str, default: float) -> float:
    value = _raw(name)
    try:
        return float(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


def envstr(name: str, default: str = "") -> str:
    return _raw(name) or default


def envprices(name: str) -> dict[str, dict[str, float]]:
    """A price table: {model: {input|output|cache_read|cache_write: USD per 1M tokens}}."""
    raw = _raw(name)
    try:
        table = json.loads(raw) if raw else {}
        ok = isinstance(table, dict) and all(
            isinstance(p, dict) and p and all(k in PRICE_KEYS and isinstance(v, (int, float))
                                              and not isinstance(v, bool) and v >= 0
                                              for k, v in p.items())
            for p in table.values())
    except ValueError:
        ok = False
    if not ok:
        raise ImproperlyConfigured(
            f"{name}: use JSON like {{\"openai:gpt-4o-mini\": {{\"input\": 0.15, "
            f"\"output\": 0.6}}}} (USD per million tokens; keys {', '.join(PRICE_KEYS)})")
    return {model: {k: float(v) for k, v in p.items()} for model, p in table.items()}


PRICE_KEYS = ("input", "output", "cache_read", "cache_write")


def envchoice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = envstr(name, default).lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r}: choose one of {', '.join(choices)}")
    return value


def envlabels(name: str) -> dict[str, str]:
    """"k=v,k2=v2" as a dict; an item without "=" is refused."""
    out = {}
    for item in filter(None, (i.strip() for i in envstr(name).split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ImproperlyConfigured(f"{name}: {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


DATA_DIR = Path(envstr("ALINEO_DATA_DIR", str(BASE_DIR / "var"))).resolve()
# Made by this process just now: a command that finds no database there (issue_token
# pointed at the wrong dir) removes it again instead of leaving an empty ./var behind.
DATA_DIR_MADE_NOW = not DATA_DIR.exists()
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: sandboxes/config.py


def _secret_key() -> str:
    """Read SECRET_KEY from the environment, else from a file in the data dir
    made on first start, so sessions survive restarts without any setup."""
    if envstr("SECRET_KEY"):
        return envstr("SECRET_KEY")
    path = DATA_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_urlsafe(50)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key)
        return key
    except FileExistsError:  # pragma: no cover - a racing first start
        return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = [h for h in envstr("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in envstr("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before channels: its `runworker` command replaces channels' own.
    "sessions.apps.AgentSessionsConfig",
    "channels",
    "django_htmx",
    "axes",  # login throttling, below
    "csp",  # the Content-Security-Policy header, below
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: it turns a lockout found during login into its page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "alineo_site.urls"
ASGI_APPLICATION = "alineo_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
# SQLite in WAL mode by default. IMMEDIATE transactions take the write lock up
# front, which removes "database is locked" under concurrent writers (measured:
# 0 errors vs 1,520 with DEFERRED). synchronous=FULL because a fact is only
# acknowledged once durable; the journal group-commits to keep throughput.
DATABASE_URL = envstr("DATABASE_URL")
SQLITE_PATH = Path(envstr("ALINEO_DB_PATH", str(DATA_DIR / "alineo.sqlite3")))
if DATABASE_URL:
    import dj_database_url

    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": envint("ALINEO_DB_POOL_MAX", 20),
        }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
            },
            "TEST": {"NAME": str(DATA_DIR / "test.sqlite3")},
        }
    }
DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer ----------------------------------------------------------
REDIS_URL = envstr("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py's async pool defaults to 100 connections: 200 streams
            # gave 101 MaxConnectionsError. Raise it well above the stream count.
            # redis-py 8 reads with a 5 s socket timeout by default, which
            # cuts channels_redis's 5 s blocking pops ("Timeout reading"):
            # give reads room above the pop's own timeout.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "max_connections": 1000,
                                  "socket_timeout": 30}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "alineo_site.layers.InMemoryChannelLayer"}}

# --- Login throttling (django-axes; docs/SECURITY.md#the-web-side) -----------------------
# Failed password logins (the dashboard's and the admin's login forms) are
# counted per client address: ALINEO_LOGIN_FAILURES of them, each less than
# ALINEO_LOGIN_LOCKOUT_S after the one before, lock that client out of logging
# in until ALINEO_LOGIN_LOCKOUT_S after the last, with a 429 page that says so
# (sessions/dashboard/lockout.py); 0 failures turns throttling off. Only
# authenticate() is throttled: API bearer tokens (sessions/access.py) and
# sessions already logged in are not.
# Behind a reverse proxy every client has the proxy's address: set
# ALINEO_LOGIN_LOCKOUT_BY=client_and_username so one client cannot lock out all.
ALINEO_LOGIN_FAILURES = envint("ALINEO_LOGIN_FAILURES", 5)
ALINEO_LOGIN_LOCKOUT_S = envfloat("ALINEO_LOGIN_LOCKOUT_S", 900.0)
ALINEO_LOGIN_LOCKOUT_BY = envchoice("ALINEO_LOGIN_LOCKOUT_BY", "client",
                                    ("client", "client_and_username"))
if ALINEO_LOGIN_FAILURES < 0:
    raise ImproperlyConfigured(f"ALINEO_LOGIN_FAILURES={ALINEO_LOGIN_FAILURES}: use 0 (no "
                               "throttling) or the failed logins that lock a client out")
if ALINEO_LOGIN_LOCKOUT_S <= 0:
    raise ImproperlyConfigured(f"ALINEO_LOGIN_LOCKOUT_S={ALINEO_LOGIN_LOCKOUT_S}: must be > 0")
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: it refuses a locked-out client
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = ALINEO_LOGIN_FAILURES > 0
AXES_FAILURE_LIMIT = max(ALINEO_LOGIN_FAILURES, 1)
AXES_COOLOFF_TIME = timedelta(seconds=ALINEO_LOGIN_LOCKOUT_S)
AXES_LOCKOUT_PARAMETERS = (["ip_address"] if ALINEO_LOGIN_LOCKOUT_BY == "client"
                           else [["ip_address", "username"]])
AXES_LOCKOUT_CALLABLE = "sessions.dashboard.lockout.locked_out"
# Not reset by a successful login: by client address, a login to one's own
# account would otherwise clear the count of guesses at everyone else's.
AXES_RESET_ON_SUCCESS = False

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

# --- Content-Security-Policy (django-csp 4.x; docs/SECURITY.md#the-web-side) -----------------
# Every response says: scripts, styles, images, fonts and fetches (the SSE
# stream too) only from this origin, no inline script or style and no eval,
# no plugins, no <base> elsewhere, forms post only here, and no framing. The
# templates keep to it: no inline <script>, no on*= handlers, no style=, and
# htmx is told not to eval or inject styles (templates/base.html).
# tests/unit/dashboard/test_csp.py and tests/browser/test_csp.py check it.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# --- Cookies and transport (docs/SECURITY.md#the-web-side) ------------------------------------
# ALINEO_HTTPS=1: browsers reach Alineo over HTTPS. Then the session and CSRF
# cookies are sent over HTTPS only. `manage.py serve` itself speaks plain HTTP,
# so HTTPS means a TLS-terminating reverse proxy in front, and Django learns
# the scheme from the proxy's X-Forwarded-Proto (SECURE_PROXY_SSL_HEADER):
# without it every request looks like http, and the CSRF check refuses each
# form POST whose Origin is https://… (tests/unit/dashboard/test_cookies.py).
# The proxy must set that header itself, replacing any a client sent; a
# client that reaches serve around the proxy could only mislabel its own
# request. HSTS (ALINEO_HSTS_S) stays off unless asked for: once a browser
# has it, plain HTTP to the host is refused until it expires.
ALINEO_HTTPS = envbool("ALINEO_HTTPS", False)
ALINEO_HSTS_S = envint("ALINEO_HSTS_S", 0)
if ALINEO_HSTS_S < 0 or (ALINEO_HSTS_S and not ALINEO_HTTPS):
    raise ImproperlyConfigured(f"ALINEO_HSTS_S={ALINEO_HSTS_S}: HSTS needs ALINEO_HTTPS=1 and a "
                               "number of seconds >= 0")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = ALINEO_HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if ALINEO_HTTPS else None
SECURE_HSTS_SECONDS = ALINEO_HSTS_S
SESSION_COOKIE_HTTPONLY = True  # no script reads the session cookie
# Lax: a cross-site link still arrives logged in, a cross-site POST does not.
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"  # with frame-ancestors 'none', for browsers without CSP

# A refused CSRF check gets the site's own 403 page (sessions/api/views.py).
CSRF_FAILURE_VIEW = "sessions.api.views.csrf_failure"

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("ALINEO_LOG_LEVEL", "INFO")},
    # axes logs each failed login and lockout as a warning, its start banner as info.
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"},
                "axes": {"level": "WARNING"}},
}

# --- Alineo -------------------------------------------------------------------
# auto: docker when an engine answers, else local (bubblewrap) when it works, else
# none (nothing can be spawned). unisolated: the old, unisolated local backend (development).
ALINEO_SANDBOX = envchoice("ALINEO_SANDBOX", "auto", ("auto", "docker", "local", "unisolated"))
# Labels put on every sandbox, "k=v,k2=v2" (tests use them to clean up).
ALINEO_SANDBOX_LABELS = envlabels("ALINEO_SANDBOX_LABELS")
# The Docker engine (docker-py reads it too); "" is the engine's default socket.
DOCKER_HOST = envstr("DOCKER_HOST")
# A root control plane on the engine's machine tars a container's home from the
# host side and writes a restored checkpoint into a new container's writable
# layer from the host side (sandboxes/backends/overlay.py); 0 always execs tar in
# the container and restores through the engine's put_archive.
ALINEO_DOCKER_HOST_TAR = envbool("ALINEO_DOCKER_HOST_TAR", True)
# Where ALINEO_DOCKER_HOST_TAR's host-side paths apply: each checkpointing agent's
# newest checkpoint is kept extracted (read-only, <data dir>/trees), and a restore
# or fork from it lays the new home over it, copy-on-write, instead of extracting
# (sandboxes/backends/trees.py; costs an extraction per checkpoint, in the background).
ALINEO_PREPARED_TREES = envbool("ALINEO_PREPARED_TREES", True)
# The Debian mirror the base image is built from (default: this machine's apt sources).
ALINEO_DEBIAN_MIRROR = envstr("ALINEO_DEBIAN_MIRROR").rstrip("/")
ALINEO_DEBIAN_SECURITY_MIRROR = envstr("ALINEO_DEBIAN_SECURITY_MIRROR").rstrip("/")
# Where harnesses other than the built-in one (Pi: node + its npm package) are
# installed once, keyed by a hash of their inputs (sandboxes/harnesses.py);
# shared by every data dir of this user, bound read-only into sandboxes.
ALINEO_HARNESS_CACHE = envstr("ALINEO_HARNESS_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "alineo", "harnesses")
# The most a home written into a sandbox (a restore, a fork) may hold: a
# checkpoint past it is refused as unusable (the agent is rebuilt instead).
ALINEO_RESTORE_MAX_BYTES = envint("ALINEO_RESTORE_MAX_BYTES", 8 << 30)
ALINEO_RESTORE_MAX_ENTRIES = envint("ALINEO_RESTORE_MAX_ENTRIES", 1_000_000)
# The port `manage.py serve` listens on without --port.
PORT = envint("PORT", 8000)
# `manage.py ensure_admin`: the first admin's password (else one is generated and printed once).
ALINEO_ADMIN_PASSWORD = envstr("ALINEO_ADMIN_PASSWORD")
# Names this worker in leases (default: machine, pid and start time, sessions/leases.py).
ALINEO_WORKER_ID = envstr("ALINEO_WORKER_ID")[:200]
# Worker processes sharing this deployment. Several on the in-memory layer is a
# misconfiguration that a system check reports.
ALINEO_WORKERS = envint("ALINEO_WORKERS", 1)
# A Snapshot of the replayed state is written once replay has folded this many
# events past the newest one, so replay cost stays bounded by it.
ALINEO_SNAPSHOT_EVERY = envint("ALINEO_SNAPSHOT_EVERY", 500)
ALINEO_PAGE_LIMIT_DEFAULT = 100
ALINEO_PAGE_LIMIT_MAX = 1000
ALINEO_MAX_TEXT = envint("ALINEO_MAX_TEXT", 100_000)
ALINEO_SSE_HEARTBEAT_S = envfloat("ALINEO_SSE_HEARTBEAT_S", 20.0)
# Bytes an SSE stream may have queued for a slow client before it stops waiting
# for its agent's shared tail and reads on its own (sessions/api/tails.py).
ALINEO_SSE_STREAM_BUFFER_KB = envint("ALINEO_SSE_STREAM_BUFFER_KB", 1024)
ALINEO_DATA_VERSION_POLL_S = envfloat("ALINEO_DATA_VERSION_POLL_S", 0.25)
ALINEO_CHECKPOINT_MAX_DAYS = 30
ALINEO_WORKER_CHANNEL = "alineo-worker"
# The worker's checkpoint retention sweep runs at boot and then this often.
ALINEO_SWEEP_S = envfloat("ALINEO_SWEEP_S", 300.0)
# An agent with no activity for this long has its sandbox stopped (its state is
# on disk and in the transcript); a prompt brings it back. 0 turns it off.
ALINEO_IDLE_UNLOAD_S = envfloat("ALINEO_IDLE_UNLOAD_S", 1800.0)
# For the fault tests only (tests/faults): a directory where a file named after
# an agent id makes the worker hold that agent's commands journaled and
# undelivered while the file exists — a kill placed "between a command's
# journaling and its delivery". Unset (the default) it does nothing; whoever
# can set it already controls the control plane's environment.
ALINEO_TEST_HOLD_DIR = envstr("ALINEO_TEST_HOLD_DIR")
# Quiet this long, an idle agent gives its sandbox slot to another agent of its
# workspace that waits for one (sessions/worker/slots.py). Must be > 0.
ALINEO_MAKE_ROOM_S = envfloat("ALINEO_MAKE_ROOM_S", 10.0)
if ALINEO_MAKE_ROOM_S <= 0:
    raise ImproperlyConfigured(f"ALINEO_MAKE_ROOM_S={ALINEO_MAKE_ROOM_S}: must be > 0")
# A worker's lease on an agent lasts this long unless renewed (every quarter of
# it); a dead worker's agents are taken over by another worker after it.
ALINEO_LEASE_S = envfloat("ALINEO_LEASE_S", 20.0)
# The model gateway (docs/GATEWAY.md): the largest request body a sandbox may
# send it, in MiB (a long conversation with its tool outputs fits well under it).
ALINEO_GATEWAY_MAX_BODY_MB = envint("ALINEO_GATEWAY_MAX_BODY_MB", 32)
if not 1 <= ALINEO_GATEWAY_MAX_BODY_MB <= 1024:
    raise ImproperlyConfigured(
        f"ALINEO_GATEWAY_MAX_BODY_MB={ALINEO_GATEWAY_MAX_BODY_MB}: use 1 to 1024 (MiB)")
# The price table for model.call costs: JSON, USD per million tokens per model
# as the spec names it, e.g. {"openai:gpt-4o-mini": {"input": 0.15, "output": 0.6,
# "cache_read": 0.075}}. A model without a price journals cost_usd null; the demo 0.
ALINEO_MODEL_PRICES = envprices("ALINEO_MODEL_PRICES")
# Scheduled backups (off unless ALINEO_BACKUP_DIR is set): a bundle when the
# newest one there is older than ALINEO_BACKUP_EVERY_S, keeping the newest K.
ALINEO_BACKUP_DIR = envstr("ALINEO_BACKUP_DIR", "")
ALINEO_BACKUP_EVERY_S = envfloat("ALINEO_BACKUP_EVERY_S", 86400.0)
ALINEO_BACKUP_KEEP = envint("ALINEO_BACKUP_KEEP", 7)
