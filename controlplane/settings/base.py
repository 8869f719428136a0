"""Settings shared by every environment. Environment files override below their imports."""
import datetime as dt
import json
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from controlplane.forwarded import forwarded_allow_ips_problem
from controlplane.settings.env import env, env_bool, env_float, env_int, env_labels

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
# Set only where every request reaches the app through your TLS proxy (nothing can connect to it directly):
# then, and only then, the proxy's X-Forwarded-Proto and X-Forwarded-For are believed.
TANDEM_ONLY_BEHIND_PROXY = env_bool("TANDEM_ONLY_BEHIND_PROXY", False)
# Where other peers can reach the app too (a cluster's pods): the proxies (addresses, CIDRs; on EKS the VPC's)
# whose X-Forwarded-Proto and X-Forwarded-For are believed, from them alone (controlplane/forwarded.py).
TANDEM_WEB_FORWARDED_ALLOW_IPS = env("TANDEM_WEB_FORWARDED_ALLOW_IPS", "")
if _problem := forwarded_allow_ips_problem("TANDEM_WEB_FORWARDED_ALLOW_IPS", TANDEM_WEB_FORWARDED_ALLOW_IPS):
    raise ImproperlyConfigured(f"Refusing to start Tandem: {_problem}")
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
    "drf_spectacular_sidecar",
    "django_htmx",
    "axes",
    "deployments",
    "usage",
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
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "deployments.api.query.one_value_per_parameter",  # /api/v1/: ?x=1&x=2 is a 400
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: it answers for locked-out sign-ins
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
                "django.template.context_processors.csp",
            ],
        },
    },
]

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# --- Content-Security-Policy: everything the portal loads is ours (htmx and Chart.js are vendored) ------
# No inline script or style runs without the response's nonce; nothing is loaded from another origin.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF, CSP.NONCE],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}

# --- Sign-in: password rules and a limit on guessing (django-axes) --------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# AUTHENTICATION_BACKENDS is set under "Company sign-in" below: axes first, then passwords and/or OIDC.
# A username is locked from one address after this many wrong passwords in a row (portal and admin
# sign-in count together) until the cool-off passes or an admin runs `manage.py axes_reset_username`.
# Locking the pair, not the username alone, keeps a stranger from locking anyone else out.
AXES_FAILURE_LIMIT = env_int("TANDEM_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = dt.timedelta(minutes=env_int("TANDEM_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "frontend.views.auth.locked_out"  # 429, the wait, Retry-After
AXES_CLIENT_IP_CALLABLE = "controlplane.client_ip.client_ip"

# --- Database and Redis ----------------------------------------------------------------------------
# Connections are kept for a minute and checked before their first use in each request or task, so a
# PostgreSQL restart costs a reconnect, not a 500 on the first request of every web process.
DATABASES = {
    "default": dj_database_url.parse(
        env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tandem"), conn_max_age=60, conn_health_checks=True
    )
}
REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0")
# Shared by every web process (API throttles count across gunicorn workers and replicas).
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env("TANDEM_CACHE_URL", REDIS_URL),
        "KEY_PREFIX": "tandem-cache",
    }
}

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
    "drain-gateway-request-records": {"task": "usage.tasks.drain_request_records", "schedule": 5.0},
    "scrape-deployment-metrics": {"task": "observability.tasks.scrape_running_deployments", "schedule": 30.0},
    "rollup-gateway-timings": {"task": "observability.tasks.rollup_gateway_timings", "schedule": 60.0},
    "prune-observability-rollups": {"task": "observability.tasks.prune_rollups", "schedule": 3600.0},
    "pause-idle-deployments": {"task": "workers.tasks.pause_idle_deployments", "schedule": 60.0},
    "check-team-budgets": {"task": "workers.tasks.check_budgets", "schedule": 600.0},
    "apply-recommendations": {"task": "observability.tasks.apply_recommendations", "schedule": 300.0},
}

