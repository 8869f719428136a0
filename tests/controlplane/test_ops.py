"""Operations: health, readiness against the real services, metrics, request ids, and the embedded services."""
import json
import logging
import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.devservices import redis_url_for_tests
from controlplane.request_id import JsonFormatter, RequestIdFilter
from tests.factories import DeploymentFactory

pytestmark = pytest.mark.django_db


def test_readyz_checks_database_redis_and_broker(client):
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready", "problems": []}


def test_readyz_says_what_is_down(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["problems"] == ["redis: ConnectionError"]


SCRAPER_TOKEN = "scraper-token-not-a-secret"


def test_metrics_count_deployments_by_status_and_queue_depth(client, redis_client, settings):
    settings.TANDEM_METRICS_TOKEN = SCRAPER_TOKEN
    DeploymentFactory(status="running")
    DeploymentFactory(status="running")
    redis_client.rpush("celery", "x")
    scrape = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}")
    families = {f.name: f for f in text_string_to_metric_families(scrape.content.decode())}
    running = [s for s in families["tandem_deployments"].samples if s.labels == {"status": "running"}]
    assert running[0].value == 2
    assert families["tandem_celery_queue_depth"].samples[0].value == 1


def test_metrics_are_only_for_the_scraper(client, settings):
    DeploymentFactory(status="running")
    settings.TANDEM_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404  # off until a token is set
    settings.TANDEM_METRICS_TOKEN = SCRAPER_TOKEN
    for headers in ({}, {"HTTP_AUTHORIZATION": "Bearer wrong-token"}, {"HTTP_AUTHORIZATION": SCRAPER_TOKEN},
                    {"HTTP_AUTHORIZATION": f"Basic {SCRAPER_TOKEN}"}):
        refused = client.get("/metrics", **headers)
        assert refused.status_code == 401 and b"tandem_deployments" not in refused.content
        assert refused["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPER_TOKEN}").status_code == 200


def test_request_id_is_kept_or_created_and_logged(client, caplog):
    assert client.get("/healthz", HTTP_X_REQUEST_ID="abc-123")["X-Request-ID"] == "abc-123"
    made = client.get("/healthz", HTTP_X_REQUEST_ID="bad id with spaces\n")["X-Request-ID"]
    assert len(made) == 32 and " " not in made
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    RequestIdFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "hello world" and line["request_id"] == "-"


def test_devservices_prints_urls_for_running_services():
    out = subprocess.run([sys.executable, "-m", "controlplane.devservices"], capture_output=True, text=True,
                         check=True).stdout
    assert "export DATABASE_URL=postgres://" in out and "export REDIS_URL=redis://" in out


def test_the_suite_never_gets_redis_db_0_from_devservices():
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:6379/0"}
    out = subprocess.run([sys.executable, "-m", "controlplane.devservices", "--tests"], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert "export REDIS_URL=redis://127.0.0.1:6379/15\n" in out
    assert redis_url_for_tests("rediss://:pw@cache:6379?ssl_cert_reqs=required") == \
        "rediss://:pw@cache:6379/15?ssl_cert_reqs=required"
    assert redis_url_for_tests("redis://127.0.0.1:6379/3") == "redis://127.0.0.1:6379/3"


def test_management_commands_print_data_on_standard_output_and_log_records_on_standard_error():
    """`manage.py spectacular --format openapi-json > schema.json` writes the schema and nothing else: the log
    records the command's start emits (django-axes announces itself) go to standard error."""
    run = subprocess.run([sys.executable, "manage.py", "spectacular", "--format", "openapi-json"],
                         capture_output=True, text=True, check=True, timeout=120,
                         env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
                              "TANDEM_LOG_LEVEL": "INFO"})
    assert json.loads(run.stdout)["info"]["title"] == "Tandem API"
    logged = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert "axes.apps" in {record["logger"] for record in logged}
