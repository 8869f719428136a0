"""An in-memory async cache: per-entry expiry, stale-while-revalidate, single-flight loads, safe invalidation."""
import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)


class AsyncCache:
    """`get` answers from memory; a miss loads once however many requests wait for the same key.

    An expired entry is still served while one background refresh runs, so the hot path never waits on the
    database for a key it has seen. `invalidate` (driven by pub/sub) drops an entry at once; a load that
    started before the invalidation does not write its possibly stale result back.
    """

    def __init__(self, loader: Callable[[Hashable], Awaitable[object]], *, ttl: float, negative_ttl: float):
        self._loader = loader
        self._ttl = ttl
        self._negative_ttl = negative_ttl
        self._data: dict[Hashable, tuple[object, float]] = {}
        self._inflight: dict[Hashable, asyncio.Future] = {}
        self._epoch = 0

    def __len__(self):
        return len(self._data)

    async def get(self, key: Hashable):
        entry = self._data.get(key)
        if entry is not None:
            if entry[1] < time.monotonic() and key not in self._inflight:
                self._start_load(key)  # serve the stale value; refresh behind it
            return entry[0]
        future = self._inflight.get(key) or self._start_load(key)
        return await asyncio.shield(future)

    def invalidate(self, key: Hashable) -> None:
        self._epoch += 1
        self._data.pop(key, None)
        self._inflight.pop(key, None)

    def clear(self) -> None:
        self._epoch += 1
        self._data.clear()
        self._inflight.clear()

    def _start_load(self, key: Hashable) -> asyncio.Future:
        future = asyncio.ensure_future(self._load(key, self._epoch))
        self._inflight[key] = future
        return future

    async def _load(self, key: Hashable, epoch: int):
        try:
            value = await self._loader(key)
        except Exception:
            if epoch == self._epoch:
                self._inflight.pop(key, None)
            if key in self._data:  # keep serving what we had while the database is away
                log.warning("cache refresh failed; serving the previous value", exc_info=True)
                return self._data[key][0]
            raise
        if epoch == self._epoch:
            ttl = self._ttl if value is not None else self._negative_ttl
            self._data[key] = (value, time.monotonic() + ttl)
            self._inflight.pop(key, None)
        return value
