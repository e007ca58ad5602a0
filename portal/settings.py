"""Sluice settings, read from the environment (12-factor).

Every setting that differs between a laptop demo and production comes from an environment
variable; docs/operator/settings.md lists them all. The embedded default needs no external service: a
SQLite file and a filesystem message broker, both under ``var/``.
"""

import ipaddress
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from celery.schedules import crontab, schedule
from django.core.exceptions import ImproperlyConfigured

from identity.ldap_config import ldap_settings
from portal.env import env_bool, env_int, env_list, env_str
from portal.varfiles import persistent_secret_key, secure_var_dir


def env_float(name: str, default: float) -> float:
    raw = env_str(name, "")
    if raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None


def env_seconds(name: str, default: float) -> float:
    """A number of seconds, 0 or more (ImproperlyConfigured otherwise)."""
    value = env_float(name, default)
    if not 0 <= value < float("inf"):
        raise ImproperlyConfigured(f"{name} must be a number of seconds, 0 or more.")
    return value


def time_sharing_levels(
    name: str, raw: str | None, default: tuple[float, ...]
) -> tuple[float, ...]:
    """Time-sharing's level thresholds in GPU-hours from ``raw`` (``"64,1024"``; None or
    blank: ``default``): one or more positive numbers, strictly ascending."""
    if raw is None or raw.strip() == "":
        return default
    try:
        levels = tuple(float(part) for part in raw.split(","))
    except ValueError:
        levels = ()
    if (
        not levels
        or not all(0 < level < float("inf") for level in levels)
        or any(low >= high for low, high in zip(levels, levels[1:], strict=False))
    ):
        raise ImproperlyConfigured(
            f"{name} must be one or more positive GPU-hours, ascending and comma-separated "
            f"(e.g. 64,1024), got {raw!r}"
        )
    return levels


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("SLUICE_VAR_DIR", str(BASE_DIR / "var")))
# What the portal writes (database, broker messages with job secrets, logs, keys) is its
# own: files 0600, directories 0700. var/ itself stays traversable (0711, not listable) only
# because the demo's node agents keep their job directories under var/agent/, which job
# accounts must reach; see portal.varfiles.
secure_var_dir(VAR_DIR)

DEBUG = env_bool("DEBUG", False)

SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    # A random key made once and kept in var/secret_key (0600), with or without DEBUG: every
    # process of one install (make run, manage.py commands, tests) signs sessions and keys
    # the audit chain alike, and no well-known key ever signs anything. Production sets
    # SECRET_KEY (the same for every web replica and worker).
    SECRET_KEY = persistent_secret_key(VAR_DIR / "secret_key")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "knox",
    "axes",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "guardian",
    "portal",
    "audit",
    "accounts",
    "tenants",
    "identity",
    "scheduling",
    "inference",
    "insights",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Errors under /api/ that no API view answered (no such route, CSRF, a crash) as JSON.
    "portal.middleware.ApiJsonErrorsMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "csp.middleware.CSPMiddleware",
    "identity.middleware.ProviderFormActionMiddleware",  # form-action: the OIDC provider
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.middleware.RequestContextMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "portal.urls"

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
                "portal.context_processors.navigation",
            ],
        },
    },
]

WSGI_APPLICATION = "portal.wsgi.application"

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'sluice.sqlite3'}"),
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and env_bool(
    "SLUICE_DB_PREPARED_STATEMENTS", True
):
    # Parameters bound by the server, and a statement a connection runs a fifth time
    # prepared (psycopg's prepare_threshold): PostgreSQL then skips parsing and planning
    # it, which halved its CPU per job submission (docs/benchmarks.md, "End-to-end
    # benchmark"). Off behind a pooler that cannot keep prepared statements (PgBouncer in
    # transaction mode before 1.21).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=5
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web server read while a worker writes; the busy timeout absorbs short locks.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out account before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    # Django's password check, refusing robot accounts (they work through tokens only).
    "accounts.backends.LocalAccountBackend",
    "guardian.backends.ObjectPermissionBackend",
]
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.ScryptPasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"
GUARDIAN_RAISE_403 = False
ANONYMOUS_USER_NAME = None

