"""A bounded in-memory async cache: LRU with a size limit, refresh ahead of a hard staleness limit, single-flight
loads, safe invalidation."""
import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable

log = logging.getLogger(__name__)

MISSING = object()  # what `peek` answers when only a load can tell
RETRY_S = 1.0  # after a failed refresh, the cached value is served this long before the next try


class AsyncCache:
    """`get` answers from memory; a miss loads once however many requests wait for the same key.

    An entry is served as is for `ttl` seconds after its load, then still served while one background refresh
    runs, so the hot path does not wait on the database for a key it has seen. Past `max_stale` seconds without
    a successful load it is not served at all: the caller waits for a load, and gets the loader's error when the
    database cannot answer. No value is ever more than `max_stale` behind the database, whichever of PostgreSQL
    or the invalidation channel is away. A `None` (no such row) is kept `negative_ttl` seconds.

    At most `max_entries` entries are kept, the least recently used going first. `invalidate` (driven by pub/sub)
    drops an entry at once; a load that started before the invalidation does not write its result back.
    """

    def __init__(self, loader: Callable[[Hashable], Awaitable[object]], *, ttl: float, max_stale: float,
                 negative_ttl: float, max_entries: int):
        self._loader = loader
        self._ttl = ttl
        self._max_stale = max(ttl, max_stale)
        self._negative_ttl = negative_ttl
        self._max_entries = max_entries
        self._data: OrderedDict[Hashable, tuple[object, float, float]] = OrderedDict()  # value, refresh at, expiry
        self._inflight: dict[Hashable, asyncio.Task] = {}

    def __len__(self):
        return len(self._data)

    def peek(self, key: Hashable):
        """What `get` answers from memory (starting the background refresh when one is due), else MISSING."""
        entry = self._data.get(key)
        if entry is None:
            return MISSING
        now = time.monotonic()
        if now >= entry[2]:
            return MISSING
        self._data.move_to_end(key)
        if now >= entry[1] and key not in self._inflight:
            self._start_load(key)  # serve the cached value; refresh behind it
        return entry[0]

    async def get(self, key: Hashable):
        value = self.peek(key)
        if value is not MISSING:
            return value
        task = self._inflight.get(key) or self._start_load(key)
        return await asyncio.shield(task)

    def invalidate(self, key: Hashable) -> None:
        self._data.pop(key, None)
        self._inflight.pop(key, None)

    def clear(self) -> None:
        self._data.clear()
        self._inflight.clear()

    def _start_load(self, key: Hashable) -> asyncio.Task:
        task = asyncio.ensure_future(self._load(key))
        self._inflight[key] = task
        return task

    async def _load(self, key: Hashable):
        me = asyncio.current_task()
        try:
            value = await self._loader(key)
        except Exception:
            if self._inflight.get(key) is me:
                del self._inflight[key]
            entry, now = self._data.get(key), time.monotonic()
            if entry is not None and now < entry[2]:  # within the limit: keep serving what we had
                # and try again in a second, not on every request meanwhile (the loader logs why it failed)
                self._data[key] = (entry[0], now + min(self._ttl, RETRY_S), entry[2])
                log.warning("cache refresh failed; serving the previous value for at most %.0f s more",
                            entry[2] - now)
                return entry[0]
            raise
        if self._inflight.get(key) is me:  # else the key was invalidated meanwhile: do not keep this value
            del self._inflight[key]
            now = time.monotonic()
            if value is None:
                self._data[key] = (None, now + self._negative_ttl, now + self._negative_ttl)
            else:
                self._data[key] = (value, now + self._ttl, now + self._max_stale)
            self._data.move_to_end(key)
            if len(self._data) > self._max_entries:
                self._data.popitem(last=False)
        return value
