"""Settings of the development project: the demo, the admin and the test suite.

Everything that differs between machines comes from the environment (or a ``.env`` file)
through django-environ: ``DATABASE_URL``, ``REDIS_URL``, ``SECRET_KEY``, ``DEBUG``.
"""

from pathlib import Path

import django
import environ

from nexus_workflows.fire_and_forget.embedded import embedded_queue

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

# The development project defaults to DEBUG so that the quickstart works with no
# configuration at all; a deployment sets DEBUG=false and a real SECRET_KEY.
DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str(
    "SECRET_KEY",
    default="django-insecure-nexus-workflows-development-only" if DEBUG else environ.Env.NOTSET,
)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rq",
    "nexus_workflows",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

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

WSGI_APPLICATION = "project.wsgi.application"

# --- Database ---------------------------------------------------------------------------
# Embedded default: an SQLite file next to manage.py. Production: DATABASE_URL=postgres://…
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the admin read while a runner writes; IMMEDIATE transactions take the
    # write lock up front instead of failing half-way with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        }
    )
else:
    # The runner is a long-lived process: keep its connections instead of reconnecting
    # for every unit of work, and check them before reuse after an outage.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=600)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis / django-rq ------------------------------------------------------------------
# REDIS_URL=redis://host:6379/0 (run `manage.py rqworker --with-scheduler` beside the web
# process and the runner). Unset means the embedded mode: fire-and-forget workflows run
# synchronously at enqueue on an in-process fakeredis (see nexus_workflows.fire_and_forget.embedded).
REDIS_URL = env.str("REDIS_URL", default="")
RQ_QUEUES = {
    "default": (
        {"URL": REDIS_URL, "DEFAULT_TIMEOUT": 360} if REDIS_URL else embedded_queue(DEFAULT_TIMEOUT=360)
    ),
}

# --- nexus_workflows ----------------------------------------------------------------------
NEXUS_WORKFLOWS: dict = {
    # PHI token maps: the lookup-key HMAC secret and the Fernet keys (comma-separated,
    # newest first). Unset with DEBUG on: development keys derived from SECRET_KEY.
    "PHI_HMAC_KEY": env.str("PHI_HMAC_KEY", default=""),
    "PHI_ENCRYPTION_KEYS": env.list("PHI_ENCRYPTION_KEYS", default=[]),
}

# --- Django's Tasks API -------------------------------------------------------------------
# @task functions are rows of nexus_workflows, run by `manage.py runworkflows`. Django 5.2
# takes the API from the django-tasks backport, an app of its own.
TASKS = {"default": {"BACKEND": "nexus_workflows.tasks.DeferredBackend"}}
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

# --- Airtable ---------------------------------------------------------------------------
# Personal access token of the Airtable helpers (nexus_workflows.airtable); never commit it.
AIRTABLE_API_KEY = env.str("AIRTABLE_API_KEY", default="")
# Base that the demo's triage projection writes to.
DEMO_AIRTABLE_BASE_ID = env.str("DEMO_AIRTABLE_BASE_ID", default="appNexusDemo")

# --- Error reports ----------------------------------------------------------------------
# Django's filter hides settings by name (…PASS…, …KEY…); REDIS_URL, RQ_QUEUES' URL and a
# DATABASE_URL in the environment (runserver's request.META) hold a password inside a
# URL. This one hides those too, in the debug page and in the reports mailed to ADMINS.
DEFAULT_EXCEPTION_REPORTER_FILTER = "nexus_workflows.error_reports.UrlCredentialsFilter"

# --- Internationalisation, static files -------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)-7s %(name)s %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        "nexus_workflows": {
            "handlers": ["console"],
            "level": env.str("NEXUS_WORKFLOWS_LOG_LEVEL", default="INFO"),
            "propagate": False,
        },
        "project.demo": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
