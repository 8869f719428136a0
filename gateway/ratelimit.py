"""Per-key requests/min and tokens/min from the ApiKey row, counted in Redis in fixed one-minute windows."""
import asyncio
import logging
import math
import time
from collections import Counter

from redis.exceptions import RedisError

from gateway import clock
from gateway.errors import rate_limited

log = logging.getLogger(__name__)

SYNC_S = 0.5  # counts older than this are read again before a request is checked against them
READ_WAIT_S = 0.25  # the longest a request waits for that read (Redis hung): then this replica's counts decide


def _keys(key_id: str, window: int) -> tuple[str, str]:
    return f"tandem:rl:{key_id}:{window}:r", f"tandem:rl:{key_id}:{window}:t"


class _Window:
    """One key's counts in one minute: the totals every replica had reached at the last sync, and this
    replica's requests since."""

    __slots__ = ("window", "requests", "tokens", "pending", "dirty", "ready", "read_since", "synced_at")

    def __init__(self, window: int):
        self.window = window
        self.requests = self.tokens = self.pending = 0
        self.dirty = False
        self.ready: asyncio.Future | None = None
        self.read_since = self.synced_at = 0.0


class RateLimiter:
    """Fixed windows shared by every replica through Redis, without a Redis round trip on the request path.

    Each replica counts its own requests and tokens and, every `interval` (50 ms, the recorder's flush interval,
    in a pipeline of its own), adds them to Redis and reads back everyone's totals. A request finding its key's
    totals older than `SYNC_S` (the key's first in a window, or after a quiet spell) reads them first, so only
    keys in steady use skip the round trip. A replica thus sees the others' traffic within about 50 ms when busy
    and `SYNC_S` at most: requests spread over several replicas can overshoot a limit by what the others admitted
    in that time. Refused requests count too. Tokens are added after a request finishes, so a burst can overshoot the token limit by
    the requests already in flight; the next request in that minute is refused. Redis away: each replica still
    enforces the limits on what it has seen itself.
    """

    def __init__(self, redis, *, interval: float, max_keys: int = 100_000):
        self._redis = redis
        self._interval = interval
        self._max_keys = max_keys
        self._live: dict[str, _Window] = {}
        self._tokens: Counter = Counter()  # (key id, window) -> tokens finished requests used since the last sync

    def __len__(self):
        return len(self._live)

    async def check(self, key) -> None:
        rpm, tpm = key.requests_per_minute, key.tokens_per_minute
        if not rpm and not tpm:
            return
        now = clock.now()
        window = int(now // 60)
        counts = self._live.get(key.key_id)
        if counts is None or counts.window != window:
            counts = self._live[key.key_id] = _Window(window)
        if counts.ready is None and time.monotonic() - counts.synced_at > SYNC_S:
            counts.ready = asyncio.ensure_future(self._read(key.key_id, counts))
            counts.read_since = time.monotonic()
        if counts.ready is not None:
            # A Redis that hangs (rather than refusing) answers nothing: wait for the totals a little, then count
            # what this replica has seen, as when Redis is away; the read finishes whenever Redis answers.
            wait = READ_WAIT_S - (time.monotonic() - counts.read_since)
            if wait > 0:
                await asyncio.wait([asyncio.shield(counts.ready)], timeout=wait)
        counts.pending += 1
        counts.dirty = True
        retry_after = max(1, math.ceil(60 - (now % 60)))
        if rpm and counts.requests + counts.pending > rpm:
            raise rate_limited("requests", retry_after)
        if tpm and counts.tokens >= tpm:
            raise rate_limited("tokens", retry_after)

    async def _read(self, key_id: str, counts: _Window) -> None:
        try:
            requests, tokens = await self._redis.mget(*_keys(key_id, counts.window))
            counts.requests, counts.tokens = int(requests or 0), int(tokens or 0)
        except RedisError:
            # Limits are a fairness tool, not auth: Redis away must not take traffic down.
            log.warning("rate limit counters unavailable; counting this replica's requests only", exc_info=True)
        finally:
            counts.ready = None
            counts.synced_at = time.monotonic()  # after a failure too: try again in SYNC_S, not per request

    def spent(self, key, *, at: float, tokens: int) -> None:
        """A finished request of `key`, started at `at` (the gateway's clock), used `tokens`: they count towards
        its tokens per minute from the next sync (only a key with that limit is counted)."""
        if not key.tokens_per_minute or not tokens:
            return
        self._tokens[key.key_id, int(at // 60)] += tokens
        counts = self._live.get(key.key_id)
        if counts is not None:
            counts.dirty = True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self._tokens or any(counts.dirty for counts in self._live.values()):
                await self.sync()

    async def sync(self) -> None:
        """Add the tokens and requests counted since the last sync to Redis and read every key's totals back, in
        one pipeline. Tokens are summed per key and window first: one INCRBY each, not one per request (packing
        commands is most of what a sync costs). Redis away: the tokens wait for the next sync, and requests stay
        pending in their window."""
        tokens, self._tokens = self._tokens, Counter()
        pipe = self._redis.pipeline(transaction=False)
        for (key_id, window), count in tokens.items():
            _, tok_key = _keys(key_id, window)
            pipe.incrby(tok_key, count)
            pipe.expire(tok_key, 120)
        current = int(clock.now() // 60)
        queued = []
        for key_id, counts in list(self._live.items()):
            if counts.window < current - 1 or (len(self._live) > self._max_keys and not counts.dirty):
                del self._live[key_id]
            elif counts.dirty and counts.ready is None:
                req_key, tok_key = _keys(key_id, counts.window)
                queued.append((counts, counts.pending, len(pipe)))
                pipe.incrby(req_key, counts.pending)
                pipe.expire(req_key, 120)
                pipe.get(tok_key)
        if not len(pipe):
            return
        try:
            results = await pipe.execute()
        except RedisError:
            log.warning("could not sync rate limit counts with Redis; will retry", exc_info=True)
            self._tokens.update(tokens)
            return
        for counts, sent, at in queued:
            counts.pending -= sent  # what came since stays pending: the check adds it to the new total
            counts.requests = results[at]
            counts.tokens = int(results[at + 2] or 0)
            counts.dirty = counts.pending > 0
            counts.synced_at = time.monotonic()
