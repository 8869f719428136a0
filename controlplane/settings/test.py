"""Settings for the test suite: real PostgreSQL and Redis, a database of its own."""
import os
import tempfile

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-not-secret")
# Tests write kubeconfigs and tokens under pytest's temporary directories (and subprocesses inherit this).
os.environ.setdefault("TANDEM_CLUSTER_SECRETS_DIR", tempfile.gettempdir())
# The suite flushes its Redis database: by default one of its own, never db 0 (see tests/conftest.py's guard).
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from controlplane.settings.base import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; tests only
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# The whole suite shares one client address and reuses user ids across runs: throttle tests set their own rates.
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": "100000/min", "anon": "100000/min"}}  # noqa: F405
