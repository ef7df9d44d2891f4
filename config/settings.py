"""Settings for the ChokaQ project.

Everything that differs between machines comes from environment variables:

* ``DATABASE_URL`` — ``sqlite:///path`` (default ``var/chokaq.sqlite3``, relative to the project),
  ``postgres://user:pass@host:5432/db`` or
  ``mssql://user:pass@host:1433/db?driver=ODBC+Driver+18+for+SQL+Server``, parsed by dj-database-url.
* ``REDIS_URL`` — when set, Channels uses Redis (cross-process events);
  otherwise an in-memory channel layer (single process).
* ``CHOKAQ_JOB_MODULES`` — extra comma-separated modules holding ``@job``
  definitions, imported at start-up besides every app's ``jobs.py`` (default: the
  demo jobs, except with ``DJANGO_ENV=production``: none).
* ``DJANGO_DEBUG=1`` — Django's debug mode, only when set explicitly (``scripts/run``
  sets it for itself); never with ``DJANGO_ENV=production``.
* ``DJANGO_BEHIND_PROXY=1`` — declares that a TLS-terminating proxy is the only way
  to reach the web process: only then are its ``X-Forwarded-Proto`` (Django) and
  ``X-Forwarded-For`` (daphne ``--proxy-headers``) trusted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("CHOKAQ_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
BEHIND_PROXY = os.environ.get("DJANGO_BEHIND_PROXY", "0") == "1"

INSTALLED_APPS = [
    # "daphne" is not listed: the web process runs the daphne CLI on config.asgi, and leaving it out keeps
    # twisted/autobahn/OpenSSL out of worker processes (~20 MiB of RSS each).
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # ChokaQ, exactly as the README's "Add ChokaQ to your project" says:
    "channels",
    "chokaq_core",
    "deck",
    # the demo project's example app: a view that enqueues inside transaction.atomic()
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files (see STORAGES below)
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
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
WSGI_APPLICATION = None
ASGI_APPLICATION = "config.asgi.application"


def database_from_url(url: str) -> dict[str, Any]:
    """A Django DATABASES entry from a DATABASE_URL (dj-database-url), with ChokaQ's per-vendor options."""
    scheme = url.split(":", 1)[0].lower()
    engine = "mssql" if scheme in ("mssql", "sqlserver") else None  # mssql-django (dj-database-url: mssqlms)
    database: dict[str, Any] = dict(dj_database_url.parse(url, engine=engine,
                                                          conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0"))))
    options: dict[str, Any] = dict(database.get("OPTIONS") or {})
    if database["ENGINE"] == "django.db.backends.sqlite3":
        name = Path(database["NAME"])
        name = name if name.is_absolute() else BASE_DIR / name  # sqlite:///var/x.sqlite3 is relative to the project
        database["NAME"] = str(name)
        # BEGIN IMMEDIATE for every atomic block: the write lock is taken up front, so read-then-write
        # transitions are serialized (system check chokaq.E009 asks for it); WAL lets readers run meanwhile.
        options.update({"transaction_mode": "IMMEDIATE", "timeout": 30,
                        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"})
        database["TEST"] = {"NAME": str(VAR_DIR / f"test_{name.stem}.sqlite3")}
    elif database["ENGINE"] == "mssql":
        driver = options.pop("driver", "ODBC Driver 18 for SQL Server")
        extra = ";".join(f"{k}={v}" for k, v in options.items())  # e.g. TrustServerCertificate=yes
        options = {"driver": driver, **({"extra_params": extra} if extra else {})}
    database["OPTIONS"] = options
    return database


DATABASES = {"default": database_from_url(os.environ.get("DATABASE_URL", "sqlite:///var/chokaq.sqlite3"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 5000, "expiry": 30},
        }
    }
    # One cache for every web process: the Deck's login throttle counts failures across all of them.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                          "KEY_PREFIX": "chokaq"}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [  # Django's defaults
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing STATIC_ROOT on every command until collectstatic
# Static files carry content-hashed names: ``manage.py collectstatic`` (scripts/run, the Dockerfile) writes
# ``deck.3f2a….css`` and its manifest, and WhiteNoise serves them with ``Cache-Control: max-age=315360000,
# public, immutable``, pre-compressed (gzip/brotli); a new release is a new name. Without DEBUG the pages need
# that collectstatic (Django's manifest storage). With DEBUG (scripts/run) the pages use the plain names and
# WhiteNoise reads the files from the apps, so an edit shows without collecting.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG
DECK_ROUTE_PREFIX = os.environ.get("CHOKAQ_DECK_ROUTE_PREFIX", "deck").strip("/")  # the Deck at /<prefix>/

# The Deck's live updates (deck/consumers.py): one broadcaster per web process reads storage in ONE
# statement at most once per READ_INTERVAL seconds (however many events arrive and tabs are open) and at
# least once per POLL_INTERVAL seconds (the only way to see other processes' work when no cross-process
# channel layer, i.e. Redis, is set); progress frames go out at most once per TICK seconds.
CHOKAQ_DECK = {
    "TICK": float(os.environ.get("CHOKAQ_DECK_TICK", "0.25")),
    "POLL_INTERVAL": float(os.environ.get("CHOKAQ_DECK_POLL_INTERVAL", "1.0")),
    "READ_INTERVAL": float(os.environ.get("CHOKAQ_DECK_READ_INTERVAL", "1.0")),
    # every open websocket's session, active flag and read permission are re-checked this often (seconds)
    "REAUTH_INTERVAL": float(os.environ.get("CHOKAQ_DECK_REAUTH_INTERVAL", "30")),
    "ROUTE_PREFIX": f"/{DECK_ROUTE_PREFIX}",
}

# Every chokaq.* record carries event_id/event_name (spec 05 §3); CHOKAQ_LOG_FORMAT=json prints one
# JSON object per line (the default in production).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"chokaq_events": {"()": "chokaq_core.logs.EventIdFilter"},
                "chokaq_secrets": {"()": "chokaq_core.redaction.CredentialMaskingLogFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "chokaq_core.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "filters": ["chokaq_events", "chokaq_secrets"],
                             "formatter": os.environ.get("CHOKAQ_LOG_FORMAT", "plain")}},
    "loggers": {
        "chokaq": {"handlers": ["console"], "level": os.environ.get("CHOKAQ_LOG_LEVEL", "INFO"), "propagate": False},
    },
}

# Debug pages and error reports mask URL passwords (REDIS_URL, DATABASE_URL) besides Django's hidden settings.
DEFAULT_EXCEPTION_REPORTER_FILTER = "chokaq_core.redaction.CredentialMaskingReporterFilter"
DEFAULT_EXCEPTION_REPORTER = "chokaq_core.redaction.CredentialMaskingExceptionReporter"

# Django's Tasks framework runs on ChokaQ: any @task is a ChokaQ job (chokaq_core.backend).
# QUEUES empty: any queue name is accepted (ChokaQ creates a queue on its first enqueue).
TASKS = {"default": {"BACKEND": "chokaq_core.backend.ChokaQBackend", "QUEUES": []}}

DJANGO_ENV = os.environ.get("DJANGO_ENV", "development")
_DEMO_JOB_MODULES = "" if DJANGO_ENV == "production" else "config.demo_jobs"  # no demo jobs in production
CHOKAQ: dict[str, object] = {
    "JOB_MODULES": [m for m in os.environ.get("CHOKAQ_JOB_MODULES", _DEMO_JOB_MODULES).split(",") if m],
}

# ---------------------------------------------------------------- production mode (DJANGO_ENV=production)
# Passes ``manage.py check --deploy``: no DEBUG, a real secret, explicit hosts, HTTPS only behind a
# TLS-terminating proxy (X-Forwarded-Proto, trusted only with DJANGO_BEHIND_PROXY=1), secure cookies, HSTS,
# a Redis channel layer (and cache), JSON logs.
if DJANGO_ENV == "production":
    from django.core.exceptions import ImproperlyConfigured

    DEBUG = False
    if SECRET_KEY == "dev-only-insecure-key-change-me" or len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5:
        raise ImproperlyConfigured("DJANGO_ENV=production needs DJANGO_SECRET_KEY: 50+ random characters")
    if "DJANGO_ALLOWED_HOSTS" not in os.environ:
        raise ImproperlyConfigured("DJANGO_ENV=production needs DJANGO_ALLOWED_HOSTS (comma-separated host names)")
    if not REDIS_URL:
        raise ImproperlyConfigured("DJANGO_ENV=production needs REDIS_URL: workers run in other processes")
    CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
    if BEHIND_PROXY:  # a client that reaches the process directly could claim HTTPS with this header
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = os.environ.get("DJANGO_SECURE_SSL_REDIRECT", "1") == "1"
    # Container probes and scrapers speak plain HTTP to the process itself.
    SECURE_REDIRECT_EXEMPT = [r"^deck/health/$", r"^deck/metrics$"]
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = os.environ.get("DJANGO_SECURE_HSTS_PRELOAD", "1") == "1"
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    X_FRAME_OPTIONS = "DENY"
    LOGGING["handlers"]["console"]["formatter"] = os.environ.get("CHOKAQ_LOG_FORMAT", "json")  # type: ignore[index]
    CHOKAQ["REQUIRE_REGISTERED_JOB_TYPES"] = True
