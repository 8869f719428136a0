"""What every gateway replica must learn at once, published on Redis once the transaction commits (so a gateway
that reloads on the message reads the committed row): a key's revocation, and a change that opens or closes a
deployment's endpoint. Redis away never fails the committed change: the gateways re-read keys and routes from
PostgreSQL behind their caches, so they see it when the cached entry expires instead."""
import logging

from django.db import transaction
from redis.exceptions import RedisError

from controlplane.redis_client import redis_client
from deployments.gateway_channels import KEY_EVENTS_CHANNEL, ROUTE_EVENTS_CHANNEL, route_event

log = logging.getLogger(__name__)


def _publish_on_commit(channel: str, message: str, what: str) -> None:
    def publish():
        try:
            redis_client(timeout=2).publish(channel, message)
        except RedisError:
            log.warning("could not announce %s on Redis; the gateways see it when their cache expires", what)

    transaction.on_commit(publish)


def key_change_announce(*, key_id: str) -> None:
    """A key was revoked: every gateway drops it (without this, within TANDEM_GATEWAY_KEY_MAX_STALE_S)."""
    _publish_on_commit(KEY_EVENTS_CHANNEL, key_id, f"the revocation of key {key_id}")


def route_change_announce(*, deployment) -> None:
    """The deployment's endpoint may have opened or closed (its status, endpoint or `endpoint_access` changed):
    every gateway reloads its team's routes on the next request."""
    _publish_on_commit(ROUTE_EVENTS_CHANNEL, route_event(team_id=deployment.team_id, deployment_id=deployment.pk),
                       f"a change of deployment {deployment.pk}")
