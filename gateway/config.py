"""The gateway's settings, read once from Django settings into a frozen object the hot path can use cheaply."""
from dataclasses import dataclass

from django.conf import settings
from psycopg.conninfo import make_conninfo

RECORD_STREAM = "tandem:gateway:requests"
# libpq parameters DATABASE_URL may carry in its query (TLS above all) that the gateway's own pool must keep too.
LIBPQ_OPTIONS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl", "sslnegotiation", "connect_timeout",
                 "application_name", "target_session_attrs", "options"}
# Redis keeps at most about this many undrained records; past it the oldest are trimmed (bounded memory).
RECORD_STREAM_MAXLEN = 1_000_000


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
    drain_timeout_s: float = 30.0  # on SIGTERM: how long in-flight streams may run before they are cut
    key_ttl_s: float = 60.0  # safety net only: revocation arrives by pub/sub
    route_ttl_s: float = 2.0  # deployments change status without an announcement
    negative_ttl_s: float = 5.0
    flush_interval_s: float = 0.05


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
        drain_timeout_s=getattr(settings, "TANDEM_GATEWAY_DRAIN_SECONDS", 30.0),
    )
    values.update(overrides)
    return GatewayConfig(**values)
