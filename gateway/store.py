"""Async PostgreSQL reads of keys and deployments (psycopg pool); only cache misses and refreshes reach it."""
import logging
import time

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from deployments.lifecycle import LIVE
from gateway import metrics
from gateway.errors import store_unavailable

log = logging.getLogger(__name__)

# The statuses are parameters, from the one module that defines them (sorted: a stable prepared statement).
LIVE_STATUSES = sorted(LIVE)

KEY_SQL = """
SELECT k.id, k.key_id, k.digest, k.team_id, t.slug AS team_slug, k.name,
       k.revoked_at IS NOT NULL AS revoked, EXTRACT(EPOCH FROM k.expires_at) AS expires_at,
       k.all_deployments, k.requests_per_minute, k.tokens_per_minute,
       k.is_service AS service,
       ARRAY(SELECT s.deployment_id FROM deployments_apikey_deployments s WHERE s.apikey_id = k.id) AS scope
FROM deployments_apikey k JOIN deployments_team t ON t.id = k.team_id
WHERE k.key_id = %s
"""

LIVE_KEY_IDS_SQL = """
SELECT key_id FROM deployments_apikey WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
"""

TEAM_DEPLOYMENTS_SQL = """
SELECT d.id, d.name, d.model_id, d.status, d.endpoint_url, d.max_model_len, d.updated_at,
       c.name AS cluster_name, c.kind AS cluster_kind, c.secret_ref AS cluster_secret_ref, d.wake_on_request,
       d.ready_estimate_seconds, EXTRACT(EPOCH FROM d.status_changed_at) AS status_changed_at,
       d.endpoint_access, d.endpoint_access_message, d.endpoint_generation, d.next_endpoint_url,
       d.next_generation, d.next_weight
FROM deployments_deployment d JOIN deployments_cluster c ON c.id = d.cluster_id
WHERE d.team_id = %s AND d.status = ANY(%s)
ORDER BY d.created_at DESC
"""


# After a failed lookup, others fail at once for this long instead of each waiting for a connection.
BACKOFF_S = 1.0


class _StaleConnection(Exception):
    """The connection broke under the query (closed by the server): a new one may well work."""


class Store:
    """The gateway's reads. Every lookup is counted (`tandem_gateway_store_queries_total` on the metrics port)."""

    def __init__(self, conninfo: str, *, max_size: int = 4):
        # Small: lookups are cached, so the pool only serves misses and background refreshes.
        self.pool = AsyncConnectionPool(conninfo, min_size=1, max_size=max_size, open=False,
                                        kwargs={"autocommit": True, "row_factory": dict_row})
        self._down_until = 0.0

    async def open(self):
        # Do not wait: a replica that starts during a database outage answers 503s and recovers by itself.
        await self.pool.open(wait=False)

    async def close(self):
        await self.pool.close()

    async def _fetch(self, what: str, sql: str, args: tuple) -> list[dict]:
        if time.monotonic() < self._down_until:
            raise store_unavailable()
        metrics.STORE_QUERIES.labels(what).inc()
        try:
            try:
                return await self._query(sql, args)
            except _StaleConnection:
                # A pooled connection that PostgreSQL closed (a restart), and its idle siblings with it: the pool
                # replaces every broken one, then once more, so a restart costs no request (checking connections
                # as they are handed out would cost a round trip on every lookup).
                await self.pool.check()
                return await self._query(sql, args)
        except (psycopg.Error, PoolTimeout, OSError, _StaleConnection):
            self._down_until = time.monotonic() + BACKOFF_S
            log.warning("database lookup failed", exc_info=True)
            raise store_unavailable() from None

    async def _query(self, sql: str, args: tuple) -> list[dict]:
        async with self.pool.connection(timeout=2) as conn:
            try:
                cur = await conn.execute(sql, args, prepare=True)
                return await cur.fetchall()
            except psycopg.OperationalError as e:
                if conn.broken:
                    raise _StaleConnection() from e
                raise

    async def key_row(self, key_id: str) -> dict | None:
        rows = await self._fetch("key", KEY_SQL, (key_id,))
        return rows[0] if rows else None

    async def live_key_ids(self) -> list[str]:
        return [r["key_id"] for r in await self._fetch("live_key_ids", LIVE_KEY_IDS_SQL, ())]

    async def team_deployments(self, team_id: int) -> list[dict]:
        return await self._fetch("team_deployments", TEAM_DEPLOYMENTS_SQL, (team_id, LIVE_STATUSES))
