"""The gateway's settings, read once from Django settings into a frozen object the hot path can use cheaply."""
from dataclasses import dataclass

from django.conf import settings
from psycopg.conninfo import make_conninfo

# libpq parameters DATABASE_URL may carry in its query (TLS above all) that the gateway's own pool must keep too.
LIBPQ_OPTIONS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslnegotiation", "connect_timeout",
                 "application_name", "target_session_attrs", "options"}
# Each stream entry carries up to this many records (a JSON list in field `b`): one Redis command per flush, not
# one per request. Redis keeps at most about RECORD_STREAM_MAXLEN undrained entries (about 1,000,000 records);
# past it the oldest are trimmed (bounded memory).
RECORDS_PER_ENTRY = 100
RECORD_STREAM_MAXLEN = 10_000


@dataclass(frozen=True)
class GatewayConfig:
    host: str
    port: int
    redis_url: str
    database_conninfo: str
    hmac_secret: bytes
    max_body_bytes: int
    connect_timeout_s: float
    upstream_timeout_s: float
    access_log: bool
    upstream_keepalive_s: float = 4.0  # below Ray Serve's 5 s: never reuse a connection upstream is closing
    drain_timeout_s: float = 30.0  # on SIGTERM: how long in-flight streams may run before they are cut
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9801
    # A cached key or route is refreshed in the background after half of this, and refused (503) past it
    # while PostgreSQL cannot confirm it: revocation fails closed even when pub/sub or the database is away.
    max_stale_s: float = 30.0
    route_ttl_s: float = 2.0  # changes are announced (gateway.announcements): this is the fallback for a lost one
    negative_ttl_s: float = 5.0
    cache_max_entries: int = 100_000
    auth_failures_per_minute: int = 60  # per client address; 0 turns the limit off
    forwarded_allow_ips: str = ""  # proxies whose X-Forwarded-For names the client (addresses, CIDRs)
    behind_load_balancer: bool = False  # then an empty forwarded_allow_ips refuses to start (gateway/forwarded.py)
    max_header_bytes: int = 64 * 1024
    flush_interval_s: float = 0.05
    # How long a stream may take to send its first event (a decode waiting for KV that never comes) before it is
    # asked once more, or, the second time, answered with a 504.
    first_byte_timeout_s: float = 60.0

    @property
    def key_ttl_s(self) -> float:
        return self.max_stale_s / 2


def database_conninfo() -> str:
    db = settings.DATABASES["default"]
    parts = {"dbname": db.get("NAME"), "user": db.get("USER"), "password": db.get("PASSWORD"),
             "host": db.get("HOST"), "port": str(db.get("PORT") or "")}
    parts.update({k: str(v) for k, v in (db.get("OPTIONS") or {}).items() if k in LIBPQ_OPTIONS})
    return make_conninfo(**{k: v for k, v in parts.items() if v})


def config_from_settings(**overrides) -> GatewayConfig:
    values = dict(
        host=getattr(settings, "TANDEM_GATEWAY_HOST", "127.0.0.1"),
        port=getattr(settings, "TANDEM_GATEWAY_PORT", 8001),
        redis_url=settings.REDIS_URL,
        database_conninfo=database_conninfo(),
        hmac_secret=settings.TANDEM_KEY_HMAC_SECRET.encode(),
        max_body_bytes=getattr(settings, "TANDEM_GATEWAY_MAX_BODY_BYTES", 4 * 1024 * 1024),
        connect_timeout_s=getattr(settings, "TANDEM_GATEWAY_CONNECT_TIMEOUT_S", 5.0),
        upstream_timeout_s=getattr(settings, "TANDEM_GATEWAY_UPSTREAM_TIMEOUT_S", 600.0),
        access_log=getattr(settings, "TANDEM_GATEWAY_ACCESS_LOG", True),
        upstream_keepalive_s=getattr(settings, "TANDEM_GATEWAY_UPSTREAM_KEEPALIVE_S", 4.0),
        drain_timeout_s=getattr(settings, "TANDEM_GATEWAY_DRAIN_SECONDS", 30.0),
        metrics_host=getattr(settings, "TANDEM_GATEWAY_METRICS_HOST", "127.0.0.1"),
        metrics_port=getattr(settings, "TANDEM_GATEWAY_METRICS_PORT", 9801),
        max_stale_s=getattr(settings, "TANDEM_GATEWAY_KEY_MAX_STALE_S", 30.0),
        cache_max_entries=getattr(settings, "TANDEM_GATEWAY_CACHE_MAX_ENTRIES", 100_000),
        auth_failures_per_minute=getattr(settings, "TANDEM_GATEWAY_AUTH_FAILURES_PER_MINUTE", 60),
        forwarded_allow_ips=getattr(settings, "TANDEM_GATEWAY_FORWARDED_ALLOW_IPS", ""),
        behind_load_balancer=getattr(settings, "TANDEM_GATEWAY_BEHIND_LOAD_BALANCER", False),
        max_header_bytes=getattr(settings, "TANDEM_GATEWAY_MAX_HEADER_BYTES", 64 * 1024),
        first_byte_timeout_s=getattr(settings, "TANDEM_GATEWAY_FIRST_BYTE_TIMEOUT_S", 60.0),
    )
    values.update(overrides)
    return GatewayConfig(**values)
