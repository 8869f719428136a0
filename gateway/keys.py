"""API-key authentication against an in-memory cache that Redis pub/sub invalidates on revocation."""
import asyncio
import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from deployments.credential_format import API_KEY_PREFIX, KEY_EVENTS_CHANNEL, credential_matches, credential_split
from gateway.cache import AsyncCache
from gateway.errors import unauthorized

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Key:
    """What the gateway needs of an ApiKey row; never the secret, only its digest."""

    pk: int
    key_id: str
    digest: str
    team_id: int
    team_slug: str
    revoked: bool
    expires_at: float | None
    all_deployments: bool
    scope: frozenset[int]
    requests_per_minute: int | None
    tokens_per_minute: int | None
    service: bool = False  # Tandem's own conformance key: it may reach a deployment before users can

    def allows(self, deployment_id: int) -> bool:
        return self.all_deployments or deployment_id in self.scope

    @classmethod
    def from_row(cls, row: dict) -> "Key":
        return cls(pk=row["id"], key_id=row["key_id"], digest=row["digest"], team_id=row["team_id"],
                   team_slug=row["team_slug"], revoked=row["revoked"],
                   expires_at=float(row["expires_at"]) if row["expires_at"] is not None else None,
                   all_deployments=row["all_deployments"], scope=frozenset(row["scope"] or ()),
                   requests_per_minute=row["requests_per_minute"], tokens_per_minute=row["tokens_per_minute"],
                   service=bool(row.get("service")))


class KeyRing:
    """Authenticates bearer keys; rows are loaded once and kept until revoked, refreshed every `ttl` as a net."""

    def __init__(self, store, *, hmac_secret: bytes, ttl: float, negative_ttl: float):
        self._secret = hmac_secret
        self._store = store
        self.cache = AsyncCache(self._load, ttl=ttl, negative_ttl=negative_ttl)
        self.listening = asyncio.Event()

    async def _load(self, key_id: str) -> Key | None:
        row = await self._store.key_row(key_id)
        return Key.from_row(row) if row else None

    async def authenticate(self, authorization: bytes | None) -> Key:
        if not authorization or authorization[:7].lower() != b"bearer ":
            raise unauthorized("Missing API key. Pass `Authorization: Bearer tdm_...`.")
        raw = authorization[7:].strip()
        key_id = credential_split(raw, API_KEY_PREFIX)
        if key_id is None:
            raise unauthorized()
        key = await self.cache.get(key_id)
        if key is None or not credential_matches(raw, key.digest, hmac_secret=self._secret):
            raise unauthorized()
        if key.revoked:
            raise unauthorized("This API key has been revoked.")
        if key.expires_at is not None and key.expires_at <= time.time():
            raise unauthorized("This API key has expired.")
        return key

    async def listen(self, client: aioredis.Redis) -> None:
        """Drop a key when it is announced; after any (re)subscription drop all, since messages may be lost.
        `client` is the gateway's one Redis client; each subscription takes a connection of its own from it."""
        while True:
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(KEY_EVENTS_CHANNEL)
                async for message in pubsub.listen():
                    if message["type"] == "subscribe":
                        self.cache.clear()
                        self.listening.set()
                    elif message["type"] == "message":
                        key_id = message["data"].decode(errors="replace")
                        self.cache.invalidate(key_id)
                        log.info("api key %s invalidated", key_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis away: retry; cached keys stay until re-subscribed
                log.warning("key invalidation channel lost; reconnecting", exc_info=True)
                self.listening.clear()
                await asyncio.sleep(0.5)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001
                    pass
