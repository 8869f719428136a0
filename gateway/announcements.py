"""The control plane's announcements (deployments.gateway_channels), applied to this replica's caches as they
arrive: a revoked key is dropped, and a deployment whose endpoint opened or closed has its team's routes reloaded
on the next request. One subscription holds both channels."""
import asyncio
import logging

import redis.asyncio as aioredis

from deployments.gateway_channels import KEY_EVENTS_CHANNEL, ROUTE_EVENTS_CHANNEL, route_event_team

log = logging.getLogger(__name__)

CHANNELS = (KEY_EVENTS_CHANNEL, ROUTE_EVENTS_CHANNEL)
_KEY_CHANNEL = KEY_EVENTS_CHANNEL.encode()  # as messages name it


class Listener:
    """Applies announcements to the key and route caches. After any (re)subscription both are cleared, since
    messages may have been lost meanwhile; while unsubscribed, a cached entry lives at most the cache's
    `max_stale` without PostgreSQL's word. `listening` is set while both channels are subscribed (/readyz)."""

    def __init__(self, *, keys, routes):
        self._keys = keys  # gateway.cache.AsyncCache of keys, by key id
        self._routes = routes  # gateway.cache.AsyncCache of routes, by team id
        self.listening = asyncio.Event()

    def apply(self, channel: bytes, data: bytes) -> None:
        if channel == _KEY_CHANNEL:
            key_id = data.decode(errors="replace")
            self._keys.invalidate(key_id)
            log.info("api key %s invalidated", key_id)
        elif (team_id := route_event_team(data)) is not None:
            self._routes.invalidate(team_id)

    async def run(self, client: aioredis.Redis) -> None:
        """`client` is the gateway's one Redis client; the subscription takes a connection of its own from it."""
        while True:
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(*CHANNELS)
                async for message in pubsub.listen():
                    if message["type"] == "subscribe":
                        self._keys.clear()
                        self._routes.clear()
                        if message["data"] == len(CHANNELS):
                            self.listening.set()
                    elif message["type"] == "message":
                        self.apply(message["channel"], message["data"])
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis away: retry; cached entries stay until re-subscribed
                log.warning("announcement channels lost; reconnecting", exc_info=True)
                self.listening.clear()
                await asyncio.sleep(0.5)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:  # noqa: BLE001
                    pass
