"""The gateway's settings, read once from Django settings into a frozen object the hot path can use cheaply."""
from dataclasses import dataclass

from django.conf import settings
from psycopg.conninfo import make_conninfo

RECORD_STREAM = "tandem:gateway:requests"
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
    key_ttl_s: float = 60.0  # safety net only: revocation arrives by pub/sub
    route_ttl_s: float = 2.0  # deployments change status without an announcement
    negative_ttl_s: float = 5.0
    flush_interval_s: float = 0.05


def database_conninfo() -> str:
    db = settings.DATABASES["default"]
    parts = {"dbname": db.get("NAME"), "user": db.get("USER"), "password": db.get("PASSWORD"),
             "host": db.get("HOST"), "port": str(db.get("PORT") or "")}
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
    )
    values.update(overrides)
    return GatewayConfig(**values)
