"""Liveness, readiness (database, Redis, broker) and Prometheus metrics for the web app.

/metrics counts every team's deployments: it answers only a scraper holding TANDEM_METRICS_TOKEN (a bearer
token, as Prometheus's `authorization: {credentials_file: ...}` sends it), and is off (404) while that is unset.
A token rather than an internal port: gunicorn serves one WSGI app on every address it binds and takes the
port a request names from its Host header, so the app cannot tell an internal port from a public one.

This module counts the queue itself and knows no app: an app with something to count (deployments by status)
registers a collector on `METRICS` at start (in its AppConfig.ready), so the arrow points from the app down to
here and not up.
"""
import hmac

import redis
from django.conf import settings
from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from controlplane.redis_client import redis_client

PROBE_TIMEOUT_S = 1.0  # a stalled Redis makes the probe fail fast instead of hanging it
# What /metrics serves. Collectors are asked at scrape time: each `collect()` (yielding metric families) reads
# what it counts then.
METRICS = CollectorRegistry()


def probe_middleware(get_response):
    """Answer /healthz and /readyz before any other middleware: kubelets and load balancers probe a pod by its
    IP, which is no allowed host, and a probe needs neither a session nor CSRF."""
    probes = {"/healthz": healthz, "/readyz": readyz}

    def middleware(request):
        probe = probes.get(request.path_info)
        return probe(request) if probe is not None and request.method == "GET" else get_response(request)

    return middleware


def healthz(request):
    return JsonResponse({"status": "ok"})


def _check_database() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return None
    except Exception as e:  # noqa: BLE001 - any failure means not ready
        return f"database: {type(e).__name__}"


def _check_redis(url: str, name: str) -> str | None:
    try:
        redis_client(url=url, timeout=PROBE_TIMEOUT_S).ping()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{name}: {type(e).__name__}"


def readyz(request):
    problems = [p for p in (_check_database(), _check_redis(settings.REDIS_URL, "redis"),
                            _check_redis(settings.CELERY_BROKER_URL, "broker")) if p]
    return JsonResponse({"status": "not ready" if problems else "ready", "problems": problems},
                        status=503 if problems else 200)


def _scraper_allowed(request) -> bool:
    token = settings.TANDEM_METRICS_TOKEN
    if not token:
        raise Http404("Metrics are off: set TANDEM_METRICS_TOKEN to serve them to your scraper.")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


class _QueueDepth:
    """`tandem_celery_queue_depth{queue}`: messages waiting on the broker (none when it does not answer)."""

    def collect(self):
        depth = GaugeMetricFamily("tandem_celery_queue_depth", "Messages waiting in the Celery queue",
                                  labels=["queue"])
        try:
            depth.add_metric(["celery"], redis_client(url=settings.CELERY_BROKER_URL, timeout=PROBE_TIMEOUT_S)
                             .llen("celery"))
        except redis.RedisError:
            pass
        yield depth


METRICS.register(_QueueDepth())


def metrics(request):
    """The Celery queue depth and what the apps registered, computed at scrape time; for the scraper only."""
    if not _scraper_allowed(request):
        response = HttpResponse("Send the metrics token as `Authorization: Bearer <TANDEM_METRICS_TOKEN>`.\n",
                                status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(generate_latest(METRICS), content_type=CONTENT_TYPE_LATEST)
