"""Settings for the test suite: real PostgreSQL and Redis, a database of its own."""
import os
import tempfile

os.environ.setdefault("DJANGO_SECRET_KEY", "test-only-not-secret")
# Tests write kubeconfigs and tokens under pytest's temporary directories (and subprocesses inherit this).
os.environ.setdefault("TANDEM_CLUSTER_SECRETS_DIR", tempfile.gettempdir())
# The suite flushes its Redis database: by default one of its own, never db 0 (see tests/conftest.py's guard).
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
# Under pytest-xdist each worker (gw0, gw1, ...) takes a database number below the suite's own (14, 13, ...; 15 stays
# the plain run's: the PD run `./tandem test` starts beside them), as pytest-django gives each its own PostgreSQL database
# (test_<name>_gw0, ...); processes a test starts inherit it.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and "TANDEM_TEST_REDIS_BASE" not in os.environ:
    from controlplane.devservices import redis_url_with_db, redis_db

    os.environ["TANDEM_TEST_REDIS_BASE"] = os.environ["REDIS_URL"]
    _worker = int(os.environ["PYTEST_XDIST_WORKER"][2:])
    os.environ["REDIS_URL"] = redis_url_with_db(os.environ["REDIS_URL"], redis_db(os.environ["REDIS_URL"]) - 1 - _worker)

from controlplane.settings.base import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; tests only
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
# The whole suite shares one client address and reuses user ids across runs: throttle tests set their own rates.
REST_FRAMEWORK = {**REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"user": "100000/min", "anon": "100000/min"}}  # noqa: F405