# --- Sign-in through an OIDC provider (Keycloak, Entra ID, Okta, Dex...): identity.oidc ---
# Off unless SLUICE_OIDC_ISSUER is set; the endpoints come from the issuer's discovery
# document. docs/operator/identity.md explains every setting.
SLUICE_OIDC_ISSUER = env_str("SLUICE_OIDC_ISSUER", "").strip()
SLUICE_OIDC_GROUPS_CLAIM = env_str("SLUICE_OIDC_GROUPS_CLAIM", "groups")
SLUICE_OIDC_USERNAME_CLAIM = env_str("SLUICE_OIDC_USERNAME_CLAIM", "preferred_username")
SLUICE_OIDC_UNIX_CLAIM = env_str("SLUICE_OIDC_UNIX_CLAIM", "")
SLUICE_OIDC_BUTTON_LABEL = env_str("SLUICE_OIDC_BUTTON_LABEL", "Sign in with your organization")
SLUICE_OIDC_DISCOVERY_TTL = env_int("SLUICE_OIDC_DISCOVERY_TTL", 3600)
# Signed out (sent to the provider again) this long after their last OIDC sign-in.
SLUICE_OIDC_MAX_SESSION_AGE = env_int("SLUICE_OIDC_MAX_SESSION_AGE", 12 * 3600)
# Off: the login page shows only the provider's button; local passwords still sign in
# platform admins (break-glass) through /login/?local.
SLUICE_LOCAL_LOGIN = env_bool("SLUICE_LOCAL_LOGIN", True)
OIDC_RP_CLIENT_ID = env_str("SLUICE_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("SLUICE_OIDC_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = env_str("SLUICE_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env_str("SLUICE_OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of the provider's end-session
OIDC_TIMEOUT = env_int("SLUICE_OIDC_TIMEOUT", 10)
OIDC_VERIFY_SSL = env_bool("SLUICE_OIDC_VERIFY_TLS", True)
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
if SLUICE_OIDC_ISSUER:
    if not OIDC_RP_CLIENT_ID:
        raise ImproperlyConfigured("SLUICE_OIDC_ISSUER is set: set SLUICE_OIDC_CLIENT_ID too.")
    AUTHENTICATION_BACKENDS.append("identity.oidc.SluiceOIDCBackend")

# --- Sign-in through LDAP / Active Directory (django-auth-ldap): identity.ldap ---
# Off unless SLUICE_LDAP_URI is set. SLUICE_LDAP_BIND_DN/_PASSWORD, _USER_SEARCH_BASE,
# _USER_FILTER ("(uid=%(user)s)"), _GROUP_SEARCH_BASE, _GROUP_TYPE (groupOfNames, ad-nested,
# ...), _START_TLS (on for ldap://), _CA_FILE, _DISABLED_FILTER, _UNIX_ATTR ("uid"),
# _UID_NUMBER_ATTR ("uidNumber"); ldap:// without StartTLS needs SLUICE_LDAP_ALLOW_PLAIN=1.
# Every SLUICE_LDAP_SYNC_SECONDS the leavers sync looks each LDAP user up again.
# docs/operator/identity.md explains every setting, with an Active Directory example.
globals().update(ldap_settings(os.environ))
SLUICE_LDAP_SYNC_SECONDS = env_int("SLUICE_LDAP_SYNC_SECONDS", 900)
if SLUICE_LDAP_ENABLED:  # noqa: F821 (set by ldap_settings)
    AUTHENTICATION_BACKENDS.append("identity.ldap.SluiceLDAPBackend")

# --- Credentials: hashed API tokens (django-rest-knox), sign-in lockout (django-axes) ---
# A token lasts SLUICE_API_TOKEN_DAYS unless its owner asks for another lifetime, never
# more than SLUICE_API_TOKEN_MAX_DAYS. Only a SHA-512 hash of its key is stored.
SLUICE_API_TOKEN_DAYS = env_int("SLUICE_API_TOKEN_DAYS", 90)
SLUICE_API_TOKEN_MAX_DAYS = env_int("SLUICE_API_TOKEN_MAX_DAYS", 365)
KNOX_TOKEN_MODEL = "accounts.ApiToken"
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=SLUICE_API_TOKEN_DAYS),
    "AUTH_HEADER_PREFIX": "Token",  # clients send "Authorization: Token <key>"
    "AUTO_REFRESH": False,
}
# knox's own token model is swapped for accounts.ApiToken; its migrations would only make
# an unused table.
MIGRATION_MODULES = {"knox": None}
# After SLUICE_LOGIN_FAILURE_LIMIT failed sign-ins for a username (login page, admin login,
# POST /api/v1/auth/token), that account is refused, even with the right password, until
# SLUICE_LOGIN_COOLOFF_MINUTES after its last failure. The lock is by username (for every
# address) and by IP+username; with one limit the second only adds a record of where the
# failures came from (and satisfies axes' check that asks for the address). Unlock early:
# `manage.py axes_reset_username <name>` or the admin's "Access attempts".
SLUICE_LOGIN_FAILURE_LIMIT = env_int("SLUICE_LOGIN_FAILURE_LIMIT", 10)
SLUICE_LOGIN_COOLOFF_MINUTES = env_int("SLUICE_LOGIN_COOLOFF_MINUTES", 15)
AXES_ENABLED = env_bool("AXES_ENABLED", True)
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = SLUICE_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=SLUICE_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", ["ip_address", "username"]]
AXES_RESET_ON_SUCCESS = True
# Attempts while locked do not restart the cool-off, so "try again in N minutes" holds.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "accounts.lockout.lockout_response"
# The client address axes records is the audit log's (portal.middleware.client_address):
# X-Forwarded-For counts only when the peer is one of SLUICE_TRUSTED_PROXIES.
AXES_CLIENT_IP_CALLABLE = "accounts.lockout.client_ip_address"
# Addresses or networks of the reverse proxies in front of the portal (comma-separated, e.g.
# "127.0.0.1,10.0.0.0/24"). Empty (the default): the connection's peer is the client and
# X-Forwarded-For is ignored. Listed: X-Forwarded-For is read from the right, skipping hops
# of listed proxies; the first other hop is the client.
SLUICE_TRUSTED_PROXIES = env_list("SLUICE_TRUSTED_PROXIES", [])
for _proxy in SLUICE_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"SLUICE_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network"
        ) from None

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where `collectstatic` gathers the static files and whitenoise serves them from (DEBUG=0).
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STATICFILES_DIRS = [BASE_DIR / "static"]
# Production (DEBUG=0) serves hashed, compressed copies named by a manifest that
# `collectstatic` writes: a page naming a static file missing from it is a 500, so every
# static file must be collected first (docs/operator/production.md).
PRODUCTION_STATICFILES_BACKEND = "whitenoise.storage.CompressedManifestStaticFilesStorage"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": PRODUCTION_STATICFILES_BACKEND
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}