# --- REST API ---------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "deployments.api.auth.AccessTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "deployments.api.pagination.StrictLimitOffsetPagination",
    # JSON only: any other body is refused with 415 before a view reads it (deployments/api/contract.py).
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["deployments.api.ordering.StableOrderingFilter"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "deployments.api.errors.exception_handler",
    # Requests per signed-in user (token or session) and per address for everyone else; the excess gets 429
    # with Retry-After. Counted in the Redis cache, so the limit holds across workers and replicas.
    "DEFAULT_THROTTLE_CLASSES": ["deployments.api.throttles.UserThrottle",
                                 "deployments.api.throttles.AnonThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env("TANDEM_API_RATE_USER", "600/min"),
                               "anon": env("TANDEM_API_RATE_ANON", "60/min")},
    # The client address: the socket's, or the one the proxy appended when only the proxy can reach us.
    "NUM_PROXIES": 1 if TANDEM_ONLY_BEHIND_PROXY else 0,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Tandem API",
    "DESCRIPTION": "Request, approve and run prefill/decode-disaggregated LLM deployments.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Every operation's error statuses and their body, from one place (deployments/api/contract.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "deployments.api.contract.error_responses_hook"],
    # Each enum named for what it is; clusters keep the name they had before events' kinds had an enum too.
    "ENUM_NAME_OVERRIDES": {"DeploymentStatusEnum": "deployments.lifecycle.Status",
                            "EventKindEnum": "deployments.event_kinds.EventKind",
                            "KindEnum": "deployments.models.clusters.Cluster.Kind",
                            "RolloutModeEnum": "deployments.models.rollouts.Rollout.Mode",
                            "RolloutStateEnum": "deployments.models.rollouts.Rollout.State",
                            "RolloutStepStateEnum": "deployments.rollout_steps.StepState.choices"},
    # Swagger UI and Redoc from the drf-spectacular-sidecar package: no CDN, pinned by the lock.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- Tandem -----------------------------------------------------------------------------------------
# Digests of API keys and access tokens are HMAC-SHA256 under this secret (rotate with care: keys die).
TANDEM_KEY_HMAC_SECRET = env("TANDEM_KEY_HMAC_SECRET", SECRET_KEY)
# Lifetimes (days) of credentials whose owner is in no team; a team sets its own for its keys and members' tokens.
TANDEM_CREDENTIAL_DEFAULT_DAYS = env_int("TANDEM_CREDENTIAL_DEFAULT_DAYS", 90)
TANDEM_CREDENTIAL_MAX_DAYS = env_int("TANDEM_CREDENTIAL_MAX_DAYS", 365)
TANDEM_GATEWAY_BASE_URL = env("TANDEM_GATEWAY_BASE_URL", "http://127.0.0.1:8001/v1")
TANDEM_RECONCILE_REQUEUE_SECONDS = env_float("TANDEM_RECONCILE_REQUEUE_SECONDS", 5.0)
TANDEM_STUCK_AFTER_SECONDS = env_int("TANDEM_STUCK_AFTER_SECONDS", 1800)
# Reconcile passes beat's resync (every 30 s) enqueues at most, less what still waits on the queue: keep it below
# what the workers finish in 30 s (bench/scale.py measures a pass). Running deployments beyond it are looked at
# in turn, each within ceil(running / batch) ticks.
TANDEM_RESYNC_BATCH = env_int("TANDEM_RESYNC_BATCH", 300)
TANDEM_ROLLUP_RETENTION_DAYS = env_int("TANDEM_ROLLUP_RETENTION_DAYS", 14)
# Who, besides the team's own pods and Tandem's gateway and workers, the NetworkPolicy of every team namespace lets
# in: the KubeRay operator (pods labelled app.kubernetes.io/name=kuberay-operator in namespaces with these labels)
# on Serve's port and Ray's dashboard, and Prometheus (every pod in namespaces with these labels; none when unset)
# on Ray's metrics port.
TANDEM_KUBERAY_NAMESPACE_LABELS = env_labels("TANDEM_KUBERAY_NAMESPACE_LABELS",
                                             "kubernetes.io/metadata.name=kuberay-system")
TANDEM_PROMETHEUS_NAMESPACE_LABELS = env_labels("TANDEM_PROMETHEUS_NAMESPACE_LABELS")
TANDEM_CONFORMANCE_RETENTION_DAYS = env_int("TANDEM_CONFORMANCE_RETENTION_DAYS", 30)
# A running deployment still waiting for its first conformance result this long has its run started again.
TANDEM_CONFORMANCE_OVERDUE_SECONDS = env_int("TANDEM_CONFORMANCE_OVERDUE_SECONDS", 600)
# How long a rollback waits, with every request already moved back, before the new application (no longer taking
# traffic) is removed: streams in flight on it finish first (workers.rollout).
TANDEM_ROLLOUT_DRAIN_SECONDS = env_float("TANDEM_ROLLOUT_DRAIN_SECONDS", 10.0)
# Ray exports engine metrics every few seconds: how long a probe waits for a run's traffic to show.
TANDEM_METRICS_SETTLE_SECONDS = env_float("TANDEM_METRICS_SETTLE_SECONDS", 30.0)
# On-demand conformance runs (POST /api/v1/deployments/<id>/conformance/): one pending per deployment, and at
# most this many per team in each window; the rest get 429 with Retry-After.
TANDEM_CONFORMANCE_TEAM_RUNS = env_int("TANDEM_CONFORMANCE_TEAM_RUNS", 10)
TANDEM_CONFORMANCE_TEAM_WINDOW_SECONDS = env_int("TANDEM_CONFORMANCE_TEAM_WINDOW_SECONDS", 3600)
# The web app's /metrics answers only `Authorization: Bearer <this>`; unset, /metrics is off (404).
TANDEM_METRICS_TOKEN = env("TANDEM_METRICS_TOKEN", "")

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
# Longest wait for a stream's first event (a decode waiting for KV that never comes): then it is asked once more,
# and the second time the client gets a 504.
TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S = env_float("TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S", 60.0)
# An idle upstream connection is reused only this long: shorter than upstream's own keep-alive (Ray Serve's proxy
# closes idle connections after 5 s), or a request can be sent on a connection upstream is closing (a 502).
TANDEM_GATEWAY_UPSTREAM_KEEPALIVE_S = env_float("TANDEM_GATEWAY_UPSTREAM_KEEPALIVE_S", 4.0)
TANDEM_GATEWAY_ACCESS_LOG = env_bool("TANDEM_GATEWAY_ACCESS_LOG", True)
# Prometheus metrics name every team's deployments: an internal address of their own, not the public port.
TANDEM_GATEWAY_METRICS_HOST = env("TANDEM_GATEWAY_METRICS_HOST", "127.0.0.1")
TANDEM_GATEWAY_METRICS_PORT = env_int("TANDEM_GATEWAY_METRICS_PORT", 9801)
# Longest a cached key (or route) is honoured without PostgreSQL confirming it; past it, 503 until it can.
TANDEM_GATEWAY_KEY_MAX_STALE_S = env_float("TANDEM_GATEWAY_KEY_MAX_STALE_S", 30.0)
TANDEM_GATEWAY_CACHE_MAX_ENTRIES = env_int("TANDEM_GATEWAY_CACHE_MAX_ENTRIES", 100_000)
# Failed authentications per client address and minute before it gets 429s (0: no limit).
TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE = env_int("TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE", 60)
# Proxies (comma-separated addresses/CIDRs, uvicorn's syntax) trusted to name the client in X-Forwarded-For.
TANDEM_GATEWAY_FORWARDED_ALLOW_IPS = env("TANDEM_GATEWAY_FORWARDED_ALLOW_IPS", "")
# On where clients come through a load balancer (the EKS overlay): then the gateway refuses to start without the
# range above, rather than give every client the balancer's address.
TANDEM_GATEWAY_BEHIND_LOAD_BALANCER = env_bool("TANDEM_GATEWAY_BEHIND_LOAD_BALANCER", False)
TANDEM_GATEWAY_MAX_HEADER_BYTES = env_int("TANDEM_GATEWAY_MAX_HEADER_BYTES", 64 * 1024)
# Seconds added to the wall clock of the per-minute rate-limit windows (gateway/clock.py); tests only, keep 0.
TANDEM_GATEWAY_CLOCK_OFFSET_S = env_float("TANDEM_GATEWAY_CLOCK_OFFSET_S", 0.0)

# --- Company sign-in (OpenID Connect, mozilla-django-oidc) -------------------------------------------------
# On when a client id is set. The provider's endpoints are named one by one (its discovery document lists them);
# the group claim maps to team memberships at every sign-in (deployments/services/sign_in.py).
OIDC_RP_CLIENT_ID = env("TANDEM_OIDC_CLIENT_ID")
TANDEM_OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env("TANDEM_OIDC_CLIENT_SECRET", required=TANDEM_OIDC_ENABLED)
OIDC_OP_AUTHORIZATION_ENDPOINT = env("TANDEM_OIDC_AUTHORIZATION_ENDPOINT", required=TANDEM_OIDC_ENABLED)
OIDC_OP_TOKEN_ENDPOINT = env("TANDEM_OIDC_TOKEN_ENDPOINT", required=TANDEM_OIDC_ENABLED)
OIDC_OP_USER_ENDPOINT = env("TANDEM_OIDC_USERINFO_ENDPOINT", required=TANDEM_OIDC_ENABLED)
OIDC_OP_JWKS_ENDPOINT = env("TANDEM_OIDC_JWKS_ENDPOINT", required=TANDEM_OIDC_ENABLED)
OIDC_RP_SIGN_ALGO = env("TANDEM_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env("TANDEM_OIDC_SCOPES", "openid email profile groups")
OIDC_USE_PKCE = True
OIDC_TOKEN_USE_BASIC_AUTH = env_bool("TANDEM_OIDC_TOKEN_BASIC_AUTH", True)  # client_secret_basic, OIDC's default
OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
OIDC_VERIFY_SSL = env_bool("TANDEM_OIDC_VERIFY_SSL", True)
OIDC_TIMEOUT = env_float("TANDEM_OIDC_TIMEOUT_S", 10.0)
TANDEM_OIDC_PROVIDER_NAME = env("TANDEM_OIDC_PROVIDER_NAME", "your company account")
# The issuer (`iss`) of the provider's discovery document: when set, ID tokens from any other are refused. A person is
# their (issuer, subject) pair (deployments/services/identities.py); the username claim only names a new account.
TANDEM_OIDC_ISSUER = env("TANDEM_OIDC_ISSUER", "")
TANDEM_OIDC_USERNAME_CLAIM = env("TANDEM_OIDC_USERNAME_CLAIM", "email")
TANDEM_OIDC_GROUPS_CLAIM = env("TANDEM_OIDC_GROUPS_CLAIM", "groups")
# group → [team slug, role]: {"ml-research-admins": ["ml-research", "admin"], "ml-research": ["ml-research", "member"]}
TANDEM_OIDC_GROUP_MAP = {g: tuple(v) for g, v in json.loads(env("TANDEM_OIDC_GROUP_MAP", "{}")).items()}
TANDEM_OIDC_PLATFORM_ADMIN_GROUPS = [g for g in env("TANDEM_OIDC_PLATFORM_ADMIN_GROUPS", "").split(",") if g]
# Off: the sign-in page offers only the company button and Django's own passwords are refused everywhere.
TANDEM_PASSWORD_SIGN_IN = env_bool("TANDEM_PASSWORD_SIGN_IN", True)
if not TANDEM_PASSWORD_SIGN_IN and not TANDEM_OIDC_ENABLED:
    raise ImproperlyConfigured("TANDEM_PASSWORD_SIGN_IN=0 needs OpenID Connect (TANDEM_OIDC_CLIENT_ID): "
                               "nobody could sign in.")
# django-axes stays first either way: it refuses a locked-out username and address before any backend checks.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend"] + \
    (["django.contrib.auth.backends.ModelBackend"] if TANDEM_PASSWORD_SIGN_IN else []) + \
    (["frontend.oidc.TandemOIDCBackend"] if TANDEM_OIDC_ENABLED else [])
TEMPLATES[0]["OPTIONS"]["context_processors"].append("frontend.oidc.sign_in_options")
INSTALLED_APPS.append("mozilla_django_oidc")
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sign_in_failed=1"
OIDC_CALLBACK_CLASS = "frontend.oidc.TandemOIDCCallbackView"
# Seconds after which a portal session signed in with the provider asks it again (no prompt) at the next page: a
# person disabled there is signed out then. mozilla-django-oidc's own interval stays 0 (frontend.oidc.VOUCHED_AT).
TANDEM_OIDC_RECHECK_S = env_int("TANDEM_OIDC_RECHECK_S", 900)
if TANDEM_OIDC_RECHECK_S < 60:
    raise ImproperlyConfigured("TANDEM_OIDC_RECHECK_S is at least 60: a shorter interval sends page after page to the "
                               "identity provider.")
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = 0
MIDDLEWARE.insert(MIDDLEWARE.index("django_htmx.middleware.HtmxMiddleware") + 1, "frontend.oidc.OIDCSessionRecheck")

# --- Several replicas of everything (deploy/, docs/install.md) -----------------------------------------------
# A gateway told to stop (SIGTERM, e.g. a rolling update) lets in-flight requests and streams finish for up to
# this many seconds; keep the pod's terminationGracePeriodSeconds above it plus the preStop pause.
TANDEM_GATEWAY_DRAIN_SECONDS = env_float("TANDEM_GATEWAY_DRAIN_SECONDS", 30.0)
# Probes come to a pod's IP (kubelet, ALB health checks): answered before the host check (controlplane/health.py).
MIDDLEWARE.insert(MIDDLEWARE.index("controlplane.request_id.RequestIdMiddleware") + 1,
                  "controlplane.health.probe_middleware")

# --- Logging: one JSON line per record, with the request id ------------------------------------------
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "controlplane.request_id.RequestIdFilter"}},
    "formatters": {"json": {"()": "controlplane.request_id.JsonFormatter"}},
    "handlers": {
        # Standard error, always: standard output carries data only (`manage.py spectacular > schema.json`).
        "console": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "json",
                    "filters": ["request_id"]}
    },
    "root": {"handlers": ["console"], "level": env("TANDEM_LOG_LEVEL", "INFO")},
    "loggers": {"django.server": {"level": "WARNING"}},
}
