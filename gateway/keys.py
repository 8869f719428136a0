"""API-key authentication against a bounded in-memory cache that Redis pub/sub invalidates on revocation
(gateway.announcements).

A key the cache holds costs a dictionary lookup and one HMAC. Anything else takes the slow path, where nothing
touches the database unless it could be a real key: a key whose check segment is right (see
`deployments.credential_format`: only the server's secret makes one) is looked up; otherwise an address past its
failure limit is refused (429), then a key without the right shape or check is refused, and a key from before
check segments must be one of the live keys' ids, which the gateway keeps in memory.
"""
import asyncio
import ipaddress
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from deployments.credential_format import (
    API_KEY_PREFIX,
    CredentialDigester,
    credential_check_key,
    credential_check_ok,
    credential_split,
)
from gateway import metrics
from gateway.cache import MISSING, AsyncCache
from gateway.errors import too_many_failures, unauthorized


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


def client_address(client) -> str | None:
    """The address failures are counted against: the IPv4 address, or the /64 an IPv6 address belongs to."""
    if not client:
        return None
    host = client[0]
    if ":" not in host:
        return host
    try:
        return ipaddress.IPv6Network((host, 64), strict=False).with_prefixlen
    except ValueError:
        return host


class AuthFailures:
    """Failed authentications per client address, in fixed windows: past `limit` in one window, the address is
    refused until the window ends. Kept per process, for at most `max_addresses` addresses (least recently
    failing first out), so a flood from many addresses cannot grow it without bound."""

    def __init__(self, *, limit: int, window: float = 60.0, max_addresses: int = 100_000):
        self.limit = limit
        self._window = window
        self._max = max_addresses
        self._counts: OrderedDict[str, list] = OrderedDict()  # address -> [window start, failures]

    def __len__(self):
        return len(self._counts)

    def check(self, address: str | None) -> None:
        """Raise the OpenAI-shaped 429 while this address is over its limit."""
        entry = self._counts.get(address) if address else None
        if entry is not None and entry[1] >= self.limit:
            left = entry[0] + self._window - time.monotonic()
            if left > 0:
                metrics.AUTH_FAILURES.labels("refused").inc()
                raise too_many_failures(max(1, math.ceil(left)))

    def failed(self, address: str | None) -> None:
        if not address or not self.limit:
            return
        now = time.monotonic()
        entry = self._counts.get(address)
        if entry is None or now >= entry[0] + self._window:
            self._counts[address] = [now, 1]
        else:
            entry[1] += 1
        self._counts.move_to_end(address)
        if len(self._counts) > self._max:
            self._counts.popitem(last=False)


class KeyRing:
    """Authenticates bearer keys. A row is loaded once, refreshed behind the cache every `ttl`, and refused
    (503) once `max_stale` seconds have passed without PostgreSQL confirming it; a revocation announced on
    Redis drops it at once."""

    def __init__(self, store, *, hmac_secret: bytes, ttl: float, max_stale: float, negative_ttl: float,
                 max_entries: int, failures: AuthFailures):
        self._digester = CredentialDigester(hmac_secret)
        self._check_key = credential_check_key(hmac_secret)
        self._store = store
        self.cache = AsyncCache(self._load, ttl=ttl, max_stale=max_stale, negative_ttl=negative_ttl,
                                max_entries=max_entries)
        self.failures = failures
        # Ids of the live keys, for keys minted before check segments (None until first loaded).
        self.known_ids: frozenset[str] | None = None

    async def _load(self, key_id: str) -> Key | None:
        row = await self._store.key_row(key_id)
        return Key.from_row(row) if row else None

    def _refuse(self, address, reason: str, message: str | None = None):
        metrics.AUTH_FAILURES.labels(reason).inc()
        self.failures.failed(address)
        return unauthorized(message) if message else unauthorized()

    async def authenticate(self, authorization: bytes | None, client=None) -> Key:
        """The live key in this `Authorization` header, or an OpenAI-shaped 401, 429 or 503 to answer with.
        `client` is the ASGI scope's (host, port), which failures are counted against."""
        parsed = raw = None
        if authorization and authorization[:7].lower() == b"bearer ":
            raw = authorization[7:].strip()
            parsed = credential_split(raw, API_KEY_PREFIX)
        key = self.cache.peek(parsed[0]) if parsed else MISSING
        if key is MISSING:  # the slow path: nothing reaches the database that cannot be a real key
            if parsed and parsed[1] and credential_check_ok(raw, check_key=self._check_key):
                # Only the server's secret makes a check: a key Tandem minted, looked up whatever its address's
                # failures, so junk from a client sharing that address (a NAT, a proxy) cannot lock it out.
                key = await self.cache.get(parsed[0])
            else:
                address = client_address(client)
                self.failures.check(address)
                if raw is None:
                    raise self._refuse(address, "missing", "Missing API key. Pass `Authorization: Bearer tdm_...`.")
                if parsed is None:
                    raise self._refuse(address, "malformed")
                key_id, checked = parsed
                if checked:
                    raise self._refuse(address, "check")
                if self.known_ids is not None and key_id not in self.known_ids:
                    raise self._refuse(address, "unknown")
                key = await self.cache.get(key_id)  # a key from before check segments: limited per address
        if key is None or not self._digester.matches(raw, key.digest):
            raise self._refuse(client_address(client), "unknown" if key is None else "wrong_secret")
        if key.revoked:
            raise self._refuse(client_address(client), "revoked", "This API key has been revoked.")
        if key.expires_at is not None and key.expires_at <= time.time():
            raise self._refuse(client_address(client), "expired", "This API key has expired.")
        return key

    async def keep_known_ids(self, every: float) -> None:
        """Reload the ids of live keys every `every` seconds (keys minted before check segments are told from
        made-up ones by these); while the database is away the last set stays."""
        while True:
            try:
                self.known_ids = frozenset(await self._store.live_key_ids())
            except Exception:  # noqa: BLE001 - logged by the store; try again next time
                pass
            await asyncio.sleep(every)