# --- Security (production mode is clean under `manage.py check --deploy`) ---
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the cookie-free meta tag; kept default
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Content-Security-Policy (django-csp): scripts, styles, images only from this site; no inline
# script, style or handler in any page (htmx's indicator style is off, see base.html). The
# Swagger UI at /api/docs/ runs with this policy too (portal/urls.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
    }
}
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- E-mail ---
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if env_str("EMAIL_HOST", "")
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "sluice@localhost")
SLUICE_MAIL_ENABLED = env_bool("SLUICE_MAIL_ENABLED", bool(env_str("EMAIL_HOST", "")))

# --- Cache (coalesces dispatch requests across processes) ---
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# --- Celery ---
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
SLUICE_BROKER_DIR = env_str("SLUICE_BROKER_DIR", str(VAR_DIR / "broker"))
if CELERY_BROKER_URL.startswith("filesystem://"):
    from scheduling.agent.transport import broker_transport_options

    # The same options and transport as the agents (kombu's own filesystem transport can
    # hand a reader a message file before it is written; see AtomicFilesystemTransport).
    CELERY_BROKER_TRANSPORT = "scheduling.agent.transport:AtomicFilesystemTransport"
    CELERY_BROKER_TRANSPORT_OPTIONS = broker_transport_options(CELERY_BROKER_URL, SLUICE_BROKER_DIR)
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Tasks are acknowledged late: a message a worker took and never acknowledged (the
    # worker was killed) goes back to the queue only after this many seconds (Redis'
    # default is an hour). It must exceed the longest a task may wait reserved plus run
    # (prefetch 1, CELERY_TASK_TIME_LIMIT 300 s; what-if runs ack early), or a running task
    # is handed to a second worker. Lost reports cost little meanwhile: every heartbeat
    # reconciles the node's jobs (scheduling/services/reports.py), beat repeats the cycles.
    SLUICE_BROKER_VISIBILITY_TIMEOUT = env_int("SLUICE_BROKER_VISIBILITY_TIMEOUT", 900)
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": SLUICE_BROKER_VISIBILITY_TIMEOUT}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# Three queues (DESIGN §12; scheduling/services/enqueue.py): the dispatch leader's cycle on
# its own worker, agent reports in batches on another, sweeps and simulations on "control".
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ROUTES = {
    "scheduling.dispatch": {"queue": "dispatch"},
    "scheduling.agent_reports": {"queue": "reports"},
    "scheduling.agent_report": {"queue": "reports"},
    "scheduling.reports_probe": {"queue": "reports"},
    # Not behind a backlog of reports: a worker takes its queues in turn.
    "scheduling.heartbeats_drain": {"queue": "control"},
}
# Workers keep their database connections between tasks. Celery's Django fix-up closes
# them before and after every task unless this is set (then only every 2 × N tasks);
# portal/celery.py closes a connection that broke or outlived CONN_MAX_AGE before each
# task instead, as Django does around each request.
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE

# One beat schedule, in code (Read the Docs' habit); tasks are thin and idempotent.
SLUICE_DISPATCH_INTERVAL = env_int("SLUICE_DISPATCH_INTERVAL", 5)
# Under a stream of requests (every submit and every job end asks for a cycle) a cycle
# starts at least this long after the previous one ended, taking every request made
# meanwhile: cycles back to back cost the dispatcher a core while each placed a job or two.
SLUICE_DISPATCH_MIN_GAP_MS = env_int("SLUICE_DISPATCH_MIN_GAP_MS", 100)
# In a deep backlog (this many jobs waiting or more) a cycle is a short one (it stops once
# no waiting job left could start or preempt; same placements and preemptions as a full
# cycle from the same state) unless a waiting job is new or changed or the last full cycle
# (every waiting job's reason, position and estimate) is old enough: at least
# SLUICE_DISPATCH_EXPLAIN_SECONDS, and long enough that full cycles take at most
# SLUICE_DISPATCH_EXPLAIN_SHARE of the loop's time, but never more than
# SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS (scheduling.services.dispatch._explain_interval).
# DEEP_BACKLOG 0: every cycle is a full one.
SLUICE_DISPATCH_DEEP_BACKLOG = env_int("SLUICE_DISPATCH_DEEP_BACKLOG", 500)
SLUICE_DISPATCH_EXPLAIN_SECONDS = env_float("SLUICE_DISPATCH_EXPLAIN_SECONDS", 1.0)
SLUICE_DISPATCH_EXPLAIN_SHARE = env_float("SLUICE_DISPATCH_EXPLAIN_SHARE", 0.1)
SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS = env_float("SLUICE_DISPATCH_EXPLAIN_MAX_SECONDS", 10.0)
SLUICE_CONTROL_INTERVAL = env_int("SLUICE_CONTROL_INTERVAL", 5)
SLUICE_AUDIT_VERIFY_INTERVAL = env_int("SLUICE_AUDIT_VERIFY_INTERVAL", 3600)
# How often the heartbeats waiting on the "heartbeats" queue are taken and applied together
# (scheduling/services/heartbeats.py): a heartbeat waits about half of it on average.
SLUICE_HEARTBEAT_DRAIN_SECONDS = env_float("SLUICE_HEARTBEAT_DRAIN_SECONDS", 1.0)
if SLUICE_HEARTBEAT_DRAIN_SECONDS <= 0:
    raise ImproperlyConfigured("SLUICE_HEARTBEAT_DRAIN_SECONDS must be a positive number")
CELERY_BEAT_SCHEDULE = {
    "dispatch": {
        "task": "scheduling.dispatch",
        "schedule": schedule(timedelta(seconds=SLUICE_DISPATCH_INTERVAL)),
    },
    "control-sweep": {
        "task": "scheduling.control_sweep",
        "schedule": schedule(timedelta(seconds=SLUICE_CONTROL_INTERVAL)),
    },
    "heartbeats-drain": {
        "task": "scheduling.heartbeats_drain",
        "schedule": schedule(timedelta(seconds=SLUICE_HEARTBEAT_DRAIN_SECONDS)),
    },
    "audit-verify": {
        "task": "audit.verify",
        "schedule": schedule(timedelta(seconds=SLUICE_AUDIT_VERIFY_INTERVAL)),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Beat runs once however many are started (high availability: docs/operator/high-availability.md).
# On Redis the schedule lives in Redis (RedBeat) and a beat sends tasks only while it holds
# a Redis lock that it renews every tick (at most SLUICE_BEAT_TICK_SECONDS apart) for
# SLUICE_BEAT_LOCK_SECONDS; a standby tries for it every tick, so a killed holder's place
# is taken within about the lock's time plus a tick. The embedded default (one machine, no
# Redis) keeps Celery's own beat and its schedule file.
SLUICE_BEAT_LOCK_SECONDS = env_int("SLUICE_BEAT_LOCK_SECONDS", 3)
SLUICE_BEAT_TICK_SECONDS = env_float("SLUICE_BEAT_TICK_SECONDS", 1.0)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BEAT_SCHEDULER = "portal.beat:BeatScheduler"
    CELERY_REDBEAT_REDIS_URL = REDIS_URL or CELERY_BROKER_URL
    CELERY_REDBEAT_REDIS_OPTIONS: dict = {}  # not the broker's transport options
    CELERY_REDBEAT_KEY_PREFIX = "sluice:beat:"
    CELERY_REDBEAT_LOCK_TIMEOUT = max(2, SLUICE_BEAT_LOCK_SECONDS)
    CELERY_BEAT_MAX_LOOP_INTERVAL = min(SLUICE_BEAT_TICK_SECONDS, CELERY_REDBEAT_LOCK_TIMEOUT / 2)

# --- Audit log (DESIGN §7): keyed hash chain, head anchored outside the database ---
# Key of the chain's HMACs; derived from SECRET_KEY when empty. Set it on its own in production
# (and keep it): with the derived key, rotating SECRET_KEY makes every keyed event fail to verify.
SLUICE_AUDIT_KEY = env_str("SLUICE_AUDIT_KEY", "")
# Where audit_verify keeps the verified head; somewhere the database's users cannot write.
SLUICE_AUDIT_ANCHOR = Path(env_str("SLUICE_AUDIT_ANCHOR", str(VAR_DIR / "audit-anchor.json")))
# A second copy of the anchor, checked against the log too (empty: none). Put it where whoever
# can write the database and SLUICE_AUDIT_ANCHOR still cannot: another host's share, or a
# root-owned file kept by a verification run as root (docs/operator/security.md).
SLUICE_AUDIT_ANCHOR_COPY = env_str("SLUICE_AUDIT_ANCHOR_COPY", "") or None

# --- Sluice behaviour ---
# Fair share: a tenant's past GPU use counts half after this many seconds (the usage history
# the engine orders tenants by inside a priority class).
SLUICE_USAGE_HALF_LIFE_SECONDS = env_int("SLUICE_USAGE_HALF_LIFE_SECONDS", 7 * 24 * 3600)
from scheduling.engine import defaults as _order_defaults  # noqa: E402 (one definition)

# Order inside a priority class: the engine's Snapshot knobs, handed over by the
# dispatch loop each cycle; see scheduling/engine/order.py. Their defaults are defined
# once, in scheduling/engine/defaults.py: the settings that measured best, which the
# simulator's `sluice` policy uses too (docs/concepts/order.md, "Changing from earlier
# defaults", for sites that set the earlier ones).
# - SLUICE_FAIR_SHARE_BAND (1.0): tenants whose fair shares (decayed usage over guaranteed
#   GPUs) lie within a factor 1 + this of each other, on a log scale, form one band and are
#   not told apart by share; between bands the lowest share goes first. 0: every share is
#   its own band (strict fair share).
# - SLUICE_SIZE_ORDER (on): inside a class and band, small and short work goes first (QSSF):
#   GPUs × expected runtime, the runtime predicted from the submitter's finished jobs
#   (scheduling/runtime_prediction.py) when shorter than the declared limit. Off: lowest
#   share, then submit order.
# - SLUICE_SIZE_HALVING_SECONDS (6 h): the aging of that order: every this many seconds a
#   job has waited count as halving its size (a job twice as big as one submitted 6 h
#   later ties with it). 6 h measured best on the ITP trace: 1 h made the order nearly
#   FIFO in long backlogs (docs/concepts/order.md).
# - SLUICE_MAX_WAIT_SECONDS (48 h): a job that has waited this long since its submission
#   goes before every job of its class and band that has waited less, whatever its size.
#   Each workload policy sets its own (max_wait_seconds); this one applies to workload
#   types without a policy.
SLUICE_SIZE_ORDER = env_bool("SLUICE_SIZE_ORDER", _order_defaults.SIZE_ORDER)
SLUICE_SIZE_HALVING_SECONDS = env_int(
    "SLUICE_SIZE_HALVING_SECONDS", int(_order_defaults.SIZE_HALVING_SECONDS)
)
SLUICE_MAX_WAIT_SECONDS = env_int("SLUICE_MAX_WAIT_SECONDS", int(_order_defaults.MAX_WAIT_SECONDS))
SLUICE_FAIR_SHARE_BAND = env_float("SLUICE_FAIR_SHARE_BAND", _order_defaults.FAIR_SHARE_BAND)
if SLUICE_SIZE_HALVING_SECONDS <= 0 or SLUICE_MAX_WAIT_SECONDS <= 0:
    raise ImproperlyConfigured(
        "SLUICE_SIZE_HALVING_SECONDS and SLUICE_MAX_WAIT_SECONDS must be positive."
    )
if not 0 <= SLUICE_FAIR_SHARE_BAND < float("inf"):
    raise ImproperlyConfigured("SLUICE_FAIR_SHARE_BAND must be a number, 0 or more.")
# - SLUICE_PREEMPTION_MIN_GAIN_SECONDS (0: any gain): a job preempts only if that gets
#   it running at least this much sooner than waiting, both for the GPUs running jobs free
#   by their limits and for its chosen victims' predicted ends (their owners' runtime
#   history, scheduling/runtime_prediction.py). 14400 measured best on the ITP trace (fewer
#   preemptions and less work lost, waits no longer; docs/decisions/).
SLUICE_PREEMPTION_MIN_GAIN_SECONDS = env_int(
    "SLUICE_PREEMPTION_MIN_GAIN_SECONDS", int(_order_defaults.PREEMPTION_MIN_GAIN_SECONDS)
)
if SLUICE_PREEMPTION_MIN_GAIN_SECONDS < 0:
    raise ImproperlyConfigured("SLUICE_PREEMPTION_MIN_GAIN_SECONDS must be 0 or more.")
# - SLUICE_GANG_BORROWER_RESERVE_SECONDS (0: off): a borrower (beyond its tenant's
#   guarantee) reserves no GPUs before its maximum wait; a job of several whole nodes
#   that has waited this long reserves them like guaranteed work, instead of waiting for
#   all its nodes to be idle at once (docs/simulator.md).
SLUICE_GANG_BORROWER_RESERVE_SECONDS = env_int(
    "SLUICE_GANG_BORROWER_RESERVE_SECONDS", int(_order_defaults.GANG_BORROWER_RESERVE_SECONDS)
)
if SLUICE_GANG_BORROWER_RESERVE_SECONDS < 0:
    raise ImproperlyConfigured("SLUICE_GANG_BORROWER_RESERVE_SECONDS must be 0 or more.")
# - SLUICE_CLASS_AGING_SECONDS (0: off): a job whose priority class may not preempt, once
#   it has waited this long since its submission, is ordered with the next class up
#   among the waiting jobs, unless that class may preempt, while its tenant's guarantee
#   in the pool has room for it (low-class work that has waited competes with normal work
#   by size and share on its tenant's own GPUs; it gains no preemption rights). On the
#   ITP trace 3600 cut the average wait of a pool at 85 % load by 3-8 % and lengthened
#   that of a saturated one (95 %) by 5-6 % (docs/decisions/): off by default.
SLUICE_CLASS_AGING_SECONDS = env_int(
    "SLUICE_CLASS_AGING_SECONDS", int(_order_defaults.CLASS_AGING_SECONDS)
)
if SLUICE_CLASS_AGING_SECONDS < 0:
    raise ImproperlyConfigured("SLUICE_CLASS_AGING_SECONDS must be 0 or more.")
# Time-sharing, for the queues that opt in (docs/concepts/time-sharing.md):
# - SLUICE_TIME_SHARING_LEVELS_GPU_HOURS (64,1024): the GPU-hours a job that takes part
#   has used (GPUs x time run, over all its runs) at which each level after the first
#   begins, ascending. A waiting job may stop a running one of its class in a higher level.
# - SLUICE_TIME_SHARING_PROMOTION_SECONDS (28800; 0: never): a job that has waited this
#   long since it last entered the queue is back in the first level.
# - SLUICE_TIME_SHARING_MIN_WAIT_SECONDS (3600): a waiting job stops nobody before it has
#   waited this long since it last entered the queue.
SLUICE_TIME_SHARING_LEVELS_GPU_HOURS = time_sharing_levels(
    "SLUICE_TIME_SHARING_LEVELS_GPU_HOURS",
    os.environ.get("SLUICE_TIME_SHARING_LEVELS_GPU_HOURS"),
    tuple(seconds / 3600 for seconds in _order_defaults.TIME_SHARING_LEVELS),
)
SLUICE_TIME_SHARING_PROMOTION_SECONDS = env_seconds(
    "SLUICE_TIME_SHARING_PROMOTION_SECONDS", _order_defaults.TIME_SHARING_PROMOTION_SECONDS
)
SLUICE_TIME_SHARING_MIN_WAIT_SECONDS = env_seconds(
    "SLUICE_TIME_SHARING_MIN_WAIT_SECONDS", _order_defaults.TIME_SHARING_MIN_WAIT_SECONDS
)
SLUICE_NODE_LOST_SECONDS = env_int("SLUICE_NODE_LOST_SECONDS", 60)
SLUICE_STUCK_LAUNCH_SECONDS = env_int("SLUICE_STUCK_LAUNCH_SECONDS", 300)
SLUICE_LOG_DIR = Path(env_str("SLUICE_LOG_DIR", str(VAR_DIR / "logs")))
# The Unix account a job runs as on the nodes, unless its tenant names one: {tenant} is
# the tenant's slug, {user} the submitter's user name (sites whose portal users are
# LDAP accounts known to the nodes use "{user}").
SLUICE_JOB_ACCOUNT = env_str("SLUICE_JOB_ACCOUNT", "sluice-{tenant}")
# Absolute directories (on the nodes) a job's working_dir or checkpoint_dir may point
# into, "{tenant}" replaced by its tenant, e.g. "/data/{tenant}". Anything else must be a
# relative path inside the job's own directory.
SLUICE_JOB_PATH_ROOTS = env_list("SLUICE_JOB_PATH_ROOTS", [])
SLUICE_RUNTIME_WARNINGS = [float(x) for x in env_list("SLUICE_RUNTIME_WARNINGS", ["0.8", "0.95"])]
SLUICE_RETENTION_CLEANUP_SECONDS = env_int("SLUICE_RETENTION_CLEANUP_SECONDS", 3600)
# A job's timeline events are deleted this many days after it ended, but its final one
# (scheduling.services.recovery); 0 keeps them forever. About 60 MB per 100,000 jobs.
SLUICE_JOB_EVENT_RETENTION_DAYS = env_int("SLUICE_JOB_EVENT_RETENTION_DAYS", 400)
if SLUICE_JOB_EVENT_RETENTION_DAYS < 0:
    raise ImproperlyConfigured("SLUICE_JOB_EVENT_RETENTION_DAYS must be 0 or more.")
# Serving jobs' scraped samples (scheduling.ServeSample) are kept this long.
SLUICE_SERVE_SAMPLE_RETENTION_HOURS = env_float("SLUICE_SERVE_SAMPLE_RETENTION_HOURS", 24.0)
# "broker" sends node messages through the broker; "memory" keeps them in a list (tests).
SLUICE_NODE_TRANSPORT = env_str("SLUICE_NODE_TRANSPORT", "broker")

# --- Insights and metrics ---
# Rollups: one row per queue and per pool/model/tenant each minute, kept this many days;
# hourly rows (means of the minutes) kept this many days. The writer runs every
# SLUICE_ROLLUP_INTERVAL seconds (a beat task on the control queue).
SLUICE_ROLLUP_INTERVAL = env_int("SLUICE_ROLLUP_INTERVAL", 60)
SLUICE_ROLLUP_MINUTE_DAYS = env_int("SLUICE_ROLLUP_MINUTE_DAYS", 2)
SLUICE_ROLLUP_HOUR_DAYS = env_int("SLUICE_ROLLUP_HOUR_DAYS", 90)
# A job's GPU chart keeps at most this many points (neighbours merge beyond it).
SLUICE_JOB_SERIES_POINTS = env_int("SLUICE_JOB_SERIES_POINTS", 720)
# /metrics answers a request with "Authorization: Bearer <SLUICE_METRICS_TOKEN>" or from an
# address in SLUICE_METRICS_ALLOWED_NETWORKS (CIDRs); with neither set, only loopback.
SLUICE_METRICS_TOKEN = env_str("SLUICE_METRICS_TOKEN", "")
SLUICE_METRICS_ALLOWED_NETWORKS = env_list(
    "SLUICE_METRICS_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"]
)
# Where web and Celery processes keep prometheus-client's multiprocess files (the events
# observed where they happen: admission waits, dispatch cycles; docs/insights-metrics.md).
PROMETHEUS_MULTIPROC_DIR = Path(env_str("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "prometheus")))
# prometheus-client chooses its multiprocess mode from the environment when it is first
# imported: the settings, loaded first in every process (gunicorn workers, Celery processes,
# manage.py), export the directory before anything imports it. Files of dead processes
# are removed when a service starts (insights.instrument.multiprocess_dir_prepare).
PROMETHEUS_MULTIPROC_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(PROMETHEUS_MULTIPROC_DIR)
# /metrics serves the totals over the whole history (job outcomes, preemptions, reclaims)
# as a beat task last counted them, this often: a count costs a pass over the jobs table.
SLUICE_METRICS_TOTALS_INTERVAL = env_int("SLUICE_METRICS_TOTALS_INTERVAL", 30)
# The insights' beat tasks: rollups every interval, history totals for /metrics, the
# recommendations once a day, the weekly policy review (written once per week; checked
# every 6 h so that a beat down on Monday morning still writes it).
CELERY_BEAT_SCHEDULE.update(
    {
        "insights-rollup": {
            "task": "insights.rollup",
            "schedule": schedule(timedelta(seconds=SLUICE_ROLLUP_INTERVAL)),
        },
        "insights-metrics-totals": {
            "task": "insights.metrics_totals",
            "schedule": schedule(timedelta(seconds=SLUICE_METRICS_TOTALS_INTERVAL)),
        },
        "insights-recommendations": {
            "task": "insights.recommendations",
            "schedule": crontab(hour=5, minute=17),
        },
        "insights-policy-review": {
            "task": "insights.policy_review",
            "schedule": crontab(hour="*/6", minute=20),
        },
    }
)

# --- Inference services ---
# The services' control loop (autoscale + reconcile, one leader) runs every this many
# seconds; a service's timeline gets a line when something changes and at least every
# SLUICE_SERVICE_DECISION_EVERY_S (the chart's points); lines are kept this many days.
SLUICE_SERVICE_INTERVAL = env_int("SLUICE_SERVICE_INTERVAL", 3)
SLUICE_SERVICE_DECISION_EVERY_S = env_int("SLUICE_SERVICE_DECISION_EVERY_S", 15)
SLUICE_SERVICE_DECISION_DAYS = env_int("SLUICE_SERVICE_DECISION_DAYS", 7)
# A ready replica that leaves (scale-down, rolling update, pause) is out of the endpoints at
# once and its job is cancelled this many seconds later: balancers re-read the endpoints
# first, so requests in flight are not cut. 0: cancelled at once.
SLUICE_SERVICE_DRAIN_S = env_int("SLUICE_SERVICE_DRAIN_S", 5)
CELERY_BEAT_SCHEDULE.update(
    {
        "inference-services-tick": {
            "task": "inference.services_tick",
            "schedule": schedule(timedelta(seconds=SLUICE_SERVICE_INTERVAL)),
        },
        "inference-decisions-prune": {
            "task": "inference.decisions_prune",
            "schedule": schedule(timedelta(seconds=3600)),
        },
    }
)

# LDAP leavers: disabled or gone from the directory → deactivated, tokens revoked.
if SLUICE_LDAP_ENABLED:  # noqa: F821 (set by ldap_settings)
    CELERY_BEAT_SCHEDULE["identity-ldap-sync"] = {
        "task": "identity.ldap_sync",
        "schedule": schedule(timedelta(seconds=SLUICE_LDAP_SYNC_SECONDS)),
    }

# OIDC users signed in longer ago than SLUICE_OIDC_MAX_SESSION_AGE are signed out.
CELERY_BEAT_SCHEDULE["identity-oidc-sessions-expire"] = {
    "task": "identity.oidc_sessions_expire",
    "schedule": schedule(timedelta(seconds=300)),
}

# --- REST API ---
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.StandardPagination",
    "PAGE_SIZE": 50,
    # Bad input is a 400 naming the field, never a 500 (portal.api.parsers and .filters):
    # NUL and lone surrogates are refused in any body, query parameter or path.
    "DEFAULT_PARSER_CLASSES": [
        "portal.api.parsers.JSONParser",
        "portal.api.parsers.FormParser",
        "portal.api.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": [
        "portal.api.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "portal.api.filters.FilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Sluice API",
    "DESCRIPTION": "GPU scheduling portal: tenants, quotas, queues, jobs, priority raises, audit.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI served from the installed sidecar package: no CDN, works air-gapped.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # One enum name for the workload types, wherever a serializer lists them.
    "ENUM_NAME_OVERRIDES": {
        "WorkloadTypeEnum": "scheduling.choices.WorkloadType",
        # A tenant role (admin, member, viewer), and the two a robot account may have.
        "TenantRoleEnum": "tenants.choices.Role",
        "RobotRoleEnum": "accounts.robots.ROBOT_ROLE_CHOICES",
    },
    # Every operation documents its error answers (400, 401, 403, 404, 409, ...) with the
    # one error shape, {"detail": ..., "errors": {field: [messages]}}.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.document_error_responses",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"no_403_traceback": {"()": "portal.logfilters.NoTracebackForExpected403"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "django.request": {"filters": ["no_403_traceback"]},
    },
}
