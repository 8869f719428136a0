"""The process's Redis clients, built once per URL and shared by every caller in the process.

A client owns a connection pool; building one per call (as `Redis.from_url` inline does) opens a new pool and
new sockets each time. Sharing one is safe under Celery's prefork pool: redis-py's pool records the pid that
created it and, in a forked child, drops the parent's connections and opens its own on first use
(`ConnectionPool._checkpid`), so parent and children never share a socket.
"""
import functools

import redis
from django.conf import settings


@functools.cache
def _client(url: str, timeout: float | None) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


def redis_client(*, url: str | None = None, timeout: float | None = None) -> redis.Redis:
    """The shared client for `url` (default `settings.REDIS_URL`); `timeout` bounds each socket operation
    (None waits, as redis-py does by default; probes pass a short one so a stalled Redis cannot hang them)."""
    return _client(url or settings.REDIS_URL, timeout)
