"""Settings shared by every environment. Environment files override below their imports."""
from pathlib import Path

import dj_database_url

from controlplane.settings.env import env, env_bool, env_float, env_int

BASE_DIR = Path(__file__).resolve().parents[2]

# --- Core -------------------------------------------------------------------------------------------
SECRET_KEY = env("DJANGO_SECRET_KEY", required=True)
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in env("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]
ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "deployments",
    "gateway",
    "observability",
    "frontend",
]

MIDDLEWARE = [
    "controlplane.request_id.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
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

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Database and Redis ----------------------------------------------------------------------------
DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tandem"), conn_max_age=60
    )
}
REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")

# --- Celery -----------------------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = env_int("TANDEM_TASK_TIME_LIMIT", 300)
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 30
# A message survives a dead worker: Redis redelivers it after this many seconds (longer than any task).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("TANDEM_VISIBILITY_TIMEOUT", 600)}
CELERY_BEAT_SCHEDULE = {
    "resync-unsettled-deployments": {"task": "workers.tasks.resync_deployments", "schedule": 30.0},
    "drain-gateway-request-records": {"task": "gateway.tasks.drain_request_records", "schedule": 5.0},
    "scrape-deployment-metrics": {"task": "observability.tasks.scrape_running_deployments", "schedule": 30.0},
    "rollup-gateway-timings": {"task": "observability.tasks.rollup_gateway_timings", "schedule": 60.0},
    "prune-observability-rollups": {"task": "observability.tasks.prune_rollups", "schedule": 3600.0},
}

# --- REST API ---------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "deployments.api.auth.AccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["rest_framework.filters.OrderingFilter"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "deployments.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tandem API",
    "DESCRIPTION": "Request, approve and run prefill/decode-disaggregated LLM deployments.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Tandem -----------------------------------------------------------------------------------------
# Digests of API keys and access tokens are HMAC-SHA256 under this secret (rotate with care: keys die).
TANDEM_KEY_HMAC_SECRET = env("TANDEM_KEY_HMAC_SECRET", SECRET_KEY)
TANDEM_GATEWAY_BASE_URL = env("TANDEM_GATEWAY_BASE_URL", "http://127.0.0.1:8001/v1")
TANDEM_RECONCILE_REQUEUE_SECONDS = env_float("TANDEM_RECONCILE_REQUEUE_SECONDS", 5.0)
TANDEM_STUCK_AFTER_SECONDS = env_int("TANDEM_STUCK_AFTER_SECONDS", 1800)
TANDEM_ROLLUP_RETENTION_DAYS = env_int("TANDEM_ROLLUP_RETENTION_DAYS", 14)
TANDEM_CONFORMANCE_RETENTION_DAYS = env_int("TANDEM_CONFORMANCE_RETENTION_DAYS", 30)
# A running deployment still waiting for its first conformance result this long has its run started again.
TANDEM_CONFORMANCE_OVERDUE_SECONDS = env_int("TANDEM_CONFORMANCE_OVERDUE_SECONDS", 600)
# Ray exports engine metrics every few seconds: how long a probe waits for a run's traffic to show.
TANDEM_METRICS_SETTLE_SECONDS = env_float("TANDEM_METRICS_SETTLE_SECONDS", 30.0)

# --- Cluster credentials (deployments.secret_refs) -----------------------------------------------------
# A cluster's secret_ref is sent as a bearer token to URLs an admin registers, so it may name only an environment
# variable with this prefix or a file inside this directory (by real path); no directory: no file references.
TANDEM_CLUSTER_SECRET_ENV_PREFIX = env("TANDEM_CLUSTER_SECRET_ENV_PREFIX", "TANDEM_CLUSTER_")
TANDEM_CLUSTER_SECRETS_DIR = env("TANDEM_CLUSTER_SECRETS_DIR", "")

# --- Gateway (its own process: `python -m gateway`) ---------------------------------------------------
TANDEM_GATEWAY_HOST = env("TANDEM_GATEWAY_HOST", "127.0.0.1")
TANDEM_GATEWAY_PORT = env_int("TANDEM_GATEWAY_PORT", 8001)
TANDEM_GATEWAY_MAX_BODY_BYTES = env_int("TANDEM_GATEWAY_MAX_BODY_BYTES", 4 * 1024 * 1024)
TANDEM_GATEWAY_CONNECT_TIMEOUT_S = env_float("TANDEM_GATEWAY_CONNECT_TIMEOUT_S", 5.0)
# Longest wait for upstream's response headers and, when streaming, between two chunks.
TANDEM_GATEWAY_UPSTREAM_TIMEOUT_S = env_float("TANDEM_GATEWAY_UPSTREAM_TIMEOUT_S", 600.0)
TANDEM_GATEWAY_ACCESS_LOG = env_bool("TANDEM_GATEWAY_ACCESS_LOG", True)

# --- Logging: one JSON line per record, with the request id ------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "controlplane.request_id.RequestIdFilter"}},
    "formatters": {"json": {"()": "controlplane.request_id.JsonFormatter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "json", "filters": ["request_id"]}
    },
    "root": {"handlers": ["console"], "level": env("TANDEM_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}
